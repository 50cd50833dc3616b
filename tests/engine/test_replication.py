"""Replication between engines over a simulated network (engine/replication/).

Each test names the rule of docs/replication.md it checks. The network, the crashes
and the clock are the cluster harness's (tests/engine/cluster.py): no sockets, no
sleeps.
"""

from __future__ import annotations

import pytest

from conveyor import errors
from conveyor.config import load_text
from conveyor.engine.replication.source import BATCH_BYTES_MAX
from conveyor.protocol.bookmarks import publisher_id
from conveyor.protocol import messages as m

from .cluster import Cluster, destination, instance_xml
from .engine_harness import queue_xml


def pair(*, sync: bool = False, both_ways: bool = False, sow: str = "", **dest) -> Cluster:
    configs = {
        "A": instance_xml("A", [destination("B", sync=sync, **dest)], sow=sow),
        "B": instance_xml("B", [destination("A", sync=sync, **dest)] if both_ways else [], sow=sow),
    }
    cluster = Cluster(configs)
    cluster.connect_all()
    return cluster


def publish(cluster: Cluster, node: str, conn: int, seq: int, topic: str = "Work", **kw) -> None:
    cluster.nodes[node].publish(conn, topic, {"n": seq}, seq=seq, ack_type="processed,persisted", **kw)


def persisted(cluster: Cluster, node: str, conn: int) -> list[int]:
    return [a.seq for a in cluster.nodes[node].acks(conn) if a.ack_type == "persisted"]


def test_publishes_reach_the_destination_with_their_identity_and_origin():
    """Rule 2: the same message keeps its publisher, sequence and timestamp; the
    destination records its origin and path."""
    c = pair()
    pub = c.nodes["A"].connect("orders-app")
    for seq in (1, 2, 3):
        publish(c, "A", pub, seq)
    c.settle()
    a, b = c.publishes("A"), c.publishes("B")
    assert [(r.publisher, r.seq, r.timestamp, r.data) for r in b] == [(r.publisher, r.seq, r.timestamp, r.data) for r in a]
    assert {(r.origin, r.origin_group, tuple(r.path)) for r in b} == {("A", "A", ("A",))}
    assert {(r.origin, tuple(r.path)) for r in a} == {("", ())}


def test_only_matching_topics_are_replicated():
    """Rule 1: a destination gets the topics its Topic regexes match."""
    c = pair(topics=("Work",))
    pub = c.nodes["A"].connect("app")
    publish(c, "A", pub, 1, topic="Work")
    publish(c, "A", pub, 2, topic="Other")
    c.settle()
    assert [r.topic for r in c.publishes("B")] == ["Work"]


def test_each_record_of_a_batch_is_judged_by_its_own_topic():
    """Rule 1 in one batch: runs of one topic, topics that alternate, names that are
    prefixes of one another, and records of other kinds between them."""
    recorded = ("Work", "Wo", "Wor", "Other")
    c = Cluster({"A": instance_xml("A", [destination("B", topics=("Work", "Wo"))], topics=recorded),
                 "B": instance_xml("B", topics=recorded)})
    c.connect_all()
    pub = c.nodes["A"].connect("app")
    topics = ["Work", "Work", "Other", "Work", "Wo", "Wor", "Wor", "Work", "Other", "Other", "Wo", "Work"]
    for seq, topic in enumerate(topics, start=1):
        publish(c, "A", pub, seq, topic=topic, **({"expiration": 30} if seq in (7, 8) else {}))
    c.settle()
    assert [(r.seq, r.topic) for r in c.publishes("B")] == [
        (seq, t) for seq, t in enumerate(topics, start=1) if t in ("Work", "Wo")]


def test_a_failed_over_publisher_is_deduplicated_on_the_other_instance():
    """Rule 2: a publisher that fails over and publishes again what A already
    replicated has it acknowledged as a duplicate on B; nothing is recorded twice."""
    c = pair(both_ways=True)
    pub = c.nodes["A"].connect("app")
    for seq in (1, 2, 3):
        publish(c, "A", pub, seq)
    c.settle()
    b = c.nodes["B"]
    conn = b.connect("app", ack_type="processed")
    (logon,) = b.acks(conn)
    assert logon.seq == 3  # B knows the publisher's highest sequence
    publish(c, "B", conn, 3)
    publish(c, "B", conn, 4)
    c.settle()
    acks = b.acks(conn)
    assert [(a.seq, a.status) for a in acks if a.ack_type == "processed"] == [(3, "duplicate"), (4, "success")]
    for node in ("A", "B"):
        assert sorted(c.identities(node)) == [(publisher_id("app"), s, -1) for s in (1, 2, 3, 4)], node


def test_sync_destination_holds_the_persisted_ack_until_it_has_the_record():
    """Rule 4: persisted only once durable here and on every sync destination."""
    c = pair(sync=True)
    a = c.nodes["A"]
    pub = a.connect("app")
    publish(c, "A", pub, 1)
    a.commit()
    assert persisted(c, "A", pub) == []  # durable on A only
    c.deliver("A", "B")  # the batch reaches B, which records it...
    assert persisted(c, "A", pub) == []
    c.commit("B")  # ...and makes it durable, then acknowledges
    c.deliver("A", "B")
    assert persisted(c, "A", pub) == [1]
    assert c.identities("B") == [(publisher_id("app"), 1, -1)]


def test_async_destination_is_never_waited_for():
    c = pair(sync=False)
    a = c.nodes["A"]
    pub = a.connect("app")
    publish(c, "A", pub, 1)
    a.commit()
    assert persisted(c, "A", pub) == [1]
    assert c.identities("B") == []


def test_a_down_sync_destination_holds_persisted_acks_and_releases_them_when_back():
    c = pair(sync=True)
    a = c.nodes["A"]
    pub = a.connect("app")
    c.cut("A", "B")
    publish(c, "A", pub, 1)
    a.commit()
    assert persisted(c, "A", pub) == []
    c.connect("A", "B")
    c.settle()
    assert persisted(c, "A", pub) == [1]


def test_downgrade_age_turns_a_lagging_sync_destination_async_and_back():
    """Rule 4: DowngradeAge / UpgradeAge."""
    c = pair(sync=True, extra="<DowngradeAge>10s</DowngradeAge>")
    a = c.nodes["A"]
    pub = a.connect("app")
    c.cut("A", "B")
    publish(c, "A", pub, 1)
    a.commit()
    c.advance(5)
    assert persisted(c, "A", pub) == []
    c.advance(6)  # the oldest record B lacks is 11 s old
    assert persisted(c, "A", pub) == [1]
    (stats,), _ = a.engine.replication.statistics(c.now)
    assert stats.downgraded
    c.connect("A", "B")
    c.settle()
    c.advance(0.1)
    (stats,), _ = a.engine.replication.statistics(c.now)
    assert not stats.downgraded
    publish(c, "A", pub, 2)
    a.commit()
    assert persisted(c, "A", pub) == []  # sync again


def test_a_cut_link_resumes_where_the_destination_is_without_a_duplicate():
    """Rule 2: the destination says where it is; what was in flight is sent again and
    what it already holds is not recorded twice."""
    c = pair()
    a = c.nodes["A"]
    pub = a.connect("app")
    for seq in range(1, 6):
        publish(c, "A", pub, seq)
        a.commit()
    c.deliver("A", "B", frames=2)  # some batches arrive, acks do not get back
    c.commit("B")
    c.cut("A", "B")
    for seq in range(6, 9):
        publish(c, "A", pub, seq)
    c.connect("A", "B")
    c.settle()
    assert [s for _, s, _ in c.identities("B")] == list(range(1, 9))


def test_the_destination_resumes_from_its_disk_after_a_crash():
    """Rule 2: ReceivedRec is durable with the batch; after a crash B resumes from what
    survived, and A resends the rest."""
    c = pair()
    a = c.nodes["A"]
    pub = a.connect("app")
    for seq in range(1, 4):
        publish(c, "A", pub, seq)
    c.settle()
    for seq in range(4, 7):
        publish(c, "A", pub, seq)
    a.commit()
    c.deliver("A", "B")  # B records 4..6 but does not commit them
    c.crash("B")
    c.restart("B")
    c.connect("A", "B")
    c.settle()
    assert [s for _, s, _ in c.identities("B")] == list(range(1, 7))


def test_a_ring_has_no_loops_and_every_message_once_everywhere():
    """Rule 5: A -> B -> C -> A with PassThrough: every instance has every message once,
    and nothing comes back to where it was published."""
    ring = {"A": "B", "B": "C", "C": "A"}
    c = Cluster({
        n: instance_xml(n, [destination(d, pass_through=".*")]) for n, d in ring.items()
    })
    c.connect_all()
    conns = {n: c.nodes[n].connect(f"app-{n}") for n in ring}
    for n in ring:
        for seq in (1, 2):
            publish(c, n, conns[n], seq)
    c.settle()
    everything = sorted((publisher_id(f"app-{n}"), s, -1) for n in ring for s in (1, 2))
    for n in ring:
        assert sorted(c.identities(n)) == everything, n
    # C got A's messages through B, so their path is A, B
    paths = {tuple(r.path) for r in c.publishes("C") if r.publisher == publisher_id("app-A")}
    assert paths == {("A", "B")}


def test_without_pass_through_nothing_received_is_forwarded():
    """Rule 1: by default an instance replicates only what was published to it."""
    c = Cluster({
        "A": instance_xml("A", [destination("B")]),
        "B": instance_xml("B", [destination("C")]),
        "C": instance_xml("C"),
    })
    c.connect_all()
    publish(c, "A", c.nodes["A"].connect("app"), 1)
    c.settle()
    assert c.identities("B") and not c.identities("C")


def test_pass_through_matches_the_originating_group():
    c = Cluster({
        "A": instance_xml("A", [destination("B")], group="east"),
        "B": instance_xml("B", [destination("C", pass_through="^east$")], group="hub"),
        "C": instance_xml("C", group="west"),
        "D": instance_xml("D", [destination("B")], group="north"),
    })
    c.connect_all()
    c.connect("D", "B")
    publish(c, "A", c.nodes["A"].connect("from-a"), 1)
    publish(c, "D", c.nodes["D"].connect("from-d"), 1)
    c.settle()
    assert [r.publisher for r in c.publishes("C")] == [publisher_id("from-a")]


def test_a_transaction_arrives_whole():
    """Rule 1: a committed transaction is one run on the destination too."""
    c = pair()
    a = c.nodes["A"]
    sink = a.connect("sink")
    a.handle(sink, m.Stage(txn="t1", topic="Work", rows=[b'{"i":1}', b'{"i":2}', b'{"i":3}']))
    a.handle(sink, m.CommitTxn(publisher="sink/q", seq=1, txns=["t1"]))
    c.settle()
    runs = [(r.txn_index, r.txn_total) for r in c.publishes("B")]
    assert runs == [(0, 3), (1, 3), (2, 3)]


def test_replicated_messages_do_not_enter_a_replicated_distributed_queue():
    """Rule 6: a Queue whose topic is replicated follows ownership: B records A's
    messages but does not deliver them."""
    sow = queue_xml("WorkQ", underlying="Work")
    c = pair(both_ways=True, sow=sow)
    pub = c.nodes["A"].connect("app")
    b = c.nodes["B"]
    worker = b.connect("worker")
    b.subscribe(worker, "WorkQ", options="max_backlog=5")
    publish(c, "A", pub, 1)
    c.settle()
    assert c.identities("B") and b.messages(worker) == []
    a = c.nodes["A"]
    w2 = a.connect("worker-a")
    a.subscribe(w2, "WorkQ", options="max_backlog=5")
    assert len(a.messages(w2)) == 1  # the owner delivers it


def test_a_queue_that_is_not_replicated_delivers_its_own_copy():
    """Rule 6: only the underlying topic is replicated (the queue topic is not): B's
    queue delivers B's copy."""
    sow = queue_xml("WorkQ", underlying="Work")
    c = pair(both_ways=True, sow=sow, topics=("Work",))
    b = c.nodes["B"]
    worker = b.connect("worker")
    b.subscribe(worker, "WorkQ", options="max_backlog=5")
    publish(c, "A", c.nodes["A"].connect("app"), 1)
    c.settle()
    assert len(b.messages(worker)) == 1


def test_a_replicated_local_queue_is_refused_at_startup():
    """Every instance delivers its own copy of a LocalQueue: its topic cannot be replicated."""
    xml = instance_xml("A", [destination("B")], sow=queue_xml("Mine", underlying="Work", tag="LocalQueue"))
    with pytest.raises(errors.ConfigError, match="destination 'B' replicates LocalQueue 'Mine'"):
        load_text(xml)


def test_queue_definitions_that_differ_refuse_the_link_naming_both_instances():
    c = Cluster({
        "A": instance_xml("A", [destination("B")], sow=queue_xml("WorkQ", underlying="Work")),
        "B": instance_xml("B", [destination("A")], sow=queue_xml("WorkQ", underlying="Orders")),
    })
    assert not c.connect("A", "B")
    assert "'A' and 'B'" in c.links[("A", "B")].refused and "same definition" in c.links[("A", "B")].refused


def test_a_replicated_queue_needs_replication_both_ways():
    c = Cluster({
        "A": instance_xml("A", [destination("B")], sow=queue_xml("WorkQ", underlying="Work")),
        "B": instance_xml("B", sow=queue_xml("WorkQ", underlying="Work")),
    })
    assert not c.connect("A", "B")
    assert "both ways" in c.links[("A", "B")].refused


def test_a_destination_must_be_the_instance_it_names():
    c = Cluster({"A": instance_xml("A", [destination("B")]), "B": instance_xml("B")})
    c.nodes["B"].config = load_text(instance_xml("Bee"))
    c.nodes["B"].crash()  # restart B as an instance named "Bee"
    assert not c.connect("A", "B")
    assert "answered as instance 'Bee'" in c.links[("A", "B")].refused


def test_statistics_say_how_far_behind_a_link_is():
    """Operations: records and bytes behind, seconds behind, state."""
    c = pair()
    a = c.nodes["A"]
    pub = a.connect("app")
    publish(c, "A", pub, 1)
    a.commit()
    c.advance(3)
    (out,), _ = a.engine.replication.statistics(c.now)
    assert (out.state, out.peer) == ("streaming", "B")
    assert out.bytes_behind > 0 and out.seconds_behind >= 3
    c.settle()
    (out,), _ = a.engine.replication.statistics(c.now)
    assert (out.bytes_behind, out.seconds_behind) == (0, 0.0)
    _, (inc,) = c.nodes["B"].engine.replication.statistics(c.now)
    assert (inc.source, inc.records_recorded) == ("A", 1)


def test_a_destination_that_does_not_read_costs_the_source_its_window_only():
    """Rule 1 (memory): the source reads what it sends from the journal, and never more
    than its window ahead of the destination's acknowledgements; a destination that takes
    nothing holds the source's unsent output at the window plus one batch, however much
    is published; once it reads again, everything arrives."""
    c = pair()
    a = c.nodes["A"]
    window = 256 * 1024
    a.engine.replication.source._window = window
    pub = a.connect("app")
    body = "x" * 4000
    for seq in range(1, 1001):  # about 4 MB of journal, 16 windows
        c.nodes["A"].publish(pub, "Work", {"n": seq, "b": body}, seq=seq, ack_type="persisted")
        if seq % 50 == 0:
            a.commit()
    a.commit()
    link = c.links[("A", "B")]
    c._pull(link)  # what A wrote for B, nothing of it delivered
    unsent = sum(len(r) for batch in link.to_dst for r in batch.records)
    assert 0 < unsent <= window + BATCH_BYTES_MAX
    (out,), _ = a.engine.replication.statistics(c.now)
    assert out.sent - out.acked <= window + BATCH_BYTES_MAX and out.bytes_behind > 3_000_000
    c.settle()
    assert len(c.publishes("B")) == 1000


def test_retention_keeps_what_a_destination_has_not_acknowledged():
    """Retention waits for destinations: records a destination lacks stay in the
    journal (no gap), and the floor moves up once it has them."""
    c = pair()
    a = c.nodes["A"]
    pub = a.connect("app")
    publish(c, "A", pub, 1)
    c.settle()
    c.cut("A", "B")
    for seq in range(2, 6):
        publish(c, "A", pub, seq)
    a.commit()
    behind = a.engine.replication.source.acknowledged()["B"]
    assert behind < a.journal.durable_end
    assert a.engine.retention_floor(a.engine.checkpoint()) <= behind
    c.connect("A", "B")
    c.settle()
    assert a.engine.replication.source.acknowledged()["B"] > behind
    assert a.engine.retention_floor(a.engine.checkpoint()) > behind


def test_a_down_sync_destination_costs_a_note_per_run_of_publishes_not_per_publish():
    """Memory while a sync destination is down: consecutive publishes of one publisher
    share one unpersisted note (publish_log rule 4) and a connection keeps a bounded
    number of frames awaiting their persisted ack (outbox rule 3). When the destination
    is back, the publisher's last publish is acknowledged as persisted."""
    from conveyor.engine.outbox import PERSIST_MARKS_MAX
    from conveyor.engine.publish_log import UNPERSISTED_RUN_MAX

    c = pair(sync=True)
    a = c.nodes["A"]
    pub = a.connect("app")
    c.cut("A", "B")
    n = 3 * PERSIST_MARKS_MAX
    for seq in range(1, n + 1):  # one frame each
        publish(c, "A", pub, seq)
    a.commit()
    assert persisted(c, "A", pub) == []
    assert a.engine.publishes.unpersisted_notes <= n // UNPERSISTED_RUN_MAX + 1
    assert a.engine.publishes.persisted_seq(a.engine.sessions[pub].publisher) == 0
    c.connect("A", "B")
    c.settle()
    acks = persisted(c, "A", pub)
    assert acks[-1] == n and len(acks) <= PERSIST_MARKS_MAX
    assert acks == sorted(acks)
    assert a.engine.publishes.unpersisted_notes == 0
