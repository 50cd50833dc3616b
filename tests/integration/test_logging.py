"""``<Logging>`` on a real ``conveyor serve``: targets replace the stderr default, file
targets rotate by size and keep RotationCount files, gzip targets compress what they
rotate out, and a log file that cannot be opened stops the server at startup with the
element's path."""

from __future__ import annotations

import gzip
import subprocess
import sys

from conveyor.client import Client
from tests.serverproc import REPO, ServerProcess, write_config


def _with_logging(path, logging_xml: str):
    path.write_text(path.read_text().replace("<TransactionLog>", f"<Logging>{logging_xml}</Logging>\n<TransactionLog>", 1))
    return path


def test_file_and_gzip_targets_rotate_and_keep_a_bounded_history(tmp_path):
    logs = tmp_path / "logs"  # created by the server
    config = _with_logging(write_config(tmp_path), (
        f"<Target><Protocol>file</Protocol><FileName>{logs}/conveyor.log</FileName><Level>info</Level>"
        "<RotationThreshold>2K</RotationThreshold><RotationCount>2</RotationCount></Target>"
        f"<Target><Protocol>gzip</Protocol><FileName>{logs}/archive.log</FileName><Level>warning</Level>"
        "</Target>"
        f"<Target><Protocol>gzip</Protocol><FileName>{logs}/small.log</FileName>"
        "<RotationThreshold>1K</RotationThreshold><RotationCount>3</RotationCount></Target>"
    ))
    server = ServerProcess(config).start()
    try:
        for i in range(40):  # each logon writes connection, logon and close lines (~300 bytes)
            with Client(f"logging-{i}").connect(server.uri):
                pass
        with Client("last-one").connect(server.uri):
            pass
    finally:
        assert server.stop() == 0
    current = (logs / "conveyor.log").read_text()
    rotated = [logs / "conveyor.log.1", logs / "conveyor.log.2"]
    assert all(p.exists() for p in rotated) and not (logs / "conveyor.log.3").exists()
    assert all(p.stat().st_size <= 2048 for p in [logs / "conveyor.log", *rotated])
    assert "logon: client 'last-one'" in current + rotated[0].read_text()  # the newest lines, in the newest files
    assert " INFO conveyor" in rotated[1].read_text()
    assert (logs / "archive.log").read_text() == ""  # only warnings and above: none happened
    small = sorted(p.name for p in logs.glob("small.log*"))
    assert small == ["small.log", "small.log.1.gz", "small.log.2.gz", "small.log.3.gz"]
    assert "logon: client" in gzip.decompress((logs / "small.log.1.gz").read_bytes()).decode()
    assert "logon: client" not in server.log  # the targets replaced the stderr default


def test_a_log_file_that_cannot_be_opened_stops_the_server_with_the_path(tmp_path):
    (tmp_path / "not-a-dir").write_text("a file where the log directory should be")
    config = _with_logging(write_config(tmp_path), (
        f"<Target><Protocol>file</Protocol><FileName>{tmp_path}/not-a-dir/conveyor.log</FileName></Target>"
    ))
    done = subprocess.run([sys.executable, "-m", "conveyor", "serve", "--config", str(config)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert "AMPSConfig/Logging/Target[1]/FileName" in done.stderr and "cannot open log file" in done.stderr
    assert "Traceback" not in done.stderr
