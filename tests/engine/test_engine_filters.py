"""Filters through the engine on every command that takes one (issue 3): subscribe,
sow, sow_and_subscribe, sow_delete; a bad filter fails that command only."""

import msgspec

from conveyor.protocol import messages as m
from tests.engine.engine_harness import Harness

CONFIG = """<AMPSConfig>
<TransactionLog><JournalDirectory>/unused</JournalDirectory><Topic><Name>orders</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW><Queue><Name>Q</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic><MaxPerSubscriptionBacklog>5</MaxPerSubscriptionBacklog></Queue></SOW>
</AMPSConfig>"""


def n_of(messages):
    return [msgspec.json.decode(x.data)["n"] for x in messages]


def test_sow_and_subscribe_applies_the_filter_to_both_parts():
    h = Harness(CONFIG)
    pub = h.connect("pub")
    for n in range(4):
        h.publish(pub, "orders", {"n": n, "eu": n % 2 == 0})
    h.commit()
    c = h.connect("c")
    h.handle(c, m.SowAndSubscribe(topic="Q", sub_id="s", query_id="q", filter="/eu = true", options="max_backlog=5"))
    out = h.take(c)
    begin = next(i for i, x in enumerate(out) if isinstance(x, m.GroupBegin))
    end = next(i for i, x in enumerate(out) if isinstance(x, m.GroupEnd))
    assert n_of(out[begin + 1 : end]) == [0, 2]  # the query: available EU messages
    assert n_of([x for x in out[end + 1 :] if isinstance(x, m.Message)]) == [0, 2]  # then the leases


def test_bad_filter_fails_only_its_command():
    h = Harness(CONFIG)
    c = h.connect("c")
    for cmd in (
        m.Subscribe(topic="orders", sub_id="a", filter="/x = = 1", cid="1"),
        m.Sow(topic="Q", filter="(", cid="2"),
        m.SowAndSubscribe(topic="Q", sub_id="b", filter="/x LIKE", cid="3"),
        m.SowDelete(topic="Q", filter="NOT", cid="4"),
    ):
        h.handle(c, cmd)
        (ack,) = [x for x in h.take(c) if isinstance(x, m.Ack)]
        assert ack.status == "failure" and ack.code == "bad_filter" and ack.cid == cmd.cid
        assert "position" in ack.details
    h.handle(c, m.Subscribe(topic="orders", sub_id="ok", filter="/x = 1", ack_type="processed", cid="5"))
    (ack,) = h.acks(c)
    assert ack.status == "success"
