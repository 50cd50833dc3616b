"""conveyor's client: ``Client`` (blocking) and ``AsyncClient`` (asyncio), one core.

See docs/client.md. The protocol logic lives in :mod:`.core` (sans-I/O); :mod:`.aio`
and :mod:`.sync` only move bytes, threads and timers.

The names below are imported on first use (PEP 562): a process that needs only
:mod:`.rpc` (Spark's Python runners, which start once per query) does not pay for
asyncio, ssl's event-loop glue and the publish store's checksum library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.client.aio import AsyncClient, AsyncSubscription
    from conveyor.client.core import ClientCore, ClientStatistics, Message
    from conveyor.client.message import AckVerb
    from conveyor.client.state import ConnectionState, ReconnectPolicy, StateChange
    from conveyor.client.store import FilePublishStore, PublishStore
    from conveyor.client.sync import Client, Subscription

_WHERE = {
    "AsyncClient": "aio", "AsyncSubscription": "aio",
    "ClientCore": "core", "ClientStatistics": "core", "Message": "core",
    "AckVerb": "message",
    "ConnectionState": "state", "ReconnectPolicy": "state", "StateChange": "state",
    "FilePublishStore": "store", "PublishStore": "store",
    "Client": "sync", "Subscription": "sync",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"conveyor.client.{module}"), name)
    globals()[name] = value  # once: the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
