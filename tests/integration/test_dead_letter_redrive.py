"""Dead letters on the real server: listing by reason, content filter and time (admin
API and CLI), and re-drive back to the queue exactly once: twice the same job, a
SIGKILL in the middle of a job (docs/queues.md, "Dead letters: inspect and re-drive")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conveyor import Client
from tests.serverproc import REPO, ServerProcess, write_config

QUEUES = """
<Queue><Name>Jobs</Name><MessageType>json</MessageType><MaxCancels>1</MaxCancels></Queue>
"""
ACTIONS = """
<Actions><Action>
  <On><Module>amps-action-on-sow-expire-message</Module><Options><Topic>Jobs</Topic><MessageType>json</MessageType></Options></On>
  <Do><Module>amps-action-do-publish-message</Module><Options><Topic>FailedJobs</Topic><MessageType>json</MessageType>
    <Data>{"message": {{AMPS_DATA}}, "reason": "{{AMPS_REASON}}", "why": "{{CONVEYOR_FAILURE_REASON}}",
"deliveries": {{CONVEYOR_DELIVERIES}}}</Data></Options></Do>
</Action></Actions>
"""
BASE = "/amps/administrator/dead_letters"


@pytest.fixture
def server(tmp_path):
    config = write_config(tmp_path, queues=QUEUES, admin=True, root_extra=ACTIONS)
    srv = ServerProcess(config).start()
    try:
        yield srv
    finally:
        srv.kill()


def get(srv: ServerProcess, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(srv.admin_url + path, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def cli(srv: ServerProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args, "--admin", srv.admin_url],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def why_of(i: int) -> str:
    return "timeout" if i % 2 else "bad input"


def dead_letter(srv: ServerProcess, ids: range) -> None:
    """Publish one job per id, cancel each once (MaxCancels 1: it expires into FailedJobs)
    with an application reason, and wait until the listing has them all."""
    with Client("submitter").connect(srv.uri) as client:
        for i in ids:
            client.publish("Jobs", {"id": i})
        client.flush()
    with Client("failing-worker").connect(srv.uri) as client:
        jobs = client.subscribe("Jobs")
        for _ in ids:
            msg = jobs.get(timeout=5)
            msg.cancel(reason=why_of(msg.json()["id"]))
        client.flush()
    deadline = time.monotonic() + 10
    while get(srv, f"{BASE}/FailedJobs?limit=10000")[1]["count"] < len(ids):
        assert time.monotonic() < deadline, "the dead letters did not all arrive"
        time.sleep(0.05)


def drain(srv: ServerProcess, *, quiet: float = 0.5) -> list[dict]:
    """What a worker receives from Jobs until it is quiet for ``quiet`` seconds (acked)."""
    got = []
    with Client("good-worker").connect(srv.uri) as client:
        jobs = client.subscribe("Jobs")
        while True:
            msg = jobs.get(timeout=quiet)
            if msg is None:  # quiet: nothing more
                break
            got.append({"id": msg.json()["id"], "correlation_id": msg.correlation_id})
            msg.ack()
        client.flush()
    return got


def wait_job(srv: ServerProcess, name: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = get(srv, f"{BASE}/jobs/{name}")[1]
        if job["state"] not in ("selecting", "running"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def test_list_by_reason_filter_and_time(server):
    before = time.time() - 1
    dead_letter(server, range(6))
    status, listing = get(server, f"{BASE}/FailedJobs")
    assert status == 200 and listing["count"] == 6
    first = listing["dead_letters"][0]
    assert first["queue"] == "Jobs" and first["reasons"] == ["max_cancels"] and first["deliveries"] == 1
    assert json.loads(first["data"])["message"] == {"id": 0} and first["failure_reason"] == "bad input"
    assert first["published_at"] >= before and first["original_position"] < first["position"]

    def ids(query: str) -> list[int]:
        status, body = get(server, f"{BASE}/FailedJobs?{query}")
        assert status == 200, body
        return sorted(json.loads(d["data"])["message"]["id"] for d in body["dead_letters"])

    assert ids("reason=max_cancels") == list(range(6))
    assert ids("reason=time_limit") == []
    assert ids("reason=TIMEOUT") == [1, 3, 5]  # the application's reason, case-blind text
    assert ids("app_reason=bad") == [0, 2, 4]
    assert ids("filter=" + urllib.parse.quote("/message/id >= 4")) == [4, 5]
    assert ids(f"since={before}&until={time.time() + 60}") == list(range(6))
    assert ids("until=1h") == [] and ids("since=1h") == list(range(6))
    assert ids("limit=2") == [0, 1]
    assert ids("queue=Other") == []

    status, body = get(server, f"{BASE}/FailedJobs?filter=" + urllib.parse.quote("/message/id >>"))
    assert status == 400 and body["message"]
    status, body = get(server, f"{BASE}/FailedJobs?since=yesterday")
    assert status == 400 and "since" in body["message"]

    out = cli(server, "dead-letters", "FailedJobs", "--reason", "timeout", "--json")
    assert out.returncode == 0, out.stderr
    assert [json.loads(d["data"])["message"]["id"] for d in json.loads(out.stdout)["dead_letters"]] == [1, 3, 5]
    out = cli(server, "dead-letters", "FailedJobs", "--filter", "/message/id = 2")
    assert out.returncode == 0 and "bad input" in out.stdout and "max_cancels" in out.stdout
    out = cli(server, "dead-letters", "FailedJobs", "--filter", "id = ")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "filter" in out.stderr


def test_redrive_chosen_set_exactly_once(server):
    dead_letter(server, range(8))
    status, job = get(server, f"{BASE}/FailedJobs/redrive?job=odd&reason=timeout&rate=0")
    assert status == 202, job
    job = wait_job(server, "odd")
    assert job["state"] == "done" and job["selected"] == 4 and job["redriven"] == 4, job
    assert job["reaches"] == {"Jobs": ["Jobs"]}
    got = drain(server)
    assert sorted(g["id"] for g in got) == [1, 3, 5, 7]
    assert all(g["correlation_id"].startswith("redrive:odd:") for g in got)

    # The same job again: nothing twice (CLI, in the foreground).
    out = cli(server, "redrive", "FailedJobs", "--job", "odd", "--reason", "timeout", "--rate", "0", "--json")
    assert out.returncode == 0, out.stderr
    again = json.loads(out.stdout)
    assert again["state"] == "done" and again["redriven"] == 0 and again["already"] == 4, again
    assert drain(server, quiet=0.3) == []
    # The same name with another selection is refused; running is per name.
    status, body = get(server, f"{BASE}/FailedJobs/redrive?job=odd&reason=max_cancels")
    assert status == 409 and "other parameters" in body["message"]
    out = cli(server, "redrive", "FailedJobs", "--job", "odd")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    status, body = get(server, f"{BASE}/FailedJobs/redrive?job=bad%20name")
    assert status == 400 and "job" in body["message"]

    # Rate limited: 4 more at 20/s take at least a little while (a generous bound).
    out = cli(server, "redrive", "FailedJobs", "--job", "even", "--app-reason", "bad input", "--rate", "20")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "re-driven       4" in out.stdout
    job = get(server, f"{BASE}/jobs/even")[1]
    assert job["finished_at"] - job["started_at"] >= 0.05
    assert sorted(g["id"] for g in drain(server)) == [0, 2, 4, 6]
    status, jobs = get(server, f"{BASE}/jobs")
    assert [j["job"] for j in jobs["jobs"]] == ["odd", "even"]


def test_redrive_resumes_after_sigkill(server):
    n = 40
    dead_letter(server, range(n))
    status, job = get(server, f"{BASE}/FailedJobs/redrive?job=all&rate=40")
    assert status == 202, job
    deadline = time.monotonic() + 20
    while get(server, f"{BASE}/jobs/all")[1]["redriven"] < 5:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.kill()
    server.restart()
    status, jobs = get(server, f"{BASE}/jobs")
    assert jobs == {"jobs": []}  # jobs live in the process; the journal knows what was done
    out = cli(server, "redrive", "FailedJobs", "--job", "all", "--rate", "0", "--json")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "done" and job["selected"] == n, job
    assert job["already"] >= 5 and job["redriven"] > 0 and job["already"] + job["redriven"] == n, job
    got = [g["id"] for g in drain(server)]
    assert sorted(got) == list(range(n))  # every one, once overall


def test_which_dead_letter_routes_need_the_full_grant():
    from conveyor.server.admin import _is_action

    assert not _is_action(f"{BASE}/FailedJobs") and not _is_action(f"{BASE}/jobs")
    assert not _is_action(f"{BASE}/jobs/n") and not _is_action("/api/admin/dead_letters/a/b")
    assert _is_action(f"{BASE}/FailedJobs/redrive") and _is_action(f"{BASE}/jobs/n/cancel")
    assert _is_action(f"{BASE}/a/b/redrive") and _is_action("/amps/administrator/diagnostics/dump")
