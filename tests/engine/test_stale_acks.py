"""Stale acknowledgements (docs/queues.md, "Leasing", "Stale acknowledgements";
engine/delivery.py rule 8, queue/leases.py rule 7), through the Engine.

A delivery is (bookmark, delivery count). Under ``Leasing=strict``, and for a
subscription made with ``fenced_acks`` under the default ``sublet``, each delivery
carries its count (``dn``); an ack or a touch naming it (``deliveries=[n,...]``) after
the message was delivered again, or (a replicated queue) after another instance took it
over, is refused and reported. Without either, nothing changes.
"""

from __future__ import annotations

import pytest

from conveyor.engine.replication.ownership import WAIT_DEFAULT_S
from conveyor.protocol import messages as m

from .cluster import Cluster, destination, instance_xml
from .engine_harness import Harness, config_xml, decode, queue_xml

LEASE_S = 5.0


def one_queue(**elements) -> Harness:
    elements.setdefault("LeasePeriod", f"{LEASE_S:g}s")
    elements.setdefault("MaxPerSubscriptionBacklog", "10")
    return Harness(config_xml(queue_xml("Q", **elements), topics=("Work",)))


def worker(h: Harness, name: str, options: str | None = None) -> int:
    conn = h.connect(name)
    h.subscribe(conn, "Q", "s", options=options)
    (ack,) = h.acks(conn)
    assert ack.status == "success", ack
    return conn


def publish(h: Harness, values) -> None:
    pub = h.connect("pub")
    for v in values:
        h.publish(pub, "Work", {"i": v})
    h.commit()


def ack(h: Harness, conn: int, msg: m.Message, delivery: int | None, **kw) -> m.Ack:
    options = None if delivery is None else f"deliveries=[{delivery}]"
    h.ack(conn, "Q", msg, options=options, ack_type="processed", **kw)
    (reply,) = h.acks(conn)
    return reply


def leased_one(options: str | None = None, **elements) -> tuple[Harness, int, m.Message]:
    """Queue Q (``elements``), worker ``a`` (``options``) holding message 0's first delivery."""
    h = one_queue(**elements)
    a = worker(h, "a", options)
    publish(h, [0])
    (first,) = h.messages(a)
    return h, a, first


def lease_expires_to_b(h: Harness, options_a: str | None, options_b: str | None) -> tuple[int, int, m.Message, m.Message]:
    """``a`` leases message 0; its lease runs out; ``b`` gets it again."""
    a = worker(h, "a", options_a)
    publish(h, [0])
    (first,) = h.messages(a)
    b = worker(h, "b", options_b)
    h.advance(LEASE_S + 1)  # a's lease runs out: the message goes to a or b again
    got_a, got_b = h.messages(a), h.messages(b)
    # the round-robin may give it back to a: then it is a's delivery 2
    second = (got_a + got_b)[0]
    if got_a:  # make b the holder for the test: a unsubscribes, which returns it to b
        h.unsubscribe(a)
        h.acks(a)
        h.advance(0.0)
        (second,) = h.messages(b)
    return a, b, first, second


def test_strict_deliveries_carry_their_count_and_a_stale_ack_is_refused_and_reported():
    h = one_queue(Leasing="strict")
    a, b, first, second = lease_expires_to_b(h, None, None)
    assert first.delivery == 1 and second.delivery >= 2
    assert decode(second)["i"] == 0
    reply = ack(h, a, first, first.delivery)
    assert reply.status == "failure" and reply.code == "not_lease_holder"
    assert reply.details["refused"] == first.bookmark and reply.details["stale"] == first.bookmark
    assert "stale" in reply.reason
    assert h.stats("Q").backlog == 1  # b's lease holds
    reply = ack(h, b, second, second.delivery)
    assert reply.status == "success" and reply.records_deleted == 1
    assert h.stats("Q").queue_depth == 0


def test_strict_refuses_the_same_connections_ack_of_an_older_delivery():
    h = one_queue(Leasing="strict")
    a = worker(h, "a")
    publish(h, [0])
    (first,) = h.messages(a)
    h.advance(LEASE_S + 1)  # the lease runs out; a, the only subscriber, gets it again
    (second,) = h.messages(a)
    assert (first.delivery, second.delivery) == (1, 2)
    reply = ack(h, a, first, 1)
    assert reply.status == "failure" and reply.details["stale"] == first.bookmark
    assert ack(h, a, second, 2).status == "success"
    assert h.stats("Q").queue_depth == 0


def test_sublet_with_fenced_acks_refuses_the_stale_ack_and_takes_the_holders():
    h = one_queue()
    a, b, first, second = lease_expires_to_b(h, "fenced_acks", None)
    assert first.delivery == 1
    assert second.delivery is None  # b did not opt in: its deliveries carry no count
    reply = ack(h, a, first, first.delivery)
    assert reply.status == "failure" and reply.code == "not_lease_holder"
    assert reply.details["refused"] == first.bookmark
    assert h.stats("Q").backlog == 1
    assert ack(h, b, second, None).status == "success"
    assert h.stats("Q").queue_depth == 0


def test_sublet_without_opt_in_takes_the_late_ack_as_before():
    h = one_queue()
    a, b, first, second = lease_expires_to_b(h, None, None)
    assert first.delivery is None and second.delivery is None
    reply = ack(h, a, first, None)
    assert reply.status == "success" and reply.records_deleted == 1  # the reference's sublet
    assert h.stats("Q").queue_depth == 0


def test_a_late_ack_of_the_latest_delivery_is_taken():
    """The lease ran out but nobody got the message again: the ack is not stale."""
    h, a, first = leased_one(Leasing="strict")
    h.unsubscribe(a)  # returned to the queue, delivered to no one since
    h.acks(a)
    assert ack(h, a, first, first.delivery).status == "success"
    assert h.stats("Q").queue_depth == 0


def test_a_batch_refuses_only_its_stale_acks():
    h = one_queue(Leasing="strict")
    a = worker(h, "a", "max_backlog=10")
    publish(h, [0, 1])
    first = h.messages(a)
    assert [x.delivery for x in first] == [1, 1]
    h.advance(LEASE_S + 1)
    again = h.messages(a)
    assert [x.delivery for x in again] == [2, 2]
    # acks of (0, delivery 1: stale) and (1, delivery 2: the latest)
    h.ack(a, "Q", [first[0], again[1]], options="deliveries=[1,2]", ack_type="processed")
    (reply,) = h.acks(a)
    assert reply.status == "failure" and reply.details["refused"] == first[0].bookmark
    assert reply.details["records_deleted"] == 1
    assert h.stats("Q").backlog == 1


def test_a_stale_cancel_is_refused_too():
    h, a, first = leased_one(Leasing="strict")
    h.advance(LEASE_S + 1)
    (second,) = h.messages(a)
    h.ack(a, "Q", first, options="cancel,deliveries=[1]", ack_type="processed")
    (reply,) = h.acks(a)
    assert reply.status == "failure" and reply.details["stale"] == first.bookmark
    assert h.stats("Q").backlog == 1 and h.stats("Q").cancelled == 0


@pytest.mark.parametrize("options, why", [
    ("deliveries=[1,2]", "one per bookmark"),
    ("deliveries=[x]", "whole numbers"),
    ("touch,deliveries=[1,2]", "one per bookmark"),
    ("touch,delay=1", "touch cannot be combined"),
])
def test_bad_deliveries_are_refused(options, why):
    h, a, first = leased_one(Leasing="strict")
    h.ack(a, "Q", first, options=options, ack_type="processed")
    (reply,) = h.acks(a)
    assert reply.status == "failure" and reply.code == "invalid_option" and why in reply.reason
    assert h.stats("Q").backlog == 1


def test_deliveries_with_a_filter_are_refused():
    h = one_queue(Leasing="strict")
    a = worker(h, "a")
    h.ack_filter(a, "Q", "/i = 0", options="deliveries=[1]", ack_type="processed")
    (reply,) = h.acks(a)
    assert reply.status == "failure" and reply.code == "invalid_option"


def test_fenced_acks_is_kept_across_a_pause_and_dropped_by_a_replace_without_it():
    h = one_queue()
    a = worker(h, "a", "fenced_acks")
    h.handle(a, m.Subscribe(topic="Q", sub_id="s", options="pause", ack_type="processed"))
    h.handle(a, m.Subscribe(topic="Q", sub_id="s", options="resume", ack_type="processed"))
    h.acks(a)
    publish(h, [0])
    (first,) = h.messages(a)
    assert first.delivery == 1
    h.ack(a, "Q", first)
    h.handle(a, m.Subscribe(topic="Q", sub_id="s", options="replace", ack_type="processed"))
    h.acks(a)
    publish(h, [1])
    (second,) = h.messages(a)
    assert second.delivery is None


def test_at_most_once_deliveries_carry_no_count():
    h, a, first = leased_one(Leasing="strict", Semantics="at-most-once", LeasePeriod=None)
    assert first.delivery is None


def touch(h: Harness, conn: int, messages, deliveries: str) -> m.Ack:
    h.ack(conn, "Q", messages, options=f"touch,deliveries=[{deliveries}]", ack_type="processed")
    (reply,) = h.acks(conn)
    return reply


def test_a_touch_of_a_stale_delivery_renews_nothing_and_is_reported():
    """A touch is fenced as an ack is: of (0, delivery 1: stale) and (1, delivery 2: the
    latest), both held by ``a`` now, only 1's lease is renewed; 0 is reported stale."""
    h = one_queue(Leasing="strict")
    a = worker(h, "a", "max_backlog=10")
    publish(h, [0, 1])
    first = h.messages(a)
    h.advance(LEASE_S + 1)
    again = h.messages(a)
    assert [x.delivery for x in again] == [2, 2]
    h.advance(LEASE_S / 2)
    reply = touch(h, a, [first[0], again[1]], "1,2")
    assert reply.status == "failure" and reply.code == "not_lease_holder"
    assert reply.details["refused"] == reply.details["stale"] == first[0].bookmark
    assert reply.details["matches"] == 1 and "touch refused" in reply.reason
    h.advance(LEASE_S * 3 / 4)  # past the untouched lease, within the renewed one
    (third,) = h.messages(a)
    assert (decode(third)["i"], third.delivery) == (0, 3)
    assert h.stats("Q").backlog == 2


def test_a_touch_of_the_latest_delivery_renews_it():
    h, a, first = leased_one("fenced_acks")
    h.advance(LEASE_S * 3 / 4)
    reply = touch(h, a, first, "1")
    assert reply.status == "success" and reply.matches == 1
    h.advance(LEASE_S / 2)  # past the first deadline, within the renewed one
    assert h.messages(a) == [] and ack(h, a, first, 1).records_deleted == 1


# --- replicated queues: a message another instance owns now -------------------------------


def test_a_fenced_ack_of_a_message_another_instance_took_over_is_refused():
    """A's lease ran out and B was granted the message (it is ELSEWHERE on A): A's late
    ack naming its delivery is stale and leaves B's lease alone; one naming no delivery
    removes the message everywhere, as before (the reference's sublet)."""
    sow = queue_xml("Q", underlying="Work", LeasePeriod=f"{LEASE_S:g}s")
    c = Cluster({n: instance_xml(n, [destination(d) for d in "AB" if d != n], sow=sow) for n in "AB"})
    c.connect_all()
    a, b = c.nodes["A"], c.nodes["B"]
    wa = worker(a, "wa", "fenced_acks,max_backlog=1")
    publish(a, [0])
    c.settle()
    (first,) = a.messages(wa)
    assert first.delivery == 1
    a.handle(wa, m.Subscribe(topic="Q", sub_id="s", options="pause", ack_type="processed"))
    a.acks(wa)
    wb = worker(b, "wb", "max_backlog=1")
    c.advance(LEASE_S + WAIT_DEFAULT_S + 1)  # A's lease runs out; B asks for the message, A grants it
    c.settle()
    (taken,) = b.messages(wb)
    assert decode(taken)["i"] == 0 and a.stats("Q").elsewhere == 1
    reply = ack(a, wa, first, first.delivery)
    assert reply.status == "failure" and reply.code == "not_lease_holder"
    assert reply.details["stale"] == first.bookmark
    c.settle()
    assert (a.stats("Q").elsewhere, b.stats("Q").backlog) == (1, 1)  # B's lease stands
    assert touch(a, wa, first, "1").details["stale"] == first.bookmark  # a touch too
    reply = ack(a, wa, first, None)  # names no delivery: taken, as before
    assert reply.status == "success" and reply.records_deleted == 1
    c.settle()
    assert a.stats("Q").elsewhere == 0 and b.stats("Q").queue_depth == 0
