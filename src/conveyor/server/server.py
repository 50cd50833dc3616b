"""The server: a thin asyncio shell around the engine.

It owns the sockets, the clock and the journal's disk writes; every decision is the
engine's. The shape of one turn:

1. a connection's bytes arrive -> the codec decodes whole frames -> ``engine.handle``;
2. records the engine appended sit in the journal's buffer; the **group-commit writer**
   takes everything buffered, writes and fsyncs it in one worker thread (one write and
   one fsync per group) while the loop keeps reading, then calls ``engine.on_durable``;
3. after each step the engine's output is taken and written as one frame per connection.

Protection: frames over ``MaxFrameSize`` are refused before buffering (codec); a
connection whose unsent output passes ``SlowClientDisconnectThreshold`` is closed with a
logged reason; reading pauses while the journal has more than
``journal_backlog_bytes_max`` unwritten, so a fast publisher cannot grow memory without
bound; heartbeats and idle timeouts close dead connections; shutdown flushes the journal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import Callable

from conveyor import errors
from conveyor.config.model import Config, Transport
from conveyor.engine.core import Engine
from conveyor.records.facts import describe_record
from conveyor.journal import Journal, MemoryJournal
from conveyor.journal import verified
from conveyor.journal.index import SealSummarizer
from conveyor.protocol import messages as m
from conveyor.protocol.codec import CommandDecoder, Rejected, encode_frames
from conveyor.protocol.options import parse_options
from conveyor.server.checkpoints import page_files, read_checkpoint, with_snapshots, write_checkpoint

log = logging.getLogger("conveyor.server")

JOURNAL_BACKLOG_BYTES_MAX = 64 * 1024 * 1024  # unwritten journal bytes before reads pause
TIMER_PERIOD_S_MAX = 1.0  # housekeeping (heartbeats, idle) runs at least this often
HEARTBEAT_GRACE_FACTOR = 2.0  # a client silent for 2 heartbeat intervals is dead
CHECKPOINT_INTERVAL_S = 5.0  # queues.ack refresh: bounds how much recovery replays


@dataclass
class ServerStats:
    connections: int
    frames_in: int
    commits: int
    journal_end: int
    journal_durable_end: int


class Connection(asyncio.Protocol):
    def __init__(self, server: "Server", transport_config: Transport) -> None:
        self.server = server
        self.config = transport_config
        self.decoder = CommandDecoder(transport_config.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.conn_id = 0
        self.peer = None
        self.last_heard = 0.0
        self.heartbeat_s: float | None = None
        self.last_beat_sent = 0.0
        self.closed = False

    # asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.last_heard = self.server.clock()
        self.server._register(self)

    def data_received(self, data: bytes) -> None:
        self.last_heard = self.server.clock()
        self.decoder.receive_data(data)
        items = self.decoder.next_items()
        if items:
            self.server._handle(self, items)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._unregister(self)

    def pause_writing(self) -> None:  # the kernel buffer is full; output accumulates
        pass

    def resume_writing(self) -> None:
        pass

    # ----------------------------------------------------------------------------------

    def write_frames(self, frames: list[bytes]) -> None:
        if self.closed or self.transport is None:
            return
        self.transport.writelines(frames)
        buffered = self.transport.get_write_buffer_size()
        if buffered > self.config.output_bytes_max:
            self.close(f"slow consumer: {buffered} bytes unsent, over the limit of {self.config.output_bytes_max}")

    def close(self, reason: str) -> None:
        if self.closed:
            return
        log.warning("closing connection %s from %s: %s", self.conn_id, self.peer, reason)
        self.closed = True
        if self.transport is not None:
            self.transport.abort() if "slow consumer" in reason else self.transport.close()


class Server:
    def __init__(
        self,
        config: Config,
        *,
        clock: Callable[[], float] = time.time,
        journal=None,
    ) -> None:
        self.config = config
        self.clock = clock
        tlog = config.transaction_log
        if journal is None:
            if tlog is not None:
                journal = Journal.open(tlog.journal_directory, segment_bytes=tlog.segment_bytes, logger=log)
                journal.on_seal = SealSummarizer(describe_record)  # sidecars for the Spark journal reader
            else:
                journal = MemoryJournal()
        self.journal = journal
        self.engine = Engine(config, journal)
        self.connections: dict[int, Connection] = {}
        self._next_conn_id = 1
        self._servers: list[asyncio.base_events.Server] = []
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self._wake_writer = asyncio.Event()
        self._wake_timer = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._reading_paused = False
        self._pump_scheduled = False
        self._timer_at = 0.0
        self._last_checkpoint = 0.0
        self._checkpointed_end = -1
        self._stopping = False
        self.frames_in = 0
        self.commits = 0
        self.ports: list[int] = []

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        started = time.monotonic()
        checkpoint = None
        tlog = self.config.transaction_log
        if tlog is not None and isinstance(self.journal, Journal):
            checkpoint = read_checkpoint(
                tlog.journal_directory, first_position=self.journal.first_position, durable_end=self.journal.durable_end
            )
            checkpoint = with_snapshots(checkpoint, tlog.journal_directory)  # FileBackedMetadata
        pages = page_files(tlog.journal_directory) if tlog is not None and isinstance(self.journal, Journal) else None
        count = self.engine.recover(self.clock(), checkpoint=checkpoint, pages=pages)
        log.info("recovered %d journal records in %.3f s", count, time.monotonic() - started)
        if tlog is not None and isinstance(self.journal, Journal):
            # Make what recovery resolved durable before serving: a configured
            # RecoveryPoint such as NOW is fixed when the queue is first seen, not again
            # at every start (spec 000, "Startup and Recovery for Queues").
            while True:
                self.journal.commit()
                self.engine.on_durable(self.clock())
                if self.journal.end == self.journal.durable_end:
                    break  # on_durable may append (expiries): commit those too
            write_checkpoint(tlog.journal_directory, self.engine.checkpoint())
            self.journal.save_prefix()  # the next open re-reads what recovery checked in one CRC pass
        loop = asyncio.get_running_loop()
        transports = self.config.transports or (Transport(name="default"),)
        for tc in transports:
            server = await loop.create_server(lambda tc=tc: Connection(self, tc), tc.host, tc.port)
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            self.ports.append(port)
            log.info("listening on %s:%d (%s)", tc.host, port, tc.name)
        self._tasks.append(asyncio.create_task(self._writer(), name="journal-writer"))
        self._tasks.append(asyncio.create_task(self._timer(), name="timer"))
        self.engine.tick(self.clock())
        self._flush_output()

    async def stop(self) -> None:
        """Graceful shutdown: stop accepting, commit what is buffered, close the journal."""
        self._stopping = True
        for server in self._servers:
            server.close()
        for conn in list(self.connections.values()):
            conn.close("server shutting down")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        loop = asyncio.get_running_loop()
        batch = self.journal.take_batch()
        if batch is not None:
            self.journal.mark_durable(await loop.run_in_executor(self._io, self.journal.write_batch, batch))
        await self._checkpoint(force=True)
        await loop.run_in_executor(self._io, self.journal.close)
        self._io.shutdown(wait=True)
        log.info("stopped; journal closed at position %d", self.journal.durable_end)

    async def serve_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    # --- connections ---------------------------------------------------------------------

    def _register(self, conn: Connection) -> None:
        conn.conn_id = self._next_conn_id
        self._next_conn_id += 1
        self.connections[conn.conn_id] = conn
        self.engine.connect(conn.conn_id)
        if self._reading_paused and conn.transport is not None:
            conn.transport.pause_reading()

    def _unregister(self, conn: Connection) -> None:
        if self.connections.pop(conn.conn_id, None) is not None:
            self.engine.disconnect(conn.conn_id, self.clock())
            self._after_engine()

    def _handle(self, conn: Connection, items: list) -> None:
        self.frames_in += 1
        engine = self.engine
        now = self.clock()
        commands = []
        for item in items:
            if type(item) is Rejected:
                if commands:
                    engine.handle(conn.conn_id, commands, now)
                    commands = []
                engine.reject(conn.conn_id, item.error, item.cid)
            elif type(item) is m.Heartbeat:
                self._heartbeat(conn, item)
                commands.append(item)
            else:
                commands.append(item)
        if commands:
            engine.handle(conn.conn_id, commands, now)
        self._after_engine()

    def _heartbeat(self, conn: Connection, cmd: m.Heartbeat) -> None:
        try:
            opts = parse_options("heartbeat", cmd.options)
        except errors.ConveyorError:
            return  # the engine reports the bad option
        interval = opts.get("start")
        if interval is not None:
            conn.heartbeat_s = float(interval) if interval > 0 else None
            self._wake_timer.set()

    def _after_engine(self) -> None:
        """Carry out what the engine asked for: output, closes, journal writes, timers."""
        self._flush_output()
        for conn_id, reason in self.engine.take_closes():
            conn = self.connections.get(conn_id)
            if conn is not None:
                conn.close(reason)
        journal = self.journal
        if journal.end != journal.durable_end:
            self._wake_writer.set()
            if not self._reading_paused and journal.end - journal.durable_end > JOURNAL_BACKLOG_BYTES_MAX:
                self._pause_reading(True)
        if self.engine.replays_pending and not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)
        deadline = self.engine.next_deadline()
        if deadline is not None and deadline < self._timer_at:
            self._timer_at = deadline
            self._wake_timer.set()

    def _pump(self) -> None:
        self._pump_scheduled = False
        self.engine.pump_replays(self.clock())
        self._after_engine()

    def _flush_output(self) -> None:
        out = self.engine.take_output()
        if not out:
            return
        for conn_id, msgs in out.items():
            conn = self.connections.get(conn_id)
            if conn is not None:
                conn.write_frames(encode_frames(msgs))

    def _pause_reading(self, pause: bool) -> None:
        self._reading_paused = pause
        for conn in self.connections.values():
            if conn.transport is not None and not conn.closed:
                (conn.transport.pause_reading if pause else conn.transport.resume_reading)()

    # --- group commit --------------------------------------------------------------------

    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        journal = self.journal
        flush_interval = self.config.transaction_log.flush_interval_s if self.config.transaction_log else 0.0
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            if flush_interval:
                await asyncio.sleep(flush_interval)
            batch = journal.take_batch()
            if batch is None:
                continue
            end = await loop.run_in_executor(self._io, journal.write_batch, batch)
            journal.mark_durable(end)
            self.commits += 1
            self.engine.on_durable(self.clock())
            if self._reading_paused and journal.end - journal.durable_end < JOURNAL_BACKLOG_BYTES_MAX // 2:
                self._pause_reading(False)
            self._after_engine()

    # --- timers --------------------------------------------------------------------------

    async def _timer(self) -> None:
        last_housekeeping = 0.0
        while True:
            now = self.clock()
            deadline = self.engine.next_deadline()
            if (deadline is not None and deadline <= now) or now - last_housekeeping >= TIMER_PERIOD_S_MAX:
                self.engine.tick(now)
                if now - last_housekeeping >= TIMER_PERIOD_S_MAX:
                    last_housekeeping = now
                    self._housekeeping(now)
                    if now - self._last_checkpoint >= CHECKPOINT_INTERVAL_S:
                        self._last_checkpoint = now
                        await self._checkpoint()
                self._after_engine()
                deadline = self.engine.next_deadline()
            wait = TIMER_PERIOD_S_MAX if deadline is None else max(0.0, min(TIMER_PERIOD_S_MAX, deadline - now))
            self._timer_at = now + wait
            self._wake_timer.clear()
            try:
                await asyncio.wait_for(self._wake_timer.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass

    async def _checkpoint(self, force: bool = False) -> None:
        """Write queues.ack / publishers.seq once durable, then apply retention."""
        tlog = self.config.transaction_log
        if tlog is None or not isinstance(self.journal, Journal):
            return
        if not force and self.journal.end == self._checkpointed_end:
            return
        cp = self.engine.checkpoint()
        loop = asyncio.get_running_loop()
        while self.journal.durable_end < cp.position:
            if force:
                batch = self.journal.take_batch()
                if batch is not None:
                    self.journal.mark_durable(await loop.run_in_executor(self._io, self.journal.write_batch, batch))
                    continue
            await asyncio.sleep(0.01)
        try:
            await loop.run_in_executor(self._io, write_checkpoint, tlog.journal_directory, cp)
        except OSError as exc:
            log.error("could not write the checkpoint in %s: %s", tlog.journal_directory, exc)
            return
        self._checkpointed_end = cp.position
        prefix = self.journal.prefix_to_save()  # journal/verified.py: a restart skips re-checking it
        if prefix is not None:
            await loop.run_in_executor(self._io, verified.save_prefix, *prefix)
        retention = tlog.retention
        if retention.max_age_s is not None or retention.max_bytes is not None:
            removed = self.journal.apply_retention(
                keep_from=self.engine.retention_floor(cp),
                max_age_s=retention.max_age_s,
                max_bytes=retention.max_bytes,
                now=self.clock(),
            )
            for seg in removed:
                log.info("retention removed journal segment %s", seg.path)

    def _housekeeping(self, now: float) -> None:
        beats = []
        for conn in list(self.connections.values()):
            if conn.heartbeat_s:
                if now - conn.last_heard > conn.heartbeat_s * HEARTBEAT_GRACE_FACTOR:
                    conn.close(f"no heartbeat for {now - conn.last_heard:.1f} s")
                    continue
                if now - conn.last_beat_sent >= conn.heartbeat_s:
                    conn.last_beat_sent = now
                    beats.append(conn)
            idle = conn.config.idle_timeout_s
            if idle and now - conn.last_heard > idle:
                conn.close(f"idle for {now - conn.last_heard:.1f} s")
        for conn in beats:
            conn.write_frames(encode_frames([m.ServerHeartbeat()]))

    def statistics(self) -> ServerStats:
        return ServerStats(len(self.connections), self.frames_in, self.commits, self.journal.end, self.journal.durable_end)
