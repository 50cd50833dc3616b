"""The asyncio face of the client. All protocol logic lives in :mod:`.core`.

This module moves bytes between a socket and the core, runs the timers (ack batches,
reconnection backoff) and turns the core's pending commands into futures. Rules:

1. Everything queued in one turn of the loop shares one frame (``_kick``).
2. A lost connection is handed to the core first (pending commands fail, a new epoch
   starts); then, if the policy allows, one task reconnects with backoff through the
   server list, logs on (the core resumes acks, publishes and subscriptions) and the
   state becomes ``CONNECTED`` again. Until then publishes and acks accumulate;
   ``flush()``, ``subscribe()``, ``sow()`` and the others wait for the connection.
3. The client is unusable (``error`` set) only after ``FAILED``, ``CLOSED`` or a
   loss with reconnection disabled; it is cleared by a successful ``connect()``.
4. **Another face plugs in through public hooks**, not private arguments:
   :meth:`AsyncClient.subscribe_state` subscribes a subscription object the face built
   (its own buffer, an acker relayed through the face), :meth:`~AsyncClient.on_persisted`
   and :meth:`~AsyncClient.before_resume` let it follow persisted acks and feed what it
   queued before a reconnection resumes. The blocking :class:`~conveyor.client.Client`
   is built on exactly these.
5. **Acknowledgements** (batches, refusals, ``ack(confirm=True)``) are
   client/acking.py's: :class:`~conveyor.client.acking.AsyncAcking` is a base of the client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import socket
import ssl
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from conveyor import errors
from conveyor.client.core import (
    ACK_BATCH_SECONDS_DEFAULT,
    ACK_BATCH_SIZE_DEFAULT,
    ClientCore,
    ClientStatistics,
    CommandKind,
    Message,
    PendingCommand,
    parse_uri,
    raise_first,
)
from conveyor.client.endpoints import Endpoint
from conveyor.client.acking import AsyncAcking
from conveyor.client.message import Acker, to_bytes
from conveyor.client.state import UNSET, ConnectionState, ReconnectPolicy, StateChange, make_policy
from conveyor.client.store import PublishStore
from conveyor.client.subscription import DeliveryMode, Handler, SubState, SubscriptionBase, sub_ids
from conveyor.protocol import messages as m

__all__ = ["AsyncClient", "AsyncSubscription", "parse_uri"]

log = logging.getLogger("conveyor.client")

MAX_INFLIGHT_DEFAULT = 10_000  # unpersisted publishes before publish() waits
_PUBLISH_OPTIONS = frozenset(("delta", "sow_key", "expiration"))  # publish_nowait's **sow
SEND_BATCH_COMMANDS = 1_000  # queued commands at which publish() lets the loop send them, even in a tight loop
READ_BYTES = 256 * 1024
DISCONNECT_ACK_SECONDS_MAX = 5.0  # disconnect() waits this long for its acks to be persisted
S = ConnectionState
D = DeliveryMode

#: ``relay(acker) -> acker``: how a face carries a subscription's acknowledgements to the
#: client (the blocking face hands them over to the loop in order with its publishes).
Relay = Callable[[Acker], Acker]


class AsyncSubscription(SubscriptionBase):
    """The messages of one subscription: ``async for msg in sub`` or ``await sub.get()``.

    The server sends up to the subscription's backlog ahead (smart pipelining); they
    wait here, so the next message is ready the moment the application asks for it.
    """

    def __init__(self, client: "AsyncClient", state: SubState) -> None:
        super().__init__(client, state)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.put = self.queue.put_nowait  # type: ignore[method-assign]  # the buffer's own method

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
        queue = self.queue
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._ended:
            if not queue.empty():
                item = queue.get_nowait()
            elif deadline is None:
                item = await queue.get()
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    # asyncio.timeout, never wait_for, everywhere in this module: in
                    # Python 3.11 wait_for returns a result that lands together with a
                    # cancellation of the caller and drops the cancellation.
                    async with asyncio.timeout(remaining):
                        item = await queue.get()
                except TimeoutError:
                    return None
            msg = self._take(item)
            if msg is not None:
                return msg
        return None

    async def unsubscribe(self) -> None:
        await self.client.unsubscribe(self.sub_id)

    async def pause(self) -> None:
        """:meth:`AsyncClient.pause` of this subscription."""
        await self.client.pause(self.sub_id)

    async def resume(self) -> None:
        """:meth:`AsyncClient.resume` of this subscription."""
        await self.client.resume(self.sub_id)

    async def _run_handler(self, handler: Handler) -> None:
        """Handler mode: one message at a time, in order; auto-ack as the core says."""
        while (msg := await self._next(None)) is not None:
            finishing = self._handle(msg, handler)
            if finishing is not None:
                await finishing


class AsyncClient(AsyncAcking):
    """The asyncio client. See docs/client.md.

    ``publish_store``: a :class:`PublishStore` (default, in memory) or a
    :class:`FilePublishStore`. ``auto_ack``: the default for subscriptions.
    ``reconnect``: True (default policy), False, or a :class:`ReconnectPolicy`;
    ``max_reconnect_attempts`` and ``reconnect_timeout`` override its limits.
    """

    def __init__(  # the blocking Client takes the same arguments and passes them here
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
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
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
        # Credentials (client/endpoints.py rule 1: arguments, then the URI, then the
        # environment) and TLS settings for tcps:// servers. Never logged.
        self.user_id = user_id
        self._password = password
        self.ca_file = ca_file
        self.cert_file = cert_file
        self.key_file = key_file
        self.ssl_context = ssl_context
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task | None = None
        self._reconnect_task: asyncio.Task | None = None
        self._send_scheduled = False
        self._ack_timer: asyncio.TimerHandle | None = None
        self._persist_waiters: list[tuple[int, asyncio.Future]] = []
        self._persisted_listeners: list[Callable[[int], None]] = []
        self._resume_hooks: list[Callable[[], None]] = []
        self._subs: dict[str, SubscriptionBase] = {}
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

    @property
    def error(self) -> errors.ConveyorError | None:
        """Why the client cannot be used (rule 3: failed, closed, or lost without
        reconnection), else None. Calls raise it."""
        return self._error

    def on_state(self, callback: Callable[[StateChange], None]) -> Callable[[StateChange], None]:
        """Call ``callback(change)`` on every connection state change (on the loop)."""
        self.core.machine.listeners.append(callback)
        return callback

    def on_persisted(self, callback: Callable[[int], None]) -> Callable[[int], None]:
        """Call ``callback(seq)`` (on the loop) each time the server confirms publishes
        persisted up to ``seq``, and after each logon. It must return quickly."""
        self._persisted_listeners.append(callback)
        return callback

    def before_resume(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (on the loop) after each logon, just before the client
        resends unconfirmed acknowledgements, publishes and subscriptions. A face that
        queues calls for the loop (the blocking Client) feeds them to the client here,
        so that they are resumed in order with everything else."""
        self._resume_hooks.append(callback)
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
        endpoint = self.core.endpoints[self.core.server_index]
        user, password = endpoint.credentials(self.user_id, self._password)
        ack = await self._wait(self.core.logon(user_id=user, password=password))
        for hook in self._resume_hooks:
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
                pending = self.core.command(m.Flush(cid=cid, ack_type="persisted"), CommandKind.FLUSH_PERSISTED)
                try:
                    await self._wait(pending, min(self.timeout, DISCONNECT_ACK_SECONDS_MAX))
                except errors.ConveyorError:
                    pass
            self._send_now()
            try:
                async with asyncio.timeout(self.timeout):
                    await writer.drain()
            except (ConnectionError, RuntimeError, TimeoutError):
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

    def _tls_for(self, endpoint: Endpoint) -> ssl.SSLContext | None:
        if not endpoint.tls:
            return None
        if self.ssl_context is not None:
            return self.ssl_context
        from conveyor.security.tls import client_context

        return client_context(ca_file=endpoint.ca_file or self.ca_file, cert_file=endpoint.cert_file or self.cert_file,
                              key_file=endpoint.key_file or self.key_file)

    async def _open(self, index: int, uri: str) -> None:
        endpoint = self.core.endpoints[index]
        host, port = endpoint.host, endpoint.port
        try:
            tls = self._tls_for(endpoint)
        except (OSError, ssl.SSLError) as exc:
            raise errors.ClientError(f"cannot use the TLS files for {uri}: {exc}") from None
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls else None)
        except ssl.SSLCertVerificationError as exc:
            raise errors.ConnectionLost(f"cannot connect to {uri}: the server's certificate was refused: "
                                        f"{exc.verify_message or exc}") from None
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
        self._writer = writer
        self._read_task = asyncio.create_task(self._read_loop(reader, writer))

    def _drop_transport(self) -> None:
        """Close the socket and stop its reader without reporting a loss."""
        writer, task = self._writer, self._read_task
        self._writer = None
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
                if self.core.acks_due():
                    self._send_acks()
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
        self._writer = None
        self._read_task = None
        writer.close()
        final = self.core.final  # the server said why it closed: no reconnection (core rule 6)
        if final is not None:
            error = final
        for pending in self.core.connection_lost(error):
            self._complete(pending)
        if self._closing or self.core.state is not S.CONNECTED:
            return  # connect() or the reconnect task sees its own command fail
        if isinstance(final, errors.DisconnectedByAdmin):
            # Deliberate, and the application is told (calls raise it, subscriptions end
            # with it, on_state has the reason): not a warning of the library's own.
            log.info("client %s: %s; not reconnecting", self.client_name, error)
        elif final is not None:
            log.warning("client %s: %s; not reconnecting", self.client_name, error)  # reconnecting would take the name back
        self._move(S.DISCONNECTED, reason=str(error))
        if self.core.reconnect.enabled and final is None:
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
            except (errors.NotAuthenticated, errors.NameInUse) as exc:
                # Credentials or a name another user holds will not get better by retrying.
                self._drop_transport()
                for pending in self.core.connection_lost(errors.ConnectionLost(str(exc))):
                    self._complete(pending)
                log.warning("client %s: reconnection to %s refused: %s", self.client_name, uri, exc)
                self._move(S.FAILED, reason=str(exc), attempt=attempt)
                self._give_up(exc)
                return
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
            sub._stop()
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

    def _complete(self, pending: PendingCommand) -> None:
        if pending.kind is CommandKind.RESUBSCRIBE:
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

    async def _wait(self, pending: PendingCommand, timeout: float | None = None) -> Any:
        if pending.done:
            if pending.error is not None:
                raise pending.error
            return pending.result
        fut = asyncio.get_running_loop().create_future()
        pending.waiter = fut
        self._kick()
        try:
            async with asyncio.timeout(timeout or self.timeout):
                return await fut
        except TimeoutError:
            raise errors.TimedOut(f"no answer from the server within {timeout or self.timeout} s") from None

    async def _request(self, build: Callable[[], PendingCommand], timeout: float | None = None) -> Any:
        await self._wait_connected()
        return await self._wait(build(), timeout)

    # --- publishing ----------------------------------------------------------------------

    def publish_nowait(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None,
                       **sow: Any) -> int:
        """Store and queue a publish; returns its sequence number. Never waits. ``sow``:
        ``delta=True`` (a delta publish), ``sow_key``, ``expiration`` (seconds)."""
        if sow.keys() - _PUBLISH_OPTIONS:
            raise TypeError(f"publish_nowait() got unexpected keyword arguments: {sorted(sow.keys() - _PUBLISH_OPTIONS)}")
        return self._store(topic, data, sequence, correlation_id, sow.get("delta", False), sow.get("sow_key"),
                           sow.get("expiration"))

    async def publish(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None,
                      sow_key: str | None = None, expiration: float | None = None) -> int:
        """Publish; returns the sequence number. Waits only while too many are unpersisted.
        ``sow_key``: the record's key on a SOW topic without Key fields; ``expiration``:
        the record's lifetime in seconds (a SOW topic with Expiration)."""
        seq = self._store(topic, data, sequence, correlation_id, False, sow_key, expiration)
        pace = self._pace(seq)
        if pace is not None:
            await pace
        return seq

    async def delta_publish(self, topic: str, data: Any, *, sequence: int | None = None,
                            correlation_id: str | None = None, sow_key: str | None = None,
                            expiration: float | None = None) -> int:
        """A delta publish: ``data``'s fields merged into the current record of a SOW topic
        (docs/sow-and-views.md); on another topic, a plain publish."""
        seq = self._store(topic, data, sequence, correlation_id, True, sow_key, expiration)
        pace = self._pace(seq)
        if pace is not None:
            await pace
        return seq

    # The publish path is the client's hot loop (a few microseconds a message): no
    # keyword dictionaries and no coroutine unless the caller has to wait.

    def _store(self, topic: str, data: Any, sequence: int | None, correlation_id: str | None, delta: bool,
               sow_key: str | None, expiration: float | None) -> int:
        if self._error is not None:
            raise self._error
        seq = self.core.publish(topic, data, sequence, correlation_id, delta, sow_key, expiration)
        if not self._send_scheduled:
            self._kick()
        return seq

    def _pace(self, seq: int) -> Awaitable[Any] | None:
        """After publish ``seq``: what to wait for, if anything. While too many are
        unpersisted, for the oldest half to be persisted; otherwise, once a batch is
        queued, a loop turn, so it goes out (and acks come in) while the caller goes on
        publishing."""
        if len(self.core.store) > self.max_inflight:
            return self.wait_persisted(seq - self.max_inflight // 2)
        if len(self.core.outgoing) >= SEND_BATCH_COMMANDS:
            return asyncio.sleep(0)
        return None

    def _on_persisted(self, seq: int) -> None:
        self._notify_persisted(seq)
        for listener in self._persisted_listeners:
            listener(seq)

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
            self._raise_publish_error()
            return
        if self._error is not None:
            raise self._error
        fut = asyncio.get_running_loop().create_future()
        self._persist_waiters.append((seq, fut))
        self._kick()
        try:
            async with asyncio.timeout(timeout or self.timeout):
                await fut
        except TimeoutError:
            raise errors.TimedOut(f"publishes up to {seq} not persisted within {timeout or self.timeout} s") from None
        self._raise_publish_error()

    def _raise_publish_error(self) -> None:
        """Report a publish the server refused (once): it was not and will not be persisted."""
        raise_first(self.core.publish_errors)

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
                async with asyncio.timeout(remaining):
                    await self._wait_connected()
            except TimeoutError:
                raise errors.TimedOut(f"not reconnected within {budget} s") from None
            self.core.flush_acks()
            cid = self.core.new_cid()
            pending = self.core.command(m.Flush(cid=cid, ack_type="persisted"), CommandKind.FLUSH_PERSISTED)
            try:
                await self._wait(pending, max(0.001, deadline - loop.time()))
                break
            except errors.ConnectionLost:
                if self.core.state in (S.CONNECTED, S.RECONNECTING) and not self._closing:
                    continue
                raise
        await self.wait_persisted(timeout=max(0.001, deadline - loop.time()))
        self._raise_ack_error()

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
        replace: bool = False,
        command: str = "subscribe",
        orderby: str | None = None,
        paused: bool = False,
    ) -> AsyncSubscription:
        """Subscribe to a topic or a queue.

        ``command``: ``subscribe`` (default), ``delta_subscribe``, ``sow_and_subscribe``
        or ``sow_and_delta_subscribe`` (SOW topics and views: docs/sow-and-views.md; the
        query's records come first, then live changes; ``orderby`` orders the query).

        - no ``handler``/``on_message``: iterate over the result (``async for``, ``get``);
        - ``handler``: called (sync or async) for each message in a task, one at a time;
        - ``on_message``: called inline on the loop as each message arrives (must not block).

        ``bookmark`` replays from the transaction log (``"0"``: the beginning, ``"NOW"``,
        a bookmark: after it, a timestamp). ``max_backlog``: messages the server may
        send ahead of acknowledgements. ``auto_ack`` (default: the client's): iterator,
        asking for the next message acknowledges the previous one; handler/on_message,
        returning acknowledges and raising cancels (the message is redelivered).
        ``replace=True`` changes the topic, filter and backlog of the existing
        subscription ``sub_id`` in place (the server swaps them atomically) and returns
        that subscription, its buffer and handler unchanged. ``paused=True``: made paused,
        sent nothing (a bookmark subscription replays nothing) until :meth:`resume`.
        """
        if replace:
            if paused or bookmark is not None or handler is not None or on_message is not None or auto_ack is not None:
                raise errors.InvalidOption("replace=True changes only the topic, filter, options and backlog")
            await self._wait_connected()
            if sub_id not in self._subs:
                raise errors.UnknownSubscription(f"no subscription {sub_id!r} to replace")
            subscription = self._subs[sub_id]
            await self._replace(subscription.state, topic, filter, options, max_backlog)
            return subscription  # type: ignore[return-value]  # another face's, if it made it
        mode = D.CALLBACK if on_message is not None else D.HANDLER if handler is not None else D.ITERATOR
        state = self.subscription_state(
            topic, filter=filter, options=options, bookmark=bookmark, max_backlog=max_backlog,
            sub_id=sub_id, auto_ack=auto_ack, mode=mode, command=command, orderby=orderby, paused=paused,
        )
        subscription = AsyncSubscription(self, state)
        sink = self._inline(subscription, on_message) if on_message is not None else None
        await self.subscribe_state(subscription, sink=sink)
        if handler is not None:
            subscription._task = asyncio.create_task(subscription._run_handler(handler))
        return subscription

    def subscription_state(self, topic: str, *, sub_id: str | None = None, auto_ack: bool | None = None, **spec: Any) -> SubState:
        """The record of a new subscription with this client's defaults (a fresh
        ``sub_id``, the client's ``auto_ack``), for :meth:`subscribe_state`. ``spec``:
        the rest of :class:`SubState`'s arguments (``filter``, ``options``,
        ``bookmark``, ``max_backlog``, ``mode``)."""
        sub_id = sub_id or f"sub-{self.core.new_cid()}"
        spec.setdefault("confirm", self._confirm_started)  # rule 5 (the blocking face brings its own)
        return SubState(sub_id, topic, auto_ack=self.auto_ack if auto_ack is None else auto_ack, **spec)

    async def subscribe_state(
        self,
        subscription: SubscriptionBase,
        *,
        sink: Callable[[Message], None] | None = None,
        relay: Relay | None = None,
    ) -> None:
        """Subscribe on the server as ``subscription.state`` says, and keep the
        subscription across reconnections (rule 4: the hook another face builds on).

        Messages go to ``sink`` (on the loop), by default the subscription's buffer
        (``subscription.put``). The messages' acker batches acknowledgements in this
        client; ``relay(acker)``, if given, wraps it, so that a face can carry
        acknowledgements made on other threads to the loop. The client ends the
        subscription when it fails or closes, and stops it on ``unsubscribe`` or
        ``disconnect`` (:class:`SubscriptionBase` does both).
        """
        await self._wait_connected()
        state = subscription.state
        sub_id = state.sub_id
        if sub_id in self._subs:
            raise errors.DuplicateSubscription(f"subscription {sub_id!r} already exists in this client")
        acker: Acker = functools.partial(self._ack, sub_id)  # C-level: no extra frame per ack
        acker.many = functools.partial(self._ack_many, sub_id)  # type: ignore[attr-defined]  # a run at once
        state.acker = state.wrap_acker(acker if relay is None else relay(acker))
        state.sink = sink if sink is not None else subscription.put
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

    async def _replace(
        self, state: SubState, topic: str, filter: str | None, options: str | None, max_backlog: int | None
    ) -> None:
        """``replace=True``: the same subscription (and buffer) with a new topic, filter
        or backlog, atomically on the server; resumed as replaced."""
        previous = (state.topic, state.filter, state.options, state.backlog)
        state.replace(topic, filter=filter, options=options, max_backlog=max_backlog)
        try:
            await self._wait(self.core.replace_subscription(state))
        except errors.ConveyorError:
            state.topic, state.filter, state.options, state.backlog = previous
            raise

    def _inline(self, subscription: SubscriptionBase, callback: Callable[[Message], None]) -> Callable[[Message], None]:
        state, core = subscription.state, self.core

        def sink(msg: Message) -> None:
            if state.accept(msg, core.epoch):
                subscription._handle(msg, callback)

        return sink

    def _forget(self, sub_id: str) -> None:
        self.core.remove_subscription(sub_id)
        self._subs.pop(sub_id, None)

    async def unsubscribe(self, sub_id: str) -> None:
        """Send batched acks, then end the subscription (here and on the server)."""
        known = sub_id in self._subs
        sub = self._subs.pop(sub_id, None)
        if sub is not None:
            sub._stop()
            task = sub._task
            if task is not None and task is not asyncio.current_task():
                await asyncio.wait([task], timeout=self.timeout)  # the handler finishes its message
        self.core.remove_subscription(sub_id)
        self.core.flush_acks()
        if self.core.state is not S.CONNECTED and known:
            return  # the server forgot it with the connection; the resume will not send it
        cid = self.core.new_cid()
        try:
            cmd = m.Unsubscribe(sub_id=sub_id, cid=cid, ack_type="processed")
            await self._request(lambda: self.core.command(cmd, CommandKind.UNSUBSCRIBE))
        except errors.ConnectionLost:
            if not known:
                raise

    async def pause(self, sub_id: str | Sequence[str]) -> None:
        """Pause subscriptions (an id, a comma list or a list; all or none): the server
        sends them nothing until :meth:`resume` (docs/client.md, "Pause and resume")."""
        await self._set_paused(sub_id, True)

    async def resume(self, sub_id: str | Sequence[str]) -> None:
        """Resume paused subscriptions (as :meth:`pause`)."""
        await self._set_paused(sub_id, False)

    async def _set_paused(self, sub_id: str | Sequence[str], paused: bool) -> None:
        if (pending := self.core.pause_subscriptions(sub_ids(sub_id), paused)) is not None:
            await self._wait(pending)  # offline, the resubscription after the logon carries it

    async def sow(self, topic: str, *, filter: str | None = None, top_n: int | None = None,
                  orderby: str | None = None, options: str | None = None, sow_keys: list[str] | str | None = None,
                  batch_size: int | None = None) -> list[Message]:
        """A query: the messages waiting in a queue (nothing is leased), or the records of
        a SOW topic or view (docs/sow-and-views.md: ``orderby``, ``options`` such as
        ``skip_n=10`` or ``projection=[...],grouping=[...]``, ``sow_keys``)."""
        if isinstance(sow_keys, (list, tuple)):
            sow_keys = ",".join(sow_keys)

        def build() -> PendingCommand:
            cid = self.core.new_cid()
            cmd = m.Sow(topic=topic, cid=cid, query_id=cid, filter=filter, top_n=top_n, ack_type="completed",
                        orderby=orderby, options=options, sow_keys=sow_keys, batch_size=batch_size)
            return self.core.command(cmd, CommandKind.SOW)

        await self._wait_connected()
        pending = build()
        await self._wait(pending)
        return pending.messages

    async def sow_delete(
        self, topic: str, *, bookmarks: list[str] | str | None = None, filter: str | None = None, options: str | None = None,
        sow_keys: list[str] | str | None = None, data: Any = None,
    ) -> int:
        """Acknowledge queue messages by bookmark or filter at once, or delete records of a
        SOW topic by filter, ``sow_keys`` or ``data`` (the record it would update);
        returns how many were removed."""
        if isinstance(bookmarks, (list, tuple)):
            bookmarks = ",".join(bookmarks)
        if isinstance(sow_keys, (list, tuple)):
            sow_keys = ",".join(sow_keys)
        body = None if data is None else to_bytes(data)

        def build() -> PendingCommand:
            cid = self.core.new_cid()
            cmd = m.SowDelete(topic=topic, bookmark=bookmarks, filter=filter, options=options, cid=cid,
                              ack_type="processed", sow_keys=sow_keys, data=body)
            return self.core.command(cmd, CommandKind.SOW_DELETE)

        ack = await self._request(build)
        return ack.records_deleted or 0
