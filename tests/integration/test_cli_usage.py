"""The real ``conveyor`` command as a new user types it: options before the message body,
one clean line for what the client library reports, exit codes (Ctrl-C in subscribe:
130; an unreadable --file: 2), filter errors that name the filter, the README's
synopsis of ``users``, and the small things (an empty DATA, --ack on a topic, the
queues table's age column)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conveyor import Client
from tests.integration.test_cli_names import QUEUE, TIMESTAMP, conveyor
from tests.serverproc import REPO


def _replay(uri: str, topic: str, count: int) -> list:
    proc = conveyor("subscribe", topic, "--bookmark", "0", "--count", str(count), "--timeout", "20", "--server", uri)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


# --- item 3: options before the message body --------------------------------------------


def test_options_may_come_before_the_message_body(server_factory):
    server = server_factory(recorded="Work")
    for args in (["--server", server.uri, "--json", '[{"n": 1}, {"n": 2}]'],
                 ["--server", server.uri, "--name", "X", '{"n": 3}'],
                 ["--json", "--server", server.uri, '{"n": 4}']):
        proc = conveyor("publish", "Work", *args)
        assert proc.returncode == 0 and "published" in proc.stderr, (args, proc.stderr)
    assert _replay(server.uri, "Work", 4) == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]


def test_a_stray_argument_is_refused_under_the_command_s_own_usage(server_factory):
    proc = conveyor("publish", "Work", '{"n": 1}', "extra", "--server", "tcp://127.0.0.1:1")
    assert proc.returncode == 2
    assert "usage: conveyor publish" in proc.stderr and "unrecognized arguments: extra" in proc.stderr


def test_ack_takes_options_between_bookmarks(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE)
    assert conveyor("publish", "Work", "--server", server.uri, input='{"n": 1}\n{"n": 2}\n').returncode == 0
    proc = conveyor("sow", "WorkToDo", "--show-bookmarks", "--server", server.uri)
    first, second = (line.split("\t")[0] for line in proc.stdout.splitlines())
    proc = conveyor("ack", "WorkToDo", first, "--server", server.uri, second)
    assert proc.returncode == 0 and "2 message(s) acknowledged" in proc.stderr, proc.stderr


# --- item 5: what the client library reports is one clean line ----------------------------


def test_a_refused_publish_is_one_line_without_log_decoration(server_factory):
    server = server_factory(recorded="Work")
    proc = conveyor("publish", "Work", "--server", server.uri, input='{"n": 1}\nnot json\n')
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("conveyor publish: publish 2 refused by the server: topic 'Work' takes JSON")
    assert lines[1] == "conveyor publish: 1 message(s) published to Work, 1 refused by the server (reasons above)"
    assert not TIMESTAMP.search(proc.stderr) and "WARNING" not in proc.stderr and "client-" not in proc.stderr


def test_verbose_keeps_the_full_log_records(server_factory):
    server = server_factory(recorded="Work")
    proc = conveyor("-v", "publish", "Work", "not json", "--server", server.uri)
    assert proc.returncode == 1
    assert re.search(TIMESTAMP.pattern + r",\d+ WARNING conveyor.client: client ", proc.stderr), proc.stderr


# --- item 12: exit codes ------------------------------------------------------------------


def _ctrl_c_possible() -> None:
    """In the child: SIGINT as a terminal gives it (a test run in the background by a
    shell without job control ignores SIGINT, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_subscribe_exits_130_with_its_acknowledgements_sent(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE, admin=True)
    command = Path(sys.executable).with_name("conveyor")
    program = [str(command)] if command.exists() else [sys.executable, "-m", "conveyor"]
    proc = subprocess.Popen([*program, "subscribe", "WorkToDo", "--ack", "--server", server.uri],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=_ctrl_c_possible)
    try:
        with Client("order-entry").connect(server.uri) as client:
            client.publish("Work", {"n": 1})
            client.flush()
        assert json.loads(proc.stdout.readline()) == {"n": 1}  # printed, so acknowledged
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    with urllib.request.urlopen(server.admin_url + "/amps/instance/queues/WorkToDo", timeout=10) as resp:
        stats = json.loads(resp.read())
        assert stats["acknowledged"] == 1, stats


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_missing_file_is_bad_usage(json_flag, tmp_path):
    missing = tmp_path / "orders.jsonl"
    proc = conveyor("publish", "Work", *json_flag, "--file", str(missing), "--server", "tcp://127.0.0.1:1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"conveyor: --file '{missing}': No such file or directory"


# --- item 13: the README's synopsis of users ----------------------------------------------


def test_the_readme_synopsis_of_users_is_what_the_command_takes(tmp_path):
    readme = (REPO / "README.md").read_text()
    lines = [line.split("#")[0] for line in readme.splitlines() if line.startswith("conveyor users ")]
    assert {line.split()[2] for line in lines} == {"add", "remove", "list"}, lines
    for line in lines:
        verb = line.split()[2]
        helptext = conveyor("users", verb, "--help").stdout
        documented = set(re.findall(r"--[a-z-]+", line))
        offered = set(re.findall(r"--[a-z-]+", helptext)) - {"--help"}
        assert documented == offered, (verb, documented, offered)
        assert ("NAME" in line) == ("name" in helptext.split("\n\n")[0]), (verb, line)
    # and as written: add, list, remove, the password from stdin
    users = tmp_path / "users"
    users.write_text("")
    proc = conveyor("users", "add", "alice", "--file", str(users), "--password-stdin", input="s3cret\n")
    assert proc.returncode == 0, proc.stderr
    assert conveyor("users", "list", "--file", str(users)).stdout.split() == ["alice"]
    assert conveyor("users", "remove", "alice", "--file", str(users)).returncode == 0
    assert conveyor("users", "list", "--file", str(users)).stdout.split() == []


# --- item 15: filter errors ---------------------------------------------------------------


def test_a_filter_error_names_the_filter_and_how_field_paths_are_written(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE)
    proc = conveyor("subscribe", "Work", "--filter", "qty > 5", "--timeout", "1", "--server", server.uri)
    assert proc.returncode == 2
    assert proc.stderr.startswith("conveyor: the filter 'qty > 5' is not valid: unexpected token 'qty'"), proc.stderr
    assert "field paths start with /" in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = conveyor("sow", "WorkToDo", "--filter", "order.qty > 5", "--server", server.uri)
    assert proc.returncode == 2 and "the filter 'order.qty > 5' is not valid" in proc.stderr, proc.stderr
    assert "field paths start with /" in proc.stderr
    # A mistake elsewhere: the filter is named, without the hint about paths.
    proc = conveyor("sow", "WorkToDo", "--filter", "/qty > 'x", "--server", server.uri)
    assert proc.returncode == 2 and "the filter \"/qty > 'x\" is not valid: unterminated string" in proc.stderr
    assert "field paths" not in proc.stderr


# --- item 16: the small things ------------------------------------------------------------


def test_an_empty_message_body_is_refused(server_factory):
    server = server_factory(recorded="Work")
    proc = conveyor("publish", "Work", "", "--server", server.uri)
    assert proc.returncode == 2 and "DATA is empty" in proc.stderr and "nothing was published" in proc.stderr
    proc = conveyor("subscribe", "Work", "--bookmark", "0", "--timeout", "1", "--server", server.uri)
    assert proc.stdout == ""


def test_ack_on_a_topic_says_it_has_no_effect(server_factory):
    server = server_factory(recorded="Work")
    assert conveyor("publish", "Work", '{"n": 1}', "--server", server.uri).returncode == 0
    proc = conveyor("subscribe", "Work", "--bookmark", "0", "--ack", "--count", "1", "--timeout", "20",
                    "--server", server.uri)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"n": 1}
    assert "--ack has no effect: a replay (--bookmark) has no queue semantics" in proc.stderr, proc.stderr
    with Client("live-publisher").connect(server.uri) as client:
        sub = subprocess.Popen([sys.executable, "-m", "conveyor", "subscribe", "Work", "--ack", "--count", "1",
                                "--timeout", "30", "--server", server.uri], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
        try:
            # Until the subscription is in place, what is published goes by unseen.
            for _ in range(120):
                client.publish("Work", {"n": 2})
                client.flush()
                try:
                    out, err = sub.communicate(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.communicate()
    assert sub.returncode == 0 and json.loads(out) == {"n": 2}, err
    assert "--ack has no effect: 'Work' is a topic, not a queue" in err, err


def test_the_queues_table_names_the_age_column_oldest(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE, admin=True)
    proc = conveyor("queues", "--admin", server.admin_url)
    header = proc.stdout.splitlines()[0].split()
    assert "OLDEST" in header and "BEHIND" not in header, proc.stdout


def test_ack_on_a_name_that_is_no_queue_says_so_without_protocol_names(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE)
    proc = conveyor("ack", "Work", "1|1|1", "--server", server.uri)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("conveyor: 'Work' is not a queue: ack settles the messages of a queue "
                                   "(`conveyor queues` lists them)")


def test_config_check_lists_sow_topics_and_views(tmp_path):
    config = tmp_path / "conveyor.xml"
    config.write_text(f"""<AMPSConfig><Name>views</Name>
      <TransactionLog><JournalDirectory>{tmp_path / "journal"}</JournalDirectory>
        <Topic><Name>orders</Name><MessageType>json</MessageType></Topic>
        <Topic><Name>Work</Name><MessageType>json</MessageType></Topic></TransactionLog>
      <SOW>
        <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/orderId</Key></Topic>
        <View><Name>value_by_region</Name><MessageType>json</MessageType>
          <UnderlyingTopic>orders</UnderlyingTopic>
          <Projection><Field>/region</Field><Field>SUM(/qty) AS /qty</Field></Projection>
          <Grouping><Field>/region</Field></Grouping></View>
        {QUEUE}
      </SOW></AMPSConfig>""")
    proc = conveyor("config", "check", str(config))
    assert proc.returncode == 0, proc.stderr
    assert "  SOW topic   orders (json), keyed by /orderId" in proc.stdout
    assert "  view        value_by_region (json, view) over orders" in proc.stdout
    assert "  queue       WorkToDo (Queue, at-least-once) over Work, a publish to WorkToDo goes to Work" in proc.stdout
