"""The seats of a queue: its consumers as the queue sees them, in subscription order,
with the fairness cursor and each filtered consumer's cursor (spec 000, "Message Flow
for Queues", step 3; "Delivery Fairness").

A part of :class:`conveyor.engine.queue.Queue`. Rules:

1. Every consumer of the queue has one :class:`Seat`, found by its key. An **active**
   seat takes deliveries; a detached one (a replace moved its topic off this queue) and
   a named consumer's (the Spark connector: it takes messages only through
   ``lease_next``) do not, but keep what they hold. ``active`` and ``consumers`` list
   the active seats and their consumers in subscription order.
2. "Delivery Fairness", table 15.1 (:meth:`choose`), among the consumers that have
   room and whose filter matches the message, in subscription order: ``fast``: the
   first one; ``round-robin``: the first one at or after the one following the last
   consumer served (the cursor; a consumer leaving before it moves it back by one, so
   nobody is skipped); ``proportional``: the lowest ``outstanding / max_backlog``, ties
   to the first one found.
3. A filtered consumer keeps a **cursor** (every available message before it, in
   delivery order, was evaluated) and a heap of **candidates** (evaluated matches
   behind the cursor): each message is evaluated at most once per consumer and filter,
   plus once each time it comes back behind the cursor (:meth:`came_back`). A new
   filter, a re-attachment or a merge of the first priority epoch rebuilds the cursor.
   Past the last active message the cursor is set to ``end`` (inactive messages enter
   behind it, in order).
4. The candidate heap collects an entry each time a message comes back behind the
   cursor and drops stale ones only when they reach the top (which never happens while
   the consumer is full): past twice its last pruned size (plus
   ``CANDIDATES_SLACK_MIN``) it is rebuilt from the entries still available, without
   duplicates, so it stays O(returned messages).
5. A seat's ``held`` set (what it leased, or was delivered at-most-once and has not
   acknowledged) and its consumer's ``outstanding`` belong to the lease table
   (:mod:`conveyor.engine.queue.leases`, rule 2), not to this part.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING, Callable, Hashable, Iterable

from conveyor.config.model import Fairness
from conveyor.engine.filter_budget import FilterBudget, FilterBudgetSpent
from conveyor.engine.queue.consumer import Consumer
from conveyor.engine.queue.priority import POSITION_MASK
from conveyor.errors import DuplicateSubscription, UnknownSubscription

if TYPE_CHECKING:
    from conveyor.engine.queue.priority import PriorityIndex
    from conveyor.engine.queue.store import MessageStore

#: Rule 4: the smallest candidate heap that is pruned.
CANDIDATES_SLACK_MIN = 32
_CURSOR_START = -(2**63)


class Seat:
    """A consumer as seen by one queue."""

    __slots__ = ("consumer", "filter_seen", "cursor", "candidates", "prune_at", "held", "active")

    def __init__(self, consumer: Consumer, *, active: bool = True) -> None:
        self.consumer = consumer
        self.filter_seen = consumer.filter  # the filter the cursor was built for
        self.cursor = _CURSOR_START  # every available key below it was evaluated
        self.candidates: list[int] = []  # heap: evaluated matches below the cursor
        self.prune_at = CANDIDATES_SLACK_MIN  # prune stale/duplicate candidates past this
        self.held: set[int] = set()  # leased here, or consumed here awaiting the ack
        self.active = active  # False once detached: keeps its leases, takes nothing new

    def reset_cursor(self) -> None:
        self.filter_seen = self.consumer.filter
        self.cursor = _CURSOR_START
        self.candidates = []
        self.prune_at = CANDIDATES_SLACK_MIN


class Seats:
    """Rules 1-4. ``matches(filter, position, now)`` evaluates a filter (the queue counts
    the ones that raise); ``contains(position)`` on a store tells a stale candidate."""

    __slots__ = ("active", "consumers", "_by_key", "_rr_next", "_mask", "_matches", "_name", "_budget")

    def __init__(
        self, name: str, *, priority: bool, matches: Callable[[Callable[[object, float], bool], int, float], bool],
        budget: FilterBudget | None = None,
    ) -> None:
        self.active: list[Seat] = []  # active seats, in subscription order
        self.consumers: list[Consumer] = []  # their consumers, same order
        self._by_key: dict[Hashable, Seat] = {}  # every seat, detached and named ones too
        self._rr_next = 0  # round-robin: index following the last consumer served
        self._mask = POSITION_MASK if priority else -1  # order key -> position
        self._matches = matches
        self._name = name
        self._budget = budget  # the turn's filter budget (queue rule 12), charged by next_for

    def __len__(self) -> int:
        return len(self.active)

    def any(self) -> bool:
        """Whether the queue has any seat at all (detached and named ones included)."""
        return bool(self._by_key)

    def every(self) -> Iterable[Seat]:
        return self._by_key.values()

    # --- membership -------------------------------------------------------------------------

    def add(self, consumer: Consumer) -> Seat:
        if consumer.key in self._by_key:
            raise DuplicateSubscription(
                f"queue {self._name!r} already has consumer {consumer.key!r}", key=consumer.key
            )
        seat = self._by_key[consumer.key] = Seat(consumer, active=False)
        self.attach(seat)
        return seat

    def named(self, key: Hashable, make: Callable[[], Consumer]) -> Seat:
        """The seat of named consumer ``key`` (never active), made with ``make()`` on first use."""
        seat = self._by_key.get(key)
        if seat is None:
            seat = self._by_key[key] = Seat(make(), active=False)
        return seat

    def of(self, consumer: Consumer) -> Seat:
        seat = self._by_key.get(consumer.key)
        if seat is None or seat.consumer is not consumer:
            raise UnknownSubscription(
                f"queue {self._name!r} has no consumer {consumer.key!r}", key=consumer.key
            )
        return seat

    def remove(self, seat: Seat) -> None:
        if seat.active:
            self.detach(seat)
        del self._by_key[seat.consumer.key]

    def attach(self, seat: Seat) -> None:
        if __debug__:
            assert not seat.active, f"seat {seat.consumer.key!r} is active already"
        seat.active = True
        self.active.append(seat)
        self.consumers.append(seat.consumer)

    def detach(self, seat: Seat) -> None:
        i = self.active.index(seat)
        del self.active[i]
        del self.consumers[i]
        if i < self._rr_next:
            self._rr_next -= 1  # rule 2
        seat.active = False

    # --- fairness ---------------------------------------------------------------------------

    def choose(self, fairness: Fairness, eligible: list[int]) -> int:
        """The index (into ``active``) of the consumer that gets the message (rule 2).
        ``eligible``: indices, ascending, of the consumers with room whose filter matches."""
        i = eligible[0]
        if len(eligible) > 1 and fairness is not Fairness.FAST:
            if fairness is Fairness.ROUND_ROBIN:
                rr_next = self._rr_next
                for j in eligible:
                    if j >= rr_next:
                        i = j
                        break  # else: wrap around to the first one
            else:
                # Proportional: the lowest outstanding / max_backlog, compared as integer
                # cross products so that 1/2 and 2/4 tie exactly; strict "<" keeps the
                # first one found on a tie.
                consumers = self.consumers
                b = consumers[i]
                for j in eligible[1:]:
                    c = consumers[j]
                    if c.outstanding * b.max_backlog < b.outstanding * c.max_backlog:
                        i, b = j, c
        self._rr_next = i + 1
        return i

    # --- filtered cursors ---------------------------------------------------------------------

    def next_for(
        self, seat: Seat, contains: Callable[[int], bool], order: PriorityIndex | MessageStore, end: int, now: float
    ) -> int | None:
        """The first key in delivery order, among ``order.scan(...)``, that the filtered
        consumer of ``seat`` matches at ``now`` (rule 3). ``contains``: membership in the
        store; ``end``: the cursor past every active message."""
        flt = seat.consumer.filter
        assert flt is not None  # asked for filtered consumers only
        if flt is not seat.filter_seen:
            seat.reset_cursor()
        candidates, mask = seat.candidates, self._mask
        while candidates:
            k = candidates[0]
            if contains(k & mask):
                return k
            heappop(candidates)
        matches, budget = self._matches, self._budget
        cost = getattr(flt, "cost_ticks", 0)
        for k in order.scan(seat.cursor):
            if budget is not None and not budget.take(cost):
                seat.cursor = k  # everything before k was evaluated: go on from k next time
                raise FilterBudgetSpent
            if matches(flt, k & mask, now):
                seat.cursor = k + 1
                heappush(candidates, k)
                return k
        seat.cursor = end
        return None

    def came_back(self, key: int, contains: Callable[[int], bool], now: float) -> None:
        """A message (order ``key``) is available again, or new before some cursors (a
        priority queue): offer it to the filtered consumers it is behind (rule 3), as
        their filters decide at ``now``."""
        p = key & self._mask
        matches = self._matches
        for seat in self.active:
            flt = seat.consumer.filter
            if flt is None or flt is not seat.filter_seen or key >= seat.cursor:
                continue
            if matches(flt, p, now):
                heappush(seat.candidates, key)
                if len(seat.candidates) > seat.prune_at:
                    self._prune(seat, contains)

    def _prune(self, seat: Seat, contains: Callable[[int], bool]) -> None:
        mask = self._mask
        seat.candidates = sorted({k for k in seat.candidates if contains(k & mask)})  # a heap
        seat.prune_at = 2 * len(seat.candidates) + CANDIDATES_SLACK_MIN

    def reset_cursors(self) -> None:
        """The first priority epoch has new messages, possibly before the cursors."""
        for seat in self._by_key.values():
            seat.reset_cursor()
