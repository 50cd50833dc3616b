"""The blocking face of the client: the asyncio client on a private loop thread.

Every protocol decision is made by the same :class:`~conveyor.client.core.ClientCore`
the asyncio client uses; this module only carries calls across threads. Rules:

1. **Hand-overs are batched.** ``publish()`` and ``Message.ack()`` append to one
   deque and wake the loop once per batch (not per call), so a blocking publisher or a
   consumer acking every message still gets one frame per group. Order is kept:
   publishes and acks reach the core in the order the application made them.
2. **Before a reconnection resumes**, the hand-over is drained on the loop thread, so
   acks the application made during the outage are resent ahead of the resubscription.
3. **Iterators read on the application's thread; handlers run on a thread of their
   own** (one per handler subscription, named ``conveyor-handler-<sub_id>``): a slow
   handler never stalls the network loop or other subscriptions, and messages of one
   subscription are handled one at a time, in order.
4. ``on_state`` listeners run on the loop thread: they must return quickly and must
   not call the blocking client.
5. **Built on the asyncio client's public hooks** only: a :class:`Subscription` is a
   subscription object of this face's own, subscribed with
   :meth:`AsyncClient.subscribe_state` (its acknowledgements relayed through the
   hand-over); :meth:`AsyncClient.on_persisted` wakes publishers waiting for room and
   :meth:`AsyncClient.before_resume` keeps rule 2.
6. **An interrupt never hangs disconnect().** A KeyboardInterrupt can leave the
   hand-over lock held (between its acquire and the ``with`` block); disconnect()
   finds it so after a second and releases it, then sends what was handed over.
7. **The application's thread never blocks without a bound.** Waits for a message or for
   the loop's answer are slices of :data:`SIGNAL_POLL_S`: a SIGINT whose handler ran just
   before the thread went to sleep (or on another thread) is raised as KeyboardInterrupt
   within one slice, instead of when the next message arrives, which may be never.
8. **A confirmed acknowledgement waits for its answer** (``msg.ack(confirm=True)``,
   docs/client.md, "Stale acknowledgements"): on the caller's thread, after what was
   handed over before it (rule 1), and returns True (applied) or False (refused).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, Sequence

import uvloop

from conveyor import errors
from conveyor.client.aio import AsyncClient
from conveyor.client.core import ClientCore, ClientStatistics, Message
from conveyor.client.message import Acker, AckVerb, Settlement, with_delivery
from conveyor.client.state import ConnectionState, StateChange
from conveyor.client.subscription import DeliveryMode, SubscriptionBase

_PUBLISH, _ACK = 0, 1
log = logging.getLogger("conveyor.client")

HANDLER_JOIN_SECONDS = 5.0  # disconnect() waits this long for a handler to finish its message
HAND_OVER_LOCK_WAIT_S = 1.0  # rule 6: the lock is held for microseconds; this long means it was orphaned
SIGNAL_POLL_S = 0.5  # rule 7: the longest a Ctrl-C waits to be noticed by a blocked application thread


class Subscription(SubscriptionBase):
    """The messages of one subscription: ``for msg in sub`` or ``sub.get(timeout)``.

    The server sends up to the subscription's backlog ahead (smart pipelining); they
    wait in this object's buffer, so the next message is ready the moment it is asked for.
    """

    def __init__(self, client: "Client", state) -> None:
        super().__init__(client, state)
        # Filled on the loop thread with what one turn of the loop received, as one item
        # (a list when several): the reading thread wakes once per turn, not per message,
        # and takes the rest without contending with the loop for each.
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._turn: list | None = None  # this turn's items, not yet in the inbox
        self._ready: deque = deque()  # taken from the inbox, not yet handed out (reader's thread)
        self._loop = client._loop
        self._loop_thread = client._thread
        self._thread: threading.Thread | None = None

    def put(self, item: Any) -> None:  # type: ignore[override]
        if threading.get_ident() != self._loop_thread.ident:
            self._inbox.put(item)  # the end marker of a stop, from the application's thread
            return
        turn = self._turn
        if turn is None:
            self._turn = [item]
            self._loop.call_soon(self._end_of_turn)
        else:
            turn.append(item)

    def _end_of_turn(self) -> None:
        turn, self._turn = self._turn, None
        if turn:
            self._inbox.put(turn if len(turn) > 1 else turn[0])

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self.get()
            if msg is None:
                return
            yield msg

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (or at the end).

        With auto-ack, asking acknowledges the message this returned last.
        """
        self.state.asking()
        return self._next(timeout)

    def _next(self, timeout: float | None) -> Message | None:
        inbox, ready = self._inbox, self._ready
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended:
            if ready:
                item = ready.popleft()
            else:
                try:
                    if deadline is None:
                        item = inbox.get(timeout=SIGNAL_POLL_S)
                    else:
                        item = inbox.get(timeout=min(SIGNAL_POLL_S, max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    if deadline is None or time.monotonic() < deadline:
                        continue  # rule 7: back in Python, where a pending signal is raised
                    return None
                if type(item) is list:
                    ready.extend(item)
                    continue
            msg = self._take(item)
            if msg is not None:
                return msg
        return None

    def unsubscribe(self) -> None:
        self.client.unsubscribe(self.sub_id)

    def pause(self) -> None:
        """:meth:`Client.pause` of this subscription."""
        self.client.pause(self.sub_id)

    def resume(self) -> None:
        """:meth:`Client.resume` of this subscription."""
        self.client.resume(self.sub_id)

    def _start_handler(self, handler: Callable[[Message], None]) -> None:
        self._thread = threading.Thread(
            target=self._run_handler, args=(handler,), name=f"conveyor-handler-{self.sub_id}", daemon=True
        )
        self._thread.start()

    def _run_handler(self, handler: Callable[[Message], None]) -> None:
        while (msg := self._next(None)) is not None:
            self._handle(msg, handler)

    def _join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


class Client:
    """The blocking client. See docs/client.md.

    Takes the arguments of :class:`AsyncClient` (``client_name``, then ``publish_store``,
    ``auto_ack``, ``ack_batch_size``, ``ack_batch_seconds``, ``max_inflight``,
    ``timeout``, ``reconnect``, ``max_reconnect_attempts``, ``reconnect_timeout``,
    ``user_id``, ``password``, ``ca_file``, ``cert_file``, ``key_file``, ``ssl_context``)
    and passes them to the asyncio client it runs.
    """

    def __init__(self, client_name: str | None = None, **options: Any) -> None:
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="conveyor-client", daemon=True)
        self._thread.start()
        try:
            self._aio: AsyncClient = self._call(self._make(client_name, options))
        except BaseException:
            self._stop_loop()
            raise
        self.timeout = self._aio.timeout
        self._ack_by_bookmark = self._aio.ack  # one object, so that a run of ack() calls is merged
        self._handover: deque = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._inflight = threading.Condition()
        self._aio.on_persisted(self._wake_publishers)
        self._aio.on_state(self._wake_publishers)
        self._aio.before_resume(self._drain_handover)  # rule 2
        self._subs: dict[str, Subscription] = {}

    @staticmethod
    async def _make(name: str | None, options: dict) -> AsyncClient:
        return AsyncClient(name, **options)

    def _call(self, coro, timeout: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SIGNAL_POLL_S if deadline is None else min(SIGNAL_POLL_S, deadline - time.monotonic())
            try:
                return future.result(max(0.0, left))
            except TimeoutError as exc:
                if future.done():  # the call itself timed out (asyncio.TimeoutError)
                    raise errors.TimedOut(str(exc) or "the call timed out") from exc
                if deadline is None or time.monotonic() < deadline:
                    continue  # rule 7
                future.cancel()
                raise errors.TimedOut("the client's loop did not answer in time") from None

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    # --- views ---------------------------------------------------------------------------

    @property
    def client_name(self) -> str:
        return self._aio.client_name

    @property
    def core(self) -> ClientCore:
        return self._aio.core

    @property
    def state(self) -> ConnectionState:
        return self._aio.core.state

    def statistics(self) -> ClientStatistics:
        return self._aio.core.statistics()

    def on_state(self, callback: Callable[[StateChange], None]) -> Callable[[StateChange], None]:
        """Call ``callback(change)`` on every connection state change (on the loop thread)."""
        return self._aio.on_state(callback)

    def on_ack_refused(
        self, callback: Callable[[str, list[str], errors.ConveyorError], None]
    ) -> Callable[[str, list[str], errors.ConveyorError], None]:
        """Call ``callback(queue, bookmarks, error)`` (on the loop thread) each time the
        server refuses batched acknowledgements (:meth:`AsyncClient.on_ack_refused`)."""
        return self._aio.on_ack_refused(callback)

    # --- connection ----------------------------------------------------------------------

    def connect(self, uri: str | Sequence[str], *, logon: bool = True) -> "Client":
        """Connect to the first server of ``uri`` (one URI or a list) that answers."""
        self._call(self._aio.connect(uri, logon=logon))
        return self

    def logon(self) -> None:
        self._call(self._aio.logon())

    def disconnect(self) -> None:
        """Stop handlers (each finishes its message), send batched acks, close. Idempotent."""
        if self._loop.is_closed():
            return
        handlers = [sub for sub in self._subs.values() if sub._thread is not None]
        for sub in handlers:
            sub._stop()
        for sub in handlers:
            sub._join(HANDLER_JOIN_SECONDS)
        self._recover_hand_over_lock()
        try:
            self._drain_blocking()
            self._call(self._aio.disconnect(), timeout=self.timeout + HANDLER_JOIN_SECONDS)
        finally:
            for sub in self._subs.values():
                sub._end()
            self._wake_publishers()
            self._stop_loop()

    close = disconnect

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disconnect()

    # --- the hand-over (rule 1) ----------------------------------------------------------

    def _hand_over(self, item: tuple | list) -> None:
        with self._lock:
            self._handover.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain_handover)

    def _hand_over_ack(self, acker: Acker, queue_name: str, bookmark: str, verb: Settlement) -> None:
        """An acknowledgement joins the run of acks of the same acker, queue and verb at
        the end of the hand-over (the loop takes a run in one call), or starts one."""
        with self._lock:
            handover = self._handover
            if handover:
                last = handover[-1]
                if last[0] == _ACK and last[1] is acker and last[4] is verb and last[2] == queue_name:
                    last[3].append(bookmark)
                    return
            handover.append([_ACK, acker, queue_name, [bookmark], verb])
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain_handover)

    def _drain_handover(self) -> None:
        """On the loop thread: feed the core what the application handed over."""
        with self._lock:
            self._scheduled = False
            if not self._handover:
                return
            items = list(self._handover)
            self._handover.clear()
        aio = self._aio
        for item in items:
            if item[0] == _PUBLISH:
                _, topic, data, sequence, corr, sow = item
                try:
                    aio.publish_nowait(topic, data, sequence=sequence, correlation_id=corr, **sow)
                except errors.ConveyorError:
                    pass  # the client failed after publish() checked: the next call raises
                continue
            _, acker, queue_name, bookmarks, verb = item
            many = getattr(acker, "many", None)
            if many is not None:
                many(queue_name, bookmarks, verb)  # the run enters the batch at once
            else:
                for bookmark in bookmarks:
                    acker(queue_name, bookmark, verb)

    def _recover_hand_over_lock(self) -> None:
        """Rule 6: the hand-over lock is held for a few appends at a time. Still held
        after :data:`HAND_OVER_LOCK_WAIT_S`, it was left so by a KeyboardInterrupt that
        landed between acquiring it and the ``with`` block that releases it (CPython does
        not guarantee that release); the loop thread would wait for it for ever, and
        disconnect() with it. Release it: what was handed over is still in the deque."""
        if self._lock.acquire(timeout=HAND_OVER_LOCK_WAIT_S):
            self._lock.release()
            return
        log.warning("client %s: the hand-over lock was left held (an interrupt inside it): released",
                    self._aio.client_name)
        self._lock.release()
        self._scheduled = False

    def _drain_blocking(self) -> None:
        async def drain() -> None:
            self._drain_handover()

        self._call(drain())

    # --- publishing ----------------------------------------------------------------------

    def publish(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None,
                sow_key: str | None = None, expiration: float | None = None) -> None:
        """Publish; returns at once. The message enters the publish store on the client's
        loop thread (at once) and is kept there until the server persists it. Waits only
        while ``max_inflight`` publishes are unpersisted. ``sow_key``, ``expiration``: as
        :meth:`AsyncClient.publish`."""
        self._publish(topic, data, sequence, correlation_id, sow_key=sow_key, expiration=expiration)

    def delta_publish(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None,
                      sow_key: str | None = None, expiration: float | None = None) -> None:
        """A delta publish (:meth:`AsyncClient.delta_publish`); returns at once, as :meth:`publish`."""
        self._publish(topic, data, sequence, correlation_id, delta=True, sow_key=sow_key, expiration=expiration)

    def _publish(self, topic: str, data: Any, sequence: int | None, correlation_id: str | None, **sow: Any) -> None:
        if self._aio.error is not None:
            raise self._aio.error
        if len(self._aio.core.store) + len(self._handover) > self._aio.max_inflight:
            self._wait_room()
        sow = {k: v for k, v in sow.items() if v is not None and v is not False}
        self._hand_over((_PUBLISH, topic, data, sequence, correlation_id, sow))

    def _wake_publishers(self, *_change: Any) -> None:
        """A persisted ack or a state change: publishers waiting for room look again."""
        with self._inflight:
            self._inflight.notify_all()

    def _wait_room(self) -> None:
        """Wait until the store is half drained. An outage is waited out (the client is
        reconnecting); a connected server that persists nothing for ``timeout`` is not."""
        aio, limit = self._aio, self._aio.max_inflight // 2
        deadline = time.monotonic() + self.timeout
        with self._inflight:
            while len(aio.core.store) + len(self._handover) > limit:
                if aio.error is not None:
                    raise aio.error
                if aio.core.state is ConnectionState.RECONNECTING:
                    deadline = time.monotonic() + self.timeout
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise errors.TimedOut("publishes are not being persisted")
                self._inflight.wait(min(remaining, 0.5))

    def wait_persisted(self, timeout: float | None = None) -> None:
        """Wait until everything published so far is persisted (no acks are sent)."""
        self._drain_blocking()
        self._call(self._aio.wait_persisted(timeout=timeout))

    def flush(self, timeout: float | None = None) -> None:
        """Send batched acks and wait until everything published and acknowledged so far
        is persisted (a reconnection is waited out)."""
        self._drain_blocking()
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
        handler: Callable[[Message], None] | None = None,
        auto_ack: bool | None = None,
        replace: bool = False,
        command: str = "subscribe",
        orderby: str | None = None,
        paused: bool = False,
    ) -> Subscription:
        """Subscribe to a topic or a queue (arguments as :meth:`AsyncClient.subscribe`).

        Without ``handler``, iterate over the result on your thread. With ``handler``,
        it is called for each message on a thread of the subscription's own.
        ``replace=True``: the subscription ``sub_id``, buffer and handler unchanged,
        with a new topic, filter or backlog. ``paused=True``: made paused (:meth:`resume`).
        """
        self._drain_blocking()  # acks handed over so far go first
        if replace:
            return self._call(
                self._aio.subscribe(
                    topic, filter=filter, options=options, bookmark=bookmark, max_backlog=max_backlog,
                    sub_id=sub_id, handler=handler, auto_ack=auto_ack, replace=True, paused=paused,
                )
            )
        state = self._aio.subscription_state(
            topic, filter=filter, options=options, bookmark=bookmark, max_backlog=max_backlog, sub_id=sub_id,
            auto_ack=auto_ack, mode=DeliveryMode.HANDLER if handler is not None else DeliveryMode.ITERATOR,
            command=command, orderby=orderby, paused=paused, confirm=self._confirm_blocking,  # rule 8
        )
        sub = Subscription(self, state)
        self._call(self._aio.subscribe_state(sub, relay=self._relay))
        self._subs[state.sub_id] = sub
        if handler is not None:
            sub._start_handler(handler)
        return sub

    def _relay(self, acker: Acker) -> Acker:
        """Acknowledgements made on the application's threads reach the loop through the
        hand-over, in order with publishes (rule 1)."""
        return functools.partial(self._hand_over_ack, acker)

    def unsubscribe(self, sub_id: str) -> None:
        """Send batched acks, then end the subscription (a handler finishes its message)."""
        sub = self._subs.pop(sub_id, None)
        if sub is not None:
            sub._stop()
            sub._join(HANDLER_JOIN_SECONDS)
        self._drain_blocking()
        self._call(self._aio.unsubscribe(sub_id))

    def pause(self, sub_id: str | Sequence[str]) -> None:
        """Pause subscriptions (:meth:`AsyncClient.pause`); acks handed over so far go first."""
        self._drain_blocking()
        self._call(self._aio.pause(sub_id))

    def resume(self, sub_id: str | Sequence[str]) -> None:
        """Resume paused subscriptions (:meth:`AsyncClient.resume`)."""
        self._call(self._aio.resume(sub_id))

    def sow(self, topic: str, *, filter: str | None = None, top_n: int | None = None, orderby: str | None = None,
            options: str | None = None, sow_keys: list[str] | str | None = None,
            batch_size: int | None = None) -> list[Message]:
        """A query (:meth:`AsyncClient.sow`)."""
        return self._call(self._aio.sow(topic, filter=filter, top_n=top_n, orderby=orderby, options=options,
                                        sow_keys=sow_keys, batch_size=batch_size))

    def sow_delete(
        self, topic: str, *, bookmarks: list[str] | str | None = None, filter: str | None = None, options: str | None = None,
        sow_keys: list[str] | str | None = None, data: Any = None,
    ) -> int:
        """Acknowledge queue messages, or delete SOW records (:meth:`AsyncClient.sow_delete`)."""
        self._drain_blocking()  # publishes handed over so far go first
        return self._call(self._aio.sow_delete(topic, bookmarks=bookmarks, filter=filter, options=options,
                                               sow_keys=sow_keys, data=data))

    def ack(self, queue_name: str, bookmark: str, verb: AckVerb | str = AckVerb.ACK, *,
            delivery: int | None = None) -> None:
        """Batch an acknowledgement of a queue message by its bookmark (``verb``: ack,
        cancel or expire; ``delivery``: the delivery it settles, refused once stale).
        For a message in hand, call ``msg.ack()`` instead."""
        self._hand_over_ack(self._ack_by_bookmark, queue_name, with_delivery(bookmark, delivery), AckVerb(verb))

    def _confirm_blocking(self, queue_name: str, bookmark: str, delivery: int | None, sub_id: str | None) -> bool:
        return self.confirm_ack(queue_name, bookmark, delivery, sub_id=sub_id)

    def confirm_ack(self, queue_name: str, bookmark: str, delivery: int | None = None, *,
                    sub_id: str | None = None) -> bool:
        """Acknowledge one queue message at once and wait for the server's answer: True
        when applied, False when refused (rule 8; :meth:`AsyncClient.confirm_ack`)."""

        async def confirm() -> bool:
            self._drain_handover()  # what was handed over before it goes first (rule 1)
            return await self._aio.confirm_ack(queue_name, bookmark, delivery, sub_id=sub_id)

        return bool(self._call(confirm()))
