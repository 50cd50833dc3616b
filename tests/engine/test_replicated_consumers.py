"""Named consumers of a replicated queue follow it to the other instances
(engine/consumers.py rule 7, engine/replication/__init__.py rule 7; docs/spark.md, "Failover
between instances").

The Spark source's named consumer is the query's position in a queue: its deliveries
(d -> message), acknowledged pointer and fencing epoch. On a replicated queue those
travel with the queue's records, by message identity, so a query whose instance fails
continues on the other one with the same deliveries, and its exactly-once commits
(ack_through with the epoch) keep working there. Engines are joined by the simulated
network of tests/engine/cluster.py, in virtual time.
"""

from __future__ import annotations

from conveyor.protocol import messages as m
from conveyor.protocol import replies

from .cluster import Cluster, destination, instance_xml
from .engine_harness import decode, queue_xml

QUEUE = queue_xml("WorkQ", underlying="Work", LeasePeriod="30s")


def cluster(*, sync: bool = True) -> Cluster:
    """A replicates to B (``sync``: persisted on B before acknowledged), B back to A
    asynchronously: the survivor B does not wait for A while A is down (a sync
    destination that is down holds persisted acks and the replies below)."""
    c = Cluster({"A": instance_xml("A", [destination("B", sync=sync)], sow=QUEUE),
                 "B": instance_xml("B", [destination("A")], sow=QUEUE)})
    c.connect_all()
    return c


def publish(c: Cluster, node: str, *values) -> None:
    h = c.nodes[node]
    conn = h.connect(f"pub-{node}-{h._next_conn}")
    for v in values:
        h.publish(conn, "Work", {"n": v})
    c.settle()


def call(c: Cluster, node: str, conn: int, cmd) -> m.Ack:
    """One named-consumer command and its reply, the network settled in between."""
    h = c.nodes[node]
    h.handle(conn, cmd)
    c.settle()
    acks = h.acks(conn)
    assert acks, f"no reply to {cmd!r}"
    return acks[-1]


def ok(ack: m.Ack):
    assert ack.status == "success", (ack.code, ack.reason)
    return ack.result


def fetch(c: Cluster, node: str, conn: int, lo: int, hi: int) -> list[int]:
    h = c.nodes[node]
    h.handle(conn, m.Fetch(queue="WorkQ", consumer="spark", lo=lo, hi=hi, cid="f"))
    out = h.take(conn)
    assert out[-1].result == replies.FetchDone(count=hi - lo), out[-1]
    return [decode(x)["n"] for x in out[:-1]]


def info(c: Cluster, node: str) -> replies.ConsumerInfoReply:
    h = c.nodes[node]
    return ok(call(c, node, h.connect(f"info-{node}-{h._next_conn}"), m.ConsumerInfo(queue="WorkQ", consumer="spark")))


def queued(c: Cluster, node: str) -> list[int]:
    h = c.nodes[node]
    return sorted(decode(x)["n"] for x in h.sow(h.connect(f"viewer-{node}-{h._next_conn}"), "WorkQ"))


def test_a_query_continues_on_the_other_instance_with_its_deliveries_position_and_epoch():
    """The owner A dies with deliveries 3 and 4 leased and not acknowledged: on B the
    consumer has the same deliveries, acked pointer and epoch; the restarted query claims
    it there, re-reads (2, 4] (the same messages: B does not own them, so it reports them
    held elsewhere rather than leasing them to anyone), and its commit acknowledges them
    on B. B leases A's other messages only once proxied transfer is on (A is down). When
    A comes back it learns the acknowledgements, the deliveries and the new epoch: the old
    query is fenced there, and the messages never come out again."""
    c = cluster()
    publish(c, "A", 1, 2, 3, 4, 5, 6)
    a = c.nodes["A"].connect("driver-1")
    epoch = ok(call(c, "A", a, m.Claim(queue="WorkQ", consumer="spark", token="query-1"))).epoch
    assert ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=0, max=4, ttl=30, epoch=epoch))).d == 4
    assert fetch(c, "A", a, 0, 4) == [1, 2, 3, 4]
    ok(call(c, "A", a, m.AckThrough(queue="WorkQ", consumer="spark", d=2, epoch=epoch)))
    assert info(c, "B") == replies.ConsumerInfoReply(d=4, acked=2, epoch=epoch, unacked=2)
    assert fetch(c, "B", c.nodes["B"].connect("reader"), 2, 4) == [3, 4]  # the same deliveries

    c.crash("A")
    b = c.nodes["B"].connect("driver-2")
    claim = ok(call(c, "B", b, m.Claim(queue="WorkQ", consumer="spark", token="query-2")))
    assert claim.epoch > epoch and (claim.d, claim.acked) == (4, 2)
    again = ok(call(c, "B", b, m.Reclaim(queue="WorkQ", consumer="spark", lo=2, hi=4, ttl=30, epoch=claim.epoch)))
    assert (again.renewed, again.held_elsewhere, again.done) == (0, 2, 0)
    assert fetch(c, "B", b, 2, 4) == [3, 4]
    ok(call(c, "B", b, m.AckThrough(queue="WorkQ", consumer="spark", d=4, epoch=claim.epoch)))
    assert queued(c, "B") == [5, 6]
    fresh = ok(call(c, "B", b, m.Lease(queue="WorkQ", consumer="spark", after=4, ttl=30, epoch=claim.epoch)))
    assert fresh.leased == 0  # 5 and 6 are A's: B delivers them only after a transfer
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)  # disaster recovery: A is down
    fresh = ok(call(c, "B", b, m.Lease(queue="WorkQ", consumer="spark", after=4, max=1, ttl=30, epoch=claim.epoch)))
    assert (fresh.leased, fresh.d) == (1, 5)  # one claimed for one wanted
    assert fetch(c, "B", b, 4, 5) == [5]
    ok(call(c, "B", b, m.AckThrough(queue="WorkQ", consumer="spark", d=5, epoch=claim.epoch)))
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", False)

    c.restart("A")
    c.connect_all()
    c.settle()
    assert queued(c, "A") == [6]
    assert info(c, "A") == replies.ConsumerInfoReply(d=5, acked=5, epoch=claim.epoch, unacked=0)
    old = c.nodes["A"].connect("driver-1-again")
    stale = call(c, "A", old, m.Lease(queue="WorkQ", consumer="spark", after=4, ttl=30, epoch=epoch))
    assert (stale.status, stale.code) == ("failure", "fenced")


def test_a_lease_reply_waits_until_the_sync_destination_holds_the_lease():
    """Rule 7: "every reply waits until the sync destinations hold its record": a query
    is never told of a delivery that a failover to a sync destination would not know."""
    c = cluster()
    publish(c, "A", 1, 2)
    h = c.nodes["A"]
    a = h.connect("driver")
    h.handle(a, m.Lease(queue="WorkQ", consumer="spark", after=0, ttl=30))
    h.commit()  # durable on A; B has not acknowledged the record yet
    assert h.acks(a) == []
    c.settle()
    assert h.acks(a)[-1].result.d == 2
    assert info(c, "B").d == 2


def test_the_other_instance_recovers_the_consumer_from_its_own_journal():
    """The replicated records are journaled where they arrive, with that instance's
    positions: a restart of B (with or without its checkpoint) keeps the consumer."""
    c = cluster(sync=False)
    publish(c, "A", 1, 2, 3)
    a = c.nodes["A"].connect("driver")
    ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=0, ttl=30)))
    ok(call(c, "A", a, m.AckThrough(queue="WorkQ", consumer="spark", d=1)))
    for checkpoint in (False, True):
        c.crash("B")
        c.nodes["B"].crash(now=c.now, checkpoint=checkpoint)
        c.down.discard("B")
        c.connect_all()
        c.settle()
        assert info(c, "B") == replies.ConsumerInfoReply(d=3, acked=1, epoch=0, unacked=2)
        assert fetch(c, "B", c.nodes["B"].connect(f"reader-{checkpoint}"), 1, 3) == [2, 3]


def test_a_consumer_of_a_queue_that_is_not_replicated_stays_on_its_instance():
    """Only queues that follow ownership ship their consumers: a replicated topic's
    LocalQueue delivers its own copy on each instance, with its own consumers."""
    local = queue_xml("WorkQ", underlying="Work", tag="LocalQueue")
    names = ("A", "B")
    c = Cluster({n: instance_xml(n, [destination(d, topics=("Work",)) for d in names if d != n], sow=local)
                 for n in names})
    c.connect_all()
    publish(c, "A", 1, 2)
    a = c.nodes["A"].connect("driver")
    ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=0, ttl=30)))
    assert info(c, "B") == replies.ConsumerInfoReply(d=0, acked=0, epoch=0, unacked=0)


def test_a_claim_cuts_off_the_deliveries_its_claimer_never_saw():
    """Rule 8: with A replicating asynchronously, A leases deliveries 3 and 4 and dies
    before they reach B. The query claims the consumer on B, which knows deliveries up
    to 2: its next lease numbers other messages 3, 4, 5. When A comes back, B's claim
    (epoch 2, "I knew up to 2") cuts A's own 3 and 4 off, B's deliveries follow, and A's
    old lease, arriving at B late, changes nothing there: both copies name the same
    messages for the same deliveries."""
    c = cluster(sync=False)
    publish(c, "A", 1, 2, 3, 4, 5, 6)
    a = c.nodes["A"].connect("driver-1")
    epoch = ok(call(c, "A", a, m.Claim(queue="WorkQ", consumer="spark", token="query-1"))).epoch
    ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=0, max=2, ttl=30, epoch=epoch)))
    c.cut("A", "B")  # A's next records stay on A
    h = c.nodes["A"]
    h.handle(a, m.Lease(queue="WorkQ", consumer="spark", after=2, max=2, ttl=30, epoch=epoch))
    h.commit()
    assert h.acks(a)[-1].result.d == 4  # async: told without B
    c.crash("A")

    b = c.nodes["B"].connect("driver-2")
    claim = ok(call(c, "B", b, m.Claim(queue="WorkQ", consumer="spark", token="query-2")))
    assert claim.epoch > epoch and (claim.d, claim.acked) == (2, 0)
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    lease = ok(call(c, "B", b, m.Lease(queue="WorkQ", consumer="spark", after=2, max=3, ttl=30, epoch=claim.epoch)))
    assert lease.d == 5
    on_b = fetch(c, "B", b, 0, 5)
    assert sorted(on_b) == [1, 2, 3, 4, 5]

    c.restart("A")
    c.connect_all()
    c.settle()
    assert info(c, "A") == info(c, "B") == replies.ConsumerInfoReply(d=5, acked=0, epoch=claim.epoch, unacked=5)
    assert fetch(c, "A", c.nodes["A"].connect("reader"), 0, 5) == on_b
    ok(call(c, "B", b, m.AckThrough(queue="WorkQ", consumer="spark", d=5, epoch=claim.epoch)))
    assert info(c, "A") == info(c, "B") == replies.ConsumerInfoReply(d=5, acked=5, epoch=claim.epoch, unacked=0)
    assert queued(c, "A") == queued(c, "B") == [6]
    # and a restart of either replays the same decisions from its journal
    for node in ("A", "B"):
        c.crash(node)
        c.restart(node)
    c.connect_all()
    c.settle()
    assert info(c, "A") == info(c, "B") == replies.ConsumerInfoReply(d=5, acked=5, epoch=claim.epoch, unacked=0)


def test_an_old_epoch_ack_counts_only_for_deliveries_the_claimer_knew():
    """Rule 8: A's query acknowledges through 4 while B knows deliveries up to 2 only;
    B's claim cuts 3 and 4 off, so A's late ack moves B's pointer to 2, not into the
    deliveries B numbered since."""
    c = cluster(sync=False)
    publish(c, "A", 1, 2, 3, 4, 5, 6)
    a = c.nodes["A"].connect("driver-1")
    epoch = ok(call(c, "A", a, m.Claim(queue="WorkQ", consumer="spark", token="query-1"))).epoch
    ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=0, max=2, ttl=30, epoch=epoch)))
    c.cut("A", "B")
    h = c.nodes["A"]
    h.handle(a, m.Lease(queue="WorkQ", consumer="spark", after=2, max=2, ttl=30, epoch=epoch),
             m.AckThrough(queue="WorkQ", consumer="spark", d=4, epoch=epoch))
    h.commit()
    c.crash("A")
    b = c.nodes["B"].connect("driver-2")
    claim = ok(call(c, "B", b, m.Claim(queue="WorkQ", consumer="spark", token="query-2")))
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    assert ok(call(c, "B", b, m.Lease(queue="WorkQ", consumer="spark", after=2, max=1, ttl=30,
                                      epoch=claim.epoch))).d == 3
    c.restart("A")
    c.connect_all()
    c.settle()
    assert info(c, "B") == info(c, "A") == replies.ConsumerInfoReply(d=3, acked=2, epoch=claim.epoch, unacked=1)


def test_the_checkpoint_file_keeps_what_a_claim_knew(tmp_path):
    """Rule 8 needs ``claim_d`` after a restart from a checkpoint: the consumers file
    keeps it, and a file written before it was kept reads as "everything known"."""
    import msgspec

    from conveyor.engine.consumers import NamedConsumer
    from conveyor.server.checkpoints import CONSUMERS_FILE, read_consumers, write_consumers

    c = NamedConsumer("WorkQ", "spark")
    c.d, c.acked, c.token = 9, 4, "t"
    c.claimed(2, "t", 5)
    c.claimed(3, "t", 7)
    c.positions.extend([10, 11, 12, 13, 14])
    write_consumers(tmp_path, 100, {"WorkQ": {"spark": c.export_state()}})
    back = NamedConsumer.from_state("WorkQ", "spark", read_consumers(tmp_path, durable_end=200)["WorkQ"]["spark"])
    assert (back.d, back.acked, back.epoch, back.claim_d, list(back.positions)) == (9, 4, 3, 7, [10, 11, 12, 13, 14])
    assert back.cuts == [(2, 5), (3, 7)] and back.cut_for(1) == 5 and back.cut_for(2) == 7
    path = tmp_path / CONSUMERS_FILE
    old = msgspec.json.decode(path.read_bytes())
    del old["consumers"]["WorkQ"]["spark"]["claim_d"]
    del old["consumers"]["WorkQ"]["spark"]["cuts"]
    path.write_bytes(msgspec.json.encode(old))
    back = NamedConsumer.from_state("WorkQ", "spark", read_consumers(tmp_path, durable_end=200)["WorkQ"]["spark"])
    assert back.claim_d == 9 and back.cuts == [(3, 9)]


def test_an_epoch_on_a_replicated_queue_is_later_for_a_later_claim_and_unique_to_its_instance():
    """Rule 8: the round is the claimer's clock (hundredths of a second), at least one
    more than the last; the low bits are the instance's tag, so two instances never
    pick one epoch, and the epoch stays exact as a JSON number (below 2**53)."""
    from conveyor.engine.consumers import EPOCH_TAG_BITS, next_epoch

    now = 1_800_000_000.0  # 2027
    a, b = next_epoch(0, "A", now), next_epoch(0, "B", now)
    assert a != b and a >> EPOCH_TAG_BITS == b >> EPOCH_TAG_BITS == int(now * 100)
    assert next_epoch(a, "B", now + 0.5) > next_epoch(b, "A", now) > max(a, b)  # the later claim wins
    assert next_epoch(a, "A", now - 60) > a  # a clock that went back still moves on
    assert next_epoch(0, "an-instance-name", 19_880_000_000.0) < 2 ** 53  # the year 2600


def test_two_claims_that_never_saw_each_other_end_as_the_later_ones_deliveries_everywhere():
    """Rule 8: with both links down, the query claims on A, leases A's messages, then
    fails over and claims on B a second later, which knows neither that claim nor those
    deliveries, and leases B's. The two claims take different epochs, B's the higher.
    Once the links are back both copies hold B's claim with exactly its deliveries (the
    claim names them by identity): A's own deliveries 3 and 4 are cut off, and a fetch
    names the same messages on both instances."""
    c = cluster(sync=False)
    publish(c, "A", 1, 2, 3)
    publish(c, "B", 4, 5, 6)
    a = c.nodes["A"].connect("driver-1")
    epoch = ok(call(c, "A", a, m.Claim(queue="WorkQ", consumer="spark", token="query-1"))).epoch
    ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=0, max=2, ttl=30, epoch=epoch)))
    c.cut("A", "B")
    c.cut("B", "A")
    first = ok(call(c, "A", a, m.Claim(queue="WorkQ", consumer="spark", token="query-2")))
    assert ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=2, max=2, ttl=30,
                                      epoch=first.epoch))).d == 3  # A owns one more: 3
    c.advance(1.0)
    b = c.nodes["B"].connect("driver-2")
    second = ok(call(c, "B", b, m.Claim(queue="WorkQ", consumer="spark", token="query-3")))
    assert second.d == 2 and second.epoch > first.epoch
    assert ok(call(c, "B", b, m.Lease(queue="WorkQ", consumer="spark", after=2, max=2, ttl=30,
                                      epoch=second.epoch))).d == 4
    on_b = fetch(c, "B", b, 0, 4)
    assert on_b[2:] == [4, 5]

    c.connect_all()
    c.settle()
    assert info(c, "A") == info(c, "B") == replies.ConsumerInfoReply(d=4, acked=0, epoch=second.epoch, unacked=4)
    assert fetch(c, "A", c.nodes["A"].connect("reader"), 0, 4) == on_b
    assert call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=3, max=1, ttl=30,
                                   epoch=first.epoch)).code == "fenced"
    for node in ("A", "B"):  # and a restart of either replays the same decisions
        c.crash(node)
        c.restart(node)
    c.connect_all()
    c.settle()
    assert info(c, "A") == info(c, "B") == replies.ConsumerInfoReply(d=4, acked=0, epoch=second.epoch, unacked=4)
    assert fetch(c, "A", c.nodes["A"].connect("reader2"), 0, 4) == fetch(c, "B", c.nodes["B"].connect("r2"), 0, 4)


def test_an_old_epoch_ack_counts_up_to_the_first_later_claim_not_the_last():
    """Rule 8: B's query acknowledges through 2 while its link to A is down; A's query
    claims knowing nothing (d 0), leases and acknowledges other messages, and claims
    again knowing 2. B's late ack is of a branch the first of those claims cut off at 0:
    it moves neither copy's acknowledged pointer (the last claim's 2 would have)."""
    c = cluster(sync=False)
    publish(c, "A", 1, 2, 3)
    publish(c, "B", 4, 5, 6)
    c.cut("A", "B")
    c.cut("B", "A")
    b = c.nodes["B"].connect("driver-1")
    eb = ok(call(c, "B", b, m.Claim(queue="WorkQ", consumer="spark", token="query-1"))).epoch
    ok(call(c, "B", b, m.Lease(queue="WorkQ", consumer="spark", after=0, max=2, ttl=30, epoch=eb)))
    ok(call(c, "B", b, m.AckThrough(queue="WorkQ", consumer="spark", d=2, epoch=eb)))
    c.advance(1.0)
    a = c.nodes["A"].connect("driver-2")
    e1 = ok(call(c, "A", a, m.Claim(queue="WorkQ", consumer="spark", token="query-2"))).epoch
    ok(call(c, "A", a, m.Lease(queue="WorkQ", consumer="spark", after=0, max=2, ttl=30, epoch=e1)))
    ok(call(c, "A", a, m.AckThrough(queue="WorkQ", consumer="spark", d=1, epoch=e1)))
    e2 = ok(call(c, "A", a, m.Claim(queue="WorkQ", consumer="spark", token="query-3"))).epoch
    c.connect_all()
    c.settle()
    assert info(c, "A") == info(c, "B") == replies.ConsumerInfoReply(d=2, acked=1, epoch=e2, unacked=1)
    assert fetch(c, "A", c.nodes["A"].connect("reader"), 1, 2) == fetch(c, "B", c.nodes["B"].connect("r"), 1, 2) == [2]
