"""The server: a thin asyncio shell around the engine.

It owns the sockets, the clock and the journal's disk writes; every decision is the
engine's. The shape of one turn:

1. a connection's bytes arrive -> the codec decodes whole frames -> ``engine.handle``;
2. records the engine appended sit in the journal's buffer; the **group-commit writer**
   takes everything buffered, writes and fsyncs it on the server's one I/O thread (one
   write and one fsync per group) while the loop keeps reading, then calls
   ``engine.on_durable``;
3. after each step the engine's output is taken and written as one frame per connection.

Supervision (trio's rule: exceptions always propagate). The background work (the
journal writer, the timer, and anything added with :meth:`Server.spawn`) runs under
one owner. When any of it raises, the server **fails**: the error is logged with its
traceback, the listeners stop accepting, every connection is closed with the reason,
nothing more is written to the journal, and :meth:`serve_forever` / :meth:`run_until`
raise :class:`~conveyor.errors.ServerFailed` (``conveyor serve`` exits 1). A publish
the journal could not persist is therefore never acknowledged as persisted, and the
server does not go on accepting publishes it cannot persist.

Disk work happens on ONE I/O thread (``self._io``): journal writes, checkpoint files,
the verified prefix and segment summaries, in the order they were submitted, so none
of it competes with the writer for the disk or reads a segment before it is written.

Security (docs/security.md): with ``Authentication`` a connection's first command must
be a logon whose credentials the authenticator verifies off the loop (or a verified
client certificate stands in for them); its later commands wait, reading paused, and
reach the engine only after the engine was told who the user is. A refused logon is
answered, logged with the address and closed; wrong credentials are counted per
address and per user, and answered late over the limit (security/ratelimit.py).
``Limits`` bound connections in total, per user and waiting to log on (closed after
``LogonTimeout``). TLS listeners (``tcps``, ``amps-replication-secure``) reload their
certificates, and the users file and the entitlements are reloaded, on SIGHUP
(:meth:`Server.reload_security`) and when their files change. Without
``Authentication``, a listener on a non-loopback address is logged as a warning.

Protection (memory is bounded whatever clients do):

- frames over ``MaxFrameSize`` are refused before buffering (codec);
- a connection whose unsent output passes ``SlowClientDisconnectThreshold`` is closed
  with a logged reason, and when the unsent output of all connections together passes
  ``Limits/OutputBudget``, the connection holding the most is closed the same way;
- a bookmark replay and the result of a query (``sow``, ``sow_and_subscribe``) are
  produced only while their connection's socket takes more (flow control:
  ``pause_writing`` holds them back) and within the connection's share of the output
  budget (:meth:`Server._replay_room`), so a large result is paced to its reader, never
  buffered whole; a replay that is not read is throttled, and a query whose socket
  takes nothing for ``QUERY_STALL_S`` is cut as a slow consumer (it holds a snapshot);
- reading pauses while the journal has more than ``JOURNAL_BACKLOG_BYTES_MAX``
  unwritten, so a fast publisher cannot grow memory without bound;
- heartbeats and idle timeouts close dead connections: a connection that holds no
  subscription and sends nothing for ``Limits/IdleTimeout`` (1 hour) is closed,
  and a transport's ``IdleTimeout`` applies to every connection on it;
- the engine's per-topic caches are bounded (engine/routes.py); shutdown flushes the
  journal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from conveyor import errors
from conveyor.config.model import Config, Transport
from conveyor.config.unsupported import refuse_unsupported
from conveyor.engine import poison
from conveyor.engine.core import Engine
from conveyor.journal import Journal, MemoryJournal
from conveyor.journal import verified
from conveyor.protocol import messages as m
from conveyor.protocol.codec import Rejected, encode_frame, encode_frames
from conveyor.protocol.options import parse_options
from conveyor.protocol import replication as p_repl
from conveyor.server.checkpoints import journal_id, page_files, read_checkpoint, with_snapshots, write_checkpoint
from conveyor.engine.entitlements import Entitlements, Permission
from conveyor.security.authenticator import Authenticator, basic_credentials
from conveyor.security.tls import ServerTls, peer_user
from conveyor.server.commit import CommitStats
from conveyor.server.connection import Connection
from conveyor.server.disk import Disk
from conveyor.server.links import IncomingReplica, OutgoingLink
from conveyor.server.startup import _listen_error, _NewJournal, _open_journal, recovery_line

__all__ = ["CHECKPOINT_INTERVAL_S", "Connection", "Server", "ServerStats"]

log = logging.getLogger("conveyor.server")

JOURNAL_BACKLOG_BYTES_MAX = 64 * 1024 * 1024  # unwritten journal bytes before reads pause
#: Client input handled before the connection that took it yields to the loop's other
#: work. The event loop reads a busy socket many times per turn (megabytes); without a
#: yield, a finished group commit waits for all of it, and its persisted acks with it.
INPUT_BYTES_PER_TURN = 256 * 1024
TIMER_PERIOD_S_MAX = 1.0  # housekeeping (heartbeats, idle) runs at least this often
HEARTBEAT_GRACE_FACTOR = 2.0  # a client silent for 2 heartbeat intervals is dead
CHECKPOINT_INTERVAL_S = 5.0  # queues.ack refresh: bounds how much recovery replays
#: A connection whose query result waits for a socket that has taken nothing for this
#: long is a slow consumer that stopped reading: it is closed (the result's snapshot and
#: the journal it names are not held for ever). A reader that takes anything is paced.
QUERY_STALL_S = 60.0
STOP_GROUPS_MAX = 16  # groups written and applied at shutdown before the rest is only written
STOP_TASKS_S_MAX = 10.0  # how long stop() waits for its cancelled tasks to end
SECURITY_CHECK_S = 2.0  # how often the users file, certificates and entitlements are checked for changes
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


def _address(peer) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)


# --- output: the share of a paced result, and results that stall ---------------------------------


def output_share(threshold: int, budget: int, paced: int) -> int:
    """What a connection may hold unsent of a replay or query result: half its
    SlowClientDisconnectThreshold, and at most an equal part of half of Limits/OutputBudget
    among the ``paced`` connections with such output on its way (the other half is left
    to live traffic)."""
    return min(threshold, budget // max(1, paced)) // 2


class QueryStalls:
    """The connections whose query result waits for a full socket, and since when their
    socket has taken nothing: past ``QUERY_STALL_S`` they are slow consumers (server
    header). Only a full socket is watched: one that is not full takes the next rows."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, float]] = {}  # conn_id -> (bytes the socket had taken, since when)

    def close_stalled(self, paused: set[int], connections: dict[int, Connection], querying: Callable[[int], bool],
                      now: float) -> None:
        """Close, as slow consumers, the connections in ``paused`` whose query result has
        waited QUERY_STALL_S for a socket that took nothing."""
        seen = {conn_id: v for conn_id, v in self._seen.items() if conn_id in paused}
        self._seen = seen
        for conn_id in list(paused):
            conn = connections.get(conn_id)
            if conn is None or conn.closed or conn.transport is None or not querying(conn_id):
                seen.pop(conn_id, None)
                continue
            unsent = conn.transport.get_write_buffer_size()
            taken = conn.bytes_out - unsent  # what the socket has accepted so far
            last = seen.get(conn_id)
            if last is None or last[0] != taken:
                seen[conn_id] = (taken, now)
            elif now - last[1] >= QUERY_STALL_S:
                del seen[conn_id]
                conn.close(f"slow consumer: {unsent} bytes unsent, and its query waits for a socket that has taken "
                           f"nothing for {now - last[1]:.0f} s", abort=True)


class Server:
    def __init__(self, config: Config, *, clock: Callable[[], float] = time.time) -> None:
        refuse_unsupported(config)  # nothing configured is silently ignored
        self.config = config
        self.clock = clock
        tlog = config.transaction_log
        # The one I/O thread: journal writes, checkpoint files and summaries, in order.
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-io")
        self.journal: Journal
        self.tls: dict[str, ServerTls] = {}  # each TLS listener's reloadable context (docs/security.md)
        # What a start that fails removes again (start()): a journal this server created.
        self._new_journal: _NewJournal | None = None
        if tlog is not None:
            # Nothing on disk before what would refuse the start anyway (_open_journal).
            self.journal, self._new_journal = _open_journal(tlog, self._io, self.tls, config)
        else:
            self.journal = MemoryJournal()
        self.durable = tlog is not None  # a journal on disk: checkpoints, retention, page files
        try:
            self.engine = Engine(config, self.journal,
                                 journal_id=journal_id(tlog.journal_directory) if tlog is not None else "memory",
                                 describe_connection=self._describe)  # log lines name the peer's address
        except BaseException:  # a configuration the engine refuses (a queue's Filter...): no trace either
            self.journal.close(commit=False)
            if self._new_journal is not None:
                self._new_journal.remove()
            raise
        self.connections: dict[int, Connection] = {}
        self._next_conn_id = 1
        self._servers: list[asyncio.base_events.Server] = []
        self._wake_writer = asyncio.Event()
        self._wake_timer = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._writer_task: asyncio.Task | None = None
        # (position, future) of everyone waiting for the journal to be durable that far;
        # the writer releases them, a failure fails them.
        self._durable_waiters: list[tuple[int, asyncio.Future]] = []
        self._failure: errors.ServerFailed | None = None
        self._failed = asyncio.Event()
        self._reading_paused = False
        self._turn_input = 0  # client input bytes since a connection last yielded (_took_input)
        self._yielded: list[Connection] = []
        self._pump_scheduled = False
        self._replays_blocked = False  # every pending replay waits for a full socket to drain
        self._writing_paused: set[int] = set()  # connections whose socket is full
        self._paced = 1  # connections with a replay or query result on its way, as of the last pump
        self._stalls = QueryStalls()  # results waiting for sockets that take nothing
        self._output_bytes = 0  # unsent output of all connections, as last seen
        self._timer_at = 0.0
        self._last_checkpoint = 0.0
        self._checkpointed_end = -1
        self._recovered = False  # start() rebuilt the engine: a checkpoint may be written
        self._stopping = False
        self._stopped = False
        self._frames_in = 0
        self._commits = 0
        self.disk = Disk(config.transaction_log, self.journal, self._io)  # free space, scrub
        self.ports: list[int] = []
        self.started_at = clock()
        self.commit_stats = CommitStats()  # group-commit latency and sizes (the admin interface)
        # The admin interface (server/admin.py), bound from config.admin. Whoever builds the
        # server may set an authenticator and a TLS context before start().
        self.admin = None
        self.admin_authenticator = None
        self.admin_ssl_context = None
        # Security (docs/security.md): the authenticator, each TLS listener's reloadable
        # context, and what the limits count.
        self.auth = Authenticator(config)
        self._pending_logons = 0
        self._user_connections: dict[str, int] = {}
        self._verifying: set[asyncio.Task] = set()
        self._last_security_check = 0.0
        self._config_stamp = self._source_stamp()

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
            if self._new_journal is not None:
                self._new_journal.remove()  # a failed start leaves no trace
            raise
        for server in self._servers:
            await server.start_serving()
        self._writer_task = self.spawn(self._writer(), name="journal writer")
        self.spawn(self._timer(), name="timer")
        if self.admin is not None:
            await self.admin.http.start_serving()  # its address is printed once start() returns
            self.spawn(self.admin.run(), name="admin interface")
        self._start_links()
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
            pages = page_files(tlog.journal_directory)
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
            # own (queue_snapshot rule 1), and writing a deep queue's again would delay
            # the first delivery; the next periodic checkpoint writes them.
            write_checkpoint(tlog.journal_directory, self.engine.checkpoint(snapshots=False))
            self.journal.save_prefix()  # the next open re-reads what recovery checked in one CRC pass

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task:
        """Run ``coro`` as supervised background work: if it raises (or returns while
        the server runs), the server fails (see the module header). For the server's own
        tasks and for modules that hook into it (an admin interface...)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)
        return task

    async def run_until(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (then stop gracefully) or the server fails (then
        stop and raise :class:`~conveyor.errors.ServerFailed`)."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._failed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await self.stop()
        if self._failure is not None:
            raise self._failure

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
        self._stopping = True
        self._close_listeners()
        for conn in list(self.connections.values()):
            conn.close("server shutting down")
        for task in (*self._tasks, *self._verifying):
            if task is not self._writer_task:
                task.cancel()
        others = [t for t in self._tasks if t is not self._writer_task]
        if others:
            _, stuck = await asyncio.wait(others, timeout=STOP_TASKS_S_MAX)
            for task in stuck:  # a task that swallowed its cancellation: a bug, but not a hang
                log.error("shutdown: %s did not end within %.0f s of its cancellation; stopping without it",
                          task.get_name(), STOP_TASKS_S_MAX)
        loop = asyncio.get_running_loop()
        if self._failure is None and self._writer_task is not None:
            self._wake_writer.set()  # the writer finishes the group in flight, then returns
            await asyncio.gather(self._writer_task, return_exceptions=True)
        if self._failure is None and self._recovered:
            try:
                await self._drain_journal()  # appended after the writer left (disconnects)
                await self._checkpoint(final=True)
            except Exception as exc:  # noqa: BLE001 (reported as the failure it is)
                self._fail("shutdown", exc)
        try:
            await loop.run_in_executor(self._io, lambda: self.journal.close(commit=self._failure is None))
        except Exception as exc:  # noqa: BLE001
            log.error("could not close the journal: %s", exc)
        # After a failure the I/O thread may be stuck on a dead disk: do not wait for it.
        self._io.shutdown(wait=self._failure is None, cancel_futures=self._failure is not None)
        self.auth.close()
        if self._failure is None:
            log.info("stopped; journal closed at position %d", self.journal.durable_end)
        else:
            log.error("stopped after a failure; journal durable up to position %d", self.journal.durable_end)

    @property
    def ready(self) -> bool:
        """Recovered, serving, not failed and not stopping (the admin readiness probe)."""
        return self._recovered and self._failure is None and not self._stopping

    @property
    def failure(self) -> errors.ServerFailed | None:
        """Why the server failed, or None."""
        return self._failure

    # --- supervision ---------------------------------------------------------------------

    def _task_done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            if self._stopping:
                return
            exc = RuntimeError("it returned while the server was running")
        self._fail(f"the {task.get_name()}", exc)

    def _fail(self, where: str, exc: BaseException) -> None:
        """Stop serving loudly: log, stop accepting, close every connection with the
        reason, fail every durability wait, wake whoever runs the server."""
        if self._failure is not None:
            return
        failure = errors.ServerFailed(f"the server stopped after a failure in {where}: {exc}")
        failure.__cause__ = exc
        self._failure = failure
        log.critical("%s; no further publish is accepted", failure, exc_info=exc)
        self._close_listeners()
        for conn in list(self.connections.values()):
            conn.close(f"server failed: {exc}", abort=True)
        waiters, self._durable_waiters = self._durable_waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(failure)
        self._failed.set()

    def _close_listeners(self) -> None:
        for server in self._servers:
            server.close()

    async def wait_durable(self, position: int) -> None:
        """Return once the journal is durable up to ``position``; raise ServerFailed if
        the server fails first (the writer will never get there)."""
        while self.journal.durable_end < position:
            if self._failure is not None:
                raise self._failure
            # What is to be durable may have been appended by the caller itself (the
            # timer's tick, just before a checkpoint): make sure the writer knows.
            self._wake_writer.set()
            fut = asyncio.get_running_loop().create_future()
            self._durable_waiters.append((position, fut))
            await fut

    def _release_durable(self) -> None:
        end = self.journal.durable_end
        waiting = []
        for position, fut in self._durable_waiters:
            if position > end:
                waiting.append((position, fut))
            elif not fut.done():
                fut.set_result(None)
        self._durable_waiters = waiting

    # --- connections ---------------------------------------------------------------------

    def _describe(self, conn_id: int) -> str:
        conn = self.connections.get(conn_id)
        return f"connection {conn_id} from {_address(conn.peer)}" if conn is not None else f"connection {conn_id}"

    def _register(self, conn: Connection) -> None:
        conn.conn_id = self._next_conn_id
        self._next_conn_id += 1
        if self._failure is not None:
            conn.close(f"server failed: {self._failure.__cause__}", abort=True)
            return
        limits = self.config.limits
        if len(self.connections) >= limits.connections_max:
            conn.close(f"too many connections: the server holds {len(self.connections)} "
                       f"(Limits/MaxConnections {limits.connections_max})", abort=True)
            return
        if self.auth.required:
            if self._pending_logons >= limits.pending_logons_max:
                conn.close(f"too many connections waiting to log on (Limits/MaxPendingLogons "
                           f"{limits.pending_logons_max})", abort=True)
                return
            self._pending_logons += 1
            conn.counted = "pending"
        self.connections[conn.conn_id] = conn
        self.engine.connect(conn.conn_id)
        log.info("connection %d from %s on %s", conn.conn_id, _address(conn.peer), conn.config.name)
        if self._reading_paused and conn.transport is not None:
            conn.transport.pause_reading()
        if self.auth.by_certificate and conn.config.tls is not None:
            user = peer_user(conn.transport)
            if user is not None:  # a verified client certificate authenticates (docs/security.md)
                self._admit(conn, user, None)

    def _unregister(self, conn: Connection) -> None:
        self._output_changed(conn, 0)
        self._writing_paused.discard(conn.conn_id)
        if conn.conn_id in self.connections and conn.close_reason is None:
            log.info("connection %d from %s closed by the client", conn.conn_id, _address(conn.peer))
        self._uncount(conn)
        if self.connections.pop(conn.conn_id, None) is not None and self._failure is None:
            self.engine.disconnect(conn.conn_id, self.clock())
            self._after_engine()

    # --- output: flow control and the budget ---------------------------------------------

    def _writing(self, conn: Connection, *, paused: bool) -> None:
        """A connection's socket filled up or drained: hold its replays back or let them go."""
        if not conn.client or self.connections.get(conn.conn_id) is not conn:
            return  # a replication link: it bounds its own output (server/links.py)
        if paused:
            self._writing_paused.add(conn.conn_id)
            return
        self._writing_paused.discard(conn.conn_id)
        self._output_changed(conn, conn.transport.get_write_buffer_size() if conn.transport is not None else 0)
        if self._replays_blocked:
            self._replays_blocked = False
            self._schedule_pump()

    def _replay_room(self, conn_id: int) -> int:
        """The bytes a replay or query result may add to a connection's output in a turn: its
        share (:func:`output_share`) less what it has unsent, so flow control holds it back."""
        conn = self.connections.get(conn_id)
        if conn is None or conn.transport is None:
            return 0
        share = output_share(conn.config.output_bytes_max, self.config.limits.output_budget_bytes, self._paced)
        return share - conn.transport.get_write_buffer_size()

    def _output_changed(self, conn: Connection, buffered: int) -> None:
        """Keep the count of unsent output; over the budget, close the largest holders.

        Other connections' counts are those of their last write (the kernel drains them
        meanwhile), so the count is recomputed exactly before anyone is closed. Client
        connections only: a replication link bounds its own output."""
        if not conn.client or self.connections.get(conn.conn_id) is not conn:
            return
        self._output_bytes += buffered - conn.buffered
        conn.buffered = buffered
        budget = self.config.limits.output_budget_bytes
        if self._output_bytes <= budget:
            return
        live = [c for c in self.connections.values() if c.client and not c.closed and c.transport is not None]
        for c in live:
            self._output_bytes += c.transport.get_write_buffer_size() - c.buffered
            c.buffered = c.transport.get_write_buffer_size()
        for c in sorted(live, key=lambda c: c.buffered, reverse=True):
            if self._output_bytes <= budget:
                break
            held = c.buffered
            c.close(
                f"slow consumer: {held} bytes unsent, and the output of all connections is over "
                f"Limits/OutputBudget ({budget} bytes); this connection held the most",
                abort=True,
            )
            self._output_bytes -= held
            c.buffered = 0
    def _uncount(self, conn: Connection) -> None:
        if conn.counted == "pending":
            self._pending_logons -= 1
        elif conn.counted == "user" and conn.user is not None:
            left = self._user_connections.get(conn.user, 0) - 1
            if left > 0:
                self._user_connections[conn.user] = left
            else:
                self._user_connections.pop(conn.user, None)
        conn.counted = ""

    # --- authentication (docs/security.md) ------------------------------------------------

    def _gate(self, conn: Connection, items: list) -> None:
        """Commands of a connection not yet authenticated: the first must be a logon;
        while it is verified, the rest wait and reading pauses."""
        if conn.held is not None:
            conn.held.extend(items)
            return
        first = items[0]
        if type(first) is not m.Logon:
            log.warning("connection %s from %s refused: %s before logon", conn.conn_id, conn.address,
                        type(first).__name__)
            self._refuse(conn, getattr(first, "cid", None),
                         errors.NotAuthenticated("this server requires a logon with credentials before any command"))
            return
        self._verify(conn, items[1:], self._verify_logon(conn, first))

    def _verify(self, conn: Connection, rest: list, verification: Coroutine[Any, Any, None]) -> None:
        """Hold ``rest`` (and pause reading) while ``verification`` runs off the loop."""
        conn.held = list(rest)
        if conn.transport is not None:
            conn.transport.pause_reading()
        task = asyncio.get_running_loop().create_task(verification)
        self._verifying.add(task)
        task.add_done_callback(self._verifying.discard)

    async def _verify_logon(self, conn: Connection, logon: m.Logon) -> None:
        now = self.clock()
        if self.auth.by_certificate and conn.config.tls is not None and peer_user(conn.transport) is not None:
            verdict = self.auth.certificate(peer_user(conn.transport), logon.user_id, conn.host, now)
        else:
            verdict = await self.auth.verify(logon.user_id, logon.password, conn.host, now)
        if conn.closed or self._failure is not None:
            return
        if verdict.user is None:
            log.warning("logon refused from %s (client %r, user %r): %s", conn.address, logon.client_name,
                        logon.user_id, verdict.detail)
            self._refuse(conn, logon.cid, errors.NotAuthenticated(verdict.reason))
            return
        if not self._admit(conn, verdict.user, logon.cid):
            return
        held, conn.held = conn.held or [], None
        self._handle(conn, [logon, *held])
        if not conn.closed and not self._reading_paused and conn.transport is not None:
            conn.transport.resume_reading()

    def _admit(self, conn: Connection, user: str, cid: str | None) -> bool:
        """``conn`` is ``user``: count it against MaxConnectionsPerUser, tell the engine."""
        limit = self.config.limits.connections_per_user_max
        if self._user_connections.get(user, 0) >= limit:
            log.warning("logon of user %r from %s refused: %d connections (MaxConnectionsPerUser)", user,
                        conn.address, limit)
            self._refuse(conn, cid, errors.LimitExceeded(
                f"user {user!r} holds {limit} connections, the limit (Limits/MaxConnectionsPerUser)",
                limit="MaxConnectionsPerUser", max=limit))
            return False
        self._uncount(conn)
        conn.user, conn.authenticated, conn.counted = user, True, "user"
        self._user_connections[user] = self._user_connections.get(user, 0) + 1
        self.engine.authenticate(conn.conn_id, user)
        log.info("connection %s from %s authenticated as %r", conn.conn_id, conn.address, user)
        return True

    def _refuse(self, conn: Connection, cid: str | None, error: errors.ConveyorError) -> None:
        """Answer ``error`` to the command ``cid`` and close the connection."""
        details = {k: v for k, v in error.details.items() if isinstance(v, (str, int, float, bool))} or None
        conn.write_frames(encode_frames([m.Ack(ack_type="processed", cid=cid, status="failure", reason=str(error),
                                               code=error.code, details=details)]))
        conn.close(str(error))

    # --- the admin interface's hooks (docs/security.md, "The admin interface") -----------------

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
        """Who an admin request is, if it may read (``full``: act): HTTP Basic credentials
        from ``authorization``, or the transport's verified client certificate. None when
        authentication is off (the admin port is then protected only by where it
        listens). Raises NotAuthenticated (answer 401) or NotEntitled (answer 403)."""
        if not self.auth.required:
            return None
        peer = transport.get_extra_info("peername") if transport is not None else None
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        cert_user = peer_user(transport) if self.auth.by_certificate else None
        user, password = basic_credentials(authorization)
        if cert_user is not None and password is None:
            verdict = self.auth.certificate(cert_user, user, host, self.clock())
        else:
            verdict = await self.auth.verify(user, password, host, self.clock())
        if verdict.user is None:
            log.warning("admin request refused from %s (user %r): %s", host, user, verdict.detail)
            raise errors.NotAuthenticated(verdict.reason)
        permission = Permission.ADMIN_FULL if full else Permission.ADMIN_READ
        self.engine.entitlements.for_user(verdict.user).check(permission)
        return verdict.user

    def reload_security(self, *, force: bool = False) -> None:
        """Reload what changed (everything with ``force``, e.g. on SIGHUP): the users file,
        TLS certificates, and the configuration's ``Entitlement``. A reload that fails is
        logged and keeps what was in force."""
        if self._failure is not None:
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

    def _handle(self, conn: Connection, items: list) -> None:
        if self._failure is not None:
            return  # the connection is closing: nothing more is accepted
        if not conn.authenticated and self.auth.required:
            self._gate(conn, items)
            return
        self._frames_in += 1
        self._replays_blocked = False  # a command may have started a replay
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
        engine = self.engine
        if (engine.replays_pending and not self._replays_blocked) or engine.fanout_pending:
            self._schedule_pump()
        deadline = self.engine.next_deadline()
        if deadline is not None and deadline < self._timer_at:
            self._timer_at = deadline
            self._wake_timer.set()

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """One turn of background delivery: fan-outs a filter budget cut short, and
        bookmark replays for the connections whose socket takes more."""
        self._pump_scheduled = False
        if self._failure is not None:
            return
        self._paced = max(1, self.engine.paced_connections())  # _replay_room shares the budget among them
        more = self.engine.pump_replays(self.clock(), paused=self._writing_paused, room=self._replay_room)
        # Nothing to do until a socket drains (resume_writing) or a command arrives.
        self._replays_blocked = not more
        self._after_engine()

    def _flush_output(self) -> None:
        out = self.engine.take_output()
        if not out:
            return
        for conn_id, msgs in out.items():
            conn = self.connections.get(conn_id)
            if conn is not None:
                conn.messages_out += len(msgs)
                try:
                    frames = encode_frames(msgs)
                except Exception:  # noqa: BLE001 - one message that cannot be encoded must not cost the others
                    frames = _encode_each(conn_id, msgs)
                conn.write_frames(frames)

    def _took_input(self, conn: Connection, size: int) -> None:
        """Count client input; past INPUT_BYTES_PER_TURN, ``conn`` stops reading until the
        loop has run what is ready (a group commit's completion first)."""
        self._turn_input += size
        if self._turn_input < INPUT_BYTES_PER_TURN or conn.closed or conn.transport is None:
            return
        conn.transport.pause_reading()
        self._yielded.append(conn)
        if len(self._yielded) == 1:
            asyncio.get_running_loop().call_soon(self._next_input_turn)

    def _next_input_turn(self) -> None:
        self._turn_input = 0
        yielded, self._yielded = self._yielded, []
        if self._reading_paused:
            return  # the journal's backlog holds every connection; its end resumes them
        for conn in yielded:
            if not conn.closed and conn.held is None and conn.transport is not None:
                conn.transport.resume_reading()

    def _pause_reading(self, pause: bool) -> None:
        self._reading_paused = pause
        for conn in self.connections.values():
            if conn.transport is not None and not conn.closed:
                (conn.transport.pause_reading if pause else conn.transport.resume_reading)()

    # --- group commit --------------------------------------------------------------------

    async def _writer(self) -> None:
        """Write and fsync each group, then release what waited for it. Returns once the
        server is stopping (stop() writes what is left); an exception (a failed write or
        fsync) ends it, and supervision fails the server."""
        flush_interval = self.config.transaction_log.flush_interval_s if self.config.transaction_log else 0.0
        while True:
            if not self._stopping:
                await self._wake_writer.wait()
                if flush_interval and not self._stopping:
                    await asyncio.sleep(flush_interval)
            self._wake_writer.clear()
            if self._stopping:
                return  # stop() drains the journal itself, bounded
            if not await self._write_group():
                continue
            if self._reading_paused and self.journal.end - self.journal.durable_end < JOURNAL_BACKLOG_BYTES_MAX // 2:
                self._pause_reading(False)
            self._after_engine()

    async def _write_group(self) -> bool:
        """Write what is buffered on the I/O thread and apply it; False when nothing was."""
        journal = self.journal
        batch = journal.take_batch()
        if batch is None:
            return False
        started = time.perf_counter()
        end = await asyncio.get_running_loop().run_in_executor(self._io, journal.write_batch, batch)
        self.commit_stats.add(time.perf_counter() - started, batch.bytes, batch.records)
        journal.mark_durable(end)
        self._commits += 1
        self._release_durable()
        self.engine.on_durable(self.clock())
        return True

    async def _drain_journal(self) -> None:
        """At shutdown, after the writer returned: write what was appended since (the
        connections' ends). Applying a group may append more (expiries, replication
        bookkeeping), so after STOP_GROUPS_MAX groups the rest is written without
        being applied: shutdown never waits for an engine that keeps appending."""
        for _ in range(STOP_GROUPS_MAX):
            if not await self._write_group():
                return
            self._flush_output()
        await self._write_unapplied()

    async def _write_unapplied(self) -> None:
        """At shutdown: make everything appended so far durable, without applying it."""
        batch = self.journal.take_batch()
        if batch is not None:
            end = await asyncio.get_running_loop().run_in_executor(self._io, self.journal.write_batch, batch)
            self.journal.mark_durable(end)

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
                    if now - self._last_security_check >= SECURITY_CHECK_S:
                        self._last_security_check = now
                        self.reload_security()
                    if now - self._last_checkpoint >= CHECKPOINT_INTERVAL_S:
                        self._last_checkpoint = now
                        await self._checkpoint()
                self._after_engine()
                deadline = self.engine.next_deadline()
            wait = TIMER_PERIOD_S_MAX if deadline is None else max(0.0, min(TIMER_PERIOD_S_MAX, deadline - now))
            self._timer_at = now + wait
            self._wake_timer.clear()
            try:
                async with asyncio.timeout(wait):  # not wait_for: it can drop stop()'s cancellation
                    await self._wake_timer.wait()
            except TimeoutError:
                pass

    async def _checkpoint(self, *, final: bool = False) -> None:
        """Write queues.ack / publishers.seq once durable, then apply retention."""
        tlog = self.config.transaction_log
        if tlog is None:
            return
        if not final and self.journal.end == self._checkpointed_end:
            return
        cp = self.engine.checkpoint()
        if final:
            await self._write_unapplied()  # the writer is gone: a disconnect may have appended
        else:
            await self.wait_durable(cp.position)  # the writer signals it; a failure raises
        loop = asyncio.get_running_loop()
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

    # --- housekeeping ----------------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        self.disk.check_free_space(now)
        self._stalls.close_stalled(self._writing_paused, self.connections, self.engine.querying, now)
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
            if idle is None and conn.client and not self.engine.subscribed(conn.conn_id):
                idle = self.config.limits.idle_timeout_s  # a quiet subscriber is not idle
            if idle and now - conn.last_heard > idle:
                conn.close(f"idle for {now - conn.last_heard:.1f} s")
            elif conn.counted == "pending" and now - conn.connected_at > self.config.limits.logon_timeout_s:
                conn.close(f"no logon within {self.config.limits.logon_timeout_s:g} s (Limits/LogonTimeout)")
        for conn in beats:
            conn.write_frames(encode_frames([m.ServerHeartbeat()]))

    # --- replication links (server/links.py; the engine decides) ----------------------------

    def _start_links(self) -> None:
        repl = self.config.replication
        for dest in repl.destinations if repl else ():
            link = OutgoingLink(self, dest.name, dest.addresses, dest.endpoints)
            self.spawn(link.run(), name=f"replication link to {dest.name}")

    def register_replica(self, conn: Connection) -> None:
        """A source connected to the incoming replication transport."""
        conn.client = False
        conn.conn_id = self._next_conn_id
        self._next_conn_id += 1
        if self._failure is not None:
            conn.close(f"server failed: {self._failure.__cause__}", abort=True)
            return
        self.connections[conn.conn_id] = conn
        self.engine.replica_connected(conn.conn_id)
        log.info("replication: source connected from %s", conn.peer)

    def unregister_replica(self, conn: Connection) -> None:
        if self.connections.pop(conn.conn_id, None) is not None and self._failure is None:
            self.engine.replica_disconnected(conn.conn_id)
            self._after_engine()

    def replica_frames(self, conn: Connection, items: list) -> None:
        if self._failure is not None:
            return
        if self.auth.required and not conn.authenticated:
            self._gate_replica(conn, items)  # a source authenticates like a client
            return
        self.engine.replica_frames(conn.conn_id, items, self.clock())
        self._after_engine()

    def _gate_replica(self, conn: Connection, items: list) -> None:
        if conn.held is not None:
            conn.held.extend(items)
            return
        hello = items[0]
        if not isinstance(hello, p_repl.Hello):
            self._refuse_replica(conn, "the link must start with its handshake")
            return
        self._verify(conn, items[1:], self._verify_replica(conn, hello))

    async def _verify_replica(self, conn: Connection, hello: p_repl.Hello) -> None:
        now = self.clock()
        cert_user = peer_user(conn.transport) if conn.config.tls is not None else None
        if self.auth.by_certificate and cert_user is not None:
            verdict = self.auth.certificate(cert_user, hello.user, conn.host, now)
        else:
            # counted apart from clients' failed logons (security/authenticator.py, rule 2)
            verdict = await self.auth.verify(hello.user, hello.password, conn.host, now, link=True)
        if conn.closed or self._failure is not None:
            return
        source = hello.profile.instance
        if verdict.user is None:
            log.warning("replication from %s (%s, user %r) refused: %s", source, conn.address, hello.user,
                        verdict.detail)
            self._refuse_replica(conn, verdict.reason)
            return
        if not self.engine.entitlements.for_user(verdict.user).allows(Permission.REPLICATE):
            log.warning("replication from %s (%s) refused: user %r is not entitled to replicate", source,
                        conn.address, verdict.user)
            self._refuse_replica(conn, f"user {verdict.user!r} is not entitled to replicate to this instance")
            return
        conn.user, conn.authenticated = verdict.user, True
        log.info("replication from %s (%s) authenticated as %r", source, conn.address, verdict.user)
        held, conn.held = conn.held or [], None
        self.replica_frames(conn, [hello, *held])
        if not conn.closed and not self._reading_paused and conn.transport is not None:
            conn.transport.resume_reading()

    def _refuse_replica(self, conn: Connection, reason: str) -> None:
        conn.write_frames(encode_frames([p_repl.Refused(reason=reason, code=errors.NotAuthenticated.code)]))
        conn.close(f"replication refused: {reason}")

    def link_up(self, destination: str, conn: Connection, welcome: p_repl.Welcome) -> None:
        """An outgoing link finished its handshake (raises ReplicationRefused)."""
        if self._failure is not None:
            raise errors.ReplicationRefused("the server failed")
        if self._stopping:  # stop() closed the connections already: this one would stay open
            raise errors.ReplicationRefused("the server is stopping")
        conn.client = False
        conn.conn_id = self._next_conn_id
        self._next_conn_id += 1
        self.engine.link_up(destination, conn.conn_id, welcome, self.clock())
        self.connections[conn.conn_id] = conn
        self._after_engine()

    def link_acked(self, conn: Connection, acked: p_repl.Acked) -> None:
        if self._failure is not None:
            return
        self.engine.link_acked(conn.conn_id, acked, self.clock())
        self._after_engine()

    def link_lost(self, destination: str, conn: Connection, reason: str) -> None:
        self.connections.pop(conn.conn_id, None)
        if self._failure is None:
            self.engine.link_down(destination, conn.conn_id, reason, self.clock())
            self._after_engine()

    def link_unreachable(self, destination: str, reason: str) -> None:
        if self._failure is None:
            self.engine.link_down(destination, None, reason, self.clock())

    def statistics(self) -> ServerStats:
        return ServerStats(
            connections=len(self.connections),
            frames_in=self._frames_in,
            commits=self._commits,
            journal_end=self.journal.end,
            journal_durable_end=self.journal.durable_end,
            failed=self._failure is not None,
            disk_free_bytes=self.disk.free_bytes,
            scrub_passes=self.disk.scrub_passes,
            scrub_bytes=self.disk.scrub_bytes,
            scrub_problems=self.disk.scrub_problems,
        )
