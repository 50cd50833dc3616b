"""The journal reader over the network: ``conveyor-journal`` with ``server`` instead of a
directory (docs/spark-journal.md, "Over the network").

Rules:

1. **Planned on the driver, from the server's list.** ``journal_segments`` names the
   journal's identity and each segment file with its readable size (bounded by what is
   durable there) and, for a sealed one, its summary; the same pruning as the local
   reader's decides which become partitions (one per segment, as locally).
2. **Read by the executors, from the server.** A partition streams its segment's bytes
   with ``journal_read`` and parses them with the same frame reader as a local file, so
   every frame's CRC32C is verified here, on the executor, after the network.
3. **The snapshot holds across reconnects.** A partition reads ``[base, end)`` as
   planned, from the journal planned against (a read naming another journal is refused by
   the server). A lost connection (a server restart) is retried on a new one, from the
   offset reached, for ``retryTimeout`` seconds; a sealed segment never changes, so the
   records are the same. Past the timeout the task fails and Spark retries it; a segment
   removed by retention fails it at once (``JournalError``), as locally.
4. **No directory, no files.** Nothing here opens a file: the executors need a route to
   the server's client port, nothing else. Summaries are the server's (the reader writes
   none).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from pyspark.sql.datasource import InputPartition

from conveyor import errors
from conveyor.errors import JournalError
from conveyor.journal.format import FILE_HEADER_LEN
from conveyor.journal.index import SegmentSummary, summary_from_json
from conveyor.journal.tools import read_segment
from conveyor.spark.options import ConnectOptions

#: Bytes asked for per ``journal_read`` (the server answers at most its own chunk).
READ_BYTES = 1024 * 1024
T = TypeVar("T")


class PlannedSegment(InputPartition):
    """One segment as planned, wherever it is read from: positions ``[base, end)``, and
    whether it is sealed (else the snapshot of the open one)."""

    def __init__(self, base: int, end: int, sealed: bool) -> None:
        super().__init__(base)
        self.base = base
        self.end = end
        self.sealed = sealed


class RemoteSegment(PlannedSegment):
    """A segment of journal ``journal``, read from ``server``."""

    def __init__(self, server: str, journal: str, base: int, end: int, sealed: bool) -> None:
        super().__init__(base, end, sealed)
        self.server = server
        self.journal = journal


def retrying(call: Callable[[], T], retry_s: float, what: str, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, called again after a lost connection (each call reconnects) until it
    answers or ``retry_s`` seconds have passed since the first failure (rule 3)."""
    deadline = None
    pause = 0.1
    while True:
        try:
            return call()
        except (errors.ConnectionLost, errors.TimedOut) as exc:
            now = clock()
            deadline = now + retry_s if deadline is None else deadline
            if now >= deadline:
                raise JournalError(f"{what}: the server did not answer for {retry_s:g} s (retryTimeout): {exc}") from None
            sleep(pause)
            pause = min(pause * 2, 2.0)


def plan(server: str, connect: ConnectOptions, include_open: bool,
         keeps: Callable[[int, int, SegmentSummary | None], bool], retry_s: float = 60.0) -> list[RemoteSegment]:
    """Rule 1: the partitions of a query, from the server's list of segments."""
    with connect.client(server, client_name="conveyor-journal-plan") as rpc:
        listing = retrying(rpc.journal_segments, retry_s, f"listing the journal of {server}")
    out = []
    for seg in listing.segments:
        if not seg.sealed and not include_open:
            continue
        end = seg.base + seg.size - FILE_HEADER_LEN
        summary = summary_from_json(seg.summary) if seg.summary is not None else None
        if keeps(seg.base, end, summary):
            out.append(RemoteSegment(server, listing.journal, seg.base, end, seg.sealed))
    return out


class _Reads:
    """``read(offset, n)`` of one remote segment for :class:`FrameReader`, reconnecting
    on a lost connection for up to ``retry_s`` (rule 3)."""

    def __init__(self, partition: RemoteSegment, connect: ConnectOptions, retry_s: float) -> None:
        self._p = partition
        self._rpc = connect.client(partition.server, client_name="conveyor-journal-read")
        self._retry_s = retry_s
        self._what = f"journal segment {partition.base} on {partition.server}"

    def __call__(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset``: short only at the segment's readable end."""
        parts = []
        while n > 0:
            data = self._chunk(offset, min(n, READ_BYTES))
            if not data:
                break
            parts.append(data)
            offset += len(data)
            n -= len(data)
        return b"".join(parts)

    def _chunk(self, offset: int, n: int) -> bytes:
        p = self._p
        return retrying(lambda: self._rpc.journal_read(p.base, offset, n, p.journal), self._retry_s, self._what)

    def close(self) -> None:
        self._rpc.close()


def frames(partition: RemoteSegment, connect: ConnectOptions, retry_s: float) -> Iterator[tuple[int, bytes]]:
    """``(position, payload)`` of every record of the partition's range (rule 2): the
    journal's own segment reader over ``journal_read``, so an invalid frame raises
    JournalCorrupt, as for a local file."""
    reads = _Reads(partition, connect, retry_s)
    try:
        yield from read_segment(reads, FILE_HEADER_LEN + partition.end - partition.base,
                                f"journal segment {partition.base} on {partition.server}", base=partition.base)
    finally:
        reads.close()
