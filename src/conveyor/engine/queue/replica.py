"""The replica state of a replicated queue's messages (docs/replication.md, "Replicated
queues"): one part of :class:`conveyor.engine.queue.Queue`, the only place it is kept.

The queue moves messages through the transition table (ELSEWHERE, TRANSFER_IN/OUT) and
tells this part what happened; every move out of the queue for good reaches
:meth:`Replica.left` through the transition table itself (``Transitions.on_leave``), live
and in a replay alike, so no caller keeps a second map in step and a restart needs no
repair pass. :class:`conveyor.engine.replication.ownership.QueueOwnership` decides (requests, grants,
transfers, tombstones) over what this part holds. Rules:

1. **Identity.** Each message in the queue here is known by ``(publisher, seq)``, the
   name replication uses on every instance, kept as one integer (:data:`Ident`); the
   :data:`LEFT_MAX` most recent leavers (up to twice as many: the oldest are dropped in
   batches) keep theirs (a named consumer's replicated lease may name a message
   acknowledged here first).
2. **Elsewhere.** A message another instance owns is recorded and in the view, never
   delivered: only its owner delivers it. It keeps its publish time, its order key (a
   priority queue needs it when the message comes back) and when it arrived here (the
   transfer heuristic asks for messages that have waited longer than acknowledgements
   usually take). Its owner may change while it stays here (a transfer between two
   other instances).
3. **Leased here, owned away.** A message leased here whose ownership moves away (two
   instances claimed it during a disaster recovery) keeps its lease; it goes away when
   the lease ends (:meth:`leaving`), never back to the available messages.
4. **Not asked yet.** Messages not yet asked for are kept apart, in the order they came
   (:meth:`unasked`): requests look only at those and at the requests due again
   (:meth:`requests_due`), instead of walking past every message in flight on every look.
5. **Epochs and requests** are per message too: the highest transfer seen for it
   (``(epoch, owner, granter)``; kept also for a message that has not arrived yet, so it
   enters owned by the winner) and this instance's unanswered request. Both go when the
   message leaves.
6. **Held by its owner.** A message ELSEWHERE that its owner cancelled with a delayed
   retry keeps that time here (queue/transfers.py rule 5) until it leaves ELSEWHERE;
   the owner's later cancel replaces it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Final, Iterable, Iterator

from conveyor.engine.queue.rows import Lease

#: A message's identity ``(publisher, seq)`` as one integer (:func:`ident_of`). Not a
#: tuple: a tuple key is hashed item by item at every dict lookup, compared item by item
#: on a match, and tracked by the garbage collector; a small integer is none of these.
Ident = int
Epoch = tuple[int, str, str]  # (epoch, owner, granter) of the transfer that won

# The usual identity is the publisher's number in this process (numbered in the order
# first seen) above the seq's 40 bits: below 2**62, so compiled code computes it without
# allocating. Any other pair (a seq below 0 or of 2**40 and more, past 2**22 publishers)
# gets a negative identity that holds both whole: -1 - (publisher, seq), each moved up by
# 2**64 (any MessagePack integer, -2**63 .. 2**64 - 1, is then positive) in 65 bits.
# Identities live in memory only: snapshots and records keep publisher and seq. The table
# of numbers keeps one entry per publisher seen, as the publish log keeps one per publisher.
_SEQ_BITS: Final = 40
_SEQ_LIMIT: Final = 1 << _SEQ_BITS
_INDEX_LIMIT: Final = 1 << 22
_WIDE_BITS: Final = 65
_WIDE_OFFSET: Final = 1 << 64
_WIDE_MASK: Final = (1 << _WIDE_BITS) - 1


class _Publishers:
    """The publishers' numbers (the identity's high bits), both ways."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        self.publishers: list[int] = []

    def number(self, publisher: int) -> int:
        index = self.index.get(publisher)
        if index is None:
            index = self.index[publisher] = len(self.publishers)
            self.publishers.append(publisher)
        return index


_PUBLISHERS: Final = _Publishers()


def ident_of(publisher: int, seq: int) -> Ident:
    """The identity of the message ``(publisher, seq)``."""
    index = _PUBLISHERS.number(publisher)
    if 0 <= seq < _SEQ_LIMIT and index < _INDEX_LIMIT:
        return (index << _SEQ_BITS) | seq
    return -1 - ((((publisher + _WIDE_OFFSET) << _WIDE_BITS)) | (seq + _WIDE_OFFSET))


def publisher_of(ident: Ident) -> int:
    if ident >= 0:
        return _PUBLISHERS.publishers[ident >> _SEQ_BITS]
    return ((-1 - ident) >> _WIDE_BITS) - _WIDE_OFFSET


def seq_of(ident: Ident) -> int:
    if ident >= 0:
        return ident & (_SEQ_LIMIT - 1)
    return ((-1 - ident) & _WIDE_MASK) - _WIDE_OFFSET


def idents_of(publishers: list[int], seqs: list[int]) -> list[Ident]:
    """A record's ``publishers`` and ``seqs`` columns as identities."""
    return [ident_of(p, s) for p, s in zip(publishers, seqs)]


def columns_of(idents: Iterable[Ident]) -> tuple[list[int], list[int]]:
    """Identities as a record's ``publishers`` and ``seqs`` columns."""
    publishers: list[int] = []
    seqs: list[int] = []
    for ident in idents:
        publishers.append(publisher_of(ident))
        seqs.append(seq_of(ident))
    return publishers, seqs


#: Messages that left the queue whose position is still found by identity (rule 1).
LEFT_MAX = 10_000


class Away:
    """A message another instance owns, as this one keeps it (rule 2). A class, not a
    NamedTuple: compiled code builds one without a call into the interpreter."""

    __slots__ = ("owner", "published_at", "key", "arrived")

    def __init__(self, owner: str, published_at: float, key: int, arrived: float) -> None:
        self.owner = owner  # changes in place: the entry is shared by _away and _unasked
        self.published_at = published_at
        self.key = key
        self.arrived = arrived


class Replica:
    __slots__ = ("_away", "_unasked", "_leaving", "_idents", "_positions", "_left", "_epochs", "_requested",
                 "_held")

    def __init__(self) -> None:
        self._away: dict[int, Away] = {}
        # Rule 4: the same entries, less those asked for. An OrderedDict, as entries leave
        # from the front: a dict's iterator would step over every slot they left behind.
        self._unasked: OrderedDict[int, Away] = OrderedDict()
        self._leaving: dict[int, str] = {}  # leased here, owned elsewhere now (rule 3)
        self._idents: dict[int, Ident] = {}  # rule 1
        self._positions: dict[Ident, int] = {}
        self._left: dict[Ident, int] = {}  # oldest first
        self._epochs: dict[Ident, Epoch] = {}  # rule 5
        # (when, attempt) of our last request, in the order asked (oldest leave first).
        self._requested: OrderedDict[Ident, tuple[float, int]] = OrderedDict()
        self._held: dict[int, float] = {}  # rule 6: position -> not before (ELSEWHERE only)

    def __contains__(self, position: int) -> bool:
        """Whether the message is ELSEWHERE (owned by another instance)."""
        return position in self._away

    def __len__(self) -> int:
        return len(self._away)

    def __bool__(self) -> bool:
        return bool(self._away)

    # --- rule 1 -------------------------------------------------------------------------------

    def entered(self, position: int, ident: Ident) -> None:
        self._idents[position] = ident
        self._positions[ident] = position

    def left(self, positions: list[int]) -> None:
        """These messages left the queue for good (called by the transition table, a
        batch at once)."""
        idents, where, left = self._idents, self._positions, self._left
        requested, epochs, held = self._requested, self._epochs, self._held
        for position in positions:
            ident = idents.pop(position, None)
            if ident is None:
                continue
            del where[ident]
            left[ident] = position
            # Each only when it holds anything: an owner's own messages have neither a
            # request nor an epoch.
            if requested:
                requested.pop(ident, None)
            if epochs:
                epochs.pop(ident, None)
            if held:
                held.pop(position, None)
        if len(left) > 2 * LEFT_MAX:  # rule 1: the oldest dropped in one pass, not one by one
            self._left = dict(itertools.islice(left.items(), len(left) - LEFT_MAX, None))

    @property
    def size(self) -> int:
        """Messages in the queue here whose identity this part keeps."""
        return len(self._idents)

    def position(self, ident: Ident) -> int | None:
        return self._positions.get(ident)

    def position_recorded(self, ident: Ident) -> int | None:
        """Where the message is in the journal here: in the queue, or among the recent
        leavers (None: unknown)."""
        position = self._positions.get(ident)
        return position if position is not None else self._left.get(ident)

    def ident(self, position: int) -> Ident | None:
        return self._idents.get(position)

    def identities(self) -> Iterator[tuple[Ident, int]]:
        return iter(self._positions.items())

    # --- rule 2 -------------------------------------------------------------------------------

    def add(self, position: int, owner: str, published_at: float, key: int, arrived: float) -> None:
        self._away[position] = self._unasked[position] = Away(owner, published_at, key, arrived)

    def take(self, position: int) -> Away:
        self._unasked.pop(position, None)
        self._held.pop(position, None)
        return self._away.pop(position)

    def get(self, position: int) -> Away | None:
        return self._away.get(position)

    def owner_of(self, position: int) -> str | None:
        """The instance that owns a message ELSEWHERE (None: this one, or not here)."""
        away = self._away.get(position)
        return away.owner if away is not None else None

    def arrival_of(self, position: int) -> float | None:
        """When a message ELSEWHERE arrived here (None: it is not ELSEWHERE)."""
        away = self._away.get(position)
        return away.arrived if away is not None else None

    def set_owner(self, position: int, owner: str) -> None:
        self._away[position].owner = owner  # the same entry as in _unasked

    def hold(self, position: int, not_before: float) -> None:
        """Rule 6: its owner holds ``position`` until ``not_before`` (0: no more)."""
        if not_before:
            self._held[position] = not_before
        else:
            self._held.pop(position, None)

    def holding(self) -> bool:
        """Whether rule 6 holds any message here."""
        return bool(self._held)

    def held_until(self, position: int) -> float:
        """Rule 6: until when its owner holds ``position`` (0: it does not)."""
        return self._held.get(position, 0.0)

    def holds(self) -> list[tuple[int, float]]:
        """Rule 6's times, (position, not before) in position order (for a snapshot)."""
        return sorted(self._held.items())

    def first(self) -> int | None:
        """The lowest position held here (O(n): barriers and recovery points only)."""
        return min(self._away) if self._away else None

    def items(self) -> Iterator[tuple[int, Away]]:
        """In position order."""
        for p in sorted(self._away):
            yield p, self._away[p]

    def in_arrival_order(self) -> Iterator[tuple[int, Away]]:
        """Roughly oldest first (the order they came here; no sort, no copy): for
        proxied claims, which stop early. The caller must not change this part while it
        iterates."""
        return iter(self._away.items())

    # --- rule 3 -------------------------------------------------------------------------------

    def owned_away_while_leased(self, position: int, owner: str) -> None:
        self._leaving[position] = owner

    def leaving(self, position: int) -> str | None:
        """The new owner of a message whose lease here just ended, if it moved away."""
        return self._leaving.pop(position, None)

    def export(self, positions: list[int], leases: list[Lease]
               ) -> tuple[list[tuple[int, str, float, int, float]], list[int], list[Lease]]:
        """What a snapshot keeps (queue/snapshot.py rule 5): the messages owned elsewhere,
        as rows ``(position, owner, published_at, key, arrived)`` in position order, and
        the leases (``positions`` ascending, ``leases`` theirs) less rule 3's messages. A
        lease ends with the restart, so one whose message was owned away while leased
        leaves for its new owner then: it is a row of the first list."""
        away = [(p, a.owner, a.published_at, a.key, a.arrived) for p, a in self.items()]
        leaving = self._leaving
        if leaving:
            away += [(p, leaving[p], lease.published_at, lease.key, lease.published_at)
                     for p, lease in zip(positions, leases) if p in leaving]
            away.sort()
            kept = [(p, lease) for p, lease in zip(positions, leases) if p not in leaving]
            positions, leases = [p for p, _ in kept], [lease for _, lease in kept]
        return away, positions, leases

    def forget(self, position: int) -> None:
        self._leaving.pop(position, None)

    def forget_all(self, positions: list[int]) -> None:
        leaving = self._leaving
        if leaving:
            for p in positions:
                leaving.pop(p, None)

    # --- rule 4 -------------------------------------------------------------------------------

    def unasked(self) -> Iterator[tuple[int, Away]]:
        """Those not asked for, in the order they came (the order of ``arrived`` while
        the clock runs forward). The caller must not change this part while it iterates:
        it marks what it asked for (:meth:`asked`) afterwards."""
        return iter(self._unasked.items())

    def asked(self, positions: Iterable[int]) -> None:
        """A request went out for these messages ELSEWHERE."""
        unasked = self._unasked
        for position in positions:
            unasked.pop(position, None)

    # --- rule 5 -------------------------------------------------------------------------------

    def epoch(self, ident: Ident) -> Epoch | None:
        return self._epochs.get(ident)

    def set_epoch(self, ident: Ident, epoch: Epoch) -> None:
        self._epochs[ident] = epoch

    def epochs(self) -> Iterator[tuple[Ident, Epoch]]:
        return iter(self._epochs.items())

    def requests_in_flight(self) -> int:
        return len(self._requested)

    def oldest_request(self) -> float | None:
        """When the oldest unanswered request went out (None: none)."""
        return next(iter(self._requested.values()))[0] if self._requested else None

    def requests_due(self, now: float, retry: float) -> tuple[list[tuple[Ident, int]], float | None]:
        """The unanswered requests ``retry`` old or older (identity, attempt), oldest
        first, and when the next one becomes due (None: none left)."""
        due: list[tuple[Ident, int]] = []
        for ident, (when, attempt) in self._requested.items():
            if now - when < retry:
                return due, when + retry
            due.append((ident, attempt))
        return due, None

    def requested(self, ident: Ident, now: float, attempt: int) -> None:
        """A request for the message went out now (the newest: last in order)."""
        requested = self._requested
        requested[ident] = (now, attempt)
        requested.move_to_end(ident)

    def answered(self, ident: Ident) -> float | None:
        """Nothing more to ask for it (it came here, or its owner changed); when its
        request went out (None: it was not asked for)."""
        if not self._requested:  # the owner granting its own messages asked for none
            return None
        asked = self._requested.pop(ident, None)
        return None if asked is None else asked[0]

    # --- snapshots ----------------------------------------------------------------------------

    def idents_by_position(self) -> tuple[Iterable[int], Iterable[Ident]]:
        return self._idents.keys(), self._idents.values()

    def leavers(self) -> tuple[Iterable[int], Iterable[Ident]]:
        return self._left.values(), self._left.keys()

    def restore_identities(self, positions: Iterable[int], idents: Iterable[Ident],
                           left_positions: Iterable[int], left_idents: Iterable[Ident]) -> None:
        for position, ident in zip(positions, idents):
            self.entered(position, ident)
        self._left.update(zip(left_idents, left_positions))
