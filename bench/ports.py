"""Loopback ports for servers that the benchmarks and the tests start.

A port is often written into a configuration (a replication transport its peers dial)
well before its server binds it. A port the kernel picks (bind to 0) comes from the
ephemeral range, where any outgoing connection may take it meanwhile; under pytest-xdist
another worker's server could take it too. So ports come from below the ephemeral range
(32768 and up on Linux), each xdist worker from a share of its own, and a process never
hands out the same port twice."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time

_PICKED: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, from this process's (and xdist worker's) share of
    20000-32000, never one handed out before by this process."""
    rng = random.Random()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    span = (32000 - 20000) // workers
    lo = 20000 + (index % workers) * span
    for _ in range(200):
        port = rng.randrange(lo, lo + span)
        if port in _PICKED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _PICKED.add(port)
            return port
    raise RuntimeError(f"no free port in {lo}-{lo + span}")


def wait_port(port: int, timeout: float = 30, proc: subprocess.Popen | None = None) -> None:
    """Return once ``port`` accepts a connection; raise at ``timeout``, or at once when
    ``proc`` (the server that should bind it) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server for port {port} exited with {proc.returncode} before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")
