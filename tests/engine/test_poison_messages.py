"""Issue 32, defect 1: one message must never stop delivery (engine/poison.py,
protocol/payload.py).

A JSON body nested a few thousand levels deep raised ``RecursionError`` in the decoder,
which nothing caught: the publisher's connection was dropped, or a fan-out deferred to a
later turn stayed at the head of the delivery queue and stopped every topic. Here each
stage of the delivery path (parse, filter, projection, join, delta, encode) is made to
fail on one message (the real failure where there is one, an injected exception
elsewhere), and every other message, subscription, queue and topic must go on.
"""

from __future__ import annotations

import json
import logging

import pytest

from conveyor.engine import poison
from conveyor.expr import compile as compile_expr
from conveyor.expr.projection import Projection
from conveyor.protocol import messages as m
from conveyor.protocol.payload import JSON_DEPTH_MAX

from .engine_harness import Harness, config_xml, queue_xml, recorded

DEEP = b"[" * 5000 + b"]" * 5000  # the poison: RecursionError in msgspec
SLOW = "/a LIKE '(a|b)*c'"  # a whole regex budget: 16 of them defer a fan-out (topics.py rule 1)


@pytest.fixture(autouse=True)
def _fresh_counts():
    poison.reset()
    yield
    poison.reset()


def numbers(h: Harness, conn: int, sub_id: str | None = None) -> list:
    """The ``n`` of each message ``conn`` received (on ``sub_id``), in order."""
    return [json.loads(x.data).get("n") for x in h.messages(conn) if sub_id is None or x.sub_id == sub_id]


def poisoned(flt_text: str, monkeypatch, method: str = "matches") -> None:
    """Make ``method`` of the compiled expression ``flt_text`` raise on a message whose
    body has ``poison`` (compile is cached: the subscriptions share this very Expression)."""
    expr = compile_expr(flt_text)
    real = getattr(expr, method)

    def failing(data, meta=None):
        if isinstance(data, dict) and data.get("poison"):
            raise RuntimeError(f"injected: the expression's {method} failed")
        return real(data, meta)

    monkeypatch.setattr(expr, method, failing)


# --- refused at publish ----------------------------------------------------------------------


@pytest.mark.parametrize("data, limit", [
    (DEEP, "JSON_DEPTH_MAX"),
    (b"[" * (JSON_DEPTH_MAX + 1) + b"]" * (JSON_DEPTH_MAX + 1), "JSON_DEPTH_MAX"),
    (b'{"a": "\xff"}', None),
    (b"[" + b"1" * 5000 + b"]", "JSON_INTEGER_DIGITS_MAX"),
])
def test_a_json_topic_refuses_what_it_cannot_parse_naming_the_limit(data, limit):
    h = Harness(config_xml("", topics=("t",)))
    pub = h.connect("pub")
    h.publish(pub, "t", data, seq=1, ack_type="processed")
    [ack] = h.acks(pub)
    assert (ack.status, ack.code, ack.seq) == ("failure", "bad_message", 1)
    if limit is None:
        assert "UTF-8" in ack.reason
    else:
        assert limit in ack.reason and ack.details["limit"] == limit
    h.publish(pub, "t", {"n": 1}, seq=2, ack_type="processed")  # the connection goes on
    assert [a.status for a in h.acks(pub)] == ["success"]


def test_as_deep_as_the_limit_is_accepted_and_huge_numbers_are_read():
    h = Harness(config_xml("", topics=("t",)))
    pub, sub = h.connect("pub"), h.connect("sub")
    h.subscribe(sub, "t", filter="/big > 1")
    deepest = b"[" * (JSON_DEPTH_MAX - 1) + b'{"big": 1e400}' + b"]" * (JSON_DEPTH_MAX - 1)
    h.publish(pub, "t", deepest, seq=1, ack_type="processed")
    h.publish(pub, "t", b'{"big": 1e400, "n": 2}', seq=2, ack_type="processed")  # read as infinity
    h.commit()
    assert [a.status for a in h.acks(pub)] == ["success", "success"]
    assert numbers(h, sub) == [2]
    assert not poison.SKIPPED


def test_a_sow_topic_and_a_sow_delete_refuse_a_deep_body():
    sow = "<Topic><Name>Orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    h = Harness(config_xml(sow, topics=("Orders",)))
    pub = h.connect("pub")
    h.publish(pub, "Orders", DEEP, seq=1, ack_type="processed")
    h.handle(pub, m.SowDelete(topic="Orders", data=DEEP, cid="d", ack_type="processed"))
    acks = h.acks(pub)
    assert [(a.code, a.details["limit"]) for a in acks] == [("bad_message", "JSON_DEPTH_MAX")] * 2


# --- the two paths: a fan-out now and one deferred to later turns ----------------------


def test_a_deep_body_on_a_topic_that_is_not_json_is_null_to_filters_and_stops_nothing(caplog):
    """Not recorded: the fan-out runs in the publisher's own command, which used to raise."""
    h = Harness(config_xml("", topics=("t",)))
    pub, sub, plain = h.connect("pub"), h.connect("sub"), h.connect("plain")
    h.subscribe(sub, "live", filter="/n > 0")
    h.subscribe(plain, "live")
    with caplog.at_level(logging.WARNING, "conveyor.engine"):
        h.publish(pub, "live", DEEP, ack_type="processed")
        h.publish(pub, "live", {"n": 1}, ack_type="processed")
    assert [a.status for a in h.acks(pub)] == ["success", "success"]
    assert numbers(h, sub) == [1]  # the deep one is NULL to the filter
    assert [x.data for x in h.messages(plain)] == [DEEP, b'{"n":1}']  # unfiltered: the bytes, as published
    assert poison.SKIPPED["parse"] == 1
    assert sum("JSON_DEPTH_MAX" in r.getMessage() for r in caplog.records) == 1


def test_a_failing_filter_in_a_deferred_fan_out_does_not_hold_the_topics_behind_it(monkeypatch, caplog):
    """16 subscribers with slow filters: the fan-out of the first message is cut short by
    the turn's budget and continued in later turns. The poison message at its head used
    to raise in every turn, for ever, and every later topic message waited behind it."""
    poisoned(SLOW, monkeypatch)
    h = Harness(config_xml("", topics=("t", "other")))
    h.replay_budget = 0  # one turn per call, like the server
    subs = [h.connect(f"s{i}") for i in range(16)]
    for conn in subs:
        h.subscribe(conn, "t", filter=SLOW)
    watcher = h.connect("watcher")
    h.subscribe(watcher, "other")
    pub = h.connect("pub")
    h.publish(pub, "t", {"poison": True, "a": "abc", "n": 0})
    for n in range(1, 4):
        h.publish(pub, "t", {"a": "abc", "n": n})
    h.publish(pub, "other", {"n": 99})
    with caplog.at_level(logging.WARNING, "conveyor.engine"):
        h.journal_commit()
        h.engine.on_durable(h.now)
        h._collect()
        assert h.engine.fanout_pending  # deferred
        turns = 0
        while h.engine.fanout_pending:
            h._collect()
            turns += 1
            assert turns < 1000, "the fan-out never finishes"
    for conn in subs:
        assert numbers(h, conn) == [1, 2, 3]
    assert numbers(h, watcher) == [99]
    assert poison.SKIPPED["filter"] == 16
    assert sum("injected" in r.getMessage() for r in caplog.records) == 1  # one warning per message


def test_a_message_an_older_version_journaled_is_skipped_by_filters_live_replayed_and_queued(caplog):
    """Already in the log: nothing refused it at publish. A filter, a queue Filter and a
    replay skip it (one warning, a count); everything after it is delivered."""
    h = Harness(config_xml(queue_xml("Jobs", underlying="t", Filter="/n >= 0"), topics=("t", "other")))
    live, plain = h.connect("live"), h.connect("plain")
    h.subscribe(live, "t", filter="/n >= 0")
    h.subscribe(plain, "t")
    worker = h.connect("worker")
    h.subscribe(worker, "Jobs", options="max_backlog=10")
    publishes = h.engine.publishes
    with caplog.at_level(logging.WARNING, "conveyor.engine"):
        publishes.append("t", 77, 1, h.now, DEEP, None)  # as an older version wrote it
        publishes.append("t", 77, 2, h.now, b'{"n": 1}', None)
        h.commit()
        assert numbers(h, live) == [1]
        assert [x.data for x in h.messages(plain)] == [DEEP, b'{"n": 1}']
        assert numbers(h, worker) == [1]  # the queue's Filter kept the deep one out
        replay = h.connect("replay")
        h.subscribe(replay, "t", filter="/n >= 0", bookmark="0")
        assert numbers(h, replay) == [1]
        h.crash()  # recovery offers it to the queue again: the same answer
        worker = h.connect("worker")
        h.subscribe(worker, "Jobs", options="max_backlog=10")
        assert numbers(h, worker) == [1]
    assert poison.SKIPPED["parse"] >= 3
    assert sum("JSON_DEPTH_MAX" in r.getMessage() for r in caplog.records) == 1


# --- a failure injected at each stage ------------------------------------------------------------


def test_a_failing_queue_consumer_filter_skips_the_message_for_that_consumer_only(monkeypatch):
    flt = "/n >= 0"
    poisoned(flt, monkeypatch)
    h = Harness(config_xml(queue_xml("Jobs"), topics=("Work",)))
    picky, anyone = h.connect("picky"), h.connect("anyone")
    h.subscribe(picky, "Jobs", filter=flt, options="max_backlog=10")
    pub = h.connect("pub")
    h.publish(pub, "Work", {"poison": True, "n": 0})
    h.publish(pub, "Work", {"n": 1})
    h.commit()
    assert numbers(h, picky) == [1]  # the queue went on past the one it could not judge
    h.subscribe(anyone, "Jobs", options="max_backlog=10")
    assert numbers(h, anyone) == [0]  # still in the queue, for a consumer without the filter
    assert poison.SKIPPED["filter"] >= 1


@pytest.mark.parametrize("element", ["Filter", "Priority", "BarrierExpression"])
def test_a_failing_queue_expression_keeps_the_queue_going(monkeypatch, element):
    text = {"Filter": "/n >= 0", "Priority": "/n", "BarrierExpression": "/n = 99"}[element]
    poisoned(text, monkeypatch)
    if element == "Priority":
        poisoned(text, monkeypatch, "evaluate")
    h = Harness(config_xml(queue_xml("Jobs", **{element: text}), topics=("Work",)))
    worker = h.connect("worker")
    h.subscribe(worker, "Jobs", options="max_backlog=10")
    pub = h.connect("pub")
    for n, poisoned_ in [(0, True), (1, False), (2, False)]:
        h.publish(pub, "Work", {"poison": poisoned_, "n": n})
    h.commit()
    got = sorted(numbers(h, worker))
    assert got == ([1, 2] if element == "Filter" else [0, 1, 2])
    assert poison.SKIPPED["filter"] >= 1


VIEWS = ("<Topic><Name>Orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
         "<View><Name>ByRegion</Name><UnderlyingTopic>Orders</UnderlyingTopic><MessageType>json</MessageType>"
         "<Projection><Field>/r</Field><Field>SUM(/q) AS /t</Field></Projection>"
         "<Grouping><Field>/r</Field></Grouping></View>")


def _orders(h: Harness, pub: int) -> None:
    h.publish(pub, "Orders", {"id": 1, "r": "EU", "q": 1, "poison": True})
    h.publish(pub, "Orders", {"id": 2, "r": "EU", "q": 2})
    h.publish(pub, "Orders", {"id": 3, "r": "US", "q": 5})
    h.commit()


def test_a_failing_projection_leaves_one_message_out_of_a_view(monkeypatch):
    real = Projection.member

    def member(self, data, meta=None):
        if isinstance(data, dict) and data.get("poison"):
            raise RuntimeError("injected: the projection failed")
        return real(self, data, meta)

    monkeypatch.setattr(Projection, "member", member)
    h = Harness(config_xml(VIEWS, topics=("Orders",)))
    sub, pub = h.connect("sub"), h.connect("pub")
    h.handle(sub, m.Subscribe(topic="ByRegion", sub_id="v"))
    _orders(h, pub)
    last = {}
    for x in h.messages(sub):
        rec = json.loads(x.data)
        last[rec["r"]] = rec["t"]
    assert last == {"EU": 2, "US": 5}  # the poison order is not counted; the others are
    assert poison.SKIPPED["projection"] == 1


def test_a_failing_view_encoding_skips_one_record_and_later_ones_go_out(monkeypatch):
    from conveyor.engine.sow import view

    real = view._encode

    def encode(record):
        if record.get("t") == 1:
            raise OverflowError("injected: the record cannot be encoded")
        return real(record)

    monkeypatch.setattr(view, "_encode", encode)
    h = Harness(config_xml(VIEWS, topics=("Orders",)))
    sub, pub = h.connect("sub"), h.connect("pub")
    h.handle(sub, m.Subscribe(topic="ByRegion", sub_id="v"))
    for i, q in enumerate([1, 2, 5]):  # EU's record is 1 (not encoded), then 3; US's 5
        h.publish(pub, "Orders", {"id": i, "r": "EU" if i < 2 else "US", "q": q})
        h.commit()
    assert [json.loads(x.data)["t"] for x in h.messages(sub)] == [3, 5]
    assert poison.SKIPPED["encode"] == 1


def test_a_failing_delta_skips_one_change_for_that_subscription(monkeypatch):
    from conveyor.engine.sow import delta

    real = delta.changes

    def changes(old, new):
        if isinstance(new, dict) and new.get("poison"):
            raise RuntimeError("injected: the delta failed")
        return real(old, new)

    monkeypatch.setattr(delta, "changes", changes)
    h = Harness(config_xml(VIEWS, topics=("Orders",)))
    sub, whole, pub = h.connect("sub"), h.connect("whole"), h.connect("pub")
    h.handle(sub, m.DeltaSubscribe(topic="Orders", sub_id="d"))
    h.handle(whole, m.Subscribe(topic="Orders", sub_id="w"))
    for q, bad in [(1, False), (2, True), (3, False)]:
        h.publish(pub, "Orders", {"id": 1, "q": q, "poison": bad})
        h.commit()
    assert [json.loads(x.data).get("q") for x in h.messages(sub)] == [1, 3]
    assert [json.loads(x.data)["q"] for x in h.messages(whole)] == [1, 2, 3]
    assert poison.SKIPPED["delta"] == 1


def test_a_failing_sow_subscription_filter_skips_one_record(monkeypatch):
    flt = "/q > 0"
    poisoned(flt, monkeypatch)
    h = Harness(config_xml(VIEWS, topics=("Orders",)))
    sub, pub = h.connect("sub"), h.connect("pub")
    h.handle(sub, m.Subscribe(topic="Orders", sub_id="s", filter=flt))
    _orders(h, pub)
    assert [json.loads(x.data)["id"] for x in h.messages(sub)] == [2, 3]
    assert poison.SKIPPED["filter"] == 1


JOIN = ("<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
        "<Topic><Name>customers</Name><MessageType>json</MessageType><Key>/cust</Key></Topic>"
        "<View><Name>names</Name><MessageType>json</MessageType>"
        "<UnderlyingTopic><Join>[orders].[/cust]=[customers].[/cust]</Join></UnderlyingTopic>"
        "<Projection><Field>[orders].[/cust] AS /cust</Field><Field>[customers].[/name] AS /name</Field>"
        "<Field>SUM([orders].[/qty]) AS /qty</Field></Projection>"
        "<Grouping><Field>[orders].[/cust]</Field></Grouping></View>")


def test_a_failing_join_value_joins_that_record_with_nothing(monkeypatch):
    from conveyor.engine.sow import joins

    real = joins.scalar

    def scalar(value):
        if value == 666:
            raise RuntimeError("injected: the join value failed")
        return real(value)

    monkeypatch.setattr(joins, "scalar", scalar)
    h = Harness("<AMPSConfig><Name>j</Name><TransactionLog><JournalDirectory>./j</JournalDirectory>"
                + recorded("orders", "customers") + f"</TransactionLog><SOW>{JOIN}</SOW></AMPSConfig>")
    sub, pub = h.connect("sub"), h.connect("pub")
    h.handle(sub, m.Subscribe(topic="names", sub_id="v"))
    h.publish(pub, "customers", {"cust": 1, "name": "Ann"})
    h.publish(pub, "orders", {"id": 1, "cust": 666, "qty": 3})  # its join value cannot be computed
    h.publish(pub, "orders", {"id": 2, "cust": 1, "qty": 4})
    h.commit()
    records = {}
    for x in h.messages(sub):
        rec = json.loads(x.data)
        records[rec.get("cust")] = rec
    assert records[1] == {"cust": 1, "name": "Ann", "qty": 4}
    assert records[666] == {"cust": 666, "qty": 3}  # joined with nothing, still counted
    assert poison.SKIPPED["join"] >= 1
