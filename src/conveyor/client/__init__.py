"""conveyor's client: ``Client`` (blocking) and ``AsyncClient`` (asyncio), one core."""

from conveyor.client.aio import AsyncClient, AsyncSubscription
from conveyor.client.core import Message, PublishStore
from conveyor.client.sync import Client, Subscription

__all__ = ["AsyncClient", "AsyncSubscription", "Client", "Message", "PublishStore", "Subscription"]
