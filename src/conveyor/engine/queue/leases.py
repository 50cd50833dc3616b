"""The lease table of a queue: who holds which delivered message, until when, and how
often each message was delivered and cancelled (spec 000, "Delivery Semantics",
"Handling Unprocessed Messages").

A part of :class:`conveyor.engine.queue.Queue`, which moves messages through the
transition table (:mod:`conveyor.engine.queue.state`) and tells this table what
happened; the table itself knows no message state. Rules:

1. It owns the leases (at-least-once: position -> :class:`Lease`), the heap of lease
   deadlines, the delivery and cancel counts, and the at-most-once deliveries awaiting
   their acknowledgement (``consumed``: position -> seat). Others read ``leased`` and
   ``consumed``; only this table changes them.
2. It is the only part that changes a seat's ``held`` set and its consumer's
   ``outstanding`` (the backlog): a lease or an at-most-once delivery adds one, its end
   or acknowledgement takes it away, exactly once. ``outstanding`` never goes below 0.
3. Deadlines: each lease (and each renewal) pushes ``(deadline, position)``; an entry
   whose lease has ended or moved is stale and skipped when it reaches the top. Stale
   entries are swept once they outnumber the live ones by ``HEAP_SLACK`` (plus
   ``HEAP_SLACK_MIN``), so the heap stays O(leases). Every live lease has its entry.
   A batch of leases with one deadline (a named consumer's lease of a batch, or the
   renewal of all it holds: :meth:`lease_all`, :meth:`renew_held`), of at least
   ``RUN_ENTRIES_MIN`` leases, is one entry of a second heap instead, a :class:`_Run`
   (its positions ascending, read from a cursor):
   one entry per batch rather than a tuple and a push per message, dropped whole once
   read. Both heaps are read together, in (deadline, position) order; a run's unread
   entries count as heap entries for the sweep.
4. Counts are kept only for messages still in the queue (available or leased): the queue
   calls :meth:`forget` when a message is done, so they cost nothing once it is.
5. :meth:`limit_reasons`: why a message coming back to the queue must expire instead
   (queue rule 2): ``time_limit`` (Expiration), ``max_cancels``, ``max_deliveries``, in
   the order of ``REASON_ORDER``.
6. Failure notes (queue/returns.py rule 3): for a message whose lease ended other than
   by an ack, the application's last failure reason and the last consumer; kept and
   forgotten with the counts (rule 4).
7. Stale acknowledgements (docs/queues.md, "Stale acknowledgements"): a delivery is
   (position, delivery count). An ack that names delivery ``n`` of a message that has
   been delivered again since (its count is above ``n``, whoever holds it now) is stale:
   :meth:`stale` sets it apart, before the queue looks at the ack (or touch). So is
   one that names a delivery of a message ``elsewhere`` (a replicated queue's message
   that another instance owns now: its lease here ended), whatever its count here. An
   ack that names no delivery (0), or the latest one here, goes on as before.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from itertools import repeat
from typing import Callable, Final, Hashable, Iterable, Iterator, Protocol, Sequence

from conveyor.engine.queue.events import REASON_ORDER, ExpiryReason
from conveyor.engine.queue.rows import Lease
from conveyor.engine.queue.seats import Seat  # at run time: the compiled build checks a Seat against it

#: Stale lease deadlines (acked before they fell due) are swept out of the heap once they
#: outnumber the live ones by this factor, so the heap stays O(leases).
HEAP_SLACK = 2
HEAP_SLACK_MIN = 64
#: Rule 3: a batch of leases of one deadline becomes a run from this many; fewer go into
#: the first heap one by one.
RUN_ENTRIES_MIN: Final = 8


class Positions(Protocol):
    """Rule 7's ``elsewhere``: the positions owned by another instance (a queue's replica part)."""

    def __contains__(self, position: int, /) -> bool: ...


class _Run:
    """Rule 3: leases of one deadline, one entry of the runs' heap, read from ``at``.
    Ordered by its next entry, (deadline, position): only the heap's top is ever read,
    so only its key moves, and it is sifted down again when it does."""

    __slots__ = ("deadline", "seq", "positions", "at")

    def __init__(self, deadline: float, seq: int, positions: list[int]) -> None:
        self.deadline = deadline
        self.seq = seq  # orders runs of one deadline
        self.positions = positions
        self.at = 0

    def __lt__(self, other: _Run) -> bool:
        return ((self.deadline, self.positions[self.at], self.seq)
                < (other.deadline, other.positions[other.at], other.seq))


class LeaseTable:
    """Leases, deadlines, delivery and cancel counts, at-most-once deliveries awaiting
    their ack (rules 1-5)."""

    __slots__ = (
        "leased", "consumed", "_deadlines", "_runs", "_in_runs", "_run_seq", "_deliveries", "_cancels",
        "_expiration", "_max_cancels", "_max_deliveries", "slots_freed", "_notes",
    )

    def __init__(
        self, *, expiration_s: float | None, max_cancels: int | None, max_deliveries: int | None
    ) -> None:
        self.leased: dict[int, Lease] = {}
        self.consumed: dict[int, Seat] = {}  # at-most-once deliveries awaiting the ack
        self._deadlines: list[tuple[float, int]] = []  # heap (rule 3; some entries stale)
        self._runs: list[_Run] = []  # heap (rule 3)
        self._in_runs = 0  # the runs' entries not read yet
        self._run_seq = 0
        self._deliveries: dict[int, int] = {}  # delivered at least once, still in the queue
        self._cancels: dict[int, int] = {}
        # rule 6: (the application's last failure reason, the last consumer's key)
        self._notes: dict[int, tuple[str, Hashable]] = {}
        self._expiration = expiration_s
        self._max_cancels = max_cancels
        self._max_deliveries = max_deliveries
        self.slots_freed = 0  # backlog slots given back so far (replicated queues ask for more on it)

    # --- leases ---------------------------------------------------------------------------

    def lease(
        self, p: int, seat: Seat, deadline: float, published_at: float, key: int, delivery: bool
    ) -> int:
        """Lease ``p`` to ``seat`` until ``deadline``: a new delivery (counted) or a
        re-offer (``delivery=False``). Its delivery count."""
        if __debug__:
            assert p not in self.leased and p not in self.consumed, f"{p} is leased or consumed already"
        self.leased[p] = Lease(seat, deadline, published_at, key)
        heappush(self._deadlines, (deadline, p))
        seat.held.add(p)
        _backlog(seat, 1)
        deliveries = self._deliveries
        if delivery:
            n = deliveries[p] = deliveries.get(p, 0) + 1
            return n
        return deliveries.get(p, 0)

    def lease_all(self, positions: list[int], seat: Seat, deadline: float, published_at: list[float],
                  keys: list[int]) -> list[int]:
        """:meth:`lease` of each of ``positions`` (new deliveries) to ``seat`` until
        ``deadline``, in one loop: their delivery counts."""
        # Not checked here that none is leased or consumed already (two set passes over a
        # batch of 200,000): the one caller takes them from the delivery order, which
        # holds available messages only (its take is what confirms AVAILABLE, state.py).
        deliveries = self._deliveries
        if len(positions) < RUN_ENTRIES_MIN:
            # A dispatch to a subscriber with a slot or two free: a plain loop (the
            # iterators of the batch path cost more than a message's own work).
            leased = self.leased
            counts: list[int] = []
            for i in range(len(positions)):
                p = positions[i]
                leased[p] = Lease(seat, deadline, published_at[i], keys[i])
                n = deliveries.get(p, 0) + 1
                deliveries[p] = n
                counts.append(n)
        else:  # map and update: the loops over a batch run in C
            self.leased.update(zip(positions, map(Lease, repeat(seat), repeat(deadline), published_at, keys)))
            if deliveries.keys().isdisjoint(positions):
                # First deliveries, the usual batch: every count is 1, set without a
                # lookup, an addition and a new int per message.
                counts = [1] * len(positions)
                deliveries.update(dict.fromkeys(positions, 1))
            else:
                counts = [deliveries.get(p, 0) + 1 for p in positions]
                deliveries.update(zip(positions, counts))
        self._push_run(deadline, positions)
        seat.held.update(positions)
        _backlog(seat, len(positions))
        return counts

    def end(self, p: int) -> Lease:
        """The lease of ``p`` is over (cancelled, expired, broken)."""
        lease = self.leased.pop(p)
        self._release(lease.seat, p)
        return lease

    def acknowledge(self, p: int) -> None:
        """The lease of ``p`` is over and ``p`` is done (:meth:`end` and :meth:`forget`,
        in one call: the hot path of an acknowledgement)."""
        self._release(self.leased.pop(p).seat, p)
        self._deliveries.pop(p, None)
        self._cancels.pop(p, None)
        if self._notes:
            self._notes.pop(p, None)

    def acknowledge_all(self, positions: list[int], seat: Seat) -> None:
        """:meth:`acknowledge` of each of ``positions``, every one leased to ``seat`` and
        named once (the caller has checked that: ``NamedLeases.acknowledge_held``,
        :meth:`acknowledge_many`; a position that is not leased raises KeyError)."""
        leased, held = self.leased, seat.held
        every = len(held) == len(positions)
        # Every one the seat holds (a named consumer's ack of its whole batch): walk the
        # held set instead, whose objects are the table's keys, found by identity; the
        # positions given are equal ints made anew, each compared by value.
        keys: set[int] | list[int] = held if every else positions
        if every and len(leased) == len(held):
            # The seat holds every lease of the table (a named consumer alone on its
            # queue): as each of ``held`` is leased (the caller's word), it is all of
            # ``leased``: emptied at once, not key by key.
            leased.clear()
        else:
            for p in keys:  # a loop, not map(): compiled, it is a C loop without a call per item
                del leased[p]
        for counts in (self._deliveries, self._cancels, self._notes):
            if not counts:
                continue
            if every and counts.keys() == held:  # only the batch's counts: a C pass, emptied whole
                counts.clear()
            else:  # a count of a message not leased (a re-offered one waiting) is kept
                for p in keys:
                    counts.pop(p, None)
        if every:
            held.clear()
        else:
            held.difference_update(positions)
        _backlog(seat, -len(positions))
        self.slots_freed += len(positions)

    def holders(self, positions: list[int], owner: Hashable | None) -> list[Seat] | None:
        """The seat holding each of ``positions`` when every one is leased and named
        once and, with ``owner`` (Leasing=strict), each seat's consumer is ``owner``'s;
        else None."""
        leased = self.leased
        if len(positions) == 1:  # a subscriber acking each message: no set, no comprehension
            lease = leased.get(positions[0])
            if lease is None:
                return None
            seats = [lease.seat]
        else:
            wanted = set(positions)
            if len(wanted) != len(positions) or not leased.keys() >= wanted:
                return None
            seats = [leased[p].seat for p in positions]
        if owner is not None and any(seat.consumer.owner != owner for seat in seats):
            return None
        return seats

    def acknowledge_many(self, positions: list[int], seats: list[Seat]) -> None:
        """:meth:`acknowledge_all` of ``positions`` seat by seat, each leased to
        ``seats[i]`` (read from :attr:`leased` by :meth:`holders`: ``Queue.acknowledge``'s
        one pass)."""
        if len(positions) == 1:
            self.acknowledge(positions[0])
            return
        held: dict[Seat, list[int]] = {}
        for p, seat in zip(positions, seats):
            mine = held.get(seat)
            if mine is None:
                held[seat] = [p]
            else:
                mine.append(p)
        for seat, mine in held.items():
            self.acknowledge_all(mine, seat)

    def renew(self, p: int, lease: Lease, deadline: float) -> None:
        if lease.deadline != deadline:
            lease.deadline = deadline
            heappush(self._deadlines, (deadline, p))

    def renew_held(self, seat: Seat, positions: Iterable[int] | None, deadline: float) -> int:
        """Move the deadline of each of ``positions`` (None: all) still leased to ``seat``;
        how many were. The moved ones become one run (rule 3)."""
        renewed = 0
        moved: list[int] = []
        leased = self.leased
        for p in list(seat.held) if positions is None else positions:
            lease = leased.get(p)
            if lease is not None and lease.seat is seat:
                if lease.deadline != deadline:
                    lease.deadline = deadline
                    moved.append(p)
                renewed += 1
        self._push_run(deadline, moved)
        self.trim()
        return renewed

    def touch(self, positions: Iterable[int], owner: Hashable, deadline: float) -> int:
        """A subscriber's touch: each of ``positions`` leased to a consumer of ``owner``
        (its connection) keeps its lease until ``deadline`` at least (a touch never
        shortens a lease); how many were leased to it."""
        held = 0
        leased = self.leased
        for p in positions:
            lease = leased.get(p)
            if lease is not None and lease.seat.consumer.owner == owner:
                if deadline > lease.deadline:
                    self.renew(p, lease, deadline)
                held += 1
        self.trim()
        return held

    def consume(self, p: int, seat: Seat) -> None:
        """An at-most-once delivery: gone from the queue, in the backlog until its ack."""
        if __debug__:
            assert p not in self.consumed, f"{p} is consumed already"
        self.consumed[p] = seat
        seat.held.add(p)
        _backlog(seat, 1)

    def release(self, p: int) -> Seat:
        """The ack of an at-most-once delivery (or its consumer left): the backlog slot
        is free again."""
        seat = self.consumed.pop(p)
        self._release(seat, p)
        return seat

    def _release(self, seat: Seat, p: int) -> None:
        if __debug__:
            assert p in seat.held, f"position {p} is not held by {seat.consumer.key!r}"
        seat.held.discard(p)
        _backlog(seat, -1)
        self.slots_freed += 1

    # --- deadlines --------------------------------------------------------------------------

    def _push_run(self, deadline: float, positions: list[int]) -> None:
        """Rule 3: ``positions``, all leased until ``deadline``, as one run; a few of
        them (a dispatch to a subscriber with a slot or two free) as entries of the
        first heap, whose tuples compare in C (a run compares through ``_Run.__lt__``,
        two tuples made per comparison)."""
        if len(positions) < RUN_ENTRIES_MIN:
            heap = self._deadlines
            for p in positions:
                heappush(heap, (deadline, p))
        else:
            self._run_seq += 1
            heappush(self._runs, _Run(deadline, self._run_seq, sorted(positions)))
            self._in_runs += len(positions)

    def _pop_due(self, now: float) -> tuple[float, int] | None:
        """Take the earliest (deadline, position) of either heap, stale or not, if it is
        at or before ``now``; None: nothing is."""
        heap, runs = self._deadlines, self._runs
        if runs:
            run = runs[0]
            head = (run.deadline, run.positions[run.at])
            if head[0] <= now and (not heap or head < heap[0]):
                run.at += 1
                self._in_runs -= 1
                if run.at == len(run.positions):
                    heappop(runs)
                else:
                    heapreplace(runs, run)  # its key moved
                return head
        return heappop(heap) if heap and heap[0][0] <= now else None

    def due(self, now: float) -> Iterator[tuple[int, Lease]]:
        """The leases whose deadline is at or before ``now``, in (deadline, position)
        order. The caller ends each one before asking for the next."""
        leased = self.leased
        while (entry := self._pop_due(now)) is not None:
            d, p = entry
            lease = leased.get(p)
            if lease is None or lease.deadline != d:
                continue  # stale: acknowledged or re-leased since
            yield p, lease

    def next_deadline(self) -> float | None:
        """The earliest live lease deadline: the earlier of the two heaps' heads, once
        their stale heads are gone (a run's in one loop: most of a batch is acked before
        it falls due)."""
        leased = self.leased
        runs = self._runs
        while runs:
            run = runs[0]
            d, positions, i = run.deadline, run.positions, run.at
            n = len(positions)
            while i < n and ((lease := leased.get(positions[i])) is None or lease.deadline != d):
                i += 1
            moved = i - run.at
            self._in_runs -= moved
            run.at = i
            if i == n:
                heappop(runs)
            elif moved:
                heapreplace(runs, run)  # its key moved: another run may come first now
            else:
                break
        heap = self._deadlines
        while heap:
            d, p = heap[0]
            lease = leased.get(p)
            if lease is not None and lease.deadline == d:
                break
            heappop(heap)  # stale: dropping it changes no state
        if not heap:
            return runs[0].deadline if runs else None
        return min(heap[0][0], runs[0].deadline) if runs else heap[0][0]

    def trim(self) -> None:
        """Rule 3: sweep the stale deadlines once they dominate."""
        heap, leased = self._deadlines, self.leased
        if len(heap) + self._in_runs > HEAP_SLACK * len(leased) + HEAP_SLACK_MIN:
            heap[:] = [(lease.deadline, p) for p, lease in leased.items()]
            heapify(heap)
            self._runs.clear()
            self._in_runs = 0

    @property
    def deadlines_size(self) -> int:
        """Entries in the deadline heaps not read yet, stale ones included (rule 3 bounds it)."""
        return len(self._deadlines) + self._in_runs

    # --- counts ---------------------------------------------------------------------------

    def deliveries_of(self, p: int) -> int:
        return self._deliveries.get(p, 0)

    def stale(self, positions: Sequence[int], deliveries: Sequence[int],
              elsewhere: Positions = frozenset()) -> tuple[list[int], list[int]]:
        """Rule 7: (the positions whose ack goes on, the stale ones), each in the order
        given; ``deliveries[i]`` is the delivery the ack of ``positions[i]`` names (0: none);
        ``elsewhere``: the messages another instance owns now."""
        counts = self._deliveries
        fresh: list[int] = []
        stale: list[int] = []
        for p, n in zip(positions, deliveries):
            (stale if n and (counts.get(p, 0) > n or p in elsewhere) else fresh).append(p)
        return fresh, stale

    def cancels_of(self, p: int) -> int:
        return self._cancels.get(p, 0)

    def cancel(self, p: int) -> int:
        """One more cancel of ``p``; the new count."""
        n = self._cancels[p] = self._cancels.get(p, 0) + 1
        return n

    def set_deliveries(self, p: int, count: int | None) -> None:
        """Replay: ``count`` from the journaled event, else one more."""
        self._deliveries[p] = count if count is not None else self._deliveries.get(p, 0) + 1

    def set_cancels(self, p: int, cancels: int | None) -> None:
        """Replay: ``cancels`` from the journaled event, else one more."""
        self._cancels[p] = cancels if cancels is not None else self._cancels.get(p, 0) + 1

    def forget(self, p: int) -> None:
        """``p`` is done (rule 4)."""
        self._deliveries.pop(p, None)
        self._cancels.pop(p, None)
        if self._notes:
            self._notes.pop(p, None)

    def note(self, p: int, consumer: Hashable, reason: str = "") -> None:
        """Rule 6: a lease of ``p`` ended (``consumer`` held it), with the application's
        failure ``reason`` ("" keeps the last one given)."""
        if not reason:
            old = self._notes.get(p)
            reason = old[0] if old is not None else ""
        self._notes[p] = (reason, consumer)

    def note_of(self, p: int) -> tuple[str, Hashable] | None:
        """(last failure reason, last consumer) of ``p``, if a lease of it ended."""
        return self._notes.get(p)

    def reasons(self) -> dict[int, str]:
        """The failure reasons given, by position (for a snapshot)."""
        return {p: note[0] for p, note in self._notes.items() if note[0]}

    def counted(self) -> list[int]:
        """Every position with a delivery or cancel count, ascending."""
        return sorted(self._deliveries.keys() | self._cancels.keys())

    def export(self) -> tuple[list[int], list[Lease]]:
        """For a snapshot: the leased positions ascending, and their leases."""
        positions = sorted(self.leased)
        return positions, list(map(self.leased.__getitem__, positions))

    def counts(self) -> tuple[dict[int, int], dict[int, int]]:
        """(deliveries, cancels): copies, for a snapshot."""
        return dict(self._deliveries), dict(self._cancels)

    def restore_counts(self, deliveries: dict[int, int], cancels: dict[int, int]) -> None:
        self._deliveries, self._cancels = dict(deliveries), dict(cancels)

    def expire_by_stamps(self) -> None:
        """The queue's Expiration now lives in its per-message expiries (queue_expiry
        rule 4): the queue checks it for a message whose lease ends, not this table."""
        self._expiration = None

    def limit_reasons(self, p: int, published_at: float, now: float) -> tuple[str, ...]:
        """Rule 5: why ``p``, coming back to the queue, must expire instead."""
        found = []
        if self._expiration is not None and now >= published_at + self._expiration:
            found.append(ExpiryReason.TIME_LIMIT)
        if self._max_cancels is not None and self._cancels.get(p, 0) >= self._max_cancels:
            found.append(ExpiryReason.MAX_CANCELS)
        if self._max_deliveries is not None and self._deliveries.get(p, 0) >= self._max_deliveries:
            found.append(ExpiryReason.MAX_DELIVERIES)
        return tuple(r for r in REASON_ORDER if r in found)

    # --- checks -----------------------------------------------------------------------------

    def check(self, tracked: Callable[[int], bool]) -> None:
        """Every rule above that is too costly to check on each call (AssertionError,
        with or without ``-O``). ``tracked(p)``: whether ``p`` is still in the queue
        (available or leased)."""
        live = set(self._deadlines)
        live.update((run.deadline, p) for run in self._runs for p in run.positions[run.at:])
        _require(self._in_runs == sum(len(run.positions) - run.at for run in self._runs), "runs miscounted")
        for p, lease in self.leased.items():
            _require((lease.deadline, p) in live, f"lease of {p} missing from the deadline heap")
            _require(p in lease.seat.held, f"lease of {p} not held by its seat")
            _require(p not in self.consumed, f"{p} is both leased and consumed")
        for p, seat in self.consumed.items():
            _require(p in seat.held, f"consumed {p} not held by its seat")
        for p in self._deliveries.keys() | self._cancels.keys() | self._notes.keys():
            _require(tracked(p), f"counts kept for {p}, which is no longer in the queue")


def _backlog(seat: Seat, n: int) -> None:
    """Rule 2: the one place a consumer's ``outstanding`` changes (by ``n``)."""
    c = seat.consumer
    c.outstanding += n
    if __debug__:
        assert c.outstanding >= 0, f"consumer {c.key!r}: outstanding below 0"


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)
