"""One message queue: the pure, I/O-free state machine of spec 000 ("Message Queues").

The queue knows a message only by its journal position (strictly increasing in publish
order) and its publish time. It reads a message body only through the injected
``load(position)``, to evaluate content filters. It never reads a clock: every call that
depends on time takes ``now`` (float seconds). It returns what must happen (deliveries,
events to journal) and does nothing else.

Rules kept here (each cites spec 000; the message transitions themselves are the table
in :mod:`conveyor.engine.queue_state`, the only place a message changes state):

1. Delivery (Message Flow for Queues, step 3): a message goes to a consumer when the
   consumer's filter matches it, it is the oldest available message that consumer
   matches, the consumer has room in its backlog, and the fairness model picks that
   consumer among all consumers that qualify (table 15.1, :func:`choose`).
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
   accepted. Unknown or already-done positions are ignored: acks are idempotent.
6. Backlog (Subscription Backlog; Replacing Queue Subscriptions): delivery needs
   ``outstanding < max_backlog``; a replace keeps leases and outstanding, so a consumer
   may sit above a lowered maximum until its acks bring it back under.
7. Priority ("Priority Queues"; Message Flow, step 3): with ``Priority`` a consumer
   gets "the highest priority value for messages in the queue and ... the oldest message
   at that priority" it matches. The engine computes the value once, at enqueue
   (``enqueue(..., priority=)``); the order is kept by
   :class:`conveyor.engine.queue_priority.PriorityIndex` over order keys that compare
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
   :mod:`conveyor.engine.queue_window`.
10. Recovery (Startup and Recovery): the engine replays the journaled events, in order
   and interleaved with the enqueues, through :meth:`replay`. No lease survives a
   restart, so a replayed lease has already ended (LEASE then RETURN): the message is
   available again with its delivery and cancel counts, and :meth:`end_replay` expires
   those at MaxCancels / MaxDeliveries by rule 2. Acknowledged, expired and
   at-most-once-delivered messages never come back (the replay methods and their rules
   are in :mod:`conveyor.engine.queue_recovery`).

Complexity (n available messages, C consumers of this queue, L leased messages):
enqueue O(1) amortized; acknowledge by bookmark O(1) for a leased message, O(log n)
otherwise; each delivery of :meth:`dispatch` O(C log n) plus filter evaluations, which
are amortized: a filtered consumer keeps a cursor (every available message before it
was evaluated) and a small heap of matches behind the cursor, so each message is
evaluated at most once per consumer and filter, plus once per consumer each time it
returns to the queue (in a priority queue, also when it is enqueued before the cursor in
priority order). :meth:`expire` O(k log L) for k expiries. Memory: 16 bytes per
available message (:mod:`conveyor.engine.queue_store`), 16 more in a priority queue
(:mod:`conveyor.engine.queue_priority`), none for an inactive one; per-message Python
objects only for leased, returned or awaiting-ack messages, which the backlogs bound.
"""

from __future__ import annotations

import enum
import math
from bisect import bisect_left
from heapq import heapify, heappop, heappush
from typing import Callable, Hashable, Iterable, Iterator

from conveyor import expr
from conveyor.config.model import Fairness, Leasing, QueueConfig, Semantics
from conveyor.engine.queue_consumer import Consumer, choose, effective_backlog
from conveyor.engine.queue_events import (
    REASON_ORDER,
    Acknowledged,
    AckOption,
    AckResult,
    BarrierDelivered,
    Cancelled,
    DeliveredAtMostOnce,
    Delivery,
    Event,
    Expired,
    ExpiryReason,
    Leased,
    LeaseExpired,
    MessageDetail,
    QueueDetails,
    QueueStats,
    Returned,
)
from conveyor.engine.queue_state import (
    TRANSITIONS,
    IllegalTransition,
    MessageState,
    PositionOutOfOrder,
    QueueStateError,
    Verb,
    advance,
)
from conveyor.engine.queue_priority import (
    KEY_END,
    POSITION_MASK,
    PriorityIndex,
    order_key,
    priority_of_key,
)
from conveyor.engine.queue_recovery import QueueRecovery
from conveyor.engine.queue_store import MessageStore
from conveyor.engine.queue_window import QueueWindow
from conveyor.errors import ConfigError, DuplicateSubscription, InvalidOption, UnknownSubscription

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
    "QueueStateError",
    "QueueStats",
    "Returned",
    "TakeBack",
    "check_config",
    "effective_backlog",
]

_AVAILABLE, _LEASED = MessageState.AVAILABLE, MessageState.LEASED
_TIME_LIMIT = ExpiryReason.TIME_LIMIT
_FORCED = (ExpiryReason.FORCED_EXPIRE,)
#: Stale lease deadlines (acked before they fell due) are swept out of the heap once they
#: outnumber the live ones by this factor, so the heap stays O(leases).
_HEAP_SLACK = 2
_HEAP_SLACK_MIN = 64
#: A filtered consumer's heap of candidates collects an entry each time a message comes
#: back behind its cursor, and drops stale ones only when they reach the top (which never
#: happens while the consumer is full). Past twice its last pruned size it is rebuilt
#: from the entries still available, without duplicates, so it stays O(returned messages).
_CANDIDATES_SLACK_MIN = 32


class TakeBack(enum.Enum):
    """What :meth:`Queue.take_back` found (a named consumer's re-offer)."""

    RENEWED = "renewed"  # it held the lease: the deadline moved
    TAKEN = "taken"  # the message was available: leased to it again
    ELSEWHERE = "elsewhere"  # leased to another subscriber, or inactive
    DONE = "done"  # acknowledged or expired


class _Seat:
    """A consumer as seen by one queue."""

    __slots__ = ("consumer", "filter_seen", "cursor", "candidates", "prune_at", "held", "active")

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.filter_seen = consumer.filter  # the filter the cursor was built for
        self.cursor = -(2**63)  # every available position below it was evaluated
        self.candidates: list[int] = []  # heap: evaluated matches below the cursor
        self.prune_at = _CANDIDATES_SLACK_MIN  # prune stale/duplicate candidates past this
        self.held: set[int] = set()  # leased here, or consumed here awaiting the ack
        self.active = True  # False once detached: keeps its leases, takes nothing new

    def reset_cursor(self) -> None:
        self.filter_seen = self.consumer.filter
        self.cursor = -(2**63)
        self.candidates = []
        self.prune_at = _CANDIDATES_SLACK_MIN


class _Lease:
    __slots__ = ("seat", "deadline", "published_at", "key")

    def __init__(self, seat: _Seat, deadline: float, published_at: float, key: int) -> None:
        self.seat = seat
        self.deadline = deadline
        self.published_at = published_at
        self.key = key  # order key: the position, or (priority queue) rank and position


class _Tally:
    """What one acknowledge call did; becomes an AckResult."""

    __slots__ = ("counts", "events", "freed", "refused")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(
            ("acknowledged", "cancelled", "expired", "released", "ignored", "deferred"), 0
        )
        self.events: list[Event] = []
        self.freed: dict[Hashable, None] = {}  # an ordered set
        self.refused: list[int] = []

    def result(self) -> AckResult:
        return AckResult(
            refused=len(self.refused),
            events=tuple(self.events),
            freed=tuple(self.freed),
            refused_positions=tuple(self.refused),
            **self.counts,
        )


def check_config(config: QueueConfig) -> None:
    """Refuse a configuration this queue cannot honour (ConfigError with the path)."""

    def bad(message: str, hint: str = "") -> ConfigError:
        return ConfigError(f"queue {config.name!r}: {message}", path=config.path, hint=hint)

    if config.semantics is Semantics.AT_MOST_ONCE and config.fairness is not Fairness.ROUND_ROBIN:
        raise bad(
            f"FairnessModel {config.fairness.value} is not allowed for at-most-once",
            "at-most-once queues support only round-robin (spec 000, Delivery Fairness)",
        )
    for name, text in (("Priority", config.priority), ("BarrierExpression", config.barrier_expression)):
        if text is None:
            continue
        if config.target_queue_depth is not None:
            raise bad(
                f"TargetQueueDepth cannot be combined with {name}",
                f"remove <TargetQueueDepth> or <{name}> (spec 000, Limiting Currently "
                "Deliverable Messages)",
            )
        try:
            expr.compile(text)
        except expr.ExpressionError as exc:
            raise bad(f"invalid {name}: {exc}", f"<{name}> takes an expression") from None
    if config.target_queue_depth is not None and config.target_queue_depth < 1:
        raise bad(f"TargetQueueDepth must be >= 1, not {config.target_queue_depth}")
    if config.lease_period_s < 0 or math.isnan(config.lease_period_s):
        raise bad(f"LeasePeriod must be >= 0, not {config.lease_period_s}")
    if config.expiration_s is not None and not config.expiration_s >= 0:
        raise bad(f"Expiration must be >= 0, not {config.expiration_s}")
    for name, value in (("MaxCancels", config.max_cancels), ("MaxDeliveries", config.max_deliveries)):
        if value is not None and value < 1:
            raise bad(f"{name} must be >= 1, not {value}")


class Queue(QueueRecovery, QueueWindow):
    """One queue (spec 000). See the module header for the rules it keeps."""

    def __init__(
        self, config: QueueConfig, *, load: Callable[[int], object], start: int = 0
    ) -> None:
        """``start``: the recovery point replay begins at (every message below it is done)."""
        check_config(config)
        self.config = config
        self._load = load
        self._semantics = config.semantics
        self._table = TRANSITIONS[config.semantics]
        self._at_least_once = config.semantics is Semantics.AT_LEAST_ONCE
        self._strict = config.leasing is Leasing.STRICT
        self._fairness = config.fairness
        self._lease_period = config.lease_period_s
        self._expiration = config.expiration_s
        self._max_cancels = config.max_cancels
        self._max_deliveries = config.max_deliveries
        self._priority = config.priority is not None
        self._barrier_on = config.barrier_expression is not None
        self._target = config.target_queue_depth

        self._store = MessageStore()  # available messages
        # Priority: the delivery order of each epoch (the messages between two pending
        # barriers); only the first is deliverable. FIFO queues deliver in store order.
        self._epochs: list[PriorityIndex] = (
            [PriorityIndex(self._store.__contains__)] if self._priority else []
        )
        self._barriers: list[int] = []  # pending barrier positions, ascending
        self._leases: dict[int, _Lease] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap of lease deadlines (some stale)
        self._deliveries: dict[int, int] = {}  # delivered at least once, still in the queue
        self._cancels: dict[int, int] = {}
        self._consumed: dict[int, _Seat] = {}  # at-most-once deliveries awaiting the ack
        self._replayed = False  # replay happened: end_replay's limit check is due
        self._pending: list[Event] = []  # events of that check not yet handed out

        self._seats: list[_Seat] = []  # active seats, in subscription order
        self._consumers: list[Consumer] = []  # their consumers, same order
        self._seat_of: dict[Hashable, _Seat] = {}  # every seat, detached ones too
        self._rr_next = 0  # round-robin: index following the last consumer served

        self._start = start
        self._last_position = start - 1
        self._last_time = -math.inf
        # TargetQueueDepth (queue_window): inactive messages are only counted.
        self._inactive = 0
        self._offered = start - 1  # last position that entered the active part (or offered)
        self._refill_from: int | None = None
        self._deferred: set[int] = set()  # deferred acks (positions in the inactive part)
        self._deferred_heap: list[int] = []
        self._n = dict.fromkeys(
            (
                "enqueued",
                "delivered",
                "acknowledged",
                "expired",
                "expired_leases",
                "returned",
                "cancelled",
                "filter_errors",
                "barriers_delivered",
            ),
            0,
        )

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def last_position(self) -> int:
        """Position of the last message enqueued (start - 1 before the first)."""
        return self._last_position

    def __repr__(self) -> str:
        return (
            f"<Queue {self.name!r} {self._semantics.value}: {len(self._store)} available, "
            f"{len(self._leases)} leased, {len(self._seats)} consumers>"
        )

    # --- messages in ----------------------------------------------------------------------

    def enqueue(
        self,
        position: int,
        published_at: float,
        priority: int | None = None,
        barrier: bool = False,
    ) -> bool:
        """A message recorded on an underlying topic (queue filter already applied).

        ``priority``: for a queue with ``Priority``, the value of the expression for this
        message (``Expression.priority``: 0 .. 2**64 - 1, or -1 for NULL / non-numeric,
        the lowest); required there (except for a barrier), refused elsewhere.
        ``barrier``: the message matches the queue's ``BarrierExpression``.

        Returns False when the message is inactive (TargetQueueDepth, rule 9): the queue
        only counted it, and the engine need not keep it in memory.

        Publish times are clamped to never decrease along positions, so the oldest
        message is always the first one (a clock that steps back cannot reorder expiry).
        """
        if position <= self._last_position:
            raise PositionOutOfOrder(
                f"queue {self.name!r}: position {position} is not above {self._last_position}",
                position=position,
            )
        if published_at != published_at:
            raise QueueStateError(f"queue {self.name!r}: publish time of {position} is NaN")
        if barrier and not self._barrier_on:
            raise QueueStateError(f"queue {self.name!r} has no BarrierExpression")
        key = position
        if self._priority:
            if barrier:
                pass  # a barrier is not in the priority order
            elif priority is None:
                raise QueueStateError(
                    f"queue {self.name!r} has a Priority: enqueue needs the message's priority",
                    position=position,
                )
            else:
                try:
                    key = order_key(priority, position)
                except ValueError as exc:
                    raise QueueStateError(f"queue {self.name!r}: {exc}", position=position) from None
        elif priority is not None:
            raise QueueStateError(f"queue {self.name!r} has no Priority")
        self._n["enqueued"] += 1
        if self._target is not None and (
            self._inactive or len(self._store) + len(self._leases) >= self._target
        ):
            self._hold(position)
            return False
        advance(self._table, self._semantics, position, MessageState.ABSENT, Verb.ENQUEUE)
        if published_at < self._last_time:
            published_at = self._last_time
        self._last_position = position
        self._offered = position
        self._last_time = published_at
        self._store.append(position, published_at)
        if barrier:
            self._barriers.append(position)
            if self._priority:
                self._epochs.append(PriorityIndex(self._store.__contains__))
        elif self._priority:
            self._epochs[-1].add(key)
            if len(self._epochs) == 1:
                self._came_back(key, published_at)  # it may sort before a filtered consumer's cursor
        return True

    # --- consumers --------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer, now: float) -> None:
        """A new subscription whose topic matches this queue."""
        self._settle(now)
        if consumer.key in self._seat_of:
            raise DuplicateSubscription(
                f"queue {self.name!r} already has consumer {consumer.key!r}", key=consumer.key
            )
        seat = _Seat(consumer)
        self._seat_of[consumer.key] = seat
        self._activate(seat)

    def replace_consumer(
        self,
        consumer: Consumer,
        *,
        filter: Callable[[object], bool] | None,
        max_backlog: int,
        now: float,
    ) -> None:
        """``subscribe`` with ``replace`` (spec 000, "Replacing Queue Subscriptions").

        Atomic: the new filter applies to every later delivery; leases and ``outstanding``
        are kept, so the consumer may end up above its new ``max_backlog``. A consumer
        that was detached from this queue is attached again. The engine calls this on
        every queue the consumer stays in (the shared consumer is updated idempotently).
        """
        seat = self._seat(consumer)
        if max_backlog < 0:
            raise InvalidOption(f"max_backlog must be >= 0, not {max_backlog}")
        consumer.filter = filter
        consumer.max_backlog = max_backlog
        if seat.filter_seen is not filter:
            seat.reset_cursor()
        if not seat.active:
            seat.reset_cursor()
            self._activate(seat)

    def detach_consumer(self, consumer: Consumer, now: float) -> None:
        """A replace moved the subscription's topic off this queue: deliver it nothing
        more, but keep its leases (spec 000: a replace does not break leases). Its acks
        still work; :meth:`remove_consumer` breaks what is left."""
        seat = self._seat(consumer)
        if seat.active:
            self._deactivate(seat)

    def remove_consumer(self, consumer: Consumer, now: float) -> list[Event]:
        """Unsubscribe or disconnect: break the consumer's leases (spec 000, "Delivery
        Semantics"); each message returns to the queue, or expires if over a limit."""
        seat = self._seat(consumer)
        if seat.active:
            self._deactivate(seat)
        del self._seat_of[consumer.key]
        events: list[Event] = []
        for p in sorted(seat.held):
            lease = self._leases.get(p)
            if lease is not None:
                self._end_lease(p, lease, Verb.RETURN, now, events)
            else:
                del self._consumed[p]
                self._release(seat, p)
        self._trim_deadlines()
        return events

    # --- delivery ---------------------------------------------------------------------------

    def dispatch(self, now: float, max_deliveries: int | None = None) -> list[Delivery]:
        """Every delivery that can happen now (at most ``max_deliveries``), in order.

        Call :meth:`expire` first with the same ``now``: dispatch does not look at
        Expiration. Each Delivery's ``event`` must be journaled.
        """
        self._settle(now)
        out: list[Delivery] = []
        seats, consumers, store = self._seats, self._consumers, self._store
        barriers, priority = self._barriers, self._priority
        budget = -1 if max_deliveries is None else max_deliveries
        while budget != 0 and store and seats:
            gate = None
            if barriers:
                b = barriers[0]
                if store.head() == b and not self._leases and not self._consumed:
                    out.append(self._release_barrier(b, now))
                    budget -= 1
                    continue
                if not priority:
                    gate = b  # FIFO: nothing at or after the first barrier goes
            if priority:
                head = self._epochs[0].head()  # the first epoch: before every barrier
            else:
                head = store.head()
                if gate is not None and head >= gate:
                    head = None
            best = None
            eligible: list[int] = []
            for i, seat in enumerate(seats):
                c = consumers[i]
                if c.outstanding >= c.max_backlog:
                    continue
                nxt = head if c.filter is None else self._next_for(seat, now)
                if nxt is None or (gate is not None and nxt >= gate):
                    continue
                if best is None or nxt < best:
                    best, eligible = nxt, [i]
                elif nxt == best:
                    eligible.append(i)
            if best is None:
                break
            i = choose(self._fairness, eligible, consumers, self._rr_next)
            self._rr_next = i + 1
            out.append(self._deliver(seats[i], best, now))
            budget -= 1
        return out

    def _next_for(self, seat: _Seat, now: float) -> int | None:
        """The first available message in delivery order (order key) that a filtered
        consumer matches."""
        flt = seat.consumer.filter
        if flt is not seat.filter_seen:
            seat.reset_cursor()
        store, candidates = self._store, seat.candidates
        mask = POSITION_MASK if self._priority else -1
        while candidates:
            k = candidates[0]
            if k & mask in store:
                return k
            heappop(candidates)
        found = None
        order = self._epochs[0] if self._priority else store
        for k in order.scan(seat.cursor):
            if self._matches(flt, k & mask, now):
                found = k
                break
        if found is None:
            # Past every active message (inactive ones enter behind it, in order).
            seat.cursor = KEY_END if self._priority else self._offered + 1
            return None
        seat.cursor = found + 1
        heappush(candidates, found)
        return found

    def _deliver(self, seat: _Seat, key: int, now: float) -> Delivery:
        c = seat.consumer
        if self._priority:
            p = key & POSITION_MASK
            self._epochs[0].remove(key)
        else:
            p = key
        if self._at_least_once:
            advance(self._table, self._semantics, p, _AVAILABLE, Verb.LEASE)
            t = self._store.discard(p)
            n = self._deliveries.get(p, 0) + 1
            self._deliveries[p] = n
            deadline: float | None = now + self._lease_period
            self._leases[p] = _Lease(seat, deadline, t, key)
            heappush(self._deadlines, (deadline, p))
        else:
            advance(self._table, self._semantics, p, _AVAILABLE, Verb.DELIVER)
            self._store.discard(p)
            self._consumed[p] = seat
            n, deadline = 1, None
        seat.held.add(p)
        c.outstanding += 1
        self._n["delivered"] += 1
        return Delivery(c, p, deadline, n)

    def _release_barrier(self, b: int, now: float) -> Delivery:
        """Everything before barrier ``b`` is acknowledged: it goes to every current
        consumer whose filter matches, backlog or not, and leaves the queue (rule 8)."""
        advance(self._table, self._semantics, b, _AVAILABLE, Verb.DELIVER_BARRIER)
        recipients = tuple(
            seat.consumer
            for seat in self._seats
            if seat.consumer.filter is None or self._matches(seat.consumer.filter, b, now)
        )
        self._unstore(b)
        self._n["barriers_delivered"] += 1
        return Delivery(None, b, None, 0, barrier=True, recipients=recipients)

    # --- acknowledgement ---------------------------------------------------------------------

    def acknowledge(
        self, positions: Iterable[int], *, by: Hashable | None, option: AckOption, now: float
    ) -> AckResult:
        """``sow_delete`` by bookmark. ``by``: the acking connection (None: the server)."""
        self._settle(now)
        tally = _Tally()
        for p in positions:
            self._ack_one(p, by, option, now, tally)
        self._trim_deadlines()
        return tally.result()

    def acknowledge_matching(
        self,
        predicate: Callable[[object], bool],
        *,
        by: Hashable | None,
        option: AckOption,
        now: float,
    ) -> AckResult:
        """``sow_delete`` with a filter: every matching message in the queue, leased or not
        (as Leasing allows). At-most-once deliveries are no longer in the queue."""
        self._settle(now)
        hits = [p for p, _ in self._store.items() if self._matches(predicate, p, now)]
        hits += [p for p in self._leases if self._matches(predicate, p, now)]
        hits.sort()
        tally = _Tally()
        for p in hits:
            self._ack_one(p, by, option, now, tally)
        self._trim_deadlines()
        return tally.result()

    # --- named consumers (the Spark connector; docs/spark-server.md) ---------------------------
    # A named consumer is a seat in _seat_of that is never active: dispatch offers it
    # nothing, it takes messages only through these calls, with deadlines of its own.
    # Its leases are ordinary leases: they expire (LEASE_EXPIRE, journaled as any other),
    # count as deliveries, and under Leasing=strict refuse acks from anyone else. A
    # barrier is never leased to it (FIFO: nothing at or after the first pending
    # barrier; priority: the first epoch only), and at-most-once queues have none.

    def named_consumer(self, name: str) -> Consumer:
        """The :class:`Consumer` of named consumer ``name``, made on first use (after
        replay: a replay refuses a queue with consumers)."""
        key = ("named", name)
        seat = self._seat_of.get(key)
        if seat is None:
            if not self._at_least_once:
                raise QueueStateError(f"queue {self.name!r}: named consumers need at-least-once")
            seat = _Seat(Consumer(key, key, max_backlog=0))
            seat.active = False
            self._seat_of[key] = seat
        return seat.consumer

    def lease_next(
        self, consumer: Consumer, n: int | None, now: float, deadline: float, upto: int | None = None
    ) -> list[Delivery]:
        """Lease up to ``n`` (None: every) available messages to named ``consumer`` until
        ``deadline``, in delivery order, never one at a position >= ``upto``."""
        self._settle(now)
        seat = self._seat(consumer)
        limit = math.inf if upto is None else upto
        if self._priority:
            keys = []
            for k in self._epochs[0]:
                if n is not None and len(keys) >= n:
                    break
                if k & POSITION_MASK < limit:
                    keys.append(k)
        else:
            if self._barriers:
                limit = min(limit, self._barriers[0])
            keys = []
            for p in self._store.scan(-1):
                if p >= limit or (n is not None and len(keys) >= n):
                    break
                keys.append(p)
        out = []
        for k in keys:
            p = self._lease_to(seat, k, deadline)
            count = self._deliveries.get(p, 0) + 1
            self._deliveries[p] = count
            self._n["delivered"] += 1
            out.append(Delivery(consumer, p, deadline, count))
        return out

    def renew(self, consumer: Consumer, positions: Iterable[int] | None, deadline: float) -> int:
        """Move the lease deadline of each of ``positions`` (None: all) still leased to
        ``consumer`` to ``deadline``; how many were."""
        seat = self._seat(consumer)
        renewed = 0
        for p in list(seat.held) if positions is None else positions:
            lease = self._leases.get(p)
            if lease is not None and lease.seat is seat:
                if lease.deadline != deadline:
                    lease.deadline = deadline
                    heappush(self._deadlines, (deadline, p))
                renewed += 1
        self._trim_deadlines()
        return renewed

    def take_back(
        self, consumer: Consumer, position: int, now: float, deadline: float, priority: int | None = None
    ) -> TakeBack:
        """Lease message ``position`` to ``consumer`` again (a re-offer): RENEWED (it
        held the lease: deadline moved), TAKEN (the message was available: leased
        again, not counted as a new delivery), ELSEWHERE (leased to another
        subscriber, or inactive) or DONE (acknowledged or expired). ``priority``: the
        message's priority, needed in a priority queue to find it in the order."""
        self._settle(now)
        seat = self._seat(consumer)
        lease = self._leases.get(position)
        if lease is not None:
            if lease.seat is not seat:
                return TakeBack.ELSEWHERE
            if lease.deadline != deadline:
                lease.deadline = deadline
                heappush(self._deadlines, (deadline, position))
                self._trim_deadlines()
            return TakeBack.RENEWED
        if position in self._store and not (self._barriers and position in self._barriers):
            key = position
            if self._priority:
                if priority is None:
                    raise QueueStateError(f"queue {self.name!r}: take_back needs the priority")
                key = order_key(priority, position)
            self._lease_to(seat, key, deadline)
            return TakeBack.TAKEN
        if position in self._consumed or self.state_of(position) is MessageState.INACTIVE:
            return TakeBack.ELSEWHERE
        return TakeBack.DONE

    def _lease_to(self, seat: _Seat, key: int, deadline: float) -> int:
        """AVAILABLE --LEASE--> LEASED for a named consumer's seat; the position."""
        p = key & POSITION_MASK if self._priority else key
        advance(self._table, self._semantics, p, _AVAILABLE, Verb.LEASE)
        if self._priority:
            # exact removal (queue_priority rule 4): the message may come back later
            self._epochs[bisect_left(self._barriers, p)].remove(key)
        t = self._store.discard(p)
        self._leases[p] = _Lease(seat, deadline, t, key)
        heappush(self._deadlines, (deadline, p))
        seat.held.add(p)
        seat.consumer.outstanding += 1
        return p

    def _ack_one(
        self, p: int, by: Hashable | None, option: AckOption, now: float, tally: _Tally
    ) -> None:
        counts = tally.counts
        lease = self._leases.get(p)
        if lease is not None:
            seat = lease.seat
            if self._strict and by is not None and by != seat.consumer.owner:
                tally.refused.append(p)
                return
            key = seat.consumer.key
            if option is AckOption.NONE:
                advance(self._table, self._semantics, p, _LEASED, Verb.ACKNOWLEDGE)
                del self._leases[p]
                self._release(seat, p)
                self._forget(p)
                tally.events.append(Acknowledged(p))
                counts["acknowledged"] += 1
                self._n["acknowledged"] += 1
            elif option is AckOption.CANCEL:
                counts["cancelled"] += 1
                if self._end_lease(p, lease, Verb.CANCEL, now, tally.events):
                    counts["expired"] += 1
            else:
                advance(self._table, self._semantics, p, _LEASED, Verb.EXPIRE)
                del self._leases[p]
                self._release(seat, p)
                self._expire_gone(p, _FORCED, tally.events)
                counts["expired"] += 1
            tally.freed[key] = None
            return
        seat = self._consumed.get(p)
        if seat is not None:
            # At-most-once: the message is gone; the ack only frees the backlog slot.
            if self._strict and by is not None and by != seat.consumer.owner:
                tally.refused.append(p)
                return
            del self._consumed[p]
            self._release(seat, p)
            counts["released"] += 1
            tally.freed[seat.consumer.key] = None
            return
        if p in self._store:
            if option is AckOption.NONE or not self._at_least_once:
                advance(self._table, self._semantics, p, _AVAILABLE, Verb.ACKNOWLEDGE)
                self._unstore(p)
                self._forget(p)
                tally.events.append(Acknowledged(p))
                counts["acknowledged"] += 1
                self._n["acknowledged"] += 1
            elif option is AckOption.CANCEL:
                counts["ignored"] += 1  # not leased: nothing to return
            else:
                advance(self._table, self._semantics, p, _AVAILABLE, Verb.EXPIRE)
                self._unstore(p)
                self._expire_gone(p, _FORCED, tally.events)
                counts["expired"] += 1
            return
        if (
            self._inactive
            and self._is_inactive(p)
            and (option is AckOption.NONE or not self._at_least_once)
            and self._defer_ack(p)
        ):
            # TargetQueueDepth: held until the message would become active (rule 9).
            tally.events.append(Acknowledged(p))
            counts["deferred"] += 1
            self._n["acknowledged"] += 1
            return
        counts["ignored"] += 1

    # --- time ---------------------------------------------------------------------------------

    def expire(self, now: float) -> list[Event]:
        """Lease expiries, then message Expiration, due at ``now``; events to journal.

        Leases go in (deadline, position) order, expirations in position order.
        """
        self._settle(now)
        events, self._pending = self._pending, []
        heap, leases = self._deadlines, self._leases
        while heap and heap[0][0] <= now:
            d, p = heappop(heap)
            lease = leases.get(p)
            if lease is None or lease.deadline != d:
                continue  # stale: acknowledged or re-leased since
            self._end_lease(p, lease, Verb.LEASE_EXPIRE, now, events)
        if self._expiration is not None:
            store, expiration = self._store, self._expiration
            while store:
                t = store.head_time()
                if now < t + expiration:
                    break
                p = store.head()
                advance(self._table, self._semantics, p, _AVAILABLE, Verb.EXPIRE)
                self._unstore(p)
                self._expire_gone(p, (_TIME_LIMIT,), events)
        return events

    def next_deadline(self) -> float | None:
        """The earliest lease or Expiration deadline: when :meth:`expire` has work
        (``-inf`` after a replay until :meth:`end_replay` or :meth:`expire` ran)."""
        if self._replayed or self._pending:
            return -math.inf
        heap, leases = self._deadlines, self._leases
        while heap:
            d, p = heap[0]
            lease = leases.get(p)
            if lease is not None and lease.deadline == d:
                break
            heappop(heap)  # stale: dropping it changes no state
        deadlines = [heap[0][0]] if heap else []
        if self._expiration is not None and self._store:
            deadlines.append(self._store.head_time() + self._expiration)
        return min(deadlines) if deadlines else None

    # --- views ---------------------------------------------------------------------------------

    def available(self) -> Iterator[int]:
        """The queue as a view (spec 000, "Querying Queues as a View"): available positions
        in delivery order (priority order within each barrier epoch, each pending barrier
        after the messages before it), leased and inactive ones excluded. Read-only; do
        not change the queue while iterating (RuntimeError)."""
        if not self._priority:
            for p, _ in self._store.items():
                yield p
            return
        store = self._store
        version = store.version
        barriers = self._barriers
        for e, index in enumerate(self._epochs):
            for k in index:
                yield k & POSITION_MASK
                if store.version != version:
                    raise RuntimeError("queue changed during iteration")
            if e < len(barriers):
                yield barriers[e]
                if store.version != version:
                    raise RuntimeError("queue changed during iteration")

    def state_of(self, position: int) -> MessageState:
        """ABSENT for messages never enqueued, before the recovery point, or done.
        INACTIVE for a position in the inactive part of a TargetQueueDepth queue (the
        queue cannot tell whether one of its messages is there)."""
        if position in self._leases:
            return _LEASED
        if position in self._consumed:
            return MessageState.CONSUMED
        if position in self._store:
            return _AVAILABLE
        if self._inactive and self._is_inactive(position) and position not in self._deferred:
            return MessageState.INACTIVE
        return MessageState.ABSENT

    def recovery_point(self) -> int:
        """The highest P such that every message of this queue below P is done
        (acknowledged, expired or delivered at-most-once): stored in ``queues.ack``.
        Never past :meth:`refill_from` while messages are inactive."""
        low = [p for p in (self._store.head(),) if p is not None]
        if self._leases:
            low.append(min(self._leases))
        if self._inactive:
            low.append(self._refill_from)
        if low:
            return min(low)
        return max(self._start, self._last_position + 1)

    def statistics(self, now: float | None = None) -> QueueStats:
        lease_start = None
        if self._leases:
            lease_start = min(l.deadline for l in self._leases.values()) - self._lease_period
        oldest = [l.published_at for l in self._leases.values()]
        if self._store:
            oldest.append(self._store.head_time())
        cfg = self.config
        return QueueStats(
            name=cfg.name,
            semantics=self._semantics.value,
            queue_depth=len(self._store) + len(self._leases),
            available=len(self._store),
            backlog=len(self._leases),
            awaiting_ack=len(self._consumed),
            consumers=len(self._seats),
            max_backlog=cfg.max_backlog,
            target_queue_depth=cfg.target_queue_depth,
            age_of_oldest_lease=(
                None if now is None or lease_start is None else max(0.0, now - lease_start)
            ),
            seconds_behind=None if now is None or not oldest else max(0.0, now - min(oldest)),
            inactive_message_count=self._inactive,
            deferred_ack_count=len(self._deferred),
            barriers_pending=len(self._barriers),
            **self._n,
        )

    def details(self) -> QueueDetails:
        """Every tracked message and consumer; O(queue), for the admin ``details``."""
        rows = []
        priorities: dict[int, int] = {}
        for index in self._epochs:
            for k in index:
                priorities[k & POSITION_MASK] = priority_of_key(k)
        barriers = set(self._barriers)
        for p, t in self._store.items():
            rows.append(
                MessageDetail(
                    p, "available", t, self._deliveries.get(p, 0), self._cancels.get(p, 0),
                    None, None, priorities.get(p), p in barriers,
                )
            )
        for p, lease in self._leases.items():
            rows.append(
                MessageDetail(
                    p, "leased", lease.published_at, self._deliveries.get(p, 0),
                    self._cancels.get(p, 0),
                    lease.seat.consumer.key,
                    lease.deadline,
                    priority_of_key(lease.key) if self._priority else None,
                )
            )
        rows.sort(key=lambda r: r.position)
        return QueueDetails(
            messages=tuple(rows),
            awaiting_ack=tuple(sorted((p, s.consumer.key) for p, s in self._consumed.items())),
            consumers=tuple(
                (s.consumer.key, s.consumer.outstanding, s.consumer.max_backlog)
                for s in self._seat_of.values()
            ),
        )

    # --- helpers ------------------------------------------------------------------------------------


    def _seat(self, consumer: Consumer) -> _Seat:
        seat = self._seat_of.get(consumer.key)
        if seat is None or seat.consumer is not consumer:
            raise UnknownSubscription(
                f"queue {self.name!r} has no consumer {consumer.key!r}", key=consumer.key
            )
        return seat

    def _activate(self, seat: _Seat) -> None:
        seat.active = True
        self._seats.append(seat)
        self._consumers.append(seat.consumer)

    def _deactivate(self, seat: _Seat) -> None:
        i = self._seats.index(seat)
        del self._seats[i]
        del self._consumers[i]
        if i < self._rr_next:
            self._rr_next -= 1
        seat.active = False

    def _release(self, seat: _Seat, p: int) -> None:
        seat.held.discard(p)
        seat.consumer.outstanding -= 1

    def _forget(self, p: int) -> None:
        self._deliveries.pop(p, None)
        self._cancels.pop(p, None)

    def _expire_gone(self, p: int, reasons: tuple[str, ...], events: list[Event]) -> None:
        """Bookkeeping for a message that has just moved to EXPIRED."""
        self._forget(p)
        events.append(Expired(p, reasons))
        self._n["expired"] += 1

    def _limit_reasons(self, p: int, published_at: float, now: float) -> tuple[str, ...]:
        """Why a message coming back to the queue must expire instead (rule 2)."""
        found = []
        if self._expiration is not None and now >= published_at + self._expiration:
            found.append(ExpiryReason.TIME_LIMIT)
        if self._max_cancels is not None and self._cancels.get(p, 0) >= self._max_cancels:
            found.append(ExpiryReason.MAX_CANCELS)
        if (
            self._max_deliveries is not None
            and self._deliveries.get(p, 0) >= self._max_deliveries
        ):
            found.append(ExpiryReason.MAX_DELIVERIES)
        return tuple(r for r in REASON_ORDER if r in found)

    def _end_lease(
        self, p: int, lease: _Lease, verb: Verb, now: float, events: list[Event]
    ) -> bool:
        """Cancel, lease expiry or broken lease: back to the queue, or expired when over a
        limit (then True)."""
        advance(self._table, self._semantics, p, _LEASED, verb)
        del self._leases[p]
        self._release(lease.seat, p)
        if verb is Verb.CANCEL:
            n = self._cancels.get(p, 0) + 1
            self._cancels[p] = n
            events.append(Cancelled(p, n))
            self._n["cancelled"] += 1
        elif verb is Verb.LEASE_EXPIRE:
            events.append(LeaseExpired(p))
            self._n["expired_leases"] += 1
        else:
            events.append(Returned(p))
            self._n["returned"] += 1
        reasons = self._limit_reasons(p, lease.published_at, now)
        if reasons:
            advance(self._table, self._semantics, p, _AVAILABLE, Verb.EXPIRE)
            self._expire_gone(p, reasons, events)
            return True
        self._store.restore(p, lease.published_at)
        if self._priority:
            self._epochs[0].add(lease.key)  # a leased message was in the first epoch
        self._came_back(lease.key, now)
        return False

    def _came_back(self, key: int, now: float) -> None:
        """A message (order ``key``) is available again, or new in a priority queue,
        behind some filtered cursors: offer it to those consumers."""
        p = key & POSITION_MASK if self._priority else key
        for seat in self._seats:
            flt = seat.consumer.filter
            if flt is None or flt is not seat.filter_seen or key >= seat.cursor:
                continue
            if self._matches(flt, p, now):
                heappush(seat.candidates, key)
                if len(seat.candidates) > seat.prune_at:
                    self._prune(seat)

    def _prune(self, seat: _Seat) -> None:
        store = self._store
        mask = POSITION_MASK if self._priority else -1
        seat.candidates = sorted({k for k in seat.candidates if k & mask in store})  # a heap
        seat.prune_at = 2 * len(seat.candidates) + _CANDIDATES_SLACK_MIN

    def _unstore(self, p: int) -> float | None:
        """An available message leaves the queue other than by a delivery (ack, expiry,
        barrier release, replayed removal): the store, and the delivery order."""
        t = self._store.discard(p)
        barriers = self._barriers
        if barriers and p >= barriers[0]:
            i = bisect_left(barriers, p)
            if i < len(barriers) and barriers[i] == p:
                self._drop_barrier(i)
                return t
        if self._priority:
            self._epochs[bisect_left(barriers, p)].forget()  # lazily (queue_priority rule 4)
        return t

    def _drop_barrier(self, i: int) -> None:
        """Pending barrier ``i`` is gone: the epochs on either side of it are one."""
        del self._barriers[i]
        if not self._priority:
            return  # FIFO: the gate is the first barrier, the cursors stay valid
        epochs = self._epochs
        left, right = epochs[i], epochs[i + 1]
        if not left:
            del epochs[i]
        elif right:
            left.merge(right)
            del epochs[i + 1]
        else:
            del epochs[i + 1]
            return
        if i == 0:
            # The first epoch has new messages, possibly before the filtered cursors.
            for seat in self._seat_of.values():
                seat.reset_cursor()

    def _matches(self, flt: Callable[[object, float], bool], p: int, now: float) -> bool:
        # A filter (or load) that raises is "no match", counted in filter_errors: one bad
        # message must not stop delivery of the others, nor lose the deliveries already
        # made in this dispatch.
        try:
            return bool(flt(self._load(p), now))
        except Exception:
            self._n["filter_errors"] += 1
            return False

    def _trim_deadlines(self) -> None:
        heap = self._deadlines
        if len(heap) > _HEAP_SLACK * len(self._leases) + _HEAP_SLACK_MIN:
            heap[:] = [(l.deadline, p) for p, l in self._leases.items()]
            heapify(heap)

    # --- FileBackedMetadata (queue_paging, queue_snapshot) -----------------------------------

    def page_to(self, file) -> None:
        """Keep the available messages in a paged store over ``file`` (a
        :class:`~conveyor.engine.queue_paging.PageFile`): memory bounded whatever the
        depth. Only before the first message, and not for a priority queue (whose
        delivery index is not paged)."""
        from conveyor.engine.queue_paging import PagedMessageStore

        if self._priority or self._store or self._last_position >= self._start:
            raise QueueStateError(f"queue {self.name!r}: paging must be set up on an empty FIFO queue")
        self._store = PagedMessageStore(file)

    def snapshot(self, *, events_from: int, publishes_from: int):
        """The state as replaying the journal would rebuild it (queue_snapshot rule 1)."""
        from conveyor.engine import queue_snapshot

        return queue_snapshot.take(self, events_from=events_from, publishes_from=publishes_from)

    def restore_snapshot(self, snap) -> None:
        """Load a snapshot (checked with ``queue_snapshot.check``) into this new queue,
        then replay the journal from the snapshot's positions."""
        from conveyor.engine import queue_snapshot

        if self._seat_of or self._store or self._last_position >= self._start:
            raise QueueStateError(f"queue {self.name!r}: a snapshot restores a new queue")
        queue_snapshot.restore(self, snap)
