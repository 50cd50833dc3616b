"""FileBackedMetadata: a queue's message store paged out to a file (spec 000, reference.md
A.2 ``FileBackedMetadata``: "queue state can be paged out to a file").

:class:`PagedMessageStore` is the :class:`~conveyor.engine.queue.store.MessageStore`
with at most ``resident_max`` chunks in memory; the others live in a :class:`PageFile`.
Rules:

1. **What stays in memory.** The head chunk (dispatch and expiry read it) and the tail
   chunk (enqueue appends to it) are always resident. Every other chunk is paged in
   when something touches it (an ack by bookmark, a filtered cursor, a view, a returned
   message) and paged out again, oldest page-in first, once more than ``resident_max``
   are resident. Memory is then O(resident_max x 4,096) messages whatever the depth,
   plus a descriptor per paged chunk (about 0.06 B per message).
2. **Pages are immutable.** A page is written once, at the end of the file, holding
   only the chunk's live slots (positions then times, 16 B a message) and known by
   ``(offset, count, crc32)``. A chunk changed while resident gets a new page when it
   is paged out again; a clean one is simply dropped. So a snapshot that names pages
   (:mod:`conveyor.engine.queue.snapshot`) stays valid while the file grows.
3. **Space comes back by generations.** Pages of consumed chunks are garbage. Once the
   garbage passes both ``COMPACT_MIN_BYTES`` and the live pages, the live pages are
   copied to a new file, ``<queue>.<generation + 1>.fbm``. Old generations are deleted
   only once a snapshot naming a newer one is durable (``PageFiles.prune``), or
   at startup (every generation but the one the loaded snapshot names).
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
from typing import TYPE_CHECKING, Protocol

from conveyor.engine.queue.store import _NO_HINT, MessageStore, _Chunk

if TYPE_CHECKING:
    from pathlib import Path

#: Resident chunks (head and tail included): 8 x 4,096 x 16 B = 512 KiB per queue.
RESIDENT_MAX = 8
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


def encode_page(positions: array[int], times: array[float]) -> tuple[bytes, int]:
    data = positions.tobytes() + times.tobytes()
    return data, zlib.crc32(data)


def check_page(data: bytes | memoryview, count: int, crc: int, where: str) -> None:
    if len(data) != 16 * count or zlib.crc32(data) != crc:
        raise PageCorrupt(f"page {where} does not match its checksum")


def decode_page(data: bytes | memoryview, count: int, crc: int, where: str) -> tuple[array[int], array[float]]:
    check_page(data, count, crc, where)
    view = memoryview(data)  # no copies of the halves: a deep queue's restart reads many pages
    positions = array("q")
    positions.frombytes(view[: 8 * count])
    times = array("d")
    times.frombytes(view[8 * count :])
    return positions, times


class PagedMessageStore(MessageStore):
    """The message store with chunks paged out to a :class:`PageFile` (rules 1-3)."""

    __slots__ = ("file", "resident_max", "_lru")

    def __init__(
        self, file: PageFile, *, resident_max: int | None = None, chunk_slots: int | None = None
    ) -> None:
        super().__init__(chunk_slots=chunk_slots)
        resident_max = RESIDENT_MAX if resident_max is None else resident_max
        if resident_max < 2:
            raise ValueError("resident_max must be >= 2 (the head and the tail)")
        self.file = file
        self.resident_max = resident_max
        self._lru: dict[_Chunk, None] = {}  # resident chunks, oldest page-in first

    # --- statistics ------------------------------------------------------------------

    @property
    def page_generation(self) -> int | None:
        return self.file.generation

    @property
    def resident_chunks(self) -> int:
        return len(self._lru)

    @property
    def paged_chunks(self) -> int:
        return sum(1 for ch in self._chunks if ch.positions is None)

    # --- hooks of MessageStore ---------------------------------------------------------

    def _added(self, ch: _Chunk) -> None:
        self._lru[ch] = None
        self._evict()

    def _dropped(self, ch: _Chunk) -> None:
        self._lru.pop(ch, None)
        self._pin_ends()

    def _page_in(self, i: int) -> _Chunk:
        ch = self._chunks[i]
        assert ch.page is not None  # a paged-out chunk is on a page
        offset, count, crc = ch.page
        ch.positions, ch.times = decode_page(
            self.file.read(offset, 16 * count), count, crc, f"{self.file.name}@{offset}"
        )
        ch.live, ch.start = count, 0
        self._lru[ch] = None
        self._evict(keep=ch)  # the caller is about to use it
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

    def _evict(self, keep: _Chunk | None = None) -> None:
        lru, chunks = self._lru, self._chunks
        if len(lru) <= self.resident_max or not chunks:
            return
        head, tail = chunks[0], chunks[-1]
        for ch in list(lru):
            if len(lru) <= self.resident_max:
                break
            if ch is head or ch is tail or ch is keep:
                continue
            del lru[ch]
            self._page_out(ch)

    def _page_out(self, ch: _Chunk) -> None:
        self._hint = _NO_HINT  # it may name a slot of this chunk
        if ch.page is None:
            positions, times = ch.live_arrays()
            data, crc = encode_page(positions, times)
            ch.page = (self.file.append(data), len(positions), crc)
            self._maybe_compact()
        ch.positions = ch.times = None
        ch.start = 0

    def live_page_bytes(self) -> int:
        return sum(16 * ch.page[1] for ch in self._chunks if ch.page is not None)

    def _maybe_compact(self) -> None:
        """Rule 3: copy the live pages to the next generation once garbage dominates."""
        size = self.file.size
        if size < COMPACT_MIN_BYTES:
            return
        live = self.live_page_bytes()
        if size - live < max(COMPACT_MIN_BYTES, live):
            return
        old = self.file
        new = old.next_generation()
        for ch in self._chunks:
            if ch.page is not None:
                offset, count, crc = ch.page
                ch.page = (new.append(old.read(offset, 16 * count)), count, crc)
        old.close()  # deleted once a snapshot names the new generation (rule 3)
        self.file = new

    def _adopted(self) -> None:
        """Chunks taken over from a snapshot (``MessageStore.adopt``; paged ones have
        ``page`` set): resident as rule 1 wants."""
        self._lru = {ch: None for ch in self._chunks if ch.positions is not None}
        self._pin_ends()
        self._evict()
