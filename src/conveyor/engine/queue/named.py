"""Named consumers' leases (the Spark connector; docs/spark-server.md): a part of
:class:`~conveyor.engine.queue.Queue`, reached as ``queue.named`` by the engine's named
consumers (engine/consumers.py). It owns no state. Rules:

1. A named consumer has a seat that is never active: dispatch offers it nothing, it
   takes messages only through these calls, with deadlines of its own.
2. Its leases are ordinary leases: they expire (LEASE_EXPIRE, journaled as any other),
   count as deliveries, and under Leasing=strict refuse acks from anyone else.
3. A barrier is never leased to it (FIFO: nothing at or after the first pending
   barrier; priority: the first epoch only), and at-most-once queues have none.
4. A re-offer (:meth:`NamedLeases.take_back`) renews a lease the consumer holds, leases
   again a message that came back (not a new delivery), and otherwise says where the
   message is (:class:`~conveyor.engine.queue.events.TakeBack`).
5. Batches: a lease (FIFO) takes the run at the head of the store in one pass, and an
   acknowledgement of messages all still leased to the consumer leaves in one pass; each
   message still goes through the transition table (the observers hear of each one),
   its own lease and its own delivery count. Anything else (a priority queue's lease, an
   ack of a lease that lapsed, a message named twice because it was leased again after
   its lease lapsed) goes message by message.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from conveyor.engine.queue.consumer import Consumer
from conveyor.engine.queue.events import TakeBack
from conveyor.engine.queue.leases import LeaseTable
from conveyor.engine.queue.order import DeliveryOrder
from conveyor.engine.queue.priority import POSITION_MASK, order_key
from conveyor.engine.queue.replica import Replica
from conveyor.engine.queue.seats import Seat, Seats
from conveyor.engine.queue.state import MessageState, QueueStateError, Transitions, Verb

_AVAILABLE = MessageState.AVAILABLE
_LEASED = MessageState.LEASED
_INACTIVE = MessageState.INACTIVE
_NOT_HERE = frozenset({_INACTIVE, _AVAILABLE})  # take_back: not deliverable to it now


class NamedLeases:
    """The named consumers' verbs over the parts of one queue (see the module header)."""

    def __init__(
        self, name: str, *, at_least_once: bool, priority: bool, transitions: Transitions, seats: Seats,
        order: DeliveryOrder, leases: LeaseTable, replica: Replica, count: Callable[[str, int], None],
        state_of: Callable[[int], MessageState], settle: Callable[[float], None],
        lease_run: Callable[[Seat, int | None, float, float], tuple[list[int], list[int]]],
    ) -> None:
        self._name = name
        self._at_least_once = at_least_once
        self._priority = priority
        self._transitions = transitions
        self._seats = seats
        self._order = order
        self._leases = leases
        self._replica = replica
        self._count = count  # adds n to a counter of the queue's statistics
        self._state_of = state_of
        self._settle = settle  # the end-of-replay limits, if no live call applied them yet
        self._lease_run = lease_run  # FIFO: the run at the head, leased in one pass (Queue._lease_run)

    def consumer(self, name: str) -> Consumer:
        """The :class:`Consumer` of named consumer ``name``, made on first use (after
        replay: a replay refuses a queue with consumers)."""
        if not self._at_least_once:
            raise QueueStateError(f"queue {self._name!r}: named consumers need at-least-once")
        key = ("named", name)
        return self._seats.named(key, lambda: Consumer(key, key, max_backlog=0)).consumer

    def lease_next(
        self, consumer: Consumer, n: int | None, now: float, deadline: float, upto: int | None = None
    ) -> tuple[list[int], list[int]]:
        """Lease up to ``n`` (None: every) available messages to ``consumer`` until
        ``deadline``, in delivery order, never one at a position >= ``upto``: (their
        positions, their delivery counts). FIFO takes the run at the head in one pass
        (rule 5)."""
        self._settle(now)
        seat = self._seats.of(consumer)
        end = math.inf if upto is None else upto
        if self._priority:
            positions, counts = [], []
            lease_to = self._lease_to
            for k in self._order.leasable(n, end):
                p, count = lease_to(seat, k, deadline, delivery=True)
                positions.append(p)
                counts.append(count)
        else:
            positions, counts = self._lease_run(seat, n, deadline, end)
        if positions:
            self._count("delivered", len(positions))
        return positions, counts

    def acknowledge_held(self, consumer: Consumer, positions: list[int], now: float) -> bool:
        """Acknowledge ``positions`` in one pass when every one is still leased to
        ``consumer`` (an ``ack_through`` in time: the common case), and say so; else
        change nothing and answer False: the queue's ``acknowledge`` then sorts them
        out one by one (rule 5)."""
        self._settle(now)
        if not _ascending(positions) and len(set(positions)) != len(positions):
            return False  # a message leased again after its lease lapsed: acked once, there
        seat = self._seats.of(consumer)
        if not seat.held.issuperset(positions):
            return False  # the seat's held set is exactly what is leased to it (leases.py rule 2)
        # LEASED is what the check above just saw (leased to this seat): not checked again
        self._transitions.move_all(positions, Verb.ACKNOWLEDGE, _LEASED, checked=False)
        self._leases.acknowledge_all(positions, seat)
        self._replica.forget_all(positions)
        self._leases.trim()
        if positions:
            self._count("acknowledged", len(positions))
        return True

    def renew(self, consumer: Consumer, positions: Iterable[int] | None, deadline: float) -> int:
        """Move the lease deadline of each of ``positions`` (None: all) still leased to
        ``consumer`` to ``deadline``; how many were."""
        return self._leases.renew_held(self._seats.of(consumer), positions, deadline)

    def take_back(
        self, consumer: Consumer, position: int, now: float, deadline: float, priority: int | None = None
    ) -> TakeBack:
        """Rule 4 for message ``position``. ``priority``: the message's priority, needed
        in a priority queue to find it in the order."""
        self._settle(now)
        seat = self._seats.of(consumer)
        leases = self._leases
        lease = leases.leased.get(position)
        if lease is not None:
            if lease.seat is not seat:
                return TakeBack.ELSEWHERE
            if lease.deadline != deadline:
                leases.renew(position, lease, deadline)
                leases.trim()
            return TakeBack.RENEWED
        order = self._order
        if position in order.store and not order.is_barrier(position):
            key = position
            if self._priority:
                if priority is None:
                    raise QueueStateError(f"queue {self._name!r}: take_back needs the priority")
                key = order_key(priority, position)
            self._lease_to(seat, key, deadline, delivery=False)
            return TakeBack.TAKEN
        if position in leases.consumed or position in self._replica or self._state_of(position) in _NOT_HERE:
            # ELSEWHERE: another instance owns it (engine/consumers.py rule 7); AVAILABLE and
            # not in the store: held for a delayed retry (queue/returns.py rule 2)
            return TakeBack.ELSEWHERE
        return TakeBack.DONE

    def _lease_to(self, seat: Seat, key: int, deadline: float, *, delivery: bool) -> tuple[int, int]:
        """AVAILABLE --LEASE--> LEASED for a named consumer's seat: (position, count)."""
        p = key & POSITION_MASK if self._priority else key
        self._transitions.move(p, Verb.LEASE, _AVAILABLE)
        t = self._order.take(key)
        return p, self._leases.lease(p, seat, deadline, t, key, delivery=delivery)


def _ascending(positions: list[int]) -> bool:
    """Each of ``positions`` above the one before (so none twice): a FIFO queue's
    deliveries, the common case, checked in one pass instead of with a set of them."""
    last = -1
    for p in positions:
        if p <= last:
            return False
        last = p
    return True
