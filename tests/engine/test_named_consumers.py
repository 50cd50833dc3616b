"""Named consumers: the Spark source's delivery sequence (docs/spark-server.md,
engine/consumers.py). Engine level, virtual clock, exact crashes (engine_harness)."""

from __future__ import annotations

import pytest

from conveyor import records
from conveyor.protocol import messages as m
from conveyor.protocol import replies

from .engine_harness import Harness, config_xml, decode, queue_xml

LEASE_S = 10.0


def harness(**elements) -> Harness:
    elements.setdefault("LeasePeriod", f"{LEASE_S:g}s")
    return Harness(config_xml(queue_xml("Q", **elements), topics=("Work",)))


def publish(h: Harness, pub: int, values) -> None:
    for v in values:
        h.publish(pub, "Work", {"i": v})
    h.commit()


def call(h: Harness, conn: int, cmd, *, commit: bool = True) -> m.Ack:
    """One operation; its Ack (the last one received)."""
    h.handle(conn, cmd)
    if commit:
        h.commit()
    acks = h.acks(conn)
    assert acks, f"no reply to {cmd!r}"
    return acks[-1]


def ok(ack: m.Ack) -> dict:
    assert ack.status == "success", (ack.code, ack.reason)
    return ack.result


def lease(h, conn, after, max=0, ttl=30.0, **kw) -> dict:
    return ok(call(h, conn, m.Lease(queue="Q", consumer="c", after=after, max=max, ttl=ttl, **kw)))


def fetch(h, conn, lo, hi) -> list[m.Message]:
    h.handle(conn, m.Fetch(queue="Q", consumer="c", lo=lo, hi=hi, cid="f"))
    out = h.take(conn)
    assert isinstance(out[-1], m.Ack) and out[-1].result == replies.FetchDone(count=hi - lo), out[-1]
    return out[:-1]


def items(msgs) -> list:
    return [decode(x)["i"] for x in msgs]


def info(h, conn) -> dict:
    return ok(call(h, conn, m.ConsumerInfo(queue="Q", consumer="c")))


def ack_through(h, conn, d, epoch=0) -> dict:
    return ok(call(h, conn, m.AckThrough(queue="Q", consumer="c", d=d, epoch=epoch)))


def failure(ack: m.Ack, code: str) -> None:
    assert ack.status == "failure" and ack.code == code, (ack.status, ack.code, ack.reason)


def setup(n=5, **elements):
    h = harness(**elements)
    pub = h.connect("pub")
    publish(h, pub, range(n))
    return h, h.connect("driver")


def test_lease_numbers_deliveries_in_queue_order_and_fetch_names_them():
    h, drv = setup(5)
    h.handle(drv, m.Lease(queue="Q", consumer="c", after=0, max=3, ttl=30))
    assert h.acks(drv) == []  # the reply waits for the lease record to be durable
    h.commit()
    assert ok(h.acks(drv)[-1]) == replies.LeaseReply(d=3, leased=3, reoffered=0, D=3)
    got = fetch(h, drv, 0, 3)
    assert items(got) == [0, 1, 2]
    assert [x.delivery for x in got] == [1, 2, 3]
    assert all(x.query_id == "f" and x.queue == "Q" and x.topic == "Work" for x in got)
    assert got[0].bookmark.split("|")[:2] == [str(got[0].publisher), str(got[0].seq)]
    assert items(fetch(h, drv, 1, 2)) == [1]
    assert lease(h, drv, after=3).d == 5  # max 0: everything available
    assert items(fetch(h, drv, 3, 5)) == [3, 4]
    assert lease(h, drv, after=5) == replies.LeaseReply(d=5, leased=0, reoffered=0, D=5)
    recs = [r for _, p in h.journal.scan() if isinstance(r := records.decode(p), records.ConsumerLeasedRec)]
    assert [(r.first, len(r.positions), r.counts) for r in recs] == [(1, 3, [1, 1, 1]), (4, 2, [1, 1])]


def test_a_columnar_fetch_answers_the_same_deliveries_in_pages(monkeypatch):
    from conveyor.engine import consumers

    monkeypatch.setattr(consumers, "FETCH_PAGE_MESSAGES", 4)
    monkeypatch.setattr(consumers, "FETCH_PAGE_BYTES", 20)  # two of these 8-byte bodies
    h, drv = setup(11)
    lease(h, drv, 0)
    rows = fetch(h, drv, 1, 11)
    h.handle(drv, m.Fetch(queue="Q", consumer="c", lo=1, hi=11, cid="f", columns=True))
    *pages, done = h.take(drv)
    assert done.result == replies.FetchDone(count=10)
    assert all(isinstance(p, m.FetchPage) and p.query_id == "f" and p.queue == "Q" for p in pages)
    assert [(p.lo, len(p.data)) for p in pages] == [(1, 2), (3, 2), (5, 2), (7, 2), (9, 2)]  # cut by bytes
    columns = [(d, t, f"{pb}|{s}|{pos}", pb, s, ts, x)
               for p in pages
               for d, t, pb, s, ts, pos, x in zip(p.data, p.topics, p.publishers, p.seqs, p.timestamps, p.positions,
                                                   p.correlation_ids)]
    assert columns == [(r.data, r.topic, r.bookmark, r.publisher, r.seq, r.timestamp, r.correlation_id)
                       for r in rows]
    monkeypatch.setattr(consumers, "FETCH_PAGE_BYTES", 1000)
    h.handle(drv, m.Fetch(queue="Q", consumer="c", lo=1, hi=11, cid="f", columns=True))
    assert [(p.lo, len(p.data)) for p in h.take(drv)[:-1]] == [(1, 4), (5, 4), (9, 2)]  # cut by count
    monkeypatch.setattr(consumers, "FETCH_PAGE_BYTES", 1)  # a body over the limit: a page of one
    h.handle(drv, m.Fetch(queue="Q", consumer="c", lo=0, hi=3, cid="g", columns=True))
    assert [(p.lo, len(p.data)) for p in h.take(drv)[:-1]] == [(0, 1), (1, 1), (2, 1)]


def test_leased_messages_go_to_no_other_subscriber_and_ack_through_removes_them():
    h, drv = setup(4)
    lease(h, drv, 0, max=2)
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [2, 3]
    assert ok(call(h, drv, m.AckThrough(queue="Q", consumer="c", d=2))) == replies.AckThroughReply(acked=2)
    assert h.stats("Q").queue_depth == 2  # only the subscriber's two are left
    assert ack_through(h, drv, 1) == replies.AckThroughReply(acked=2)  # idempotent
    assert ack_through(h, drv, 2) == replies.AckThroughReply(acked=2)
    acked = [r for _, p in h.journal.scan() if isinstance(r := records.decode(p), records.ConsumerAckedRec)]
    assert len(acked) == 1 and acked[0].through == 2
    assert info(h, drv) == replies.ConsumerInfoReply(d=2, acked=2, epoch=0, unacked=0)


def test_upto_bounds_the_lease():
    h, drv = setup(3)
    upto = ok(call(h, drv, m.Head(queue="Q"))).upto
    publish(h, h.connect("late"), [10, 11])
    assert lease(h, drv, 0, upto=upto).d == 3
    assert items(fetch(h, drv, 0, 3)) == [0, 1, 2]
    assert lease(h, drv, 3, upto=upto).leased == 0
    assert lease(h, drv, 3).d == 5


def test_reoffer_after_a_driver_crash_leases_nothing_new():
    """SPARK.md 4.1: the driver leased, died before its offset log write, and asks again
    with the old ``after``: the same deliveries, renewed, and nothing new."""
    h, drv = setup(6)
    assert lease(h, drv, 0, max=4).d == 4
    r = lease(h, drv, 0, max=3)
    assert (r.d, r.leased, r.reoffered, r.renewed) == (3, 0, 3, 3)
    assert lease(h, drv, 0, max=0).d == 4
    assert lease(h, drv, 3, max=10).reoffered == 1
    assert items(fetch(h, drv, 0, 4)) == [0, 1, 2, 3]
    assert lease(h, drv, 4, max=10).d == 6  # caught up: new leases again


def test_bad_delivery_ranges():
    h, drv = setup(3)
    lease(h, drv, 0, max=2)
    failure(call(h, drv, m.Lease(queue="Q", consumer="c", after=3)), "bad_delivery_range")
    ack_through(h, drv, 1)
    failure(call(h, drv, m.Lease(queue="Q", consumer="c", after=0)), "bad_delivery_range")
    failure(call(h, drv, m.Fetch(queue="Q", consumer="c", lo=0, hi=2)), "bad_delivery_range")
    failure(call(h, drv, m.Fetch(queue="Q", consumer="c", lo=1, hi=3)), "bad_delivery_range")
    failure(call(h, drv, m.AckThrough(queue="Q", consumer="c", d=3)), "bad_delivery_range")
    failure(call(h, drv, m.Reclaim(queue="Q", consumer="c", lo=0, hi=3)), "bad_delivery_range")
    failure(call(h, drv, m.Lease(queue="Nope", consumer="c")), "unknown_topic")
    failure(call(h, drv, m.Lease(queue="Q", consumer="c", after=2, ttl=0)), "invalid_option")


def test_an_expired_lease_returns_the_message_and_a_reoffer_takes_it_back():
    h, drv = setup(3)
    lease(h, drv, 0, ttl=5)
    h.advance(6)
    h.commit()
    assert h.stats("Q").available == 3  # LeaseExpired -> ready again
    assert any(isinstance(records.decode(p), records.ReturnedRec) for _, p in h.journal.scan())
    r = lease(h, drv, 0, ttl=5)
    assert (r.d, r.taken, r.renewed) == (3, 3, 0)
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert h.messages(w) == []  # taken back: nobody else gets them
    assert items(fetch(h, drv, 0, 3)) == [0, 1, 2]
    c = h.engine.named.get("Q", "c")
    assert c.expired_leases == 3 and c.taken_back == 3


def test_a_message_leased_again_under_a_new_delivery_is_acknowledged_once():
    """A lapsed lease lets the message go out again, to the same consumer too (a new
    lease after the old one, not a re-offer of it): one ack_through then names the
    message twice."""
    h, drv = setup(2)
    lease(h, drv, 0, max=1, ttl=5)
    h.advance(6)
    h.commit()
    assert lease(h, drv, 1, ttl=5).d == 3  # message 0 again (d 2), then message 1 (d 3)
    assert items(fetch(h, drv, 0, 3)) == [0, 0, 1]
    assert ack_through(h, drv, 3).acked == 3
    assert h.stats("Q").available == 0 and h.stats("Q").acknowledged == 2


def test_ack_through_of_a_delivery_held_elsewhere_still_acks_the_message():
    """SPARK.md 2.2: acking an expired delivery still acks the message."""
    h, drv = setup(2)
    lease(h, drv, 0, ttl=5)
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    h.advance(6)
    got = h.messages(w)
    assert items(got) == [0, 1]
    r = ok(call(h, drv, m.Reclaim(queue="Q", consumer="c", lo=0, hi=2, ttl=5)))
    assert r == replies.ReclaimReply(renewed=0, held_elsewhere=2, done=0)
    ack_through(h, drv, 2)
    assert h.stats("Q").queue_depth == 0
    h.ack(w, "Q", got)  # the subscriber's late ack: already done, ignored
    assert h.failures(w) == []
    r = ok(call(h, drv, m.Reclaim(queue="Q", consumer="c", lo=0, hi=2, ttl=5)))
    assert r == replies.ReclaimReply(renewed=0, held_elsewhere=0, done=2)


def test_extend_renews_every_unacked_lease():
    h, drv = setup(3)
    lease(h, drv, 0, ttl=5)
    for _ in range(4):
        h.advance(4)
        assert ok(call(h, drv, m.Extend(queue="Q", consumer="c", ttl=5))) == replies.ExtendReply(renewed=3)
    assert h.stats("Q").backlog == 3 and h.stats("Q").available == 0
    h.advance(6)
    assert ok(call(h, drv, m.Extend(queue="Q", consumer="c", ttl=5))) == replies.ExtendReply(renewed=0)


def test_claim_fences_older_holders():
    h, drv = setup(3)
    other = h.connect("other")
    lease(h, drv, 0, max=1)  # never claimed: epoch 0 works
    assert ok(call(h, other, m.Claim(queue="Q", consumer="c", token="query-2"))) == replies.ClaimReply(epoch=1, d=1, acked=0)
    ack = call(h, drv, m.Lease(queue="Q", consumer="c", after=1))
    failure(ack, "fenced")
    assert "claimed by a newer holder (epoch 1)" in ack.reason
    failure(call(h, drv, m.AckThrough(queue="Q", consumer="c", d=1)), "fenced")
    failure(call(h, drv, m.Extend(queue="Q", consumer="c")), "fenced")
    failure(call(h, drv, m.Reclaim(queue="Q", consumer="c", lo=0, hi=1)), "fenced")
    assert items(fetch(h, drv, 0, 1)) == [0]  # reads are not fenced
    assert lease(h, other, 1, epoch=1).d == 3
    assert ok(call(h, drv, m.Claim(queue="Q", consumer="c"))).epoch == 2
    failure(call(h, other, m.AckThrough(queue="Q", consumer="c", d=1, epoch=1)), "fenced")
    h.crash()
    drv = h.connect("driver")
    assert info(h, drv).epoch == 2
    failure(call(h, drv, m.AckThrough(queue="Q", consumer="c", d=1, epoch=1)), "fenced")
    assert ack_through(h, drv, 1, epoch=2) == replies.AckThroughReply(acked=1)


def test_at_most_once_queues_are_refused():
    h = Harness(config_xml(queue_xml("Q", Semantics="at-most-once"), topics=("Work",)))
    drv = h.connect("driver")
    ack = call(h, drv, m.Lease(queue="Q", consumer="c"))
    failure(ack, "invalid_option")
    assert "at-least-once" in ack.reason


@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_deliveries_and_the_acked_pointer_survive_a_crash(with_checkpoint):
    h, drv = setup(6)
    lease(h, drv, 0, max=4)
    ack_through(h, drv, 2)
    if with_checkpoint:
        h.checkpoint()
        h.commit()
    h.crash(checkpoint=with_checkpoint)
    drv = h.connect("driver")
    assert info(h, drv) == replies.ConsumerInfoReply(d=4, acked=2, epoch=0, unacked=2)
    assert items(fetch(h, drv, 2, 4)) == [2, 3]
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    # unacked deliveries stay with the named consumer for one LeasePeriod; acked never come back
    assert items(h.messages(w)) == [4, 5]
    r = lease(h, drv, 2)  # the driver comes back: re-offer renews them
    assert (r.d, r.renewed, r.reoffered) == (4, 2, 2)
    ack_through(h, drv, 4)
    h.crash(checkpoint=with_checkpoint)
    drv = h.connect("driver")
    assert info(h, drv) == replies.ConsumerInfoReply(d=4, acked=4, epoch=0, unacked=0)
    assert h.stats("Q").queue_depth == 2  # the subscriber's two, unacked


def test_after_a_restart_unacked_deliveries_lapse_to_other_subscribers_after_the_lease_period():
    h, drv = setup(2)
    lease(h, drv, 0)
    h.crash()
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert h.messages(w) == []
    h.advance(LEASE_S + 1)
    assert items(h.messages(w)) == [0, 1]


def test_a_lease_whose_record_was_not_durable_is_forgotten():
    h, drv = setup(3)
    h.handle(drv, m.Lease(queue="Q", consumer="c", after=0))
    assert h.acks(drv) == []  # never answered
    h.crash()
    drv = h.connect("driver")
    assert info(h, drv).d == 0
    assert lease(h, drv, 0).d == 3


def test_replays_are_idempotent_over_a_checkpoint_taken_midway():
    """The checkpoint snapshot and the records after the scan start overlap: applying a
    record twice must change nothing (a lease applies only when first == D+1)."""
    h, drv = setup(8)
    lease(h, drv, 0, max=2)
    ack_through(h, drv, 1)
    h.checkpoint()
    h.commit()
    lease(h, drv, 2, max=2)
    ack_through(h, drv, 3)
    for _ in range(3):
        h.crash()
        drv = h.connect("driver")
        assert info(h, drv) == replies.ConsumerInfoReply(d=4, acked=3, epoch=0, unacked=1)
        assert items(fetch(h, drv, 3, 4)) == [3]
        h.checkpoint()
        h.commit()


def test_a_delivery_acked_by_another_path_keeps_its_consumer_state_past_the_queue_point():
    """The checkpoint carries the consumer state, so a restart needs no record below the
    queue's recovery point, and fetch still reads the body from the journal."""
    h, drv = setup(3)
    lease(h, drv, 0, ttl=5)
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    h.advance(6)
    h.ack(w, "Q", h.messages(w))  # the lapsed messages processed elsewhere
    h.commit()
    assert h.engine.queues["Q"].recovery_point() > max(h.engine.named.get("Q", "c").positions)
    cp = h.checkpoint()
    h.commit()
    assert cp.consumers["Q"]["c"].d == 3
    assert h.engine.retention_floor(cp) <= min(h.engine.named.get("Q", "c").positions)
    h.crash()
    drv = h.connect("driver")
    assert info(h, drv) == replies.ConsumerInfoReply(d=3, acked=0, epoch=0, unacked=3)
    h.engine.cache._entries.clear()  # force journal reads
    assert items(fetch(h, drv, 0, 3)) == [0, 1, 2]
    assert ok(call(h, drv, m.Reclaim(queue="Q", consumer="c", lo=0, hi=3))).done == 3
    ack_through(h, drv, 3)


def test_priority_queue_leases_in_priority_order_and_takes_back():
    h = Harness(config_xml(queue_xml("Q", LeasePeriod="10s", Priority="/p"), topics=("Work",)))
    pub = h.connect("pub")
    for i, p in enumerate([1, 5, 3]):
        h.publish(pub, "Work", {"i": i, "p": p})
    h.commit()
    drv = h.connect("driver")
    assert lease(h, drv, 0, max=2, ttl=5).d == 2
    assert items(fetch(h, drv, 0, 2)) == [1, 2]
    h.advance(6)
    r = lease(h, drv, 0, ttl=5)
    assert r.taken == 2
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [0]
    h.crash()  # restart: taken back again with their priorities
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [0]


def test_statistics_report_each_named_consumer():
    h, drv = setup(3)
    lease(h, drv, 0, max=2)
    lease(h, drv, 0, max=2)
    (stats,) = [c for c in h.engine.statistics().named_consumers if (c.queue, c.name) == ("Q", "c")]
    assert (stats.d, stats.acked, stats.leased, stats.reoffered) == (2, 0, 2, 2)


def test_fetch_is_bounded():
    h, drv = setup(1)
    lease(h, drv, 0)
    failure(call(h, drv, m.Fetch(queue="Q", consumer="c", lo=0, hi=200_000)), "bad_delivery_range")
