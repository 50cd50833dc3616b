"""How a message comes back to its queue, or leaves it as expired: the end of a lease
other than by an acknowledgement (cancel, lease expiry, broken lease), delayed retries,
and the failure notes an expiry carries to its dead letter (docs/queues.md, "Delayed
retry" and "Failure reasons"). A part of :class:`conveyor.engine.queue.Queue`, which
reaches it as ``queue._returns``. Rules:

1. **Back or expired.** A lease that ends other than by an ack returns its message to
   the queue, unless it is over a limit (queue rule 2): then it expires at once, in the
   same call. A message whose ownership moved away while it was leased leaves for its
   new owner (queue/replica.py rule 3).
2. **Delayed retry.** A cancel may come with a delay (``cancel,delay=N``), or the
   queue's ``RetryBackoff`` gives one by the message's new cancel count (the last value
   repeats; an asked delay wins, ``delay=0`` included). The message is then HELD here,
   out of the delivery order, until ``not_before``: AVAILABLE for the transition table
   (the CANCEL made it so; holding it is no transition), but offered to nobody, so the
   messages after it flow past it. At its time (:meth:`wake`, from ``Queue.expire``,
   whose deadline :meth:`next_deadline` feeds) it goes back into the order in its
   place, so FIFO order among available messages is kept; or expires, if it is over a
   limit then (an Expiration that passes while it waits takes effect then); or leaves
   for its new owner (replicated queues). ``not_before`` is journaled in the
   ``Cancelled`` event and restored by replay and snapshots; a held message counts
   wherever an available one does (recovery point, TargetQueueDepth, a barrier after
   it waits for it), and an ack or an ``expire`` of it removes it at once.
3. **Failure notes.** Every lease end notes the consumer that held it, and a cancel or
   an ``expire`` the application's reason (:meth:`LeaseTable.note`); an expiry carries
   the last reason in its ``Expired`` event, and leaves its delivery count and last
   consumer for the engine to read as it journals the dead letter (:meth:`failure_of`). Reasons are journaled with the cancel that gave them; the last
   consumer is not (after a restart it is unknown until the next delivery ends).

Complexity: O(log h) per delayed cancel and per wake-up (h held messages); memory one
dict entry and one heap entry per held message.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush
from typing import Callable, Hashable, Iterator, NamedTuple

from conveyor.engine.queue.events import Cancelled, Event, Expired, ExpiryReason, LeaseExpired, Returned
from conveyor.engine.queue.expiry import MessageExpiry
from conveyor.engine.queue.leases import LeaseTable
from conveyor.engine.queue.order import DeliveryOrder
from conveyor.engine.queue.replica import Replica
from conveyor.engine.queue.seats import Seats
from conveyor.engine.queue.state import MessageState, Transitions, Verb

_LEASED, _AVAILABLE = MessageState.LEASED, MessageState.AVAILABLE

#: Expiries whose delivery count and last consumer wait for the engine (rule 3), at most.
FAILURES_KEPT = 4096


class _LeaseEnd(NamedTuple):
    counter: str  # the QueueCounters field it adds one to
    cancels: bool  # it counts as a cancel (MaxCancels)


#: How a lease ends other than by an acknowledgement (queue rule 2), by verb.
_LEASE_ENDS = {
    Verb.CANCEL: _LeaseEnd("cancelled", True),
    Verb.LEASE_EXPIRE: _LeaseEnd("expired_leases", False),
    Verb.RETURN: _LeaseEnd("returned", False),
}


class Returns:
    """Rules 1-3 over the parts of one queue. ``backoff``: the queue's RetryBackoff
    (seconds; empty: no delay unless asked); ``count(name)`` adds one to a counter."""

    __slots__ = ("_held", "_heap", "_backoff", "_transitions", "_order", "_leases", "_seats", "_replica",
                 "_stamped", "_count", "_failures")

    def __init__(
        self, backoff: tuple[float, ...], *, transitions: Transitions, order: DeliveryOrder, leases: LeaseTable,
        seats: Seats, replica: Replica, stamped: MessageExpiry[int], count: Callable[[str], None],
    ) -> None:
        self._held: dict[int, tuple[float, float, int]] = {}  # position -> (not before, publish time, key)
        self._heap: list[tuple[float, int]] = []  # (not before, position); entries of gone ones are stale
        self._backoff = backoff
        self._transitions = transitions
        self._order = order
        self._leases = leases
        self._seats = seats
        self._replica = replica
        self._stamped = stamped
        self._count = count
        # rule 3: (deliveries, last consumer) of the messages just expired, until the engine
        # journals their dead letters (:meth:`failure_of`); the oldest go past FAILURES_KEPT
        self._failures: dict[int, tuple[int, Hashable]] = {}

    # --- rule 1 ------------------------------------------------------------------------------

    def end_lease(self, p: int, verb: Verb, now: float, events: list[Event], *,
                  delay: float | None = None, reason: str = "") -> bool:
        """Cancel, lease expiry or broken lease: back to the queue (held until its time,
        rule 2), or expired when over a limit (then True)."""
        end = _LEASE_ENDS[verb]
        state = self._transitions.move(p, verb, _LEASED)
        leases = self._leases
        lease = leases.end(p)
        leases.note(p, lease.seat.consumer.key, reason)
        not_before = 0.0
        if end.cancels:
            cancels = leases.cancel(p)
            wait = self.delay(cancels, delay)
            not_before = now + wait if wait > 0 else 0.0
            events.append(Cancelled(p, cancels, not_before, reason))
        else:
            events.append(LeaseExpired(p) if verb is Verb.LEASE_EXPIRE else Returned(p))
        self._count(end.counter)
        if self._expired_instead(p, lease.published_at, now, state, events):
            return True
        if self._leaves(p, lease.published_at, lease.key, now, state):
            return False
        if not_before:
            self.hold(p, not_before, lease.published_at, lease.key)
            return False
        self._order.put_back(p, lease.published_at, lease.key)
        self._seats.came_back(lease.key, self._order.store.__contains__, now)
        return False

    def _expired_instead(self, p: int, published_at: float, now: float, state: MessageState,
                         events: list[Event]) -> bool:
        reasons = self._leases.limit_reasons(p, published_at, now)
        if self._stamped and self._stamped.due(p, now) and ExpiryReason.TIME_LIMIT not in reasons:
            reasons = (ExpiryReason.TIME_LIMIT, *reasons)  # its own expiry (queue/expiry.py rule 2)
        if not reasons:
            return False
        self._transitions.step(p, Verb.EXPIRE, state)
        self.expire_gone(p, reasons, events)
        return True

    def _leaves(self, p: int, published_at: float, key: int, now: float, state: MessageState) -> bool:
        owner = self._replica.leaving(p)
        if owner is None:
            return False
        # Its ownership moved away while it was leased or held here (queue/replica.py rule 3).
        self._transitions.step(p, Verb.TRANSFER_OUT, state)
        self._replica.add(p, owner, published_at, key, now)
        self._count("transferred_out")
        return True

    def expire_gone(self, p: int, reasons: tuple[str, ...], events: list[Event], *,
                    reason: str = "", consumer: Hashable | None = None) -> None:
        """Bookkeeping for a message that has just moved to EXPIRED (rule 3: its notes
        go with the event)."""
        leases = self._leases
        note = leases.note_of(p)
        if consumer is not None or reason:
            leases.note(p, consumer if consumer is not None else note[1] if note is not None else None, reason)
            note = leases.note_of(p)
        failures = self._failures
        failures[p] = (leases.deliveries_of(p), note[1] if note is not None else None)
        if len(failures) > FAILURES_KEPT:
            del failures[next(iter(failures))]
        leases.forget(p)
        self._replica.forget(p)
        events.append(Expired(p, reasons) if note is None or not note[0] else Expired(p, reasons, note[0]))
        self._count("expired")

    def failure_of(self, p: int) -> tuple[int, Hashable]:
        """(delivery count, last consumer key or None) of ``p``, which has just expired
        (rule 3); asked once, by the engine as it journals the expiry."""
        return self._failures.pop(p, (0, None))

    # --- rule 2 ------------------------------------------------------------------------------

    def delay(self, cancels: int, asked: float | None) -> float:
        """The delay of a cancel that brought the count to ``cancels``."""
        if asked is not None:
            return asked
        backoff = self._backoff
        return backoff[min(cancels, len(backoff)) - 1] if backoff else 0.0

    def __contains__(self, p: int) -> bool:
        return p in self._held

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, p: int, not_before: float, published_at: float, key: int) -> None:
        """Hold ``p`` until ``not_before`` (inf: until released, as an OrderingKey holds
        a key's later messages: never on the heap, which would keep it after its release)."""
        self._held[p] = (not_before, published_at, key)
        if not_before != math.inf:
            heappush(self._heap, (not_before, p))

    @property
    def replica(self) -> Replica:
        """The queue's replica part (the messages owned elsewhere), for the key lines."""
        return self._replica

    def hold_back(self, p: int, not_before: float) -> None:
        """Replay or restore (rule 2): available ``p`` is held until ``not_before``; or,
        a restore of ``p`` ELSEWHERE, its owner holds it (queue/transfers.py rule 5)."""
        if p in self._replica:
            self._replica.hold(p, not_before)
            return
        key = self._order.key_of(p)
        self.hold(p, not_before, self._order.take(key), key)

    def take(self, p: int) -> float:
        """Held ``p`` leaves (acknowledged, expired, transferred); its publish time."""
        return self._held.pop(p)[1]

    def take_key(self, p: int) -> tuple[float, int]:
        """Held ``p`` leaves: (publish time, order key)."""
        _, t, key = self._held.pop(p)
        return t, key

    def put_back(self, p: int) -> None:
        """Replay: held ``p`` was offered again before it was leased (no checks)."""
        _, t, key = self._held.pop(p)
        self._order.put_back(p, t, key)

    def time_of(self, p: int) -> float | None:
        entry = self._held.get(p)
        return None if entry is None else entry[1]

    def not_before(self, p: int) -> float | None:
        entry = self._held.get(p)
        return None if entry is None else entry[0]

    def first(self) -> int | None:
        """The lowest held position (O(held))."""
        return min(self._held) if self._held else None

    def items(self) -> Iterator[tuple[int, float]]:
        """(position, publish time) of each held message."""
        return ((p, entry[1]) for p, entry in self._held.items())

    def export(self) -> tuple[list[tuple[int, float]], list[tuple[int, float, int]]]:
        """For a snapshot: (position, not before), also of the messages ELSEWHERE that
        their owner holds (:meth:`hold_back` tells them apart again), and (position,
        publish time, key) of those held here, in position order."""
        rows = sorted(self._held.items())
        delays = [(p, e[0]) for p, e in rows]
        away = self._replica.holds()
        return sorted(delays + away) if away else delays, [(p, e[1], e[2]) for p, e in rows]

    def next_deadline(self) -> float | None:
        heap, held = self._heap, self._held
        while heap:
            t, p = heap[0]
            entry = held.get(p)
            if entry is not None and entry[0] == t:
                return t
            heappop(heap)  # stale: the message left, or was held again
        return None

    def wake(self, now: float, events: list[Event]) -> None:
        """Rule 2: each held message whose time has come goes back into the order in its
        place (or expires, or leaves for its new owner)."""
        heap, held = self._heap, self._held
        while heap and heap[0][0] <= now:
            t0, p = heappop(heap)
            entry = held.get(p)
            if entry is None or entry[0] != t0:
                continue
            del held[p]
            _, t, key = entry
            if self._expired_instead(p, t, now, _AVAILABLE, events) or self._leaves(p, t, key, now, _AVAILABLE):
                continue
            self._order.put_back(p, t, key)
            self._seats.came_back(key, self._order.store.__contains__, now)
