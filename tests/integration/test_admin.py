"""The admin interface of a real server: every route, the metric families, the explain
verdicts, the actions, the HTTP limits, and the operator commands of the CLI.

One server for the module (queues for each explain verdict), started with an admin
interface on a free loopback port; clients are real :class:`conveyor.Client`s."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import urllib.parse
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor import Client
from conveyor.cli import ops
from tests.serverproc import ServerProcess, write_config

QUEUES = """
<Queue><Name>Q</Name><MessageType>json</MessageType><UnderlyingTopic>work</UnderlyingTopic>
  <LeasePeriod>60s</LeasePeriod></Queue>
<Queue><Name>F</Name><MessageType>json</MessageType><UnderlyingTopic>fwork</UnderlyingTopic></Queue>
<Queue><Name>T</Name><MessageType>json</MessageType><UnderlyingTopic>twork</UnderlyingTopic>
  <TargetQueueDepth>2</TargetQueueDepth></Queue>
<Queue><Name>B</Name><MessageType>json</MessageType><UnderlyingTopic>bwork</UnderlyingTopic>
  <BarrierExpression>/barrier = 1</BarrierExpression></Queue>
<Queue><Name>M</Name><MessageType>json</MessageType><UnderlyingTopic>mwork</UnderlyingTopic>
  <MaxBacklog>1</MaxBacklog></Queue>
<Queue><Name>S</Name><MessageType>json</MessageType><UnderlyingTopic>^s(work|direct)$</UnderlyingTopic>
  <DefaultPublishTarget>sdirect</DefaultPublishTarget><Semantics>at-least-once</Semantics>
  <FairnessModel>round-robin</FairnessModel><Leasing>strict</Leasing><LeasePeriod>30s</LeasePeriod>
  <Expiration>1h</Expiration><MaxBacklog>10</MaxBacklog><MaxPerSubscriptionBacklog>5</MaxPerSubscriptionBacklog>
  <MaxCancels>3</MaxCancels><MaxDeliveries>4</MaxDeliveries><Priority>/p</Priority>
  <Filter>/keep = 1</Filter><DeferredAckExpiration>2h</DeferredAckExpiration></Queue>
"""
#: What the admin JSON's ``settings`` of queue S must be (its configured values).
S_SETTINGS = {
    "Semantics": "at-least-once", "FairnessModel": "round-robin", "Leasing": "strict", "LeasePeriod": 30.0,
    "Expiration": 3600.0, "MaxBacklog": 10, "MaxPerSubscriptionBacklog": 5, "MaxCancels": 3, "MaxDeliveries": 4,
    "TargetQueueDepth": None, "Priority": "/p", "BarrierExpression": None, "Filter": "/keep = 1",
    "UnderlyingTopic": "^s(work|direct)$", "DefaultPublishTarget": "sdirect", "RecoveryPoint": None,
    "DeferredAckExpiration": 7200.0, "FileBackedMetadata": False,
    "RetryBackoff": None, "OrderingKey": None, "MaxInFlightPerKey": None,
}


def get(url: str, *, headers: dict | None = None) -> tuple[int, dict | str, dict]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read().decode()
            status, hdrs = resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        body, status, hdrs = exc.read().decode(), exc.code, dict(exc.headers)
    if hdrs.get("Content-Type", "").startswith("application/json"):
        return status, json.loads(body), hdrs
    return status, body, hdrs


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A server with an admin interface, messages in every queue, and two subscribers:
    ``worker`` holds a lease on Q, ``picky`` filters F down to nothing."""
    directory = tmp_path_factory.mktemp("admin")
    server = ServerProcess(write_config(directory, queues=QUEUES, admin=True)).start()
    assert server.admin_url and server.admin_url.startswith("http://127.0.0.1:")
    publisher = Client("publisher").connect(server.uri)
    for n in range(3):
        publisher.publish("work", {"n": n})
        publisher.publish("fwork", {"n": n, "kind": "plain"})
    for n in range(5):
        publisher.publish("twork", {"n": n})
    publisher.publish("bwork", {"n": 0})
    publisher.publish("bwork", {"n": 1, "barrier": 1})
    publisher.publish("bwork", {"n": 2})
    publisher.publish("mwork", {"n": 0})
    publisher.publish("mwork", {"n": 1})
    publisher.flush()
    worker = Client("worker").connect(server.uri)
    lease = worker.subscribe("Q", max_backlog=1)
    held = lease.get(timeout=10)
    assert held is not None
    picky = Client("picky").connect(server.uri)
    picky.subscribe("F", filter="/kind = 'special'", max_backlog=5)
    barrier_worker = Client("barrier-worker").connect(server.uri)
    bsub = barrier_worker.subscribe("B", max_backlog=1)
    bheld = bsub.get(timeout=10)  # n=0 leased: the barrier waits for it
    m_worker = Client("m-worker").connect(server.uri)
    msub = m_worker.subscribe("M", max_backlog=5)
    mheld = msub.get(timeout=10)  # MaxBacklog 1: the second waits
    yield {
        "server": server, "url": server.admin_url, "held": held, "publisher": publisher,
        "bheld": bheld, "mheld": mheld, "clients": [publisher, worker, picky, barrier_worker, m_worker],
        "config": directory / "config.xml",
    }
    for c in (publisher, worker, picky, barrier_worker, m_worker):
        try:
            c.disconnect()
        except Exception:  # noqa: BLE001 (one was disconnected by the test)
            pass
    server.stop()


def test_health_and_readiness(env):
    status, body, _ = get(env["url"] + "/healthz")
    assert status == 200 and body["status"] == "ok"
    status, body, _ = get(env["url"] + "/readyz")
    assert status == 200 and body["ready"] is True


def test_instance_tree_and_aliases(env):
    status, tree, _ = get(env["url"] + "/amps/instance")
    assert status == 200
    assert tree["name"] == "test-instance" and tree["ready"] and tree["uptime"] >= 0
    assert tree["client_count"] >= 5
    assert set(tree["queues"]) == {"Q", "F", "T", "B", "M", "S"}
    j = tree["journal"]
    assert j["directory"].endswith("journal") and os.path.isabs(j["directory"])
    assert j["durable_end"] > 0 and j["commits"] > 0 and j["commit_seconds_max"] > 0 and j["segments"] >= 1
    assert {s["client"] for s in tree["subscriptions"]} >= {"worker", "picky"}
    assert tree["replication"] == {"outgoing": [], "incoming": []}
    # aliases and sub-paths
    assert get(env["url"] + "/api/stats")[1]["name"] == "test-instance"
    assert get(env["url"] + "/amps/instance/queues/Q/backlog")[1] == 1
    assert get(env["url"] + "/api/queues/Q/queue_depth")[1] == 3
    assert get(env["url"] + "/amps/instance/journal/in_memory")[1] is False
    assert get(env["url"] + "/api/replication")[1] == {"outgoing": [], "incoming": []}
    status, body, _ = get(env["url"] + "/amps/instance/queues/NOPE")
    assert status == 404 and body["error"] == "unknown_queue"
    status, body, _ = get(env["url"] + "/amps/instance/queues/Q/no_such_metric")
    assert status == 404


def test_queue_metrics_of_the_reference(env):
    q = get(env["url"] + "/amps/instance/queues/Q")[1]
    for metric in ("topic", "message_type", "max_backlog", "target_queue_depth", "proxied_transfer", "queue_depth",
                   "inactive_message_count", "backlog", "deferred_ack_count", "age_of_oldest_lease", "seconds_behind",
                   "owned", "expired_leases", "transferred_in", "transferred_out"):
        assert metric in q, metric
    assert q["backlog"] == 1 and q["available"] == 2 and q["consumers"] == 1
    assert q["age_of_oldest_lease"] >= 0 and q["seconds_behind"] >= 0
    t = get(env["url"] + "/amps/instance/queues/T")[1]
    assert t["target_queue_depth"] == 2 and t["inactive_message_count"] == 3 and t["queue_depth"] == 2


def expected_settings(env, name: str) -> dict:
    """The settings the server's configuration gives queue ``name``, read by the
    configuration loader (so the defaults are whatever this version's are)."""
    from conveyor.config.loader import load_file

    (cfg,) = [q for q in load_file(env["config"]).queues if q.name == name]

    def seconds(v):
        return None if v is None or math.isinf(v) else v

    return {
        "Semantics": cfg.semantics.value, "FairnessModel": cfg.fairness.value, "Leasing": cfg.leasing.value,
        "LeasePeriod": seconds(cfg.lease_period_s), "Expiration": seconds(cfg.expiration_s),
        "MaxBacklog": cfg.max_backlog, "MaxPerSubscriptionBacklog": cfg.max_per_subscription_backlog,
        "MaxCancels": cfg.max_cancels, "MaxDeliveries": cfg.max_deliveries, "TargetQueueDepth": cfg.target_queue_depth,
        "Priority": cfg.priority, "BarrierExpression": cfg.barrier_expression, "Filter": cfg.filter,
        "UnderlyingTopic": cfg.underlying, "DefaultPublishTarget": cfg.default_publish_target,
        "RecoveryPoint": cfg.recovery_point, "DeferredAckExpiration": seconds(cfg.deferred_ack_expiration_s),
        "FileBackedMetadata": cfg.file_backed_metadata, "RetryBackoff": list(cfg.retry_backoff_s) or None,
        "OrderingKey": cfg.ordering_key, "MaxInFlightPerKey": cfg.max_in_flight_per_key if cfg.ordering_key else None,
    }


def test_queue_settings_show_defaults_and_configured_values(env):
    # F sets nothing but its topic: every setting is there, with this version's default
    f = get(env["url"] + "/amps/instance/queues/F/settings")[1]
    assert f == expected_settings(env, "F")
    assert f["Semantics"] == "at-least-once" and f["UnderlyingTopic"] == "fwork" and f["DefaultPublishTarget"] == "fwork"
    assert f["MaxBacklog"] is None and f["Expiration"] is None and f["Priority"] is None  # null: none / unlimited
    # S sets (almost) everything: the configured values, durations in seconds
    s = get(env["url"] + "/amps/instance/queues/S")[1]["settings"]
    assert s == S_SETTINGS == expected_settings(env, "S")
    # in the whole tree too, and one value by its path
    tree = get(env["url"] + "/amps/instance/queues")[1]
    assert tree["T"]["settings"]["TargetQueueDepth"] == 2 and tree["B"]["settings"]["BarrierExpression"] == "/barrier = 1"
    assert get(env["url"] + "/api/queues/S/settings/LeasePeriod")[1] == 30.0


def test_queue_details_lists_holder_deadline_and_count(env):
    d = get(env["url"] + "/amps/instance/queues/Q/details")[1]
    leased = [m for m in d["messages"] if m["state"] == "leased"]
    assert len(leased) == 1
    m = leased[0]
    assert m["bookmark"] == env["held"].bookmark
    assert m["holder_client"] == "worker" and m["deliveries"] == 1
    assert m["lease_deadline"] > time.time()
    assert [c["client"] for c in d["cursors"]] == ["worker"]
    assert len([m for m in d["messages"] if m["state"] == "available"]) == 2
    limited = get(env["url"] + "/api/queues/Q/details?limit=1")[1]
    assert limited["messages_truncated"] is True
    assert get(env["url"] + "/api/queues/Q/details?limit=x")[0] == 400


def test_queue_details_browses_by_content_without_changing_anything(env):
    """A browse (``details?filter=``, ``conveyor queues Q --filter``): the messages whose
    body matches, leased or available, at most ``limit`` of them; nothing changes."""
    def browse(flt: str, extra: str = "") -> tuple[int, dict]:
        status, body, _ = get(env["url"] + f"/api/queues/Q/details?{extra}filter=" + urllib.parse.quote(flt))
        return status, body

    everything = get(env["url"] + "/amps/instance/queues/Q/details")[1]["messages"]
    by_n = {}
    for n in range(3):
        [m] = browse(f"/n = {n}")[1]["messages"]
        by_n[n] = m["bookmark"]
    assert sorted(by_n.values()) == sorted(m["bookmark"] for m in everything)  # each found once, leased one too
    assert [m["owner"] for m in browse("/n >= 0")[1]["messages"]] == [None] * 3  # not a replicated queue
    one = browse("/n >= 0", "limit=1&")[1]
    assert len(one["messages"]) == 1 and one["messages_truncated"] is True
    assert browse("/n >=")[0] == 400
    assert get(env["url"] + "/amps/instance/queues/Q/details")[1]["messages"] == everything  # unchanged
    proc = cli(env, "queues", "Q", "--filter", "/n = 2")
    assert proc.returncode == 0, proc.stderr
    assert by_n[2] in proc.stdout and by_n[0] not in proc.stdout and by_n[1] not in proc.stdout


def explain(env, queue, bookmark):
    status, body, _ = get(env["url"] + f"/amps/instance/queues/{queue}/explain?bookmark={bookmark}")
    assert status == 200, body
    return body


def test_explain_leased(env):
    e = explain(env, "Q", env["held"].bookmark)
    assert e["verdict"] == "leased" and e["holder_client"] == "worker" and "worker" in e["summary"]
    assert e["lease_deadline"] > time.time()


def test_explain_filtered_out(env):
    sow = env["publisher"].sow("F")
    e = explain(env, "F", sow[0].bookmark)
    assert e["verdict"] == "filtered_out"
    [sub] = e["subscribers"]
    assert sub["client"] == "picky" and sub["filter"] == "/kind = 'special'" and sub["verdict"] == "filtered_out"


def test_explain_deliverable_backlog_full(env):
    available = [m for m in get(env["url"] + "/api/queues/Q/details")[1]["messages"] if m["state"] == "available"]
    e = explain(env, "Q", available[0]["bookmark"])
    assert e["verdict"] == "backlog_full" and "1/1" in e["reasons"][-1]


def test_explain_beyond_target_queue_depth(env):
    # T holds 5 messages, 2 active: the 3 others are inactive; find one by position
    d = get(env["url"] + "/api/queues/T/details")[1]
    last_active = max(m["position"] for m in d["messages"])
    positions = [r["position"] for r in journal_publishes(env, "twork")]
    inactive = [p for p in positions if p > last_active]
    assert len(inactive) == 3
    e = explain(env, "T", str(inactive[0]))
    assert e["verdict"] == "beyond_target_depth" and "TargetQueueDepth 2" in e["summary"]


def journal_publishes(env, topic):
    """The records of ``topic`` (positions), through the CLI's journal dump."""
    journal = env["server"].config.parent / "journal"
    proc = subprocess.run([sys.executable, "-m", "conveyor", "journal", "dump", str(journal)],
                          capture_output=True, text=True, timeout=60)
    return [r for r in map(json.loads, proc.stdout.splitlines()) if r["type"] == "publish" and r["topic"] == topic]


def test_explain_barrier(env):
    d = get(env["url"] + "/api/queues/B/details")[1]
    by_barrier = {m["barrier"]: m for m in d["messages"] if m["state"] == "available"}
    e = explain(env, "B", by_barrier[True]["bookmark"])
    assert e["verdict"] == "barrier_waiting"
    after = [m for m in d["messages"] if m["state"] == "available" and m["position"] > by_barrier[True]["position"]]
    e = explain(env, "B", after[0]["bookmark"])
    assert e["verdict"] == "behind_barrier"


def test_explain_max_backlog_and_done(env):
    d = get(env["url"] + "/api/queues/M/details")[1]
    [waiting] = [m for m in d["messages"] if m["state"] == "available"]
    e = explain(env, "M", waiting["bookmark"])
    assert e["verdict"] == "max_backlog_reached" and "MaxBacklog 1" in e["summary"]
    e = explain(env, "Q", "999999999")
    assert e["verdict"] == "unknown"  # a position no publish of the journal is at
    status, body, _ = get(env["url"] + "/amps/instance/queues/Q/explain?bookmark=garbage")
    assert status == 400 and body["error"] == "bad_bookmark"


def test_clients_and_subscriptions(env):
    clients = get(env["url"] + "/amps/instance/clients")[1]
    by_name = {c["name"]: c for c in clients.values()}
    worker = by_name["worker"]
    assert worker["address"].startswith("127.0.0.1:") and worker["subscriptions"] == 1
    assert worker["messages_out"] >= 1 and worker["bytes_in"] > 0 and worker["connected_for"] >= 0
    assert worker["unsent_bytes"] == 0
    assert get(env["url"] + "/amps/instance/clients/worker/name")[1] == "worker"
    subs = get(env["url"] + "/api/subscriptions")[1]
    [w] = [s for s in subs if s["client"] == "worker"]
    assert w["kind"] == "queue" and w["outstanding"] == 1 and w["max_backlog"] == 1


def test_prometheus_metrics(env):
    status, text, headers = get(env["url"] + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    depth = {s.labels["queue"]: s.value for s in families["conveyor_queue_depth"].samples}
    assert depth["Q"] == 3 and depth["T"] == 2
    assert families["conveyor_queue_delivered"].type == "counter"
    delivered = {s.labels["queue"]: s.value for s in families["conveyor_queue_delivered"].samples
                 if s.name == "conveyor_queue_delivered_total"}
    assert delivered["Q"] >= 1
    assert families["conveyor_journal_commit_seconds"].type == "histogram"
    count = [s for s in families["conveyor_journal_commit_seconds"].samples if s.name.endswith("_count")]
    assert count[0].value >= 1
    assert families["conveyor_clients"].samples[0].value >= 5
    for name in ("conveyor_queue_inactive_messages", "conveyor_queue_oldest_lease_age_seconds",
                 "conveyor_queue_seconds_behind", "conveyor_journal_size_bytes", "conveyor_replication_link_up",
                 "conveyor_info", "conveyor_up_ready"):
        assert name in families, name


def test_history_for_the_charts(env):
    def sampled():  # the first sample is taken at startup, the next every 2 s
        h = get(env["url"] + "/api/history?queues=Q")[1]
        return h if h["queues"]["Q"]["queue_depth"][-1:] == [3] else None

    h = wait_for(sampled)
    assert list(h["queues"]) == ["Q"] and len(h["t"]) == len(h["instance"]["connections"])
    assert h["queues"]["Q"]["in_flight"][-1] == 1 and h["queues"]["Q"]["enqueued"][-1] == 3
    default = get(env["url"] + "/api/history")[1]
    assert "T" in default["queues"] or "Q" in default["queues"]


def test_dashboard_files_are_served(env):
    status, html, headers = get(env["url"] + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and "/static/app.js" in html
    assert get(env["url"] + "/static/app.js")[0] == 200
    assert get(env["url"] + "/static/app.css")[0] == 200
    assert get(env["url"] + "/static/../../etc/passwd")[0] == 404


def test_actions(env):
    server = env["server"]
    status, body, _ = get(env["url"] + "/amps/administrator/queues/Q/enable_proxied_transfer")
    assert status == 501 and body["error"] == "not_available"
    status, body, _ = get(env["url"] + "/amps/administrator/queues/NOPE/disable_proxied_transfer")
    assert status == 400 and body["error"] == "unknown_topic"
    status, body, _ = get(env["url"] + "/amps/administrator/diagnostics/dump")
    assert status == 200 and body["queues"]["Q"]["leased"][0]["holder_client"] == "worker"
    server.wait_log("diagnostics: queue Q: depth 3")
    status, _, _ = get(env["url"] + "/amps/administrator/clients/picky/disconnect",
                       headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    status, body, _ = get(env["url"] + "/amps/administrator/clients/nobody/disconnect")
    assert status == 404
    status, body, _ = get(env["url"] + "/amps/administrator/clients/picky/disconnect")
    assert status == 200 and body["client"] == "picky"
    server.wait_log("disconnected by an administrator")
    old_id = body["disconnected"]
    # the connection is gone (told why, the client does not reconnect)
    wait_for(lambda: str(old_id) not in get(env["url"] + "/api/clients")[1])


def raw(env, data: bytes) -> bytes:
    host, port = env["url"].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_http_limits_and_keep_alive(env):
    # two requests on one connection, the second closes it
    out = raw(env, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 OK") == 2
    assert raw(env, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(env, b"DELETE / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    too_many = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(100)) + b"\r\n"
    assert raw(env, too_many).startswith(b"HTTP/1.1 431")
    assert raw(env, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 414")
    assert raw(env, b"POST /healthz HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n").startswith(b"HTTP/1.1 413")
    head = raw(env, b"HEAD /healthz HTTP/1.0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
    # the server still answers after all of that
    assert get(env["url"] + "/healthz")[0] == 200


# --- the operator commands of the CLI -------------------------------------------------------------


def cli(env, *args, admin=True):
    e = dict(os.environ)
    if admin:
        e["CONVEYOR_ADMIN"] = env["url"]
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=60, env=e)


def test_cli_stats_queues_clients_replication(env):
    proc = cli(env, "stats")
    assert proc.returncode == 0, proc.stderr
    assert "test-instance" in proc.stdout and "ready" in proc.stdout and "journal" in proc.stdout
    proc = cli(env, "queues")
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "DEPTH", "AVAILABLE"]
    assert any(line.split()[0] == "Q" and line.split()[1] == "3" for line in lines[1:])
    proc = cli(env, "queues", "Q")
    assert proc.returncode == 0 and "leased" in proc.stdout and "worker" in proc.stdout
    proc = cli(env, "clients")
    assert proc.returncode == 0 and "worker" in proc.stdout and "publisher" in proc.stdout
    proc = cli(env, "replication")
    assert proc.returncode == 0 and "no replication links" in proc.stdout
    proc = cli(env, "queues", "--json")
    assert json.loads(proc.stdout)["Q"]["queue_depth"] == 3
    proc = subprocess.run([sys.executable, "-m", "conveyor", "stats", "--json", "--admin", env["url"]],
                          capture_output=True, text=True, timeout=60)
    assert json.loads(proc.stdout)["name"] == "test-instance"


def test_cli_queue_shows_its_settings(env):
    proc = cli(env, "queues", "S")
    assert proc.returncode == 0, proc.stderr
    block = proc.stdout.split("settings:\n", 1)[1].split("\n\n", 1)[0]
    assert block.splitlines() == [
        "  Semantics at-least-once, FairnessModel round-robin, Leasing strict",
        "  LeasePeriod 30s, Expiration 1h, DeferredAckExpiration 2h",
        "  MaxBacklog 10, MaxPerSubscriptionBacklog 5, TargetQueueDepth none",
        "  MaxCancels 3, MaxDeliveries 4",
        '  Priority "/p", BarrierExpression none, Filter "/keep = 1"',
        "  UnderlyingTopic ^s(work|direct)$, DefaultPublishTarget sdirect, RecoveryPoint epoch, FileBackedMetadata disabled",
        "  RetryBackoff none, OrderingKey none, MaxInFlightPerKey none",
    ]
    # a queue with no options: its defaults, whatever this version's are (null: infinite, unlimited)
    proc = cli(env, "queues", "F")
    defaults = expected_settings(env, "F")
    lease = "infinite" if defaults["LeasePeriod"] is None else ops._duration(defaults["LeasePeriod"])
    per_sub = defaults["MaxPerSubscriptionBacklog"]
    assert f"LeasePeriod {lease}, Expiration never" in proc.stdout
    assert f"MaxBacklog unlimited, MaxPerSubscriptionBacklog {'unlimited' if per_sub is None else per_sub}" in proc.stdout
    assert "Leasing sublet" in proc.stdout and "Priority none" in proc.stdout
    assert ops._duration(0.5) == "0.5s" and ops._duration(90) == "90s" and ops._duration(5400) == "90m"


def test_cli_explain(env):
    proc = cli(env, "explain", "Q", env["held"].bookmark)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"Q {env['held'].bookmark}: leased") and "worker" in proc.stdout
    proc = cli(env, "explain", "Q", env["held"].bookmark, "--json")
    assert json.loads(proc.stdout)["verdict"] == "leased"
    proc = cli(env, "explain", "NOPE", "1")
    assert proc.returncode == 1 and "no queue 'NOPE'" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_unreachable_admin_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "conveyor", "stats", "--admin", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot reach the admin interface" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def serve_refused(tmp_path, config_text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "config.xml"
    path.write_text(config_text)
    return subprocess.run([sys.executable, "-m", "conveyor", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_settings_this_version_would_ignore_are_refused(tmp_path):
    journal = tmp_path / "journal"
    for element, path in (
        ("<Admin><InetAddr>127.0.0.1:0</InetAddr><FileName>stats.db</FileName></Admin>", "AMPSConfig/Admin/FileName"),
        (f"<TransactionLog><JournalDirectory>{journal}</JournalDirectory>"
         "<JournalArchiveDirectory>/tmp/x</JournalArchiveDirectory></TransactionLog>",
         "AMPSConfig/TransactionLog/JournalArchiveDirectory"),
    ):
        text = f"<AMPSConfig><Transports><Transport><InetAddr>127.0.0.1:0</InetAddr></Transport></Transports>{element}</AMPSConfig>"
        proc = serve_refused(tmp_path, text)
        assert proc.returncode == 2 and path in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        proc = subprocess.run([sys.executable, "-m", "conveyor", "config", "check", str(tmp_path / "config.xml")],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and path in proc.stderr


def test_admin_port_in_use_is_refused_with_its_path(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve_refused(tmp_path, "<AMPSConfig><Transports><Transport><InetAddr>127.0.0.1:0</InetAddr></Transport>"
                                       f"</Transports><Admin><InetAddr>127.0.0.1:{port}</InetAddr></Admin></AMPSConfig>")
    assert proc.returncode == 2 and "AMPSConfig/Admin/InetAddr" in proc.stderr and "already in use" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_check_and_default(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "conveyor", "config", "default"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("<?xml")
    path = tmp_path / "default.xml"
    path.write_text(proc.stdout)
    proc = subprocess.run([sys.executable, "-m", "conveyor", "config", "check", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "valid" in proc.stdout and "queue       WorkToDo" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "conveyor", "config", "check", str(tmp_path / "missing.xml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "cannot read configuration file" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "conveyor", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("conveyor ")


@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
def test_ports_are_validated(flag):
    proc = subprocess.run([sys.executable, "-m", "conveyor", "serve", flag, "70000"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "is not a port" in proc.stderr and "Traceback" not in proc.stderr
