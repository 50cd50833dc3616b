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
7. Recovery (Startup and Recovery): the engine replays the journaled events, in order
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
returns to the queue. :meth:`expire` O(k log L) for k expiries. Memory: 16 bytes per
available message (:mod:`conveyor.engine.queue_store`); per-message Python objects only
for leased, returned or awaiting-ack messages, which the backlogs bound.
"""

from __future__ import annotations

import math
from heapq import heapify, heappop, heappush
from typing import Callable, Hashable, Iterable, Iterator

from conveyor.config.model import Fairness, Leasing, QueueConfig, Semantics
from conveyor.engine.queue_consumer import Consumer, choose, effective_backlog
from conveyor.engine.queue_events import (
    REASON_ORDER,
    Acknowledged,
    AckOption,
    AckResult,
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
from conveyor.engine.queue_recovery import QueueRecovery
from conveyor.engine.queue_store import MessageStore
from conveyor.errors import ConfigError, DuplicateSubscription, InvalidOption, UnknownSubscription

__all__ = [
    "AckOption",
    "AckResult",
    "Acknowledged",
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
    __slots__ = ("seat", "deadline", "published_at")

    def __init__(self, seat: _Seat, deadline: float, published_at: float) -> None:
        self.seat = seat
        self.deadline = deadline
        self.published_at = published_at


class _Tally:
    """What one acknowledge call did; becomes an AckResult."""

    __slots__ = ("counts", "events", "freed", "refused")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(
            ("acknowledged", "cancelled", "expired", "released", "ignored"), 0
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
    for name, value in (
        ("Priority", config.priority),
        ("BarrierExpression", config.barrier_expression),
        ("TargetQueueDepth", config.target_queue_depth),
    ):
        if value is not None:
            raise bad(f"{name} is not supported yet", f"remove <{name}>")
    if config.lease_period_s < 0 or math.isnan(config.lease_period_s):
        raise bad(f"LeasePeriod must be >= 0, not {config.lease_period_s}")
    if config.expiration_s is not None and not config.expiration_s >= 0:
        raise bad(f"Expiration must be >= 0, not {config.expiration_s}")
    for name, value in (("MaxCancels", config.max_cancels), ("MaxDeliveries", config.max_deliveries)):
        if value is not None and value < 1:
            raise bad(f"{name} must be >= 1, not {value}")


class Queue(QueueRecovery):
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

        self._store = MessageStore()  # available messages
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

    def enqueue(self, position: int, published_at: float) -> None:
        """A message recorded on an underlying topic (queue filter already applied).

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
        advance(self._table, self._semantics, position, MessageState.ABSENT, Verb.ENQUEUE)
        if published_at < self._last_time:
            published_at = self._last_time
        self._last_position = position
        self._last_time = published_at
        self._store.append(position, published_at)
        self._n["enqueued"] += 1

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
        budget = -1 if max_deliveries is None else max_deliveries
        while budget != 0 and store and seats:
            head = store.head()
            best = None
            eligible: list[int] = []
            for i, seat in enumerate(seats):
                c = consumers[i]
                if c.outstanding >= c.max_backlog:
                    continue
                nxt = head if c.filter is None else self._next_for(seat)
                if nxt is None:
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

    def _next_for(self, seat: _Seat) -> int | None:
        """The oldest available message a filtered consumer matches."""
        flt = seat.consumer.filter
        if flt is not seat.filter_seen:
            seat.reset_cursor()
        store, candidates = self._store, seat.candidates
        while candidates:
            p = candidates[0]
            if p in store:
                return p
            heappop(candidates)
        found = None
        for p in store.scan(seat.cursor):
            if self._matches(flt, p):
                found = p
                break
        if found is None:
            seat.cursor = self._last_position + 1
            return None
        seat.cursor = found + 1
        heappush(candidates, found)
        return found

    def _deliver(self, seat: _Seat, p: int, now: float) -> Delivery:
        c = seat.consumer
        if self._at_least_once:
            advance(self._table, self._semantics, p, _AVAILABLE, Verb.LEASE)
            t = self._store.discard(p)
            n = self._deliveries.get(p, 0) + 1
            self._deliveries[p] = n
            deadline: float | None = now + self._lease_period
            self._leases[p] = _Lease(seat, deadline, t)
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
        hits = [p for p, _ in self._store.items() if self._matches(predicate, p)]
        hits += [p for p in self._leases if self._matches(predicate, p)]
        hits.sort()
        tally = _Tally()
        for p in hits:
            self._ack_one(p, by, option, now, tally)
        self._trim_deadlines()
        return tally.result()

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
                self._store.discard(p)
                self._forget(p)
                tally.events.append(Acknowledged(p))
                counts["acknowledged"] += 1
                self._n["acknowledged"] += 1
            elif option is AckOption.CANCEL:
                counts["ignored"] += 1  # not leased: nothing to return
            else:
                advance(self._table, self._semantics, p, _AVAILABLE, Verb.EXPIRE)
                self._store.discard(p)
                self._expire_gone(p, _FORCED, tally.events)
                counts["expired"] += 1
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
                store.discard(p)
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
        in delivery order, leased ones excluded. Read-only; do not change the queue while
        iterating."""
        for p, _ in self._store.items():
            yield p

    def state_of(self, position: int) -> MessageState:
        """ABSENT for messages never enqueued, before the recovery point, or done."""
        if position in self._leases:
            return _LEASED
        if position in self._consumed:
            return MessageState.CONSUMED
        if position in self._store:
            return _AVAILABLE
        return MessageState.ABSENT

    def recovery_point(self) -> int:
        """The highest P such that every message of this queue below P is done
        (acknowledged, expired or delivered at-most-once): stored in ``queues.ack``."""
        low = [p for p in (self._store.head(),) if p is not None]
        if self._leases:
            low.append(min(self._leases))
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
            **self._n,
        )

    def details(self) -> QueueDetails:
        """Every tracked message and consumer; O(queue), for the admin ``details``."""
        rows = []
        for p, t in self._store.items():
            rows.append(
                MessageDetail(
                    p, "available", t, self._deliveries.get(p, 0), self._cancels.get(p, 0),
                    None, None,
                )
            )
        for p, lease in self._leases.items():
            rows.append(
                MessageDetail(
                    p, "leased", lease.published_at, self._deliveries.get(p, 0),
                    self._cancels.get(p, 0),
                    lease.seat.consumer.key,
                    lease.deadline,
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
        self._came_back(p)
        return False

    def _came_back(self, p: int) -> None:
        """A message returned behind some filtered cursors: offer it to those consumers."""
        for seat in self._seats:
            flt = seat.consumer.filter
            if flt is None or flt is not seat.filter_seen or p >= seat.cursor:
                continue
            if self._matches(flt, p):
                heappush(seat.candidates, p)
                if len(seat.candidates) > seat.prune_at:
                    self._prune(seat)

    def _prune(self, seat: _Seat) -> None:
        store = self._store
        seat.candidates = sorted({p for p in seat.candidates if p in store})  # a valid heap
        seat.prune_at = 2 * len(seat.candidates) + _CANDIDATES_SLACK_MIN

    def _matches(self, flt: Callable[[object], bool], p: int) -> bool:
        # A filter (or load) that raises is "no match", counted in filter_errors: one bad
        # message must not stop delivery of the others, nor lose the deliveries already
        # made in this dispatch.
        try:
            return bool(flt(self._load(p)))
        except Exception:
            self._n["filter_errors"] += 1
            return False

    def _trim_deadlines(self) -> None:
        heap = self._deadlines
        if len(heap) > _HEAP_SLACK * len(self._leases) + _HEAP_SLACK_MIN:
            heap[:] = [(l.deadline, p) for p, l in self._leases.items()]
            heapify(heap)
