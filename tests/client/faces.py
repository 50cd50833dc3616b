"""One blocking interface over both faces of the client, for the conformance suite.

``SyncFace`` is the blocking :class:`Client` itself. ``AsyncFace`` drives an
:class:`AsyncClient` on an ``asyncio.Runner`` in the test's thread: its loop runs
whenever the test waits (``get``, ``flush``, ``wait_until``...), which is when an
asyncio application's loop would run too.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from conveyor.client import AsyncClient, Client, Message

WAIT_STEP_SECONDS = 0.01


class SyncSub:
    def __init__(self, sub) -> None:
        self.sub = sub

    @property
    def sub_id(self) -> str:
        return self.sub.sub_id

    @property
    def state(self):
        return self.sub.state

    def get(self, timeout: float | None = None) -> Message | None:
        return self.sub.get(timeout)

    def unsubscribe(self) -> None:
        self.sub.unsubscribe()


class SyncFace:
    kind = "sync"

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.client = Client(name, **kwargs)

    def connect(self, uri) -> "SyncFace":
        self.client.connect(uri)
        return self

    def publish(self, topic: str, data: Any, **kwargs: Any) -> None:
        self.client.publish(topic, data, **kwargs)

    def flush(self, timeout: float | None = None) -> None:
        self.client.flush(timeout)

    def subscribe(self, topic: str, **kwargs: Any) -> SyncSub:
        return SyncSub(self.client.subscribe(topic, **kwargs))

    def sow(self, topic: str, **kwargs: Any) -> list[Message]:
        return self.client.sow(topic, **kwargs)

    def sow_delete(self, topic: str, **kwargs: Any) -> int:
        return self.client.sow_delete(topic, **kwargs)

    def disconnect(self) -> None:
        self.client.disconnect()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @property
    def core(self):
        return self.client.core

    @property
    def state(self):
        return self.client.state

    def statistics(self):
        return self.client.statistics()

    def on_state(self, callback: Callable) -> None:
        self.client.on_state(callback)

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            self.sleep(WAIT_STEP_SECONDS)
        return predicate()


class AsyncSub:
    def __init__(self, face: "AsyncFace", sub) -> None:
        self.face = face
        self.sub = sub

    @property
    def sub_id(self) -> str:
        return self.sub.sub_id

    @property
    def state(self):
        return self.sub.state

    def get(self, timeout: float | None = None) -> Message | None:
        return self.face.run(self.sub.get(timeout))

    def unsubscribe(self) -> None:
        self.face.run(self.sub.unsubscribe())


class AsyncFace(SyncFace):
    kind = "async"

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.runner = asyncio.Runner()
        self._closed = False
        self.client = self.run(self._make(name, kwargs))

    @staticmethod
    async def _make(name: str, kwargs: dict) -> AsyncClient:
        return AsyncClient(name, **kwargs)

    def run(self, coro) -> Any:
        return self.runner.run(coro)

    def connect(self, uri) -> "AsyncFace":
        self.run(self.client.connect(uri))
        return self

    def publish(self, topic: str, data: Any, **kwargs: Any) -> None:
        self.run(self.client.publish(topic, data, **kwargs))

    def flush(self, timeout: float | None = None) -> None:
        self.run(self.client.flush(timeout))

    def subscribe(self, topic: str, **kwargs: Any) -> AsyncSub:
        return AsyncSub(self, self.run(self.client.subscribe(topic, **kwargs)))

    def sow(self, topic: str, **kwargs: Any) -> list[Message]:
        return self.run(self.client.sow(topic, **kwargs))

    def sow_delete(self, topic: str, **kwargs: Any) -> int:
        return self.run(self.client.sow_delete(topic, **kwargs))

    def disconnect(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.run(self.client.disconnect())
        finally:
            self.runner.close()

    def sleep(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))

    @property
    def state(self):
        return self.client.state


FACES = {"sync": SyncFace, "async": AsyncFace}
