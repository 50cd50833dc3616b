"""Replication between real server processes on loopback (docs/replication.md).

Every instance is a ``conveyor serve`` subprocess with a client transport and an
incoming replication transport; links are real TCP connections, cut by a proxy where a
test needs a network fault, and servers die by SIGKILL. What each instance recorded is
read from its journal once it has stopped, so "exactly once" is checked record by
record, not by waiting for silence.
"""

from __future__ import annotations

from conveyor import Client
from conveyor.protocol.bookmarks import publisher_id
from tests.integration.instances import TOPIC, Instance, assert_exactly_once, ids, instances, publish  # noqa: F401
from tests.integration.tcp_proxy import TcpProxy


def test_async_one_way_with_a_link_cut_mid_stream(instances):
    """A -> B async through a proxy that drops the connection twice while 3,000
    messages stream: B has each exactly once, with its publisher, sequence and time."""
    a, b = instances("A"), instances("B")
    b.start()
    proxy = TcpProxy(b.repl_port)
    instances.proxies.append(proxy)
    a.replicate_to(b, port=proxy.port)
    a.start()
    with Client("orders").connect(a.uri) as client:
        for i in range(1, 3001):
            client.publish(TOPIC, {"i": i}, sequence=i)
            if i in (1000, 2000):
                client.flush()
                proxy.cut()
        client.flush()
    b.wait_for(3000)
    a.stop()
    b.stop()
    assert_exactly_once(b, ids("orders", range(1, 3001)))
    a_recs = {(r.publisher, r.seq): r.timestamp for r in a.recorded()}
    b_recs = {(r.publisher, r.seq): (r.timestamp, r.origin) for r in b.recorded()}
    assert all(b_recs[k] == (t, "A") for k, t in a_recs.items())


def test_sync_persisted_ack_means_the_destination_has_it_on_disk(instances):
    """A <-> B sync: SIGKILL A right after flush() says everything is persisted, then
    SIGKILL B too: every message is in B's journal."""
    a, b = instances("A"), instances("B")
    a.replicate_to(b, sync=True)
    b.replicate_to(a, sync=True)
    a.start()
    b.start()
    publish(a.uri, "payments", range(1, 2001))
    a.kill()
    b.kill()
    assert_exactly_once(b, ids("payments", range(1, 2001)))


def test_sigkill_of_the_destination_mid_stream_then_restart(instances):
    a, b = instances("A"), instances("B")
    a.replicate_to(b)
    b.start()
    a.start()
    publish(a.uri, "feed", range(1, 2001))
    b.kill()
    publish(a.uri, "feed", range(2001, 3001))  # while B is down
    b.start()
    b.wait_for(3000)
    a.stop()
    b.stop()
    assert_exactly_once(b, ids("feed", range(1, 3001)))


def test_sigkill_of_the_source_then_both_restarted_in_either_order(instances):
    a, b = instances("A"), instances("B")
    a.replicate_to(b)
    b.replicate_to(a)
    a.start()
    b.start()
    publish(a.uri, "feed", range(1, 1001))
    publish(b.uri, "other", range(1, 1001))
    a.kill()
    b.kill()
    b.start()  # the destination first
    a.start()
    publish(a.uri, "feed", range(1001, 1501))
    a.wait_for(2500)
    b.wait_for(2500)
    a.kill()
    a.start()  # and the source alone
    publish(a.uri, "feed", range(1501, 2001))
    b.wait_for(3000)
    a.stop()
    b.stop()
    expected = ids("feed", range(1, 2001)) | ids("other", range(1, 1001))
    assert_exactly_once(a, expected)
    assert_exactly_once(b, expected)


def test_chain_with_pass_through_and_a_ring_without_loops(instances):
    """A -> B -> C with PassThrough on B, and C -> A closing a ring: every message once
    on every instance, nothing comes back to where it was published."""
    a, b, c = instances("A", group="ga"), instances("B", group="gb"), instances("C", group="gc")
    a.replicate_to(b, pass_through=".*")
    b.replicate_to(c, pass_through=".*")
    c.replicate_to(a, pass_through=".*")
    for inst in (a, b, c):
        inst.start()
    publish(a.uri, "from-a", range(1, 501))
    publish(b.uri, "from-b", range(1, 501))
    publish(c.uri, "from-c", range(1, 501))
    for inst in (a, b, c):
        inst.wait_for(1500)
    for inst in (a, b, c):
        inst.stop()
    expected = ids("from-a", range(1, 501)) | ids("from-b", range(1, 501)) | ids("from-c", range(1, 501))
    for inst in (a, b, c):
        assert_exactly_once(inst, expected)
    paths = {tuple(r.path) for r in c.recorded() if r.publisher == publisher_id("from-a")}
    assert paths == {("A", "B")}


def test_a_publisher_that_fails_over_records_nothing_twice(instances, tmp_path):
    """A publisher with a FilePublishStore publishes to A, loses A (SIGKILL) before every
    persisted ack arrived, and republishes from its store on B: each message is recorded
    once on B, and once on A after A comes back (B's persisted acks wait for A, its
    sync destination)."""
    from conveyor.client import FilePublishStore

    a, b = instances("A"), instances("B")
    a.replicate_to(b, sync=True)
    b.replicate_to(a, sync=True)
    a.start()
    b.start()
    store = tmp_path / "publisher.store"
    client = Client("trades", publish_store=FilePublishStore(store), reconnect=False).connect(a.uri)
    for i in range(1, 1001):
        client.publish(TOPIC, {"i": i})
    a.kill()  # some of them persisted (on A and B), some perhaps not
    try:
        client.close()
    except Exception:  # noqa: BLE001 (the server is gone)
        pass
    with Client("trades", publish_store=FilePublishStore(store)).connect(b.uri) as client:
        # The store republishes what was not persisted; B drops what it has. B's sync
        # destination A is down, so B holds the persisted acks until A is back.
        a.start()
        client.flush()
    a.wait_for(1000)
    a.stop()
    b.stop()
    assert_exactly_once(a, ids("trades", range(1, 1001)))
    assert_exactly_once(b, ids("trades", range(1, 1001)))


def test_a_destination_that_breaks_a_rule_is_refused_loudly(instances):
    """Validation: a destination named after another instance is refused, with both
    names in the log, and the source keeps serving."""
    a, b = instances("A"), instances("B")
    b.start()
    wrong = Instance(a.dir.parent, "Bee")
    wrong.repl_port = b.repl_port
    a.replicate_to(wrong)
    a.start()
    a.proc.wait_log("answered as instance 'B'", timeout=30)
    publish(a.uri, "still-serving", range(1, 11))


def test_a_bookmark_subscriber_that_fails_over_resumes_without_a_gap_or_a_duplicate(instances):
    """Clients across instances: a bookmark subscriber reading A, which dies, goes on on
    B from where it was, although B recorded the same messages in another order (two
    publishers, one on each instance) and at other positions: every message once."""
    import time

    a, b = instances("A"), instances("B")
    a.replicate_to(b)
    b.replicate_to(a)
    a.start()
    b.start()

    def publish_on(uri: str, name: str, seqs: range) -> None:
        with Client(name).connect(uri) as client:
            for i in seqs:
                client.publish(TOPIC, {"p": name, "i": i}, sequence=i + 1)
            client.flush()

    publish_on(a.uri, "east", range(0, 200))
    publish_on(b.uri, "west", range(0, 200))
    a.wait_for(400)
    b.wait_for(400)
    got: list[tuple[str, int]] = []
    with Client("reader").connect([a.uri, b.uri]) as reader:
        sub = reader.subscribe(TOPIC, bookmark="0")
        while len(got) < 150:
            msg = sub.get(timeout=30)
            assert msg is not None, f"only {len(got)} messages from A"
            got.append((msg.json()["p"], msg.json()["i"]))
        a.kill()  # the reader fails over to B, which has every message at other positions
        publish_on(b.uri, "west", range(200, 250))
        deadline = time.monotonic() + 60
        while len(got) < 450 and time.monotonic() < deadline:
            msg = sub.get(timeout=1)
            if msg is not None:
                got.append((msg.json()["p"], msg.json()["i"]))
        assert sub.get(timeout=1) is None
    twice = [m for m in set(got) if got.count(m) > 1]
    assert not twice, f"handed out twice: {sorted(twice)[:10]}"
    expected = {("east", i) for i in range(200)} | {("west", i) for i in range(250)}
    assert set(got) == expected, f"missing: {sorted(expected - set(got))[:10]}"


def test_a_destination_filter_replicates_only_the_messages_that_match(instances):
    """A destination Topic's Filter (reference E.1): B records the messages of Work whose
    body matches, and nothing else; A keeps them all."""
    a, b = instances("A"), instances("B")
    a.replicate_to(b, topic_filter="/i % 3 = 0")
    b.start()
    a.start()
    publish(a.uri, "feed", range(1, 301))
    b.wait_for(100)
    a.stop()
    b.stop()
    assert sorted(r.seq for r in b.recorded()) == list(range(3, 301, 3))
    assert len(a.recorded()) == 300
