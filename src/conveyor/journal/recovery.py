"""Checking segments, and what opening a journal does with what it finds.

Rules (STYLE 10: the log is append-only and says what it lost):

- Every segment is read in full and every record's CRC checked, in order, except a
  sealed segment that an earlier open verified and that has not changed since
  (verified.py): its ``.verified`` sidecar stands in for the read.
- Only a **torn tail** is trimmed: the last segment ends in an invalid record (a
  crash while a group was being written leaves exactly that), nothing valid follows
  it, and it starts at or after the last durable point the server recorded (the
  ``.prefix`` sidecar, verified.py). None of those bytes had been reported durable. The
  segment is truncated there and ONE warning names the file, the offset and the bytes
  dropped.
- A torn **file header** on the last segment (a crash while it was being created) is
  rewritten from the file name, unless valid records follow it or a durable prefix
  was recorded for it.
- Anything else refuses to start with :class:`~conveyor.errors.JournalCorrupt`, which
  names the file and offset and points at ``conveyor journal repair``: an invalid
  record in a sealed segment; an invalid record in the last segment with valid records
  after it (damage, not a torn write) or inside its recorded durable prefix; a last
  segment shorter than its recorded durable prefix; a damaged header; a gap or an
  overlap between segments. Those were durable once; dropping them silently would lose
  acknowledged messages (or deliver an at-most-once message twice), so a person
  decides, with ``repair`` saying what it will drop before it drops it.
- A header that checks out but carries a version or flag this code does not know
  raises :class:`~conveyor.errors.JournalError` and is never repaired: it was written
  by a newer conveyor.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass
from typing import Protocol

from conveyor.errors import JournalCorrupt, JournalError

from . import verified
from .storage import FileStorage

from .format import (
    FILE_HEADER_LEN,
    FRAME_HEADER_LEN,
    RECORD_BYTES_MAX,
    FrameReader,
    HeaderProblem,
    decode_header,
    frame_crc,
    unpack_frame_header,
)

#: A sparse index keeps one record position per this many bytes, so that ``read()``
#: can prove a position is a record boundary by walking at most this far. 8 bytes per
#: 4 KiB is 0.2% of the log in memory.
INDEX_INTERVAL_BYTES = 4096

#: How far past a damaged record recovery looks for records that still check out, for
#: the note in its warning. Bounded so a damaged multi-gigabyte tail costs little.
RESYNC_WINDOW_BYTES = 1024 * 1024

logger_default = logging.getLogger("conveyor.journal")

REPAIR_HINT = (
    "run `conveyor journal repair DIRECTORY` to see what truncating the log there would drop, "
    "then `conveyor journal repair --apply DIRECTORY` to do it"
)


class Storage(Protocol):  # what recovery needs from storage.py
    def list_bases(self) -> list[int]: ...
    def path(self, base: int) -> str: ...
    def size(self, base: int) -> int: ...
    def pread(self, base: int, offset: int, n: int) -> bytes: ...
    def create_empty(self, base: int) -> None: ...
    def truncate(self, base: int, size: int) -> None: ...
    def remove(self, base: int) -> None: ...


@dataclass(frozen=True)
class SegmentCheck:
    """What reading one segment found. Offsets are file offsets."""

    base: int
    path: str
    size: int  # bytes in the file
    records: int  # valid records from the start
    end: int  # position after the last valid record
    valid_bytes: int  # file offset where the valid prefix ends
    last_position: int | None  # position of the last valid record
    problem: str | None = None  # the first problem, None when the segment is clean
    header_kind: str | None = None  # set when the problem is the file header (HeaderProblem.kind)

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def header_problem(self) -> bool:
        return self.header_kind is not None

    @property
    def unsupported(self) -> bool:
        """A valid header of a version or flag this code does not know."""
        return self.header_kind == "unsupported"

    @property
    def bytes_after(self) -> int:
        """Bytes after the valid prefix (what truncation would drop)."""
        return self.size - self.valid_bytes


@dataclass(frozen=True)
class RecoveryReport:
    """What ``Journal.open`` found and did (``journal.recovery``)."""

    segments: int
    records: int
    first_position: int
    end: int
    created: bool = False  # the journal was empty: a first segment was created
    problem: str | None = None  # why the tail was truncated, if it was
    truncated_path: str | None = None
    truncated_offset: int | None = None  # file offset of the truncation
    truncated_position: int | None = None
    bytes_dropped: int = 0
    records_after_damage: int = 0  # records that still checked out after the damage
    # The last segment's valid records: their CRC32C and count, so the writer can keep
    # a verified prefix up to date (verified.py); None when unknown.
    tail_crc: int | None = None
    tail_records: int = 0


def check_segment(
    storage: Storage, base: int, *, index_interval: int = INDEX_INTERVAL_BYTES, resume: tuple[int, int, array[int]] | None = None
) -> tuple[SegmentCheck, array[int]]:
    """Read segment ``base`` in full; return what it holds and its sparse index.

    ``resume=(offset, records, index)``: the part before file offset ``offset`` is
    already known good (a verified prefix, verified.py): check only the rest.
    """
    path = storage.path(base)
    size = storage.size(base)
    index = array("q", [base])
    hbase, problem = decode_header(storage.pread(base, 0, FILE_HEADER_LEN))
    if problem is None and hbase != base:
        problem = HeaderProblem("foreign", f"file header says base position {hbase}, the file name says {base}")
    if problem is not None:
        return SegmentCheck(base, path, size, 0, base, 0, None, problem.text, problem.kind), index
    offset, records = FILE_HEADER_LEN, 0
    if resume is not None:
        offset, records, index = resume
    reader = FrameReader(lambda o, n: storage.pread(base, o, n), offset, size)
    next_index = index[-1] + index_interval
    last = None
    start = base - FILE_HEADER_LEN
    for offset, _payload in reader:
        last = start + offset
        if last >= next_index:
            index.append(last)
            next_index = last + index_interval
        records += 1
    end = start + reader.offset
    check = SegmentCheck(base, path, size, records, end, reader.offset, last, reader.problem)
    return check, index


def probe_after(storage: Storage, base: int, offset: int, size: int) -> tuple[int, int]:
    """``(records, first_offset)`` of valid-looking records after a damaged one at ``offset``.

    First tries the frame the damaged record's length points at (a flipped payload or
    CRC bit leaves the length right), then resynchronises byte by byte within
    :data:`RESYNC_WINDOW_BYTES`. ``(0, -1)`` when nothing checks out: a torn write.
    """
    head = storage.pread(base, offset, FRAME_HEADER_LEN)
    candidates = []
    if len(head) == FRAME_HEADER_LEN:
        n, _ = unpack_frame_header(head)
        if offset + FRAME_HEADER_LEN + n < size:
            candidates.append(offset + FRAME_HEADER_LEN + n)
    for start in candidates:
        records = _chain(storage, base, start, size)
        if records:
            return records, start
    window = storage.pread(base, offset + 1, min(RESYNC_WINDOW_BYTES, size - offset - 1))
    o = 0
    while o + FRAME_HEADER_LEN <= len(window):
        if window[o] == 0 and window[o : o + FRAME_HEADER_LEN] == bytes(FRAME_HEADER_LEN):
            # Zeros are what a crash leaves past the end of a write; skip the run.
            rest = window[o:].lstrip(b"\0")
            o = len(window) - len(rest)
            continue
        n, crc = unpack_frame_header(window, o)
        e = o + FRAME_HEADER_LEN + n
        if e <= len(window) and n <= RECORD_BYTES_MAX and frame_crc(n, window[o + FRAME_HEADER_LEN : e]) == crc:
            start = offset + 1 + o
            return _chain(storage, base, start, size), start
        o += 1
    return 0, -1


def _chain(storage: Storage, base: int, start: int, size: int) -> int:
    reader = FrameReader(lambda o, n: storage.pread(base, o, n), start, size)
    return sum(1 for _ in reader)


def recover(storage: Storage, *, logger: logging.Logger, create: bool) -> tuple[RecoveryReport, list[tuple[int, int, array[int]]]]:
    """Check every segment; truncate a bad tail of the last one; refuse anything else.

    Returns the report and, per segment, ``(base, end, sparse index)``.
    """
    bases = storage.list_bases()
    created = False
    if not bases:
        if not create:
            raise JournalError(f"no journal segments in {getattr(storage, 'directory', '?')}")
        storage.create_empty(0)
        bases = [0]
        created = True
    segments: list[tuple[int, int, array[int]]] = []
    records = 0
    report_tail: dict[str, object] = {}
    prev: SegmentCheck | None = None
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        if prev is not None and base != prev.end:
            raise _gap_error(prev, base, storage.path(base))
        durable_bytes = FILE_HEADER_LEN
        if last:
            check, index, tail_crc, durable_bytes = _check_last(storage, base)
        else:
            check, index = _check_sealed(storage, base)
        if check.problem is not None:
            if check.unsupported:
                raise JournalError(
                    f"journal segment {check.path}: {check.problem}; it was written by a newer "
                    "conveyor: upgrade, or move the journal aside",
                    path=check.path,
                )
            if not last:
                raise corrupt_error(check)
            why = tail_damage(storage, check, durable_bytes)
            if why is not None:
                raise corrupt_error(check, why)
            # The check already describes the valid prefix that truncation keeps.
            report_tail = _truncate_tail(storage, check, logger)
        elif last and check.size < durable_bytes:
            raise JournalCorrupt(
                f"journal segment {check.path} is {check.size} bytes, shorter than the durable end "
                f"recorded at the last checkpoint (offset {durable_bytes}): acknowledged records are "
                f"missing, so it will not be opened: {REPAIR_HINT} (records from position "
                f"{check.end} on are lost)",
                path=check.path, offset=check.size, position=check.end,
            )
        records += check.records
        segments.append((base, check.end, index))
        prev = check
    report = RecoveryReport(
        segments=len(segments),
        records=records,
        first_position=segments[0][0],
        end=segments[-1][1],
        created=created,
        tail_crc=tail_crc,
        tail_records=prev.records if prev is not None else 0,
        **report_tail,  # type: ignore[arg-type]  # _truncate_tail's fields, each of its own type (a dict of them)
    )
    return report, segments


def _check_last(storage: Storage, base: int) -> tuple[SegmentCheck, array[int], int | None, int]:
    """The last segment: a prefix saved by the running server (verified.save_prefix) is
    trusted when its CRC32C still matches the file; the rest is checked record by
    record. Also returns the CRC32C of the valid records (for the writer to continue),
    or None when it is not known (in-memory storage, a damaged header), and the file
    offset up to which the server recorded the segment durable (FILE_HEADER_LEN when it
    recorded nothing), whether or not the bytes still match."""
    if not isinstance(storage, FileStorage):
        check, index = check_segment(storage, base)
        return check, index, None, FILE_HEADER_LEN
    path = storage.path(base)
    claim = verified.read_prefix(path, base)
    durable_bytes = claim.valid_bytes if claim is not None else FILE_HEADER_LEN
    v = verified.load_prefix(path, base) if claim is not None else None
    if v is None:
        check, index = check_segment(storage, base)
        crc_from, crc = FILE_HEADER_LEN, 0
    else:
        check, index = check_segment(storage, base, resume=(v.valid_bytes, v.records, array("q", v.index)))
        crc_from, crc = v.valid_bytes, v.prefix_crc
    if check.header_problem:
        return check, index, None, durable_bytes
    return check, index, verified.file_crc(path, crc_from, check.valid_bytes, crc), durable_bytes


def tail_damage(storage: Storage, check: SegmentCheck, durable_bytes: int) -> str | None:
    """Why the invalid end of the last segment ``check`` is damage that must not be
    trimmed, or None when it is a torn tail: nothing valid after it, and at or after
    ``durable_bytes`` (the durable point the server recorded)."""
    if check.header_problem:
        if durable_bytes > FILE_HEADER_LEN:
            return f"the server recorded the segment durable up to offset {durable_bytes}"
        if not torn_creation(storage, check):
            return "valid records follow it, so this is damage, not a torn creation"
        return None
    after, after_offset = probe_after(storage, check.base, check.valid_bytes, check.size)
    if after:
        return (
            f"{after} record(s) from offset {after_offset} on still check out, so this is damage, "
            "not a torn write"
        )
    if check.valid_bytes < durable_bytes:
        return (
            f"the server recorded the segment durable up to offset {durable_bytes}, so the "
            "damaged record was acknowledged"
        )
    return None


def _check_sealed(storage: Storage, base: int) -> tuple[SegmentCheck, array[int]]:
    """A sealed segment: trusted from its ``.verified`` sidecar when that still matches,
    else checked in full (and the sidecar written when clean). See verified.py."""
    if not isinstance(storage, FileStorage):  # in-memory storage: nothing to save
        return check_segment(storage, base)
    path = storage.path(base)
    v = verified.load(path, base)
    if v is not None:
        check = SegmentCheck(base, path, v.size, v.records, v.end, v.valid_bytes, v.last_position)
        return check, array("q", v.index)
    prefix = verified.load_prefix(path, base)  # saved while it was the open segment
    if prefix is None:
        check, index = check_segment(storage, base)
    else:
        check, index = check_segment(storage, base, resume=(prefix.valid_bytes, prefix.records, array("q", prefix.index)))
    if check.problem is None:
        verified.save(path, base, check.records, check.end, check.valid_bytes, check.last_position, index)
    return check, index


def torn_creation(storage: Storage, check: SegmentCheck) -> bool:
    """A last segment with a torn or damaged header is a crash while it was created,
    unless valid records follow the header (then the header was damaged later)."""
    if check.header_kind in ("torn", "damaged"):
        return _chain(storage, check.base, FILE_HEADER_LEN, check.size) == 0
    return False


def _truncate_tail(storage: Storage, check: SegmentCheck, logger: logging.Logger) -> dict[str, object]:
    if check.header_problem:
        dropped = max(0, check.size - FILE_HEADER_LEN)
        storage.create_empty(check.base)
        logger.warning(
            "journal: %s in %s at offset 0 (position %d): rewrote the header, dropping %d bytes",
            check.problem, check.path, check.base, dropped,
        )
        return dict(
            problem=check.problem, truncated_path=check.path, truncated_offset=0,
            truncated_position=check.base, bytes_dropped=dropped,
        )
    storage.truncate(check.base, check.valid_bytes)
    logger.warning(
        "journal: %s in %s at offset %d (position %d): a torn last write, never reported durable; "
        "truncated the segment there, dropping %d bytes",
        check.problem, check.path, check.valid_bytes, check.end, check.bytes_after,
    )
    return dict(
        problem=check.problem, truncated_path=check.path, truncated_offset=check.valid_bytes,
        truncated_position=check.end, bytes_dropped=check.bytes_after,
    )


def corrupt_error(check: SegmentCheck, why: str = "the log is damaged before its tail") -> JournalCorrupt:
    where = 0 if check.header_problem else check.valid_bytes
    what = "the file header" if check.header_problem else f"the record at offset {where} (position {check.end})"
    return JournalCorrupt(
        f"journal segment {check.path}: {check.problem} in {what}; {why}, so it will not be "
        f"opened: {REPAIR_HINT} (records from position {check.end} on would be lost)",
        path=check.path, offset=where, position=check.end,
    )


def _gap_error(prev: SegmentCheck, base: int, path: str) -> JournalCorrupt:
    kind = "gap" if base > prev.end else "overlap"
    return JournalCorrupt(
        f"journal segment {path} starts at position {base} but {prev.path} ends at "
        f"{prev.end}: a {kind} between segments; {REPAIR_HINT} (segments from {path} on are removed)",
        path=path, offset=0, position=prev.end,
    )
