"""The journal read over the client port: ``journal_segments`` and ``journal_read``, for
the Spark journal reader with ``server`` (docs/spark-journal.md, "Over the network").

The engine decides who may (``ReadJournal``, engine/entitlements.py) and hands the
command over (``Engine.take_shell_commands``); this part of the server shell does the
file work. Rules:

1. **Off the loop.** Listing and reading segment files happens on a pool of its own
   (:data:`READ_THREADS`), never on the loop nor on the I/O thread that writes and
   syncs the journal: a reader costs the publishers nothing but the disk they share.
2. **Only what is durable.** A segment's readable size is its file size, bounded by the
   journal's ``durable_end`` as it was when the command arrived. A segment is reported
   *sealed* when a newer one exists and all of it is durable: sealed bytes never
   change, so a reader's retry (or a Spark task's) reads the same records.
3. **One journal.** Positions mean something in one journal only: the list names the
   journal's identity, and a read naming another is refused (``journal_error``), so a
   reader that reconnects to another instance or to a new journal fails, never mixes.
4. **Bounded.** A read returns at most :data:`CHUNK_BYTES_MAX` bytes (the reader asks
   again for more), and a connection has at most :data:`IN_FLIGHT_MAX` commands here at
   once; past that it is refused with ``limit_exceeded``, so one client cannot queue unbounded
   work.
5. **Names, not paths.** A segment is named by its first position, and its file is
   derived from it: nothing a client sends becomes a path.
6. Checksums are not verified here: the reader verifies every frame's CRC32C as it
   parses, so damage on disk or on the way is caught where the records are decoded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable
from pathlib import Path

from conveyor import errors
from conveyor.journal.format import FILE_HEADER_LEN
from conveyor.journal.index import load_summary, summary_json
from conveyor.journal.storage import parse_segment_name, segment_name
from conveyor.protocol import messages as m
from conveyor.protocol import replies

READ_THREADS = 2
CHUNK_BYTES_MAX = 4 * 1024 * 1024  # a reply stays far below any client's frame limit
IN_FLIGHT_MAX = 4


class JournalReads:
    def __init__(self, directory: Path | None, journal_id: str, durable_end: Callable[[], int],
                 send: Callable[[int, m.Ack], None]) -> None:
        """``directory``: the journal's (None: the server keeps its journal in memory);
        ``send(conn_id, ack)`` writes a reply to a connection still open."""
        self._directory = directory
        self._journal_id = journal_id
        self._durable_end = durable_end
        self._send = send
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight: dict[int, int] = {}
        self.reads = 0  # journal_read commands answered
        self.bytes_read = 0

    def serve(self, conn_id: int, cmd: m.JournalSegments | m.JournalRead) -> None:
        """Start answering ``cmd`` (on the loop); the reply is sent when the file work is done."""
        if self._directory is None:
            self._fail(conn_id, cmd, errors.JournalError(
                "this server keeps its journal in memory (no TransactionLog): there are no segment files to read"))
            return
        if self._in_flight.get(conn_id, 0) >= IN_FLIGHT_MAX:
            self._fail(conn_id, cmd, errors.LimitExceeded(
                f"at most {IN_FLIGHT_MAX} journal reads of one connection at once: wait for the replies",
                limit="journal_reads_in_flight", max=IN_FLIGHT_MAX))
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="conveyor-journal-read")
        durable = self._durable_end()  # rule 2: read on the loop, as the command arrives
        work = self._segments if isinstance(cmd, m.JournalSegments) else self._read
        self._in_flight[conn_id] = self._in_flight.get(conn_id, 0) + 1
        future = asyncio.get_running_loop().run_in_executor(self._pool, work, cmd, durable)
        future.add_done_callback(lambda f: self._done(conn_id, cmd, f))

    def forget(self, conn_id: int) -> None:
        self._in_flight.pop(conn_id, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _done(self, conn_id: int, cmd: m.JournalSegments | m.JournalRead, future: asyncio.Future) -> None:
        left = self._in_flight.get(conn_id)
        if left is None:
            return  # the connection went away
        self._in_flight[conn_id] = left - 1
        if future.cancelled():
            return
        exc = future.exception()
        if isinstance(exc, errors.ConveyorError):
            self._fail(conn_id, cmd, exc)
        elif exc is not None:
            self._fail(conn_id, cmd, errors.JournalError(f"cannot read the journal: {exc}"))
        else:
            self._send(conn_id, m.Ack(ack_type="processed", cid=cmd.cid, result=future.result()))

    def _fail(self, conn_id: int, cmd: m.JournalSegments | m.JournalRead, exc: errors.ConveyorError) -> None:
        details = {k: v for k, v in exc.details.items() if isinstance(v, (str, int))} or None
        self._send(conn_id, m.Ack(ack_type="processed", cid=cmd.cid, status="failure", reason=str(exc), code=exc.code,
                                  details=details))

    # --- file work, on the pool (rule 1) ------------------------------------------------------

    def _segments(self, cmd: m.JournalSegments, durable: int) -> replies.JournalSegmentsReply:
        assert self._directory is not None
        bases = sorted(b for b in map(parse_segment_name, os.listdir(self._directory)) if b is not None)
        out = []
        for i, base in enumerate(bases):
            path = self._directory / segment_name(base)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue  # removed by retention while listing
            readable = min(size, FILE_HEADER_LEN + max(0, durable - base))
            sealed = i + 1 < len(bases) and readable == size
            summary = load_summary(path) if sealed else None
            out.append(replies.SegmentInfo(base=base, size=readable, sealed=sealed,
                                           summary=summary_json(summary) if summary is not None else None))
        return replies.JournalSegmentsReply(journal=self._journal_id, segments=out)

    def _read(self, cmd: m.JournalRead, durable: int) -> replies.JournalChunk:
        assert self._directory is not None
        if cmd.journal and cmd.journal != self._journal_id:
            raise errors.JournalError(
                f"this server's journal is {self._journal_id}, not {cmd.journal} (the one the read was planned "
                "against): positions differ between journals; plan the query again")
        if cmd.base < 0 or cmd.offset < 0 or cmd.n < 0:
            raise errors.InvalidOption("journal_read: base, offset and n must not be negative", option="n")
        path = self._directory / segment_name(cmd.base)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise errors.JournalError(f"journal segment {cmd.base} does not exist here (removed by retention or "
                                      "repair after the query was planned?)") from None
        try:
            limit = min(os.fstat(fd).st_size, FILE_HEADER_LEN + max(0, durable - cmd.base))
            n = max(0, min(cmd.n, CHUNK_BYTES_MAX, limit - cmd.offset))
            data = os.pread(fd, n, cmd.offset) if n else b""
        finally:
            os.close(fd)
        self.reads += 1
        self.bytes_read += len(data)
        return replies.JournalChunk(data=data)
