"""The background scrub: re-read the journal and check every record's CRC, in small steps.

A sealed segment whose ``.verified`` sidecar still matches is not read at startup
(verified.py), and a record is otherwise read again only when someone needs it. Bit rot
in a record nobody reads would stay hidden until the day a consumer or a replay needs
it. The scrub finds it first: the server walks every segment on disk, oldest first,
one bounded :meth:`Scrubber.step` at a time on its background I/O thread (not the
journal writer's), at a configured rate (``TransactionLog/Scrub``), and starts a new
pass at a configured interval.

Rules:

- A pass covers the segments on disk when it starts (:func:`plan`), each up to its end
  then: the file size of a sealed segment, the durable end of the open one. Records
  appended later are checked by the next pass.
- A step reads at most about ``bytes_max`` bytes (a whole record more at most) through
  a descriptor of its own, so retention may remove a segment under it: a segment that
  is gone when the scrub reaches it is skipped, one removed while it reads is read to
  the end.
- A problem (an invalid record) ends the scrub of that segment and is reported with
  the file, the offset and the position. :func:`forget_verified` then drops the
  segment's ``.verified`` sidecar, so the next start checks it record by record and
  refuses to open it (docs/journal.md, "Recovery") instead of trusting it.
- The scrub never changes the journal: repair stays a person's decision.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .format import FILE_HEADER_LEN, FRAME_HEADER_LEN, FrameReader
from .storage import SegmentReader
from .verified import sidecar_path

if TYPE_CHECKING:
    from .journal import SegmentInfo

#: Bytes one step reads at most (plus the rest of a record that straddles the bound):
#: small enough that a journal write queued behind it on the I/O thread waits little.
SCRUB_STEP_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ScrubTarget:
    path: str
    base: int
    limit: int  # file offset up to which the segment is checked


@dataclass(frozen=True)
class ScrubProblem:
    path: str
    offset: int  # file offset of the invalid record
    position: int
    problem: str

    def describe(self) -> str:
        return f"journal segment {self.path}: {self.problem} at offset {self.offset} (position {self.position})"


@dataclass(frozen=True)
class StepResult:
    bytes: int  # bytes read by the step
    problems: tuple[ScrubProblem, ...] = ()


class Scrubber:
    """One pass over a list of targets; :meth:`step` runs on ONE thread at a time."""

    def __init__(self, targets: list[ScrubTarget]) -> None:
        self._targets = list(targets)
        self._i = 0
        self._offset = FILE_HEADER_LEN
        self._reader: SegmentReader | None = None
        self.bytes_checked = 0
        self.records_checked = 0
        self.problems: list[ScrubProblem] = []

    @property
    def done(self) -> bool:
        return self._i >= len(self._targets)

    def step(self, bytes_max: int = SCRUB_STEP_BYTES) -> StepResult:
        """Check about ``bytes_max`` bytes of records, from where the last step stopped."""
        if self.done:
            return StepResult(0)
        target = self._targets[self._i]
        if self._reader is None:
            try:
                self._reader = SegmentReader(os.open(target.path, os.O_RDONLY))
            except FileNotFoundError:  # removed by retention (or repair) since the pass began
                self._next()
                return StepResult(0)
        start = self._offset
        frames = FrameReader(self._reader.pread, start, target.limit, chunk_bytes=min(bytes_max, 1 << 20))
        for offset, payload in frames:
            self._offset = offset + FRAME_HEADER_LEN + len(payload)
            self.records_checked += 1
            if self._offset - start >= bytes_max:
                break
        else:
            self._offset = frames.offset
        read = self._offset - start
        self.bytes_checked += read
        problems: tuple[ScrubProblem, ...] = ()
        if frames.problem is not None and frames.offset < target.limit:
            found = ScrubProblem(
                target.path, frames.offset, target.base + frames.offset - FILE_HEADER_LEN, frames.problem
            )
            self.problems.append(found)
            problems = (found,)
            self._next()
        elif self._offset >= target.limit:
            self._next()
        return StepResult(read, problems)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _next(self) -> None:
        self.close()
        self._i += 1
        self._offset = FILE_HEADER_LEN


def forget_verified(segment_path: str) -> None:
    """Drop the ``.verified`` sidecar of a segment the scrub found damaged, so the next
    open checks it in full (and refuses it) instead of trusting it."""
    try:
        os.unlink(sidecar_path(segment_path))
    except OSError:
        pass  # gone already, or a read-only directory (reads still check every CRC)


def targets_of(segments: Iterable[SegmentInfo]) -> list[ScrubTarget]:
    """The targets of a pass over ``Journal.segments()`` (loop thread)."""
    return [ScrubTarget(s.path, s.base, FILE_HEADER_LEN + s.end - s.base) for s in segments]

