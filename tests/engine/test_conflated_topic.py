"""Conflated topics (engine/sow/conflated.py; docs/sow-and-views.md, "Conflated topics";
reference G.1.6): at most one update per key per interval, the latest one, at the end of
the interval; the Filter; queries answer the state of the last flush; over a view and
over another conflated topic; read-only; rebuilt from the underlying topic at restart.

Time is the harness's: ``commit()`` makes a publish durable (the record changes, the
key's change is pending), ``advance()`` moves the clock and runs the engine's timer.
"""

from __future__ import annotations

import json

from conveyor.protocol import messages as m

from .engine_harness import Harness, body, recorded

SOW = (
    "<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    "<View><Name>totals</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
    "<Projection><Field>/region</Field><Field>SUM(/qty) AS /qty</Field></Projection>"
    "<Grouping><Field>/region</Field></Grouping></View>"
    "<ConflatedTopic><Name>orders_1s</Name><UnderlyingTopic>orders</UnderlyingTopic>"
    "<MessageType>json</MessageType><Interval>1s</Interval></ConflatedTopic>"
    "<ConflatedTopic><Name>open_orders</Name><UnderlyingTopic>orders</UnderlyingTopic>"
    "<MessageType>json</MessageType><Interval>1s</Interval><Filter>/status = 'open'</Filter></ConflatedTopic>"
    "<ReplicaDefinition><Name>totals_2s</Name><UnderlyingTopic>totals</UnderlyingTopic>"
    "<MessageType>json</MessageType><Interval>2s</Interval></ReplicaDefinition>"
    "<ConflatedTopic><Name>orders_3s</Name><UnderlyingTopic>orders_1s</UnderlyingTopic>"
    "<MessageType>json</MessageType><Interval>3s</Interval></ConflatedTopic>"
)
CONFIG = ("<AMPSConfig><Name>c</Name><TransactionLog><JournalDirectory>./j</JournalDirectory>"
          + recorded("orders") + f"</TransactionLog><SOW>{SOW}</SOW></AMPSConfig>")


def setup() -> tuple[Harness, int, int]:
    h = Harness(CONFIG)
    return h, h.connect("pub"), h.connect("sub")


def publish(h: Harness, pub: int, **fields) -> None:
    """One durable publish to orders (its change is pending on the conflated topics)."""
    h.publish(pub, "orders", fields)
    h.commit()


def records(out: list) -> list[dict]:
    return [json.loads(x.data) for x in out if isinstance(x, m.Message)]


def test_updates_of_one_key_within_an_interval_give_one_message_with_the_latest_value():
    h, pub, sub = setup()
    h.subscribe(sub, "orders_1s")
    h.take(sub)
    start = h.now
    for v in range(5):
        publish(h, pub, id=1, v=v)
        h.advance(0.1)
    assert h.take(sub) == []  # all within the interval the first one opened
    assert h.engine.next_deadline() == start + 1.0
    h.advance(start + 1.0 - h.now)
    (msg,) = h.take(sub)
    assert (msg.topic, json.loads(msg.data), msg.bookmark) == ("orders_1s", {"id": 1, "v": 4}, None)
    (record,) = h.sow(sub, "orders")
    assert msg.sow_key == record.sow_key  # the underlying's SowKey
    h.advance(3.0)  # totals_2s and orders_3s (over orders_1s) flush theirs
    assert h.engine.next_deadline() is None  # nothing pending: no timer
    assert h.take(sub) == []


def test_a_steady_stream_gives_at_most_one_update_per_key_per_interval():
    h, pub, sub = setup()
    h.subscribe(sub, "orders_1s")
    h.take(sub)
    sent: list[tuple[float, dict]] = []
    for v in range(50):  # 5 s of updates every 100 ms, on two keys
        publish(h, pub, id=v % 2, v=v)
        h.advance(0.1)
        sent += [(h.now, r) for r in records(h.take(sub))]
    h.advance(1.0)
    sent += [(h.now, r) for r in records(h.take(sub))]
    for key in (0, 1):
        times = [t for t, r in sent if r["id"] == key]
        assert 4 <= len(times) <= 6
        assert all(b - a >= 1.0 - 1e-6 for a, b in zip(times, times[1:]))
    assert [r for _, r in sent][-2:] == [{"id": 0, "v": 48}, {"id": 1, "v": 49}]


def test_each_key_gets_its_latest_value_in_the_order_of_last_changes():
    h, pub, sub = setup()
    h.subscribe(sub, "orders_1s")
    h.take(sub)
    for key, v in ((1, 0), (2, 0), (3, 0), (1, 1), (2, 1)):
        publish(h, pub, id=key, v=v)
    h.advance(1.0)
    assert records(h.take(sub)) == [{"id": 3, "v": 0}, {"id": 1, "v": 1}, {"id": 2, "v": 1}]
    publish(h, pub, id=2, v=2)
    h.advance(0.5)
    assert h.take(sub) == []
    h.advance(0.5)
    assert records(h.take(sub)) == [{"id": 2, "v": 2}]


def test_a_delete_is_sent_as_a_delete_at_the_end_of_the_interval():
    h, pub, sub = setup()
    publish(h, pub, id=1, v=0)
    publish(h, pub, id=2, v=0)
    h.advance(1.0)
    h.handle(sub, m.SowAndSubscribe(topic="orders_1s", sub_id="s", options="oof"))
    assert sorted(r["id"] for r in records(h.take(sub))) == [1, 2]
    publish(h, pub, id=1, v=1)
    h.handle(pub, m.SowDelete(topic="orders", sow_keys=h.sow(pub, "orders", filter="/id = 1")[0].sow_key))
    h.commit()
    publish(h, pub, id=3, v=0)  # a key that comes and goes within the interval: nothing at all
    h.handle(pub, m.SowDelete(topic="orders", filter="/id = 3"))
    h.commit()
    assert h.take(sub) == []
    h.advance(1.0)
    (oof,) = h.take(sub)
    assert isinstance(oof, m.OutOfFocus)
    assert (oof.topic, oof.reason, json.loads(oof.data)) == ("orders_1s", "deleted", {"id": 1, "v": 0})
    assert records(h.sow(sub, "orders_1s")) == [{"id": 2, "v": 0}]


def test_the_filter_admits_matching_records_and_one_that_stops_matching_leaves():
    h, pub, sub = setup()
    h.handle(sub, m.SowAndSubscribe(topic="open_orders", sub_id="s", options="oof"))
    h.take(sub)
    publish(h, pub, id=1, status="open")
    publish(h, pub, id=2, status="closed")  # never in it
    h.advance(1.0)
    assert records(h.take(sub)) == [{"id": 1, "status": "open"}]
    publish(h, pub, id=1, status="closed")
    publish(h, pub, id=2, status="open")
    h.advance(1.0)
    oof, msg = h.take(sub)
    assert isinstance(oof, m.OutOfFocus) and oof.reason == "deleted"
    assert json.loads(oof.data) == {"id": 1, "status": "open"}  # the last state it had
    assert json.loads(msg.data) == {"id": 2, "status": "open"}
    assert records(h.sow(sub, "open_orders")) == [{"id": 2, "status": "open"}]
    publish(h, pub, id=2, status="shut")  # out and back within one interval: no oof, the latest state
    publish(h, pub, id=2, status="open", n=1)
    h.advance(1.0)
    assert records(h.take(sub)) == [{"id": 2, "status": "open", "n": 1}]


def test_sow_answers_the_records_of_the_last_flush():
    h, pub, sub = setup()
    publish(h, pub, id=1, v=0)
    assert h.sow(sub, "orders_1s") == []  # not flushed yet
    h.advance(1.0)
    assert records(h.sow(sub, "orders_1s")) == [{"id": 1, "v": 0}]
    publish(h, pub, id=1, v=1)
    h.advance(0.9)
    assert records(h.sow(sub, "orders_1s")) == [{"id": 1, "v": 0}]
    assert records(h.sow(sub, "orders")) == [{"id": 1, "v": 1}]
    h.advance(0.1)
    (rec,) = h.sow(sub, "orders_1s")
    assert json.loads(rec.data) == {"id": 1, "v": 1}
    h.handle(sub, m.Sow(topic="orders_1s", query_id="k", sow_keys=f"{rec.sow_key},nope"))
    assert records(h.take(sub)) == [{"id": 1, "v": 1}]


def test_a_delta_subscription_gets_the_changed_fields_of_each_flush():
    h, pub, sub = setup()
    publish(h, pub, id=1, a=1, b=1)
    h.advance(1.0)
    h.handle(sub, m.SowAndDeltaSubscribe(topic="orders_1s", sub_id="s"))
    assert records(h.take(sub)) == [{"id": 1, "a": 1, "b": 1}]
    publish(h, pub, id=1, a=2, b=1)
    publish(h, pub, id=1, a=3, b=1)
    h.advance(1.0)
    assert records(h.take(sub)) == [{"id": 1, "a": 3}]


def test_a_conflated_topic_over_a_view_and_over_a_conflated_topic():
    h, pub, sub = setup()
    h.subscribe(sub, "totals_2s", sub_id="t")
    h.subscribe(sub, "orders_3s", sub_id="o")
    h.take(sub)
    for i in range(10):  # the view changes at every step
        publish(h, pub, id=i, region="EU" if i % 2 else "US", qty=1)
        h.advance(0.25)
    out = h.take(sub)  # t = 2.5 s: one flush of totals_2s so far (at 2 s)
    assert {(x.sub_id, json.dumps(json.loads(x.data), sort_keys=True)) for x in out} == {
        ("t", '{"qty": 4, "region": "US"}'), ("t", '{"qty": 4, "region": "EU"}')}
    h.advance(3.0)
    out = h.take(sub)
    totals = [json.loads(x.data) for x in out if x.sub_id == "t"]
    assert sorted(totals, key=lambda r: r["region"]) == [{"region": "EU", "qty": 5}, {"region": "US", "qty": 5}]
    assert sorted(json.loads(x.data)["id"] for x in out if x.sub_id == "o") == list(range(10))
    assert sorted(r["qty"] for r in records(h.sow(sub, "totals_2s"))) == [5, 5]


def test_publish_and_sow_delete_are_refused():
    h, pub, _ = setup()
    h.handle(pub, m.Publish(topic="orders_1s", data=body({"id": 1}), ack_type="processed"),
             m.DeltaPublish(topic="totals_2s", data=body({"region": "EU"}), ack_type="processed"),
             m.SowDelete(topic="open_orders", filter="1=1", ack_type="processed"))
    failures = h.failures(pub)
    assert [f.code for f in failures] == ["read_only_topic"] * 3
    assert "'orders_1s' is a conflated topic" in failures[0].reason
    assert h.sow(pub, "orders") == []


def test_a_restart_rebuilds_the_records_from_the_underlying_topic():
    h, pub, sub = setup()
    publish(h, pub, id=1, status="open", region="EU", qty=1)
    publish(h, pub, id=2, status="open", region="US", qty=2)
    h.advance(2.0)
    publish(h, pub, id=1, status="closed", region="EU", qty=5)  # durable, still pending at the crash
    assert records(h.sow(sub, "open_orders")) == [{"id": 1, "status": "open", "region": "EU", "qty": 1},
                                                 {"id": 2, "status": "open", "region": "US", "qty": 2}]
    h.crash()
    assert h.engine.next_deadline() is None  # nothing pending after a restart
    sub = h.connect("sub")
    assert records(h.sow(sub, "orders_1s")) == records(h.sow(sub, "orders"))
    assert records(h.sow(sub, "orders_3s")) == records(h.sow(sub, "orders"))
    assert records(h.sow(sub, "open_orders")) == [{"id": 2, "status": "open", "region": "US", "qty": 2}]
    assert sorted(map(json.dumps, records(h.sow(sub, "totals_2s")))) == sorted(
        map(json.dumps, records(h.sow(sub, "totals"))))
    assert sorted(r["qty"] for r in records(h.sow(sub, "totals_2s"))) == [2, 5]
    h.subscribe(sub, "orders_1s")
    pub = h.connect("pub")
    publish(h, pub, id=2, status="open", v=1)
    h.advance(1.0)
    assert records(h.take(sub)) == [{"id": 2, "status": "open", "v": 1}]


def test_aggregated_queries_and_subscriptions_over_it_are_refused():
    h, _, sub = setup()
    h.handle(sub, m.Sow(topic="orders_1s", options="projection=[/region],grouping=[/region]", query_id="a"),
             m.SowAndSubscribe(topic="orders_1s", sub_id="g", options="projection=[/region],grouping=[/region]"))
    failures = h.failures(sub)
    assert [f.code for f in failures] == ["invalid_option"] * 2
    assert all("'orders_1s' is a conflated topic" in f.reason for f in failures)
