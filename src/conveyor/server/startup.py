"""The server's start-up before it serves: nothing is created on disk while something
would refuse the start anyway (another process holds the journal directory, a listening
address is taken, a transport's TLS files cannot be used), a journal a failed start
created is removed again, and the log's account of recovery (docs/operations.md,
"Start-up"). Used by :class:`conveyor.server.server.Server`; the CLI reads the element
paths of the listening addresses to name ``--port`` / ``--admin-port`` instead."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from conveyor import errors
from conveyor.config.model import Config, TransactionLog, Transport
from conveyor.engine.core import Checkpoint, Engine
from conveyor.journal import Journal
from conveyor.journal.files import remove_temporaries
from conveyor.journal.index import SealSummarizer
from conveyor.journal.lock import check_unlocked
from conveyor.security.tls import ServerTls
from conveyor.server.checkpoints import PAGES_DIRECTORY, snapshot_messages
from conveyor.server.net import bind_problem

log = logging.getLogger("conveyor.server")

ADMIN_LISTEN_PATH = "AMPSConfig/Admin/InetAddr"  # the element of the admin interface's address
RECOVERED_QUEUES_NAMED = 5  # the deepest queues the recovery line names


def listen_path(tc: Transport) -> str:
    """The configuration element a transport's address comes from (errors name it)."""
    return f"{tc.path or 'Transports/Transport'}/InetAddr"


def _listen_error(tc: Transport, exc: OSError) -> errors.ConfigError:
    return errors.ConfigError(
        f"cannot listen on {tc.host}:{tc.port}: {bind_problem(exc)}",
        path=listen_path(tc),
        hint="choose a free port and an address of this machine",
    )


def _listen_problem(host: str, port: int) -> OSError | None:
    """Why listening on ``host:port`` would fail for certain (taken, not allowed, a host
    that does not resolve), tried the way the event loop binds (every address the host
    resolves to, ``SO_REUSEADDR``, IPv6 only on IPv6) and let go at once; None otherwise."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return exc
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(1)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return exc
    return None


@dataclass
class _NewJournal:
    """A journal directory as it was before this server created its journal there: what
    a start that fails removes (the new entries, then the directories it created)."""

    directory: Path
    entries: frozenset[str]
    created: list[Path]  # the directory and its parents that did not exist, deepest first

    @classmethod
    def before(cls, directory: Path) -> _NewJournal:
        created = [p for p in (directory, *directory.parents) if not p.exists()]
        entries = frozenset(os.listdir(directory)) if directory.is_dir() else frozenset()
        return cls(directory, entries, created)

    def remove(self) -> None:
        try:
            check_unlocked(self.directory)  # nobody took the directory since: it is still ours
            names = set(os.listdir(self.directory)) - self.entries
        except (errors.JournalError, OSError):
            return
        for name in names:
            path = self.directory / name
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError as exc:
                log.warning("could not remove %s after the failed start: %s", path, exc)
        for path in self.created:
            try:
                path.rmdir()
            except OSError:
                break  # not empty: something else is there now
        log.info("journal %s: removed what the failed start created", self.directory)


def _check_listeners(config: Config, tls: dict[str, ServerTls]) -> None:
    """Before the journal is opened (created): ConfigError, as ``Server._bind`` would
    raise it, for an address that is already in use, not allowed or does not resolve
    (only those: anything this cannot tell for sure is left to ``_bind``), and for a
    transport's TLS files that cannot be used (loaded into ``tls``, kept for ``_bind``)."""
    for tc in config.transports or (Transport(name="default"),):
        exc = _listen_problem(tc.host, tc.port)
        if exc is not None:
            raise _listen_error(tc, exc)
        if tc.tls is not None:
            tls[tc.name] = ServerTls(tc.tls)  # ConfigError with the element's path
    admin = config.admin
    if admin is not None:
        exc = _listen_problem(admin.host, admin.port)
        if exc is not None:  # the wording of AdminInterface.bind
            raise errors.ConfigError(
                f"cannot listen on {admin.host}:{admin.port} for the admin interface: {bind_problem(exc)}",
                path=ADMIN_LISTEN_PATH,
                hint="choose a free port (conveyor serve --admin-port N), or remove <Admin>",
            )


def _open_journal(tlog: TransactionLog, summaries: SealSummarizer, tls: dict[str, ServerTls],
                  config: Config) -> tuple[Journal, _NewJournal | None]:
    """The server's journal, opened (created) only once nothing else refuses the start:
    not while another process holds the directory (the refusal names it), nor while a
    listening address is taken (the listeners are bound in ``start()``). With a new
    journal, what a failed start removes again."""
    directory = tlog.journal_directory.resolve()
    check_unlocked(directory)
    _check_listeners(config, tls)
    fresh = not directory.is_dir() or not any(directory.glob("*.log"))
    new = _NewJournal.before(directory) if fresh else None
    try:
        journal = Journal.open(tlog.journal_directory, segment_bytes=tlog.segment_bytes, logger=log)
    except BaseException:
        if new is not None:
            new.remove()  # the directories it may have created
        raise
    # With the directory locked and before any writer starts: the temporaries of
    # checkpoint, snapshot and sidecar writes that a crash cut short.
    for folder in (directory, directory / PAGES_DIRECTORY):
        removed = remove_temporaries(folder)
        if removed:
            log.warning("journal %s: removed %d temporary file(s) left by an interrupted write: %s",
                        folder, len(removed), ", ".join(removed[:5]) + (" ..." if len(removed) > 5 else ""))
    if fresh:
        log.info("journal %s: created a new, empty journal", directory)
    else:
        log.info("journal %s: opened, positions %d to %d", directory, journal.first_position, journal.end)
    # Sidecars for the Spark journal reader, written behind the write that seals a segment.
    journal.on_seal = summaries
    return journal, new


def recovery_line(engine: Engine, count: int, seconds: float, checkpoint: Checkpoint | None, durable: bool,
                  now: float) -> str:
    """The start's account of recovery: what the checkpoint restored (its position, the
    messages of the queues' snapshots), the journal records replayed, and what the
    queues hold now. "recovered N journal records" leads (scripts read it)."""
    line = f"recovered {count} journal records in {seconds:.3f} s"
    if checkpoint is not None:
        # The snapshots the engine used (one it refused, its queue replayed from the journal).
        restored = [snapshot_messages(snap) for name, snap in checkpoint.snapshots.items()
                    if (b := engine.bindings.get(name)) is not None and b.snapshot_events_from is not None]
        line += f" on top of the checkpoint at position {checkpoint.position}"
        if restored:
            line += f", which restored {sum(restored)} queued message(s) from {len(restored)} queue snapshot(s)"
        else:
            line += " (no queue snapshot: each queue replayed from its recovery point)"
    elif durable:
        line += " (no checkpoint: the whole journal)"
    if engine.queues:
        held = ((q.statistics(now).queue_depth, name) for name, q in engine.queues.items())
        depths = sorted(((depth, name) for depth, name in held if depth), key=lambda item: (-item[0], item[1]))
        line += f"; queues hold {sum(d for d, _ in depths)} message(s)"
        if depths:
            more = len(depths) - RECOVERED_QUEUES_NAMED
            line += (": " + ", ".join(f"{name} {depth}" for depth, name in depths[:RECOVERED_QUEUES_NAMED])
                     + (f" and {more} more queue(s)" if more > 0 else ""))
    return line
