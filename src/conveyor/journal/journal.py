"""The transaction log: append, group commit, read by position, scan, retention.

Rules this module keeps:

- **Positions.** ``append`` returns the record's position, the logical byte offset of
  its frame in the stream of frames (file headers excluded). Positions are contiguous
  across segments and strictly increasing; a record keeps its position until
  retention removes its segment.
- **Group commit.** ``append`` and ``take_batch`` run on the thread that owns the
  journal (the event loop) and only touch memory. ``write_batch`` runs on ONE writer
  thread, never two at once, and touches only what the :class:`Batch` carries and
  the write side of the storage. Its result goes back to the loop, which calls
  ``mark_durable``. ``durable_end`` only grows, and every record before it is on disk.
- **Segments.** ``append`` decides rotation, so a batch arrives already cut into one
  :class:`Piece` per segment: one write and one fsync per segment touched, plus a
  directory fsync when a segment is created. A record goes to a new segment when it
  would push the current one past ``segment_bytes`` and the current one already holds
  a record; so a record larger than ``segment_bytes`` gets a segment of its own.
- **Reads are checked.** A position handed to ``read``/``scan`` is proven to be a
  record boundary by walking from the nearest entry of a sparse index (never by trusting
  bytes that a payload could forge), and every payload's CRC is checked again when it
  comes from a file.
- **Recent records are scanned from memory.** The frames of the last
  :data:`RECENT_BYTES` of batches stay in memory after they are written, so a scan
  of the tail (a replication link or a bookmark subscriber that keeps up) costs no
  system call and no CRC pass: those bytes are the ones this process framed, they never
  came back from a disk.
- **Retention** removes whole sealed segments, oldest first, never the last segment
  on disk, so what remains is always a contiguous run of positions.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from crc32c import crc32c

from conveyor.errors import JournalCorrupt, JournalError

from .format import (
    FILE_HEADER_LEN,
    FRAME_HEADER_LEN,
    RECORD_BYTES_MAX,
    SEGMENT_BYTES_DEFAULT,
    SEGMENT_BYTES_MAX,
    FrameReader,
    frame_length_at,
    length_crc,
    length_crcs,
    pack_frame_header,
    unpack_frame_header,
)
from .recovery import INDEX_INTERVAL_BYTES, RecoveryReport, logger_default, recover
from . import verified
from .storage import FileStorage, MemoryStore

#: Bytes read past a frame header by ``read()``, so most payloads come in the same
#: system call as the walk that proves the position.
READ_AHEAD_BYTES = 4096

#: Frames of the newest batches kept in memory for :meth:`Journal.scan`. 8 MiB is 25,000
#: records of 300 bytes, more than the readers of the tail are behind when they keep up.
RECENT_BYTES = 8 << 20

_cached_length_crc = length_crcs.get


@dataclass(frozen=True, slots=True)
class Piece:
    """The frames a batch adds to one segment; ``create`` when they open it."""

    base: int  # the segment's base position
    start: int  # position of the first frame in ``data``
    data: bytes  # whole frames
    create: bool
    records: int = 0  # frames in ``data``


@dataclass(frozen=True, slots=True)
class Batch:
    """Everything appended between two ``take_batch`` calls, cut per segment."""

    start: int
    end: int
    records: int
    pieces: tuple[Piece, ...]

    @property
    def bytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SegmentInfo:
    base: int  # position of its first record
    end: int  # position after its last durable record
    path: str
    size: int  # bytes in the file, header included
    # No record will be appended to it again. All but the last are sealed; the last
    # one listed is too, for a moment, when its successor exists only in memory.
    sealed: bool
    mtime: float  # seconds since the epoch, last modification


@dataclass(frozen=True)
class JournalStatistics:
    end: int
    durable_end: int
    first_position: int
    segments: int
    pending_records: int  # appended, not yet taken in a batch
    pending_bytes: int  # appended, not yet durable (includes a batch being written)
    batches_written: int
    records_written: int
    bytes_written: int  # frame bytes, headers not counted
    fsyncs: int


class _Segment:
    __slots__ = ("base", "index")

    def __init__(self, base: int, index: array[int]) -> None:
        self.base = base
        self.index = index  # sparse: record positions at least INDEX_INTERVAL_BYTES apart


def _make_directory(path: Path, *, fsync: bool) -> None:
    """Create ``path`` and its missing parents, and make their names durable: a commit
    fsyncs the segment and the journal directory, not the directories above it."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        if fsync:
            for created in reversed(missing):
                fd = os.open(created.parent, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    except OSError as exc:
        raise JournalError(f"cannot create journal directory {path}: {exc.strerror}") from exc


def _check_segment_bytes(segment_bytes: int) -> None:
    if not 1 <= segment_bytes <= SEGMENT_BYTES_MAX:
        raise JournalError(f"segment_bytes must be between 1 and {SEGMENT_BYTES_MAX}, not {segment_bytes}")


def _extend_tail(tail: tuple[int, int, int, int] | None, piece: Piece) -> tuple[int, int, int, int] | None:
    """The open segment's (base, file end, CRC32C, records) after ``piece`` is written."""
    if piece.create:
        return (piece.base, FILE_HEADER_LEN + len(piece.data), crc32c(piece.data), piece.records)
    if tail is None or tail[0] != piece.base:
        return None
    return (tail[0], tail[1] + len(piece.data), crc32c(piece.data, tail[2]), tail[3] + piece.records)


class Journal:
    """A file-backed transaction log. Use :meth:`open`; see the module header."""

    # Slots, not a __dict__: an instance with 30 attributes or more gets a dict of its own
    # in CPython 3.11 (no shared keys), and every attribute load on the append path is a
    # dict lookup; slots make each a fixed offset.
    __slots__ = (
        "_bases", "_batch_start", "_batches_written", "_buf", "_buf_create", "_buf_rec0", "_buf_start",
        "_bytes_written", "_closed", "_disk_last", "_fast_limit", "_fsyncs", "_index", "_index_next",
        "_pieces", "_read_hint", "_recent_bytes", "_recent_frames", "_recent_starts", "_records",
        "_records_written", "_saved_tail", "_sealing", "_seg_base", "_seg_limit", "_segment_bytes", "_segs",
        "_storage", "_tail", "_write_error", "_written_end", "durable_end", "end", "first_position",
        "recovery", "on_seal",
    )

    end: int  # the position the next append() gets
    durable_end: int  # every record before it is on disk (and fsynced)
    first_position: int  # the first retained position
    recovery: RecoveryReport
    #: ``on_seal(path, base, end)``, called on the loop thread by :meth:`mark_durable`
    #: once segment ``base`` is sealed and its last record durable, so the file has its
    #: final size. Must be quick and must not raise: the server sets it to write segment
    #: summaries on its I/O thread (index.py). None (set in __init__): nothing is called.
    on_seal: Callable[[str, int, int], None] | None

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = SEGMENT_BYTES_DEFAULT,
        fsync: bool = True,
        logger: logging.Logger | None = None,
        create: bool = True,
    ) -> Journal:
        """Open (and recover) the journal in ``directory``; see recovery.py for the rules."""
        _check_segment_bytes(segment_bytes)
        path = Path(directory)
        if not path.is_dir():
            if path.exists():
                raise JournalError(f"journal directory {path} is not a directory")
            if not create:
                raise JournalError(f"journal directory {path} does not exist")
            _make_directory(path, fsync=fsync)
        storage = FileStorage(path, fsync=fsync)
        log = logger or logger_default
        try:
            report, segments = recover(storage, logger=log, create=create)
        except OSError as exc:
            storage.close()
            raise JournalError(f"cannot read journal in {path}: {exc}") from exc
        except BaseException:
            storage.close()
            raise
        return cls(storage, report, segments, segment_bytes=segment_bytes)

    def __init__(self, storage: FileStorage | MemoryStore, report: RecoveryReport,
                 segments: list[tuple[int, int, array[int]]], *, segment_bytes: int) -> None:
        """Internal: :meth:`open` recovers the storage, then builds the journal on it."""
        self._setup(storage, report, segments, segment_bytes)

    def _setup(self, storage: FileStorage | MemoryStore, report: RecoveryReport,
               segments: list[tuple[int, int, array[int]]], segment_bytes: int) -> None:
        self.on_seal = None
        self._storage = storage
        self._segment_bytes = segment_bytes
        self.recovery = report
        self._segs = [_Segment(base, index) for base, _end, index in segments]
        self._bases = [s.base for s in self._segs]
        active = self._segs[-1]
        self.end = self.durable_end = segments[-1][1]
        self.first_position = self._segs[0].base
        self._disk_last = active.base  # the newest segment known to exist on disk
        self._closed = False
        # A record boundary proven by the last read: sequential reads walk nothing.
        # Always the end of a record inside a retained segment, or 0.
        self._read_hint = 0
        # --- append side (loop thread) ---
        self._seg_base = active.base
        self._seg_limit = active.base + segment_bytes - FILE_HEADER_LEN
        self._index = active.index
        self._index_next = active.index[-1] + INDEX_INTERVAL_BYTES
        self._fast_limit = min(self._seg_limit, self._index_next)
        # The frames appended since the last take, as parts (a frame header, then its
        # payload), joined once when taken: a bytearray grown record by record is copied
        # again at each reallocation.
        self._buf: list[bytes] = []
        self._buf_start = self.end
        self._buf_create = False
        self._buf_rec0 = 0  # self._records when the buffer started (records per piece)
        self._pieces: list[Piece] = []
        # Segments sealed by append, not yet durable to their end: (base, end), oldest first.
        self._sealing: list[tuple[int, int]] = []
        self._batch_start = self.end
        self._records = 0
        # The newest batches' frames, oldest first: starts[i] is the position of
        # frames[i][0]; they cover [starts[0], self._batch_start) without a hole.
        self._recent_starts: list[int] = []
        self._recent_frames: list[bytes] = []
        self._recent_bytes = 0
        # --- write side (writer thread) ---
        self._written_end = self.end
        self._write_error: BaseException | None = None
        self._batches_written = 0
        self._records_written = 0
        self._bytes_written = 0
        self._fsyncs = 0
        # The open segment's written prefix: (base, file end, CRC32C, records), kept by
        # the writer thread so save_prefix() can record it (verified.py); None: unknown.
        self._tail: tuple[int, int, int, int] | None = None
        self._saved_tail: tuple[int, int, int, int] | None = None
        if report.tail_crc is not None:
            self._tail = (active.base, FILE_HEADER_LEN + self.end - active.base, report.tail_crc, report.tail_records)

    # --- append (loop thread, hot path) ----------------------------------------------

    def append(self, payload: bytes) -> int:
        """Buffer one record; return its position. Not durable until committed."""
        n = len(payload)
        pos = self.end
        new_end = pos + FRAME_HEADER_LEN + n
        if new_end > self._fast_limit:
            # Rotation, a sparse-index entry, an oversized record or a closed journal.
            self._before_append_slow(pos, n)
        lc = _cached_length_crc(n)
        if lc is None:
            lc = length_crc(n)
        buf = self._buf
        buf.append(pack_frame_header(n, crc32c(payload, lc)))
        buf.append(payload)
        self.end = new_end
        self._records += 1
        return pos

    def append_many(self, payloads: list[bytes]) -> list[int]:
        """Buffer records in order, as ``append`` does each; their positions. All or
        nothing: a closed journal or an oversized record refuses the lot."""
        self._check_appendable(max(map(len, payloads), default=0))
        positions: list[int] = []
        note = positions.append
        pos = self.end
        records0 = self._records
        buf = self._buf
        for payload in payloads:
            n = len(payload)
            new_end = pos + FRAME_HEADER_LEN + n
            if new_end > self._fast_limit:
                self.end, self._records = pos, records0 + len(positions)  # what a rotation reads
                self._before_append_slow(pos, n)
                buf = self._buf
            lc = _cached_length_crc(n)
            if lc is None:
                lc = length_crc(n)
            buf.append(pack_frame_header(n, crc32c(payload, lc)))
            buf.append(payload)
            note(pos)
            pos = new_end
        self.end = pos
        self._records = records0 + len(positions)
        return positions

    def _check_appendable(self, n: int) -> None:
        """Refuse a record of ``n`` bytes: the journal is closed, or it is too large."""
        if self._closed:
            raise JournalError("the journal is closed")
        if n > RECORD_BYTES_MAX:
            raise JournalError(f"a record of {n} bytes is over record_bytes_max ({RECORD_BYTES_MAX})")

    def _before_append_slow(self, pos: int, n: int) -> None:
        self._check_appendable(n)
        if pos + FRAME_HEADER_LEN + n > self._seg_limit and pos > self._seg_base:
            self._rotate(pos)
        if pos >= self._index_next:
            self._index.append(pos)
            self._index_next = pos + INDEX_INTERVAL_BYTES
        self._fast_limit = min(self._seg_limit, self._index_next)

    def _rotate(self, pos: int) -> None:
        """Start a new segment at ``pos``: the current buffer becomes a finished piece."""
        self._sealing.append((self._seg_base, pos))
        if self._buf:
            self._pieces.append(self._buffered_piece())
            self._buf = []
        self._buf_rec0 = self._records
        self._buf_start = pos
        self._buf_create = True
        seg = _Segment(pos, array("q", [pos]))
        self._segs.append(seg)
        self._bases.append(pos)
        self._seg_base = pos
        self._seg_limit = pos + self._segment_bytes - FILE_HEADER_LEN
        self._index = seg.index
        self._index_next = pos + INDEX_INTERVAL_BYTES

    def _buffered_piece(self) -> Piece:
        """The frames appended to the current segment since the buffer started, joined."""
        return Piece(self._seg_base, self._buf_start, b"".join(self._buf), self._buf_create,
                     self._records - self._buf_rec0)

    def take_batch(self) -> Batch | None:
        """Take everything appended since the last call (loop thread), or None."""
        if self.end == self._batch_start:
            return None
        pieces = self._pieces
        if self._buf:
            pieces.append(self._buffered_piece())
        batch = Batch(self._batch_start, self.end, self._records, tuple(pieces))
        self._remember(pieces)
        self._pieces = []
        self._buf = []
        self._buf_start = self._batch_start = self.end
        self._buf_create = False
        self._records = self._buf_rec0 = 0
        return batch

    def _remember(self, pieces: list[Piece]) -> None:
        starts, frames = self._recent_starts, self._recent_frames
        for piece in pieces:
            if len(piece.data) > RECENT_BYTES:  # read back from the file; nothing older either
                starts.clear()
                frames.clear()
                self._recent_bytes = 0
                continue
            data = piece.data  # immutable: the writer thread reads the same bytes
            starts.append(piece.start)
            frames.append(data)
            self._recent_bytes += len(data)
        drop = 0
        while self._recent_bytes > RECENT_BYTES:
            self._recent_bytes -= len(frames[drop])
            drop += 1
        if drop:
            del starts[:drop], frames[:drop]

    def _forget_recent(self) -> None:
        self._recent_starts, self._recent_frames, self._recent_bytes = [], [], 0

    # --- write (writer thread) ---------------------------------------------------------

    def write_batch(self, batch: Batch) -> int:
        """Write and sync ``batch`` (writer thread); return the new durable end.

        After a failed write or fsync nothing more is written: what reached the disk
        is unknown until the journal is opened again, and recovery decides.
        """
        if self._write_error is not None:
            raise JournalError(f"the journal stopped writing after an earlier failure: {self._write_error}")
        if batch.start != self._written_end:
            raise JournalError(f"batch starts at {batch.start}, the journal was written up to {self._written_end}")
        storage = self._storage
        piece = None
        try:
            for piece in batch.pieces:
                storage.write(piece.base, piece.data, create=piece.create)
                self._tail = _extend_tail(self._tail, piece)
        except OSError as exc:
            self._write_error = exc
            where = storage.path(piece.base) if piece is not None else "?"
            raise JournalError(
                f"journal write to {where} failed: {exc.strerror or exc}; no further writes "
                "will be made (reopen the journal to recover)"
            ) from exc
        self._written_end = batch.end
        self._batches_written += 1
        self._records_written += batch.records
        self._bytes_written += batch.end - batch.start
        if storage.fsync:
            self._fsyncs += len(batch.pieces) + sum(p.create for p in batch.pieces)
        return batch.end

    def save_prefix(self) -> bool:
        """Save the open segment's written prefix as ``<segment>.prefix``, so the next
        open re-reads it with one CRC32C pass instead of checking every record (verified.py).
        False when there is nothing new to save. The server splits it in two:
        :meth:`prefix_to_save` on the loop thread, the file write on its I/O thread."""
        args = self.prefix_to_save()
        if args is None:
            return False
        verified.save_prefix(*args)
        return True

    def prefix_to_save(self) -> tuple[str, int, int, int, int, list[int], int] | None:
        """The arguments of :func:`verified.save_prefix` for the written prefix, or None
        when it is unknown, already saved, or not on disk storage (loop thread)."""
        tail = self._tail
        if tail is None or tail == self._saved_tail or not isinstance(self._storage, FileStorage):
            return None
        self._saved_tail = tail
        base, file_end, crc, records = tail
        seg = self._segs[bisect_left(self._bases, base + 1) - 1]
        if seg.base != base:
            return None  # retention or truncation removed it
        end = base + file_end - FILE_HEADER_LEN
        index = seg.index[: max(1, bisect_left(seg.index, end))].tolist()  # [base] at least, as a check builds it
        return self._storage.path(base), base, records, end, file_end, index, crc

    def mark_durable(self, end: int) -> None:
        """Record that everything before ``end`` is durable (loop thread)."""
        if end > self.durable_end:
            self.durable_end = end
            # Every segment that starts before ``end`` now exists on disk.
            newest = self._bases[bisect_left(self._bases, end) - 1]
            if newest > self._disk_last:
                self._disk_last = newest
            sealing = self._sealing
            while sealing and sealing[0][1] <= end:
                base, seal_end = sealing.pop(0)
                if self.on_seal is not None:
                    self.on_seal(self._storage.path(base), base, seal_end)

    def commit(self) -> int:
        """take_batch + write_batch + mark_durable, synchronously; the durable end.

        For tests, tools and the CLI: it must not run while a batch is being written
        by the writer thread.
        """
        batch = self.take_batch()
        if batch is not None:
            self.mark_durable(self.write_batch(batch))
        return self.durable_end

    # --- read ----------------------------------------------------------------------

    def read(self, position: int) -> bytes:
        """The payload of the durable record at ``position``."""
        seg, limit, fo, data, o = self._frame_at(position)
        n, crc = unpack_frame_header(data, o)
        if position + FRAME_HEADER_LEN + n > limit:
            raise self._corrupt(seg, position, f"record length {n} runs past the end of the segment")
        start = o + FRAME_HEADER_LEN
        payload = data[start : start + n]
        if len(payload) < n:
            payload = self._storage.pread(seg.base, fo + start, n)
        if crc32c(payload, length_crc(n)) != crc:
            raise self._corrupt(seg, position, "CRC mismatch")
        self._read_hint = position + FRAME_HEADER_LEN + n
        return payload

    def position_after(self, position: int) -> int:
        """The position of the record after the one at ``position`` (or durable_end)."""
        seg, limit, _fo, data, o = self._frame_at(position)
        after = position + FRAME_HEADER_LEN + frame_length_at(data, o)
        if after > limit:
            raise self._corrupt(seg, position, "record length runs past the end of the segment")
        self._read_hint = after
        return after

    def scan(self, start: int | None = None, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """``(position, payload)`` of durable records with ``start <= position < end``.

        The bounds are fixed when scan() is called (later commits are not seen; resume
        from ``position_after`` of the last record). ``start`` must be a record
        boundary; below ``first_position`` it means ``first_position``.
        """
        if self._closed:
            raise JournalError("the journal is closed")
        hi = self.durable_end if end is None else min(end, self.durable_end)
        lo = self.first_position if start is None or start < self.first_position else start
        if lo > self.end:
            raise JournalError(f"position {lo} is past the end of the journal ({self.end})")
        if lo < hi:
            self._frame_at(lo)  # proves lo is a record boundary, now rather than later
        return self._scan(lo, hi, self.durable_end)

    def _scan(self, pos: int, hi: int, durable: int) -> Iterator[tuple[int, bytes]]:
        storage = self._storage
        while pos < hi:
            # Retention may have run between two records; skip what it removed.
            pos = max(pos, self.first_position)
            starts = self._recent_starts
            if starts and pos >= starts[0]:
                # In memory: frames this process wrote (checked when they were made).
                # Looked up again for each batch, since newer batches evict older ones.
                i = bisect_right(starts, pos) - 1
                base, data = starts[i], self._recent_frames[i]
                if pos < base + len(data):
                    limit = min(base + len(data), hi)
                    unpack = unpack_frame_header
                    while pos < limit:
                        o = pos - base
                        e = o + FRAME_HEADER_LEN + unpack(data, o)[0]
                        yield pos, data[o + FRAME_HEADER_LEN : e]
                        pos = base + e
                    continue
            i = bisect_right(self._bases, pos) - 1
            base = self._bases[i]
            # Frames are read up to the durable end of the segment; the last one
            # yielded may start before ``hi`` and end after it.
            limit = min(self._bases[i + 1], durable) if i + 1 < len(self._bases) else durable
            handle = storage.reader(base)
            try:
                frames = FrameReader(handle.pread, FILE_HEADER_LEN + pos - base, FILE_HEADER_LEN + limit - base)
                shift = base - FILE_HEADER_LEN
                for offset, payload in frames:
                    pos = shift + offset
                    if pos >= hi:
                        return
                    yield pos, payload
                if frames.problem is not None:
                    raise self._corrupt(self._segs[i], shift + frames.offset, frames.problem)
            finally:
                handle.close()
            pos = limit

    def _frame_at(self, position: int) -> tuple[_Segment, int, int, bytes, int]:
        """Prove ``position`` is a durable record boundary; read its frame header.

        Returns ``(segment, limit, file offset of data[0], data, offset of the frame
        in data)``, where ``limit`` is the end of the durable part of the segment.
        """
        if self._closed:
            raise JournalError("the journal is closed")
        if not self.first_position <= position < self.durable_end:
            raise JournalError(
                f"position {position} is not a durable record of the journal "
                f"(retained: {self.first_position} to {self.durable_end})",
                position=position,
            )
        bases = self._bases
        i = bisect_right(bases, position) - 1
        seg = self._segs[i]
        limit = min(bases[i + 1], self.durable_end) if i + 1 < len(bases) else self.durable_end
        index = seg.index
        entry = index[bisect_right(index, position) - 1]
        hint = self._read_hint
        if entry < hint <= position:
            entry = hint  # the end of the last record read: a proven boundary, and nearer
        span = position - entry
        fo = FILE_HEADER_LEN + entry - seg.base
        data = self._storage.pread(seg.base, fo, span + FRAME_HEADER_LEN + READ_AHEAD_BYTES)
        if len(data) < span + FRAME_HEADER_LEN:
            raise self._corrupt(seg, position, "segment file shorter than its durable end")
        o = 0
        while o < span:
            o += FRAME_HEADER_LEN + frame_length_at(data, o)
        if o != span:
            raise JournalError(f"position {position} is not a record boundary", position=position)
        return seg, limit, fo, data, o

    def _corrupt(self, seg: _Segment, position: int, problem: str) -> JournalCorrupt:
        path = self._storage.path(seg.base)
        offset = FILE_HEADER_LEN + position - seg.base
        return JournalCorrupt(
            f"journal segment {path}: {problem} at offset {offset} (position {position}), "
            "in a record that was valid when it was written",
            path=path, offset=offset, position=position,
        )

    # --- segments and retention ------------------------------------------------------

    def segments(self) -> list[SegmentInfo]:
        """The segments on disk, oldest first; all but the last are sealed."""
        out = []
        bases = self._bases
        for i, base in enumerate(bases):
            if base > self._disk_last:
                break
            size, mtime = self._storage.stat(base)
            end = min(bases[i + 1], self.durable_end) if i + 1 < len(bases) else self.durable_end
            out.append(SegmentInfo(base, end, self._storage.path(base), size, i + 1 < len(bases), mtime))
        return out

    def apply_retention(
        self,
        *,
        keep_from: int,
        max_age_s: float | None = None,
        max_bytes: int | None = None,
        now: float | None = None,
    ) -> list[SegmentInfo]:
        """Remove the oldest sealed segments that nothing needs and the limits let go.

        A segment goes when it ends at or before ``keep_from`` (no consumer needs its
        records) AND it is at least ``max_age_s`` old (by mtime) or the journal is over
        ``max_bytes``. With neither limit set nothing is removed: keep for ever. Removal
        stops at the first segment that must stay, so what remains is contiguous; the
        newest segment on disk always stays, since it carries the end position.
        """
        if max_age_s is None and max_bytes is None:
            return []
        now = time.time() if now is None else now
        infos = self.segments()
        total = sum(info.size for info in infos)
        removed = []
        for info in infos:
            if not info.sealed or info.base >= self._disk_last or info.end > keep_from:
                break
            old = max_age_s is not None and now - info.mtime >= max_age_s
            big = max_bytes is not None and total > max_bytes
            if not (old or big):
                break
            try:
                self._storage.remove(info.base)
            except OSError as exc:
                raise JournalError(f"cannot remove journal segment {info.path}: {exc.strerror}") from exc
            del self._segs[0]
            del self._bases[0]
            self.first_position = self._bases[0]
            total -= info.size
            removed.append(info)
        return removed

    # --- lifecycle -------------------------------------------------------------------

    @property
    def directory(self) -> Path | str:
        return self._storage.directory

    def statistics(self) -> JournalStatistics:
        return JournalStatistics(
            end=self.end,
            durable_end=self.durable_end,
            first_position=self.first_position,
            segments=len(self._bases),
            pending_records=self._records,
            pending_bytes=self.end - self.durable_end,
            batches_written=self._batches_written,
            records_written=self._records_written,
            bytes_written=self._bytes_written,
            fsyncs=self._fsyncs,
        )

    def close(self, *, commit: bool = True) -> None:
        """Commit what is pending (unless ``commit=False``: a server that failed writes
        nothing more), then close every descriptor and the lock."""
        if self._closed:
            return
        try:
            if commit and self._write_error is None:
                self.commit()
        finally:
            self._closed = True
            self._fast_limit = -1  # every append now takes the slow path, which refuses
            self._storage.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def truncate(self, position: int) -> None:
        """Cut the log back to ``position``, a durable record boundary: every record at or
        after it is gone for good, even from segments after the one holding it.

        For recovery only (an incomplete transaction at the tail, engine/txn.py), before
        anything else is appended: refuses while appended records are not durable. The
        newest segments go first and the cut segment is fsynced, so a crash midway
        leaves a prefix of the log, and the caller's next recovery cuts the rest.
        """
        if self._closed:
            raise JournalError("the journal is closed")
        if self.end != self.durable_end or self._pieces or self._buf:
            raise JournalError("truncate needs every appended record durable (recovery only)")
        if position == self.end:
            return
        if position < self.first_position or position > self.end:
            raise JournalError(f"cannot truncate at {position}: the journal holds {self.first_position} to {self.end}")
        if position != self._segs[0].base:
            self._frame_at(position)  # proves it is a record boundary
        i = bisect_right(self._bases, position) - 1
        try:
            for base in reversed(self._bases[i + 1 :]):
                if base <= self._disk_last:
                    self._storage.remove(base)
            seg = self._segs[i]
            self._storage.truncate(seg.base, FILE_HEADER_LEN + position - seg.base)
        except OSError as exc:
            raise JournalError(f"cannot truncate the journal at {position}: {exc.strerror or exc}") from exc
        del self._segs[i + 1 :]
        del self._bases[i + 1 :]
        index = seg.index
        del index[bisect_left(index, position) :]
        if not index:
            index.append(seg.base)
        self._disk_last = min(self._disk_last, seg.base)
        self.end = self.durable_end = self._written_end = position
        self._read_hint = 0
        self._forget_recent()
        self._seg_base = seg.base
        self._seg_limit = seg.base + self._segment_bytes - FILE_HEADER_LEN
        self._index = index
        self._index_next = index[-1] + INDEX_INTERVAL_BYTES
        self._fast_limit = min(self._seg_limit, self._index_next)
        self._buf_start = self._batch_start = position
        self._buf_create = False
        self._tail = None  # the CRC of the cut prefix is unknown until the next open


class MemoryJournal(Journal):
    """The same journal over a :class:`MemoryStore`: no files, same bytes, same rules.

    For engine unit tests and deterministic simulation: ``MemoryJournal()`` is an
    empty journal. Opening a new MemoryJournal on the ``store`` of an old one is what a
    restart after a crash sees: the records written by ``write_batch`` and nothing
    that was only appended.
    """

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        segment_bytes: int = SEGMENT_BYTES_DEFAULT,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] | None = None,
        create: bool = True,
    ) -> None:
        _check_segment_bytes(segment_bytes)
        store = store if store is not None else MemoryStore(clock)
        report, segments = recover(store, logger=logger or logger_default, create=create)
        self._setup(store, report, segments, segment_bytes)

    @classmethod
    def open(  # type: ignore[override]  # on a store, not a directory: by design not Journal.open's signature
        cls,
        store: MemoryStore | None = None,
        *,
        segment_bytes: int = SEGMENT_BYTES_DEFAULT,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] | None = None,
        create: bool = True,
    ) -> MemoryJournal:
        """Same as the constructor, named like :meth:`Journal.open`."""
        return cls(store, segment_bytes=segment_bytes, logger=logger, clock=clock, create=create)

    @property
    def store(self) -> MemoryStore:
        return cast(MemoryStore, self._storage)  # MemoryJournal is only ever built on a MemoryStore
