"""Replicated queues across three real server processes (docs/replication.md,
"Replicated queues"): transfer requests that go through another instance, and proxied
transfer answering for an owner that is down. Helpers are those of
tests/integration/test_replicated_queues.py.
"""

from __future__ import annotations

import json
import time
import urllib.request

from conveyor import Client
from tests.integration.instances import Instance, instances  # noqa: F401
from tests.integration.test_replicated_queues import QUEUE, TOPICS, Worker, assert_once, publish_n, run_workers


def link(a: Instance, b: Instance) -> None:
    """Replication both ways, passing every group's records on (a replicated queue that
    arrives from one peer and goes on to another needs it: replication/checks.py)."""
    a.replicate_to(b, pass_through=".*")
    b.replicate_to(a, pass_through=".*")


def admin(inst: Instance, action: str) -> None:
    url = f"http://127.0.0.1:{inst.admin_port}/amps/administrator/queues/WorkQ/{action}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert json.loads(resp.read())["done"] is True


def queue_stats(inst: Instance) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{inst.admin_port}/amps/instance/queues/WorkQ", timeout=10) as r:
        return json.load(r)


def test_owner_down_proxied_transfer_on_one_instance_answers_a_worker_on_another(instances):
    """Rules 4 and 6: A, B, C in a full mesh; A owns 6 messages and is SIGKILLed; proxied
    transfer is enabled on B only (no worker there); a worker on C (max_backlog=50)
    asks for A's messages although it cannot reach A, B grants them for A: C processes
    every one of them exactly once."""
    a = instances("A", queues=QUEUE, topics=TOPICS)
    b = instances("B", queues=QUEUE, topics=TOPICS, admin=True)
    c = instances("C", queues=QUEUE, topics=TOPICS, admin=True)
    link(a, b)
    link(a, c)
    link(b, c)
    for inst in (a, b, c):
        inst.start()
    publish_n(a.uri, 6)
    b.wait_for_queue(6)
    c.wait_for_queue(6)
    a.kill()
    admin(b, "enable_proxied_transfer")
    processed: list = []
    run_workers([Worker(c.uri, "c0", processed, backlog=50)], processed, 6, timeout=30)
    time.sleep(1)  # nothing more arrives
    assert_once(processed, 6)
    on_b, on_c = queue_stats(b), queue_stats(c)
    assert on_b["transfer_grants"] == 6 and on_b["proxied_claims"] == 0
    assert on_c["transfer_requests_sent"] >= 6 and on_c["transferred_in"] == 6


def test_a_request_travels_through_a_pass_through_instance_to_the_owner(instances):
    """Rule 4: "a request is a journal record, so it reaches the owner through any
    topology": a line A - B - C with PassThrough on B, A alive, the only worker on C: C's
    requests go through B to A, A grants them, and C processes each of A's messages
    exactly once."""
    a = instances("A", queues=QUEUE, topics=TOPICS, admin=True)
    b = instances("B", queues=QUEUE, topics=TOPICS)
    c = instances("C", queues=QUEUE, topics=TOPICS, admin=True)
    a.replicate_to(b)
    b.replicate_to(a, pass_through=".*")
    b.replicate_to(c, pass_through=".*")
    c.replicate_to(b)
    for inst in (a, b, c):
        inst.start()
    publish_n(a.uri, 30)
    c.wait_for_queue(30)
    processed: list = []
    run_workers([Worker(c.uri, "c0", processed)], processed, 30, timeout=30)
    time.sleep(1)
    assert_once(processed, 30)
    assert queue_stats(a)["transfer_grants"] == 30 and queue_stats(c)["transferred_in"] == 30


def test_proxied_transfer_takes_only_what_the_subscriber_can_take(instances):
    """Rule 6: a proxied claim is limited to the subscribers' free backlog: with A down
    and a max_backlog=1 subscriber on B, B takes one of A's messages at a time, and once
    proxied transfer is disabled it delivers no more of them."""
    a = instances("A", queues=QUEUE, topics=TOPICS)
    b = instances("B", queues=QUEUE, topics=TOPICS, admin=True)
    a.replicate_to(b)
    b.replicate_to(a)
    a.start()
    b.start()
    publish_n(a.uri, 5)
    b.wait_for_queue(5)
    a.kill()
    with Client("worker-b").connect(b.uri) as client:
        sub = client.subscribe("WorkQ", max_backlog=1)
        admin(b, "enable_proxied_transfer")
        first = sub.get(timeout=15)
        assert first is not None
        time.sleep(0.5)
        stats = queue_stats(b)
        assert (stats["proxied_claims"], stats["owned"], stats["elsewhere"]) == (1, 1, 4), stats
        first.ack()
        second = sub.get(timeout=15)
        assert second is not None and second.json()["i"] != first.json()["i"]
        admin(b, "disable_proxied_transfer")
        second.ack()
        client.flush()
        assert sub.get(timeout=4) is None  # longer than the transfer wait
        stats = queue_stats(b)
        assert (stats["proxied_claims"], stats["owned"], stats["elsewhere"]) == (2, 0, 3), stats


def test_an_owner_three_hops_away_is_reached_while_alive_and_claimed_once_down(instances):
    """reach.py rule 3: a line A - B - C - D, PassThrough on B and C, proxied transfer on
    at D with the only worker there. While A is alive D reaches it through C and B (no
    profile D sees names A: the flooded link states say so), so D's requests are granted
    by A and D claims nothing; once A is SIGKILLed and B says so, D claims A's remaining
    messages. Every message is processed exactly once."""
    a = instances("A", queues=QUEUE, topics=TOPICS, admin=True)
    b = instances("B", queues=QUEUE, topics=TOPICS)
    c = instances("C", queues=QUEUE, topics=TOPICS)
    d = instances("D", queues=QUEUE, topics=TOPICS, admin=True)
    a.replicate_to(b)
    b.replicate_to(a, pass_through=".*")
    b.replicate_to(c, pass_through=".*")
    c.replicate_to(b, pass_through=".*")
    c.replicate_to(d, pass_through=".*")
    d.replicate_to(c)
    for inst in (a, b, c, d):
        inst.start()
    publish_n(a.uri, 10)
    d.wait_for_queue(10)
    admin(d, "enable_proxied_transfer")
    processed: list = []
    run_workers([Worker(d.uri, "d0", processed)], processed, 10, timeout=30)
    assert queue_stats(d)["proxied_claims"] == 0 and queue_stats(a)["transfer_grants"] == 10
    publish_n(a.uri, 5, name="orders-2", start=10)
    d.wait_for_queue(5)
    a.kill()
    run_workers([Worker(d.uri, "d1", processed)], processed, 15, timeout=30)
    time.sleep(1)
    assert_once(processed, 15)
    assert queue_stats(d)["proxied_claims"] == 5
