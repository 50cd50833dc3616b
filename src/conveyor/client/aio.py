"""The asyncio face of the client. All protocol logic lives in :mod:`.core`.

This module moves bytes between a socket and the core, runs the timers (ack batches,
reconnection backoff) and turns the core's pending commands into futures. Rules:

1. Everything queued in one turn of the loop shares one frame (``_kick``).
2. A lost connection is handed to the core first (pending commands fail, a new epoch
   starts); then, if the policy allows, one task reconnects with backoff through the
   server list, logs on (the core resumes acks, publishes and subscriptions) and the
   state becomes ``CONNECTED`` again. Until then publishes and acks accumulate;
   ``flush()``, ``subscribe()``, ``sow()`` and the others wait for the connection.
3. The client is unusable (``_error`` set) only after ``FAILED``, ``CLOSED`` or a
   loss with reconnection disabled; it is cleared by a successful ``connect()``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import socket
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from conveyor import errors
from conveyor.client.core import (
    ACK_BATCH_SECONDS_DEFAULT,
    ACK_BATCH_SIZE_DEFAULT,
    ClientCore,
    ClientStatistics,
    Message,
    PendingAck,
    parse_uri,
)
from conveyor.client.state import UNSET, ConnectionState, ReconnectPolicy, StateChange, make_policy
from conveyor.client.store import PublishStore
from conveyor.client.subscription import CALLBACK, HANDLER, ITERATOR, SubState, split_replace
from conveyor.protocol import messages as m

__all__ = ["AsyncClient", "AsyncSubscription", "parse_uri"]

log = logging.getLogger("conveyor.client")

MAX_INFLIGHT_DEFAULT = 10_000  # unpersisted publishes before publish() waits
READ_BYTES = 256 * 1024
DISCONNECT_ACK_SECONDS_MAX = 5.0  # disconnect() waits this long for its acks to be persisted
S = ConnectionState
_END = object()  # ends a subscription's buffer

Handler = Callable[[Message], "None | Awaitable[None]"]


class AsyncSubscription:
    """The messages of one subscription: ``async for msg in sub`` or ``await sub.get()``.

    The server sends up to the subscription's backlog ahead (smart pipelining); they
    wait here, so the next message is ready the moment the application asks for it.
    """

    def __init__(self, client: "AsyncClient", state: SubState, on_end: Callable[[], None] | None = None) -> None:
        self.client = client
        self.state = state
        self.queue: asyncio.Queue = asyncio.Queue()
        self._ended = False
        self._stopping = False
        self._on_end = on_end
        self._task: asyncio.Task | None = None

    @property
    def sub_id(self) -> str:
        return self.state.sub_id

    @property
    def error(self) -> Exception | None:
        """Why the subscription ended, if the server refused to resume it."""
        return self.state.error

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        msg = await self.get()
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (or at the end).

        With auto-ack, asking acknowledges the message this returned last.
        """
        self.state.asking()
        return await self._next(timeout)

    async def _next(self, timeout: float | None) -> Message | None:
        queue, state, core = self.queue, self.state, self.client.core
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._ended:
            if not queue.empty():
                msg = queue.get_nowait()
            elif deadline is None:
                msg = await queue.get()
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    msg = await asyncio.wait_for(queue.get(), remaining)
                except asyncio.TimeoutError:
                    return None
            if msg is _END or self._stopping:
                self._ended = True
                return None
            if state.accept(msg, core.epoch):
                return msg
        return None

    async def unsubscribe(self) -> None:
        await self.client.unsubscribe(self.sub_id)

    def _end(self, error: Exception | None = None) -> None:
        if error is not None and self.state.error is None:
            self.state.error = error
        self.queue.put_nowait(_END)
        if self._on_end is not None:
            self._on_end()

    async def _run_handler(self, handler: Handler) -> None:
        """Handler mode: one message at a time, in order; auto-ack as the core says."""
        state = self.state
        while True:
            msg = await self._next(None)
            if msg is None:
                return
            try:
                result = handler(msg)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                state.finished(msg, exc)
            else:
                state.finished(msg, None)


class AsyncClient:
    """The asyncio client. See docs/client.md.

    ``publish_store``: a :class:`PublishStore` (default, in memory) or a
    :class:`FilePublishStore`. ``auto_ack``: the default for subscriptions.
    ``reconnect``: True (default policy), False, or a :class:`ReconnectPolicy`;
    ``max_reconnect_attempts`` and ``reconnect_timeout`` override its limits.
    """

    def __init__(
        self,
        client_name: str | None = None,
        *,
        publish_store: PublishStore | None = None,
        auto_ack: bool = False,
        ack_batch_size: int = ACK_BATCH_SIZE_DEFAULT,
        ack_batch_seconds: float = ACK_BATCH_SECONDS_DEFAULT,
        max_inflight: int = MAX_INFLIGHT_DEFAULT,
        timeout: float = 30.0,
        reconnect: bool | ReconnectPolicy = True,
        max_reconnect_attempts: int | None = UNSET,  # type: ignore[assignment]
        reconnect_timeout: float | None = UNSET,  # type: ignore[assignment]
        user_id: str | None = None,
        password: str | None = None,
    ) -> None:
        self.core = ClientCore(
            client_name=client_name or f"client-{os.getpid()}-{id(self):x}",
            ack_batch_size=ack_batch_size,
            store=publish_store,
            reconnect=make_policy(reconnect, max_reconnect_attempts, reconnect_timeout),
        )
        self.core.on_persisted = self._on_persisted
        self.auto_ack = auto_ack
        self.ack_batch_seconds = ack_batch_seconds
        self.max_inflight = max_inflight
        self.timeout = timeout
        self.user_id = user_id
        self.password = password
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task | None = None
        self._reconnect_task: asyncio.Task | None = None
        self._send_scheduled = False
        self._ack_timer: asyncio.TimerHandle | None = None
        self._persist_waiters: list[tuple[int, asyncio.Future]] = []
        self._persisted_hooks: list[Callable[[int], None]] = []  # the blocking face listens
        self._before_resume: list[Callable[[], None]] = []  # run just before the core resumes
        self._subs: dict[str, AsyncSubscription] = {}
        self._state_changed = asyncio.Event()
        self._error: errors.ConveyorError | None = None
        self._closing = False
        self._rng = random.Random()
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- views ---------------------------------------------------------------------------

    @property
    def client_name(self) -> str:
        return self.core.client_name

    @property
    def state(self) -> ConnectionState:
        return self.core.state

    def statistics(self) -> ClientStatistics:
        return self.core.statistics()

    def on_state(self, callback: Callable[[StateChange], None]) -> Callable[[StateChange], None]:
        """Call ``callback(change)`` on every connection state change (on the loop)."""
        self.core.machine.listeners.append(callback)
        return callback

    # --- connection ----------------------------------------------------------------------

    async def connect(self, uri: str | Sequence[str], *, logon: bool = True) -> "AsyncClient":
        """Connect to the first server of ``uri`` (one URI or a list) that answers.

        Each server is tried once; the reconnection policy applies to connections lost
        later. Raises ConnectionLost when none answers.
        """
        if self.core.state in (S.CONNECTED, S.RECONNECTING):
            raise errors.ClientError(f"already {self.core.state}: disconnect() first")
        self.core.set_servers(uri)
        self.loop = asyncio.get_running_loop()
        self._closing = False
        error: errors.ConveyorError | None = None
        for attempt in range(len(self.core.servers)):
            index, server = self.core.server_for(attempt, failover=False)
            try:
                await self._open(index, server)
                if logon:
                    await self.logon()
            except (errors.ConnectionLost, errors.TimedOut) as exc:
                error = exc
                self._drop_transport()
                continue
            except errors.ConveyorError:
                self._drop_transport()
                raise
            self._error = None
            self._move(S.CONNECTED, uri=server)
            return self
        assert error is not None
        raise error

    async def logon(self) -> m.Ack:
        ack = await self._wait(self.core.logon(user_id=self.user_id, password=self.password))
        for hook in self._before_resume:
            hook()
        self.core.logged_on(ack)
        self._kick()
        return ack

    async def disconnect(self) -> None:
        """Stop handlers (each finishes its message), send batched acks and wait (up to
        5 s) until they are persisted, close the connection, stop reconnecting. Idempotent."""
        if self.core.state is S.CLOSED:
            return
        self._closing = True
        current = asyncio.current_task()
        if self._reconnect_task is not None and self._reconnect_task is not current:
            self._reconnect_task.cancel()
            await asyncio.gather(self._reconnect_task, return_exceptions=True)
        self._reconnect_task = None
        await self._stop_handlers(current)
        self._cancel_ack_timer()
        writer = self._writer
        if writer is not None:
            self.core.flush_acks()
            if self.core.online and self.core.acks_unconfirmed:
                # Acknowledgements are the consumer's promise: see them persisted.
                cid = self.core.new_cid()
                pending = self.core.command(m.Flush(cid=cid, ack_type="persisted"), "flush-persisted")
                try:
                    await self._wait(pending, min(self.timeout, DISCONNECT_ACK_SECONDS_MAX))
                except errors.ConveyorError:
                    pass
            self._send_now()
            try:
                await asyncio.wait_for(writer.drain(), self.timeout)
            except (ConnectionError, RuntimeError, asyncio.TimeoutError):
                pass
        self._drop_transport()
        for pending in self.core.connection_lost(errors.ConnectionLost("disconnected")):
            self._complete(pending)
        left = self.core.statistics()
        if left.unpersisted or left.ack_batches_unconfirmed or left.acks_batched:
            # Not an error (a file store keeps its publishes for the next run), but say so.
            log.warning(
                "client %s closed with %d unpersisted publish(es) and %d acknowledgement(s) not confirmed",
                self.client_name, left.unpersisted, left.acks_batched + left.ack_batches_unconfirmed,
            )
        self.core.store.close()
        self._move(S.CLOSED)
        self._give_up(errors.ConnectionLost("disconnected"), clean=True)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.disconnect()

    async def _open(self, index: int, uri: str) -> None:
        host, port = parse_uri(uri)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise errors.ConnectionLost(f"cannot connect to {uri}: {exc}") from None
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:  # reset at once (a server going down or coming up)
            writer.close()
            raise errors.ConnectionLost(f"connection to {uri} lost at once: {exc}") from None
        self.core.connection_opened(index)
        self._reader, self._writer = reader, writer
        self._read_task = asyncio.create_task(self._read_loop(reader, writer))

    def _drop_transport(self) -> None:
        """Close the socket and stop its reader without reporting a loss."""
        writer, task = self._writer, self._read_task
        self._writer = self._reader = None
        self._read_task = None
        if writer is not None:
            writer.close()
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _read_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    raise errors.ConnectionLost("the server closed the connection")
                for pending in self.core.receive_data(data):
                    self._complete(pending)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError) as exc:
            error: errors.ConveyorError = errors.ConnectionLost(f"connection lost: {exc}")
        except errors.ConveyorError as exc:
            error = exc
        except Exception as exc:  # a bug must not leave a dead reader behind a live state
            log.exception("client read loop failed")
            error = errors.ConnectionLost(f"client error: {exc!r}")
        self._lost(writer, error)

    def _lost(self, writer: asyncio.StreamWriter, error: errors.ConveyorError) -> None:
        if writer is not self._writer:
            return  # a connection already replaced or closed
        self._writer = self._reader = None
        self._read_task = None
        writer.close()
        for pending in self.core.connection_lost(error):
            self._complete(pending)
        if self._closing or self.core.state is not S.CONNECTED:
            return  # connect() or the reconnect task sees its own command fail
        self._move(S.DISCONNECTED, reason=str(error))
        if self.core.reconnect.enabled:
            self._move(S.RECONNECTING, reason=str(error))
            assert self.loop is not None
            self._reconnect_task = self.loop.create_task(self._reconnect(str(error)))
        else:
            self._give_up(error)

    async def _reconnect(self, reason: str) -> None:
        """Rule 2: try the servers with backoff until logged on again or out of budget."""
        loop = asyncio.get_running_loop()
        policy = self.core.reconnect
        started = loop.time()
        attempt = 0
        while not self._closing:
            if policy.exhausted(attempt, loop.time() - started):
                break
            delay = policy.delay(attempt, self._rng.random())
            if policy.timeout_seconds is not None:
                delay = min(delay, max(0.0, started + policy.timeout_seconds - loop.time()))
            await asyncio.sleep(delay)
            index, uri = self.core.server_for(attempt, failover=True)
            attempt += 1
            try:
                await self._open(index, uri)
                await self.logon()
            except Exception as exc:  # any failed attempt is retried; only the policy gives up
                if isinstance(exc, errors.ConveyorError):
                    log.debug("client %s: reconnection attempt %d to %s failed: %s", self.client_name, attempt, uri, exc)
                else:
                    log.exception("client %s: reconnection attempt %d to %s failed", self.client_name, attempt, uri)
                reason = str(exc)
                self._drop_transport()
                for pending in self.core.connection_lost(errors.ConnectionLost(reason)):
                    self._complete(pending)
                continue
            self.core.reconnects += 1
            self._move(S.CONNECTED, uri=uri, attempt=attempt)
            return
        if self._closing:
            return
        message = f"{policy.describe_exhaustion(attempt, loop.time() - started)}: {reason}"
        log.warning("client %s: %s", self.client_name, message)
        self._move(S.FAILED, reason=message, attempt=attempt)
        self._give_up(errors.ConnectionLost(message))

    def _move(self, state: ConnectionState, **info: Any) -> None:
        self.core.machine.move(state, **info)
        self._state_changed.set()
        self._state_changed = asyncio.Event()

    def _give_up(self, error: errors.ConveyorError, *, clean: bool = False) -> None:
        """The client cannot go on: fail every waiter and end every subscription."""
        self._error = error
        waiters, self._persist_waiters = self._persist_waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(error)
        for sub in list(self._subs.values()):
            sub._end(None if clean else error)

    async def _wait_connected(self) -> None:
        """Return when connected; wait while reconnecting; raise when unusable."""
        while True:
            state = self.core.state
            if state is S.CONNECTED:
                return
            if state is not S.RECONNECTING:
                raise self._error or errors.ConnectionLost("not connected: call connect() first")
            await self._state_changed.wait()

    async def _stop_handlers(self, current: asyncio.Task | None) -> None:
        tasks = []
        for sub in self._subs.values():
            sub._stopping = True
            sub.queue.put_nowait(_END)
            if sub._task is not None and sub._task is not current:
                tasks.append(sub._task)
        if tasks:
            # A handler finishes the message it holds (its ack is sent below), no more.
            _, late = await asyncio.wait(tasks, timeout=self.timeout)
            for task in late:
                task.cancel()

    # --- sending -------------------------------------------------------------------------

    def _kick(self) -> None:
        """Send on the next loop turn, so everything queued in this turn shares a frame."""
        if not self._send_scheduled and self.loop is not None:
            self._send_scheduled = True
            self.loop.call_soon(self._send_now)

    def _send_now(self) -> None:
        self._send_scheduled = False
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        try:
            frames = self.core.take_frames()
        except OSError:
            # The publish store could not be written: nothing is sent before it is.
            log.exception("client %s: publish store write failed; sending held back", self.client_name)
            return
        if frames:
            writer.writelines(frames)

    def _complete(self, pending: PendingAck) -> None:
        if pending.kind == "resubscribe":
            if pending.error is not None and not isinstance(pending.error, errors.ConnectionLost):
                self._resubscribe_failed(pending.sub_id, pending.error)
            return
        fut = pending.waiter
        if fut is not None and not fut.done():
            if pending.error is not None:
                fut.set_exception(pending.error)
            else:
                fut.set_result(pending.result)

    def _resubscribe_failed(self, sub_id: str | None, error: errors.ConveyorError) -> None:
        log.warning("client %s: subscription %s could not be resumed: %s", self.client_name, sub_id, error)
        self.core.remove_subscription(sub_id or "")
        sub = self._subs.pop(sub_id or "", None)
        if sub is not None:
            sub._end(error)

    async def _wait(self, pending: PendingAck, timeout: float | None = None) -> Any:
        if pending.done:
            if pending.error is not None:
                raise pending.error
            return pending.result
        fut = asyncio.get_running_loop().create_future()
        pending.waiter = fut
        self._kick()
        try:
            return await asyncio.wait_for(fut, timeout or self.timeout)
        except asyncio.TimeoutError:
            raise errors.TimedOut(f"no answer from the server within {timeout or self.timeout} s") from None

    async def _request(self, build: Callable[[], PendingAck], timeout: float | None = None) -> Any:
        await self._wait_connected()
        return await self._wait(build(), timeout)

    # --- publishing ----------------------------------------------------------------------

    def publish_nowait(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None) -> int:
        """Store and queue a publish; returns its sequence number. Never waits."""
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
        self._notify_persisted(seq)
        for hook in self._persisted_hooks:
            hook(seq)

    def _notify_persisted(self, seq: int) -> None:
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
        """Wait until every publish up to ``seq`` (default: all so far) is persisted.

        Survives reconnections (the store is republished); raises once the client failed.
        """
        if seq is None:
            seq = self.core.next_seq - 1
        if self.core.persisted_seq >= seq or len(self.core.store) == 0:
            return
        if self._error is not None:
            raise self._error
        fut = asyncio.get_running_loop().create_future()
        self._persist_waiters.append((seq, fut))
        self._kick()
        try:
            await asyncio.wait_for(fut, timeout or self.timeout)
        except asyncio.TimeoutError:
            raise errors.TimedOut(f"publishes up to {seq} not persisted within {timeout or self.timeout} s") from None

    async def flush(self, timeout: float | None = None) -> None:
        """Send batched acks, then wait until the server has processed and persisted
        every command sent so far (every publish and every acknowledgement). A lost
        connection is waited out: the flush is repeated once reconnected."""
        loop = asyncio.get_running_loop()
        budget = timeout or self.timeout
        deadline = loop.time() + budget
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise errors.TimedOut(f"flush did not complete within {budget} s")
            try:
                await asyncio.wait_for(self._wait_connected(), remaining)
            except asyncio.TimeoutError:
                raise errors.TimedOut(f"not reconnected within {budget} s") from None
            self.core.flush_acks()
            cid = self.core.new_cid()
            pending = self.core.command(m.Flush(cid=cid, ack_type="persisted"), "flush-persisted")
            try:
                await self._wait(pending, max(0.001, deadline - loop.time()))
                break
            except errors.ConnectionLost:
                if self.core.state in (S.CONNECTED, S.RECONNECTING) and not self._closing:
                    continue
                raise
        await self.wait_persisted(timeout=max(0.001, deadline - loop.time()))

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
        handler: Handler | None = None,
        auto_ack: bool | None = None,
        on_message: Callable[[Message], None] | None = None,
        _acker: Callable[[str, str, str | None], None] | None = None,
        _sink: Callable[[Message], None] | None = None,
        _on_end: Callable[[], None] | None = None,
        _mode: str | None = None,
    ) -> AsyncSubscription:
        """Subscribe to a topic or a queue.

        - no ``handler``/``on_message``: iterate over the result (``async for``, ``get``);
        - ``handler``: called (sync or async) for each message in a task, one at a time;
        - ``on_message``: called inline on the loop as each message arrives (must not block).

        ``bookmark`` replays from the transaction log (``"0"``: the beginning, ``"NOW"``,
        a bookmark: after it, a timestamp). ``max_backlog``: messages the server may
        send ahead of acknowledgements. ``auto_ack`` (default: the client's): iterator,
        asking for the next message acknowledges the previous one; handler/on_message,
        returning acknowledges and raising cancels (the message is redelivered).
        """
        await self._wait_connected()
        options, replace = split_replace(options)
        if replace:
            if sub_id not in self._subs:
                raise errors.UnknownSubscription(f"no subscription {sub_id!r} to replace")
            return await self._replace(self._subs[sub_id], topic, filter, options, max_backlog)
        sub_id = sub_id or f"sub-{self.core.new_cid()}"
        mode = _mode or (CALLBACK if on_message is not None else HANDLER if handler is not None else ITERATOR)
        state = SubState(
            sub_id, topic, filter=filter, options=options, bookmark=bookmark, max_backlog=max_backlog,
            auto_ack=self.auto_ack if auto_ack is None else auto_ack, mode=mode,
        )
        if sub_id in self._subs:
            raise errors.DuplicateSubscription(f"subscription {sub_id!r} already exists in this client")
        subscription = AsyncSubscription(self, state, _on_end)
        state.acker = state.wrap_acker(_acker or (lambda q, b, o, _sid=sub_id: self._ack(q, b, o, _sid)))
        if _sink is not None:
            state.sink = _sink
        elif on_message is not None:
            state.sink = self._inline(state, on_message)
        else:
            state.sink = subscription.queue.put_nowait
        self._subs[sub_id] = subscription
        try:
            await self._wait(self.core.add_subscription(state))
        except errors.ConnectionLost:
            # The reconnection resubscribes it (it is registered); unusable: give up.
            if self.core.state not in (S.CONNECTED, S.RECONNECTING) or self._closing:
                self._forget(sub_id)
                raise
            await self._wait_connected()
        except errors.ConveyorError:
            self._forget(sub_id)
            raise
        if handler is not None and _sink is None:
            subscription._task = asyncio.create_task(subscription._run_handler(handler))
        return subscription

    async def _replace(
        self, subscription: AsyncSubscription, topic: str, filter: str | None, options: str | None, max_backlog: int | None
    ) -> AsyncSubscription:
        """The ``replace`` option: the same subscription (and buffer) with a new topic,
        filter or backlog, atomically on the server; resumed as replaced."""
        state = subscription.state
        previous = (state.topic, state.filter, state.options, state.backlog)
        state.replace(topic, filter=filter, options=options, max_backlog=max_backlog)
        try:
            await self._wait(self.core.replace_subscription(state))
        except errors.ConveyorError:
            state.topic, state.filter, state.options, state.backlog = previous
            raise
        return subscription

    def _inline(self, state: SubState, callback: Callable[[Message], None]) -> Callable[[Message], None]:
        core = self.core

        def sink(msg: Message) -> None:
            if not state.accept(msg, core.epoch):
                return
            try:
                callback(msg)
            except Exception as exc:
                state.finished(msg, exc)
            else:
                state.finished(msg, None)

        return sink

    def _forget(self, sub_id: str) -> None:
        self.core.remove_subscription(sub_id)
        self._subs.pop(sub_id, None)

    async def unsubscribe(self, sub_id: str) -> None:
        """Send batched acks, then end the subscription (here and on the server)."""
        known = sub_id in self._subs
        sub = self._subs.pop(sub_id, None)
        if sub is not None:
            sub._stopping = True
            sub._end()
            task = sub._task
            if task is not None and task is not asyncio.current_task():
                await asyncio.wait([task], timeout=self.timeout)  # the handler finishes its message
        self.core.remove_subscription(sub_id)
        self.core.flush_acks()
        if self.core.state is not S.CONNECTED and known:
            return  # the server forgot it with the connection; the resume will not send it
        cid = self.core.new_cid()
        try:
            await self._request(lambda: self.core.command(m.Unsubscribe(sub_id=sub_id, cid=cid, ack_type="processed"), "unsubscribe"))
        except errors.ConnectionLost:
            if not known:
                raise

    async def sow(self, topic: str, *, filter: str | None = None, top_n: int | None = None) -> list[Message]:
        """The messages waiting in a queue (a query; nothing is leased)."""

        def build() -> PendingAck:
            cid = self.core.new_cid()
            return self.core.command(m.Sow(topic=topic, cid=cid, query_id=cid, filter=filter, top_n=top_n, ack_type="completed"), "sow")

        await self._wait_connected()
        pending = build()
        await self._wait(pending)
        return pending.messages

    async def sow_delete(
        self, topic: str, *, bookmarks: list[str] | str | None = None, filter: str | None = None, options: str | None = None
    ) -> int:
        """Acknowledge queue messages by bookmark or filter at once; returns how many were removed."""
        if isinstance(bookmarks, (list, tuple)):
            bookmarks = ",".join(bookmarks)

        def build() -> PendingAck:
            cid = self.core.new_cid()
            cmd = m.SowDelete(topic=topic, bookmark=bookmarks, filter=filter, options=options, cid=cid, ack_type="processed")
            return self.core.command(cmd, "sow_delete")

        ack = await self._request(build)
        return ack.records_deleted or 0

    # --- acknowledging -------------------------------------------------------------------

    def ack(self, queue: str, bookmark: str, options: str | None = None) -> None:
        """Batch an acknowledgement; sent when the batch fills or after ack_batch_seconds."""
        self._ack(queue, bookmark, options, None)

    def _ack(self, queue: str, bookmark: str, options: str | None, sub_id: str | None) -> None:
        if self.core.ack(queue, bookmark, options, sub_id):
            self._send_acks()
        elif self._ack_timer is None and self.loop is not None:
            self._ack_timer = self.loop.call_later(self.ack_batch_seconds, self._send_acks)

    def _send_acks(self) -> None:
        self._cancel_ack_timer()
        self.core.flush_acks()
        self._kick()

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
