"""The delivery order of a priority queue: (priority, position) in compact sorted arrays.

Spec 000, "Priority Queues": delivery follows "a descending sort of the value calculated
for the Priority", read as an unsigned 64-bit integer; "Non-numeric values or NULL are
treated as NaN, and have the lowest priority"; among equal priorities the oldest message
first (Message Flow for Queues, step 3: "the oldest message at that priority"). The
engine evaluates the expression once, at enqueue (``conveyor.expr.Expression.priority``:
0 .. 2**64 - 1, or -1 for NaN), and the queue never evaluates it again.

Rules:

1. A message's **order key** is one Python int, ``rank << 63 | position``, where
   ``rank = 2**64 - 1 - priority`` for a numeric priority and ``2**64`` for NaN: keys
   ascend in delivery order, so the queue's dispatch loop, its filtered-consumer cursors
   and their candidate heaps compare plain ints, exactly as for a FIFO queue (whose key
   is the position). Positions are below 2**63 (journal positions).
2. :class:`PriorityIndex` holds the keys of the available messages in chunks of two
   ``array`` columns (rank ``'Q'``, position ``'q'``), sorted, 16 bytes a message and no
   Python object per message. A chunk is found by bisecting the first keys, a slot by
   two C bisects (rank, then position within the rank's run). The NaN messages (rank
   2**64 does not fit in 64 bits) are a second run after the numeric one.
3. Taking the head (the common delivery) is O(1): a start offset moves, the dead prefix
   is cut when it passes half the chunk. Inserting is O(log n) plus a copy of at most
   ``2 * CHUNK_SLOTS`` slots; a chunk past that is split.
4. Removal is exact for a delivery (the queue has the key) and lazy for everything else
   (an acknowledgement by bookmark, an expiry, a replayed removal: the queue knows only
   the position): the entry stays, counted as stale, and is dropped when it reaches the
   head or when stale entries outnumber the live ones (a rebuild). A stale entry is one
   whose position is no longer in the queue's store; such a position never comes back
   (acknowledged and expired are terminal), so ``live(position)`` tells them apart.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import Callable, Iterator, NamedTuple

#: Priorities are unsigned 64-bit; -1 is NaN (NULL, non-numeric), the lowest.
PRIORITY_MAX = (1 << 64) - 1
PRIORITY_NAN = -1
_RANK_NAN = 1 << 64
_SHIFT = 63
POSITION_MASK = (1 << _SHIFT) - 1
#: Above every order key (a cursor that has seen everything).
KEY_END = (_RANK_NAN + 1) << _SHIFT

#: Slots per chunk after a split; a chunk holds up to twice this many.
CHUNK_SLOTS = 1024
#: The dead prefix of a chunk (taken heads) is cut once it is this long and over half.
_CUT_MIN = 64
#: Stale entries are swept once they outnumber live ones by this much.
_STALE_SLACK = 1024


def rank_of(priority: int) -> int:
    """The rank of a priority value (lower rank is delivered first)."""
    if priority < 0:
        if priority != PRIORITY_NAN:
            raise ValueError(f"priority {priority} is not -1 (NaN) or an unsigned 64-bit value")
        return _RANK_NAN
    if priority > PRIORITY_MAX:
        raise ValueError(f"priority {priority} is above 2**64 - 1")
    return PRIORITY_MAX - priority


def priority_of_rank(rank: int) -> int:
    return PRIORITY_NAN if rank == _RANK_NAN else PRIORITY_MAX - rank


def order_key(priority: int, position: int) -> int:
    """The order key of a message (rule 1)."""
    if not 0 <= position <= POSITION_MASK:
        raise ValueError(f"position {position} is not in 0 .. 2**63 - 1")
    return (rank_of(priority) << _SHIFT) | position


def priority_of_key(key: int) -> int:
    return priority_of_rank(key >> _SHIFT)


class EpochImage(NamedTuple):
    """A :class:`PriorityIndex` as a snapshot keeps it: the numeric run's ranks
    (``'Q'``) and positions (``'q'``), the NaN run's positions, in order, stale entries
    included, and how many entries are stale."""

    ranks: bytes
    positions: bytes
    nan_positions: bytes
    stale: int


class _Chunk:
    __slots__ = ("ranks", "positions", "start")

    def __init__(self, ranks: array[int], positions: array[int]) -> None:
        self.ranks = ranks  # array('Q'): rank minus the run's base
        self.positions = positions  # array('q')
        self.start = 0  # slots before it are taken heads (dead)


class _Run:
    """Sorted (rank, position) pairs in chunks; ``base`` is added to every rank (the NaN
    run stores 0 and has base 2**64)."""

    __slots__ = ("_chunks", "_firsts", "_base", "n")

    def __init__(self, base: int) -> None:
        self._chunks: list[_Chunk] = []
        self._firsts: list[int] = []  # the first live key of each chunk, for bisect
        self._base = base
        self.n = 0  # entries, stale ones included

    def _key(self, ch: _Chunk, k: int) -> int:
        return ((ch.ranks[k] + self._base) << _SHIFT) | ch.positions[k]

    def _locate(self, rank: int, position: int, key: int) -> tuple[int, int]:
        """(chunk, slot) where (rank, position) is or would be inserted."""
        i = bisect_right(self._firsts, key) - 1
        if i < 0:
            return 0, self._chunks[0].start
        ch = self._chunks[i]
        ranks = ch.ranks
        lo = bisect_left(ranks, rank, ch.start)
        hi = bisect_right(ranks, rank, lo)
        return i, bisect_left(ch.positions, position, lo, hi)

    def add(self, rank: int, position: int) -> None:
        key = ((rank + self._base) << _SHIFT) | position
        self.n += 1
        chunks = self._chunks
        if not chunks:
            chunks.append(_Chunk(array("Q", (rank,)), array("q", (position,))))
            self._firsts.append(key)
            return
        i, j = self._locate(rank, position, key)
        ch = chunks[i]
        if j == ch.start and j > 0:
            j -= 1  # reuse a dead slot at the front
            ch.ranks[j] = rank
            ch.positions[j] = position
            ch.start = j
        else:
            ch.ranks.insert(j, rank)
            ch.positions.insert(j, position)
        if j == ch.start:
            self._firsts[i] = key
        if len(ch.ranks) - ch.start > 2 * CHUNK_SLOTS:
            self._split(i)

    def remove(self, rank: int, position: int) -> bool:
        """Remove the entry exactly; False if it is not there."""
        if not self._chunks:
            return False
        ch = self._chunks[0]
        s = ch.start
        if ch.positions[s] == position and ch.ranks[s] == rank:  # the head: the usual case
            self.n -= 1
            self._advance(0)
            return True
        key = ((rank + self._base) << _SHIFT) | position
        i, j = self._locate(rank, position, key)
        ch = self._chunks[i]
        if j >= len(ch.positions) or ch.positions[j] != position or ch.ranks[j] != rank:
            return False
        self.n -= 1
        if j == ch.start:
            self._advance(i)
        else:
            del ch.ranks[j]
            del ch.positions[j]
        return True

    def head(self) -> int | None:
        if not self._chunks:
            return None
        ch = self._chunks[0]
        s = ch.start  # self._key(ch, s), inlined: once per delivery
        return ((ch.ranks[s] + self._base) << _SHIFT) | ch.positions[s]

    def pop_head(self) -> None:
        self.n -= 1
        self._advance(0)

    def _advance(self, i: int) -> None:
        """The first live slot of chunk ``i`` is gone."""
        ch = self._chunks[i]
        s = ch.start + 1
        size = len(ch.ranks)
        if s == size:
            del self._chunks[i]
            del self._firsts[i]
            return
        if s >= _CUT_MIN and 2 * s > size:
            del ch.ranks[:s]
            del ch.positions[:s]
            s = 0
        ch.start = s
        self._firsts[i] = ((ch.ranks[s] + self._base) << _SHIFT) | ch.positions[s]  # _key, inlined

    def _split(self, i: int) -> None:
        ch = self._chunks[i]
        s = ch.start
        cut = s + CHUNK_SLOTS
        tail = _Chunk(ch.ranks[cut:], ch.positions[cut:])
        del ch.ranks[cut:]
        del ch.positions[cut:]
        if s:
            del ch.ranks[:s]
            del ch.positions[:s]
            ch.start = 0
        self._chunks.insert(i + 1, tail)
        self._firsts.insert(i + 1, self._key(tail, 0))

    def scan(self, key: int) -> Iterator[int]:
        """Keys >= ``key``, in order (stale ones included)."""
        chunks = self._chunks
        if not chunks:
            return
        rank = (key >> _SHIFT) - self._base
        if rank < 0:
            i, j = 0, chunks[0].start
        else:
            i, j = self._locate(rank, key & POSITION_MASK, key)
        base = self._base
        while i < len(chunks):
            ch = chunks[i]
            ranks, positions = ch.ranks, ch.positions
            for k in range(max(j, ch.start), len(ranks)):
                yield ((ranks[k] + base) << _SHIFT) | positions[k]
            i += 1
            j = 0

    def export(self) -> tuple[bytes, bytes]:
        """(ranks ``'Q'``, positions ``'q'``) of every entry, stale ones included, in
        order: C copies of the chunks, no Python object per entry (a snapshot)."""
        ranks, positions = array("Q"), array("q")
        for ch in self._chunks:
            ranks.extend(ch.ranks[ch.start:])
            positions.extend(ch.positions[ch.start:])
        return ranks.tobytes(), positions.tobytes()

    def load(self, ranks: array[int], positions: array[int]) -> None:
        """Replace the contents with what :meth:`export` gave (sorted, this run's)."""
        base = self._base
        self._chunks, self._firsts, self.n = [], [], len(positions)
        for a in range(0, len(positions), CHUNK_SLOTS):
            ch = _Chunk(ranks[a : a + CHUNK_SLOTS], positions[a : a + CHUNK_SLOTS])
            self._chunks.append(ch)
            self._firsts.append(((ch.ranks[0] + base) << _SHIFT) | ch.positions[0])

    def rebuild(self, keys: list[int]) -> None:
        """Replace the contents with ``keys`` (sorted, all in this run)."""
        self._chunks, self._firsts, self.n = [], [], len(keys)
        base = self._base
        for a in range(0, len(keys), CHUNK_SLOTS):
            part = keys[a : a + CHUNK_SLOTS]
            ch = _Chunk(
                array("Q", [(k >> _SHIFT) - base for k in part]),
                array("q", [k & POSITION_MASK for k in part]),
            )
            self._chunks.append(ch)
            self._firsts.append(part[0])


class PriorityIndex:
    """The available messages of a priority queue (or of one barrier epoch of it), by
    order key. ``live(position)``: whether the position is still in the queue's store
    (rule 4)."""

    __slots__ = ("_num", "_nan", "_live", "stale", "version")

    def __init__(self, live: Callable[[int], bool]) -> None:
        self._num = _Run(0)
        self._nan = _Run(_RANK_NAN)
        self._live = live
        self.stale = 0  # entries whose position left the store (lazy removals)
        self.version = 0  # bumped on every change, to catch mutation during iteration

    def __len__(self) -> int:
        return self._num.n + self._nan.n - self.stale

    def __bool__(self) -> bool:
        return len(self) > 0

    def add(self, key: int) -> None:
        self.version += 1
        rank, position = key >> _SHIFT, key & POSITION_MASK
        if rank == _RANK_NAN:
            self._nan.add(0, position)
        else:
            self._num.add(rank, position)

    def remove(self, key: int) -> None:
        """Exact removal of a live entry (a delivery)."""
        self.version += 1
        rank, position = key >> _SHIFT, key & POSITION_MASK
        found = (
            self._nan.remove(0, position) if rank == _RANK_NAN else self._num.remove(rank, position)
        )
        if not found:
            raise KeyError(key)

    def forget(self) -> None:
        """One entry's position has left the store (rule 4, lazy removal)."""
        self.version += 1
        self.stale += 1
        if self.stale > len(self) + _STALE_SLACK:
            self._sweep()

    def head(self) -> int | None:
        """The first live key (drops stale entries on the way)."""
        while True:
            run = self._num if self._num.n else self._nan
            key = run.head()
            if key is None or not self.stale or self._live(key & POSITION_MASK):
                return key
            run.pop_head()
            self.stale -= 1

    def pop_head(self, key: int) -> None:
        """Remove ``key``, which :meth:`head` just returned."""
        self.version += 1
        (self._num if self._num.n else self._nan).pop_head()

    def scan(self, key: int) -> Iterator[int]:
        """Live keys >= ``key``, in delivery order."""
        live = self._live
        for run in (self._num, self._nan):
            for k in run.scan(key):
                if not self.stale or live(k & POSITION_MASK):
                    yield k

    def __iter__(self) -> Iterator[int]:
        return self.scan(-1)

    def export(self) -> EpochImage:
        """The index as a snapshot keeps it: O(chunks) C copies (rule 2)."""
        num_ranks, num_positions = self._num.export()
        _, nan_positions = self._nan.export()
        return EpochImage(num_ranks, num_positions, nan_positions, self.stale)

    def load(self, image: EpochImage) -> None:
        """Replace the contents with an exported image. Its stale entries stay stale:
        their positions are not in the store the snapshot restores either (rule 4)."""
        ranks, positions, nan_positions = array("Q"), array("q"), array("q")
        ranks.frombytes(image.ranks)
        positions.frombytes(image.positions)
        nan_positions.frombytes(image.nan_positions)
        if len(ranks) != len(positions) or image.stale > len(positions) + len(nan_positions):
            raise ValueError("an inconsistent priority index image")
        self._num.load(ranks, positions)
        self._nan.load(array("Q", bytes(8 * len(nan_positions))), nan_positions)
        self.stale = image.stale
        self.version += 1

    def merge(self, other: PriorityIndex) -> None:
        """Take every entry of ``other`` (a barrier between the two went away)."""
        keys = sorted([*self.scan(-1), *other.scan(-1)])
        self.version += 1
        self.stale = 0
        self._rebuild(keys)

    def _sweep(self) -> None:
        self._rebuild(list(self.scan(-1)))
        self.stale = 0

    def _rebuild(self, keys: list[int]) -> None:
        split = bisect_left(keys, _RANK_NAN << _SHIFT)
        self._num.rebuild(keys[:split])
        self._nan.rebuild(keys[split:])
