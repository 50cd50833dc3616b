"""Publish and subscribe options that must do what they say or be refused: the
per-message expiration ``e`` of a publish (reference B.3, "a per-message expiration in
the log overrides" the queue's, G.8) and a ``replace`` of a bookmark (replay)
subscription that changes its topic (spec 000, "Replacing Queue Subscriptions": the
new topic and filter apply to every later message)."""

from __future__ import annotations

import math

import pytest

from .engine_harness import Harness, config_xml, queue_xml
from .test_engine_queue_rules import LEASE_S, items, one_queue, publish_all, worker


def _failure(h: Harness, conn: int):
    (ack,) = [a for a in h.acks(conn) if a.status != "success"]
    return ack


# --- the per-message expiration ``e`` ---------------------------------------------------------


def test_publish_expiration_removes_the_message_from_the_queue_when_it_is_due():
    h = one_queue()
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 0}, expiration=5.0)
    h.publish(pub, "Work", {"i": 1})
    h.commit()
    h.advance(5.0)
    w = worker(h, "w", options="max_backlog=5")
    assert items(h.messages(w)) == [1]
    assert h.stats("Q").expired == 1


def test_publish_expiration_of_a_leased_message_waits_for_the_lease():
    """As the queue's own Expiration (Message Flow step 6): no return once due, gone
    when the lease ends."""
    h = one_queue()
    pub = h.connect("pub")
    w = worker(h, "w")
    h.publish(pub, "Work", {"i": 0}, expiration=3.0)
    h.commit()
    (got,) = h.messages(w)
    h.advance(LEASE_S)
    assert h.messages(w) == [] and h.stats("Q").queue_depth == 0 and h.stats("Q").expired == 1


@pytest.mark.parametrize("snapshot", [False, True])
def test_publish_expiration_travels_in_the_journal_across_a_restart(snapshot):
    """Replayed from the journal, or restored from a queue snapshot (which keeps it)."""
    h = one_queue()
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 0}, expiration=60.0)
    h.publish(pub, "Work", {"i": 1})
    h.commit()
    if snapshot:
        h.checkpoint()
    h.crash()
    h.advance(61.0)
    w = worker(h, "w", options="max_backlog=5")
    assert items(h.messages(w)) == [1]


def test_a_message_s_own_expiration_overrides_the_queue_s_earlier_or_later():
    """The reference's queue table: "a per-message expiration in the log overrides" the
    queue's Expiration; messages without one keep the queue's."""
    h = one_queue(Expiration="10s")
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 0}, expiration=60.0)  # longer than the queue's: 60 s apply
    h.publish(pub, "Work", {"i": 1}, expiration=2.0)  # shorter: its own 2 s apply
    h.publish(pub, "Work", {"i": 2})  # none: the queue's 10 s
    h.commit()
    h.advance(2.0)
    w = worker(h, "w", options="max_backlog=5")
    assert items(h.messages(w)) == [0, 2]
    h.unsubscribe(w)
    h.advance(8.0)
    assert h.stats("Q").queue_depth == 1 and h.stats("Q").expired == 2  # 0 is still there
    h.advance(50.0)
    assert h.stats("Q").queue_depth == 0 and h.stats("Q").expired == 3


def test_messages_in_the_queue_before_the_first_own_expiration_keep_the_queue_s():
    h = one_queue(Expiration="10s")
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 0})
    h.commit()
    h.advance(5.0)
    h.publish(pub, "Work", {"i": 1}, expiration=60.0)
    h.publish(pub, "Work", {"i": 2})
    h.commit()
    h.advance(5.0)  # 0 is 10 s old; 2 is 5 s old
    w = worker(h, "w", options="max_backlog=5")
    assert items(h.messages(w)) == [1, 2]


@pytest.mark.parametrize("snapshots", [True, False])
def test_expirations_survive_a_restart_from_a_checkpoint(snapshots):
    """A restart from a checkpoint's queue snapshot expires the same messages at the same
    times as one that replays the journal."""
    h = Harness(config_xml(queue_xml("Q", Expiration="10s")), snapshots=snapshots)
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 0}, expiration=60.0)
    h.publish(pub, "Work", {"i": 1}, expiration=3.0)
    h.publish(pub, "Work", {"i": 2})
    h.commit()
    h.checkpoint()
    h.crash()
    h.advance(3.0)
    assert h.stats("Q").queue_depth == 2
    h.advance(7.0)
    assert h.stats("Q").queue_depth == 1  # 2 at the queue's 10 s; 0 keeps its own 60 s
    h.crash()
    h.advance(50.0)
    assert h.stats("Q").queue_depth == 0


def test_publish_expiration_zero_means_never():
    h = one_queue()
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 0}, expiration=0.0)
    h.commit()
    h.advance(3600.0)
    w = worker(h, "w")
    assert items(h.messages(w)) == [0]


def test_publish_expiration_on_a_topic_nothing_keeps_is_refused():
    """A topic that is not recorded: live subscribers get the message at once, no queue
    keeps it, so an expiration could only be ignored."""
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    pub = h.connect("pub")
    h.publish(pub, "Chatter", {"i": 0}, expiration=5.0, ack_type="processed")
    failure = _failure(h, pub)
    assert failure.code == "bad_expiration" and "not recorded" in failure.reason


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_publish_expiration_that_is_not_a_positive_finite_number_is_refused(bad):
    h = one_queue()
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 0}, expiration=bad, ack_type="persisted")
    h.commit()
    failure = _failure(h, pub)
    assert failure.status == "failure" and "expiration" in failure.reason
    assert h.stats("Q").queue_depth == 0  # nothing journaled


# --- replace of a bookmark subscription --------------------------------------------------------


def _replayer(h: Harness, topic: str) -> int:
    r = h.connect("replayer")
    h.subscribe(r, topic, "r", bookmark="0")
    assert h.acks(r)[0].status == "success"
    return r


def test_replace_changes_a_replay_subscription_s_topic_for_every_later_message():
    h = Harness(config_xml(queue_xml("Q"), topics=("Work", "Other")))
    pub = h.connect("pub")
    publish_all(h, pub, [{"i": 0}])
    r = _replayer(h, "Work")
    assert [x.topic for x in h.messages(r)] == ["Work"]
    h.subscribe(r, "Other", "r", options="replace")
    assert h.acks(r)[0].status == "success"
    publish_all(h, pub, [{"i": 1}], topic="Work")
    publish_all(h, pub, [{"i": 2}], topic="Other")
    got = h.messages(r)
    assert [(x.topic, items([x])[0]) for x in got] == [("Other", 2)]


def test_replace_of_a_replay_to_a_queue_name_replays_its_underlying_topic():
    """Bookmark Subscriptions to Queues: the subscription follows the queue's underlying
    topic (rule 2 of subscribing), also when a replace names the queue."""
    h = Harness(config_xml(queue_xml("Q"), topics=("Work", "Other")))
    pub = h.connect("pub")
    r = _replayer(h, "Other")
    h.subscribe(r, "Q", "r", options="replace")
    assert h.acks(r)[0].status == "success"
    publish_all(h, pub, [{"i": 0}], topic="Work")
    (got,) = h.messages(r)
    assert got.topic == "Work" and got.queue is None


def test_replace_of_a_replay_with_a_bookmark_is_refused():
    """A replace keeps the replay's place in the log: a bookmark on it would be ignored."""
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    r = _replayer(h, "Work")
    h.subscribe(r, "Work", "r", options="replace", bookmark="0")
    failure = _failure(h, r)
    assert "bookmark" in failure.reason


# --- replaying a topic that is not recorded ---------------------------------------------------


def test_a_bookmark_subscription_to_a_topic_that_is_not_recorded_is_refused():
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    r = h.connect("replayer")
    h.subscribe(r, "Chatter", "r", bookmark="0")
    failure = _failure(h, r)
    assert failure.code == "not_recorded" and "Chatter" in failure.reason
    h.subscribe(r, "Work", "w", bookmark="0")  # recorded: fine
    h.subscribe(r, "Q", "q", bookmark="0")  # a queue: its underlying topic
    assert [a.status for a in h.acks(r)] == ["success", "success"]


# --- subscribing to a name that is no queue and no recorded topic ------------------------------


def test_a_subscription_to_an_unknown_name_works_and_is_warned_about_with_the_nearest_queue():
    h = Harness(config_xml(queue_xml("WorkToDo"), topics=("Work",)))
    s = h.connect("s")
    h.subscribe(s, "WorkToDoo", "typo")
    (ack,) = h.acks(s)
    assert ack.status == "success" and "not a queue and not a recorded topic" in ack.reason
    assert "did you mean the queue 'WorkToDo'?" in ack.reason
    pub = h.connect("pub")
    h.publish(pub, "WorkToDoo", {"i": 7})
    h.commit()
    assert items(h.messages(s)) == [7]  # it works: live pub/sub
    for topic in ("Work", "WorkToDo", "^Work.*"):  # recorded, a queue, a pattern: no warning
        h.subscribe(s, topic, topic)
        (ack,) = h.acks(s)
        assert ack.status == "success" and ack.reason is None, topic


# --- JSON topics ------------------------------------------------------------------------------


def test_a_body_that_is_not_json_is_refused_on_a_json_topic_with_its_sequence():
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    pub = h.connect("pub")
    h.publish(pub, "Work", b'{"i": 0', seq=1)
    h.publish(pub, "Work", b"hello", seq=2)
    h.publish(pub, "Work", {"i": 3}, seq=3)
    h.publish(pub, "Chatter", b"not recorded: not checked", seq=4)
    h.commit()
    refused = [a for a in h.acks(pub) if a.status == "failure"]
    assert [(a.seq, a.code) for a in refused] == [(1, "bad_message"), (2, "bad_message")]
    assert "takes JSON messages" in refused[0].reason
    w = worker(h, "w", options="max_backlog=5")
    assert items(h.messages(w)) == [3]  # nothing of the refused ones was journaled


def test_a_delta_publish_resent_with_its_sequence_is_a_duplicate_not_a_crash():
    """A client resending from its publish store sends a delta publish again with the
    same sequence number: it is acknowledged as a duplicate and recorded once (it once
    raised AttributeError: a DeltaPublish has no fingerprint)."""
    import json

    from conveyor.protocol import messages as m

    sow = "<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    h = Harness(config_xml(sow, topics=("orders",)))
    pub = h.connect("pub", ack_type="persisted")
    data = json.dumps({"id": 1, "qty": 5}).encode()
    h.handle(pub, m.DeltaPublish(topic="orders", data=data, seq=1, ack_type="persisted"))
    h.handle(pub, m.DeltaPublish(topic="orders", data=data, seq=1, ack_type="persisted"))
    h.commit()
    assert sorted(a.status for a in h.acks(pub) if a.seq == 1) == ["duplicate", "success"]
    assert len([p for p in h.engine.journal.scan() if b"orders" in p[1]]) == 1
