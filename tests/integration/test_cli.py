"""The conveyor command: --help everywhere, exit codes, and the journal tools."""

import json
import subprocess
import sys

import pytest

from conveyor import Client
from tests.integration.test_durability import replay_all


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
    proc = run("subscribe", "work", "--server", server.uri, "--bookmark", "0", "--count", "3", "--timeout", "5")
    assert [json.loads(x)["n"] for x in proc.stdout.splitlines()] == [1, 2, 3]


def test_publish_of_lines_that_are_not_json_to_a_json_topic_says_which_were_refused(server_factory):
    server = server_factory(recorded="work")
    proc = run("publish", "work", "--server", server.uri, input='{"n": 1}\nhello\n{"n": 3}\n')
    assert proc.returncode == 1, proc.stderr
    assert "takes JSON messages" in proc.stderr and "2 message(s) published to work, 1 refused" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run("subscribe", "work", "--server", server.uri, "--bookmark", "0", "--count", "2", "--timeout", "5")
    assert [json.loads(x)["n"] for x in proc.stdout.splitlines()] == [1, 3]


def test_publish_json_reads_the_whole_input_as_one_document(server_factory, tmp_path):
    """``--json``: a pretty-printed array is one message per element, an object one
    message; input that is not JSON is refused before anything is sent."""
    server = server_factory(recorded="work")
    orders = tmp_path / "orders.json"
    orders.write_text(json.dumps([{"n": 1, "items": ["a", "b"]}, {"n": 2}, {"n": 3}], indent=2))
    proc = run("publish", "work", "--json", "--file", str(orders), "--server", server.uri)
    assert proc.returncode == 0 and "published 3" in proc.stderr, proc.stderr
    proc = run("publish", "work", "--json", "--server", server.uri, input='{\n  "n": 4\n}\n')
    assert proc.returncode == 0 and "published 1" in proc.stderr, proc.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('[\n  {"n": 5},\n  {"n": 6,}\n]\n')
    proc = run("publish", "work", "--json", "--file", str(broken), "--server", server.uri)
    assert proc.returncode == 2, proc.stderr
    assert "is not JSON (line 3, column" in proc.stderr and "nothing was published" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run("subscribe", "work", "--server", server.uri, "--bookmark", "0", "--timeout", "2")
    assert [json.loads(x) for x in proc.stdout.splitlines()] == [
        {"n": 1, "items": ["a", "b"]}, {"n": 2}, {"n": 3}, {"n": 4}]


def test_replaying_a_topic_that_is_not_recorded_is_an_error(server_factory):
    server = server_factory(recorded="work")
    proc = run("subscribe", "chatter", "--server", server.uri, "--bookmark", "0", "--timeout", "5")
    assert proc.returncode == 2 and "the transaction log does not record it" in proc.stderr, proc.stderr


def test_subscribing_to_a_name_that_is_no_queue_or_recorded_topic_warns(server_factory):
    server = server_factory(recorded="work", queues=(
        "<Queue><Name>WorkToDo</Name><MessageType>json</MessageType><UnderlyingTopic>work</UnderlyingTopic></Queue>"))
    proc = run("subscribe", "WorkToDoo", "--server", server.uri, "--timeout", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert "not a queue and not a recorded topic" in proc.stderr and "'WorkToDo'" in proc.stderr


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


def test_damage_in_the_open_segment_refuses_to_start_until_repaired(server_factory, tmp_path):
    """Issue 15, item 1: one flipped byte in the middle of the only (open) segment. The
    server used to start with a warning and drop every record after it, intact or not;
    now it refuses (exit 3) and `journal repair` says what it would drop first."""
    server = server_factory(recorded="t")
    with Client("p").connect(server.uri) as client:
        for n in range(2000):
            client.publish("t", {"n": n})
        client.flush()
    assert server.stop() == 0
    journal = tmp_path / "journal"
    [segment] = sorted(journal.glob("*.log"))
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    segment.write_bytes(bytes(raw))

    proc = run("serve", "--config", str(server.config), "--port", "0", timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert str(segment) in proc.stderr and "conveyor journal repair" in proc.stderr
    assert "still check out" in proc.stderr and "Traceback" not in proc.stderr
    assert segment.read_bytes() == bytes(raw)  # nothing was dropped

    plan = run("journal", "repair", str(journal))
    assert plan.returncode == 3
    assert "would keep the log up to position" in plan.stdout and "--apply" in plan.stdout
    assert "record(s) that still check out" in plan.stdout
    assert segment.read_bytes() == bytes(raw)  # a plan changes nothing

    done = run("journal", "repair", "--apply", str(journal))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kept the log up to position" in done.stdout
    assert run("journal", "verify", str(journal)).returncode == 0
    server.restart()  # starts on what is left
    with Client("r").connect(server.uri) as reader:
        got = [msg.json()["n"] for msg in replay_all(reader, "t")]
    assert 0 < len(got) < 2000 and got == list(range(len(got)))
