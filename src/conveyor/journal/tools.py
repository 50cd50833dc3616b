"""Offline tools over a journal directory, for the CLI and the Spark reader.

- :func:`verify` reads everything and changes nothing; it may run beside a live
  server (whose last record may then show as torn).
- :func:`repair` takes the directory lock, truncates the log at its first invalid
  record wherever it is, removes every later segment, and reports exactly that.
- :func:`dump` yields the records that ``Journal.open`` would keep.
- :func:`scan_segment` reads one segment file on its own (one Spark partition).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conveyor.errors import JournalCorrupt, JournalError

from .format import FILE_HEADER_LEN, FrameReader, decode_header
from .recovery import SegmentCheck, check_segment, corrupt_error, logger_default, probe_after, torn_creation
from .storage import FileStorage, SegmentReader, parse_segment_name


@dataclass(frozen=True)
class VerifyReport:
    directory: str
    segments: tuple[SegmentCheck, ...]
    records: int  # valid records, all segments
    first_position: int | None
    last_position: int | None  # position of the last valid record
    end: int | None  # position after the last valid record of the last segment
    problems: tuple[str, ...]  # each names a file and an offset

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        """A few lines for a person (``conveyor journal verify`` prints this)."""
        if not self.segments:
            return f"journal {self.directory}: no segments"
        lines = [
            f"journal {self.directory}: {len(self.segments)} segment(s), {self.records} record(s), "
            f"positions {self.first_position} to {self.end}"
            + (f", last record at {self.last_position}" if self.last_position is not None else ""),
        ]
        lines += [f"problem: {p}" for p in self.problems] or ["no problem found"]
        return "\n".join(lines)

    __str__ = describe


@dataclass(frozen=True)
class RepairReport:
    directory: str
    problem: str | None  # the first problem found; None: nothing to repair
    path: str | None = None  # the segment truncated (or whose header was rewritten)
    offset: int | None = None  # the file offset it was truncated at
    position: int | None = None  # records from this position on are gone
    bytes_dropped: int = 0  # file bytes removed, headers of removed segments included
    records_dropped: int = 0  # records after the damage that still checked out
    segments_removed: tuple[str, ...] = ()

    @property
    def repaired(self) -> bool:
        return self.problem is not None

    def describe(self) -> str:
        if self.problem is None:
            return f"journal {self.directory}: nothing to repair"
        removed = f", removed {len(self.segments_removed)} later segment(s)" if self.segments_removed else ""
        return (
            f"journal {self.directory}: {self.problem}; kept the log up to position "
            f"{self.position} ({self.path} truncated at offset {self.offset}){removed}; dropped "
            f"{self.bytes_dropped} bytes, among them {self.records_dropped} record(s) that still checked out"
        )

    __str__ = describe


def _open_storage(directory: str | os.PathLike[str], *, lock: bool) -> FileStorage:
    if not Path(directory).is_dir():
        raise JournalError(f"journal directory {directory} does not exist")
    return FileStorage(directory, fsync=True, lock=lock)


def _check_all(storage: FileStorage) -> tuple[list[SegmentCheck], list[str], int | None]:
    """Check every segment; return the checks, the problems, and the index of the first
    segment that cannot stay as it is (a bad segment, or the later side of a gap)."""
    checks: list[SegmentCheck] = []
    problems: list[str] = []
    first_bad = None
    for base in storage.list_bases():
        check, _index = check_segment(storage, base)
        # After a damaged segment its end says nothing about where the next should start.
        if checks and checks[-1].ok and base != checks[-1].end:
            prev = checks[-1]
            problems.append(f"{check.path} starts at position {base} but {prev.path} ends at {prev.end}")
            if first_bad is None:
                first_bad = len(checks)
        if check.problem is not None:
            at = 0 if check.header_problem else check.valid_bytes
            problems.append(f"{check.path}: {check.problem} at offset {at} (position {check.end})")
            if first_bad is None:
                first_bad = len(checks)
        checks.append(check)
    return checks, problems, first_bad


def verify(directory: str | os.PathLike[str]) -> VerifyReport:
    """Check every segment and record; change nothing."""
    storage = _open_storage(directory, lock=False)
    try:
        checks, problems, _ = _check_all(storage)
    finally:
        storage.close()
    last = next((c.last_position for c in reversed(checks) if c.last_position is not None), None)
    return VerifyReport(
        directory=str(directory),
        segments=tuple(checks),
        records=sum(c.records for c in checks),
        first_position=checks[0].base if checks else None,
        last_position=last,
        end=checks[-1].end if checks else None,
        problems=tuple(problems),
    )


def repair(directory: str | os.PathLike[str], logger: logging.Logger | None = None) -> RepairReport:
    """Truncate the log at its first invalid record and remove every later segment."""
    log = logger or logger_default
    storage = _open_storage(directory, lock=True)
    try:
        checks, problems, first_bad = _check_all(storage)
        if first_bad is None:
            return RepairReport(str(directory), None)
        bad = checks[first_bad]
        if bad.unsupported:
            raise JournalError(f"{bad.path}: {bad.problem}; written by a newer conveyor, repair refuses to touch it")
        gap = first_bad > 0 and bad.base != checks[first_bad - 1].end
        later = checks[first_bad + 1 :]
        # Remove the newest first: a crash part-way leaves a log that repair can finish.
        for check in reversed(later):
            storage.remove(check.base)
        dropped = sum(c.size for c in later)
        records = sum(c.records for c in later)
        if gap:
            prev = checks[first_bad - 1]
            storage.remove(bad.base)
            report = RepairReport(
                str(directory), problems[0], prev.path, prev.size, prev.end,
                dropped + bad.size, records + bad.records,
                tuple(c.path for c in [bad, *later]),
            )
        elif bad.header_problem:
            storage.create_empty(bad.base)
            report = RepairReport(
                str(directory), problems[0], bad.path, 0, bad.base,
                dropped + bad.size - min(bad.size, FILE_HEADER_LEN), records,
                tuple(c.path for c in later),
            )
        else:
            # The record at valid_bytes is the bad one; count what checked out behind it.
            after, _ = probe_after(storage, bad.base, bad.valid_bytes, bad.size)
            storage.truncate(bad.base, bad.valid_bytes)
            report = RepairReport(
                str(directory), problems[0], bad.path, bad.valid_bytes, bad.end,
                dropped + bad.bytes_after, records + after,
                tuple(c.path for c in later),
            )
        log.warning("%s", report.describe())
        return report
    finally:
        storage.close()


def dump(directory: str | os.PathLike[str], start: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(position, payload)`` of every record ``Journal.open`` would keep, from ``start``.

    Read-only. A torn tail of the last segment ends the dump quietly (it is what
    recovery would truncate); damage anywhere else raises JournalCorrupt.
    """
    storage = _open_storage(directory, lock=False)
    try:
        bases = storage.list_bases()
        prev_end = None
        for i, base in enumerate(bases):
            if prev_end is not None and base != prev_end:
                raise JournalCorrupt(
                    f"{storage.path(base)} starts at position {base}, the previous segment ends at {prev_end}",
                    path=storage.path(base), offset=0, position=prev_end,
                )
            last = i == len(bases) - 1
            size = storage.size(base)
            _, problem = decode_header(storage.pread(base, 0, FILE_HEADER_LEN))
            if problem is not None:
                check, _ = check_segment(storage, base)
                if last and torn_creation(storage, check):
                    return
                raise corrupt_error(check)
            reader = FrameReader(lambda o, n, b=base: storage.pread(b, o, n), FILE_HEADER_LEN, size)
            shift = base - FILE_HEADER_LEN
            for offset, payload in reader:
                if start is None or shift + offset >= start:
                    yield shift + offset, payload
            if reader.problem is not None and not last:
                check, _ = check_segment(storage, base)
                raise corrupt_error(check)
            prev_end = shift + reader.offset
    finally:
        storage.close()


def scan_segment(path: str | os.PathLike[str], *, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(position, payload)`` of every record of one segment file.

    ``end`` bounds the positions read (pass the journal's ``durable_end`` when reading
    the segment a server is still appending to). An invalid record raises
    JournalCorrupt: a sealed segment has none.
    """
    path = Path(path)
    if parse_segment_name(path.name) is None:
        raise JournalError(f"{path} is not named like a journal segment (<base:020d>.log)")
    try:
        reader = SegmentReader(os.open(path, os.O_RDONLY))
    except OSError as exc:
        raise JournalError(f"cannot open journal segment {path}: {exc.strerror}") from exc
    try:
        base, problem = decode_header(reader.pread(0, FILE_HEADER_LEN))
        if problem is not None:
            raise JournalCorrupt(f"journal segment {path}: {problem}", path=str(path), offset=0)
        size = reader.size()
        limit = size if end is None else min(size, FILE_HEADER_LEN + max(0, end - base))
        frames = FrameReader(reader.pread, FILE_HEADER_LEN, limit)
        shift = base - FILE_HEADER_LEN
        for offset, payload in frames:
            yield shift + offset, payload
        if frames.problem is not None:
            raise JournalCorrupt(
                f"journal segment {path}: {frames.problem} at offset {frames.offset} "
                f"(position {shift + frames.offset})",
                path=str(path), offset=frames.offset, position=shift + frames.offset,
            )
    finally:
        reader.close()
