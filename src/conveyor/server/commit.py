"""The group commit: the journal writer, the waits for durability, and its statistics.

The engine appends records to the journal's buffer on the loop thread. The writer takes
everything buffered, writes and fsyncs it on the server's one I/O thread (one write and
one fsync per group) while the loop keeps reading, then calls ``engine.on_durable`` and
releases whoever waits for the journal to be durable that far (:meth:`GroupCommit.wait_durable`,
the checkpoint). A failed write or fsync ends the writer with its exception, and
supervision fails the server (server/supervisor.py), which fails every wait.

The statistics (:class:`CommitStats`) are for the admin interface (``/metrics``, the
statistics tree, the dashboard's commit card).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor import errors
    from conveyor.engine.core import Engine
    from conveyor.journal import Journal
    from conveyor.server.io_thread import IoThread
    from conveyor.server.pacing import InputPacing
    from conveyor.server.supervisor import Supervisor

STOP_GROUPS_MAX = 16  # groups written and applied at shutdown before the rest is only written


class GroupCommit:
    """The journal writer (:meth:`run`, a supervised task) and the durability waits."""

    def __init__(self, journal: Journal, io: IoThread, engine: Engine,
                 clock: Callable[[], float], supervisor: Supervisor, pacing: InputPacing, *,
                 flush_interval_s: float, after_engine: Callable[[], None],
                 flush_output: Callable[[], None]) -> None:
        self._journal = journal
        self._io = io  # the server's one I/O thread: writes in submission order
        self._engine = engine
        self._clock = clock
        self._supervisor = supervisor
        self._pacing = pacing  # reading resumes as the backlog shrinks
        self._flush_interval_s = flush_interval_s
        self._after_engine = after_engine  # the server's: output, closes, timers after each group
        self._flush_output = flush_output
        self._wake = asyncio.Event()
        # (position, future) of everyone waiting for the journal to be durable that far;
        # the writer releases them, a failure fails them.
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self.commits = 0  # groups written and fsynced
        self.stats = CommitStats()  # latency and sizes (the admin interface)

    def wake(self) -> None:
        """Something was appended: the writer takes it (now, or after FlushInterval)."""
        self._wake.set()

    async def run(self) -> None:
        """Write and fsync each group, then release what waited for it. Returns once the
        server is stopping (stop() writes what is left); an exception (a failed write or
        fsync) ends it, and supervision fails the server."""
        supervisor = self._supervisor
        while True:
            if not supervisor.stopping:
                await self._wake.wait()
                if self._flush_interval_s and not supervisor.stopping:
                    await asyncio.sleep(self._flush_interval_s)
            self._wake.clear()
            if supervisor.stopping:
                return  # stop() drains the journal itself, bounded
            if not await self._write_group():
                continue
            self._pacing.journal_written()
            self._after_engine()

    async def _write_group(self) -> bool:
        """Write what is buffered on the I/O thread and apply it; False when nothing was."""
        journal = self._journal
        batch = journal.take_batch()
        if batch is None:
            return False
        started = time.perf_counter()
        end = await self._io.call(journal.write_batch, batch)
        self.stats.add(time.perf_counter() - started, batch.bytes, batch.records)
        journal.mark_durable(end)
        self.commits += 1
        self._release()
        self._engine.on_durable(self._clock())
        return True

    async def drain(self) -> None:
        """At shutdown, after the writer returned: write what was appended since (the
        connections' ends). Applying a group may append more (expiries, replication
        bookkeeping), so after STOP_GROUPS_MAX groups the rest is written without
        being applied: shutdown never waits for an engine that keeps appending."""
        for _ in range(STOP_GROUPS_MAX):
            if not await self._write_group():
                return
            self._flush_output()
        await self.write_unapplied()

    async def write_unapplied(self) -> None:
        """At shutdown: make everything appended so far durable, without applying it."""
        batch = self._journal.take_batch()
        if batch is not None:
            end = await self._io.call(self._journal.write_batch, batch)
            self._journal.mark_durable(end)

    async def wait_durable(self, position: int) -> None:
        """Return once the journal is durable up to ``position``; raise ServerFailed if
        the server fails first (the writer will never get there)."""
        while self._journal.durable_end < position:
            if self._supervisor.failure is not None:
                raise self._supervisor.failure
            # What is to be durable may have been appended by the caller itself (the
            # timer's tick, just before a checkpoint): make sure the writer knows.
            self._wake.set()
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append((position, fut))
            await fut

    def _release(self) -> None:
        end = self._journal.durable_end
        waiting = []
        for position, fut in self._waiters:
            if position > end:
                waiting.append((position, fut))
            elif not fut.done():
                fut.set_result(None)
        self._waiters = waiting

    def fail_waiters(self, failure: errors.ServerFailed) -> None:
        """The server failed: every wait for durability raises ``failure``."""
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(failure)


class CommitStats:
    """Group commits, for the admin interface: how long each write + fsync took (seconds;
    ``buckets[i]`` counts the commits whose time fell in ``COMMIT_SECONDS_BUCKETS[i]``
    and no lower bucket) and how big each group was. A few additions per group, off the
    per-message path."""

    __slots__ = ("count", "seconds_sum", "seconds_max", "last_seconds", "bytes_sum", "records_sum",
                 "bytes_max", "records_max", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.seconds_sum = self.seconds_max = self.last_seconds = 0.0
        self.bytes_sum = self.records_sum = self.bytes_max = self.records_max = 0
        self.buckets = [0] * len(COMMIT_SECONDS_BUCKETS)

    def add(self, seconds: float, size: int, records: int) -> None:
        self.count += 1
        self.last_seconds = seconds
        self.seconds_sum += seconds
        if seconds > self.seconds_max:
            self.seconds_max = seconds
        self.bytes_sum += size
        self.records_sum += records
        if size > self.bytes_max:
            self.bytes_max = size
        if records > self.records_max:
            self.records_max = records
        for i, bound in enumerate(COMMIT_SECONDS_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
                break


#: Upper bounds (seconds) of the group-commit latency histogram.
COMMIT_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
