"""The demo's server (examples/demo_pipeline.py, ``make demo``) takes free ports, client
and admin alike, so it never clashes with a server on 9007 (``make run``)."""

from __future__ import annotations

import errno
import importlib.util
import json
import socket
from pathlib import Path

from tests.integration.test_cli_names import conveyor
from tests.serverproc import REPO


def _demo():
    spec = importlib.util.spec_from_file_location("demo_pipeline", REPO / "examples" / "demo_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hold_port_9007() -> socket.socket | None:
    """A listener on 127.0.0.1:9007, as `make run` leaves it (None: something holds it already)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 9007))
    except OSError as exc:
        sock.close()
        assert exc.errno == errno.EADDRINUSE, exc
        return None
    sock.listen()
    return sock


def test_the_demo_server_runs_beside_a_server_on_9007(tmp_path: Path):
    holder = _hold_port_9007()
    server = None
    try:
        server, uri = _demo().start_server(tmp_path)
        assert not uri.endswith(":9007"), uri
        proc = conveyor("publish", "Work", '{"order": 1}', "--server", uri)
        assert proc.returncode == 0, proc.stderr
        proc = conveyor("subscribe", "Work", "--bookmark", "0", "--count", "1", "--timeout", "20", "--server", uri)
        assert [json.loads(line) for line in proc.stdout.splitlines()] == [{"order": 1}], proc.stderr
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        if holder is not None:
            holder.close()
