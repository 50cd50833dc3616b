"""The conveyor command: --help everywhere, exit codes, and the journal tools."""

import json
import subprocess
import sys

import pytest

from conveyor import Client


def run(*args, input=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, input=input, timeout=timeout)


@pytest.mark.parametrize(
    "args",
    [[], ["serve"], ["publish"], ["subscribe"], ["sow"], ["ack"], ["journal"], ["journal", "dump"], ["journal", "verify"], ["journal", "repair"]],
)
def test_help(args):
    proc = run(*args, "--help")
    assert proc.returncode == 0 and "usage: conveyor" in proc.stdout


def test_usage_error_exit_code():
    assert run("publish").returncode == 2


def test_publish_subscribe_sow_ack_round_trip(server_factory):
    server = server_factory(
        recorded="work",
        queues="<Queue><Name>Q</Name><MessageType>json</MessageType><UnderlyingTopic>work</UnderlyingTopic></Queue>",
    )
    proc = run("publish", "work", "--server", server.uri, input='{"n": 1}\n{"n": 2}\n{"n": 3}\n')
    assert proc.returncode == 0, proc.stderr
    assert "published 3" in proc.stderr
    proc = run("sow", "Q", "--server", server.uri, "--show-bookmarks")
    lines = proc.stdout.splitlines()
    assert len(lines) == 3
    first_bookmark = lines[0].split("\t")[0]
    proc = run("ack", "Q", first_bookmark, "--server", server.uri)
    assert proc.returncode == 0 and "1 message(s) acknowledged" in proc.stderr
    proc = run("subscribe", "Q", "--server", server.uri, "--count", "2", "--ack", "--timeout", "5")
    assert [json.loads(x)["n"] for x in proc.stdout.splitlines()] == [2, 3]
    proc = run("subscribe", "work", "--server", server.uri, "--bookmark", "0", "--timeout", "1")
    assert [json.loads(x)["n"] for x in proc.stdout.splitlines()] == [1, 2, 3]


def test_connection_refused_is_exit_1():
    proc = run("publish", "t", "x", "--server", "tcp://127.0.0.1:1")
    assert proc.returncode == 1 and "cannot connect" in proc.stderr


def test_journal_dump_verify_and_corruption_exit_code(server_factory, tmp_path):
    server = server_factory(recorded="t")
    with Client("p").connect(server.uri) as client:
        for n in range(5):
            client.publish("t", {"n": n})
        client.flush()
    server.stop()
    journal = tmp_path / "journal"
    proc = run("journal", "dump", str(journal))
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["data"]["n"] for r in records if r["type"] == "publish"] == [0, 1, 2, 3, 4]
    assert run("journal", "verify", str(journal)).returncode == 0
    # damage a sealed record in the middle: verify reports it (exit 3)
    seg = sorted(journal.glob("*.log"))[0]
    raw = bytearray(seg.read_bytes())
    raw[60] ^= 0xFF
    seg.write_bytes(bytes(raw))
    proc = run("journal", "verify", str(journal))
    assert proc.returncode == 3, proc.stdout + proc.stderr
