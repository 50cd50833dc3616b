"""conveyor's client: ``Client`` (blocking) and ``AsyncClient`` (asyncio), one core.

See docs/client.md. The protocol logic lives in :mod:`.core` (sans-I/O); :mod:`.aio`
and :mod:`.sync` only move bytes, threads and timers.
"""

from conveyor.client.aio import AsyncClient, AsyncSubscription
from conveyor.client.core import ClientCore, ClientStatistics, Message
from conveyor.client.message import AckVerb
from conveyor.client.state import ConnectionState, ReconnectPolicy, StateChange
from conveyor.client.store import FilePublishStore, PublishStore
from conveyor.client.sync import Client, Subscription

__all__ = [
    "AckVerb",
    "AsyncClient",
    "AsyncSubscription",
    "Client",
    "ClientCore",
    "ClientStatistics",
    "ConnectionState",
    "FilePublishStore",
    "Message",
    "PublishStore",
    "ReconnectPolicy",
    "StateChange",
    "Subscription",
]
