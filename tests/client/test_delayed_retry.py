"""Delayed retry and failure reasons with a real server, for both faces of the client
(docs/client.md; docs/queues.md, "Delayed retry" and "Failure reasons"):
``msg.cancel(delay=1)`` keeps the message from everyone for a second while the next one
is delivered; ``msg.expire(reason=...)`` puts the reason on the dead letter; a delay
survives a server restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

QUEUE = """
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <LeasePeriod>30s</LeasePeriod>
</Queue>
<Queue>
    <Name>Failed</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>failed</UnderlyingTopic>
</Queue>
"""
ACTIONS = """
<Actions><Action>
  <On><Module>amps-action-on-sow-expire-message</Module>
      <Options><Topic>Jobs</Topic><MessageType>json</MessageType></Options></On>
  <Do><Module>amps-action-do-publish-message</Module>
      <Options><Topic>failed</Topic><MessageType>json</MessageType>
      <Data>{ "message": {{AMPS_DATA}}, "reason": "{{AMPS_REASON}}", "why": "{{CONVEYOR_FAILURE_REASON}}", "by": "{{CONVEYOR_LAST_CONSUMER}}", "deliveries": {{CONVEYOR_DELIVERIES}} }</Data>
  </Options></Do>
</Action></Actions>
"""


def start(server_factory, **kwargs):
    return server_factory(queues=QUEUE, root_extra=ACTIONS, **kwargs)


def jobs_of(server, face, *bodies):
    """A worker that published ``bodies`` to jobs, and its subscription to Jobs (backlog 1)."""
    worker = face("worker").connect(server.uri)
    for body in bodies:
        worker.publish("jobs", body)
    worker.flush()
    return worker, worker.subscribe("Jobs", max_backlog=1)


def test_the_cli_and_the_admin_details_show_the_delay_and_the_reason(server_factory, face):
    """``conveyor queues Jobs`` (and the admin details it reads) while a message waits out
    its delay: how long it still waits and the reason its worker gave."""
    server = start(server_factory, admin=True)
    worker, jobs = jobs_of(server, face, {"n": 1})
    msg = jobs.get(10)
    msg.cancel(delay=60, reason="db timeout")
    worker.flush()
    env = {**os.environ, "CONVEYOR_ADMIN": server.admin_url}
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(server.admin_url + "/amps/instance/queues/Jobs/details", timeout=10) as reply:
            (row,) = json.load(reply)["messages"]
        if row["reason"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert row["reason"] == "db timeout" and 50 < row["not_before"] - time.time() <= 60, row
    proc = subprocess.run([sys.executable, "-m", "conveyor", "queues", "Jobs"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    header, line = [x for x in proc.stdout.splitlines() if "BOOKMARK" in x or msg.bookmark in x]
    assert "RETRY IN" in header and "FAILURE REASON" in header
    assert "db timeout" in line and "available" in line, proc.stdout


def test_a_delayed_cancel_comes_back_after_its_delay_while_the_next_message_flows(server_factory, face):
    server = start(server_factory)
    worker, jobs = jobs_of(server, face, {"n": 1}, {"n": 2})
    first = jobs.get(10)
    assert first is not None and first.json() == {"n": 1}
    first.cancel(delay=1, reason="db timeout")
    cancelled_at = time.monotonic()
    worker.flush()
    second = jobs.get(10)
    assert second is not None and second.json() == {"n": 2}
    assert time.monotonic() - cancelled_at < 1.0  # delivered while the first waits
    second.ack()
    worker.flush()
    again = jobs.get(10)
    assert again is not None and again.json() == {"n": 1}
    assert time.monotonic() - cancelled_at >= 1.0
    again.ack()
    worker.flush()


def test_expire_with_a_reason_lands_on_the_dead_letter_topic(server_factory, face):
    server = start(server_factory)
    worker, jobs = jobs_of(server, face, {"n": 7})
    msg = jobs.get(10)
    assert msg is not None
    msg.expire(reason='bad "schema"')
    worker.flush()
    failed = worker.subscribe("Failed", max_backlog=1)
    letter = failed.get(10)
    assert letter is not None
    body = json.loads(letter.data)
    assert body["message"] == {"n": 7} and body["reason"] == "forced_expire"
    assert body["why"] == 'bad "schema"' and body["by"].startswith("worker/") and body["deliveries"] == 1


def test_a_delay_survives_a_restart(server_factory, face):
    server = start(server_factory)
    worker, jobs = jobs_of(server, face, {"n": 1})
    msg = jobs.get(10)
    assert msg is not None
    msg.cancel(delay=4)
    cancelled_at = time.monotonic()
    worker.flush()
    worker.disconnect()
    server.kill()
    server.restart()
    worker = face("worker2").connect(server.uri)
    jobs = worker.subscribe("Jobs", max_backlog=1)
    back = jobs.get(15)
    assert back is not None and back.json() == {"n": 1}
    assert time.monotonic() - cancelled_at >= 4.0  # held through the restart, not redelivered at once
    back.ack()
    worker.flush()
