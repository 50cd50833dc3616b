"""Issue 32, defect 3: a topic that is not a valid regular expression is refused with one
line naming the pattern and the position, for every command that takes a topic pattern;
the connection goes on (config/model.py, topic_matcher)."""

from __future__ import annotations

import pytest

from conveyor.protocol import messages as m

from .engine_harness import Harness, config_xml, queue_xml

SOW = "<Topic><Name>Orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
BAD = "orders.(eu"


def harness() -> Harness:
    return Harness(config_xml(queue_xml("Jobs") + SOW, topics=("Work", "Orders")))


@pytest.mark.parametrize("command", [
    m.Subscribe(topic=BAD, sub_id="s", cid="c"),
    m.Subscribe(topic=BAD, sub_id="s", cid="c", bookmark="0"),
    m.Subscribe(topic=BAD, sub_id="s", cid="c", filter="/a = 1"),
    m.SowAndSubscribe(topic=BAD, sub_id="s", cid="c"),
    m.DeltaSubscribe(topic=BAD, sub_id="s", cid="c"),
    m.SowAndDeltaSubscribe(topic=BAD, sub_id="s", cid="c"),
], ids=lambda c: type(c).__name__ + ("+bookmark" if getattr(c, "bookmark", None) else "")
                 + ("+filter" if getattr(c, "filter", None) else ""))
def test_a_topic_that_is_no_regex_is_refused_naming_it_and_the_position(command):
    h = harness()
    conn = h.connect("c")
    h.handle(conn, command)
    [ack] = h.failures(conn)
    assert ack.code == "bad_topic" and ack.cid == "c"
    assert ack.reason == ("topic 'orders.(eu' is not a valid regular expression: missing ), unterminated "
                          "subpattern at position 7")
    assert ack.details == {"topic": BAD, "position": 7}
    h.handle(conn, m.Flush(cid="after", ack_type="processed"))  # the connection goes on
    assert [a.cid for a in h.acks(conn)] == ["after"]


def test_a_sow_takes_a_name_not_a_pattern_and_says_so():
    h = harness()
    conn = h.connect("c")
    h.handle(conn, m.Sow(topic=BAD, cid="c", query_id="q"))
    [ack] = h.failures(conn)
    assert ack.code == "unknown_topic" and repr(BAD) in ack.reason


def test_replacing_a_subscription_with_a_bad_pattern_keeps_the_old_one():
    h = harness()
    conn, pub = h.connect("c"), h.connect("p")
    h.subscribe(conn, "Work", sub_id="s")
    h.handle(conn, m.Subscribe(topic="W(", sub_id="s", options="replace", cid="r"))
    [ack] = h.failures(conn)
    assert ack.code == "bad_topic" and "'W('" in ack.reason and "position 1" in ack.reason
    h.publish(pub, "Work", {"n": 1})
    h.commit()
    assert [x.topic for x in h.messages(conn)] == ["Work"]


@pytest.mark.parametrize("pattern, why", [
    ("(" * 3000, "nested too deeply"),
    ("a{99999999999}", "too large"),
    ("[z-a]", "bad character range z-a at position 1"),
])
def test_every_way_a_pattern_fails_is_a_refusal(pattern, why):
    h = Harness(config_xml("", topics=("t",)))
    conn = h.connect("c")
    h.handle(conn, m.Subscribe(topic=pattern[:1000], sub_id="s", cid="c"))
    [ack] = h.failures(conn)
    assert ack.code == "bad_topic" and why in ack.reason and "\n" not in ack.reason
    assert len(ack.reason) < 200  # the pattern is quoted cut short


def test_a_valid_regex_topic_still_subscribes():
    h = harness()
    conn, pub = h.connect("c"), h.connect("p")
    h.subscribe(conn, "^W(or)k$", sub_id="s", ack_type="processed")
    assert [a.status for a in h.acks(conn)] == ["success"]
    h.publish(pub, "Work", {"n": 1})
    h.commit()
    assert len(h.messages(conn)) == 1
