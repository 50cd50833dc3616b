"""The timer: the engine's deadlines, and the server's periodic work.

One supervised task (:meth:`Housekeeping.run`) wakes at the engine's next deadline
(leases, expiries: ``Engine.tick``) and at least every ``TIMER_PERIOD_S_MAX``, when it
also:

- checks the journal's free space (server/disk.py) and closes the connections whose
  query result stalled (server/output.py);
- sends heartbeats, and closes connections that are dead (silent for two heartbeat
  intervals), idle (``IdleTimeout``: a transport's for every connection on it, else
  ``Limits/IdleTimeout``, 1 hour, for a client that holds no subscription and sends
  nothing) or that did not log on within ``Limits/LogonTimeout``;
- every ``SECURITY_CHECK_S``, reloads what changed of the users file, the certificates
  and the entitlements;
- every ``CHECKPOINT_INTERVAL_S`` while the journal moves, writes the checkpoint
  (``queues.ack``, ``publishers.seq``, snapshots) once the journal is durable up to it,
  saves the verified prefix, then applies retention.

It also checkpoints as soon as the journal has grown by ``<CheckpointSize>`` since the
last checkpoint began (:meth:`Housekeeping.journal_grew`, after each group commit): what
a restart after a crash replays (and re-checks at the journal's open) is then at most
about that much whatever the timing of the crash, not up to 5 s of the fastest
publishing. The queues' snapshots are taken on the loop (a few ms per million queued
messages); their files are written on the background I/O thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from conveyor.journal import verified
from conveyor.protocol import messages as m
from conveyor.protocol.codec import encode_frames
from conveyor.server.checkpoints import write_checkpoint

if TYPE_CHECKING:
    from conveyor.config.model import Limits, TransactionLog
    from conveyor.engine.core import Engine
    from conveyor.journal import Journal
    from conveyor.server.commit import GroupCommit
    from conveyor.server.connection import Connection
    from conveyor.server.disk import Disk
    from conveyor.server.gate import LogonGate
    from conveyor.server.output import OutputBudget

log = logging.getLogger("conveyor.server")

TIMER_PERIOD_S_MAX = 1.0  # housekeeping (heartbeats, idle) runs at least this often
HEARTBEAT_GRACE_FACTOR = 2.0  # a client silent for 2 heartbeat intervals is dead
CHECKPOINT_INTERVAL_S = 5.0  # queues.ack refresh: bounds how much recovery replays
SECURITY_CHECK_S = 2.0  # how often the users file, certificates and entitlements are checked for changes


class Housekeeping:
    def __init__(self, engine: Engine, journal: Journal, tlog: TransactionLog | None, limits: Limits,
                 io: concurrent.futures.Executor, clock: Callable[[], float], connections: dict[int, Connection],
                 disk: Disk, commit: GroupCommit, output: OutputBudget, gate: LogonGate, *,
                 reload_security: Callable[[], None], after_engine: Callable[[], None]) -> None:
        self._engine = engine
        self._journal = journal
        self._tlog = tlog  # None: a journal in memory, no checkpoint
        self._limits = limits
        self._io = io  # the server's background I/O thread (not the journal writer's): checkpoint files
        self._clock = clock
        self._connections = connections  # the server's, read only
        self._disk = disk
        self._commit = commit
        self._output = output
        self._gate = gate
        self._reload_security = reload_security
        self._after_engine = after_engine  # the server's: output, closes, journal writes
        self._wake = asyncio.Event()
        self._at = 0.0  # when the timer wakes next
        # The first periodic checkpoint comes an interval after the start, not at once: the
        # start wrote one (without the queues' snapshots, still valid), and taking and
        # writing a deep queue's snapshot then would delay the first deliveries.
        self._last_checkpoint = clock()
        self._checkpointed_end = -1
        # Where the last checkpoint began (its position): CheckpointSize counts from there.
        self._checkpoint_from = journal.end
        self._checkpoint_bytes = tlog.checkpoint_bytes if tlog is not None else 0
        self._snapshot_bytes = 0  # what the last checkpoint wrote of queue snapshots
        self._last_security_check = 0.0

    def wake(self) -> None:
        """Run now (a heartbeat interval was set)."""
        self._wake.set()

    def journal_grew(self) -> None:
        """After a group commit: wake for a checkpoint once the journal grew by
        CheckpointSize since the last one began."""
        if self._grown():
            self._wake.set()

    def _grown(self) -> bool:
        """The journal grew by CheckpointSize since the last checkpoint began, and by at
        least what that checkpoint wrote of snapshots: checkpoints never write more than
        the journal does (a deep queue's snapshot grows with it)."""
        size = self._checkpoint_bytes
        return bool(size) and self._journal.end - self._checkpoint_from >= max(size, self._snapshot_bytes)

    def wake_by(self, deadline: float | None) -> None:
        """The engine's next deadline may be earlier than the timer's: wake for it."""
        if deadline is not None and deadline < self._at:
            self._at = deadline
            self._wake.set()

    async def run(self) -> None:
        engine = self._engine
        last_housekeeping = 0.0
        while True:
            now = self._clock()
            deadline = engine.next_deadline()
            if (deadline is not None and deadline <= now) or now - last_housekeeping >= TIMER_PERIOD_S_MAX:
                engine.tick(now)
                if now - last_housekeeping >= TIMER_PERIOD_S_MAX:
                    last_housekeeping = now
                    self._sweep(now)
                    if now - self._last_security_check >= SECURITY_CHECK_S:
                        self._last_security_check = now
                        self._reload_security()
                    if now - self._last_checkpoint >= CHECKPOINT_INTERVAL_S:
                        self._last_checkpoint = now
                        await self.checkpoint()
                self._after_engine()
                deadline = engine.next_deadline()
            if self._grown():
                self._last_checkpoint = now
                await self.checkpoint()
                self._after_engine()
                deadline = engine.next_deadline()
            wait = TIMER_PERIOD_S_MAX if deadline is None else max(0.0, min(TIMER_PERIOD_S_MAX, deadline - now))
            self._at = now + wait
            self._wake.clear()
            try:
                async with asyncio.timeout(wait):  # not wait_for: it can drop stop()'s cancellation
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def checkpoint(self, *, final: bool = False) -> None:
        """Write queues.ack / publishers.seq once durable, then apply retention."""
        tlog = self._tlog
        if tlog is None:
            return
        journal = self._journal
        if not final and journal.end == self._checkpointed_end:
            return
        cp = self._engine.checkpoint()
        self._checkpoint_from = cp.position
        if final:
            await self._commit.write_unapplied()  # the writer is gone: a disconnect may have appended
        else:
            await self._commit.wait_durable(cp.position)  # the writer signals it; a failure raises
        loop = asyncio.get_running_loop()
        try:
            self._snapshot_bytes = await loop.run_in_executor(self._io, write_checkpoint, tlog.journal_directory, cp)
        except OSError as exc:
            log.error("could not write the checkpoint in %s: %s", tlog.journal_directory, exc)
            return
        self._checkpointed_end = cp.position
        prefix = journal.prefix_to_save()  # journal/verified.py: a restart skips re-checking it
        if prefix is not None:
            await loop.run_in_executor(self._io, verified.save_prefix, *prefix)
        retention = tlog.retention
        if retention.max_age_s is not None or retention.max_bytes is not None:
            removed = journal.apply_retention(
                keep_from=self._engine.retention_floor(cp),
                max_age_s=retention.max_age_s,
                max_bytes=retention.max_bytes,
                now=self._clock(),
            )
            for seg in removed:
                log.info("retention removed journal segment %s", seg.path)

    def _sweep(self, now: float) -> None:
        """Free space, stalled queries, heartbeats, dead, idle and logon timeouts."""
        self._disk.check_free_space(now)
        self._output.close_stalled(now)
        limits = self._limits
        beats = []
        for conn in list(self._connections.values()):
            if conn.heartbeat_s:
                if now - conn.last_heard > conn.heartbeat_s * HEARTBEAT_GRACE_FACTOR:
                    conn.close(f"no heartbeat for {now - conn.last_heard:.1f} s")
                    continue
                if conn.beat_due(now):
                    beats.append(conn)
            idle = conn.config.idle_timeout_s
            if idle is None and conn.client and not self._engine.subscribed(conn.conn_id):
                idle = limits.idle_timeout_s  # a quiet subscriber is not idle
            if idle and now - conn.last_heard > idle:
                conn.close(f"idle for {now - conn.last_heard:.1f} s")
            elif self._gate.waiting_for_logon(conn) and now - conn.connected_at > limits.logon_timeout_s:
                conn.close(f"no logon within {limits.logon_timeout_s:g} s (Limits/LogonTimeout)")
        for conn in beats:
            conn.write_frames(encode_frames([m.ServerHeartbeat()]))
