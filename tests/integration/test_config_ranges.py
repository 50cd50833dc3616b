"""Issue 32, defect 4: a configuration value out of range is a configuration error like
any other, from the real CLI: exit 2, the element path, one line ending in a newline
(docs/cli.md, "Exit codes"). ``JournalSize 100T`` used to pass ``config check`` and make
``serve`` exit 1 with the journal's own message and no path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conveyor.config.model import JOURNAL_SEGMENT_BYTES_MAX
from conveyor.journal.format import SEGMENT_BYTES_MAX

CLI_SECONDS_MAX = 120.0  # a bound on a command that answers in about a second


def config(tmp_path, journal_size: str) -> str:
    path = tmp_path / "conveyor.xml"
    path.write_text(
        "<AMPSConfig><Transports><Transport><Name>clients</Name><Type>tcp</Type>"
        "<InetAddr>127.0.0.1:0</InetAddr><Protocol>amps</Protocol></Transport></Transports>"
        f"<TransactionLog><JournalDirectory>{tmp_path / 'journal'}</JournalDirectory>"
        f"<JournalSize>{journal_size}</JournalSize>"
        "<Topic><Name>t</Name><MessageType>json</MessageType></Topic></TransactionLog></AMPSConfig>")
    return str(path)


def conveyor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True,
                          timeout=CLI_SECONDS_MAX)


@pytest.mark.parametrize("command", [["config", "check"], ["serve", "--config"]], ids=["config check", "serve"])
@pytest.mark.parametrize("size", ["100T", "65G"])
def test_a_journal_size_above_what_the_journal_takes_is_a_configuration_error(tmp_path, command, size):
    proc = conveyor(*command, config(tmp_path, size))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("conveyor: configuration error: AMPSConfig/TransactionLog/JournalSize: ")
    assert "above the maximum" in proc.stderr and proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "journal").exists()  # refused before anything was created


def test_the_largest_journal_size_is_accepted(tmp_path):
    proc = conveyor("config", "check", config(tmp_path, "64G"))
    assert proc.returncode == 0, proc.stderr


def test_the_configuration_and_the_journal_agree_on_the_largest_segment():
    assert JOURNAL_SEGMENT_BYTES_MAX == SEGMENT_BYTES_MAX
