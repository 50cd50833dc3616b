"""The queue rules of spec 000 ("Message Queues"), one test each, through the Engine.

tests/engine/test_queue_spec.py checks the same chapter on a bare Queue. These tests go
one level up: commands in, messages out, publishes through the journal (read-committed:
a message reaches a queue only once durable), virtual time through ``tick``. Each
docstring names the section of spec 000 it checks (reference.md sections where the
chapter is silent). Crash and recovery are in test_engine_recovery.py.
"""

from __future__ import annotations

import pytest

from conveyor.protocol import messages as m

from .engine_harness import Harness, config_xml, decode, queue_xml, recorded

LEASE_S = 10.0


def one_queue(**elements) -> Harness:
    """Queue ``Q`` over the recorded topic ``Work`` (LeasePeriod 10s unless given)."""
    elements.setdefault("LeasePeriod", f"{LEASE_S:g}s")
    return Harness(config_xml(queue_xml("Q", **elements), topics=("Work",)))


def publish_all(h: Harness, pub: int, values, topic: str = "Work") -> None:
    for v in values:
        h.publish(pub, topic, v)
    h.commit()


def items(messages) -> list:
    return [decode(x)["i"] for x in messages]


def worker(h: Harness, name: str, topic: str = "Q", sub_id: str = "s", **kw) -> int:
    conn = h.connect(name)
    h.subscribe(conn, topic, sub_id, **kw)
    (ack,) = h.acks(conn)
    assert ack.status == "success", ack
    return conn


def test_publishes_made_durable_together_enter_the_queue_in_position_order():
    """One group commit makes several publishes durable at once: those of a plain queue go in
    as one run, and one with an expiry of its own goes in one by one, in its place."""
    h = one_queue()
    pub = h.connect("pub")
    for i in range(5):
        h.publish(pub, "Work", {"i": i}, **({"expiration": 60.0} if i == 2 else {}))
    h.commit()
    w = worker(h, "w", options="max_backlog=10")
    assert items(h.messages(w)) == [0, 1, 2, 3, 4]
    assert h.stats("Q").available == 0 and h.stats("Q").enqueued == 5


def test_a_replay_enqueues_runs_in_position_order():
    """Recovery enqueues a plain queue's publishes in runs: one with an expiry of its own,
    and a record of another kind (an ack), still apply in their place."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=1")
    for i in range(6):
        h.publish(pub, "Work", {"i": i}, **({"expiration": 60.0} if i == 3 else {}))
        if i == 1:
            h.commit()
            (first,) = h.messages(w)
            h.ack(w, "Q", [first])  # a queue record between the publishes
    h.commit()
    h.crash(checkpoint=False)
    w = worker(h, "w2", options="max_backlog=10")
    assert items(h.messages(w)) == [1, 2, 3, 4, 5]


# --- Getting Started / Understanding AMPS Queuing -----------------------------------------


def test_getting_started_configuration_distributes_work_one_message_each():
    """Getting Started with AMPS Queues: the sample TransactionLog (Work, WorkToDo) and the
    at-most-once queue WorkToDo over Work; three publishes to Work, three subscribers to
    WorkToDo: "each subscriber only receives one message, and each message is delivered
    to only one subscriber" (the diagram of the chapter's introduction)."""
    xml = (
        "<AMPSConfig>"
        "<TransactionLog><JournalDirectory>./journals</JournalDirectory>"
        "<Topic><Name>Work</Name><MessageType>json</MessageType></Topic>"
        "<Topic><Name>WorkToDo</Name><MessageType>json</MessageType></Topic>"
        "</TransactionLog>"
        "<SOW><Queue><Name>WorkToDo</Name><MessageType>json</MessageType>"
        "<Semantics>at-most-once</Semantics><UnderlyingTopic>Work</UnderlyingTopic></Queue></SOW>"
        "</AMPSConfig>"
    )
    h = Harness(xml)
    pub = h.connect("publisher")
    workers = [worker(h, f"w{i}", "WorkToDo") for i in range(3)]
    publish_all(h, pub, [{"i": i} for i in range(3)])
    got = [items(h.messages(w, "WorkToDo")) for w in workers]
    assert sorted(len(g) for g in got) == [1, 1, 1]
    assert sorted(x for g in got for x in g) == [0, 1, 2]


def test_queue_without_underlying_topic_is_over_its_own_name_and_takes_every_subscription():
    """Getting Started: "leave out the UnderlyingTopic to include only messages published
    to the topic with the same name as the queue"; Understanding AMPS Queuing: "When a
    queue topic has the same name as the underlying topic (the default), all
    subscriptions to that topic are to the queue"."""
    h = Harness(config_xml(queue_xml("Jobs", underlying=None), topics=("Jobs", "Other")))
    pub = h.connect("pub")
    a = worker(h, "a", "Jobs")
    b = worker(h, "b", "Jobs")
    publish_all(h, pub, [{"i": 1}, {"i": 2}], topic="Jobs")
    publish_all(h, pub, [{"i": 3}], topic="Other")
    ma, mb = h.messages(a), h.messages(b)
    assert sorted(items(ma) + items(mb)) == [1, 2]  # queue delivery: one each, no copies
    assert all(x.queue == "Jobs" and x.lease_deadline is not None for x in ma + mb)


def test_any_number_of_queues_over_the_same_topic_track_messages_independently():
    """Understanding AMPS Queuing: "AMPS allows you to create any number of queues over the
    same underlying topic. Each queue tracks messages to the topic independently, and can
    have different policies for delivery"."""
    h = Harness(
        config_xml(
            queue_xml("Q1", LeasePeriod="10s")
            + queue_xml("Q2", Semantics="at-most-once")
            + queue_xml("Q3", LeasePeriod="10s"),
            topics=("Work",),
        )
    )
    pub = h.connect("pub")
    c1 = worker(h, "c1", "Q1", options="max_backlog=5")
    c2 = worker(h, "c2", "Q2", options="max_backlog=5")
    publish_all(h, pub, [{"i": i} for i in range(3)])
    got1, got2 = h.messages(c1, "Q1"), h.messages(c2, "Q2")
    assert items(got1) == items(got2) == [0, 1, 2]
    h.ack(c1, "Q1", got1)  # acknowledged in Q1 only
    h.commit()
    assert h.stats("Q1").queue_depth == 0
    assert h.stats("Q2").queue_depth == 0  # at-most-once: removed at delivery
    assert [decode(x)["i"] for x in h.sow(c1, "Q3")] == [0, 1, 2]  # untouched
    c3 = worker(h, "c3", "Q3", options="max_backlog=5")
    assert items(h.messages(c3, "Q3")) == [0, 1, 2]


def test_subscription_to_the_underlying_topic_under_another_name_is_plain_pub_sub():
    """Understanding AMPS Queuing: "When a queue topic has a different name than the
    underlying topic, you can subscribe to the underlying topic directly, and that
    subscription is to the underlying (non-queue) topic"."""
    h = one_queue()
    pub = h.connect("pub")
    q = worker(h, "q", "Q", options="max_backlog=1")
    s1 = worker(h, "s1", "Work")
    s2 = worker(h, "s2", "Work")
    publish_all(h, pub, [{"i": i} for i in range(3)])
    for s in (s1, s2):
        got = h.messages(s)
        assert items(got) == [0, 1, 2]  # every message, to every subscriber
        assert all(x.topic == "Work" and x.queue is None and x.lease_deadline is None for x in got)
    assert items(h.messages(q)) == [0]  # the queue is unaffected by them
    assert h.stats("Q").queue_depth == 3


def test_a_message_reaches_the_queue_only_once_durable():
    """Understanding AMPS Queuing: "Queues use the transaction log to determine which
    messages to enqueue": a publish is in the queue (delivered, in a sow) only once its
    journal record is durable (core rule 1, read-committed)."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w")
    h.publish(pub, "Work", {"i": 1})
    assert h.messages(w) == []
    assert h.sow(w, "Q") == []
    assert h.stats("Q").enqueued == 0
    h.commit()
    assert items(h.messages(w)) == [1]


# --- Delivery Semantics ---------------------------------------------------------------------


def test_at_least_once_lease_period_is_sent_with_each_message():
    """Message Flow for Queues (at-least-once), step 3: "AMPS calculates the lease time for
    the message and provides that time to the subscriber along with the message"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=2")
    publish_all(h, pub, [{"i": 1}])
    h.advance(3.0)
    publish_all(h, pub, [{"i": 2}])
    first, second = h.messages(w)
    assert first.lease_deadline == pytest.approx(h.now - 3.0 + LEASE_S)
    assert second.lease_deadline == pytest.approx(h.now + LEASE_S)
    assert first.queue == second.queue == "Q" and first.bookmark and second.bookmark


def test_at_least_once_lease_broken_on_disconnect_message_goes_to_another_consumer():
    """Delivery Semantics: "Leases are broken and messages are returned to the queue if the
    lease holder disconnects from AMPS ... the message can immediately be processed by
    another message processor"."""
    h = one_queue()
    pub = h.connect("pub")
    a = worker(h, "a")
    b = worker(h, "b")
    publish_all(h, pub, [{"i": 1}, {"i": 2}])
    (got_a,), (got_b,) = h.messages(a), h.messages(b)
    h.disconnect(a)
    assert h.messages(b) == []  # b's backlog of 1 is full
    assert h.stats("Q").available == 1
    h.ack(b, "Q", got_b)
    assert [x.bookmark for x in h.messages(b)] == [got_a.bookmark]


def test_at_least_once_lease_broken_on_unsubscribe():
    """Delivery Semantics, and reference.md B.6 (inferred): unsubscribing breaks the leases
    of that subscription, as a disconnect does; the connection itself stays."""
    h = one_queue()
    pub = h.connect("pub")
    a = worker(h, "a", options="max_backlog=2")
    b = worker(h, "b", options="max_backlog=0")
    publish_all(h, pub, [{"i": 1}, {"i": 2}])
    assert items(h.messages(a)) == [1, 2]
    h.unsubscribe(a)
    assert h.stats("Q").available == 2
    h.subscribe(b, "Q", "s", options="max_backlog=5,replace")
    assert items(h.messages(b)) == [1, 2]
    assert h.messages(a) == []


def test_at_least_once_lease_expiry_returns_the_message_to_another_consumer():
    """Delivery Semantics: "If the subscriber has not responded by removing the message
    within the lease period, AMPS revokes the lease and the message is available to
    another subscriber" (round-robin here, so that the other one is next)."""
    h = one_queue(FairnessModel="round-robin")
    pub = h.connect("pub")
    a = worker(h, "a")
    publish_all(h, pub, [{"i": 1}])
    (got,) = h.messages(a)
    b = worker(h, "b")
    h.advance(LEASE_S - 0.5)
    assert h.messages(b) == []
    h.advance(0.5)
    (again,) = h.messages(b)
    assert again.bookmark == got.bookmark
    assert again.lease_deadline == pytest.approx(h.now + LEASE_S)


def test_at_most_once_message_is_removed_at_delivery():
    """Delivery Semantics: at-most-once, "AMPS removes the message from the queue as soon
    as the message is sent to a subscriber"; it is not in a sow, and a disconnect does
    not bring it back."""
    h = one_queue(Semantics="at-most-once")
    pub = h.connect("pub")
    a = worker(h, "a")
    b = worker(h, "b", options="max_backlog=0")
    publish_all(h, pub, [{"i": 1}, {"i": 2}])
    assert items(h.messages(a)) == [1]
    assert items(h.sow(b, "Q")) == [2]
    h.disconnect(a)
    h.subscribe(b, "Q", "s", options="max_backlog=5,replace")
    h.commit()
    assert items(h.messages(b)) == [2]
    assert h.stats("Q").queue_depth == 0


def test_at_most_once_delivery_is_sent_only_once_its_record_is_durable():
    """Core rule 2 (issue 4.7): the at-most-once delivery record is journaled and fsynced
    before the message is sent, so a crash can never deliver it twice."""
    h = one_queue(Semantics="at-most-once")
    pub = h.connect("pub")
    a = worker(h, "a")
    h.publish(pub, "Work", {"i": 1})
    h.commit(rounds=1)  # the publish is durable and dispatched; the delivery is not durable
    assert h.messages(a) == []
    h.commit(rounds=1)
    assert items(h.messages(a)) == [1]


def test_at_most_once_ack_only_frees_the_backlog():
    """Delivery Semantics: at-most-once, "the subscriber still needs to acknowledge that the
    message was processed, so that AMPS can track the subscription backlog"."""
    h = one_queue(Semantics="at-most-once")
    pub = h.connect("pub")
    a = worker(h, "a")
    publish_all(h, pub, [{"i": 1}, {"i": 2}])
    (first,) = h.messages(a)
    h.commit()
    assert h.messages(a) == []  # backlog 1 is full until the ack
    h.ack(a, "Q", first, ack_type="processed")
    h.commit()
    assert items(h.messages(a)) == [2]
    (ack,) = h.acks(a)
    assert ack.records_deleted == 1


@pytest.mark.parametrize("option", ["cancel", "expire"])
def test_at_most_once_ack_options_cancel_and_expire_have_no_effect(option):
    """Acknowledging Messages: "For at-most-once queues, these options to acknowledgments
    have no effect": a cancel does not return the message, an expire removes nothing
    more; either frees the backlog like a plain ack."""
    h = one_queue(Semantics="at-most-once")
    pub = h.connect("pub")
    a = worker(h, "a")
    b = worker(h, "b", options="max_backlog=0")
    publish_all(h, pub, [{"i": 1}, {"i": 2}, {"i": 3}])
    (first,) = h.messages(a)
    assert decode(first)["i"] == 1
    h.ack(a, "Q", first, options=option, ack_type="processed")
    assert h.acks(a)[0].records_deleted == 1
    h.commit()
    assert items(h.messages(a)) == [2]  # the backlog slot was freed; 1 is not redelivered
    assert items(h.sow(b, "Q")) == [3]
    assert h.stats("Q").expired == 0


# --- Subscription Backlog -------------------------------------------------------------------


def test_max_backlog_defaults_to_one():
    """Subscription Backlog: "if a subscriber does not provide a max_backlog on a
    subscription, AMPS defaults to a max_backlog of 1"."""
    h = one_queue(MaxPerSubscriptionBacklog=10)
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": i} for i in range(5)])
    (got,) = h.messages(w)
    h.ack(w, "Q", got)
    assert items(h.messages(w)) == [1]


@pytest.mark.parametrize(
    ("requested", "limit", "expected"),
    [(10, 3, 3), (2, 3, 2), (None, 3, 1), (10, 1_000_000, 10), (10, None, 1), (0, 3, 0)],
)
def test_backlog_is_min_of_max_backlog_and_max_per_subscription_backlog(requested, limit, expected):
    """Subscription Backlog: the backlog is the minimum of the MaxPerSubscriptionBacklog of
    the queue and the max_backlog on the subscribe command (1 when absent)."""
    h = one_queue(MaxPerSubscriptionBacklog=limit)
    pub = h.connect("pub")
    options = None if requested is None else f"max_backlog={requested}"
    w = worker(h, "w", options=options)
    publish_all(h, pub, [{"i": i} for i in range(12)])
    assert len(h.messages(w)) == expected


def two_queues(**elements) -> Harness:
    """QA over topic A and QB over topic B."""
    xml = config_xml(
        queue_xml("QA", underlying="A", LeasePeriod="10s", **elements.get("a", {}))
        + queue_xml("QB", underlying="B", LeasePeriod="10s", **elements.get("b", {})),
        topics=("A", "B"),
    )
    return Harness(xml)


def test_regex_subscription_over_two_queues_has_one_backlog():
    """Subscription Backlog: the backlog is per subscription, whatever the number of queues
    its topic matches; one ack frees room for a message of either queue."""
    h = two_queues()
    pub = h.connect("pub")
    w = worker(h, "w", "^Q[AB]$", options="max_backlog=2")
    publish_all(h, pub, [{"i": "a1"}, {"i": "a2"}], topic="A")
    publish_all(h, pub, [{"i": "b1"}, {"i": "b2"}], topic="B")
    got = h.messages(w)
    assert items(got) == ["a1", "a2"]
    h.ack(w, "QA", got[0])
    (nxt,) = h.messages(w)
    assert nxt.queue == "QB" and decode(nxt)["i"] == "b1"


def test_regex_subscription_backlog_uses_the_smallest_max_per_subscription_backlog():
    """Subscription Backlog: "The minimum MaxPerSubscriptionBacklog setting for the queues
    matched by the subscription"."""
    h = two_queues(a={"MaxPerSubscriptionBacklog": 5}, b={"MaxPerSubscriptionBacklog": 2})
    pub = h.connect("pub")
    w = worker(h, "w", "^Q[AB]$", options="max_backlog=10")
    publish_all(h, pub, [{"i": i} for i in range(4)], topic="A")
    assert len(h.messages(w)) == 2


def test_lease_expiry_in_one_queue_frees_the_shared_backlog_for_the_other_queue():
    """Subscription Backlog (one backlog per subscription) with Delivery Semantics (a lease
    that ends frees the backlog): a message of QA whose lease expires for good
    (MaxDeliveries 1) leaves room that a waiting message of QB must fill."""
    h = two_queues(a={"MaxDeliveries": 1})
    pub = h.connect("pub")
    w = worker(h, "w", "^Q[AB]$", options="max_backlog=1")
    publish_all(h, pub, [{"i": "a"}], topic="A")
    publish_all(h, pub, [{"i": "b"}], topic="B")
    assert items(h.messages(w)) == ["a"]
    h.advance(LEASE_S)
    assert h.stats("QA").queue_depth == 0  # expired: max_deliveries
    assert items(h.messages(w)) == ["b"]


# --- Delivery Fairness ----------------------------------------------------------------------


def test_round_robin_fairness_deals_messages_in_turn():
    """Delivery Fairness, table 15.1, round-robin: "AMPS delivers messages evenly among the
    subscribers that have space in their backlog"."""
    h = one_queue(FairnessModel="round-robin")
    pub = h.connect("pub")
    ws = [worker(h, f"w{i}", options="max_backlog=10") for i in range(3)]
    publish_all(h, pub, [{"i": i} for i in range(7)])
    assert [items(h.messages(w)) for w in ws] == [[0, 3, 6], [1, 4], [2, 5]]


def test_round_robin_is_the_only_model_for_at_most_once_and_the_default():
    """Delivery Fairness: "For at-most-once delivery, AMPS supports only the round-robin
    method" and defaults to it."""
    h = one_queue(Semantics="at-most-once")
    pub = h.connect("pub")
    ws = [worker(h, f"w{i}", options="max_backlog=10") for i in range(2)]
    publish_all(h, pub, [{"i": i} for i in range(4)])
    assert [items(h.messages(w)) for w in ws] == [[0, 2], [1, 3]]


def test_proportional_fairness_inky_blinky_clyde():
    """Delivery Fairness, table 15.1, proportional: Inky 1 of 2, Blinky 3 of 4, Clyde 4 of
    10: "a new message for the queue will be delivered to Clyde". Proportional is the
    default for at-least-once."""
    h = one_queue()
    pub = h.connect("pub")
    blinky = worker(h, "blinky", options="max_backlog=4")
    publish_all(h, pub, [{"i": i} for i in range(3)])
    clyde = worker(h, "clyde", options="max_backlog=10")
    publish_all(h, pub, [{"i": i} for i in range(3, 7)])
    inky = worker(h, "inky", options="max_backlog=2")
    publish_all(h, pub, [{"i": 7}])
    assert [len(h.messages(c)) for c in (inky, blinky, clyde)] == [1, 3, 4]
    publish_all(h, pub, [{"i": 8}])
    assert [items(h.messages(c)) for c in (inky, blinky, clyde)] == [[], [], [8]]


def test_proportional_fairness_tie_goes_to_the_first_subscription_found():
    """Delivery Fairness: "If more than one subscription has the same unused capacity, AMPS
    delivers the message to the first subscription found with that capacity"."""
    h = one_queue()
    pub = h.connect("pub")
    a = worker(h, "a", options="max_backlog=2")
    b = worker(h, "b", options="max_backlog=4")
    publish_all(h, pub, [{"i": i} for i in range(3)])
    # 0 to a (tie 0/2, 0/4), 1 to b (1/2 > 0/4), 2 to b (1/2 > 1/4)
    assert items(h.messages(a)) == [0]
    assert items(h.messages(b)) == [1, 2]
    publish_all(h, pub, [{"i": 3}])  # tie 1/2 = 2/4: the first one found, a
    assert items(h.messages(a)) == [3]


def test_fast_fairness_first_subscription_with_room():
    """Delivery Fairness, table 15.1, fast: "AMPS delivers the message to the first
    subscription found that does not have a full backlog"."""
    h = one_queue(FairnessModel="fast")
    pub = h.connect("pub")
    a = worker(h, "a", options="max_backlog=2")
    b = worker(h, "b", options="max_backlog=5")
    publish_all(h, pub, [{"i": i} for i in range(4)])
    assert items(h.messages(a)) == [0, 1]
    assert items(h.messages(b)) == [2, 3]


# --- Acknowledging Messages -----------------------------------------------------------------


def test_sow_delete_with_a_list_of_bookmarks_acknowledges_them_all():
    """Acknowledging Messages: "AMPS allows subscribers to acknowledge multiple messages
    simultaneously by providing a comma-delimited list of bookmarks"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=3")
    publish_all(h, pub, [{"i": i} for i in range(5)])
    got = h.messages(w)
    h.ack(w, "Q", [got[0], got[2]], ack_type="processed")
    (ack,) = h.acks(w)
    assert ack.status == "success" and ack.records_deleted == 2
    assert items(h.messages(w)) == [3, 4]
    h.disconnect(w)
    assert items(h.sow(pub, "Q")) == [1, 3, 4]


def test_sow_delete_with_a_filter_acknowledges_matching_messages_leased_or_not():
    """Acknowledging Messages: "the sow_delete acknowledges all messages that match the
    filter, regardless of whether the application that sends the command has a current
    lease on a given message or not"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=2")
    publish_all(h, pub, [{"i": i, "k": i % 2} for i in range(6)])
    assert items(h.messages(w)) == [0, 1]
    h.ack_filter(w, "Q", "/k = 0", ack_type="processed")
    (ack,) = h.acks(w)
    assert ack.records_deleted == 3  # 0 (leased by w), 2 and 4 (not leased)
    assert items(h.messages(w)) == [3]
    h.disconnect(w)
    assert items(h.sow(pub, "Q")) == [1, 3, 5]


def test_sow_delete_filter_under_strict_leasing_spares_messages_leased_to_others():
    """Acknowledging Messages: "The Leasing parameter on the queue specifies whether AMPS
    allows a client to successfully acknowledge messages that it does not currently have
    leased" (strict, the default here: it does not)."""
    h = one_queue(Leasing="strict")
    pub = h.connect("pub")
    holder = worker(h, "holder", options="max_backlog=2")
    other = h.connect("other")
    publish_all(h, pub, [{"i": i, "k": 0} for i in range(4)])
    assert items(h.messages(holder)) == [0, 1]
    h.ack_filter(other, "Q", "/k = 0", ack_type="processed")
    (ack,) = h.acks(other)
    assert ack.records_deleted == 2  # the two unleased ones
    assert h.stats("Q").queue_depth == 2 and h.stats("Q").backlog == 2


def test_sow_delete_filter_under_sloppy_leasing_acknowledges_others_leases():
    """Acknowledging Messages, Leasing sloppy: an acknowledgement from a client that does
    not hold the lease succeeds, and frees the holder's backlog."""
    h = one_queue(Leasing="sloppy")
    pub = h.connect("pub")
    holder = worker(h, "holder", options="max_backlog=2")
    other = h.connect("other")
    publish_all(h, pub, [{"i": i, "k": int(i < 3)} for i in range(5)])
    assert items(h.messages(holder)) == [0, 1]
    h.ack_filter(other, "Q", "/k = 1", ack_type="processed")
    (ack,) = h.acks(other)
    assert ack.records_deleted == 3
    assert items(h.messages(holder)) == [3, 4]
    assert h.stats("Q").queue_depth == 2


def test_sow_delete_by_bookmark_under_sloppy_leasing_from_another_connection():
    """Acknowledging Messages, Leasing sloppy: any client may acknowledge by bookmark."""
    h = one_queue(Leasing="sloppy")
    pub = h.connect("pub")
    holder = worker(h, "holder")
    other = h.connect("other")
    publish_all(h, pub, [{"i": 0}, {"i": 1}])
    (got,) = h.messages(holder)
    h.ack(other, "Q", got.bookmark)
    assert items(h.messages(holder)) == [1]


def test_strict_leasing_refused_bookmark_ack_is_reported_to_the_client():
    """Acknowledging Messages: Leasing decides whether a client may "successfully
    acknowledge messages that it does not currently have leased"; the refusal must reach
    the client (errors.NotLeaseHolder, code not_lease_holder), else it believes the
    message is processed while the holder's lease still runs."""
    h = one_queue(Leasing="strict")
    pub = h.connect("pub")
    holder = worker(h, "holder")
    other = h.connect("other")
    publish_all(h, pub, [{"i": 0}])
    (got,) = h.messages(holder)
    h.ack(other, "Q", got.bookmark, ack_type="processed")
    (ack,) = h.acks(other)
    assert h.stats("Q").backlog == 1  # refused: the lease holds
    assert ack.status == "failure" and ack.code == "not_lease_holder"


def test_cancel_returns_the_message_and_max_cancels_3_expires_it_on_the_third():
    """Acknowledging Messages (cancel: "returns the message to the queue just as though the
    lease had expired") and Handling Unprocessed Messages: "AMPS will automatically expire
    a message from Jobs on the 3rd time it receives a sow_delete with the cancel
    operation" (MaxCancels 3; reference.md A.2 follows this worked example)."""
    h = one_queue(MaxCancels=3)
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": 0}, {"i": 1}])
    for attempt in range(1, 4):
        (got,) = h.messages(w)
        assert decode(got)["i"] == 0, attempt
        h.ack(w, "Q", got, options="cancel")
    (nxt,) = h.messages(w)
    assert decode(nxt)["i"] == 1  # message 0 expired on the third cancel
    assert h.stats("Q").expired == 1


def test_expire_option_removes_the_message_at_once():
    """Acknowledging Messages: "To immediately remove a message from the queue, the
    subscriber provides the expire option ... AMPS does not return the message to the
    queue for redelivery"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": 0}, {"i": 1}])
    (got,) = h.messages(w)
    h.ack(w, "Q", got, options="expire", ack_type="processed")
    assert h.acks(w)[0].records_deleted == 1
    assert items(h.messages(w)) == [1]
    h.disconnect(w)
    assert items(h.sow(pub, "Q")) == [1]
    assert h.stats("Q").expired == 1


def test_cancel_and_expire_together_are_refused():
    """Acknowledging Messages: cancel returns, expire removes; a command with both is a
    client error and changes nothing."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": 0}])
    (got,) = h.messages(w)
    h.ack(w, "Q", got, options="cancel,expire")
    (fail,) = h.failures(w)
    assert fail.code == "invalid_option"
    assert h.stats("Q").backlog == 1


# --- Message Flow: MaxDeliveries and Expiration ------------------------------------------------


def test_max_deliveries_expires_after_the_nth_unsuccessful_delivery():
    """Message Flow for Queues (at-least-once), step 6: a lease that expires on a message
    "delivered more than the number of times specified by MaxDeliveries" removes it;
    Handling Unprocessed Messages: "after the 10th unsuccessful delivery" (here 2)."""
    h = one_queue(MaxDeliveries=2)
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": 0}])
    assert items(h.messages(w)) == [0]
    h.advance(LEASE_S)
    assert items(h.messages(w)) == [0]  # second delivery
    h.advance(LEASE_S)
    assert h.messages(w) == []
    assert h.stats("Q").queue_depth == 0 and h.stats("Q").expired == 1


def test_expiration_removes_a_message_nobody_took():
    """Message Flow for Queues, step 5: "If the message has been in the queue longer than
    the Expiration time, and there is no current lease on the message, AMPS removes the
    message from the queue"."""
    h = one_queue(Expiration="30s")
    pub = h.connect("pub")
    publish_all(h, pub, [{"i": 0}])
    h.advance(29.0)
    publish_all(h, pub, [{"i": 1}])
    h.advance(1.0)
    w = worker(h, "w", options="max_backlog=5")
    assert items(h.messages(w)) == [1]
    assert h.stats("Q").expired == 1


def test_expiration_waits_for_the_lease_then_removes_instead_of_returning():
    """Message Flow for Queues (at-least-once), steps 5 and 6: a leased message is not
    removed while the lease runs; when the lease expires after the Expiration time, AMPS
    "removes the message from the queue when the lease expires"."""
    h = one_queue(Expiration="15s")
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": 0}])
    (got,) = h.messages(w)
    h.advance(LEASE_S)  # lease over at 10s, age 10s < 15s: back, and delivered again
    (again,) = h.messages(w)
    assert again.bookmark == got.bookmark
    h.advance(LEASE_S)  # age 20s: the lease ends and the message expires
    assert h.messages(w) == [] and h.stats("Q").queue_depth == 0


def test_expiration_at_most_once_removes_only_undelivered_messages():
    """Message Flow for Queues (at-most-once), step 5: "If no subscription has requested
    the message, and the message has been in the queue longer than the Expiration time,
    AMPS removes the message"."""
    h = one_queue(Semantics="at-most-once", Expiration="5s")
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": 0}, {"i": 1}])
    (got,) = h.messages(w)
    h.advance(5.0)
    h.ack(w, "Q", got)
    h.commit()
    assert h.messages(w) == []
    assert h.stats("Q").expired == 1


def test_a_lagging_timer_does_not_let_an_expired_message_out():
    """Message Flow for Queues, step 5 with STYLE 2 (time is an argument): a command that
    arrives after a message's Expiration, before the timer fired, must not deliver it."""
    h = one_queue(Expiration="5s")
    pub = h.connect("pub")
    publish_all(h, pub, [{"i": 0}])
    h.now += 60.0  # no tick
    w = worker(h, "w")
    assert h.messages(w) == []


# --- Querying Queues as a View ----------------------------------------------------------------


def test_sow_on_a_queue_returns_available_messages_excludes_leased_and_changes_nothing():
    """Querying Queues as a View: "A query of a queue is read-only. AMPS does not lease the
    returned messages to the querying application, or remove them from the queue";
    reference.md B.5 (inferred): leased messages are excluded."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=1")
    publish_all(h, pub, [{"i": i, "k": i % 2} for i in range(4)])
    assert items(h.messages(w)) == [0]
    reader = h.connect("reader")
    before = h.stats("Q")
    assert items(h.sow(reader, "Q")) == [1, 2, 3]
    assert items(h.sow(reader, "Q", filter="/k = 1")) == [1, 3]
    assert h.stats("Q") == before
    assert h.messages(reader) == []


def test_sow_on_a_topic_that_is_not_a_queue_is_refused():
    """reference.md B.5: "A sow on a topic without a SOW is an error" (conveyor has no SOW
    topics, only queues)."""
    h = one_queue()
    c = h.connect("c")
    h.handle(c, m.Sow(topic="Work", query_id="q"))
    (fail,) = h.failures(c)
    assert fail.code == "unknown_topic"


# --- Replacing Queue Subscriptions ------------------------------------------------------------


def test_replace_lowering_max_backlog_keeps_leases_and_waits_below_the_new_maximum():
    """Replacing Queue Subscriptions, 1 and 2: "AMPS does not break message leases or adjust
    the number of currently-unacknowledged messages"; the new maximum can leave the
    consumer above it, "and no new messages will be delivered until that number drops
    below the current maximum"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=10")
    publish_all(h, pub, [{"i": i} for i in range(20)])
    got = h.messages(w)
    assert len(got) == 10
    h.subscribe(w, "Q", "s", options="max_backlog=5,replace")
    assert h.acks(w)[0].status == "success"
    assert h.stats("Q").backlog == 10  # leases kept
    h.ack(w, "Q", got[:5])
    assert h.messages(w) == []  # 5 outstanding, maximum 5
    h.ack(w, "Q", got[5])
    assert items(h.messages(w)) == [10]


def test_replace_to_another_queue_recomputes_backlog_the_10_to_5_example():
    """Replacing Queue Subscriptions, 2: "if the consumer has a requested max_backlog of 10
    and updates a subscription from a queue with a configured maximum of 10 to a queue
    with a configured maximum of 5, the new backlog for the subscription will be 5.
    However, the consumer may still have 10 messages outstanding"."""
    h = Harness(
        config_xml(
            queue_xml("Q10", underlying="A", MaxPerSubscriptionBacklog=10)
            + queue_xml("Q5", underlying="B", MaxPerSubscriptionBacklog=5),
            topics=("A", "B"),
        )
    )
    pub = h.connect("pub")
    w = worker(h, "w", "Q10", options="max_backlog=10")
    publish_all(h, pub, [{"i": i} for i in range(12)], topic="A")
    publish_all(h, pub, [{"i": 100 + i} for i in range(12)], topic="B")
    got = h.messages(w)
    assert len(got) == 10
    h.subscribe(w, "Q5", "s", options="max_backlog=10,replace")
    (ack,) = h.acks(w)
    assert ack.status == "success", ack
    assert h.stats("Q10").backlog == 10  # leases not broken
    h.ack(w, "Q10", got[:5])
    assert h.messages(w) == []  # still 5 outstanding, new maximum 5
    h.ack(w, "Q10", got[5])
    assert items(h.messages(w)) == [100]  # only the new topic delivers now


def test_replace_filter_applies_to_every_later_delivery_and_keeps_leases():
    """Replacing Queue Subscriptions: "Replacement is atomic. The queue consumer is
    guaranteed that, after the replace occurs, only messages that match the new
    subscription will be delivered"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=2", filter="/k = 0")
    publish_all(h, pub, [{"i": i, "k": i % 2} for i in range(6)])
    got = h.messages(w)
    assert items(got) == [0, 2]
    h.subscribe(w, "Q", "s", options="max_backlog=2,replace", filter="/k = 1")
    assert h.stats("Q").backlog == 2
    h.ack(w, "Q", got)
    assert items(h.messages(w)) == [1, 3]


# --- Bookmark Subscriptions to Queues ---------------------------------------------------------


def test_bookmark_subscription_to_a_queue_replays_the_underlying_topic_without_queue_semantics():
    """Bookmark Subscriptions to Queues: "a bookmark subscription to a queue becomes a
    publish/subscribe bookmark subscription to the underlying topic ... Messages from this
    subscription do not have at-most-once or at-least-once delivery, and do not need to
    be acknowledged"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=5")
    publish_all(h, pub, [{"i": i} for i in range(3)])
    h.ack(w, "Q", h.messages(w)[:2])  # 0 and 1 processed
    h.commit()
    r = h.connect("replayer")
    h.subscribe(r, "Q", "r", bookmark="0")
    assert h.acks(r)[0].status == "success"
    got = h.messages(r)
    assert items(got) == [0, 1, 2]  # acknowledged ones too: a replay of the topic
    assert all(x.topic == "Work" and x.queue is None and x.lease_deadline is None for x in got)
    publish_all(h, pub, [{"i": 3}])
    assert items(h.messages(r)) == [3]  # then live, still pub/sub
    assert items(h.messages(w)) == [3]  # the queue still delivers its own way
    assert h.stats("Q").backlog == 2  # 2 and 3 leased to w; the replay took nothing


# --- Using Multiple Underlying Topics (DefaultPublishTarget) ----------------------------------

ORDERS_XML = (
    "<AMPSConfig><TransactionLog><JournalDirectory>./journals</JournalDirectory>"
    + recorded("^ORDERS.*")
    + "</TransactionLog><SOW>"
    "<Queue><Name>ORDERS_ANALYTICS</Name><MessageType>json</MessageType>"
    "<UnderlyingTopic>^ORDERS$|^ORDERS_ANALYTICS_DIRECT$</UnderlyingTopic>"
    "<DefaultPublishTarget>ORDERS_ANALYTICS_DIRECT</DefaultPublishTarget></Queue>"
    "<Queue><Name>ORDERS_RISK</Name><MessageType>json</MessageType>"
    "<UnderlyingTopic>^ORDERS$|^ORDERS_RISK_DIRECT$</UnderlyingTopic>"
    "<DefaultPublishTarget>ORDERS_RISK_DIRECT</DefaultPublishTarget></Queue>"
    "</SOW></AMPSConfig>"
)


@pytest.mark.parametrize(
    ("publish_to", "recorded_as", "queues"),
    [
        ("ORDERS", "ORDERS", {"ORDERS_ANALYTICS", "ORDERS_RISK"}),
        ("ORDERS_ANALYTICS", "ORDERS_ANALYTICS_DIRECT", {"ORDERS_ANALYTICS"}),
        ("ORDERS_RISK", "ORDERS_RISK_DIRECT", {"ORDERS_RISK"}),
        ("ORDERS_ANALYTICS_DIRECT", "ORDERS_ANALYTICS_DIRECT", {"ORDERS_ANALYTICS"}),
        ("ORDERS_RISK_DIRECT", "ORDERS_RISK_DIRECT", {"ORDERS_RISK"}),
    ],
)
def test_default_publish_target_routing_table(publish_to, recorded_as, queues):
    """Using Multiple Underlying Topics: the table of where a publish goes with the
    ORDERS_ANALYTICS / ORDERS_RISK configuration ("any publish to the name of the queue
    will be routed to the appropriate _DIRECT topic")."""
    h = Harness(ORDERS_XML)
    pub = h.connect("pub")
    consumers = {q: worker(h, q.lower(), q, options="max_backlog=5") for q in ("ORDERS_ANALYTICS", "ORDERS_RISK")}
    watcher = worker(h, "watcher", recorded_as)  # pub/sub on the topic it is recorded on
    publish_all(h, pub, [{"to": publish_to}], topic=publish_to)
    got = {q: h.messages(c) for q, c in consumers.items()}
    assert {q for q, msgs in got.items() if msgs} == queues
    for q in queues:
        (msg,) = got[q]
        assert decode(msg) == {"to": publish_to}
    (seen,) = h.messages(watcher)
    assert seen.topic == recorded_as
    (rec,) = [r for _, r in _journal_publishes(h)]
    assert rec.topic == recorded_as


def _journal_publishes(h: Harness):
    from conveyor import records

    for pos, payload in h.journal.scan():
        rec = records.decode(payload)
        if isinstance(rec, records.PublishRec):
            yield pos, rec


# --- Advanced Messaging and Queues: a queue-level filter --------------------------------------


def test_queue_filter_selects_which_messages_enter_the_queue():
    """Advanced Messaging and Queues: "You can use content filters to select only a subset
    of messages published to an underlying topic to populate the queue" (reference.md
    A.2: the element is Filter)."""
    h = one_queue(Filter="/priority &gt;= 5")
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=10")
    s = worker(h, "s", "Work")
    publish_all(h, pub, [{"i": i, "priority": p} for i, p in enumerate([1, 5, 9, 4, 7])])
    assert items(h.messages(w)) == [1, 2, 4]
    assert items(h.messages(s)) == [0, 1, 2, 3, 4]  # the topic itself has them all
    assert h.stats("Q").enqueued == 3


# --- Duplicates (spec 002, engine rule 3) and errors -------------------------------------------


def test_a_duplicate_publish_never_enters_the_queue_twice():
    """Engine rule 3 (spec 002): a publish whose sequence is not above the publisher's
    highest is a duplicate, acknowledged as such and never journaled; so it never enters
    a queue twice, whether the original was already durable or not."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w", options="max_backlog=10")
    h.publish(pub, "Work", {"i": 1}, seq=1)
    h.publish(pub, "Work", {"i": 1}, seq=1, ack_type="processed")  # original not durable yet
    h.commit()
    h.publish(pub, "Work", {"i": 1}, seq=1, ack_type="processed")  # original durable
    h.publish(pub, "Work", {"i": 2}, seq=2)
    h.publish(pub, "Work", {"i": 2}, seq=1)  # older than the highest
    h.commit()
    assert items(h.messages(w)) == [1, 2]
    assert [a.status for a in h.acks(pub)] == ["duplicate", "duplicate"]
    assert h.stats("Q").enqueued == 2


def test_a_bad_filter_on_subscribe_fails_with_bad_filter_and_the_connection_keeps_working():
    """reference.md B.4: errors travel in the processed ack of the subscribe; STYLE 8: with
    a stable code (``bad_filter``). The subscription is not created and the connection
    keeps working."""
    h = one_queue()
    pub = h.connect("pub")
    w = h.connect("w")
    h.subscribe(w, "Q", "s", filter="/k = = 1")
    (fail,) = h.acks(w)
    assert fail.status == "failure" and fail.code == "bad_filter"
    publish_all(h, pub, [{"i": 0, "k": 1}])
    assert h.messages(w) == []
    assert h.stats("Q").consumers == 0
    h.subscribe(w, "Q", "s", filter="/k = 1")  # same id: nothing was left behind
    assert h.acks(w)[0].status == "success"
    assert items(h.messages(w)) == [0]


def test_sow_delete_on_a_topic_that_is_not_a_queue_is_refused():
    """reference.md B.7: the bookmark form of sow_delete "is accepted only on queue
    topics"."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w")
    publish_all(h, pub, [{"i": 0}])
    (got,) = h.messages(w)
    h.ack(w, "Work", got)
    (fail,) = h.failures(w)
    assert fail.code == "unknown_topic"
    assert h.stats("Q").backlog == 1


@pytest.mark.parametrize("where", ["subscribe", "sow_delete"])
def test_queue_filters_see_message_functions_as_a_sow_of_the_queue_does(where):
    """Advanced Messaging and Queues: consumers "can use content filtering to select the
    messages from the queue that they want"; docs/expressions.md: TOPIC_NAME() of a queue
    message is its underlying topic (reference.md B.10). A queue fed by several topics
    (Using Multiple Underlying Topics) is where that matters."""
    h = Harness(ORDERS_XML)
    pub = h.connect("pub")
    reader = h.connect("reader")
    publish_all(h, pub, [{"i": 1}], topic="ORDERS")
    publish_all(h, pub, [{"i": 2}], topic="ORDERS_ANALYTICS_DIRECT")
    only_orders = "TOPIC_NAME() = 'ORDERS'"
    assert items(h.sow(reader, "ORDERS_ANALYTICS", filter=only_orders)) == [1]  # the view agrees
    if where == "subscribe":
        w = worker(h, "w", "ORDERS_ANALYTICS", options="max_backlog=5", filter=only_orders)
        assert items(h.messages(w)) == [1]
    else:
        h.ack_filter(reader, "ORDERS_ANALYTICS", only_orders, ack_type="processed")
        assert h.acks(reader)[0].records_deleted == 1
