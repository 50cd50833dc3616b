"""Crash and recovery through the journal (spec 000, "Startup and Recovery for Queues").

The rule under test (the issue's words): after SIGKILL, unacknowledged at-least-once
messages come back, acknowledged ones never do, and at-most-once messages already
delivered never do. "Acknowledged" and "delivered" mean: their journal record was
durable when the process died. A crash here is exact (engine_harness.Harness.crash):
a new MemoryJournal on the old store keeps every committed record and nothing else, and
a new Engine recovers from it.
"""

from __future__ import annotations


from conveyor import records

from .engine_harness import Harness, config_xml, decode, queue_xml

LEASE_S = 10.0


def harness(**elements) -> Harness:
    elements.setdefault("LeasePeriod", f"{LEASE_S:g}s")
    return Harness(config_xml(queue_xml("Q", **elements), topics=("Work",)))


def items(messages) -> list:
    return [decode(x)["i"] for x in messages]


def consumer(h: Harness, name: str = "w", backlog: int = 10, topic: str = "Q") -> int:
    conn = h.connect(name)
    h.subscribe(conn, topic, "s", options=f"max_backlog={backlog}")
    assert h.acks(conn)[0].status == "success"
    return conn


def publish(h: Harness, pub: int, values, topic: str = "Work") -> None:
    for v in values:
        h.publish(pub, topic, {"i": v})


def journal_records(h: Harness) -> list:
    return [records.decode(payload) for _, payload in h.journal.scan()]


def test_unacknowledged_at_least_once_messages_come_back_after_a_crash():
    """Startup and Recovery for Queues: the state of the queue is rebuilt from the
    transaction log; a lease does not survive the restart, so every unacknowledged
    message (leased or never delivered) is delivered again."""
    h = harness()
    pub = h.connect("pub")
    w = consumer(h, backlog=2)
    publish(h, pub, range(4))
    h.commit()
    assert items(h.messages(w)) == [0, 1]
    h.crash()
    w = consumer(h)
    assert items(h.messages(w)) == [0, 1, 2, 3]


def test_acknowledged_messages_never_come_back_once_the_ack_is_durable():
    """Startup and Recovery for Queues: "when a message is acknowledged, the acknowledgment
    is also recorded in the transaction log" (chapter introduction), so it survives."""
    h = harness()
    pub = h.connect("pub")
    w = consumer(h, backlog=4)
    publish(h, pub, range(4))
    h.commit()
    got = h.messages(w)
    h.ack(w, "Q", [got[0], got[2]])
    h.commit()
    h.crash()
    w = consumer(h)
    assert items(h.messages(w)) == [1, 3]
    h.crash()  # and again: recovery itself must not bring anything back
    w = consumer(h)
    assert items(h.messages(w)) == [1, 3]


def test_an_acknowledgement_lost_in_the_crash_means_the_message_comes_back():
    """Delivery Semantics, at-least-once: a message is redelivered "until the message is
    either explicitly acknowledged ..."; an ack whose record was not durable at the crash
    did not happen, and at-least-once prefers a duplicate to a loss."""
    h = harness()
    pub = h.connect("pub")
    w = consumer(h)
    publish(h, pub, range(3))
    h.commit()
    got = h.messages(w)
    h.ack(w, "Q", got[0])
    h.commit()
    h.ack(w, "Q", got[1:])  # not committed
    h.crash()
    w = consumer(h)
    assert items(h.messages(w)) == [1, 2]


def test_a_publish_lost_in_the_crash_never_reaches_the_queue_and_its_sequence_is_free():
    """Startup and Recovery for Queues with core rule 1: only durable publishes are in the
    queue; an undurable one is lost with the crash, and the publisher may send it again
    with the same sequence number (its logon ack reports the highest durable one)."""
    h = harness()
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 1}, seq=1)
    h.commit()
    h.publish(pub, "Work", {"i": 2}, seq=2)
    h.crash()
    pub = h.connect("pub")
    w = consumer(h)
    assert items(h.messages(w)) == [1]
    h.publish(pub, "Work", {"i": 2}, seq=2, ack_type="processed")
    h.publish(pub, "Work", {"i": 1}, seq=1, ack_type="processed")  # durable: a duplicate
    h.commit()
    assert [a.status for a in h.acks(pub)] == ["success", "duplicate"]
    assert items(h.messages(w)) == [2]


def test_at_most_once_messages_delivered_before_the_crash_never_come_back():
    """Delivery Semantics, at-most-once: "the message will not be redelivered even if the
    subscriber fails to process the message"; the delivery record is durable before the
    message is sent, so it survives every crash after the send."""
    h = harness(Semantics="at-most-once")
    pub = h.connect("pub")
    w = consumer(h, backlog=2)
    publish(h, pub, range(4))
    h.commit()
    assert items(h.messages(w)) == [0, 1]
    h.crash()
    w = consumer(h)
    h.commit()
    assert items(h.messages(w)) == [2, 3]
    h.crash()
    w = consumer(h)
    h.commit()
    assert h.messages(w) == []


def test_at_most_once_delivery_not_yet_durable_at_the_crash_is_delivered_once_after_it():
    """Core rule 2: a delivery record not durable at the crash means the message was never
    sent; it is still in the queue after the restart and is delivered exactly once."""
    h = harness(Semantics="at-most-once")
    pub = h.connect("pub")
    w = consumer(h)
    publish(h, pub, range(2))
    h.commit(rounds=1)  # publishes durable, deliveries journaled but not durable
    assert h.messages(w) == []
    h.crash()
    w = consumer(h)
    h.commit()
    assert items(h.messages(w)) == [0, 1]


def test_a_crash_after_the_write_but_before_durability_was_reported_keeps_the_records():
    """Startup and Recovery for Queues: recovery reads what is in the transaction log,
    whether or not the old process learnt that it was durable (write_batch done,
    mark_durable not)."""
    h = harness()
    pub = h.connect("pub")
    w = consumer(h)
    publish(h, pub, range(2))
    h.commit()
    got = h.messages(w)
    h.ack(w, "Q", got[0])
    batch = h.journal.take_batch()
    h.journal.write_batch(batch)  # on disk; the engine never hears of it
    h.crash()
    w = consumer(h)
    assert items(h.messages(w)) == [1]


def test_delivery_counts_survive_a_restart_max_deliveries():
    """Handling Unprocessed Messages: MaxDeliveries limits the deliveries of a message, and
    docs/queues.md: a lease broken by a restart counts. MaxDeliveries 2: delivered once,
    crash, delivered again, crash: the restart expires it instead of a third delivery."""
    h = harness(MaxDeliveries=2)
    pub = h.connect("pub")
    w = consumer(h, backlog=1)
    publish(h, pub, [0, 1])
    h.commit()
    assert items(h.messages(w)) == [0]
    h.commit()
    h.crash()
    w = consumer(h, backlog=1)
    assert items(h.messages(w)) == [0]
    h.commit()
    h.crash()
    w = consumer(h, backlog=5)
    assert items(h.messages(w)) == [1]
    # The restart expired it, and the server made that durable before serving.
    expired = [r for r in journal_records(h) if isinstance(r, records.ExpiredRec)]
    assert [(r.queue, r.reasons) for r in expired] == [("Q", "max_deliveries")]


def test_delivery_counts_survive_a_restart_together_with_lease_expiries():
    """Message Flow (at-least-once), step 6, across a restart: one delivery ended by its
    lease before the crash and one ended by the crash make two (MaxDeliveries 2)."""
    h = harness(MaxDeliveries=2)
    pub = h.connect("pub")
    w = consumer(h, backlog=1)
    publish(h, pub, [0])
    h.commit()
    h.disconnect(w)  # first delivery, lease broken
    w = consumer(h, backlog=1)
    assert items(h.messages(w)) == [0]  # second delivery
    h.commit()
    h.crash()
    w = consumer(h)
    assert h.messages(w) == []
    assert h.stats("Q").queue_depth == 0


def test_cancel_counts_survive_a_restart_max_cancels():
    """Handling Unprocessed Messages: MaxCancels 3 expires a message on its 3rd cancel, and
    the count is in the transaction log, so a restart does not reset it."""
    h = harness(MaxCancels=3)
    pub = h.connect("pub")
    w = consumer(h, backlog=1)
    publish(h, pub, [0, 1])
    h.commit()
    for _ in range(2):
        (got,) = h.messages(w)
        h.ack(w, "Q", got, options="cancel")
    h.commit()
    h.crash()
    w = consumer(h, backlog=1)
    (got,) = h.messages(w)
    assert decode(got)["i"] == 0
    h.ack(w, "Q", got, options="cancel")  # the 3rd
    assert items(h.messages(w)) == [1]
    assert h.stats("Q").expired == 1


def test_an_expired_message_stays_expired_after_a_restart():
    """Acknowledging Messages (expire) and Message Flow step 5: expiry is a way out of the
    queue and is journaled like an ack."""
    h = harness(Expiration="30s")
    pub = h.connect("pub")
    w = consumer(h, backlog=1)
    publish(h, pub, [0, 1, 2])
    h.commit()
    (got,) = h.messages(w)
    h.ack(w, "Q", got, options="expire")
    h.commit()
    h.crash()
    w = consumer(h, backlog=1)
    (got,) = h.messages(w)
    assert decode(got)["i"] == 1
    h.disconnect(w)
    h.advance(30.0)  # 1 and 2 reach their Expiration
    h.commit()
    h.crash()
    w = consumer(h)
    assert h.messages(w) == []
    assert h.stats("Q").queue_depth == 0


def test_messages_past_their_expiration_at_restart_are_not_delivered():
    """Message Flow step 5 across a restart: recovery keeps the publish time, so a message
    older than Expiration when the server comes back expires instead of being
    delivered (here the timer has not fired before the first subscribe)."""
    h = harness(Expiration="30s")
    pub = h.connect("pub")
    publish(h, pub, [0])
    h.commit()
    h.advance(20.0)
    publish(h, pub, [1])
    h.commit()
    h.crash(now=h.now + 15.0)  # 0 is 35s old, 1 is 15s old
    w = consumer(h)
    assert items(h.messages(w)) == [1]


def test_duplicate_detection_survives_a_restart():
    """Engine rule 3 (spec 002) across a restart: the highest sequence of each publisher is
    rebuilt from the journal, so a resend of a durable message is still a duplicate and
    never enters the queue twice."""
    h = harness()
    pub = h.connect("pub")
    for seq in (1, 2, 3):
        h.publish(pub, "Work", {"i": seq}, seq=seq)
    h.commit()
    h.crash()
    pub = h.connect("pub")
    w = consumer(h)
    for seq in (2, 3, 4):
        h.publish(pub, "Work", {"i": seq}, seq=seq)
    h.commit()
    assert items(h.messages(w)) == [1, 2, 3, 4]


def test_recovery_reads_the_journal_once_and_is_stable_across_repeated_crashes():
    """Startup and Recovery for Queues: replaying the same transaction log gives the same
    queue, however often it happens."""
    h = harness(MaxDeliveries=3, MaxCancels=2)
    pub = h.connect("pub")
    w = consumer(h, backlog=3)
    publish(h, pub, range(6))
    h.commit()
    got = h.messages(w)
    h.ack(w, "Q", got[0])
    h.ack(w, "Q", got[1], options="cancel")
    h.ack(w, "Q", got[2], options="expire")
    h.commit()
    h.crash()
    first = h.queue("Q").details()
    for _ in range(3):
        h.crash()
        assert h.queue("Q").details() == first
    w = consumer(h)
    assert sorted(items(h.messages(w))) == [1, 3, 4, 5]


# --- checkpoints: queues.ack and publishers.seq --------------------------------------------------


def test_a_checkpoint_taken_while_a_publish_is_not_yet_durable_does_not_skip_it():
    """Startup and Recovery for Queues: recovery starts "from the most recent point in the
    transaction log at which all previous messages have been acknowledged". A publish
    appended but not yet applied when the checkpoint is taken is not acknowledged, so the
    point must not pass it (regression: the point of an empty queue was the journal's end,
    and the message was lost after a crash; fixed in Engine.checkpoint)."""
    h = harness()
    pub = h.connect("pub")
    publish(h, pub, [0])  # appended, not durable, not in the queue yet
    h.checkpoint()  # the server's timer fires now...
    h.commit()  # ...and writes it once the journal is durable up to its position
    assert h.written_checkpoint is not None
    h.crash()
    w = consumer(h)
    assert items(h.messages(w)) == [0]


def test_recovery_from_a_checkpoint_rebuilds_the_same_queue_as_from_the_whole_journal():
    """Startup and Recovery for Queues: starting from the point stored in queues.ack is an
    optimisation; the queue it rebuilds (messages, delivery and cancel counts) is the one
    a replay of the whole transaction log gives."""
    h = harness(MaxDeliveries=5, MaxCancels=5)
    pub = h.connect("pub")
    w = consumer(h, backlog=3)
    publish(h, pub, range(8))
    h.commit()
    got = h.messages(w)
    h.ack(w, "Q", got[0])
    h.ack(w, "Q", got[1], options="cancel")
    h.commit()
    h.checkpoint()
    h.commit()
    got = h.messages(w)
    h.ack(w, "Q", got[0], options="expire")
    publish(h, pub, [8, 9])
    h.commit()
    h.crash()  # from the checkpoint
    from_checkpoint = h.queue("Q").details()
    h.crash(checkpoint=False)  # from the whole journal
    assert h.queue("Q").details() == from_checkpoint
    w = consumer(h)
    assert items(h.messages(w)) == [1, 2, 4, 5, 6, 7, 8, 9]


def test_duplicate_detection_survives_a_restart_from_a_checkpoint():
    """Engine rule 3 with publishers.seq: the highest sequence of each publisher comes from
    the checkpoint and the journal after it, so a resend is still a duplicate."""
    h = harness()
    pub = h.connect("pub")
    for seq in (1, 2):
        h.publish(pub, "Work", {"i": seq}, seq=seq)
    h.commit()
    h.checkpoint()
    h.publish(pub, "Work", {"i": 3}, seq=3)
    h.commit()
    h.crash()
    pub = h.connect("pub", ack_type="processed")
    assert h.acks(pub)[0].seq == 3
    w = consumer(h)
    for seq in (1, 3, 4):
        h.publish(pub, "Work", {"i": seq}, seq=seq)
    h.commit()
    assert items(h.messages(w)) == [1, 2, 3, 4]


def test_a_queue_with_a_recovery_point_keeps_its_messages_when_no_checkpoint_was_written():
    """Startup and Recovery for Queues: the configured RecoveryPoint applies only to "a new
    queue, or [when] the configured RecoveryPoint for the queue has changed"; otherwise
    recovery starts where everything before is acknowledged. server/checkpoints.py: "a
    missing or unreadable file is not an error: recovery then scans the whole journal,
    which is always correct"."""
    h = harness(RecoveryPoint="NOW")
    pub = h.connect("pub")
    publish(h, pub, [0])
    h.commit()
    assert h.stats("Q").queue_depth == 1
    h.crash()  # within the first CHECKPOINT_INTERVAL_S: only the startup checkpoint exists
    w = consumer(h)
    assert items(h.messages(w)) == [0]


def _reconfigure(h: Harness, sow: str) -> None:
    """The next start reads another configuration (queues added or changed)."""
    from conveyor.config import load_text

    h.config = load_text(config_xml(sow, topics=("Work", "Other")))


def test_recovery_point_creation_is_where_the_log_ended_when_the_queue_was_first_seen():
    """RecoveryPoint ``creation`` (recovery rule 1): a new queue starts at the end of the
    log, like ``now``; an existing queue whose RecoveryPoint changes to ``creation``
    replays its own history from its creation point: what it acknowledged stays
    acknowledged, and nothing published before it existed comes in."""
    h = harness()
    _reconfigure(h, queue_xml("Elsewhere", underlying="Other"))
    h.crash()
    pub = h.connect("pub")
    publish(h, pub, [0, 1, 2])  # before Q exists
    h.commit()
    _reconfigure(h, queue_xml("Q", LeasePeriod=f"{LEASE_S:g}s"))  # Q appears, RecoveryPoint epoch
    h.crash()
    pub = h.connect("pub")
    publish(h, pub, [3, 4])
    h.commit()
    w = consumer(h)
    got = h.messages(w)
    assert items(got) == [0, 1, 2, 3, 4]  # epoch: the whole log
    h.ack(w, "Q", got[3])  # 3 is done
    h.commit()
    h.checkpoint()
    h.commit()
    _reconfigure(h, queue_xml("Q", LeasePeriod=f"{LEASE_S:g}s", RecoveryPoint="creation"))
    h.crash()
    assert items(h.messages(consumer(h))) == [4]
    h.crash()  # unchanged RecoveryPoint: the checkpoint's point, the same messages
    assert items(h.messages(consumer(h))) == [4]


def test_a_new_queue_with_recovery_point_creation_starts_at_the_end_of_the_log():
    h = harness()
    _reconfigure(h, queue_xml("Elsewhere", underlying="Other"))
    h.crash()
    pub = h.connect("pub")
    publish(h, pub, [0, 1])
    h.commit()
    _reconfigure(h, queue_xml("Q", LeasePeriod=f"{LEASE_S:g}s", RecoveryPoint="creation"))
    h.crash()
    pub = h.connect("pub")
    publish(h, pub, [2])
    h.commit()
    h.crash()
    assert items(h.messages(consumer(h))) == [2]
