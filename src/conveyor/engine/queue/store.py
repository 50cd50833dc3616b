"""The available messages of one queue, sorted by journal position, in compact arrays.

This is the queue's memory for the common case: a message that is in the queue and not
leased costs 16 bytes here (an ``int64`` position and a ``float64`` publish time) and no
Python object. Rules:

- Positions only grow: :meth:`append` takes a position above every position seen, so
  each chunk is sorted and the chunks are in order; a position is found by two binary
  searches (the chunk by its first position, then the slot), never by a dict.
- A removed message leaves a tombstone (its time becomes NaN). A chunk whose tombstones
  pass half its slots is compacted; an empty chunk is dropped. Removal is O(log n) plus
  O(1) amortized compaction.
- A message that comes back (an expired, cancelled or broken lease) is put back in its
  place by :meth:`restore`: the tombstone is revived, or the slot re-inserted (O(chunk)).
- ``head`` is the oldest available message and ``head_time`` its publish time. Publish
  times never decrease along positions (the queue clamps them), so the head is also the
  next message to reach its Expiration.
- A lookup of the head costs O(1), and the slot of the last position found is kept until
  the store changes (or, paged, a chunk is paged out): the queue asks whether a message
  is available just before it removes it, and that is one search, not two.

A FIFO queue delivers in this order. A priority queue keeps this store for bookmark
lookups, expiry, the view's membership test and the recovery point, and adds a delivery
index on top (:mod:`conveyor.engine.queue.priority`).

Paging (FileBackedMetadata, :mod:`conveyor.engine.queue.paging`) is a subclass: a chunk
may be *paged out* (``positions is None``; ``live`` slots on disk, no tombstones). The
few places that touch a chunk other than the head or the tail page it in through
:meth:`_page_in`; the hooks ``_added`` / ``_dropped`` / ``_adopted`` tell the subclass
about chunks that appear or go. The base store never pages, and those checks cost it
nothing measurable.

Snapshots (:mod:`conveyor.engine.queue.snapshot`) see the chunks only as
:class:`ChunkImage` values (:meth:`export_chunks`, :meth:`adopt`), never as the store's
own objects.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import Final, Iterator, NamedTuple, cast

#: Slots per chunk (the default of ``MessageStore(chunk_slots=)``). An insert moves at most
#: 2 x 4096 x 8 bytes; the chunk's own overhead (two array headers, one list slot) is under
#: 0.1 byte per message.
CHUNK_SLOTS = 4096
#: A chunk is compacted when more than this share of its slots are tombstones.
_COMPACT_RATIO = 0.5
#: Chunks smaller than this are not compacted (the copy would cost more than it frees);
#: half the chunk size when chunks are smaller (tests use tiny chunks to reach every path).
_COMPACT_MIN_SLOTS = 64

_NAN = float("nan")
_FEW: Final = 8  # take_head: fewer messages are copied one by one, more by slices


class _Chunk:
    __slots__ = ("positions", "times", "live", "start", "page")

    def __init__(self, positions: array[int] | None, times: array[float] | None) -> None:
        self.positions = positions  # array('q'), sorted; None while paged out
        self.times = times  # array('d'); NaN marks a tombstone
        self.live = len(positions) if positions is not None else 0
        self.start = 0  # index of the first live slot
        self.page: tuple[int, int, int] | None = None  # paging: where an up-to-date copy is on disk, if any

    def live_arrays(self) -> tuple[array[int], array[float]]:
        """The chunk's messages still in the queue (a removed one has a NaN time)."""
        positions, times = self.positions, self.times
        assert positions is not None and times is not None  # asked of resident chunks only
        if self.live != len(positions):
            keep = [k for k in range(self.start, len(positions)) if times[k] == times[k]]
            positions = array("q", [positions[k] for k in keep])
            times = array("d", [times[k] for k in keep])
        return positions, times


class ChunkImage(NamedTuple):
    """One chunk as a snapshot sees it: either resident (``positions`` and ``times`` of
    its live messages) or paged out (``page``: ``(offset, count, crc32)`` in the store's
    page file). ``first`` bounds the chunk from below (no position of an earlier chunk is
    at or above it)."""

    first: int
    positions: array[int] | None
    times: array[float] | None
    page: tuple[int, int, int] | None = None


_NO_HINT: tuple[int, int | None, int, int] = (-1, None, -1, -1)


class MessageStore:
    __slots__ = ("chunk_slots", "_compact_min_slots", "_chunks", "_firsts", "_live", "_version", "_hint")

    def __init__(self, *, chunk_slots: int | None = None) -> None:
        chunk_slots = CHUNK_SLOTS if chunk_slots is None else chunk_slots
        if chunk_slots < 2:
            raise ValueError(f"chunk_slots must be >= 2, not {chunk_slots}")
        self.chunk_slots = chunk_slots
        self._compact_min_slots = min(_COMPACT_MIN_SLOTS, chunk_slots // 2)
        self._chunks: list[_Chunk] = []
        self._firsts: list[int] = []  # _chunks[i].positions[0], for bisect
        self._live = 0
        self._version = 0  # bumped on every change, to catch mutation during iteration
        self._hint: tuple[int, int | None, int, int] = _NO_HINT  # (version, position, chunk, slot) of the last position found

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    @property
    def version(self) -> int:
        """Changes on every change of the store (to catch mutation during iteration)."""
        return self._version

    # --- reading ------------------------------------------------------------------------

    def head(self) -> int | None:
        """The oldest available position."""
        if not self._chunks:
            return None
        ch = self._chunks[0]
        assert ch.positions is not None  # the head chunk is always resident
        return ch.positions[ch.start]

    def head_time(self) -> float | None:
        if not self._chunks:
            return None
        ch = self._chunks[0]
        assert ch.times is not None  # the head chunk is always resident
        return ch.times[ch.start]

    @property
    def page_generation(self) -> int | None:
        """The generation of the page file the paged-out chunks are in (None: in memory)."""
        return None

    def _find(self, position: int) -> tuple[int, int]:
        """(chunk index, slot index) of a live ``position``, or (-1, -1)."""
        chunks = self._chunks
        if chunks:  # the head: what a FIFO queue delivers, expires and usually acknowledges
            ch = chunks[0]
            j = ch.start
            assert ch.positions is not None  # the head chunk is always resident
            if ch.positions[j] == position:
                return 0, j
        hint = self._hint
        if hint[1] == position and hint[0] == self._version:
            return hint[2], hint[3]
        # The slot after the last one found: the next of a run, as a grant, a removal or
        # a check of each message of a batch asks for them. Checked by its content (a
        # live position is in one slot only), so it holds whatever changed since.
        i, j = hint[2], hint[3] + 1
        if 0 <= i < len(chunks):
            ch = chunks[i]
            ps = ch.positions
            if ps is not None and j < len(ps) and ps[j] == position:
                t = cast("array[float]", ch.times)[j]
                if t == t:  # not NaN: live
                    self._hint = (self._version, position, i, j)
                    return i, j
        i = bisect_right(self._firsts, position) - 1
        if i < 0:
            return -1, -1
        ch = chunks[i]
        if ch.positions is None:
            ch = self._page_in(i)
        assert ch.positions is not None and ch.times is not None  # resident, or paged in just now
        j = bisect_left(ch.positions, position)
        if j < len(ch.positions) and ch.positions[j] == position:
            t = ch.times[j]
            if t == t:  # not NaN: live
                self._hint = (self._version, position, i, j)
                return i, j
        return -1, -1

    def __contains__(self, position: int) -> bool:
        return self._find(position)[0] >= 0

    def time_of(self, position: int) -> float | None:
        i, j = self._find(position)
        return None if i < 0 else cast("array[float]", self._chunks[i].times)[j]  # _find left it resident

    def scan(self, position: int) -> Iterator[int]:
        """Available positions >= ``position``, in order. Do not change the store while
        iterating (RuntimeError)."""
        version = self._version
        chunks = self._chunks
        i = bisect_right(self._firsts, position) - 1
        first = True
        if i < 0:
            i, first = 0, False
        while i < len(chunks):
            ch = chunks[i]
            if ch.positions is None:
                ch = self._page_in(i)
            positions, times = ch.positions, ch.times
            assert positions is not None and times is not None  # resident, or paged in just now
            j = max(bisect_left(positions, position), ch.start) if first else ch.start
            first = False
            for k in range(j, len(positions)):
                t = times[k]
                if t == t:
                    yield positions[k]
                    if self._version != version:
                        raise RuntimeError("queue changed during iteration")
            i += 1

    def items(self) -> Iterator[tuple[int, float]]:
        """(position, publish time) of every available message, in order."""
        version = self._version
        for i, ch in enumerate(self._chunks):
            if ch.positions is None:
                ch = self._page_in(i)
            positions, times = ch.positions, ch.times
            assert positions is not None and times is not None  # resident, or paged in just now
            for k in range(ch.start, len(positions)):
                t = times[k]
                if t == t:
                    yield positions[k], t
                    if self._version != version:
                        raise RuntimeError("queue changed during iteration")

    # --- changing -----------------------------------------------------------------------

    def append(self, position: int, t: float) -> None:
        """Add a message above every position the store holds: a new one, or one
        returned after the newest (:meth:`restore`)."""
        self._version += 1
        chunks = self._chunks
        if chunks:
            ch = chunks[-1]
            assert ch.positions is not None and ch.times is not None  # the tail chunk is always resident
            if len(ch.positions) < self.chunk_slots:
                ch.positions.append(position)
                ch.times.append(t)
                ch.live += 1
                self._live += 1
                return
        chunks.append(_Chunk(array("q", (position,)), array("d", (t,))))
        self._firsts.append(position)
        self._live += 1
        self._added(chunks[-1])

    def extend(self, positions: list[int], times: list[float]) -> None:
        """:meth:`append` of each of ``positions`` (ascending, above every position
        appended), filling the tail chunk and then new ones by slices."""
        self._version += 1
        chunks, size, at, n = self._chunks, self.chunk_slots, 0, len(positions)
        if chunks and n:
            ch = chunks[-1]
            assert ch.positions is not None and ch.times is not None  # the tail chunk is always resident
            at = min(n, max(0, size - len(ch.positions)))
            ch.positions.extend(positions[:at])
            ch.times.extend(times[:at])
            ch.live += at
        while at < n:
            end = min(n, at + size)
            chunks.append(_Chunk(array("q", positions[at:end]), array("d", times[at:end])))
            self._firsts.append(positions[at])
            self._added(chunks[-1])
            at = end
        self._live += n

    def discard(self, position: int) -> float | None:
        """Remove ``position``; its publish time, or None if it was not available."""
        i, j = self._find(position)
        if i < 0:
            return None
        self._version += 1
        ch = self._chunks[i]
        assert ch.positions is not None and ch.times is not None  # _find left it resident
        ch.page = None  # the copy on disk (if any) is stale
        t = ch.times[j]
        ch.times[j] = _NAN
        ch.live -= 1
        self._live -= 1
        if ch.live == 0:
            del self._chunks[i]
            del self._firsts[i]
            self._dropped(ch)
            return t
        if j == ch.start:
            times = ch.times
            k = j + 1
            while times[k] != times[k]:
                k += 1
            ch.start = k
        size = len(ch.positions)
        if size >= self._compact_min_slots and size - ch.live > size * _COMPACT_RATIO:
            self._compact(i)
        return t

    def take_head(self, n: int, upto: float) -> tuple[list[int], list[float]]:
        """Remove the ``n`` oldest available positions below ``upto`` (fewer when there
        are not as many); (their positions, their publish times), in order. A run of the
        head costs two slice copies per chunk, not a search per message: a named
        consumer's lease of a whole batch (queue/named.py)."""
        positions: list[int] = []
        times: list[float] = []
        chunks = self._chunks
        while n > 0 and chunks:
            ch = chunks[0]
            ps, ts = ch.positions, ch.times
            assert ps is not None and ts is not None  # the head chunk is always resident
            start, size = ch.start, len(ps)
            if ch.live == size - start:  # no tombstone after the head: the run is contiguous
                end = bisect_left(ps, upto, start, start + min(n, ch.live))
                taken = end - start
                if taken < _FEW:  # a dispatch of one or a few: no slice arrays made
                    for k in range(start, end):
                        positions.append(ps[k])
                        times.append(ts[k])
                        ts[k] = _NAN
                else:
                    positions += ps[start:end]
                    times += ts[start:end]
                    ts[start:end] = array("d", (_NAN,)) * taken
                ch.start = end
            else:
                taken, k = 0, start
                while k < size and taken < n and ps[k] < upto:
                    t = ts[k]
                    if t == t:
                        positions.append(ps[k])
                        times.append(t)
                        ts[k] = _NAN
                        taken += 1
                    k += 1
                while k < size and ts[k] != ts[k]:
                    k += 1
                ch.start = k
            if not taken:
                break  # the head is at or past ``upto``
            self._version += 1
            ch.page = None  # the copy on disk (if any) is stale
            ch.live -= taken
            self._live -= taken
            n -= taken
            if ch.live == 0:
                del chunks[0]
                del self._firsts[0]
                self._dropped(ch)  # paged: the next head is paged in
            elif size >= self._compact_min_slots and size - ch.live > size * _COMPACT_RATIO:
                self._compact(0)
            else:
                break  # the run stopped inside this chunk: at ``upto`` or after n
        return positions, times

    def restore(self, position: int, t: float) -> None:
        """Put a returned message back in its place."""
        chunks, firsts = self._chunks, self._firsts
        if chunks:
            tail = chunks[-1].positions
            assert tail is not None  # the tail chunk is always resident
            if tail and position > tail[-1]:
                # After every message here: a grant's run, oldest first, into a queue
                # that holds nothing newer (an instance whose messages are owned
                # elsewhere), goes in as appends do, without a search or a shift.
                self.append(position, t)
                return
        self._version += 1
        i = bisect_right(firsts, position) - 1
        if i < 0:
            # Before every chunk: the chunks that held it were dropped.
            if chunks and len(cast("array[int]", chunks[0].positions)) < self.chunk_slots:
                ch = chunks[0]  # the head: always in memory
                assert ch.positions is not None and ch.times is not None
                ch.page = None
                ch.positions.insert(0, position)
                ch.times.insert(0, t)
                ch.live += 1
                ch.start = 0
                firsts[0] = position
            else:
                chunks.insert(0, _Chunk(array("q", (position,)), array("d", (t,))))
                firsts.insert(0, position)
                self._added(chunks[0])
            self._live += 1
            return
        ch = chunks[i]
        if ch.positions is None:
            ch = self._page_in(i)
        assert ch.positions is not None and ch.times is not None  # resident, or paged in just now
        ch.page = None
        j = bisect_left(ch.positions, position)
        if j < len(ch.positions) and ch.positions[j] == position:
            old = ch.times[j]
            if old == old:
                raise ValueError(f"position {position} is already available")
            ch.times[j] = t  # revive the tombstone
        else:
            ch.positions.insert(j, position)
            ch.times.insert(j, t)
        ch.live += 1
        self._live += 1
        if j <= ch.start:
            ch.start = j
        if len(ch.positions) > 2 * self.chunk_slots:
            self._split(i)

    def _compact(self, i: int) -> None:
        ch = self._chunks[i]
        assert ch.positions is not None and ch.times is not None  # discard found it resident
        if ch.start == len(ch.positions) - ch.live:
            # Every tombstone is in the prefix (the usual case: the head was consumed).
            del ch.positions[: ch.start]
            del ch.times[: ch.start]
        else:
            keep = [k for k in range(ch.start, len(ch.positions)) if ch.times[k] == ch.times[k]]
            ch.positions = array("q", [ch.positions[k] for k in keep])
            ch.times = array("d", [ch.times[k] for k in keep])
        ch.start = 0
        self._firsts[i] = ch.positions[0]

    def _split(self, i: int) -> None:
        """Cut an over-full chunk in two; recount both halves, drop an empty one."""
        ch = self._chunks[i]
        assert ch.positions is not None and ch.times is not None  # restore made it resident
        cut = self.chunk_slots
        tail = _Chunk(ch.positions[cut:], ch.times[cut:])
        del ch.positions[cut:]
        del ch.times[cut:]
        halves = []
        for part in (ch, tail):
            assert part.times is not None  # both halves hold arrays
            live = [k for k, t in enumerate(part.times) if t == t]
            if live:
                part.live, part.start = len(live), live[0]
                halves.append(part)
        self._chunks[i : i + 1] = halves
        self._firsts[i : i + 1] = [cast("array[int]", part.positions)[0] for part in halves]
        if ch not in halves:
            self._dropped(ch)
        if tail in halves:
            self._added(tail)

    # --- snapshots (queue_snapshot) --------------------------------------------------------

    def export_chunks(self) -> list[ChunkImage]:
        """Every chunk, in order: paged-out ones by reference, the others by value."""
        out: list[ChunkImage] = []
        for first, ch in zip(self._firsts, self._chunks):
            if ch.positions is None:
                out.append(ChunkImage(first, None, None, ch.page))
            else:
                out.append(ChunkImage(first, *ch.live_arrays()))
        return out

    def adopt(self, images: list[ChunkImage]) -> None:
        """Take over the chunks of a snapshot (:meth:`export_chunks`), into an empty store."""
        if self._chunks:
            raise ValueError("a store adopts chunks only when it is empty")
        chunks, firsts, live = [], [], 0
        for image in images:
            if image.page is not None:
                ch = _Chunk(None, None)
                ch.live, ch.page = image.page[1], image.page
            else:
                ch = _Chunk(image.positions, image.times)
            if ch.live == 0:
                raise ValueError("an empty chunk")
            chunks.append(ch)
            firsts.append(image.first)
            live += ch.live
        self._chunks, self._firsts, self._live = chunks, firsts, live
        self._version += 1
        self._adopted()

    # --- paging hooks (queue_paging.PagedMessageStore) ------------------------------------

    def _page_in(self, i: int) -> _Chunk:
        raise AssertionError("the base store never pages out")

    def _added(self, ch: _Chunk) -> None:
        """A new chunk is in the list."""

    def _dropped(self, ch: _Chunk) -> None:
        """A chunk left the list (emptied)."""

    def _adopted(self) -> None:
        """The chunks were replaced by :meth:`adopt`."""
        if any(ch.positions is None for ch in self._chunks):
            raise ValueError("this store does not page: a snapshot with pages needs a paged store")
