"""SOW topics and views across replicated instances (engine/replication/__init__.py rule 8,
engine/sow/state.py rule 7; docs/sow-and-views.md, "Replication").

The invariant every test checks: a SOW topic replicated to another instance holds the
same records there (same keys, same messages), live and after a crash and restart of
either instance. The network and the clock are the cluster harness's
(tests/engine/cluster.py): no sockets, no sleeps.
"""

from __future__ import annotations

import json

import pytest

from conveyor import errors
from conveyor.protocol import messages as m

from .cluster import Cluster, destination, instance_xml

ORDERS = ("<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key>"
          "<Expiration>60s</Expiration></Topic>")
VIEW = ("<View><Name>by_region</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
        "<Projection><Field>/region</Field><Field>SUM(/qty) AS /qty</Field></Projection>"
        "<Grouping><Field>/region</Field></Grouping></View>")


def cluster(*, both_ways: bool = False, b_sow: str = ORDERS + VIEW) -> Cluster:
    topics = ("orders",)
    c = Cluster({
        "A": instance_xml("A", [destination("B", topics=topics)], sow=ORDERS + VIEW, topics=topics),
        "B": instance_xml("B", [destination("A", topics=topics)] if both_ways else [], sow=b_sow, topics=topics),
    })
    c.connect_all()
    return c


def two_way(sow: str, *, replicated: tuple[str, ...], recorded: tuple[str, ...]) -> Cluster:
    """A and B replicating ``replicated`` to each other, both with ``sow``; A's
    publisher has put two EU orders (qty 5 and 7) in ``orders``."""
    c = Cluster({n: instance_xml(n, [destination(d, topics=replicated)], sow=sow, topics=recorded)
                 for n, d in (("A", "B"), ("B", "A"))})
    c.connect_all()
    pub = c.nodes["A"].connect("orders-app")
    publish(c, "A", pub, 1, {"id": 1, "region": "EU", "qty": 5})
    publish(c, "A", pub, 2, {"id": 2, "region": "EU", "qty": 7})
    c.settle()
    return c


def records(c: Cluster, node: str, topic: str = "orders") -> dict[str, dict]:
    h = c.nodes[node]
    conn = h.connect(f"reader-{node}-{topic}")
    out = {msg.sow_key: json.loads(msg.data) for msg in h.sow(conn, topic)}
    h.disconnect(conn)
    return out


def view(c: Cluster, node: str) -> dict[str, int]:
    return {r["region"]: r["qty"] for r in records(c, node, "by_region").values()}


def publish(c: Cluster, node: str, conn: int, seq: int, data: dict, *, delta: bool = False) -> None:
    cls = m.DeltaPublish if delta else m.Publish
    c.nodes[node].handle(conn, cls(topic="orders", data=json.dumps(data).encode(), seq=seq))


def delete(c: Cluster, node: str, conn: int, filter: str) -> None:
    c.nodes[node].handle(conn, m.SowDelete(topic="orders", filter=filter, ack_type="processed"))


def test_publishes_and_delta_publishes_build_the_same_records_on_the_destination():
    """Rule 8: a delta publish is journaled merged, so the destination gets the full
    message; each instance's records and views agree."""
    c = cluster()
    pub = c.nodes["A"].connect("orders-app")
    publish(c, "A", pub, 1, {"id": 1, "region": "EU", "qty": 5})
    publish(c, "A", pub, 2, {"id": 2, "region": "US", "qty": 7})
    publish(c, "A", pub, 3, {"id": 1, "qty": 9}, delta=True)
    c.settle()
    a = records(c, "A")
    assert sorted(r["qty"] for r in a.values()) == [7, 9]
    assert records(c, "B") == a
    assert view(c, "B") == view(c, "A") == {"EU": 9, "US": 7}


def test_a_sow_delete_is_replicated_by_identity_and_survives_a_restart_of_the_destination():
    """Rule 8: the destination removes the very records the delete removed on the
    source (named by identity, journaled there), also after a crash and restart."""
    c = cluster()
    pub = c.nodes["A"].connect("orders-app")
    for i in range(1, 6):
        publish(c, "A", pub, i, {"id": i, "region": "EU" if i % 2 else "US", "qty": i})
    c.settle()
    admin = c.nodes["A"].connect("admin")
    delete(c, "A", admin, "/region = 'EU'")
    c.settle()
    assert sorted(r["id"] for r in records(c, "A").values()) == [2, 4]
    assert records(c, "B") == records(c, "A")
    assert view(c, "B") == {"US": 6}
    c.crash("B")
    c.restart("B")
    c.connect_all()
    c.settle()
    assert records(c, "B") == records(c, "A")
    assert view(c, "B") == {"US": 6}


def test_a_delete_does_not_remove_a_newer_record_of_the_key_on_the_other_instance():
    """Rule 8: with both instances publishing, a delete on A names A's record; on B a
    newer publish of the same key that A has not seen yet is kept, and once both
    directions have settled, both instances agree."""
    c = cluster(both_ways=True)
    pa, pb = c.nodes["A"].connect("app-a"), c.nodes["B"].connect("app-b")
    publish(c, "A", pa, 1, {"id": 1, "region": "EU", "qty": 1})
    c.settle()
    # B replaces key 1 while A deletes it; neither has seen the other's change yet.
    publish(c, "B", pb, 1, {"id": 1, "region": "EU", "qty": 2})
    delete(c, "A", c.nodes["A"].connect("admin"), "/id = 1")
    c.commit("A")
    c.commit("B")
    c.deliver("A", "B")  # A's delete reaches B after B's own publish: B keeps its newer record
    assert [r["qty"] for r in records(c, "B").values()] == [2]
    c.settle()  # B's publish reaches A after A's delete: A has it as the record of key 1
    assert records(c, "A") == records(c, "B")
    assert [r["qty"] for r in records(c, "A").values()] == [2]


def test_a_replicated_publish_takes_the_destinations_key():
    """Rule 8: the record's key is the one this instance's Key computes, live and after a
    restart (a destination keyed differently from its source keeps its own records)."""
    by_region = ("<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/region</Key></Topic>")
    c = cluster(b_sow=by_region)
    pub = c.nodes["A"].connect("orders-app")
    publish(c, "A", pub, 1, {"id": 1, "region": "EU", "qty": 1})
    publish(c, "A", pub, 2, {"id": 2, "region": "EU", "qty": 2})
    c.settle()
    assert len(records(c, "A")) == 2
    live = records(c, "B")
    assert [r["id"] for r in live.values()] == [2]  # one record per region on B
    c.crash("B")
    c.restart("B")
    assert records(c, "B") == live


def test_record_expiry_is_stamped_at_the_source_and_happens_on_every_instance():
    """Rule 8: expiry is not replicated, the message carries its absolute expiry."""
    c = cluster()
    pub = c.nodes["A"].connect("orders-app")
    publish(c, "A", pub, 1, {"id": 1, "region": "EU", "qty": 1})
    c.settle()
    c.advance(30.0)
    publish(c, "A", pub, 2, {"id": 2, "region": "US", "qty": 2})
    c.settle()
    assert len(records(c, "B")) == 2
    c.advance(31.0)  # record 1 is 61 s old: gone on both
    assert [r["id"] for r in records(c, "A").values()] == [2]
    assert records(c, "B") == records(c, "A")
    assert view(c, "B") == view(c, "A") == {"US": 2}


def test_a_view_over_a_replicated_queue_counts_what_the_queue_shows_on_each_instance():
    """views rule 2: on a non-owner, a message another instance owns (ELSEWHERE) counts
    like an available one, as the queue's sow lists it, until it leaves the queue on
    its owner; its lease there is not replicated, so only the owner's view drops it
    while it is leased."""
    pending = ("<Queue><Name>pending</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic>"
               "</Queue>"
               "<View><Name>open_qty</Name><UnderlyingTopic>pending</UnderlyingTopic><MessageType>json</MessageType>"
               "<Projection><Field>/region</Field><Field>SUM(/qty) AS /qty</Field></Projection>"
               "<Grouping><Field>/region</Field></Grouping></View>")
    c = two_way(pending, replicated=("orders", "pending"), recorded=("orders",))

    def open_qty(node: str) -> dict:
        return {r["region"]: r["qty"] for r in records(c, node, "open_qty").values()}

    assert open_qty("A") == open_qty("B") == {"EU": 12}
    assert c.nodes["B"].engine.statistics(c.now).queues["pending"].elsewhere == 2
    worker = c.nodes["A"].connect("worker")
    c.nodes["A"].subscribe(worker, "pending", options="max_backlog=1")
    (msg,) = c.nodes["A"].messages(worker, "pending")
    c.settle()
    leased_qty = json.loads(msg.data)["qty"]
    assert open_qty("A") == {"EU": 12 - leased_qty}
    assert open_qty("B") == {"EU": 12}  # the lease on A is not replicated
    c.nodes["A"].ack(worker, "pending", msg)
    c.nodes["A"].unsubscribe(worker)
    c.settle()
    assert open_qty("A") == open_qty("B") == {"EU": 12 - leased_qty}


FEEDING_VIEW = ("<View><Name>totals</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
                "<Projection><Field>/region</Field><Field>SUM(/qty) AS /qty</Field></Projection>"
                "<Grouping><Field>/region</Field></Grouping></View>")


def test_a_views_records_are_never_replicated():
    """Rule 8: every instance computes its own views; the records a view journals for
    the queue it feeds stay on their instance."""
    local_q = ("<LocalQueue><Name>totals_q</Name><MessageType>json</MessageType>"
               "<UnderlyingTopic>totals</UnderlyingTopic></LocalQueue>")
    # the destinations' Topic matches the view's name too: its records still stay here
    c = two_way(ORDERS + FEEDING_VIEW + local_q, replicated=("orders", "totals"), recorded=("orders", "totals"))
    for node in ("A", "B"):
        totals = [r for r in c.publishes(node) if r.topic == "totals"]
        assert totals and {r.origin for r in totals} == {""}, node  # its own, none replicated
        assert json.loads(totals[-1].data) == {"region": "EU", "qty": 12}
        assert c.nodes[node].engine.statistics(c.now).queues["totals_q"].queue_depth == len(totals)


def test_a_replicated_queue_over_a_view_is_refused_at_startup():
    """Rule 8: a replicated queue over a view would hold every instance's own copies."""
    q = "<Queue><Name>totals_q</Name><MessageType>json</MessageType><UnderlyingTopic>totals</UnderlyingTopic></Queue>"
    with pytest.raises(errors.ConfigError) as exc:
        Cluster({"A": instance_xml("A", [destination("B")], sow=ORDERS + FEEDING_VIEW + q,
                                              topics=("orders", "totals"))})
    assert "totals_q" in str(exc.value) and "view 'totals'" in str(exc.value)
    assert exc.value.path
