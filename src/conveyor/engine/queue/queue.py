"""One message queue: the pure, I/O-free state machine of spec 000 ("Message Queues").

The queue knows a message only by its journal position (strictly increasing in publish
order) and its publish time. It reads a message body only through the injected
``load(position)``, to evaluate content filters. It never reads a clock: every call that
depends on time takes ``now`` (float seconds). It returns what must happen (deliveries,
events to journal) and does nothing else.

Rules kept here (each cites spec 000; the message transitions themselves are the table
in :mod:`conveyor.engine.queue.state`, the only place a message changes state):

1. Delivery (Message Flow for Queues, step 3): a message goes to a consumer when the
   consumer's filter matches it, it is the oldest available message that consumer
   matches, the consumer has room in its backlog, and the fairness model picks that
   consumer among all consumers that qualify (table 15.1, ``Seats.choose``). In a FIFO
   at-least-once queue without OrderingKey, an unfiltered consumer that is the only one
   with room takes the run at the head (up to its room, before the first barrier) in
   one pass: each message is the one this rule gives it, message after message.
2. At-least-once (Delivery Semantics): a delivery leases the message until
   ``now + LeasePeriod``; the message is out of the view until the lease ends. An ack
   removes it; a cancel, an expired lease or a broken lease (unsubscribe, disconnect,
   restart) returns it, unless it is over a limit, in which case it expires:
   ``time_limit`` (in the queue for Expiration or longer), ``max_cancels`` (cancelled
   MaxCancels times: the worked example of "Handling Unprocessed Messages"),
   ``max_deliveries`` (delivered MaxDeliveries times). Every delivery counts, including
   one whose lease a disconnect broke (docs/queues.md says why).
3. At-most-once: a delivery removes the message at once (the engine journals it before
   sending); it still counts in the consumer's backlog until acknowledged. Ack options
   have no effect (Acknowledging Messages); fairness is round-robin only.
4. Expiration (Message Flow, step 5): at-most-once, a message not yet delivered expires
   once in the queue for Expiration; at-least-once, once that old and not leased.
   "Older than" is ``now >= published_at + Expiration``, so waking at
   :meth:`next_deadline` always finds work.
5. Acknowledgement (sow_delete, reference.md B.7): by bookmark or by filter. Leasing
   strict refuses, message by message, an ack of a message leased to another owner
   (connection); sloppy accepts it. ``by=None`` is the server itself and is always
   accepted. Unknown or already-done positions are ignored: acks are idempotent. A
   plain ack whose messages are all leased here, each named once and none refused (the
   common case), is taken in one pass (the transition table read once, each seat's
   held set changed once); any other goes message by message, with the same outcome.
6. Backlog (Subscription Backlog; Replacing Queue Subscriptions): delivery needs
   ``outstanding < max_backlog``; a replace keeps leases and outstanding, so a consumer
   may sit above a lowered maximum until its acks bring it back under. ``MaxBacklog``
   caps the whole queue the same way: no delivery while its leased messages plus its
   at-most-once deliveries awaiting an ack reach it (barriers count in no backlog;
   named consumers take what they ask for).
7. Priority ("Priority Queues"; Message Flow, step 3): with ``Priority`` a consumer
   gets "the highest priority value for messages in the queue and ... the oldest message
   at that priority" it matches. The engine computes the value once, at enqueue
   (``enqueue(..., priority=)``); the order is kept by
   :class:`conveyor.engine.queue.priority.PriorityIndex` over order keys that compare
   as plain ints, so the dispatch loop is the FIFO one.
8. Barrier messages ("Synchronizing Work with Barrier Messages"; Message Flow, step 4):
   a message the engine marks ``barrier=True`` is held "until all previous messages in
   the queue are acknowledged" (none before it available, leased, or delivered
   at-most-once and not yet acknowledged), and nothing after it is delivered until it
   is. Then it goes at once to every current (attached) consumer whose filter matches,
   whatever its backlog (``max_backlog=0`` included), counts in no backlog and leaves
   the queue without an ack: one :class:`Delivery` with ``barrier=True`` listing its
   ``recipients``, journaled as :class:`BarrierDelivered`. It needs at least one
   consumer (with none it waits). Until then it is an ordinary queued message: in the
   view (in its place in delivery order), acknowledgeable, subject to Expiration; if it
   leaves that way, the messages after it are released. With Priority, the barriers cut
   the queue into epochs: only the first epoch is deliverable, in priority order.
9. TargetQueueDepth: the active window, deferred acks and the engine's refill:
   :mod:`conveyor.engine.queue.window`.
10. Recovery (Startup and Recovery): the engine replays the journaled events, in order
   and interleaved with the enqueues, through the ``replay`` verbs. No lease survives
   a restart, so a replayed lease has already ended (LEASE then RETURN): the message is
   available again with its delivery and cancel counts, and :meth:`end_replay` expires
   those at MaxCancels / MaxDeliveries by rule 2. Acknowledged, expired and
   at-most-once-delivered messages never come back (the replay verbs and their rules
   are in :mod:`conveyor.engine.queue.recovery`).
11. Replicated queues (docs/replication.md, "Replicated queues"): a message another
   instance owns is ELSEWHERE: in the view, never delivered here. The engine decides
   ownership and moves a message in (``transfers.transfer_in``, with its delivery and
   cancel counts) or out (``transfers.transfer_out``); a message that left on another
   instance goes with ``transfers.remove_replicated`` (:mod:`conveyor.engine.queue.transfers`). A barrier is delivered on every instance once every
   earlier message of this instance is acknowledged, wherever they are owned, so a
   message ELSEWHERE before it holds it too.
12. Filter work per turn (engine/filter_budget.py): with a ``budget``, each consumer
   filter a dispatch evaluates is charged its worst-case cost first; when the turn
   cannot pay, :meth:`dispatch` returns what it delivered so far with ``cut_short``
   set, and the consumer's cursor keeps every message already evaluated, so the next
   dispatch goes on from there. Only dispatch stops: a message coming back is offered
   to the filtered consumers it is behind whatever the budget (that work is bounded by
   the consumers of one message).

The queue is an orchestrator of parts that own their state; it moves each message
through the transition table (:class:`~conveyor.engine.queue.state.Transitions`: the
state is derived from the part that holds the message, and checked under
``__debug__``) and tells the parts what happened:

- :class:`~conveyor.engine.queue.order.DeliveryOrder`: the available messages (the
  store), the priority epochs and the pending barriers;
- :class:`~conveyor.engine.queue.leases.LeaseTable`: leases, deadlines, delivery and
  cancel counts, at-most-once deliveries awaiting their ack, the backlogs;
- :class:`~conveyor.engine.queue.seats.Seats`: the consumers, fairness and the filtered
  consumers' cursors;
- :class:`~conveyor.engine.queue.window.ActiveWindow`: TargetQueueDepth;
- :class:`~conveyor.engine.queue.replica.Replica`: in a replicated queue, each
  message's identity, the messages another instance owns, transfer epochs and this
  instance's requests (rule 11); fed by the transition table (every move out of the
  queue for good), so the engine keeps no second map in step;
- :class:`~conveyor.engine.queue.returns.Returns`: how a lease ends other than by an
  ack, delayed retries (held messages) and the failure notes of expiries;
- :class:`~conveyor.engine.queue.recovery.QueueReplayer`: the replay verbs;
- :class:`~conveyor.engine.queue.transfers.Transfers` (``queue.transfers``): rule 11's
  verbs, called by the engine's ownership rules;
- :class:`~conveyor.engine.queue.named.NamedLeases` (``queue.named``): the named
  consumers' leases (the Spark connector).

A snapshot (FileBackedMetadata) goes through :meth:`export_state` and
:meth:`restore_state` (:class:`~conveyor.engine.queue.events.QueueState`), never through
the parts' fields.

Complexity (n available messages, C consumers of this queue, L leased messages):
enqueue O(1) amortized; acknowledge by bookmark O(1) for a leased message, O(log n)
otherwise; each delivery of :meth:`dispatch` O(C log n) plus filter evaluations, which
are amortized: a filtered consumer keeps a cursor (every available message before it
was evaluated) and a small heap of matches behind the cursor, so each message is
evaluated at most once per consumer and filter, plus once per consumer each time it
returns to the queue (in a priority queue, also when it is enqueued before the cursor in
priority order). :meth:`expire` O(k log L) for k expiries. Memory: 16 bytes per
available message (:mod:`conveyor.engine.queue.store`), 16 more in a priority queue
(:mod:`conveyor.engine.queue.priority`), none for an inactive one; per-message Python
objects only for leased, returned or awaiting-ack messages, which the backlogs bound.
"""

from __future__ import annotations

import itertools
import math
from operator import attrgetter
from typing import Any, Callable, Final, Hashable, Iterable, Iterator

from conveyor.config.model import Leasing, QueueConfig, Semantics
from conveyor.config.validation import check_queue
from conveyor.engine.queue import snapshot as queue_snapshot
from conveyor.engine.explain import MessageFacts
from conveyor.engine.queue.consumer import Consumer, Delivery, effective_backlog
from conveyor.engine.queue.replica import Ident, Replica
from conveyor.engine.queue.expiry import MessageExpiry, earliest
from conveyor.engine.queue.intake import Intake
from conveyor.engine.filter_budget import FilterBudget, FilterBudgetSpent
from conveyor.engine.queue.events import (
    Acknowledged,
    AckOption,
    AckResult,
    BarrierDelivered,
    Cancelled,
    DeliveredAtMostOnce,
    Event,
    Expired,
    ExpiryReason,
    Leased,
    LeaseExpired,
    MessageDetail,
    QueueDetails,
    QueueState,
    QueueStats,
    Returned,
    TakeBack,
)
from conveyor.engine.queue.keys import KeyedOrder, explained
from conveyor.engine.queue.leases import LeaseTable
from conveyor.engine.queue.order import DeliveryOrder
from conveyor.engine.queue.paging import PageFile, PagingBudget
from conveyor.engine.queue.priority import KEY_END, POSITION_MASK, order_key
from conveyor.engine.queue.recovery import QueueReplayer
from conveyor.engine.queue.report import QueueReport
from conveyor.engine.queue.returns import Returns
from conveyor.engine.queue.rows import Lease
from conveyor.engine.queue.seats import Seat, Seats
from conveyor.engine.queue.state import (
    IllegalTransition,
    MessageState,
    PositionOutOfOrder,
    QueueStateError,
    Transitions,
    Verb,
)
from conveyor.engine.queue.named import NamedLeases
from conveyor.engine.queue.transfers import Transfers
from conveyor.engine.queue.window import ActiveWindow
from conveyor.errors import InvalidOption

__all__ = [
    "AckOption",
    "AckResult",
    "Acknowledged",
    "BarrierDelivered",
    "Cancelled",
    "Consumer",
    "DeliveredAtMostOnce",
    "Delivery",
    "Event",
    "Expired",
    "ExpiryReason",
    "IllegalTransition",
    "LeaseExpired",
    "Leased",
    "MessageDetail",
    "MessageState",
    "PositionOutOfOrder",
    "Queue",
    "QueueDetails",
    "QueueState",
    "QueueStateError",
    "QueueStats",
    "Returned",
    "TakeBack",
    "effective_backlog",
]

_ABSENT, _AVAILABLE = MessageState.ABSENT, MessageState.AVAILABLE
_LEASED, _INACTIVE = MessageState.LEASED, MessageState.INACTIVE
# The verbs and option of every message's path, read once: an Enum member read from its
# class costs compiled code a lookup (a descriptor call) at each read.
_ENQUEUE: Final = Verb.ENQUEUE
_LEASE: Final = Verb.LEASE
_ACKNOWLEDGE: Final = Verb.ACKNOWLEDGE
_ACK_NONE: Final = AckOption.NONE
_ELSEWHERE = MessageState.ELSEWHERE
_TIME_LIMIT = (ExpiryReason.TIME_LIMIT,)
_FORCED = (ExpiryReason.FORCED_EXPIRE,)
#: A move from AVAILABLE takes the message out of the store at once, and the store
#: confirms it held it (``DeliveryOrder.take`` / ``remove`` assert it, before anything
#: else changes; ``LeaseTable.lease`` / ``consume`` assert they did not hold it): the
#: transitions need not search the store a second time on the hot path.
_CONFIRMED_BY_THE_STORE = frozenset({MessageState.AVAILABLE})


#: QueueCounters' fields, read from here: a compiled class keeps no ``__slots__`` to read back.
_COUNTERS = (
    "enqueued", "delivered", "acknowledged", "expired", "expired_leases", "returned",
    "cancelled", "filter_errors", "barriers_delivered", "transferred_in", "transferred_out",
)


class QueueCounters:
    """The cumulative counters of :class:`QueueStats` (since this Queue was built)."""

    __slots__ = _COUNTERS
    enqueued: int
    delivered: int
    acknowledged: int
    expired: int
    expired_leases: int
    returned: int
    cancelled: int
    filter_errors: int
    barriers_delivered: int
    transferred_in: int
    transferred_out: int

    def __init__(self) -> None:
        for name in _COUNTERS:
            setattr(self, name, 0)

    def add(self, name: str, n: int = 1) -> None:
        setattr(self, name, getattr(self, name) + n)

    def counts(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _COUNTERS}


class _Tally:
    """What one acknowledge call did; becomes an AckResult."""

    __slots__ = (
        "acknowledged", "cancelled", "expired", "released", "ignored", "deferred",
        "cancels_expired", "events", "freed", "refused",
    )

    def __init__(self) -> None:
        self.acknowledged = self.cancelled = self.expired = 0
        self.released = self.ignored = self.deferred = 0
        self.cancels_expired = 0  # cancels over a limit: counted in cancelled and expired
        self.events: list[Event] = []
        self.freed: dict[Hashable, None] = {}  # an ordered set
        self.refused: list[int] = []

    def result(self, asked: int) -> AckResult:
        if __debug__:  # each position asked about has exactly one outcome
            outcomes = (
                self.acknowledged + self.cancelled + self.expired - self.cancels_expired
                + self.released + len(self.refused) + self.ignored + self.deferred
            )
            assert outcomes == asked, f"{asked} positions acknowledged, {outcomes} outcomes"
        return AckResult(
            acknowledged=self.acknowledged, cancelled=self.cancelled, expired=self.expired,
            released=self.released, refused=len(self.refused), ignored=self.ignored,
            events=tuple(self.events), freed=tuple(self.freed),
            refused_positions=tuple(self.refused), deferred=self.deferred,
        )


def _order_key(name: str, has_priority: bool, position: int, priority: int | None, barrier: bool) -> int:
    """The message's key in the delivery order: its position, or (Priority) its order key."""
    if not has_priority:
        if priority is not None:
            raise QueueStateError(f"queue {name!r} has no Priority")
        return position
    if barrier:
        return position  # a barrier is not in the priority order
    if priority is None:
        raise QueueStateError(
            f"queue {name!r} has a Priority: enqueue needs the message's priority",
            position=position,
        )
    try:
        return order_key(priority, position)
    except ValueError as exc:
        raise QueueStateError(f"queue {name!r}: {exc}", position=position) from None


#: Shorter runs are enqueued message by message: a run's fixed cost is about that of
#: three single enqueues (measured: a run of 5 costs 1.5 µs a message, one by one 2.4).
_RUN_MIN = 4


class Queue:
    """One queue (spec 000). See the module header for the rules it keeps."""

    def __init__(self, config: QueueConfig, *, load: Callable[[int], object], start: int = 0,
                 chunk_slots: int | None = None, budget: FilterBudget | None = None, replicated: bool = False,
                 key_at: Callable[[int], str | None] | None = None) -> None:
        """``start``: the recovery point replay begins at (every message below it is done).
        ``chunk_slots``: messages per chunk of the store (``queue_store.CHUNK_SLOTS``).
        ``budget``: the turn's filter budget (rule 12); None: unbounded. ``replicated``:
        a replicated queue (rule 11): its replica part learns of every message that leaves. ``key_at``: keys.py."""
        check_queue(config)  # config/validation.py: what this queue cannot honour
        self.config = config
        self._load = load
        self._at_least_once = config.semantics is Semantics.AT_LEAST_ONCE
        self._strict = config.leasing is Leasing.STRICT
        self._fairness = config.fairness
        self._lease_period = config.lease_period_s
        self._expiration = config.expiration_s
        self._priority = config.priority is not None
        self._barrier_on = config.barrier_expression is not None
        self._target = config.target_queue_depth
        self._start, self._intake = start, Intake(config.name, start)
        self._counters = QueueCounters()

        self._transitions = Transitions(config.semantics, self.state_of, self._holds, confirmed=_CONFIRMED_BY_THE_STORE)
        self._seats = Seats(config.name, priority=self._priority, matches=self._matches, budget=budget)
        self.cut_short = False  # the last dispatch stopped for the filter budget (rule 12)
        self._order = DeliveryOrder(priority=self._priority, chunk_slots=chunk_slots,
                                    on_first_epoch_grew=self._seats.reset_cursors)
        self._leases = LeaseTable(expiration_s=config.expiration_s, max_cancels=config.max_cancels,
                                  max_deliveries=config.max_deliveries)
        self._window = ActiveWindow(self._target, start)
        self.replica = Replica()  # rule 11: ownership rules read it, transitions feed it
        if replicated:
            self._transitions.on_leave(self.replica.left)
        self._stamped: MessageExpiry[int] = MessageExpiry()  # messages carrying their own expiry (queue_expiry)
        self._returns = Returns(
            config.retry_backoff_s, transitions=self._transitions, order=self._order, leases=self._leases,
            seats=self._seats, replica=self.replica, stamped=self._stamped, count=self._counters.add)
        self._report = QueueReport(
            config, order=self._order, leases=self._leases, seats=self._seats, window=self._window,
            replica=self.replica, stamped=self._stamped, counts=self._counters.counts, state_of=self.state_of,
            load=load, expiration=lambda: self._expiration, active=self._active, returns=self._returns)
        self.keys = KeyedOrder.build(  # OrderingKey (queue/keys.py); None without one
            config, key_at, self._transitions, self._order, self._leases, self._seats, self._returns, self._stamped)
        self.transfers = Transfers(
            priority=self._priority, transitions=self._transitions, replica=self.replica, order=self._order,
            leases=self._leases, seats=self._seats, stamped=self._stamped, count=self._counters.add,
            state_of=self.state_of, matches=self._matches, returns=self._returns, keys=self.keys)
        self.named = NamedLeases(
            config.name, at_least_once=self._at_least_once, priority=self._priority, transitions=self._transitions,
            seats=self._seats, order=self._order, leases=self._leases, replica=self.replica,
            count=self._counters.add, state_of=self.state_of, settle=self._settle, lease_run=self._lease_run)
        self.replay = QueueReplayer(
            config.name, at_least_once=self._at_least_once, state_of=self.state_of,
            transitions=self._transitions, order=self._order, leases=self._leases,
            window=self._window, seats=self._seats, expired=self._returns.expire_gone, transfers=self.transfers,
            returns=self._returns)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def last_position(self) -> int:
        """Position of the last message enqueued (start - 1 before the first)."""
        return self._intake.last_position

    def watch(self, observer: Callable[[int, MessageState], object] | None, states: frozenset[MessageState]) -> None:
        """Call ``observer(position, new_state)`` for every message that enters or leaves
        ``states`` (None: stop): what entered or left the available messages (views)."""
        self._transitions.watch(observer, states)

    def __repr__(self) -> str:
        return (f"<Queue {self.name!r} {self.config.semantics.value}: {len(self._order.store)} available, "
                f"{len(self._leases.leased)} leased, {len(self._seats)} consumers>")

    # --- messages in ----------------------------------------------------------------------

    def enqueue(self, position: int, published_at: float, priority: int | None = None, barrier: bool = False,
                expires_at: float = 0.0, *, owner: str | None = None, arrived: float | None = None,
                ident: Ident | None = None, ordering_key: str | None = None) -> bool:
        """A message recorded on an underlying topic (queue filter already applied).

        ``priority``: for a queue with ``Priority``, the value of the expression for this
        message (``Expression.priority``: 0 .. 2**64 - 1, or -1 for NULL / non-numeric,
        the lowest); required there (except for a barrier), refused elsewhere.
        ``barrier``: the message matches the queue's ``BarrierExpression``. Returns False
        when the message is inactive (TargetQueueDepth, rule 9): the queue only counted it,
        and the engine need not keep it in memory. Publish times are clamped to never
        decrease along positions, so the oldest message is always the first one (a clock
        that steps back cannot reorder expiry). ``expires_at``: when the message itself
        expires (0: never), stamped by a SOW topic with Expiration (queue/expiry.py).
        ``owner``: in a replicated queue, the instance that owns the message when not this
        one (rule 11): it is recorded ELSEWHERE; ``arrived``: when it arrived here; ``ident``:
        its (publisher, seq), the name replication gives it; ``ordering_key``: its OrderingKey."""
        self._intake.check(position, published_at)
        if barrier and not self._barrier_on:
            raise QueueStateError(f"queue {self.name!r} has no BarrierExpression")
        key = (position if not self._priority and priority is None  # FIFO: no call
               else _order_key(self.name, self._priority, position, priority, barrier))
        self._counters.enqueued += 1
        if ident is not None:
            self.replica.entered(position, ident)
        step = self._transitions.step  # ABSENT, derived: nothing is held above the last position
        if self.would_hold():  # a replicated queue's engine asks first: the owner is decided on activation
            step(position, Verb.HOLD, _ABSENT)
            self._window.hold(position)
            self._intake.skip(position)
            return False
        if self._target is not None:
            self._window.enter(position)
        if owner is not None:
            self._enqueue_elsewhere(position, published_at, key, barrier, expires_at, owner, arrived, ordering_key)
            return True
        step(position, Verb.ENQUEUE, _ABSENT)
        published_at = self._intake.enter(position, published_at)
        self._note_expiry(position, published_at, expires_at)
        if (self._order.append(position, published_at, key, barrier) if self.keys is None  # or held: keys.py
                else self.keys.enter(position, published_at, key, barrier, ordering_key)):
            # it may sort before a filtered consumer's cursor; enqueue has no now: the
            # filters decide at the message's publish time
            self._seats.came_back(key, self._order.store.__contains__, published_at)
        return True

    def enqueue_run(self, positions: list[int], times: list[float]) -> None:
        """:meth:`enqueue` of each of ``positions`` (ascending; no priority, barrier, own expiry, owner
        or key), in one pass unless Priority, OrderingKey or TargetQueueDepth take them one by one."""
        if positions:
            self._intake.check_run(positions, times)  # the whole run, before anything changes
        if self._priority or self.keys is not None or self._target is not None or len(positions) < _RUN_MIN:
            for p, t in zip(positions, times):
                self.enqueue(p, t)
            return
        times = self._intake.enter_run(positions, times)
        self._counters.enqueued += len(positions)
        self._transitions.move_all(positions, _ENQUEUE, _ABSENT, checked=False)  # above the last position
        self._stamped.enter_all(positions, times)
        self._order.append_run(positions, times)

    def _enqueue_elsewhere(self, position: int, published_at: float, key: int, barrier: bool, expires_at: float,
                           owner: str, arrived: float | None, ordering_key: str | None) -> None:
        """Rule 11: a message another instance owns is recorded ELSEWHERE (in its key's line: queue/keys.py)."""
        self._note_expiry(position, published_at, expires_at)  # it expires here if it is transferred here
        if barrier:
            raise QueueStateError(f"queue {self.name!r}: a barrier is delivered on every instance", position=position)
        self._transitions.step(position, Verb.ENQUEUE_ELSEWHERE, _ABSENT)  # ABSENT: above the last position
        published_at = self._intake.enter(position, published_at)
        self.replica.add(position, owner, published_at, key, published_at if arrived is None else arrived)
        if self.keys is not None:
            self.keys.enter_elsewhere(position, ordering_key)

    def _note_expiry(self, position: int, published_at: float, expires_at: float) -> None:
        """A message entering the queue: its own expiry overrides the queue's Expiration,
        which is then kept per message (queue/expiry.py rule 4)."""
        if expires_at and self._expiration is not None:
            self._keep_expiration_per_message()
        self._stamped.enter(position, published_at, expires_at)

    def _keep_expiration_per_message(self) -> None:
        assert self._expiration is not None
        self._stamped.keep_expiration(self._expiration, itertools.chain(
            self._order.store.items(), ((p, lease.published_at) for p, lease in self._leases.leased.items()),
            ((p, away.published_at) for p, away in self.replica.items()), self._returns.items()))
        self._expiration = None  # no head-of-queue check: every message has its entry
        self._leases.expire_by_stamps()

    def _active(self) -> int:
        """Messages in the active part (TargetQueueDepth): available (held ones too), leased, owned elsewhere."""
        return len(self._order.store) + len(self._leases.leased) + len(self._returns) + len(self.replica)

    def would_hold(self) -> bool:
        """Whether a message enqueued now would be inactive (TargetQueueDepth, queue/window.py rule 2)."""
        return self._target is not None and self._window.holds_back(self._active())

    # --- consumers --------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer, now: float) -> None:
        """A new subscription whose topic matches this queue."""
        self._settle(now)
        self._seats.add(consumer)

    def replace_consumer(
        self,
        consumer: Consumer,
        *,
        filter: Callable[[object, float], bool] | None,
        max_backlog: int,
        now: float,
    ) -> None:
        """``subscribe`` with ``replace`` (spec 000, "Replacing Queue Subscriptions").

        Atomic: the new filter applies to every later delivery; leases and ``outstanding``
        are kept, so the consumer may end up above its new ``max_backlog``. A consumer
        that was detached from this queue is attached again. The engine calls this on
        every queue the consumer stays in (the shared consumer is updated idempotently).
        """
        seat = self._seats.of(consumer)
        if max_backlog < 0:
            raise InvalidOption(f"max_backlog must be >= 0, not {max_backlog}")
        consumer.filter = filter
        consumer.max_backlog = max_backlog
        if seat.filter_seen is not filter:
            seat.reset_cursor()
        if not seat.active:
            seat.reset_cursor()
            self._seats.attach(seat)

    def detach_consumer(self, consumer: Consumer, now: float) -> None:
        """A replace moved the subscription's topic off this queue: deliver it nothing
        more, but keep its leases (spec 000: a replace does not break leases). Its acks
        still work; :meth:`remove_consumer` breaks what is left."""
        seat = self._seats.of(consumer)
        if seat.active:
            self._seats.detach(seat)

    def remove_consumer(self, consumer: Consumer, now: float) -> list[Event]:
        """Unsubscribe or disconnect: break the consumer's leases (spec 000, "Delivery
        Semantics"); each message returns to the queue, or expires if over a limit."""
        seat = self._seats.of(consumer)
        self._seats.remove(seat)
        events: list[Event] = []
        leases = self._leases
        for p in sorted(seat.held):
            if p in leases.leased:
                self._returns.end_lease(p, Verb.RETURN, now, events)
            else:
                leases.release(p)
        leases.trim()
        return events

    # --- delivery ---------------------------------------------------------------------------

    def dispatch(self, now: float, max_deliveries: int | None = None) -> list[Delivery]:
        """Every delivery that can happen now (at most ``max_deliveries``), in order.

        Call :meth:`expire` first with the same ``now``: dispatch does not look at
        Expiration. Each Delivery's ``event`` must be journaled.
        """
        self._settle(now)
        out: list[Delivery] = []
        self.cut_short = False
        try:
            self._dispatch(now, -1 if max_deliveries is None else max_deliveries, out)
        except FilterBudgetSpent:
            self.cut_short = True  # rule 12: the next dispatch goes on from the cursors
        return out

    def _dispatch(self, now: float, budget: int, out: list[Delivery]) -> None:
        """:meth:`dispatch`'s loop: deliveries go to ``out`` as they are made, so those
        made before the filter budget runs out stand (rule 12)."""
        seats, order, leases = self._seats, self._order, self._leases
        active, consumers, store = seats.active, seats.consumers, order.store
        contains, next_for = store.__contains__, seats.next_for
        end = KEY_END if self._priority else self._active_end() + 1
        deliverable = order.deliverable()
        max_out = self.config.max_backlog
        runs = self._at_least_once and not self._priority and self.keys is None  # FIFO: _deliver_run
        while budget != 0 and store and active:
            gate = None
            if order.barriers:
                b = order.barrier_due()
                if b is not None and not leases.leased and not leases.consumed and not self._held_before(b):
                    out.append(self._release_barrier(b, now))
                    budget -= 1
                    deliverable = order.deliverable()  # the first epoch may have changed
                    continue
                gate = order.gate()
            if max_out is not None and len(leases.leased) + len(leases.consumed) >= max_out:
                break  # MaxBacklog: the queue-wide cap on outstanding messages (rule 6)
            head = deliverable.head()  # FIFO: the gate below stops it at the first barrier
            best = None
            eligible: list[int] = []
            room = 0  # consumers with room
            for i, seat in enumerate(active):
                c = consumers[i]
                if c.outstanding >= c.max_backlog:
                    continue
                room += 1
                nxt = head if c.filter is None else next_for(seat, contains, deliverable, end, now)
                if nxt is None or (gate is not None and nxt >= gate):
                    continue
                if best is None or nxt < best:
                    best, eligible = nxt, [i]
                elif nxt == best:
                    eligible.append(i)
            if best is None:
                break
            i = seats.choose(self._fairness, eligible)
            c = consumers[i]
            if runs and room == 1 and c.filter is None:  # alone with room: a run from the head
                n = c.max_backlog - c.outstanding
                n = n if max_out is None else min(n, max_out - len(leases.leased) - len(leases.consumed))
                budget -= self._deliver_run(active[i], n if budget < 0 else min(n, budget), now, out)
                continue
            out.append(self._deliver(active[i], best, now))
            budget -= 1

    def _active_end(self) -> int:
        """The last position that entered the active part."""
        return self._window.offered if self._target is not None else self._intake.last_position

    def _deliver(self, seat: Seat, key: int, now: float) -> Delivery:
        p = key & POSITION_MASK if self._priority else key
        if self._at_least_once:
            self._transitions.move(p, Verb.LEASE, _AVAILABLE)
            t = self._order.take(key)
            deadline: float | None
            deadline = now + self._lease_period
            n = self._leases.lease(p, seat, deadline, t, key, True)
        else:
            self._transitions.move(p, Verb.DELIVER, _AVAILABLE)
            self._order.take(key)
            self._leases.consume(p, seat)
            n, deadline = 1, None
        self._counters.delivered += 1
        return Delivery(seat.consumer, p, deadline, n)

    def _deliver_run(self, seat: Seat, n: int, now: float, out: list[Delivery]) -> int:
        """:meth:`_deliver` of up to ``n`` messages from the head of a FIFO queue (none at
        or past the first barrier) to ``seat`` in one pass; how many."""
        deadline = now + self._lease_period
        positions, counts = self._lease_run(seat, n, deadline, math.inf)
        self._counters.delivered += len(positions)
        out += map(Delivery, itertools.repeat(seat.consumer), positions, itertools.repeat(deadline), counts)
        return len(positions)

    def _lease_run(self, seat: Seat, n: int | None, deadline: float, upto: float) -> tuple[list[int], list[int]]:
        """FIFO: the run at the head (``n`` at most, None: all; below ``upto`` and the first barrier)
        leased to ``seat`` until ``deadline`` in one pass (dispatch, named.py): (positions, counts)."""
        positions, times = self._order.take_head(n, upto)
        self._transitions.move_all(positions, _LEASE, _AVAILABLE)
        return positions, self._leases.lease_all(positions, seat, deadline, times, positions)

    def _release_barrier(self, b: int, now: float) -> Delivery:
        """Everything before barrier ``b`` is acknowledged: it goes to every current
        consumer whose filter matches, backlog or not, and leaves the queue (rule 8)."""
        self._transitions.move(b, Verb.DELIVER_BARRIER, _AVAILABLE)
        recipients = tuple(
            seat.consumer
            for seat in self._seats.active
            if seat.consumer.filter is None or self._matches(seat.consumer.filter, b, now)
        )
        self._order.remove(b)
        self._counters.barriers_delivered += 1
        return Delivery(None, b, None, 0, barrier=True, recipients=recipients)

    # --- acknowledgement ---------------------------------------------------------------------

    def acknowledge(self, positions: Iterable[int], *, by: Hashable | None, option: AckOption, now: float,
                    delay: float | None = None, reason: str = "") -> AckResult:
        """``sow_delete`` by bookmark. ``by``: the acking connection (None: the server).
        ``delay``, ``reason``: a cancel's delayed retry, a cancel's or expire's failure
        reason (queue/returns.py rules 2 and 3)."""
        self._settle(now)
        if option is _ACK_NONE and self._at_least_once and type(positions) is list:
            done = self._ack_leased(positions, by)
            if done is not None:
                return done
        tally = _Tally()
        if not self._at_least_once:
            option = AckOption.NONE  # options have no effect at-most-once (rule 3)
        asked = 0
        for p in positions:
            self._ack_one(p, by, option, now, tally, delay, reason)
            asked += 1
        self._leases.trim()
        return tally.result(asked)

    def _ack_leased(self, positions: list[int], by: Hashable | None) -> AckResult | None:
        """An acknowledgement of messages all leased here, each named once and none
        refused (the common case), in one pass: the transition table read once, each
        seat's held set changed once. None: anything else, taken message by message."""
        seats = self._leases.holders(positions, by if self._strict else None)
        if seats is None:
            return None
        self._transitions.move_all(positions, _ACKNOWLEDGE, _LEASED, checked=False)
        self._leases.acknowledge_many(positions, seats)
        self.replica.forget_all(positions)
        self._leases.trim()
        self._counters.acknowledged += len(positions)
        return AckResult(acknowledged=len(positions), events=tuple(map(Acknowledged, positions)),
                         freed=tuple(dict.fromkeys(seat.consumer.key for seat in seats)))

    def acknowledge_matching(self, predicate: Callable[[object, float], bool], *, by: Hashable | None,
                             option: AckOption, now: float, delay: float | None = None, reason: str = "") -> AckResult:
        """``sow_delete`` with a filter: every matching message in the queue, leased or not
        (as Leasing allows). At-most-once deliveries are no longer in the queue."""
        self._settle(now)
        matches = self._matches
        hits = [p for p, _ in self._order.store.items() if matches(predicate, p, now)]
        hits += [p for p in self._leases.leased if matches(predicate, p, now)]
        hits += [p for p, _ in itertools.chain(self.replica.items(), self._returns.items()) if matches(predicate, p, now)]
        hits.sort()
        return self.acknowledge(hits, by=by, option=option, now=now, delay=delay, reason=reason)

    def stale_acks(self, positions: list[int], deliveries: list[int]) -> tuple[list[int], list[int]]:
        """(positions to acknowledge, stale ones): queue/leases.py rule 7."""
        return self._leases.stale(positions, deliveries, self.replica)

    def _ack_one(self, p: int, by: Hashable | None, option: AckOption, now: float, tally: _Tally,
                 delay: float | None, reason: str) -> None:
        """One position of an acknowledgement, by where the message is (rules 3 and 5)."""
        leases = self._leases
        lease = leases.leased.get(p)
        seat: Seat | None
        if lease is not None:
            seat = lease.seat
            if self._strict and by is not None and by != seat.consumer.owner:
                tally.refused.append(p)
                return
            if option is AckOption.NONE:
                self._transitions.move(p, Verb.ACKNOWLEDGE, _LEASED)
                leases.acknowledge(p)
                self.replica.forget(p)
                tally.events.append(Acknowledged(p))
                tally.acknowledged += 1
                self._counters.acknowledged += 1
            elif option is AckOption.CANCEL:
                tally.cancelled += 1
                if self._returns.end_lease(p, Verb.CANCEL, now, tally.events, delay=delay, reason=reason):
                    tally.expired += 1
                    tally.cancels_expired += 1
            else:
                self._transitions.move(p, Verb.EXPIRE, _LEASED)
                leases.end(p)
                self._returns.expire_gone(p, _FORCED, tally.events, reason=reason, consumer=seat.consumer.key)
                tally.expired += 1
            tally.freed[seat.consumer.key] = None
            return
        seat = leases.consumed.get(p)
        if seat is not None:
            # At-most-once: the message is gone; the ack only frees the backlog slot.
            if self._strict and by is not None and by != seat.consumer.owner:
                tally.refused.append(p)
                return
            leases.release(p)
            tally.released += 1
            tally.freed[seat.consumer.key] = None
            return
        if p in self._order.store or p in self._returns:
            self._ack_available(p, option, tally, reason)
            return
        if p in self.replica and option is not AckOption.CANCEL:
            # An acknowledgement on any instance removes the message everywhere (rule 11);
            # expiring one is its owner's business (exactly one dead letter).
            if option is AckOption.EXPIRE:
                tally.ignored += 1
                return
            self.transfers.acknowledged_here(p)
            tally.events.append(Acknowledged(p))
            tally.acknowledged += 1
            self._counters.acknowledged += 1
            return
        window = self._window
        if option is AckOption.NONE and window.is_inactive(p) and not window.acked(p):
            # TargetQueueDepth: held until the message would become active (rule 9).
            self._transitions.move(p, Verb.ACKNOWLEDGE, _INACTIVE)
            window.defer_ack(p)
            tally.events.append(Acknowledged(p))
            tally.deferred += 1
            self._counters.acknowledged += 1
            return
        tally.ignored += 1

    def _ack_available(self, p: int, option: AckOption, tally: _Tally, reason: str) -> None:
        """Available (or held for a delayed retry: queue/returns.py rule 2) ``p``."""
        if option is AckOption.CANCEL:
            tally.ignored += 1  # not leased: nothing to return
            return
        self._transitions.move(p, Verb.ACKNOWLEDGE if option is AckOption.NONE else Verb.EXPIRE, _AVAILABLE)
        if p in self._returns:
            self._returns.take(p)
        else:
            self._order.remove(p)
        if option is AckOption.NONE:
            self._leases.forget(p)
            tally.events.append(Acknowledged(p))
            tally.acknowledged += 1
            self._counters.acknowledged += 1
        else:
            self._returns.expire_gone(p, _FORCED, tally.events, reason=reason)
            tally.expired += 1

    # --- replicated queues (rule 11; the engine decides, engine/replication/ownership.py) --------------------

    def _held_before(self, b: int) -> bool:
        """A message before barrier ``b`` is owned elsewhere, or held for a delayed retry."""
        first = self.replica.first() if self.replica else None
        held = self._returns.first() if self._returns else None
        return (first is not None and first < b) or (held is not None and held < b)

    def touch(self, positions: Iterable[int], *, by: Hashable, deadline: float) -> int:
        """A subscriber's touch (docs/queues.md): the leases of ``positions`` that ``by``
        holds last until ``deadline`` at least; how many it held."""
        return self._leases.touch(positions, by, deadline)

    # --- time ---------------------------------------------------------------------------------

    def expire(self, now: float) -> list[Event]:
        """Lease expiries, then message Expiration, due at ``now``; events to journal.

        Leases go in (deadline, position) order, expirations in position order.
        """
        events = self.replay.take_events(now) + (self.keys.take_events(now) if self.keys is not None else [])
        for p, _ in self._leases.due(now):
            self._returns.end_lease(p, Verb.LEASE_EXPIRE, now, events)
        self._returns.wake(now, events)
        if self._expiration is not None:
            store, expiration = self._order.store, self._expiration
            while store:
                head_time = store.head_time()
                assert head_time is not None  # the store is not empty
                if now < head_time + expiration:
                    break
                head = store.head()
                assert head is not None
                p = head
                self._transitions.move(p, Verb.EXPIRE, _AVAILABLE)
                self._order.remove(p)
                self._returns.expire_gone(p, _TIME_LIMIT, events)
        stamped = self._stamped
        if stamped:
            leased = self._leases.leased
            for p in list(stamped.pop_due(now)):
                if p in leased or p in self.replica or p in self._returns:
                    # due: it expires when its lease or delay ends, or when it is transferred
                    # here (its owner expires it; queue/expiry.py rule 2)
                    stamped.hold(p)
                elif p in self._order.store:
                    self._transitions.move(p, Verb.EXPIRE, _AVAILABLE)
                    self._order.remove(p)
                    self._returns.expire_gone(p, _TIME_LIMIT, events)
            stamped.sweep(self._in_queue, self._active() + len(self.replica))
        return events

    def next_deadline(self) -> float | None:
        """The earliest lease, delayed retry or Expiration deadline: when :meth:`expire` has work
        (``-inf`` after a replay until :meth:`end_replay` or :meth:`expire` ran)."""
        if self.replay.has_events or (self.keys is not None and self.keys.has_events):
            return -math.inf
        deadline = self._leases.next_deadline()
        store = self._order.store
        if self._returns:  # a delayed retry's
            deadline = earliest(deadline, self._returns.next_deadline())
        if self._expiration is not None and store:
            head_time = store.head_time()
            assert head_time is not None  # the store is not empty
            deadline = earliest(deadline, head_time + self._expiration)
        if self._stamped:
            deadline = earliest(deadline, self._stamped.next_deadline())
        return deadline

    # --- views ---------------------------------------------------------------------------------

    def available(self) -> Iterator[int]:
        """The queue as a view (spec 000, "Querying Queues as a View"): available positions
        in delivery order (priority order within each barrier epoch, each pending barrier
        after the messages before it), leased and inactive ones excluded. Read-only; do
        not change the queue while iterating (RuntimeError). A replicated queue lists the
        messages other instances own after its own (rule 11)."""
        if not self.replica:
            return iter(self._order)
        return itertools.chain(iter(self._order), [p for p, _ in self.replica.items()])

    def state_of(self, position: int) -> MessageState:
        """Where the message is. ABSENT for messages never enqueued, before the recovery
        point, or done. INACTIVE for a position in the inactive part of a TargetQueueDepth
        queue (the queue cannot tell whether one of its messages is there)."""
        if position > self._intake.last_position:
            return _ABSENT  # nothing above the last enqueued position is held anywhere
        leases = self._leases
        if position in leases.leased:
            return _LEASED
        if position in leases.consumed:
            return MessageState.CONSUMED
        # A message is in one place only; ELSEWHERE (a dict) is asked before the store (a
        # search), as most messages a non-owner is asked about are owned elsewhere.
        if position in self.replica:
            return _ELSEWHERE
        if position in self._order.store or position in self._returns:
            return _AVAILABLE
        window = self._window
        if window.inactive and window.is_inactive(position) and not window.acked(position):
            return _INACTIVE
        return _ABSENT

    def _holds(self, position: int, state: MessageState) -> bool:
        """Whether the message at ``position`` is in ``state``: the transitions' check
        under ``__debug__`` (AVAILABLE is confirmed by the store itself, see
        ``_CONFIRMED_BY_THE_STORE``)."""
        if state is _LEASED:
            return position in self._leases.leased  # state_of answers LEASED exactly then
        return self.state_of(position) is state

    def recovery_point(self) -> int:
        """The highest P such that every message of this queue below P is done
        (acknowledged, expired or delivered at-most-once): stored in ``queues.ack``.
        Never past :meth:`refill_from` while messages are inactive."""
        low = [p for p in (self._order.store.head(),) if p is not None]
        if self._leases.leased:
            low.append(min(self._leases.leased))
        if self._window.inactive:
            refill_from = self._window.refill_from()
            assert refill_from is not None  # messages are inactive
            low.append(refill_from)
        for part in (self.replica, self._returns):
            first = part.first() if part else None
            if first is not None:  # messages are elsewhere, or held for a delayed retry
                low.append(first)
        if low:
            return min(low)
        return max(self._start, self._intake.last_position + 1)

    # --- reports (queue/report.py) -----------------------------------------------------------

    def activity(self) -> tuple[int, int, int, int, int]:
        return self._report.activity()

    def depth_and_readers(self) -> tuple[int, bool]:  # the payload cache's admission (engine/cache.py)
        return self._report.depth(), self._seats.any()

    def statistics(self, now: float | None = None) -> QueueStats:
        return self._report.statistics(now)

    def details(self, limit: int | None = None) -> QueueDetails:
        return self._report.details(limit)

    def failure_of(self, position: int) -> tuple[int, Hashable]:
        """(delivery count, last consumer key) of a message that has just expired."""
        return self._returns.failure_of(position)

    def explain(self, position: int, now: float) -> MessageFacts:
        return explained(self.keys, self._report.explain(position, now))

    def check_invariants(self) -> None:
        self._report.check_invariants()

    @property
    def paged_chunks(self) -> int:
        """Chunks of available messages paged out to the page file (FileBackedMetadata)."""
        return self._order.paged_chunks()

    # --- TargetQueueDepth (queue_window) ----------------------------------------------------

    def wants(self) -> int:
        """How many inactive messages the queue would activate now (0 without
        TargetQueueDepth): the engine refills while this is above 0 (queue/window.py rule 3)."""
        return self._window.wants(self._active()) if self._target is not None else 0

    def refill_from(self) -> int | None:
        """The journal position (a record boundary) to read inactive messages from, or
        None when nothing is inactive."""
        return self._window.refill_from()

    def activate(self, position: int, published_at: float, expires_at: float = 0.0, *, owner: str | None = None,
                 arrived: float = 0.0, removed: bool = False) -> bool:
        """Offer the message at ``position``, read back from the log (queue/window.py rule 3):
        True if it became active; False if offered before (ignored) or consumed by a deferred
        ack. A replicated queue's: ``owner``, when another instance owns it (it becomes
        ELSEWHERE, ``arrived`` here then); ``removed`` on another instance meanwhile (consumed)."""
        window = self._window
        if self._target is None:
            raise QueueStateError(f"queue {self.name!r} has no TargetQueueDepth")
        if position <= window.offered:
            return False
        if not window.is_inactive(position):
            raise QueueStateError(f"queue {self.name!r}: {position} is not an inactive message", position=position)
        if published_at != published_at:
            raise QueueStateError(f"queue {self.name!r}: publish time of {position} is NaN")
        if not window.acked(position):
            if self._active() >= self._target and not removed:
                raise QueueStateError(f"queue {self.name!r}: no room to activate {position} (check wants())",
                                      position=position)
            self._transitions.move(position, Verb.ACKNOWLEDGE if removed else Verb.ACTIVATE if owner is None
                                   else Verb.ACTIVATE_ELSEWHERE, _INACTIVE)
            if removed:
                window.defer_ack(position)
        if not window.offer(position):
            return False
        published_at = self._intake.clamp(published_at)
        self._note_expiry(position, published_at, expires_at)
        if owner is None:
            self._order.append(position, published_at, position, False)
        else:
            self.replica.add(position, owner, published_at, position, arrived)
        return True

    # --- recovery (queue/recovery.py: the replay verbs are ``queue.replay``'s) -----------------

    def end_replay(self, now: float) -> list[Event]:
        """Events to journal after a replay: the leases broken by the restart are over, and
        a message whose lease ended at MaxCancels / MaxDeliveries expires (rule 2). This
        also catches a torn journal tail and limits lowered since.

        If the engine does not call it, the first live call does the same and
        :meth:`expire` returns the events (:meth:`next_deadline` is then ``-inf``).
        """
        return self.replay.take_events(now) + (self.keys.take_events(now) if self.keys is not None else [])

    def _settle(self, now: float) -> None:
        if self.replay.due:
            self.replay.settle(now)
        if self.keys is not None:
            self.keys.release(now)  # queue/keys.py rule 4

    # --- FileBackedMetadata (queue_paging, queue_snapshot) -----------------------------------

    def page_to(self, file: PageFile, *, budget: PagingBudget | None = None) -> None:
        """Page the available messages (and a priority queue's delivery index) out to
        ``file`` (a :class:`~conveyor.engine.queue.paging.PageFile`) when the resident
        chunks of every paged queue pass ``budget`` (shared by them; None: one of
        ``budget.DEFAULT_LIMIT`` for this queue). Only before the first message."""
        if self._order.store or self._intake.last_position >= self._start:
            raise QueueStateError(f"queue {self.name!r}: paging must be set up on an empty queue")
        self._order.page_to(file, budget)

    def export_state(self) -> QueueState:
        """The state a snapshot keeps (queue/snapshot.py rule 5)."""
        chunks, barriers, epochs = self._order.export()
        deliveries, cancels = self._leases.counts()
        inactive, refill_from, acks = self._window.export()
        away, positions, leases = self.replica.export(*self._leases.export())
        delays, held = self._returns.export()  # held messages: in ``leased`` (queue/returns.py rule 2)
        leased, times, keys = _leased_columns(positions, leases, held)
        return QueueState(
            start=self._start, last_position=self._intake.last_position, last_time=self._intake.last_time,
            chunks=tuple(chunks), page_file=self._order.store.page_generation,
            leased=leased, leased_times=times, leased_keys=keys if self._priority else (),
            delays=tuple(delays), reasons=tuple(sorted(self._leases.reasons().items())),
            epochs=tuple(epochs), elsewhere=tuple(away), deliveries=deliveries, cancels=cancels,
            barriers=tuple(barriers), offered=self._active_end(), inactive=inactive, refill_from=refill_from,
            deferred_acks=acks, expiries=self._stamped.export(self._in_queue))

    def restore_state(self, state: QueueState) -> None:
        """Load an exported state into this new queue (after :meth:`page_to`, if the state
        has pages), as a replay would leave it: the leases it lists were broken by the
        restart, their messages are available again; :meth:`end_replay` applies the
        limits. Then replay the journal from the snapshot's positions."""
        if self._seats.any() or self._order.store or self._intake.last_position >= self._start:
            raise QueueStateError(f"queue {self.name!r}: a state restores a new queue")
        if self._priority and len(state.leased_keys) != len(state.leased):
            raise QueueStateError(f"queue {self.name!r}: a priority queue's state needs its leases' order keys")
        try:
            self._order.adopt(list(state.chunks), list(state.barriers), list(state.epochs))
        except ValueError as exc:
            raise QueueStateError(f"queue {self.name!r}: {exc}") from None
        keys = state.leased_keys or state.leased
        for p, t, key in zip(state.leased, state.leased_times, keys):
            self._order.put_back(p, t, key)
        for p, owner, t, key, arrived in state.elsewhere:
            self.replica.add(p, owner, t, key, arrived)
        self._start = state.start
        self._intake.restore(state.last_position, state.last_time)
        self._leases.restore_counts(state.deliveries, state.cancels)
        for p, t in state.expiries:
            self._stamped.note(p, t)
        for p, reason in state.reasons:
            self._leases.note(p, None, reason)
        for p, t in state.delays:
            self._returns.hold_back(p, t)
        if state.expiries and self._expiration is not None:
            self._keep_expiration_per_message()
        self._window.restore(offered=state.offered, inactive=state.inactive, refill_from=state.refill_from,
                             acks=state.deferred_acks, last=state.last_position)
        self.replay.restored()
        if self.keys is not None:
            self.keys.restored()  # queue/keys.py rule 5

    def snapshot(self, *, events_from: int, publishes_from: int) -> queue_snapshot.QueueSnapshot:
        """The state as replaying the journal would rebuild it (queue/snapshot.py rule 1)."""
        return queue_snapshot.take(
            self.export_state(), self.config, events_from=events_from, publishes_from=publishes_from
        )

    def restore_snapshot(self, snap: queue_snapshot.QueueSnapshot) -> None:
        """Load a snapshot (checked with ``queue_snapshot.check``) into this new queue,
        then replay the journal from the snapshot's positions."""
        self.restore_state(queue_snapshot.state(snap))

    # --- helpers ------------------------------------------------------------------------------

    def _in_queue(self, p: int) -> bool:
        """Whether ``p`` is in the queue here: available, held, leased or owned elsewhere."""
        return p in self._order.store or p in self._leases.leased or p in self.replica or p in self._returns

    def _matches(self, flt: Callable[[object, float], bool], p: int, now: float) -> bool:
        # A filter (or load) that raises is "no match", counted in filter_errors: one bad
        # message must not stop delivery of the others, nor lose the deliveries already
        # made in this dispatch. ``now``: the time of the decision (filters may use it).
        try:
            return bool(flt(self._load(p), now))
        except Exception:
            self._counters.filter_errors += 1
            return False


# --- explain's facts (Queue.explain) --------------------------------------------------------


def _leased_columns(positions: list[int], leases: list[Lease], held: list[tuple[int, float, int]]
                    ) -> tuple[list[int], list[float], list[int]]:
    """A snapshot's leased messages as columns (positions, publish times, order keys), in
    position order: the leases (``positions`` ascending) and the messages held for a
    delayed retry (``held``: position, publish time, key). The usual case, nothing held,
    is built in C (map), with no row per message."""
    if held:
        rows = sorted([(p, lease.published_at, lease.key) for p, lease in zip(positions, leases)] + held)
        return [p for p, _, _ in rows], [t for _, t, _ in rows], [key for _, _, key in rows]
    return positions, list(map(_PUBLISHED_AT, leases)), list(map(_KEY, leases))


_PUBLISHED_AT, _KEY = attrgetter("published_at"), attrgetter("key")
