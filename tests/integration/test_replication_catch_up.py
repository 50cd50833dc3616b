"""Catching up after a restart, with real server processes (docs/replication.md, "After a
restart: catching up").

The defect it guards against: with two ``sync`` instances, an instance restarted after a
SIGKILL delivered the messages it owned before its peer's acknowledgements of them (made
while it was down: here after a proxied transfer) reached it, so a worker waiting on it
processed them a second time. And the reference's recovery procedure, which keeps
clients away from a recovering instance until replication has caught up:
``conveyor serve --no-clients-until-replicated`` and the admin action
``/amps/administrator/replication/catch_up``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from unittest import mock

import pytest

from conveyor import Client, errors
from tests import serverproc
from tests.integration.instances import Instance, instances  # noqa: F401
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.test_replicated_queues import QUEUE, TOPICS, publish_n
from tests.serverproc import ServerProcess

#: Long enough that B's link (its backoff, while A was down) is back well before it.
TIMEOUT = "<RecoveryCatchUpTimeout>120s</RecoveryCatchUpTimeout>"


class HoldingServer(ServerProcess):
    """``conveyor serve --no-clients-until-replicated``."""

    def start(self, port: int = 0) -> ServerProcess:
        popen = subprocess.Popen

        def with_the_option(args, **kw):
            return popen([*args, "--no-clients-until-replicated"], **kw)

        with mock.patch.object(serverproc.subprocess, "Popen", with_the_option):
            return super().start(port)


def sync_pair(instances, proxy: bool = False, **a_options) -> tuple[Instance, Instance]:
    """A and B, ``sync`` both ways; with ``proxy``, B's link to A goes through a TCP
    proxy (``instances.proxies[0]``) that a test may block."""
    a = instances("A", queues=QUEUE, topics=TOPICS, **a_options)
    b = instances("B", queues=QUEUE, topics=TOPICS, admin=True)
    a.replicate_to(b, sync=True)
    port = None
    if proxy:
        instances.proxies.append(TcpProxy(a.repl_port))
        port = instances.proxies[0].port
    b.replicate_to(a, sync=True, port=port)
    a.destinations.append(TIMEOUT)  # an element of A's <Replication>
    return a, b


def admin(inst: Instance, action: str) -> dict:
    url = f"http://127.0.0.1:{inst.admin_port}/amps/administrator/{action}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as reply:
        return json.load(reply)


def ready(inst: Instance) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{inst.admin_port}/readyz", timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def process_on(inst: Instance, n: int) -> list[int]:
    """A worker on ``inst`` processes ``n`` messages of WorkQ; returns once its
    acknowledgements are applied there (not persisted: a sync peer is down)."""
    got = []
    with Client("b-worker").connect(inst.uri) as client, Client("b-viewer").connect(inst.uri) as viewer:
        sub = client.subscribe("WorkQ", max_backlog=10)
        while len(got) < n:
            msg = sub.get(timeout=30)
            assert msg is not None, f"only {len(got)} of {n}"
            got.append(msg.json()["i"])
            msg.ack()
        deadline = time.monotonic() + 30
        while viewer.sow("WorkQ"):
            assert time.monotonic() < deadline, "the acknowledgements did not arrive"
            time.sleep(0.1)
    return got


class PatientWorker(threading.Thread):
    """A worker waiting for an instance that is down: it connects as soon as the
    instance accepts it, subscribes to WorkQ and keeps what it gets (acknowledged)."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.uri = uri
        self.got: list[int] = []
        self.subscribed = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                client = Client(f"patient-{time.monotonic_ns()}").connect(self.uri)
            except errors.ConveyorError:
                time.sleep(0.05)
                continue
            with client:
                sub = client.subscribe("WorkQ", max_backlog=50)
                self.subscribed.set()
                while not self.stop.is_set():
                    msg = sub.get(timeout=0.1)
                    if msg is not None:
                        self.got.append(msg.json()["i"])
                        msg.ack()
                client.flush()
            return


def test_a_restarted_owner_does_not_deliver_what_its_peer_acknowledged_while_it_was_down(instances):
    """The defect in small: A owns 30 messages, is SIGKILLed; proxied transfer on B, B's
    worker processes all 30 (the acknowledgements are in B's journal); A restarts while
    a worker waits on A, and B's link to A cannot get through for a while (blocked at a
    proxy: a link in its backoff, a slow network). The worker gets none of them, then or
    later: A holds its replicated queue until B's stream has brought it B's journal as
    it was at the handshake."""
    a, b = sync_pair(instances, proxy=True)
    proxy = instances.proxies[0]
    a.start()
    b.start()
    publish_n(a.uri, 30)
    b.wait_for_queue(30)
    a.kill()
    admin(b, "queues/WorkQ/enable_proxied_transfer")
    processed = process_on(b, 30)
    assert sorted(processed) == list(range(30))
    admin(b, "queues/WorkQ/disable_proxied_transfer")
    patient = PatientWorker(a.uri)
    patient.start()
    proxy.block()
    a.start()
    assert patient.subscribed.wait(30), a.proc.log[-3000:]
    time.sleep(2.0)
    assert patient.got == [], f"processed again on A: {patient.got}"
    proxy.block(False)
    a.proc.wait_log("catching up: done", timeout=60)
    time.sleep(2.0)  # anything A would deliver now has arrived
    patient.stop.set()
    patient.join(30)
    assert patient.got == [], f"processed again on A: {patient.got}"
    assert "catching up: the replicated queues deliver nothing until B" in a.proc.log
    with Client("viewer").connect(a.uri) as client:
        assert client.sow("WorkQ") == []


def test_no_clients_until_replicated_refuses_logons_until_the_peer_caught_it_up(instances):
    """``--no-clients-until-replicated``: with B down, A refuses every client logon with
    a retryable ``not_available`` that says why (and /readyz says 503); once B is back
    and has caught A up, clients log on, and A's own messages are delivered."""
    a, b = sync_pair(instances, admin=True)
    a.start()
    b.start()
    publish_n(a.uri, 5)
    b.wait_for_queue(5)
    b.stop()
    a.kill()
    port = a.proc.port
    a.proc = HoldingServer(a.config())
    a.proc.start(port)
    with pytest.raises(errors.NotAvailable, match="catching up with its replication peers"):
        Client("early").connect(a.uri)
    assert ready(a) == 503
    a.proc.wait_log("refused: this instance is catching up with B")
    b.start()
    deadline = time.monotonic() + 60
    while True:
        try:
            client = Client("late").connect(a.uri)
            break
        except errors.NotAvailable:
            assert time.monotonic() < deadline, a.proc.log[-3000:]
            time.sleep(0.1)
    with client:
        sub = client.subscribe("WorkQ", max_backlog=10)
        got = []
        while len(got) < 5:
            msg = sub.get(timeout=10)
            assert msg is not None, f"only {got}"
            got.append(msg.json()["i"])
            msg.ack()
        client.flush()
    assert sorted(got) == [0, 1, 2, 3, 4]
    assert ready(a) == 200


def test_the_admin_action_reports_and_ends_the_wait(instances):
    """``/amps/administrator/replication/catch_up`` reports the wait (B not heard from,
    clients held); ``.../catch_up/end`` ends it: clients log on and the replicated queue
    delivers, whoever has not caught up."""
    a, _ = sync_pair(instances, admin=True)
    a.proc = HoldingServer(a.config())
    a.proc.start()
    report = admin(a, "replication/catch_up")
    assert report["waiting"] is True and report["clients_held"] is True and report["outcome"] is None
    assert [(p["peer"], p["state"]) for p in report["peers"]] == [("B", "not_heard_from")]
    assert report["timeout_s"] == 120.0
    with pytest.raises(errors.NotAvailable):
        Client("early").connect(a.uri)
    ended = admin(a, "replication/catch_up/end")
    assert ended["ended"] is True and ended["outcome"] == "ended" and ended["clients_held"] is False
    assert admin(a, "replication/catch_up/end")["ended"] is False  # once
    a.proc.wait_log("catching up: ended by an administrator")
    with Client("worker").connect(a.uri) as client:
        sub = client.subscribe("WorkQ", max_backlog=10)
        client.publish("Work", {"i": 1})
        msg = sub.get(timeout=10)
        assert msg is not None and msg.json() == {"i": 1}  # not acknowledged: B, a sync peer, is down
