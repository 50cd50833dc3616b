"""The asyncio face of the client. All protocol logic lives in :mod:`.core`."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any, AsyncIterator, Callable
from urllib.parse import urlparse

from conveyor import errors
from conveyor.client.core import ACK_BATCH_SECONDS_DEFAULT, ACK_BATCH_SIZE_DEFAULT, ClientCore, Message, PendingAck
from conveyor.protocol import messages as m

MAX_INFLIGHT_DEFAULT = 10_000  # unpersisted publishes before publish() waits
READ_BYTES = 256 * 1024


def parse_uri(uri: str) -> tuple[str, int]:
    parsed = urlparse(uri if "://" in uri else f"tcp://{uri}")
    if parsed.scheme not in ("tcp", "conveyor", "amps"):
        raise errors.ClientError(f"unsupported URI scheme {parsed.scheme!r} (use tcp://host:port)")
    if not parsed.hostname or not parsed.port:
        raise errors.ClientError(f"URI {uri!r} needs a host and a port, e.g. tcp://127.0.0.1:9007")
    return parsed.hostname, parsed.port


class AsyncSubscription:
    """An async iterator over the messages of one subscription."""

    def __init__(self, client: "AsyncClient", sub_id: str) -> None:
        self.client = client
        self.sub_id = sub_id
        self.queue: asyncio.Queue[Message | None] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        msg = await self.queue.get()
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds."""
        try:
            msg = await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        return msg

    async def unsubscribe(self) -> None:
        await self.client.unsubscribe(self.sub_id)


class AsyncClient:
    def __init__(
        self,
        client_name: str | None = None,
        *,
        ack_batch_size: int = ACK_BATCH_SIZE_DEFAULT,
        ack_batch_seconds: float = ACK_BATCH_SECONDS_DEFAULT,
        max_inflight: int = MAX_INFLIGHT_DEFAULT,
        timeout: float = 30.0,
    ) -> None:
        self.core = ClientCore(client_name=client_name or f"client-{os.getpid()}-{id(self):x}", ack_batch_size=ack_batch_size)
        self.core.on_persisted = self._on_persisted
        self.ack_batch_seconds = ack_batch_seconds
        self.max_inflight = max_inflight
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task | None = None
        self._send_scheduled = False
        self._ack_timer: asyncio.TimerHandle | None = None
        self._persist_waiters: list[tuple[int, asyncio.Future]] = []
        self._subs: dict[str, AsyncSubscription] = {}
        self._closed = asyncio.Event()
        self._error: errors.ConveyorError | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def client_name(self) -> str:
        return self.core.client_name

    # --- connection ----------------------------------------------------------------------

    async def connect(self, uri: str, *, logon: bool = True) -> "AsyncClient":
        host, port = parse_uri(uri)
        self.loop = asyncio.get_running_loop()
        try:
            self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise errors.ConnectionLost(f"cannot connect to {uri}: {exc}") from None
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._closed.clear()
        self._error = None
        self._read_task = asyncio.create_task(self._read_loop())
        if logon:
            await self.logon()
        return self

    async def logon(self) -> m.Ack:
        ack = await self._wait(self.core.logon())
        self.core.logged_on(ack)
        self._kick()
        return ack

    async def disconnect(self) -> None:
        if self._writer is None:
            return
        self.core.flush_acks()
        self._send_now()
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, RuntimeError):
            pass
        if self._read_task is not None:
            self._read_task.cancel()
        self._writer = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.disconnect()

    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        try:
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    raise errors.ConnectionLost("the server closed the connection")
                for pending in self.core.receive_data(data):
                    self._complete(pending)
        except asyncio.CancelledError:
            self._lost(errors.ConnectionLost("disconnected"))
            raise
        except (ConnectionError, OSError) as exc:
            self._lost(errors.ConnectionLost(f"connection lost: {exc}"))
        except errors.ConveyorError as exc:
            self._lost(exc)

    def _lost(self, error: errors.ConveyorError) -> None:
        self._error = error
        for pending in self.core.fail_all(error):
            self._complete(pending)
        for _, fut in self._persist_waiters:
            if not fut.done():
                fut.set_exception(error)
        self._persist_waiters.clear()
        for sub in self._subs.values():
            sub.queue.put_nowait(None)
        self._closed.set()

    # --- sending -------------------------------------------------------------------------

    def _kick(self) -> None:
        """Send on the next loop turn, so everything queued in this turn shares a frame."""
        if not self._send_scheduled and self.loop is not None:
            self._send_scheduled = True
            self.loop.call_soon(self._send_now)

    def _send_now(self) -> None:
        self._send_scheduled = False
        frames = self.core.take_frames()
        if frames and self._writer is not None and not self._writer.is_closing():
            self._writer.writelines(frames)

    def _complete(self, pending: PendingAck) -> None:
        fut = pending.waiter
        if fut is not None and not fut.done():
            if pending.error is not None:
                fut.set_exception(pending.error)
            else:
                fut.set_result(pending.result)

    async def _wait(self, pending: PendingAck, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        fut = asyncio.get_running_loop().create_future()
        pending.waiter = fut
        self._kick()
        try:
            return await asyncio.wait_for(fut, timeout or self.timeout)
        except asyncio.TimeoutError:
            raise errors.TimedOut(f"no answer from the server within {timeout or self.timeout} s") from None

    # --- publishing ----------------------------------------------------------------------

    def publish_nowait(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None) -> int:
        if self._error is not None:
            raise self._error
        seq = self.core.publish(topic, data, sequence=sequence, correlation_id=correlation_id)
        self._kick()
        return seq

    async def publish(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None) -> int:
        """Publish; returns the sequence number. Waits only while too many are unpersisted."""
        seq = self.publish_nowait(topic, data, sequence=sequence, correlation_id=correlation_id)
        if len(self.core.store) > self.max_inflight:
            await self.wait_persisted(seq - self.max_inflight // 2)
        return seq

    def _on_persisted(self, seq: int) -> None:
        if not self._persist_waiters:
            return
        empty = len(self.core.store) == 0
        keep = []
        for target, fut in self._persist_waiters:
            if seq >= target or empty:
                if not fut.done():
                    fut.set_result(seq)
            else:
                keep.append((target, fut))
        self._persist_waiters = keep

    async def wait_persisted(self, seq: int | None = None, timeout: float | None = None) -> None:
        """Wait until every publish up to ``seq`` (default: all so far) is persisted."""
        if seq is None:
            seq = self.core.next_seq - 1
        if self.core.persisted_seq >= seq or len(self.core.store) == 0:
            return
        fut = asyncio.get_running_loop().create_future()
        self._persist_waiters.append((seq, fut))
        self._kick()
        try:
            await asyncio.wait_for(fut, timeout or self.timeout)
        except asyncio.TimeoutError:
            raise errors.TimedOut(f"publishes up to {seq} not persisted within {timeout or self.timeout} s") from None

    async def flush(self, timeout: float | None = None) -> None:
        """Send batched acks, then wait until the server has processed and persisted
        every command sent so far (including every publish)."""
        self.core.flush_acks()
        cid = self.core.new_cid()
        pending = self.core.command(m.Flush(cid=cid, ack_type="persisted"), "flush-persisted")
        await self._wait(pending, timeout)
        await self.wait_persisted(timeout=timeout)

    # --- subscribing ---------------------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        options: str | None = None,
        bookmark: str | None = None,
        max_backlog: int | None = None,
        sub_id: str | None = None,
        on_message: Callable[[Message], None] | None = None,
        _acker: Callable[[str, str, str | None], None] | None = None,
    ) -> AsyncSubscription:
        """Subscribe; the result iterates over messages (unless ``on_message`` is given)."""
        cid = self.core.new_cid()
        sub_id = sub_id or f"sub-{cid}"
        if max_backlog is not None:
            options = f"{options},max_backlog={max_backlog}" if options else f"max_backlog={max_backlog}"
        subscription = AsyncSubscription(self, sub_id)
        acker = _acker or self.ack
        deliver = on_message or subscription.queue.put_nowait

        def handler(msg: Message, _deliver=deliver) -> None:
            msg._acker = acker
            _deliver(msg)

        self.core.subscriptions[sub_id] = handler
        self._subs[sub_id] = subscription
        cmd = m.Subscribe(topic=topic, sub_id=sub_id, cid=cid, ack_type="processed", filter=filter, options=options, bookmark=bookmark)
        try:
            await self._wait(self.core.command(cmd, "subscribe"))
        except errors.ConveyorError:
            self.core.subscriptions.pop(sub_id, None)
            self._subs.pop(sub_id, None)
            raise
        return subscription

    async def unsubscribe(self, sub_id: str) -> None:
        self.core.flush_acks()
        cid = self.core.new_cid()
        await self._wait(self.core.command(m.Unsubscribe(sub_id=sub_id, cid=cid, ack_type="processed"), "unsubscribe"))
        self.core.subscriptions.pop(sub_id, None)
        sub = self._subs.pop(sub_id, None)
        if sub is not None:
            sub.queue.put_nowait(None)

    async def sow(self, topic: str, *, filter: str | None = None, top_n: int | None = None) -> list[Message]:
        cid = self.core.new_cid()
        pending = self.core.command(m.Sow(topic=topic, cid=cid, query_id=cid, filter=filter, top_n=top_n, ack_type="completed"), "sow")
        await self._wait(pending)
        return pending.messages

    async def sow_delete(
        self, topic: str, *, bookmarks: list[str] | str | None = None, filter: str | None = None, options: str | None = None
    ) -> int:
        """Acknowledge queue messages by bookmark or filter; returns how many were removed."""
        if isinstance(bookmarks, (list, tuple)):
            bookmarks = ",".join(bookmarks)
        cid = self.core.new_cid()
        cmd = m.SowDelete(topic=topic, bookmark=bookmarks, filter=filter, options=options, cid=cid, ack_type="processed")
        ack = await self._wait(self.core.command(cmd, "sow_delete"))
        return ack.records_deleted or 0

    # --- acknowledging -------------------------------------------------------------------

    def ack(self, queue: str, bookmark: str, options: str | None = None) -> None:
        """Batch an acknowledgement; sent when the batch fills or after ack_batch_seconds."""
        if self.core.ack(queue, bookmark, options):
            self._send_acks()
        elif self._ack_timer is None and self.loop is not None:
            self._ack_timer = self.loop.call_later(self.ack_batch_seconds, self._send_acks)

    def _send_acks(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self.core.flush_acks()
        self._kick()
