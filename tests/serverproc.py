"""Start the real server as a subprocess on loopback, for integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from bench.ports import free_port

STARTUP_SECONDS_MAX = 60.0
CHECKPOINT_SECONDS_MAX = 30.0  # the server checkpoints every 5 s while its log moves

BASE_CONFIG = """\
<AMPSConfig>
    <Name>test-instance</Name>
    <Transports>
        <Transport>
            <Name>tcp</Name>
            <Type>tcp</Type>
            <InetAddr>127.0.0.1:0</InetAddr>
            <Protocol>amps</Protocol>
            {transport_extra}
        </Transport>
    </Transports>
    {admin}
    <TransactionLog>
        <JournalDirectory>{journal}</JournalDirectory>
        {txlog_extra}
        <Topic><Name>{recorded}</Name><MessageType>json</MessageType></Topic>
    </TransactionLog>
    <SOW>
        {queues}
    </SOW>
    {limits}
    {root_extra}
</AMPSConfig>
"""


ADMIN_LOOPBACK = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"


def write_config(
    directory: Path, *, queues: str = "", recorded: str = ".*", transport_extra: str = "", txlog_extra: str = "",
    limits: str = "", admin: bool = False, root_extra: str = "",
) -> Path:
    """``admin``: with an admin interface on a free loopback port (``ServerProcess.admin_url``).
    ``root_extra``: elements of AMPSConfig itself (Authentication, Entitlement, Limits...)."""
    journal = directory / "journal"
    path = directory / "config.xml"
    path.write_text(
        BASE_CONFIG.format(
            journal=journal, queues=textwrap.dedent(queues), recorded=recorded, transport_extra=transport_extra,
            txlog_extra=txlog_extra, limits=f"<Limits>{limits}</Limits>" if limits else "",
            admin=ADMIN_LOOPBACK if admin else "", root_extra=root_extra,
        )
    )
    return path


REPO = Path(__file__).resolve().parent.parent


class ServerProcess:
    """A `conveyor serve` subprocess; `uri` once it is listening.

    ``faults``: run it through tests/faults/launcher.py with these injected faults
    (``CONVEYOR_TEST_FAULTS`` syntax), the real CLI otherwise unchanged."""

    def __init__(self, config: Path, *, env: dict | None = None, faults: str | None = None) -> None:
        self.config = config
        self.env = env
        self.faults = faults
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.admin_url: str | None = None  # "conveyor admin on URL", when configured
        self.ports: list[int] = []  # every listener, in the order of the configuration's transports
        self.stderr_lines: list[str] = []

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> "ServerProcess":
        """Start serving clients on ``port`` (0: a free port below the ephemeral range)."""
        port = port or free_port()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(self.env or {}))
        program = ["-m", "conveyor"]
        if self.faults is not None:
            program = ["-m", "tests.faults.launcher"]
            env["CONVEYOR_TEST_FAULTS"] = self.faults
        self.proc = subprocess.Popen(
            [sys.executable, *program, "serve", "--config", str(self.config), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.monotonic() + STARTUP_SECONDS_MAX
        assert self.proc.stdout is not None
        self.ports = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("conveyor admin on "):
                self.admin_url = line.rsplit(" ", 1)[1].strip()
            if line.startswith("conveyor listening on port "):
                self.ports.append(int(line.rsplit(" ", 1)[1]))
                self.port = self.ports[0]
            elif line.startswith("conveyor ready"):
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return self
        self.proc.kill()
        raise RuntimeError("server did not start:\n" + "".join(self.stderr_lines[-40:]))

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM: graceful shutdown."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=30)
        return self.proc.returncode if self.proc else 0

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code of a server that stops by itself (a failure, a refusal)."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def restart(self) -> "ServerProcess":
        """Start again on the same port (clients can reconnect to the same URI)."""
        port = self.port or 0
        return self.start(port)

    @property
    def log(self) -> str:
        return "".join(self.stderr_lines)

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        """The server's log once it contains ``text`` (stderr is read by a thread)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log:
                return self.log
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not in the server log:\n{self.log[-3000:]}")


def checkpoint_mark(journal: Path) -> tuple[int, int] | None:
    """Which checkpoint ``journal``/queues.ack holds now (it is replaced by a rename,
    so inode and modification time change with every checkpoint), None before any."""
    try:
        st = (journal / "queues.ack").stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def wait_checkpoint(journal: Path, since: tuple[int, int] | None, timeout: float = CHECKPOINT_SECONDS_MAX) -> None:
    """Until the server has written a checkpoint after the one marked ``since`` (queues.ack
    is written last, after the queue snapshots and publishers.seq)."""
    deadline = time.monotonic() + timeout
    while checkpoint_mark(journal) == since:
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint in {journal} within {timeout} s")
        time.sleep(0.02)


@contextlib.asynccontextmanager
async def in_process_server(config, *, stop_seconds: float = 30.0):
    """A :class:`~conveyor.server.server.Server` serving ``config`` in this event loop
    (for a test that patches the server module or reads its state), stopped on exit."""
    from conveyor.server.server import Server

    srv = Server(config)
    await srv.start()
    stop = asyncio.Event()
    serving = asyncio.create_task(srv.run_until(stop))
    try:
        yield srv
    finally:
        stop.set()
        await asyncio.wait_for(serving, stop_seconds)
