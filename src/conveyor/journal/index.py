"""Segment summaries: a small sidecar file per sealed segment, for pruning readers.

``<segment>.log.summary`` (JSON) says what one SEALED segment holds: its positions,
record count, publish-time range and the sets of ops, topics, queues, publishers and
consumers in it. The Spark journal reader (conveyor.spark.journal_source) uses it to
skip segments a filter cannot match. Rules:

- **Layering.** The journal does not know what its records mean. The content of a
  summary comes from a ``describe(payload) -> (op, ts, topic, queue, publisher,
  consumer)`` callable the caller passes in (conveyor.records.facts).
- **Never trusted blindly.** A summary is used only when it matches its segment: same
  base, file size and mtime, and the same length and CRC in the first and last frame
  headers (re-read from the segment at every check). Sealed segments change only by
  ``journal repair`` (truncation, header rewrite, removal) or retention (removal), and
  a segment created later under the same name differs in mtime. A summary that does
  not match is ignored, so a stale sidecar costs a rescan, never a dropped row.
- **Best effort.** Writes are atomic (temporary file + rename) and a failure to write
  (read-only directory) is not an error: readers compute what is missing.
- **Bounded.** A set with more than :data:`SET_MAX` members is stored as ``null``:
  "unknown", which prunes nothing.
- Sidecars whose segment is gone (retention, repair) are ignored, and removed by
  :func:`remove_orphans` (the server runs it when it writes a summary).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import msgspec

from .files import write_atomic
from .format import FILE_HEADER_LEN, FRAME_HEADER_LEN, frame_crc, unpack_frame_header
from .storage import parse_segment_name
from .tools import scan_segment

SUMMARY_SUFFIX = ".summary"
_STOP_CHECK_RECORDS = 4096  # records between two looks at whether the summarizer was closed

#: Version 1: the fields of :class:`SegmentSummary`. A reader ignores other versions.
SUMMARY_VERSION = 1

#: Largest set kept per field; a segment with more distinct values stores null.
SET_MAX = 1024

#: ``describe(payload) -> (op, ts, topic, queue, publisher, consumer)``
Describe = Callable[[bytes], tuple[str, float | None, str | None, str | None, int | None, str | None]]

log = logging.getLogger("conveyor.journal.index")


class SegmentSummary(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    base: int  # position of the first record (the segment's name)
    end: int  # position after the last record
    size: int  # file size, header included
    mtime_ns: int
    records: int
    first_frame: tuple[int, int] | None  # (length, crc) of the first frame; None if empty
    last_position: int | None
    last_frame: tuple[int, int] | None
    ts_min: float | None  # publish timestamps (epoch seconds); None: no publish
    ts_max: float | None
    ops: dict[str, int]  # op -> record count
    topics: list[str] | None  # None: more than SET_MAX (unknown)
    queues: list[str] | None
    publishers: list[int] | None
    consumers: list[str] | None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SegmentSummary)


def summary_path(segment_path: str | os.PathLike[str]) -> str:
    return os.fspath(segment_path) + SUMMARY_SUFFIX


class SummaryBuilder:
    """Accumulates a summary over the records of one segment, in order."""

    def __init__(self, describe: Describe) -> None:
        self._describe = describe
        self.records = 0
        self.first: tuple[int, bytes] | None = None
        self.last: tuple[int, bytes] | None = None
        self.ts_min: float | None = None
        self.ts_max: float | None = None
        self.ops: dict[str, int] = {}
        self.sets: dict[str, set[str | int] | None] = {"topics": set(), "queues": set(), "publishers": set(), "consumers": set()}

    def add(self, position: int, payload: bytes) -> None:
        op, ts, topic, queue_, publisher, consumer = self._describe(payload)
        if self.first is None:
            self.first = (position, payload)
        self.last = (position, payload)
        self.records += 1
        self.ops[op] = self.ops.get(op, 0) + 1
        if ts is not None:
            if self.ts_min is None or ts < self.ts_min:
                self.ts_min = ts
            if self.ts_max is None or ts > self.ts_max:
                self.ts_max = ts
        for name, value in (("topics", topic), ("queues", queue_), ("publishers", publisher), ("consumers", consumer)):
            if value is not None:
                members = self.sets[name]
                if members is not None and value not in members:
                    members.add(value)
                    if len(members) > SET_MAX:
                        self.sets[name] = None

    def finish(self, base: int, size: int, mtime_ns: int) -> SegmentSummary:
        def frame(entry: tuple[int, bytes] | None) -> tuple[int, int] | None:
            return None if entry is None else (len(entry[1]), frame_crc(len(entry[1]), entry[1]))

        def members(name: str) -> list[str | int] | None:
            s = self.sets[name]
            return None if s is None else sorted(s)

        return SegmentSummary(
            version=SUMMARY_VERSION, base=base, end=base + size - FILE_HEADER_LEN, size=size, mtime_ns=mtime_ns,
            records=self.records, first_frame=frame(self.first),
            last_position=None if self.last is None else self.last[0], last_frame=frame(self.last),
            ts_min=self.ts_min, ts_max=self.ts_max, ops=self.ops,
            # Each set holds one field of Describe's tuple: the publishers ints, the rest strings.
            topics=cast("list[str] | None", members("topics")), queues=cast("list[str] | None", members("queues")),
            publishers=cast("list[int] | None", members("publishers")),
            consumers=cast("list[str] | None", members("consumers")),
        )


class SummaryStopped(Exception):
    """A summary given up because its summarizer was closed (:meth:`SealSummarizer.close`)."""


def summarize_segment(segment_path: str | os.PathLike[str], describe: Describe,
                      stopped: Callable[[], bool] | None = None) -> SegmentSummary:
    """Read one sealed segment and summarize it. Raises if it changed meanwhile, and
    SummaryStopped when ``stopped()`` says so (asked every few thousand records)."""
    base = _base_of(segment_path)
    before = os.stat(segment_path)
    builder = SummaryBuilder(describe)
    for position, payload in scan_segment(segment_path):
        builder.add(position, payload)
        if stopped is not None and not builder.records % _STOP_CHECK_RECORDS and stopped():
            raise SummaryStopped(segment_path)
    after = os.stat(segment_path)
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise OSError(f"{segment_path} changed while it was summarized")
    return builder.finish(base, before.st_size, before.st_mtime_ns)


def summary_json(summary: SegmentSummary) -> bytes:
    """The summary as the sidecar holds it (and as ``journal_segments`` sends it)."""
    return _encoder.encode(summary)


def summary_from_json(data: bytes) -> SegmentSummary:
    return _decoder.decode(data)


def write_summary(segment_path: str | os.PathLike[str], summary: SegmentSummary) -> bool:
    """Write the sidecar atomically; False (and nothing written) if that fails."""
    try:
        # Not durable: a lost or stale summary only costs the reader a rescan.
        write_atomic(summary_path(segment_path), summary_json(summary), durable=False)
        return True
    except OSError:
        return False


def load_summary(segment_path: str | os.PathLike[str]) -> SegmentSummary | None:
    """The sidecar of ``segment_path`` if it exists and matches the segment, else None."""
    try:
        with open(summary_path(segment_path), "rb") as f:
            summary = summary_from_json(f.read())
        if summary.version != SUMMARY_VERSION or summary.base != _base_of(segment_path):
            return None
        fd = os.open(segment_path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if (st.st_size, st.st_mtime_ns) != (summary.size, summary.mtime_ns):
                return None
            if summary.end != summary.base + st.st_size - FILE_HEADER_LEN:
                return None
            if summary.records:
                if summary.last_position is None or summary.first_frame is None or summary.last_frame is None:
                    return None  # counts records but names no frames: it does not match
                first = _frame_header(fd, FILE_HEADER_LEN)
                last = _frame_header(fd, FILE_HEADER_LEN + summary.last_position - summary.base)
                if first != tuple(summary.first_frame) or last != tuple(summary.last_frame):
                    return None
            elif st.st_size != FILE_HEADER_LEN:
                return None
        finally:
            os.close(fd)
        return summary
    except (OSError, ValueError, TypeError, msgspec.DecodeError):
        return None


def remove_orphans(directory: str | os.PathLike[str]) -> list[str]:
    """Remove the sidecars whose segment no longer exists; return their names."""
    names = set(os.listdir(directory))
    removed = []
    for name in names:
        if name.endswith(SUMMARY_SUFFIX) and name[: -len(SUMMARY_SUFFIX)] not in names:
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


class SealSummarizer:
    """Set as ``Journal.on_seal``: summarizes each segment once it is sealed and durable.

    ``on_seal`` runs on the loop thread after the write that made the segment's last
    record durable, so the file already has its final size: nothing to wait for.
    ``background``: the server's; each summary is made on a thread of the summarizer's
    own, one after the other. Not on the server's I/O thread: a summary reads its whole
    segment (about ten seconds for a segment of a gigabyte), and every journal write
    queued behind it would wait that long, and with them every durable reply (a Spark
    source's lease stalled for 11-25 s at each seal). Without it the summary is written
    at once, on the calling thread (tools and tests). :meth:`close` stops a summary
    under way at its next few thousand records. Summaries are an optimisation: any
    failure is logged and skipped.
    """

    def __init__(self, describe: Describe, *, background: bool = False) -> None:
        self._describe = describe
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="journal-summary") if background else None
        self._closed = False

    def __call__(self, path: str, base: int, end: int) -> None:
        size = FILE_HEADER_LEN + end - base
        if self._pool is None:
            self.summarize(path, size)
        elif not self._closed:
            self._pool.submit(self.summarize, path, size)

    def close(self) -> None:
        """Stop: the summary under way gives up (its segment is summarized again by
        whoever reads it), the queued ones are dropped; returns once the thread is idle."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _stopped(self) -> bool:
        return self._closed

    def summarize(self, path: str, size: int) -> bool:
        """Write the summary of the sealed segment ``path`` of ``size`` bytes; False when
        the file is not that segment any more (repaired or removed meanwhile)."""
        try:
            if os.stat(path).st_size != size:
                return False
            summary = summarize_segment(path, self._describe, self._stopped)
            if summary.size != size:
                return False
            ok = write_summary(path, summary)
            remove_orphans(os.path.dirname(path))
            return ok
        except SummaryStopped:
            return False
        except Exception as exc:  # noqa: BLE001 (an optimisation must not stop the server)
            log.warning("could not summarize journal segment %s: %s", path, exc)
            return False


def _base_of(segment_path: str | os.PathLike[str]) -> int:
    base = parse_segment_name(Path(segment_path).name)
    if base is None:
        raise ValueError(f"{segment_path} is not named like a journal segment")
    return base


def _frame_header(fd: int, offset: int) -> tuple[int, int] | None:
    data = os.pread(fd, FRAME_HEADER_LEN, offset)
    return tuple(unpack_frame_header(data, 0)) if len(data) == FRAME_HEADER_LEN else None

