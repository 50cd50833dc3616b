"""The client's record of one subscription: what to resubscribe, and the ack rules.

Rules kept here (shared by both faces; the faces only move messages between threads):

1. **Resubscribe as subscribed.** After a reconnect the same ``sub_id``, topic, filter
   and options (as last replaced; ``replace`` itself applies to one command only) are
   sent again. A bookmark subscription resumes *after* the last message the
   application was handed (``last_bookmark``), so nothing is missed or repeated;
   before any, it starts from its original bookmark.
2. **Messages buffered from a lost connection are dropped**, if they came from a queue
   (their leases were broken: the server redelivers them) or from a bookmark
   subscription (the resume replays them). Plain pub/sub messages are kept.
3. **An acknowledged message is never handed out again.** The bookmarks the
   application acknowledged recently are remembered; a redelivery of one (the lease was
   broken before the ack reached the server, which the resent ack then settles) is
   dropped. ``cancel`` is not remembered: a cancelled message is meant to come back,
   nor is a touch (it settles nothing), nor an acknowledgement the server refused
   (:meth:`SubState.forget_acks`): the message is still in the queue, and may come back.
4. **Auto-ack.** Iterator: asking for the next message acknowledges the previous one.
   Handler: returning acknowledges, raising cancels (so the message is redelivered).
   A message the application settled itself is left as it is.
5. **Ack batches follow the backlog.** Acks are sent when ``min(ack_batch_size,
   backlog // 2)`` are waiting for this subscription, or when every message it holds
   is acknowledged (the server will send nothing more until it hears), or after
   ``ack_batch_seconds`` (the face's timer).
6. **One hand-out rule for both faces.** :class:`SubscriptionBase` decides what leaves
   a subscription's buffer (the end marker, a stop, rules 2 and 3) and how a handler's
   outcome settles its message (rule 4). A face adds only the buffer and the waiting:
   an ``asyncio.Queue`` read on the loop, or a thread-safe queue read on the
   application's or the handler's thread.
7. **Across instances, by time and by what was seen.** Bookmarks name positions in
   one instance's journal. When the client logs on to an instance with another journal
   (it failed over to a replica), a bookmark subscription resumes from the publish time
   of the last message it handed out, less :data:`CROSS_INSTANCE_MARGIN_S`, and drops
   every message whose sequence is not above the highest it has handed out from the
   same publisher (each publisher's messages keep their order on every instance).
8. **Paused stays paused.** ``paused`` is part of what is resubscribed: a subscription
   paused on the server is resubscribed with the ``pause`` option after a reconnect, so
   it is made paused there (a bookmark one from its resume point, as in rule 1: nothing
   is missed or repeated when it is resumed). ``pause`` and ``resume`` are never in an
   options string: they apply to one command.

9. **A long handler keeps its lease.** While a handler works on a queue message whose
   lease ends at a known time, the subscription's lease keeper (on the client's loop)
   touches the message every third of the time its lease had left when the handler
   took it (never more often than :data:`TOUCH_EVERY_MIN_S`), so a handler slower
   than the queue's LeasePeriod keeps its message (docs/queues.md, "Touch"). One timer
   per handler subscription, armed only while a message is in hand; the handler's
   thread only records which message that is. An asyncio handler that blocks the loop
   cannot be touched.

``accept`` runs on the application's thread in the blocking face, while resubscribing
runs on the loop thread; ``_guard`` makes "check the connection, record the bookmark"
and "read the resume point" atomic with respect to each other.
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Sequence

from conveyor import errors
from conveyor.client.message import DELIVERY_MARK, Acker, AckVerb, AckWith, Confirmer, Message, Settlement
from conveyor.protocol import messages as m

log = logging.getLogger("conveyor.client")

TOUCH_EVERY_MIN_S = 0.1  # rule 9: the lease keeper's shortest interval

RECENT_ACKS_MIN = 4096  # acknowledged bookmarks remembered per subscription (rule 3)
#: Rule 7: how far before the last message's publish time a subscription that moved to
#: another instance replays. A message that reached the new instance this much earlier
#: than a later one that the old instance delivered first would be missed (clock skew
#: between publishing instances and replication lag must stay below it).
CROSS_INSTANCE_MARGIN_S = 60.0
END = object()  # put into a subscription's buffer: nothing comes after it

#: ``handler(msg)``: called for each message; the asyncio face also awaits what it returns.
Handler = Callable[[Message], "None | Awaitable[None]"]


class DeliveryMode(enum.Enum):
    """How the application receives a subscription's messages."""

    ITERATOR = "iterator"  # get() / iteration: auto-ack acknowledges on the next ask
    HANDLER = "handler"  # a handler, one message at a time, off the network loop
    CALLBACK = "callback"  # on_message, inline on the loop (asyncio face only)


def backlog_from_options(options: str | None) -> int | None:
    for part in (options or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "max_backlog" and value.strip().isdigit():
            return int(value)
    return None


def merge_backlog(options: str | None, max_backlog: int | None) -> str | None:
    if max_backlog is None:
        return options
    return f"{options},max_backlog={max_backlog}" if options else f"max_backlog={max_backlog}"


#: Options that act once, each with the call that sends it: an options string is resent
#: on every resubscription (rule 1), where they would fail or mislead.
_CALL_FOR = {"replace": "subscribe(..., replace=True)", "pause": "subscribe(..., paused=True) or pause(sub_id)",
             "resume": "resume(sub_id)"}


def refuse_replace_option(options: str | None) -> None:
    """``replace``, ``pause`` and ``resume`` are calls, not options strings (rules 1 and 8)."""
    for part in (options or "").split(","):
        call = _CALL_FOR.get(part.strip())
        if call is not None:
            raise errors.InvalidOption(f"{part.strip()} is not an option string here: call {call}")


def sub_ids(sub_id: str | Sequence[str]) -> list[str]:
    """One id, a comma list or a sequence of ids -> the ids, in order, without repeats."""
    parts = sub_id.split(",") if isinstance(sub_id, str) else list(sub_id)
    return list(dict.fromkeys(p.strip() for p in parts if p.strip()))


_ITERATOR = DeliveryMode.ITERATOR  # per-message checks: a global, not an enum lookup
_COMMANDS = ("subscribe", "delta_subscribe", "sow_and_subscribe", "sow_and_delta_subscribe")
_CANCEL, _TOUCH = AckVerb.CANCEL, AckVerb.TOUCH


class SubState:
    """One subscription, as the core keeps it across connections."""

    def __init__(
        self,
        sub_id: str,
        topic: str,
        *,
        filter: str | None = None,
        options: str | None = None,
        bookmark: str | None = None,
        max_backlog: int | None = None,
        auto_ack: bool = False,
        mode: DeliveryMode = DeliveryMode.ITERATOR,
        command: str = "subscribe",
        orderby: str | None = None,
        paused: bool = False,
        confirm: Confirmer | None = None,
    ) -> None:
        refuse_replace_option(options)
        if command not in _COMMANDS:
            raise errors.InvalidOption(f"unknown subscribe command {command!r} (one of {', '.join(_COMMANDS)})")
        self.kind = command  # subscribe, delta_subscribe, sow_and_subscribe, sow_and_delta_subscribe
        self.orderby = orderby  # the query part of a sow_and_* subscription
        self.sub_id = sub_id
        self.topic = topic
        self.filter = filter
        self.options = merge_backlog(options, max_backlog)
        self.bookmark = bookmark  # where it started: None for queue and live subscriptions
        self.backlog = backlog_from_options(self.options)
        self.auto_ack = auto_ack
        self.mode = mode
        self.paused = paused  # rule 8: resubscribed paused
        self.sink: Callable[[Message], None] = _drop  # the face's buffer or callback
        self.acker: Acker | None = None
        #: ``ack(confirm=True)`` of its messages: the face's confirmer (message.py rule 3)
        self.confirm = confirm
        self.last_bookmark: str | None = None  # last handed to the application
        self.last_timestamp: float | None = None  # its publish time (rule 7)
        self._latest: dict[str, str] = {}  # rule 7: publisher -> "seq|position" of its last message handed out
        self._seen: dict[str, int] | None = None  # rule 7, once crossed: publisher -> highest seq handed out
        self.previous: Message | None = None  # auto-ack in iterator mode
        self.outstanding = 0  # queue messages received on this connection, not yet acked
        self.acks_pending = 0  # acks batched for it, not yet sent
        self.error: Exception | None = None  # why it ended, if it failed
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._recent_max = max(RECENT_ACKS_MIN, 4 * (self.backlog or 1))
        self._guard = threading.Lock()

    # --- on the wire ---------------------------------------------------------------

    def resume_bookmark(self) -> str | None:
        with self._guard:
            return self.last_bookmark or self.bookmark

    def crossed_journals(self) -> None:
        """Rule 7: the next logon is to an instance with another journal."""
        if self.bookmark is None:
            return
        with self._guard:
            seen = self._seen or {}
            for publisher, rest in self._latest.items():
                seq = int(rest.partition("|")[0])
                if seq > seen.get(publisher, -1):
                    seen[publisher] = seq
            self._seen = seen
            if self.last_timestamp is not None:
                self.last_bookmark = _utc_text(self.last_timestamp - CROSS_INSTANCE_MARGIN_S)

    def command(self, cid: str, *, replace: bool = False):
        """The subscribe command: the first, a ``replace``, or a resume after a reconnect.
        A ``sow_and_*`` subscription queries again on a resume (its query's messages
        carry the sub_id as their query_id)."""
        # a replace goes on from where the replay is: the server refuses one that names a
        # bookmark (InvalidOption), so only a first subscribe or a resume carries it
        bookmark = self.resume_bookmark() if self.bookmark is not None and not replace else None
        options = self.options
        if replace:
            options = f"replace,{options}" if options else "replace"
        elif self.paused:  # rule 8: made paused (a replace keeps it paused on the server)
            options = f"pause,{options}" if options else "pause"
        if self.kind in ("sow_and_subscribe", "sow_and_delta_subscribe"):
            cls = m.SowAndSubscribe if self.kind == "sow_and_subscribe" else m.SowAndDeltaSubscribe
            return cls(topic=self.topic, sub_id=self.sub_id, query_id=self.sub_id, cid=cid, ack_type="processed",
                       filter=self.filter, options=options, orderby=self.orderby)
        cls = m.DeltaSubscribe if self.kind == "delta_subscribe" else m.Subscribe
        return cls(
            topic=self.topic, sub_id=self.sub_id, cid=cid, ack_type="processed",
            filter=self.filter, options=options, bookmark=bookmark,
        )

    def replace(self, topic: str, *, filter: str | None, options: str | None, max_backlog: int | None) -> None:
        """The subscription's new topic, filter and options (``replace=True``)."""
        refuse_replace_option(options)
        self.topic = topic
        self.filter = filter
        self.options = merge_backlog(options, max_backlog)
        self.backlog = backlog_from_options(self.options)

    def mark_paused(self, paused: bool) -> bool:
        """Rule 8: resubscribe paused (or not) from now on; returns the mark it had."""
        was, self.paused = self.paused, paused
        return was

    def all_acked(self) -> bool:
        """Every message the server leased us is acknowledged here (it sends nothing more
        until it hears of them)."""
        return self.acks_pending >= self.outstanding

    def ack_threshold(self, batch_size: int) -> int:
        return max(1, min(batch_size, (self.backlog or 1) // 2))

    # --- acknowledgements ----------------------------------------------------------

    def wrap_acker(self, ack: Acker) -> Acker:
        """The acker messages of this subscription carry: remember, then batch."""

        def acker(queue: str, bookmark: str, verb: Settlement) -> None:
            if verb is not _CANCEL and verb is not _TOUCH and not (type(verb) is AckWith and verb.verb is _CANCEL):
                self.note_ack(bookmark.partition(DELIVERY_MARK)[0])  # message.py rule 4
            ack(queue, bookmark, verb)

        return acker

    def confirmed(self, bookmark: str) -> None:
        """An ``ack(confirm=True)`` sent at once (not batched): one message fewer held,
        remembered as acknowledged (rule 3)."""
        self.outstanding = max(0, self.outstanding - 1)
        self.note_ack(bookmark)

    def forget_acks(self, bookmarks: Sequence[str]) -> None:
        """Rule 3: acknowledgements the server refused; a redelivery of them is handed out."""
        recent = self._recent
        for bookmark in bookmarks:
            recent.pop(bookmark, None)

    def note_ack(self, bookmark: str) -> None:
        recent = self._recent
        recent[bookmark] = None
        if len(recent) > self._recent_max:
            recent.popitem(last=False)

    # --- handing messages to the application ---------------------------------------

    def asking(self) -> None:
        """The application asks for a message: with auto-ack, it is done with the last."""
        previous = self.previous
        if previous is not None:
            self.previous = None
            if not previous.acked:
                previous.ack()

    def accept(self, msg: Message, epoch: int) -> bool:
        """Whether ``msg`` may be handed to the application now (rules 2 and 3)."""
        if msg.queue is not None:
            if msg._epoch != epoch or msg.bookmark in self._recent:
                return False
        elif self.bookmark is not None:
            with self._guard:
                if msg._epoch != epoch:
                    return False
                bookmark = msg.bookmark
                if bookmark is not None:
                    publisher, _, rest = bookmark.partition("|")
                    seen = self._seen
                    if seen is not None and int(rest.partition("|")[0]) <= seen.get(publisher, -1):
                        return False  # rule 7: handed out already, from the other instance
                    self._latest[publisher] = rest
                self.last_bookmark = bookmark
                self.last_timestamp = msg.timestamp
        if self.auto_ack and self.mode is _ITERATOR:
            self.previous = msg
        return True

    def finished(self, msg: Message, error: BaseException | None) -> None:
        """A handler returned (``error`` None) or raised: auto-ack or cancel (rule 4)."""
        if error is not None:
            log.error("handler of subscription %s raised on %s", self.sub_id, msg.bookmark, exc_info=error)
        if self.auto_ack and not msg.acked:
            if error is None:
                msg.ack()
            else:
                msg.cancel()


class SubscriptionBase:
    """What both faces' subscription objects share (rule 6).

    A face subclasses it and implements :meth:`put`, its buffer. The client puts each
    delivered message there (on its loop), ends the subscription with :meth:`_end` and
    stops a handler with :meth:`_stop`; the face reads the buffer and hands each item
    to :meth:`_take`. ``client`` is the face's client (its ``core`` says the current
    connection epoch).
    """

    def __init__(self, client: Any, state: SubState) -> None:
        self.client = client
        self.state = state
        self._ended = False  # the end marker was read: get() returns None from now on
        self._stopping = False  # hand out nothing more (unsubscribe, disconnect)
        self._task: Any = None  # the asyncio face's handler task (the blocking face joins threads)
        self._keeper: _LeaseKeeper | None = None  # rule 9, made by the first message a handler takes

    @property
    def sub_id(self) -> str:
        return self.state.sub_id

    @property
    def error(self) -> Exception | None:
        """Why the subscription ended, if the server refused to resume it."""
        return self.state.error

    @property
    def paused(self) -> bool:
        """Paused (``pause()``, ``subscribe(..., paused=True)``): the server sends it nothing."""
        return self.state.paused

    @property
    def ended(self) -> bool:
        """The subscription has ended and its buffer is read: ``get`` returns None at once."""
        return self._ended

    def put(self, item: Any) -> None:
        """Buffer a message (or :data:`END`) for the application. Called by the client,
        on its loop; the face implements it."""
        raise NotImplementedError

    def _end(self, error: Exception | None = None) -> None:
        """No more messages: the iterator ends after what is buffered."""
        if error is not None and self.state.error is None:
            self.state.error = error
        self.put(END)

    def _stop(self) -> None:
        """Hand out nothing more: a handler finishes the message in hand and returns."""
        self._stopping = True
        self.put(END)

    def _take(self, item: Any) -> Message | None:
        """An item read from the buffer: the message to hand out, or None to read on
        (after the end marker or a stop, ``_ended`` is set and nothing is handed out)."""
        if item is END or self._stopping:
            self._ended = True
            return None
        state = self.state
        return item if state.accept(item, self.client.core.epoch) else None

    def _handle(self, msg: Message, handler: Handler) -> Awaitable[None] | None:
        """Call ``handler(msg)`` and settle by its outcome (rule 4), its lease kept while
        it runs (rule 9). A coroutine result comes back as an awaitable that settles
        once awaited (the asyncio face awaits it)."""
        keeper = self._keeper
        if msg.lease_deadline is not None and msg.lease_deadline != math.inf and msg.queue is not None:
            if keeper is None:
                keeper = self._keeper = _LeaseKeeper(self._loop_of_client())
            keeper.take(msg)
        try:
            result = handler(msg)
        except Exception as exc:
            self._done(keeper)
            self.state.finished(msg, exc)
            return None
        if inspect.isawaitable(result):
            return self._finish_after(msg, result, keeper)
        self._done(keeper)
        self.state.finished(msg, None)
        return None

    async def _finish_after(self, msg: Message, result: Awaitable[None], keeper: _LeaseKeeper | None) -> None:
        try:
            await result
        except Exception as exc:
            self._done(keeper)
            self.state.finished(msg, exc)
        else:
            self._done(keeper)
            self.state.finished(msg, None)

    @staticmethod
    def _done(keeper: _LeaseKeeper | None) -> None:
        if keeper is not None:
            keeper.in_hand = None

    def _loop_of_client(self) -> Any:
        """The event loop the client runs on (rule 9's timer); the face's client says."""
        return getattr(self.client, "loop", None) or getattr(self.client, "_loop", None)


class _LeaseKeeper:
    """Rule 9 for one handler subscription: a timer on the client's loop, armed while a
    message is in hand, that touches it when a third of its remaining lease passed."""

    __slots__ = ("_loop", "in_hand", "_every", "_due", "_armed")

    def __init__(self, loop: Any) -> None:
        self._loop = loop
        self.in_hand: Message | None = None  # written by the handler's thread, read on the loop
        self._every = 0.0
        self._due = 0.0
        self._armed = False  # a timer is pending (loop thread only)

    def take(self, msg: Message) -> None:
        """The handler's thread took ``msg`` (its lease deadline is finite)."""
        assert msg.lease_deadline is not None
        now = time.time()
        self._every = max(TOUCH_EVERY_MIN_S, (msg.lease_deadline - now) / 3)
        self._due = now + self._every
        self.in_hand = msg
        loop = self._loop
        if loop is not None and not self._armed:
            try:
                loop.call_soon_threadsafe(self._arm)
            except RuntimeError:  # the client's loop is closed: nothing to keep
                pass

    def _arm(self) -> None:
        if not self._armed and self.in_hand is not None:
            self._armed = True
            self._loop.call_later(max(0.0, self._due - time.time()), self._check)

    def _check(self) -> None:
        self._armed = False
        msg = self.in_hand
        if msg is None or msg.acked:
            return  # nothing in hand: the next take() arms it again
        if time.time() >= self._due:
            msg.touch()
            self._due = time.time() + self._every
        self._arm()


def _drop(msg: Message) -> None:
    return None


def _utc_text(t: float) -> str:
    """A replay start time as bookmarks accept it: ``YYYYMMDDTHHMMSS.ffffffZ``."""
    return datetime.fromtimestamp(max(0.0, t), tz=timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
