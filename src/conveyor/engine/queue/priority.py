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
   A sweep, like the merge of two epochs, reads the index in order and builds the new
   one chunk by chunk.
5. **Paging** (FileBackedMetadata, :mod:`conveyor.engine.queue.paging`): given the
   queue's page space, the chunks are paged out and in under the server-wide budget
   like the store's (budget.py), 16 bytes a message on a page. The first chunk of each
   run (the head) is always resident; any other is paged in when an insert, an exact
   removal or a scan reaches it. A snapshot names a paged-out chunk by its page
   (:class:`EpochImage` segments), so neither a snapshot nor a restart holds the whole
   index in memory.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

if TYPE_CHECKING:
    from conveyor.engine.queue.paging import PageSpace

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


#: A chunk of a paged index as a snapshot names it: ``(rank, position, offset, count,
#: crc)``, the chunk's first entry (rank minus the run's base) and its page; an inline
#: chunk has offset -1 and takes the next ``count`` entries of the image's columns.
Segment = tuple[int, int, int, int, int]


class EpochImage(NamedTuple):
    """A :class:`PriorityIndex` as a snapshot keeps it: the numeric run's ranks
    (``'Q'``) and positions (``'q'``), the NaN run's positions, in order, stale entries
    included, and how many entries are stale. A paged index (rule 5) whose chunks are
    not all resident adds each run's chunks as :data:`Segment` values: the columns then
    hold only the resident chunks' entries."""

    ranks: bytes
    positions: bytes
    nan_positions: bytes
    stale: int
    num_pages: tuple[Segment, ...] = ()
    nan_pages: tuple[Segment, ...] = ()


#: The columns of a paged-out chunk (shared, never written: rule 5 pages a chunk in
#: before anything changes it). A resident chunk is never empty.
_PAGED_RANKS: array[int] = array("Q")
_PAGED_POSITIONS: array[int] = array("q")


class _Chunk:
    __slots__ = ("ranks", "positions", "start", "page")

    def __init__(self, ranks: array[int], positions: array[int]) -> None:
        self.ranks = ranks  # array('Q'): rank minus the run's base; empty while paged out
        self.positions = positions  # array('q')
        self.start = 0  # slots before it are taken heads (dead)
        self.page: tuple[int, int, int] | None = None  # paging: an up-to-date copy on disk, if any


class _Run:
    """Sorted (rank, position) pairs in chunks; ``base`` is added to every rank (the NaN
    run stores 0 and has base 2**64). With a ``space`` (FileBackedMetadata, rule 5) the
    chunks are paged under its budget; the first chunk is always resident."""

    __slots__ = ("_chunks", "_firsts", "_base", "n", "_space")

    def __init__(self, base: int, space: PageSpace | None = None) -> None:
        self._chunks: list[_Chunk] = []
        self._firsts: list[int] = []  # the first live key of each chunk, for bisect
        self._base = base
        self.n = 0  # entries, stale ones included
        self._space = space

    def _key(self, ch: _Chunk, k: int) -> int:
        return ((ch.ranks[k] + self._base) << _SHIFT) | ch.positions[k]

    # --- paging (rule 5) ---------------------------------------------------------------

    def _resident(self, ch: _Chunk, *, touch: bool = True) -> _Chunk:
        """``ch`` in memory (paged in if it was out), the most recently used."""
        space = self._space
        if space is None:
            return ch
        if not ch.ranks:
            assert ch.page is not None  # a paged-out chunk is on a page
            ch.ranks, ch.positions = space.read(ch.page, "Qq")
            ch.start = 0
            space.budget.admit(self, ch, 16 * len(ch.ranks), paged_in=True)
        elif touch:
            space.budget.touch(ch, 16 * len(ch.ranks))
        return ch

    def _admit(self, ch: _Chunk) -> None:
        if self._space is not None:
            self._space.budget.admit(self, ch, 16 * len(ch.ranks))

    def release(self, chunk: object) -> bool:
        """Page ``chunk`` out, asked by the budget; never the first chunk."""
        chunks, space = self._chunks, self._space
        if not chunks or chunk is chunks[0] or space is None:
            return False
        assert isinstance(chunk, _Chunk) and chunk.ranks  # the budget holds resident chunks
        if chunk.page is None:
            s = chunk.start
            chunk.page = space.write(chunk.ranks[s:], chunk.positions[s:])
            chunk.ranks, chunk.positions, chunk.start = _PAGED_RANKS, _PAGED_POSITIONS, 0
            space.maybe_compact()
        chunk.ranks, chunk.positions, chunk.start = _PAGED_RANKS, _PAGED_POSITIONS, 0
        return True

    def drop(self) -> None:
        """This run is gone (rebuilt, merged, emptied): its chunks leave the budget."""
        if self._space is not None:
            forget = self._space.budget.forget
            for ch in self._chunks:
                forget(ch)

    def chunks(self) -> list[_Chunk]:
        return self._chunks

    @property
    def paged_chunks(self) -> int:
        return sum(1 for ch in self._chunks if not ch.ranks)

    # --- reading and changing ----------------------------------------------------------

    def _locate(self, rank: int, position: int, key: int) -> tuple[int, int]:
        """(chunk, slot) where (rank, position) is or would be inserted; that chunk is
        resident."""
        i = bisect_right(self._firsts, key) - 1
        if i < 0:
            return 0, self._chunks[0].start
        ch = self._resident(self._chunks[i])
        ranks = ch.ranks
        lo = bisect_left(ranks, rank, ch.start)
        hi = bisect_right(ranks, rank, lo)
        return i, bisect_left(ch.positions, position, lo, hi)

    def add(self, rank: int, position: int) -> None:
        key = ((rank + self._base) << _SHIFT) | position
        self.n += 1
        chunks = self._chunks
        if not chunks:
            ch = _Chunk(array("Q", (rank,)), array("q", (position,)))
            chunks.append(ch)
            self._firsts.append(key)
            self._admit(ch)
            return
        i, j = self._locate(rank, position, key)
        ch = chunks[i]
        ch.page = None
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
            ch.page = None
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
        """The first live slot of chunk ``i`` (resident) is gone."""
        ch = self._chunks[i]
        ch.page = None
        s = ch.start + 1
        size = len(ch.ranks)
        if s == size:
            del self._chunks[i]
            del self._firsts[i]
            if self._space is not None:
                self._space.budget.forget(ch)
                if i == 0 and self._chunks:
                    self._resident(self._chunks[0])  # the first chunk is always resident
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
        self._admit(tail)

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
            if not ch.ranks:
                ch = self._resident(ch)
            ranks, positions = ch.ranks, ch.positions
            for k in range(max(j, ch.start), len(ranks)):
                yield ((ranks[k] + base) << _SHIFT) | positions[k]
            i += 1
            j = 0

    # --- snapshots and rebuilds --------------------------------------------------------

    def export(self) -> tuple[bytes, bytes, tuple[Segment, ...]]:
        """(ranks ``'Q'``, positions ``'q'``, segments) of every entry, stale ones
        included, in order: C copies of the resident chunks, no Python object per entry
        (a snapshot). Segments only when a chunk is paged out; those are named by
        their page."""
        ranks, positions = array("Q"), array("q")
        segments: list[Segment] = []
        base = self._base
        for first, ch in zip(self._firsts, self._chunks):
            if not ch.ranks:
                assert ch.page is not None  # a paged-out chunk is on a page
                segments.append(((first >> _SHIFT) - base, first & POSITION_MASK, *ch.page))
            else:
                ranks.extend(ch.ranks[ch.start:])
                positions.extend(ch.positions[ch.start:])
                segments.append((0, 0, -1, len(ch.ranks) - ch.start, 0))
        if all(seg[2] < 0 for seg in segments):
            segments = []  # every chunk inline: the columns say it all
        return ranks.tobytes(), positions.tobytes(), tuple(segments)

    def load(self, ranks: array[int], positions: array[int], segments: tuple[Segment, ...] = ()) -> None:
        """Replace the contents with what :meth:`export` gave (sorted, this run's);
        ValueError if the segments do not match the columns."""
        self.drop()
        base = self._base
        self._chunks, self._firsts, self.n = [], [], 0
        if not segments:
            segments = tuple((0, 0, -1, min(CHUNK_SLOTS, len(positions) - a), 0)
                             for a in range(0, len(positions), CHUNK_SLOTS))
        a = 0
        for rank, position, offset, count, crc in segments:
            if count <= 0 or (offset < 0 and a + count > len(positions)):
                raise ValueError("a priority index segment does not match its columns")
            if offset < 0:
                ch = _Chunk(ranks[a : a + count], positions[a : a + count])
                first = ((ch.ranks[0] + base) << _SHIFT) | ch.positions[0]
                a += count
            else:
                if self._space is None:
                    raise ValueError("a paged priority index image needs a paged queue")
                ch = _Chunk(_PAGED_RANKS, _PAGED_POSITIONS)
                ch.page = (offset, count, crc)
                first = ((rank + base) << _SHIFT) | position
            self._chunks.append(ch)
            self._firsts.append(first)
            self.n += count
            if ch.ranks:
                self._admit(ch)
        if a != len(positions):
            raise ValueError("a priority index segment does not match its columns")
        if self._chunks:
            self._resident(self._chunks[0])

    def append_keys(self, keys: list[int]) -> None:
        """Add a chunk of ``keys`` (sorted, this run's, after every key here)."""
        base = self._base
        ch = _Chunk(
            array("Q", [(k >> _SHIFT) - base for k in keys]),
            array("q", [k & POSITION_MASK for k in keys]),
        )
        self._chunks.append(ch)
        self._firsts.append(keys[0])
        self.n += len(keys)
        self._admit(ch)


class PriorityIndex:
    """The available messages of a priority queue (or of one barrier epoch of it), by
    order key. ``live(position)``: whether the position is still in the queue's store
    (rule 4). ``space``: page the chunks there (FileBackedMetadata, rule 5)."""

    __slots__ = ("_num", "_nan", "_live", "_space", "stale", "version")

    def __init__(self, live: Callable[[int], bool], space: PageSpace | None = None) -> None:
        self._num = _Run(0, space)
        self._nan = _Run(_RANK_NAN, space)
        self._live = live
        self._space = space
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

    # --- paging (rule 5) -----------------------------------------------------------------

    def chunks(self) -> Iterator[_Chunk]:
        """Every chunk (the page space moves their pages when it compacts)."""
        yield from self._num.chunks()
        yield from self._nan.chunks()

    @property
    def paged_chunks(self) -> int:
        return self._num.paged_chunks + self._nan.paged_chunks

    def close(self) -> None:
        """This index is gone (its epoch joined another): its chunks leave the budget."""
        self._num.drop()
        self._nan.drop()

    # --- snapshots and rebuilds --------------------------------------------------------

    def export(self) -> EpochImage:
        """The index as a snapshot keeps it: O(chunks) C copies (rule 2); a paged-out
        chunk by its page (rule 5)."""
        num_ranks, num_positions, num_pages = self._num.export()
        _, nan_positions, nan_pages = self._nan.export()
        return EpochImage(num_ranks, num_positions, nan_positions, self.stale, num_pages, nan_pages)

    def load(self, image: EpochImage) -> None:
        """Replace the contents with an exported image. Its stale entries stay stale:
        their positions are not in the store the snapshot restores either (rule 4)."""
        ranks, positions, nan_positions = array("Q"), array("q"), array("q")
        ranks.frombytes(image.ranks)
        positions.frombytes(image.positions)
        nan_positions.frombytes(image.nan_positions)
        total = len(positions) + len(nan_positions)
        total += sum(seg[3] for seg in (*image.num_pages, *image.nan_pages) if seg[2] >= 0)
        if len(ranks) != len(positions) or not 0 <= image.stale <= total:
            raise ValueError("an inconsistent priority index image")
        self._num.load(ranks, positions, tuple(image.num_pages))
        self._nan.load(array("Q", bytes(8 * len(nan_positions))), nan_positions, tuple(image.nan_pages))
        self.stale = image.stale
        self.version += 1

    def merge(self, other: PriorityIndex) -> None:
        """Take every entry of ``other`` (a barrier between the two went away), and
        close it. Both are read in order and rebuilt chunk by chunk: a paged index is
        never all in memory (rule 5)."""
        self.version += 1
        self._rebuild(heapq.merge(self.scan(-1), other.scan(-1)))
        self.stale = 0
        other.close()

    def _sweep(self) -> None:
        self._rebuild(self.scan(-1))
        self.stale = 0

    def _rebuild(self, keys: Iterable[int]) -> None:
        """Replace the contents with ``keys`` (sorted, live), which may be read from this
        index: the new runs are built beside the old ones, then swapped in."""
        num, nan = _Run(0, self._space), _Run(_RANK_NAN, self._space)
        split = _RANK_NAN << _SHIFT
        run, part = num, list[int]()
        for k in keys:
            if k >= split and run is num:
                if part:
                    num.append_keys(part)
                run, part = nan, []
            part.append(k)
            if len(part) == CHUNK_SLOTS:
                run.append_keys(part)
                part = []
        if part:
            run.append_keys(part)
        self._num.drop()
        self._nan.drop()
        self._num, self._nan = num, nan
