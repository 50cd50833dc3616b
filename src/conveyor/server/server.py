"""The server: a thin asyncio shell around the engine.

It owns the sockets, the clock and the journal's disk writes; every decision is the
engine's. The shape of one turn:

1. a connection's bytes arrive -> the codec decodes whole frames -> ``engine.handle``
   (:meth:`Server.handle`: the host its connections talk to, server/connection.py);
2. records the engine appended sit in the journal's buffer; the **group-commit writer**
   (server/commit.py) takes everything buffered, writes and fsyncs it on the server's one
   I/O thread (one write and one fsync per group) while the loop keeps reading, then
   calls ``engine.on_durable``;
3. after each step the engine's output is taken and written as one frame per connection
   (:meth:`Server._after_engine`).

``Server`` holds the lifecycle (bind, recover, serve, stop) and wires the parts, each of
which owns its state and gets its collaborators in its constructor:

- :class:`~conveyor.server.supervisor.Supervisor`: the background work (trio's rule:
  exceptions always propagate). When any of it raises, the server **fails**: the error
  is logged with its traceback, the listeners stop accepting, every connection is
  closed with the reason, nothing more is written to the journal, and
  :meth:`serve_forever` / :meth:`run_until` raise :class:`~conveyor.errors.ServerFailed`
  (``conveyor serve`` exits 1). A publish the journal could not persist is therefore
  never acknowledged as persisted, and the server does not go on accepting publishes it
  cannot persist.
- :class:`~conveyor.server.commit.GroupCommit`: the writer, the waits for durability,
  the commit statistics.
- :class:`~conveyor.server.gate.LogonGate` (docs/security.md): with ``Authentication``
  a connection's first command must be a logon verified off the loop; its later
  commands wait, reading paused; ``Limits`` bound connections waiting to log on and per
  user (the total is bounded here, in :meth:`Server.register`).
- :class:`~conveyor.server.output.OutputBudget`: flow control, ``Limits/OutputBudget``,
  paced replays and query results, slow consumers.
- :class:`~conveyor.server.pacing.InputPacing`: reading pauses while the journal has too
  much unwritten, and a connection yields after a turn's input.
- :class:`~conveyor.server.housekeeping.Housekeeping`: the timer (the engine's deadlines,
  heartbeats, idle and logon timeouts, free space, security reloads, checkpoints and
  retention).

Journal writes happen on ONE I/O thread (``self._io``), in the order they were
submitted, and nothing else does: a publish's durability never waits behind other disk
work. Checkpoint files, the verified prefix and the background scrub run in order on a
second thread (``self._background_io``): a checkpoint with a large queue's snapshot
(80 ms for 1,000,000 queued) or a scrub step held every group commit behind it there.
Segment summaries, which read a whole sealed segment, run on a thread of their own
(``self._summaries``).

TLS listeners (``tcps``, ``amps-replication-secure``) reload their certificates, and the
users file and the entitlements are reloaded, on SIGHUP (:meth:`Server.reload_security`)
and when their files change. Without ``Authentication``, a listener on a non-loopback
address is logged as a warning. Frames over ``MaxFrameSize`` are refused before
buffering (codec); the engine's per-topic caches are bounded (engine/routes.py);
shutdown flushes the journal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from conveyor import errors
from conveyor.config.model import Config, Transport
from conveyor.config.validation import validate
from conveyor.engine import poison
from conveyor.engine.core import Engine
from conveyor.engine.entitlements import Entitlements
from conveyor.journal import Journal, MemoryJournal
from conveyor.journal.index import SealSummarizer
from conveyor.protocol import messages as m
from conveyor.protocol import replication as p_repl
from conveyor.protocol.codec import Rejected, encode_frame, encode_frames
from conveyor.protocol.options import parse_options
from conveyor.records.facts import describe_record
from conveyor.security.authenticator import Authenticator
from conveyor.security.tls import ServerTls
from conveyor.server.checkpoints import journal_id, page_files, read_checkpoint, with_snapshots, write_checkpoint
from conveyor.server.commit import GroupCommit
from conveyor.server.connection import Connection
from conveyor.server.disk import Disk
from conveyor.server.gate import LogonGate
from conveyor.server.journal_reads import JournalReads
from conveyor.server.housekeeping import CHECKPOINT_INTERVAL_S, Housekeeping
from conveyor.server.io_thread import IoThread
from conveyor.server.links import IncomingReplica, OutgoingLink
from conveyor.server.output import OutputBudget
from conveyor.server.pacing import InputPacing
from conveyor.server.startup import _listen_error, _NewJournal, _open_journal, recovery_line
from conveyor.server.supervisor import Supervisor

__all__ = ["CHECKPOINT_INTERVAL_S", "Connection", "Server", "ServerStats"]

log = logging.getLogger("conveyor.server")

TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a TLS client that does not finish its handshake is dropped
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True)
class ServerStats:
    connections: int
    frames_in: int
    commits: int  # journal groups written and fsynced
    journal_end: int
    journal_durable_end: int
    failed: bool  # the server stopped itself after a failure (see the module header)
    disk_free_bytes: int | None  # free space of the journal's file system, last checked
    scrub_passes: int  # background scrub passes completed
    scrub_bytes: int  # journal bytes the background scrub checked
    scrub_problems: int  # damaged records the background scrub found


def _encode_each(conn_id: int, msgs: list) -> list[bytes]:
    """The frames of ``msgs`` one by one, leaving out (counted and logged, engine/poison.py)
    a message that cannot be encoded: its connection gets every other one, in order."""
    frames = []
    for msg in msgs:
        try:
            frames.append(encode_frame([msg]))
        except Exception as exc:  # noqa: BLE001 - poison.py rule 1: this message, this connection only
            poison.skipped("encode", f"{type(msg).__name__} for connection {conn_id} "
                           f"({getattr(msg, 'topic', None) or getattr(msg, 'cid', None) or '-'})", exc)
    return frames


class Server:
    # Slots: with 30 attributes or more a CPython 3.11 instance has a dict of its own (no
    # shared keys) and every attribute load is a dict lookup; a slot is a fixed offset.
    __slots__ = (
        "_background_io", "_config_stamp", "_conn_ids", "_frames_in", "_hold_clients", "_io", "_links",
        "_new_journal", "_summaries", "_recovered", "_servers", "_stopped", "_writer_task", "admin",
        "admin_authenticator", "admin_ssl_context", "auth", "clock", "commit", "commit_stats", "config", "connections", "disk",
        "durable", "engine", "gate", "housekeeping", "journal", "journal_reads", "output", "pacing", "pages",
        "ports", "started_at", "supervisor", "tls",
    )

    def __init__(self, config: Config, *, clock: Callable[[], float] = time.time,
                 no_clients_until_replicated: bool = False) -> None:
        """``no_clients_until_replicated`` (``conveyor serve --no-clients-until-replicated``):
        refuse client logons until the engine's wait for its sync peers to catch it up
        after the start is over (docs/replication.md, "After a restart: catching up")."""
        validate(config)  # as `conveyor config check` does: nothing configured is silently ignored
        self.config = config
        self.clock = clock
        tlog = config.transaction_log
        # The journal's writes, alone on their thread; the other disk work on a second one.
        self._io = IoThread("journal-io")
        self._background_io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="background-io")
        # Segment summaries, on a thread of their own (journal/index.py SealSummarizer).
        self._summaries = SealSummarizer(describe_record, background=True)
        self.journal: Journal
        self.tls: dict[str, ServerTls] = {}  # each TLS listener's reloadable context (docs/security.md)
        # What a start that fails removes again (start()): a journal this server created.
        self._new_journal: _NewJournal | None = None
        if tlog is not None:
            # Nothing on disk before what would refuse the start anyway (_open_journal).
            self.journal, self._new_journal = _open_journal(tlog, self._summaries, self.tls, config)
        else:
            self.journal = MemoryJournal()
        self.durable = tlog is not None  # a journal on disk: checkpoints, retention, page files
        jid = journal_id(tlog.journal_directory) if tlog is not None else "memory"
        try:
            self.engine = Engine(config, self.journal, journal_id=jid,
                                 describe_connection=self._describe)  # log lines name the peer's address
        except BaseException:  # a configuration the engine refuses (a queue's Filter...): no trace either
            self.journal.close(commit=False)
            if self._new_journal is not None:
                self._new_journal.remove()
            raise
        self.connections: dict[int, Connection] = {}
        self._conn_ids = itertools.count(1)
        self._servers: list[asyncio.base_events.Server] = []
        self._writer_task: asyncio.Task | None = None
        self._recovered = False  # start() rebuilt the engine: a checkpoint may be written
        self._stopped = False
        self._frames_in = 0
        self.ports: list[int] = []
        self.started_at = clock()
        # The parts, each given its collaborators once (docs/architecture.md, "The server's parts").
        self.supervisor = Supervisor(on_failure=self._on_failure)
        self.pacing = InputPacing(self.connections, self.journal)
        self.commit = GroupCommit(self.journal, self._io, self.engine, clock, self.supervisor, self.pacing,
                                  flush_interval_s=tlog.flush_interval_s if tlog is not None else 0.0,
                                  after_engine=self._after_engine, flush_output=self._flush_output)
        self.commit_stats = self.commit.stats  # group-commit latency and sizes (the admin interface)
        self.output = OutputBudget(self.engine, self.connections, config.limits.output_budget_bytes, clock,
                                   self.supervisor, after_engine=self._after_engine)
        self.disk = Disk(config.transaction_log, self.journal, self._background_io)  # free space, scrub
        self.journal_reads = JournalReads(tlog.journal_directory if tlog is not None else None, jid,
                                          lambda: self.journal.durable_end, self._send_one)  # the Spark journal reader
        # The admin interface (server/admin.py), bound from config.admin. Whoever builds the
        # server may set an authenticator and a TLS context before start().
        self.admin = None
        self.admin_authenticator = None
        self.admin_ssl_context = None
        # Security (docs/security.md): the authenticator, and the gate that holds a
        # connection's commands until it is verified and counts what the limits bound.
        self.auth = Authenticator(config)
        self.gate = LogonGate(self.auth, self.engine, config.limits, clock, self.supervisor, self.pacing,
                              handle=self.handle, replica_frames=self.replica_frames)
        self.housekeeping = Housekeeping(self.engine, self.journal, tlog, config.limits, self._background_io, clock,
                                         self.connections, self.disk, self.commit, self.output, self.gate,
                                         reload_security=self.reload_security, after_engine=self._after_engine)
        self._config_stamp = self._source_stamp()
        # --no-clients-until-replicated: client logons are refused while this is True.
        self._hold_clients = no_clients_until_replicated and not self.engine.catch_up.done
        self._links: dict[str, OutgoingLink] = {}  # by destination (a peer that dials in wakes its link)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the listeners, recover the engine from the journal, then serve.

        Binding comes first, so an address that cannot be used is refused (ConfigError,
        naming the transport's element) before a long recovery; connections are
        accepted only once recovery is done. (A taken address was refused already by
        the constructor, before the journal was created: ``_open_journal``.) A start
        that fails removes the journal it created, if it created one."""
        try:
            await self._bind()
            self._recover()
        except BaseException:
            self._stopped = True  # nothing was served: there is nothing for stop() to do
            self._close_listeners()
            if self.admin is not None:
                self.admin.close()
            self.journal.close(commit=False)
            self._io.shutdown(wait=True)
            self._background_io.shutdown(wait=True)
            self._summaries.close()
            if self._new_journal is not None:
                self._new_journal.remove()  # a failed start leaves no trace
            raise
        for server in self._servers:
            await server.start_serving()
        self._writer_task = self.spawn(self.commit.run(), name="journal writer")
        self.spawn(self.housekeeping.run(), name="timer")
        if self.admin is not None:
            await self.admin.http.start_serving()  # its address is printed once start() returns
            self.spawn(self.admin.run(), name="admin interface")
        self._start_links()
        if self._hold_clients:
            log.warning("--no-clients-until-replicated: client logons are refused until %s ha%s caught this instance "
                        "up (or RecoveryCatchUpTimeout, %g s, passes)", ", ".join(self.engine.catch_up.peers),
                        "s" if len(self.engine.catch_up.peers) == 1 else "ve", self.engine.catch_up.timeout_s)
        tlog = self.config.transaction_log
        if tlog is not None and tlog.scrub.bytes_per_s > 0:
            self.spawn(self.disk.scrub(tlog.scrub), name="journal scrub")
        self.disk.check_free_space(self.clock())
        self.engine.tick(self.clock())
        self._flush_output()

    async def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        transports = self.config.transports or (Transport(name="default"),)
        for tc in transports:
            protocol = IncomingReplica if tc.type == "replication" else Connection
            ssl_context = None
            if tc.tls is not None:
                if tc.name not in self.tls:  # loaded already when the addresses were checked
                    self.tls[tc.name] = ServerTls(tc.tls)  # ConfigError with the element's path
                ssl_context = self.tls[tc.name].context
            try:
                server = await loop.create_server(
                    lambda tc=tc, protocol=protocol: protocol(self, tc), tc.host, tc.port, start_serving=False,
                    ssl=ssl_context, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if ssl_context else None,
                )
            except OSError as exc:  # socket.gaierror too: a host name that does not resolve
                raise _listen_error(tc, exc) from None
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            self.ports.append(port)
            log.info("listening on %s:%d (%s%s%s)", tc.host, port, tc.name,
                     ", incoming replication" if tc.type == "replication" else "", ", TLS" if ssl_context else "")
            if not self.auth.required and tc.host not in LOOPBACK_HOSTS:
                log.warning("SECURITY WARNING: transport %s listens on %s:%d, beyond this machine, WITHOUT "
                            "<Authentication>: anyone who can reach the port can publish, consume, acknowledge and "
                            "purge. Add <Authentication> and <Entitlement> (docs/security.md), or listen on 127.0.0.1.",
                            tc.name, tc.host, port)
        if self.config.admin is not None:
            from conveyor.server.admin import AdminInterface  # the admin shell sits beside this one

            self.admin = AdminInterface(self, self.config.admin, authenticate=self.admin_authenticator,
                                        ssl=self.admin_ssl_context or self.admin_tls())
            await self.admin.bind()

    def _recover(self) -> None:
        started = time.monotonic()
        checkpoint = None
        pages = None
        tlog = self.config.transaction_log
        if tlog is not None:
            checkpoint = read_checkpoint(
                tlog.journal_directory, first_position=self.journal.first_position, durable_end=self.journal.durable_end
            )
            checkpoint = with_snapshots(checkpoint, tlog.journal_directory)  # FileBackedMetadata
            pages = self.pages = page_files(tlog.journal_directory, self.config.limits.queue_metadata_memory_bytes)
        count = self.engine.recover(self.clock(), checkpoint=checkpoint, pages=pages)
        log.info("%s", recovery_line(self.engine, count, time.monotonic() - started, checkpoint, tlog is not None,
                                     self.clock()))
        self._recovered = True
        if tlog is not None:
            # Make what recovery resolved durable before serving: a configured
            # RecoveryPoint such as NOW is fixed when the queue is first seen, not again
            # at every start (spec 000, "Startup and Recovery for Queues").
            while True:
                self.journal.commit()
                self.engine.on_durable(self.clock())
                if self.journal.end == self.journal.durable_end:
                    break  # on_durable may append (expiries): commit those too
            # Without the queues' snapshots: those recovery just loaded stay valid on their
            # own (queue/snapshot.py rule 1), and writing a deep queue's again would delay
            # the first delivery; the next periodic checkpoint writes them.
            write_checkpoint(tlog.journal_directory, self.engine.checkpoint(snapshots=False))
            self.journal.save_prefix()  # the next open re-reads what recovery checked in one CRC pass

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task:
        """Run ``coro`` as supervised background work: if it raises (or returns while
        the server runs), the server fails (see the module header). For the server's own
        tasks and for modules that hook into it (an admin interface...)."""
        return self.supervisor.spawn(coro, name=name)

    async def run_until(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (then stop gracefully) or the server fails (then
        stop and raise :class:`~conveyor.errors.ServerFailed`)."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.supervisor.failed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await self.stop()
        if self.supervisor.failure is not None:
            raise self.supervisor.failure

    async def serve_forever(self) -> None:
        """Start, then serve until the server fails (raises ServerFailed) or the task is
        cancelled (stops gracefully)."""
        await self.start()
        await self.run_until(asyncio.Event())

    async def stop(self) -> None:
        """Shutdown: stop accepting, close connections, write what is buffered (unless
        the server failed: then nothing more is written), checkpoint, close the journal.
        Returns in bounded time: nothing here waits for a task that may never finish."""
        if self._stopped:
            return
        self._stopped = True
        supervisor = self.supervisor
        supervisor.begin_stop()
        self._close_listeners()
        for conn in list(self.connections.values()):
            conn.close("server shutting down")
        await supervisor.cancel(keep=self._writer_task, also=self.gate.verifying)
        if supervisor.failure is None and self._writer_task is not None:
            self.commit.wake()  # the writer finishes the group in flight, then returns
            await asyncio.gather(self._writer_task, return_exceptions=True)
        if supervisor.failure is None and self._recovered:
            try:
                await self.commit.drain()  # appended after the writer left (disconnects)
                await self.housekeeping.checkpoint(final=True)
            except Exception as exc:  # noqa: BLE001 (reported as the failure it is)
                supervisor.fail("shutdown", exc)
        try:
            await self._io.call(lambda: self.journal.close(commit=supervisor.failure is None))
        except Exception as exc:  # noqa: BLE001
            log.error("could not close the journal: %s", exc)
        # After a failure the I/O thread may be stuck on a dead disk: do not wait for it.
        self._io.shutdown(wait=supervisor.failure is None, cancel_futures=supervisor.failure is not None)
        self._background_io.shutdown(wait=supervisor.failure is None, cancel_futures=supervisor.failure is not None)
        self._summaries.close()
        self.auth.close()
        self.journal_reads.close()
        if supervisor.failure is None:
            log.info("stopped; journal closed at position %d", self.journal.durable_end)
        else:
            log.error("stopped after a failure; journal durable up to position %d", self.journal.durable_end)

    @property
    def ready(self) -> bool:
        """Recovered, serving, not failed and not stopping (the admin readiness probe);
        with --no-clients-until-replicated, also caught up."""
        return (self._recovered and self.supervisor.failure is None and not self.supervisor.stopping
                and not self.clients_held)

    @property
    def clients_held(self) -> bool:
        """--no-clients-until-replicated, and the wait for the peers is not over."""
        return self._hold_clients and not self.engine.catch_up.done

    @property
    def failure(self) -> errors.ServerFailed | None:
        """Why the server failed, or None."""
        return self.supervisor.failure

    def _on_failure(self, failure: errors.ServerFailed, exc: BaseException) -> None:
        """The supervisor's failure, here: stop accepting, close every connection with the
        reason, fail every durability wait."""
        self._close_listeners()
        for conn in list(self.connections.values()):
            conn.close(f"server failed: {exc}", abort=True)
        self.commit.fail_waiters(failure)

    def _close_listeners(self) -> None:
        for server in self._servers:
            server.close()

    async def wait_durable(self, position: int) -> None:
        """Return once the journal is durable up to ``position``; raise ServerFailed if
        the server fails first (the writer will never get there)."""
        await self.commit.wait_durable(position)

    # --- connections: the ConnectionHost (server/connection.py) ----------------------------

    def _describe(self, conn_id: int) -> str:
        conn = self.connections.get(conn_id)
        return f"connection {conn_id} from {conn.address}" if conn is not None else f"connection {conn_id}"

    def register(self, conn: Connection) -> None:
        conn.numbered(next(self._conn_ids))
        failure = self.supervisor.failure
        if failure is not None:
            conn.close(f"server failed: {failure.__cause__}", abort=True)
            return
        limits = self.config.limits
        if len(self.connections) >= limits.connections_max:
            conn.close(f"too many connections: the server holds {len(self.connections)} "
                       f"(Limits/MaxConnections {limits.connections_max})", abort=True)
            return
        if not self.gate.count_pending(conn):
            return
        self.connections[conn.conn_id] = conn
        self.engine.connect(conn.conn_id)
        log.info("connection %d from %s on %s", conn.conn_id, conn.address, conn.config.name)
        if self.pacing.paused and conn.transport is not None:
            conn.transport.pause_reading()
        self.gate.admit_by_certificate(conn)

    def unregister(self, conn: Connection) -> None:
        self.output.forget(conn)
        if conn.conn_id in self.connections and conn.close_reason is None:
            log.info("connection %d from %s closed by the client", conn.conn_id, conn.address)
        self.gate.forget(conn)
        self.journal_reads.forget(conn.conn_id)
        if self.connections.pop(conn.conn_id, None) is not None and self.supervisor.failure is None:
            self.engine.disconnect(conn.conn_id, self.clock())
            self._after_engine()

    def took_input(self, conn: Connection, size: int) -> None:
        self.pacing.took_input(conn, size)

    def writing(self, conn: Connection, *, paused: bool) -> None:
        self.output.writing(conn, paused=paused)

    def output_changed(self, conn: Connection, buffered: int) -> None:
        self.output.changed(conn, buffered)

    def admin_url(self) -> str | None:
        return self.admin.url if self.admin is not None else None

    def handle(self, conn: Connection, items: list) -> None:
        if self.supervisor.failure is not None:
            return  # the connection is closing: nothing more is accepted
        if self._hold_clients and self._catching_up(conn, items):
            return
        if not conn.authenticated and self.auth.required:
            self.gate.commands(conn, items)
            return
        self._frames_in += 1
        self.output.commands_arrived()
        engine = self.engine
        now = self.clock()
        kinds = {type(item) for item in items}
        if Rejected not in kinds and m.Heartbeat not in kinds:  # the usual frame: commands alone
            engine.handle(conn.conn_id, items, now)
            self._after_engine()
            return
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

    def _catching_up(self, conn: Connection, items: list) -> bool:
        """--no-clients-until-replicated: True when ``conn`` was refused because this
        instance still waits for its peers to catch it up; once that wait is over, never
        again."""
        if self.engine.catch_up.settle(self.clock()):
            self._hold_clients = False
            self.housekeeping.wake_by(self.engine.next_deadline())  # the held queues deliver at the next tick
            return False
        self.gate.refuse_until_replicated(conn, items)
        return True

    def end_catch_up(self, by: str) -> bool:
        """The admin action: stop waiting for the peers to catch this instance up; the
        replicated queues deliver and clients may log on. False when it was over."""
        now = self.clock()
        ended = self.engine.catch_up.end(now, by)
        if ended:
            self.engine.tick(now)  # the held replicated queues deliver now
            self._after_engine()
        return ended

    def _heartbeat(self, conn: Connection, cmd: m.Heartbeat) -> None:
        try:
            opts = parse_options("heartbeat", cmd.options)
        except errors.ConveyorError:
            return  # the engine reports the bad option
        interval = opts.get("start")
        if interval is not None:
            conn.set_heartbeat(float(interval) if interval > 0 else None)
            self.housekeeping.wake()

    def _after_engine(self) -> None:
        """Carry out what the engine asked for: output, closes, journal writes, timers."""
        self._flush_output()
        for conn_id, reason in self.engine.take_closes():
            conn = self.connections.get(conn_id)
            if conn is not None:
                conn.close(reason)
        for conn_id, cmd in self.engine.take_shell_commands():
            self.journal_reads.serve(conn_id, cmd)
        journal = self.journal
        if journal.end != journal.durable_end:
            self.commit.wake()
            self.pacing.journal_appended()
        self.output.pump_if_pending()
        self.housekeeping.wake_by(self.engine.next_deadline())
        self.housekeeping.journal_grew()

    def _send_one(self, conn_id: int, message: m.Ack) -> None:
        """A reply made outside an engine step (server/journal_reads.py)."""
        conn = self.connections.get(conn_id)
        if conn is not None:
            conn.write_frames(encode_frames([message]), messages=0)

    def _flush_output(self) -> None:
        out = self.engine.take_output()
        if not out:
            return
        for conn_id, msgs in out.items():
            conn = self.connections.get(conn_id)
            if conn is not None:
                try:
                    frames = encode_frames(msgs)
                except Exception:  # noqa: BLE001 - one message that cannot be encoded must not cost the others
                    frames = _encode_each(conn_id, msgs)
                conn.write_frames(frames, messages=len(msgs))

    # --- security: reloads and the admin interface's hooks (docs/security.md) -----------------

    def admin_tls(self) -> ssl.SSLContext | None:
        """The admin port's TLS context (reloaded with the others), or None without TLS
        in ``<Admin>``. Raises ConfigError (naming the element) if the files are bad."""
        admin = self.config.admin
        if admin is None or admin.tls is None:
            return None
        if "admin" not in self.tls:
            self.tls["admin"] = ServerTls(admin.tls)
        return self.tls["admin"].context

    async def admin_user(self, authorization: str | None, transport, *, full: bool) -> str | None:
        """Who an admin request is, if it may read (``full``: act); see LogonGate.admin_user.
        Raises NotAuthenticated (answer 401) or NotEntitled (answer 403)."""
        return await self.gate.admin_user(authorization, transport, full=full)

    def reload_security(self, *, force: bool = False) -> None:
        """Reload what changed (everything with ``force``, e.g. on SIGHUP): the users file,
        TLS certificates, and the configuration's ``Entitlement``. A reload that fails is
        logged and keeps what was in force."""
        if self.supervisor.failure is not None:
            return
        if self.auth.reload(force=force):
            for conn in list(self.connections.values()):
                if conn.user is not None and not self.auth.knows(conn.user):
                    conn.close(f"user {conn.user!r} was removed from the users file")
        for tls in self.tls.values():
            tls.reload(force=force)
        stamp = self._source_stamp()
        if stamp is not None and (force or stamp != self._config_stamp):
            self._config_stamp = stamp
            self._reload_entitlements()
        self._after_engine()

    def _source_stamp(self) -> tuple | None:
        try:
            st = os.stat(self.config.source)
        except (OSError, ValueError):
            return None  # the embedded default, or a configuration given as text
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _reload_entitlements(self) -> None:
        from conveyor.config import load_file

        try:
            new = load_file(self.config.source)
        except errors.ConfigError as exc:
            log.error("configuration NOT reloaded (the entitlements in force stay): %s", exc)
            return
        if (new.authentication is None) != (self.config.authentication is None):
            log.error("configuration NOT reloaded: turning <Authentication> on or off needs a restart")
            return
        if new.entitlement != self.config.entitlement:
            self.config = dataclasses.replace(self.config, entitlement=new.entitlement)
            self.engine.set_entitlements(Entitlements.from_config(self.config), self.clock())
            log.info("entitlements reloaded from %s", self.config.source)

    # --- replication links (server/links.py; the engine decides) ----------------------------

    def _start_links(self) -> None:
        repl = self.config.replication
        for dest in repl.destinations if repl else ():
            link = self._links[dest.name] = OutgoingLink(self, dest.name, dest.addresses, dest.endpoints)
            self.spawn(link.run(), name=f"replication link to {dest.name}")

    def register_replica(self, conn: Connection) -> None:
        """A source connected to the incoming replication transport."""
        conn.numbered(next(self._conn_ids), link=True)
        failure = self.supervisor.failure
        if failure is not None:
            conn.close(f"server failed: {failure.__cause__}", abort=True)
            return
        self.connections[conn.conn_id] = conn
        self.engine.replica_connected(conn.conn_id)
        log.info("replication: source connected from %s", conn.peer)

    def unregister_replica(self, conn: Connection) -> None:
        if self.connections.pop(conn.conn_id, None) is not None and self.supervisor.failure is None:
            self.engine.replica_disconnected(conn.conn_id)
            self._after_engine()

    def replica_frames(self, conn: Connection, items: list) -> None:
        if self.supervisor.failure is not None:
            return
        if self.auth.required and not conn.authenticated:
            self.gate.replica_handshake(conn, items)  # a source authenticates like a client
            return
        self.engine.replica_frames(conn.conn_id, items, self.clock())
        first = items[0]
        if type(first) is p_repl.Hello and first.catching_up:
            # The peer is up again and waits for this instance's stream to catch it up:
            # dial it now rather than at the end of a backoff.
            link = self._links.get(first.profile.instance)
            if link is not None:
                link.wake()
        self._after_engine()

    def link_up(self, destination: str, conn: Connection, welcome: p_repl.Welcome) -> None:
        """An outgoing link finished its handshake (raises ReplicationRefused)."""
        if self.supervisor.failure is not None:
            raise errors.ReplicationRefused("the server failed")
        if self.supervisor.stopping:  # stop() closed the connections already: this one would stay open
            raise errors.ReplicationRefused("the server is stopping")
        conn.numbered(next(self._conn_ids), link=True)
        self.engine.link_up(destination, conn.conn_id, welcome, self.clock())
        self.connections[conn.conn_id] = conn
        self._after_engine()

    def link_acked(self, conn: Connection, acked: p_repl.Acked) -> None:
        if self.supervisor.failure is not None:
            return
        self.engine.link_acked(conn.conn_id, acked, self.clock())
        self._after_engine()

    def link_lost(self, destination: str, conn: Connection, reason: str) -> None:
        self.connections.pop(conn.conn_id, None)
        if self.supervisor.failure is None:
            self.engine.link_down(destination, conn.conn_id, reason, self.clock())
            self._after_engine()

    def link_unreachable(self, destination: str, reason: str) -> None:
        if self.supervisor.failure is None:
            self.engine.link_down(destination, None, reason, self.clock())

    def statistics(self) -> ServerStats:
        return ServerStats(
            connections=len(self.connections),
            frames_in=self._frames_in,
            commits=self.commit.commits,
            journal_end=self.journal.end,
            journal_durable_end=self.journal.durable_end,
            failed=self.supervisor.failure is not None,
            disk_free_bytes=self.disk.free_bytes,
            scrub_passes=self.disk.scrub_passes,
            scrub_bytes=self.disk.scrub_bytes,
            scrub_problems=self.disk.scrub_problems,
        )
