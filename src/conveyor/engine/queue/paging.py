"""FileBackedMetadata: a queue's state paged out to a file (spec 000, reference.md A.2
``FileBackedMetadata``: "queue state can be paged out to a file"), only as necessary.

:class:`PagedMessageStore` is the :class:`~conveyor.engine.queue.store.MessageStore`
whose chunks can be paged out to the queue's :class:`PageSpace`; a priority queue's
delivery index pages its chunks to the same space (:mod:`conveyor.engine.queue.priority`).
Rules:

1. **What stays in memory.** Every chunk, while the server-wide budget
   (:class:`~conveyor.engine.queue.budget.PagingBudget`, ``<Limits>
   <QueueMetadataMemory>``) holds it: nothing is paged out under the budget. Past it,
   the least recently used chunks of every FileBackedMetadata queue are paged out
   (budget.py rule 3). The head chunk (dispatch and expiry read it) and the tail chunk
   (enqueue appends to it) of a store are never paged out; a paged-out chunk is paged in
   when something touches it (an ack by bookmark, a filtered cursor, a view, a returned
   message). What stays per paged chunk is a descriptor (about 0.06 B per message).
2. **Pages are immutable.** A page is written once, at the end of the file, holding
   only the chunk's live slots (two 8-byte columns: 16 B a message) and known by
   ``(offset, count, crc32)``. A chunk changed while resident gets a new page when it
   is paged out again; a clean one is simply dropped. So a snapshot that names pages
   (:mod:`conveyor.engine.queue.snapshot`) stays valid while the file grows.
3. **Space comes back by generations.** Pages of consumed chunks are garbage. Once the
   garbage passes both ``COMPACT_MIN_BYTES`` and the live pages, the live pages (of the
   store and of the priority index alike) are copied to a new file,
   ``<queue>.<generation + 1>.fbm``. Old generations are deleted only once a snapshot
   naming a newer one is durable (``PageFiles.prune``), or at startup (every
   generation but the one the loaded snapshot names).
4. A page that does not read back with its crc raises :class:`PageCorrupt`: the state
   cannot be trusted (a snapshot whose pages do not check is ignored at startup).

No clock and no journal here; only this file, read and written on the engine's thread.
The file itself (open, pread, pwrite, fsync, delete) is the shell's
(:mod:`conveyor.server.page_files`); the fsync happens before a snapshot naming the pages
is written (the checkpoint writer).
"""

from __future__ import annotations

import zlib
from array import array
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from conveyor.engine.queue.budget import PagingBudget as PagingBudget  # re-exported: Queue.page_to's budget
from conveyor.engine.queue.store import _NO_HINT, MessageStore, _Chunk

if TYPE_CHECKING:
    from pathlib import Path

#: The file is compacted only past this much garbage (and past the live pages).
COMPACT_MIN_BYTES = 64 * 1024 * 1024


class PageCorrupt(Exception):
    pass


class PageFile(Protocol):
    """One generation of a queue's page file, provided by the shell
    (:mod:`conveyor.server.page_files`): the engine does no I/O itself."""

    generation: int
    size: int
    name: str
    path: Path

    def append(self, data: bytes) -> int: ...
    def read(self, offset: int, n: int) -> bytes: ...
    def next_generation(self) -> "PageFile": ...
    def close(self) -> None: ...


def encode_page(first: array[int] | array[float], second: array[int] | array[float]) -> tuple[bytes, int]:
    """A page of two 8-byte columns (a store: positions, times; an index: ranks, positions)."""
    data = first.tobytes() + second.tobytes()
    return data, zlib.crc32(data)


def check_page(data: bytes | memoryview, count: int, crc: int, where: str) -> None:
    if len(data) != 16 * count or zlib.crc32(data) != crc:
        raise PageCorrupt(f"page {where} does not match its checksum")


def decode_columns(data: bytes | memoryview, count: int, crc: int, where: str,
                   codes: str) -> tuple[array[Any], array[Any]]:
    """The two columns of a checked page, of the two type codes ``codes``."""
    check_page(data, count, crc, where)
    view = memoryview(data)  # no copies of the halves: a deep queue's restart reads many pages
    first = array(codes[0])
    first.frombytes(view[: 8 * count])
    second = array(codes[1])
    second.frombytes(view[8 * count :])
    return first, second


def decode_page(data: bytes | memoryview, count: int, crc: int, where: str) -> tuple[array[int], array[float]]:
    """A store's page: positions ``'q'``, publish times ``'d'``."""
    return decode_columns(data, count, crc, where, "qd")


class PageSpace:
    """One queue's page file and the budget its chunks are resident under. The queue's
    store and (priority queue) its delivery index page to it; each registers how to
    find its chunks (:meth:`hold`) so that compaction (rule 3) moves every live page."""

    __slots__ = ("file", "budget", "_holders")

    def __init__(self, file: PageFile, budget: PagingBudget | None = None) -> None:
        self.file = file
        self.budget = budget if budget is not None else PagingBudget()
        self._holders: list[Callable[[], Iterable[Any]]] = []  # each: chunks with a ``page``

    def hold(self, chunks: Callable[[], Iterable[Any]]) -> None:
        self._holders.append(chunks)

    def write(self, first: array[int] | array[float], second: array[int] | array[float]) -> tuple[int, int, int]:
        """Append a page (rule 2); the caller stores it, then calls :meth:`maybe_compact`."""
        data, crc = encode_page(first, second)
        return self.file.append(data), len(first), crc

    def read(self, page: tuple[int, int, int], codes: str) -> tuple[array[Any], array[Any]]:
        offset, count, crc = page
        data = self.file.read(offset, 16 * count)
        return decode_columns(data, count, crc, f"{self.file.name}@{offset}", codes)

    def _pages(self) -> Iterable[Any]:
        for chunks in self._holders:
            for ch in chunks():
                if ch.page is not None:
                    yield ch

    def live_bytes(self) -> int:
        return sum(16 * ch.page[1] for ch in self._pages())

    def maybe_compact(self) -> None:
        """Rule 3: copy the live pages to the next generation once garbage dominates."""
        size = self.file.size
        if size < COMPACT_MIN_BYTES:
            return
        live = self.live_bytes()
        if size - live < max(COMPACT_MIN_BYTES, live):
            return
        old = self.file
        new = old.next_generation()
        for ch in list(self._pages()):
            offset, count, crc = ch.page
            ch.page = (new.append(old.read(offset, 16 * count)), count, crc)
        old.close()  # deleted once a snapshot names the new generation (rule 3)
        self.file = new


class PagedMessageStore(MessageStore):
    """The message store with chunks paged out to a :class:`PageSpace` (rules 1-3)."""

    __slots__ = ("space",)

    def __init__(self, space: PageSpace, *, chunk_slots: int | None = None) -> None:
        super().__init__(chunk_slots=chunk_slots)
        self.space = space
        space.hold(lambda: self._chunks)

    # --- statistics ------------------------------------------------------------------

    @property
    def file(self) -> PageFile:
        return self.space.file

    @property
    def page_generation(self) -> int | None:
        return self.space.file.generation

    @property
    def resident_chunks(self) -> int:
        return sum(1 for ch in self._chunks if ch.positions is not None)

    @property
    def resident_bytes(self) -> int:
        return sum(16 * len(ch.positions) for ch in self._chunks if ch.positions is not None)

    @property
    def paged_chunks(self) -> int:
        return sum(1 for ch in self._chunks if ch.positions is None)

    def live_page_bytes(self) -> int:
        return self.space.live_bytes()

    # --- hooks of MessageStore ---------------------------------------------------------

    def _find(self, position: int) -> tuple[int, int]:
        i, j = MessageStore._find(self, position)
        if i > 0:  # used: the most recent for the budget (the head is always resident)
            ch = self._chunks[i]
            assert ch.positions is not None  # found: resident
            self.space.budget.touch(ch, 16 * len(ch.positions))
        return i, j

    def _added(self, ch: _Chunk) -> None:
        chunks = self._chunks
        budget = self.space.budget
        if len(chunks) > 1 and ch is chunks[-1]:
            sealed = chunks[-2]  # the tail it follows is full now: measure it again
            if sealed.positions is not None:
                budget.touch(sealed, 16 * len(sealed.positions))
        assert ch.positions is not None  # a new chunk holds arrays
        budget.admit(self, ch, 16 * len(ch.positions))

    def _dropped(self, ch: _Chunk) -> None:
        self.space.budget.forget(ch)
        self._pin_ends()

    def _page_in(self, i: int) -> _Chunk:
        ch = self._chunks[i]
        assert ch.page is not None  # a paged-out chunk is on a page
        ch.positions, ch.times = self.space.read(ch.page, "qd")
        ch.live, ch.start = ch.page[1], 0
        self.space.budget.admit(self, ch, 16 * ch.live, paged_in=True)  # never pages out ch itself
        return ch

    # --- paging ----------------------------------------------------------------------

    def _pin_ends(self) -> None:
        """The head and the tail are always resident (rule 1); the tail is about to be
        appended to, so its page is dropped at once."""
        chunks = self._chunks
        if chunks and chunks[0].positions is None:
            self._page_in(0)
        if chunks and chunks[-1].positions is None:
            self._page_in(len(chunks) - 1)
        if chunks:
            chunks[-1].page = None

    def release(self, chunk: object) -> bool:
        """Page ``chunk`` out, asked by the budget; never the head or the tail."""
        chunks = self._chunks
        if not chunks or chunk is chunks[0] or chunk is chunks[-1]:
            return False
        assert isinstance(chunk, _Chunk) and chunk.positions is not None  # the budget holds resident chunks
        self._hint = _NO_HINT  # it may name a slot of this chunk
        written = chunk.page is None
        if written:
            chunk.page = self.space.write(*chunk.live_arrays())
        chunk.positions = chunk.times = None
        chunk.start = 0
        if written:
            self.space.maybe_compact()  # after: the chunk is on its page only
        return True

    def _adopted(self) -> None:
        """Chunks taken over from a snapshot (``MessageStore.adopt``; paged ones have
        ``page`` set): resident as rule 1 wants."""
        budget = self.space.budget
        for ch in self._chunks:
            if ch.positions is not None:
                budget.admit(self, ch, 16 * len(ch.positions))
        self._pin_ends()
