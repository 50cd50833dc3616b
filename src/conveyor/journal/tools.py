"""Offline tools over a journal directory, for the CLI and the Spark reader.

- :func:`verify` reads everything and changes nothing; it takes no lock, so it runs
  beside a live server (``conveyor journal verify`` is the operator's scrub). A torn
  tail of the last segment (what a write in progress, or a crash, leaves: the next
  start trims it) is a note, not a problem; damage anywhere else is a problem.
- :func:`plan_repair` says what :func:`repair` would do, changing nothing.
- :func:`repair` takes the directory lock, truncates the log at its first invalid
  record wherever it is, removes every later segment, and reports exactly that.
- :func:`dump` yields the records that ``Journal.open`` would keep.
- :func:`scan_segment` reads one segment file on its own (one Spark partition).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from conveyor.errors import JournalCorrupt, JournalError

from . import verified
from .format import FILE_HEADER_LEN, FrameReader, decode_header
from .recovery import (
    SegmentCheck,
    check_segment,
    corrupt_error,
    logger_default,
    probe_after,
    tail_damage,
    torn_creation,
)
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
    notes: tuple[str, ...] = ()  # a torn tail: not damage (the next start trims it)

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
        lines += [f"note: {n}" for n in self.notes]
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
    applied: bool = True  # False: a plan (plan_repair); nothing was changed

    @property
    def repaired(self) -> bool:
        return self.problem is not None and self.applied

    def describe(self) -> str:
        if self.problem is None:
            return f"journal {self.directory}: nothing to repair"
        if self.applied:
            removed = f", removed {len(self.segments_removed)} later segment(s)" if self.segments_removed else ""
            return (
                f"journal {self.directory}: {self.problem}; kept the log up to position "
                f"{self.position} ({self.path} truncated at offset {self.offset}){removed}; dropped "
                f"{self.bytes_dropped} bytes, among them {self.records_dropped} record(s) that still checked out"
            )
        removed = "".join(f"\n  remove {path}" for path in self.segments_removed)
        return (
            f"journal {self.directory}: {self.problem}\n"
            f"repair would keep the log up to position {self.position} and drop everything after it:\n"
            f"  truncate {self.path} at offset {self.offset}{removed}\n"
            f"  {self.bytes_dropped} bytes dropped, among them {self.records_dropped} record(s) that still "
            "check out (they were valid, and are lost)\n"
            "nothing was changed; run again with --apply to do it"
        )

    __str__ = describe


def _open_storage(directory: str | os.PathLike[str], *, lock: bool) -> FileStorage:
    if not Path(directory).is_dir():
        raise JournalError(f"journal directory {directory} does not exist")
    return FileStorage(directory, fsync=True, lock=lock)


@dataclass(frozen=True)
class _Finding:
    index: int  # the segment (in list order) that cannot stay as it is
    kind: str  # "gap", "damage", "torn" (a torn tail), "short" (shorter than its durable prefix)
    text: str


def _check_all(storage: FileStorage) -> tuple[list[SegmentCheck], list[_Finding]]:
    """Check every segment; return the checks and what is wrong, in log order."""
    checks: list[SegmentCheck] = []
    findings: list[_Finding] = []
    bases = storage.list_bases()
    for i, base in enumerate(bases):
        check, _index = check_segment(storage, base)
        last = i == len(bases) - 1
        # After a damaged segment its end says nothing about where the next should start.
        if checks and checks[-1].ok and base != checks[-1].end:
            prev = checks[-1]
            findings.append(_Finding(len(checks), "gap", f"{check.path} starts at position {base} but {prev.path} ends at {prev.end}"))
        durable_bytes = _durable_bytes(storage, base) if last else FILE_HEADER_LEN
        if check.problem is not None:
            at = 0 if check.header_problem else check.valid_bytes
            where = f"{check.path}: {check.problem} at offset {at} (position {check.end})"
            why = None
            if not last:
                why = "a sealed segment"
            elif not check.unsupported:
                why = tail_damage(storage, check, durable_bytes)
            if why is None and not check.unsupported:
                findings.append(_Finding(len(checks), "torn", f"{where}: a torn last write (the next start trims it)"))
            else:
                findings.append(_Finding(len(checks), "damage", f"{where}{f'; {why}' if why else ''}"))
        elif last and check.size < durable_bytes:
            findings.append(_Finding(
                len(checks), "short",
                f"{check.path} is {check.size} bytes, shorter than the durable end recorded at the last "
                f"checkpoint (offset {durable_bytes}): acknowledged records are missing",
            ))
        checks.append(check)
    return checks, findings


def _durable_bytes(storage: FileStorage, base: int) -> int:
    claim = verified.read_prefix(storage.path(base), base)
    return claim.valid_bytes if claim is not None else FILE_HEADER_LEN


def verify(directory: str | os.PathLike[str]) -> VerifyReport:
    """Check every segment and record; change nothing."""
    storage = _open_storage(directory, lock=False)
    try:
        checks, findings = _check_all(storage)
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
        problems=tuple(f.text for f in findings if f.kind != "torn"),
        notes=tuple(f.text for f in findings if f.kind == "torn"),
    )


def plan_repair(directory: str | os.PathLike[str]) -> RepairReport:
    """What :func:`repair` would drop, with ``applied=False``; changes nothing."""
    return repair(directory, apply=False)


def repair(
    directory: str | os.PathLike[str], logger: logging.Logger | None = None, *, apply: bool = True
) -> RepairReport:
    """Truncate the log at its first invalid record and remove every later segment
    (``apply=False``: only say so)."""
    log = logger or logger_default
    storage = _open_storage(directory, lock=True)
    try:
        checks, findings = _check_all(storage)
        if not findings:
            return RepairReport(str(directory), None)
        first = findings[0]
        bad = checks[first.index]
        if bad.unsupported:
            raise JournalError(f"{bad.path}: {bad.problem}; written by a newer conveyor, repair refuses to touch it")
        later = checks[first.index + 1 :]
        dropped = sum(c.size for c in later)
        records = sum(c.records for c in later)
        removed = tuple(c.path for c in later)
        if first.kind == "gap":
            prev = checks[first.index - 1]
            report = RepairReport(
                str(directory), first.text, prev.path, prev.size, prev.end,
                dropped + bad.size, records + bad.records, (bad.path, *removed), apply,
            )
        elif first.kind == "short":
            report = RepairReport(str(directory), first.text, bad.path, bad.size, bad.end, 0, 0, removed, apply)
        elif bad.header_problem:
            report = RepairReport(
                str(directory), first.text, bad.path, 0, bad.base,
                dropped + bad.size - min(bad.size, FILE_HEADER_LEN), records, removed, apply,
            )
        else:
            # The record at valid_bytes is the bad one; count what checked out behind it.
            after, _ = probe_after(storage, bad.base, bad.valid_bytes, bad.size)
            report = RepairReport(
                str(directory), first.text, bad.path, bad.valid_bytes, bad.end,
                dropped + bad.bytes_after, records + after, removed, apply,
            )
        if not apply:
            return report
        # Remove the newest first: a crash part-way leaves a log that repair can finish.
        for check in reversed(later):
            storage.remove(check.base)
        if first.kind == "gap":
            storage.remove(bad.base)
        elif first.kind == "short":
            verified.remove(bad.path)  # the shorter log is accepted: forget the durable end
        elif bad.header_problem:
            storage.create_empty(bad.base)
        else:
            storage.truncate(bad.base, bad.valid_bytes)
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
            reader = FrameReader(partial(storage.pread, base), FILE_HEADER_LEN, size)
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
        yield from read_segment(reader.pread, reader.size(), f"journal segment {path}", end=end, path=str(path))
    finally:
        reader.close()


def read_segment(read: Callable[[int, int], bytes], size: int, where: str, *, end: int | None = None,
                 base: int | None = None, **details: object) -> Iterator[tuple[int, bytes]]:
    """``(position, payload)`` of every record of one segment read through ``read(offset,
    n)``: a file's ``pread``, or a server's ``journal_read`` (the Spark journal reader).
    ``size``: the bytes readable; ``end`` bounds the positions. The header is checked
    (and must name ``base`` when given) and so is every frame's CRC: the first invalid one
    raises JournalCorrupt naming ``where``, with ``details``."""
    found, problem = decode_header(read(0, FILE_HEADER_LEN))
    if problem is not None:
        raise JournalCorrupt(f"{where}: {problem}", offset=0, **details)
    if base is not None and found != base:
        raise JournalCorrupt(f"{where}: its header names base {found}, not {base}", offset=0, **details)
    assert found is not None  # decode_header gives a base exactly when there is no problem
    limit = size if end is None else min(size, FILE_HEADER_LEN + max(0, end - found))
    frames = FrameReader(read, FILE_HEADER_LEN, limit)
    shift = found - FILE_HEADER_LEN
    for offset, payload in frames:
        yield shift + offset, payload
    if frames.problem is not None:
        raise JournalCorrupt(
            f"{where}: {frames.problem} at offset {frames.offset} (position {shift + frames.offset})",
            offset=frames.offset, position=shift + frames.offset, **details,
        )
