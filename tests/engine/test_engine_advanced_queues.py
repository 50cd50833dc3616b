"""Priority, barrier messages and TargetQueueDepth through the engine and its journal
(spec 000, "Advanced Queue Configuration"), including crash recovery."""

import msgspec

from tests.engine.engine_harness import Harness


def config(queue_elements: str) -> str:
    return f"""<AMPSConfig>
<TransactionLog><JournalDirectory>/unused</JournalDirectory>
<Topic><Name>Orders</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW><Queue><Name>Q</Name><MessageType>json</MessageType><UnderlyingTopic>Orders</UnderlyingTopic>
<Semantics>at-least-once</Semantics><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog>{queue_elements}</Queue></SOW></AMPSConfig>"""


def items(messages, key="i"):
    return [msgspec.json.decode(x.data)[key] for x in messages]


def publish(h, pub, values):
    for v in values:
        h.publish(pub, "Orders", v)
    h.commit()


def test_order_priority_example_delivers_highest_price_times_qty_first():
    """Priority Queues: the OrderPriority example, "a descending sort of the value
    calculated for the Priority"; NULL lowest; equal priorities oldest first."""
    h = Harness(config("<Priority>/price * /qty</Priority>"))
    pub = h.connect("pub")
    publish(h, pub, [
        {"i": "small", "price": 1, "qty": 10},
        {"i": "null"},
        {"i": "big", "price": 100, "qty": 10},
        {"i": "small-2", "price": 2, "qty": 5},
        {"i": "mid", "price": 10, "qty": 10},
    ])
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == ["big", "mid", "small", "small-2", "null"]
    assert items(h.sow(pub, "Q")) == []  # all leased


def test_priority_order_survives_a_crash():
    h = Harness(config("<Priority>/p</Priority>"))
    pub = h.connect("pub")
    publish(h, pub, [{"i": n, "p": n % 3} for n in range(6)])
    h.crash()
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [2, 5, 1, 4, 0, 3]


def test_barrier_waits_for_earlier_acks_then_goes_to_every_subscriber_ignoring_backlog():
    """Synchronizing Work with Barrier Messages."""
    h = Harness(config("<BarrierExpression>/kind = 'eod'</BarrierExpression>"))
    pub = h.connect("pub")
    w1, w2 = h.connect("w1"), h.connect("w2")
    h.subscribe(w1, "Q", options="max_backlog=1")
    h.subscribe(w2, "Q", options="max_backlog=1")
    publish(h, pub, [{"i": 1}, {"i": 2}, {"i": "eod", "kind": "eod"}, {"i": 3}])
    got1, got2 = h.messages(w1), h.messages(w2)
    assert sorted(items(got1 + got2)) == [1, 2]
    h.ack(w1, "Q", got1)
    h.commit()
    assert h.messages(w1) == [] and h.messages(w2) == []  # 2 is still unacknowledged
    h.ack(w2, "Q", got2)
    h.commit()
    b1, b2 = h.messages(w1), h.messages(w2)
    assert [x.barrier for x in b1[:1] + b2[:1]] == [True, True]
    assert items(b1[:1]) == items(b2[:1]) == ["eod"]
    after = b1[1:] + b2[1:]
    assert items(after) == [3]  # released only after the barrier
    h.crash()
    w = h.connect("w3")
    h.subscribe(w, "Q", options="max_backlog=5")
    assert items(h.messages(w)) == [3]  # the barrier is not sent again


def test_target_queue_depth_only_first_n_active_and_refills_from_the_journal():
    """Limiting Currently Deliverable Messages: only the first N are deliverable and
    visible to sow; acknowledged ones are replaced from the transaction log."""
    h = Harness(config("<TargetQueueDepth>3</TargetQueueDepth>"))
    pub = h.connect("pub")
    publish(h, pub, [{"i": n} for n in range(8)])
    assert items(h.sow(pub, "Q")) == [0, 1, 2]
    assert h.stats("Q").inactive_message_count == 5
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    got = h.messages(w)
    assert items(got) == [0, 1, 2]
    h.ack(w, "Q", got[:2])
    h.commit()
    assert items(h.messages(w)) == [3, 4]
    h.crash()
    w = h.connect("w2")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [2, 3, 4]


def test_target_queue_depth_remembers_acks_of_inactive_messages():
    """"AMPS keeps a list of acknowledgments that have been received for messages that
    are not in the queue. When a message that would be added to the active part of the
    queue has already been acknowledged, AMPS does not add that message"."""
    h = Harness(config("<TargetQueueDepth>2</TargetQueueDepth>"))
    pub = h.connect("pub")
    publish(h, pub, [{"i": n} for n in range(5)])
    everything = []
    r = h.connect("reader")
    h.subscribe(r, "Orders", sub_id="b", bookmark="0")
    everything = h.messages(r)
    assert items(everything) == [0, 1, 2, 3, 4]
    h.ack(pub, "Q", [everything[3].bookmark])  # inactive: deferred
    h.commit()
    assert h.stats("Q").deferred_ack_count == 1
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    got = h.messages(w)
    h.ack(w, "Q", got)
    h.commit()
    got += h.messages(w)
    h.ack(w, "Q", got[2:])
    h.commit()
    got += h.messages(w)
    assert items(got) == [0, 1, 2, 4]
