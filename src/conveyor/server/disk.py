"""The journal's disk, watched while the server runs: free space on its file system
(``FreeSpaceWarning``) and the background scrub that re-reads it (journal/scrub.py).

A part of the server shell with its own state and counters (``ServerStats`` reads
them); it runs on the loop, and its file work on the server's background I/O thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os

from conveyor.config.model import Scrub, TransactionLog
from conveyor.journal import Journal, MemoryJournal
from conveyor.journal.scrub import SCRUB_STEP_BYTES, Scrubber, forget_verified, targets_of

log = logging.getLogger("conveyor.server")

FREE_SPACE_CHECK_INTERVAL_S = 10.0  # statvfs of the journal's file system
FREE_SPACE_REPORT_INTERVAL_S = 300.0  # while space is low, the warning repeats this often


class Disk:
    def __init__(self, tlog: TransactionLog | None, journal: Journal | MemoryJournal,
                 io: concurrent.futures.Executor) -> None:
        self._tlog = tlog
        self.journal = journal
        self._io = io  # the server's background I/O thread: scrub steps, and closing the scrubber after them
        self.free_bytes: int | None = None  # free space of the journal's file system, last checked
        self._checked_at = float("-inf")
        self._warned_at: float | None = None
        self.scrub_passes = 0
        self.scrub_bytes = 0
        self.scrub_problems = 0

    def check_free_space(self, now: float) -> None:
        """Warn while the journal's file system has less free than FreeSpaceWarning: a
        full disk fails the next journal write, and that stops the server."""
        tlog = self._tlog
        if tlog is None or tlog.free_space_warning <= 0:
            return
        if now - self._checked_at < FREE_SPACE_CHECK_INTERVAL_S:
            return
        self._checked_at = now
        try:
            st = os.statvfs(tlog.journal_directory)
        except OSError as exc:
            log.warning("cannot read the free space of %s: %s", tlog.journal_directory, exc)
            return
        free = self.free_bytes = st.f_bavail * st.f_frsize
        if free < tlog.free_space_warning:
            if self._warned_at is None or now - self._warned_at >= FREE_SPACE_REPORT_INTERVAL_S:
                self._warned_at = now
                log.warning(
                    "low free space: the file system of the journal %s has %d bytes free, below "
                    "FreeSpaceWarning (%d bytes); when it is full the next journal write fails and the "
                    "server stops",
                    tlog.journal_directory, free, tlog.free_space_warning,
                )
        elif self._warned_at is not None:
            self._warned_at = None
            log.info("free space of %s is back above FreeSpaceWarning: %d bytes free", tlog.journal_directory, free)

    def _close_on_io(self, scrubber: Scrubber) -> None:
        """Close ``scrubber`` on the background I/O thread, after the step that may still run there:
        a scrub cancelled at shutdown leaves its step running, and closing its file from
        the loop meanwhile raced the step's own close (EBADF, found by the checker), or
        could close a descriptor number the journal had just reused."""
        try:
            self._io.submit(scrubber.close)
        except RuntimeError:  # the thread is gone: nothing runs there any more
            scrubber.close()

    async def scrub(self, scrub: Scrub) -> None:
        """Re-read the journal at ``scrub.bytes_per_s``, a pass every ``scrub.interval_s``
        (journal/scrub.py). A damaged record is logged, counted, and its segment's
        ``.verified`` sidecar dropped, so the next start refuses to open it; the server
        keeps serving (a read of that record fails on its own)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            scrubber = Scrubber(targets_of(self.journal.segments()))
            try:
                while not scrubber.done:
                    t0 = loop.time()
                    result = await loop.run_in_executor(self._io, scrubber.step, SCRUB_STEP_BYTES)
                    self.scrub_bytes += result.bytes
                    for problem in result.problems:
                        self.scrub_problems += 1
                        # Distrusted before it is reported: whoever reads the error (an
                        # operator, a test) finds the segment's .verified sidecar gone.
                        await loop.run_in_executor(self._io, forget_verified, problem.path)
                        log.error(
                            "journal scrub: %s; the records from there on cannot be read, and the next "
                            "start will refuse to open the journal until it is repaired "
                            "(`conveyor journal repair`)",
                            problem.describe(),
                        )
                    await asyncio.sleep(max(0.0, result.bytes / scrub.bytes_per_s - (loop.time() - t0)))
            finally:
                self._close_on_io(scrubber)
            self.scrub_passes += 1
            # A clean pass is debug (each problem was an error above); one that found some, a warning.
            log.log(
                logging.WARNING if scrubber.problems else logging.DEBUG,
                "journal scrub: pass %d checked %d records (%d bytes) in %.1f s, %d problem(s)",
                self.scrub_passes, scrubber.records_checked, scrubber.bytes_checked, loop.time() - started,
                len(scrubber.problems),
            )
            await asyncio.sleep(max(0.0, scrub.interval_s - (loop.time() - started)))
