"""The blocking face of the client: the asyncio client on a private loop thread.

Every protocol decision is made by the same :class:`~conveyor.client.core.ClientCore`
the asyncio client uses; this module only carries calls across threads. Publishes are
handed over in batches (one wake-up of the loop per batch, not per message), so a
blocking publisher still gets one frame per group.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from typing import Any, Iterator

from conveyor import errors
from conveyor.client.aio import MAX_INFLIGHT_DEFAULT, AsyncClient
from conveyor.client.core import ACK_BATCH_SECONDS_DEFAULT, ACK_BATCH_SIZE_DEFAULT, Message

_END = object()


class Subscription:
    """A blocking iterator over the messages of one subscription."""

    def __init__(self, client: "Client", sub_id: str, inbox: queue.SimpleQueue) -> None:
        self.client = client
        self.sub_id = sub_id
        self._inbox = inbox

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self._inbox.get()
            if msg is _END:
                return
            yield msg

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (or at the end)."""
        try:
            msg = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        return None if msg is _END else msg

    def unsubscribe(self) -> None:
        self.client.unsubscribe(self.sub_id)


class Client:
    def __init__(
        self,
        client_name: str | None = None,
        *,
        ack_batch_size: int = ACK_BATCH_SIZE_DEFAULT,
        ack_batch_seconds: float = ACK_BATCH_SECONDS_DEFAULT,
        max_inflight: int = MAX_INFLIGHT_DEFAULT,
        timeout: float = 30.0,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="conveyor-client", daemon=True)
        self._thread.start()
        self._aio: AsyncClient = self._call(self._make(client_name, ack_batch_size, ack_batch_seconds, max_inflight, timeout))
        self.timeout = timeout
        self._outbox: deque = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._inflight = threading.Condition()
        self._aio.core.on_persisted = self._on_persisted
        self._subs: dict[str, queue.SimpleQueue] = {}

    @staticmethod
    async def _make(name, ack_batch_size, ack_batch_seconds, max_inflight, timeout) -> AsyncClient:
        return AsyncClient(
            name, ack_batch_size=ack_batch_size, ack_batch_seconds=ack_batch_seconds, max_inflight=max_inflight, timeout=timeout
        )

    def _call(self, coro, timeout: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise errors.TimedOut("the client's loop did not answer in time") from None

    @property
    def client_name(self) -> str:
        return self._aio.client_name

    # --- connection ----------------------------------------------------------------------

    def connect(self, uri: str, *, logon: bool = True) -> "Client":
        self._call(self._aio.connect(uri, logon=logon))
        return self

    def logon(self) -> None:
        self._call(self._aio.logon())

    def disconnect(self) -> None:
        if self._loop.is_closed():
            return
        self._drain_outbox_blocking()
        try:
            self._call(self._aio.disconnect(), timeout=self.timeout)
        finally:
            for inbox in self._subs.values():
                inbox.put(_END)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

    close = disconnect

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disconnect()

    # --- publishing ----------------------------------------------------------------------

    def publish(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None) -> None:
        """Publish; returns at once. The client keeps the message until it is persisted."""
        core = self._aio.core
        if len(core.store) + len(self._outbox) > self._aio.max_inflight:
            self._wait_room()
        with self._lock:
            self._outbox.append((topic, data, sequence, correlation_id))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain_outbox)

    def _drain_outbox(self) -> None:
        with self._lock:
            self._scheduled = False
            items = list(self._outbox)
            self._outbox.clear()
        publish = self._aio.publish_nowait
        for topic, data, sequence, corr in items:
            publish(topic, data, sequence=sequence, correlation_id=corr)

    def _drain_outbox_blocking(self) -> None:
        async def drain() -> None:
            self._drain_outbox()

        self._call(drain())

    def _on_persisted(self, seq: int) -> None:
        with self._inflight:
            self._inflight.notify_all()

    def _wait_room(self) -> None:
        limit = self._aio.max_inflight // 2
        with self._inflight:
            ok = self._inflight.wait_for(
                lambda: len(self._aio.core.store) + len(self._outbox) <= limit or self._aio._error is not None,
                timeout=self.timeout,
            )
        if self._aio._error is not None:
            raise self._aio._error
        if not ok:
            raise errors.TimedOut("publishes are not being persisted")

    def flush(self, timeout: float | None = None) -> None:
        """Send batched acks and wait until everything published so far is persisted."""
        self._drain_outbox_blocking()
        self._call(self._aio.flush(timeout))

    # --- subscribing ---------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        options: str | None = None,
        bookmark: str | None = None,
        max_backlog: int | None = None,
        sub_id: str | None = None,
    ) -> Subscription:
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        sub = self._call(
            self._aio.subscribe(
                topic, filter=filter, options=options, bookmark=bookmark, max_backlog=max_backlog, sub_id=sub_id,
                on_message=inbox.put, _acker=self.ack,
            )
        )
        self._subs[sub.sub_id] = inbox
        return Subscription(self, sub.sub_id, inbox)

    def unsubscribe(self, sub_id: str) -> None:
        self._call(self._aio.unsubscribe(sub_id))
        inbox = self._subs.pop(sub_id, None)
        if inbox is not None:
            inbox.put(_END)

    def sow(self, topic: str, *, filter: str | None = None, top_n: int | None = None) -> list[Message]:
        return self._call(self._aio.sow(topic, filter=filter, top_n=top_n))

    def sow_delete(
        self, topic: str, *, bookmarks: list[str] | str | None = None, filter: str | None = None, options: str | None = None
    ) -> int:
        return self._call(self._aio.sow_delete(topic, bookmarks=bookmarks, filter=filter, options=options))

    def ack(self, queue_name: str, bookmark: str, options: str | None = None) -> None:
        self._loop.call_soon_threadsafe(self._aio.ack, queue_name, bookmark, options)
