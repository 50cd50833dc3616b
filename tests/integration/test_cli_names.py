"""Publishing to a name with the real ``conveyor`` command: a queue's name reaches the
queue (its DefaultPublishTarget defaults to a literal UnderlyingTopic), and a name that
is neither recorded, nor a queue's, nor subscribed gets a one-line warning, counted by
the server (``publishes_unrouted``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from conveyor import Client
from tests.serverproc import REPO

QUEUE = ("<Queue><Name>WorkToDo</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic>"
         "</Queue>")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def conveyor(*args: str, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The installed ``conveyor`` command (beside this Python), as a user runs it."""
    command = Path(sys.executable).with_name("conveyor")
    program = [str(command)] if command.exists() else [sys.executable, "-m", "conveyor"]
    return subprocess.run([*program, *args], capture_output=True, text=True, input=input, timeout=timeout, cwd=REPO)


def engine_counters(server) -> dict:
    with urllib.request.urlopen(server.admin_url + "/amps/instance/engine", timeout=10) as resp:
        return json.loads(resp.read())


def test_a_publish_to_a_queue_name_enters_the_queue(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE)
    proc = conveyor("publish", "WorkToDo", '{"n": 1}', "--server", server.uri)
    assert proc.returncode == 0 and "published 1 message(s) to WorkToDo" in proc.stderr, proc.stderr
    assert "warning" not in proc.stderr
    proc = conveyor("subscribe", "WorkToDo", "--count", "1", "--ack", "--timeout", "20", "--server", server.uri)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [{"n": 1}]
    # Recorded on the underlying topic, where a replay finds it.
    proc = conveyor("subscribe", "Work", "--bookmark", "0", "--count", "1", "--timeout", "20", "--server", server.uri)
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [{"n": 1}], proc.stderr


def test_a_publish_that_reaches_no_one_is_a_one_line_warning_and_counted(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE, admin=True)
    proc = conveyor("publish", "Wrok", '{"n": 1}', "--server", server.uri)
    assert proc.returncode == 0, proc.stderr  # pub/sub needs no declaration: not a failure
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("conveyor publish: warning: topic 'Wrok' is not recorded")
    assert "reached no one" in warnings[0] and "did you mean 'Work'?" in warnings[0]
    assert "published 1 message(s) to Wrok (1 reached no one" in proc.stderr
    assert not TIMESTAMP.search(proc.stderr) and "Traceback" not in proc.stderr
    # Three more from stdin: each counted, the warning printed once.
    proc = conveyor("publish", "Wrok", "--server", server.uri, input='{"n": 2}\n{"n": 3}\n{"n": 4}\n')
    assert proc.returncode == 0 and proc.stderr.count("warning") == 1, proc.stderr
    assert engine_counters(server)["publishes_unrouted"] == 4
    proc = conveyor("stats", "--admin", server.admin_url)
    assert "4 publish(es) reached no one" in proc.stdout, proc.stdout + proc.stderr


def test_a_publish_to_a_subscribed_topic_that_is_not_recorded_is_no_warning(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE, admin=True)
    with Client("listener").connect(server.uri) as client:
        sub = client.subscribe("Chatter")
        proc = conveyor("publish", "Chatter", '{"n": 1}', "--server", server.uri)
        assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
        msg = sub.get(30)
        assert msg is not None and json.loads(msg.data) == {"n": 1}
    proc = conveyor("publish", "Work", '{"n": 2}', "--server", server.uri)  # recorded: no warning either
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    assert engine_counters(server)["publishes_unrouted"] == 0
