"""engine/queue/replica.py: the replica state of a replicated queue's messages.

Rule 4: the messages not yet asked for are kept apart, in the order they came, so a
transfer look reads only those (and the requests due again). Rules 1 and 5: a message
that leaves the queue for good (acknowledged, expired, delivered at most once), live or
replayed, loses its identity, epoch and request through the queue's own transition
table, with nobody outside the queue telling the replica part."""

from __future__ import annotations

import pytest

from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.queue.queue import AckOption, Consumer, Queue
from conveyor.engine.queue.replica import LEFT_MAX, Replica, columns_of, ident_of, idents_of, publisher_of, seq_of


def test_asked_messages_leave_the_unasked_view_and_nothing_else():
    e = Replica()
    for p, arrived in ((30, 1.0), (10, 2.0), (20, 3.0)):
        e.add(p, "A", published_at=0.5, key=p, arrived=arrived)
    assert [p for p, _ in e.unasked()] == [30, 10, 20]  # the order they came, not by position
    e.asked([30])
    assert [p for p, _ in e.unasked()] == [10, 20]
    assert 30 in e and len(e) == 3 and [p for p, _ in e.in_arrival_order()] == [30, 10, 20]


def test_a_new_owner_shows_in_both_views_and_a_taken_message_in_neither():
    e = Replica()
    e.add(1, "A", 0.0, 1, 1.0)
    e.add(2, "A", 0.0, 2, 2.0)
    e.asked([1])
    e.set_owner(1, "C")
    e.set_owner(2, "C")
    assert e.get(1).owner == "C" and dict(e.unasked())[2].owner == "C"
    assert e.take(2).owner == "C" and e.take(1).owner == "C"
    assert not e and list(e.unasked()) == []
    e.asked([1])  # a message that left: nothing to do


@pytest.mark.parametrize("publisher", [0, 1, 7, 2**63 - 1, 2**64 - 1, -1])
def test_every_publisher_and_seq_has_its_own_identity_and_gets_it_back(publisher):
    """Any MessagePack integer is a seq (-2**63 .. 2**64 - 1): no two pairs share an
    identity, and each pair comes back whole."""
    seqs = [-2**63, -1, 0, 1, 2**40 - 1, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
    idents = [ident_of(publisher, s) for s in seqs] + [ident_of(publisher + 1, s) for s in seqs]
    assert len(set(idents)) == len(idents)
    assert [(publisher_of(i), seq_of(i)) for i in idents[:len(seqs)]] == [(publisher, s) for s in seqs]
    assert columns_of(idents_of([publisher] * len(seqs), seqs)) == ([publisher] * len(seqs), seqs)


def test_requests_come_due_oldest_first_and_a_repeat_moves_to_the_end():
    e = Replica()
    e.requested(ident_of(1, 1), 0.0, 1)
    e.requested(ident_of(1, 2), 1.0, 1)
    assert e.requests_due(2.5, 2.0) == ([(ident_of(1, 1), 1)], 3.0)
    e.requested(ident_of(1, 1), 2.5, 2)
    assert e.requests_due(10.0, 2.0) == ([(ident_of(1, 2), 1), (ident_of(1, 1), 2)], None)
    assert e.oldest_request() == 1.0 and e.requests_in_flight() == 2


def _queue(semantics: Semantics = Semantics.AT_LEAST_ONCE, replicated: bool = True) -> Queue:
    config = QueueConfig(name="Q", message_type="json", semantics=semantics, fairness=Fairness.ROUND_ROBIN,
                         expiration_s=5.0)
    return Queue(config, load=lambda p: {}, replicated=replicated)


@pytest.mark.parametrize("how", ["ack", "expire", "at_most_once", "replayed_ack", "replicated_removal"])
def test_a_message_that_leaves_loses_its_identity_epoch_and_request(how):
    semantics = Semantics.AT_MOST_ONCE if how == "at_most_once" else Semantics.AT_LEAST_ONCE
    q = _queue(semantics)
    replica = q.replica
    q.enqueue(1, 0.0, ident=ident_of(7, 1))
    q.enqueue(2, 3.0, ident=ident_of(7, 2))
    replica.set_epoch(ident_of(7, 1), (1, "A", "B"))
    replica.requested(ident_of(7, 1), 0.0, 1)
    if how == "ack":
        q.acknowledge([1], by=None, option=AckOption.NONE, now=1.0)
    elif how == "expire":
        q.expire(5.5)  # Expiration 5 s: 1 is due, 2 is not
    elif how == "at_most_once":
        q.add_consumer(Consumer("c", "c", max_backlog=1), 1.0)
        q.dispatch(1.0)
    elif how == "replayed_ack":
        q.replay.acknowledged(1)
    else:
        q.transfers.remove_replicated(1, "ack", 1.0)
    assert replica.ident(1) is None and replica.position(ident_of(7, 1)) is None
    assert replica.epoch(ident_of(7, 1)) is None and replica.requests_in_flight() == 0
    assert replica.position_recorded(ident_of(7, 1)) == 1  # a recent leaver
    assert replica.ident(2) == ident_of(7, 2) and replica.size == 1


def test_a_queue_that_is_not_replicated_keeps_no_identities():
    q = _queue(replicated=False)
    q.enqueue(1, 0.0)
    q.acknowledge([1], by=None, option=AckOption.NONE, now=1.0)
    assert q.replica.size == 0 and q.replica.position_recorded(ident_of(7, 1)) is None


def test_recent_leavers_are_bounded():
    e = Replica()
    for p in range(2 * LEFT_MAX + 5):
        e.entered(p, ident_of(1, p))
        e.left([p])
    # the oldest go in one batch once twice the bound is passed; the newest LEFT_MAX stay
    newest = 2 * LEFT_MAX + 4
    assert e.position_recorded(ident_of(1, 0)) is None and e.position_recorded(ident_of(1, newest)) == newest
    assert e.position_recorded(ident_of(1, LEFT_MAX + 5)) == LEFT_MAX + 5
    assert len(list(e.leavers()[0])) <= 2 * LEFT_MAX and e.size == 0


def test_a_replicated_queue_with_an_ordering_key_forgets_identities_and_releases_keys():
    """Both parts hear of a message that leaves: the replica part's observer is not
    replaced by the OrderingKey part's (each is told, a batch in one call)."""
    config = QueueConfig(name="Q", message_type="json", ordering_key="/c")
    q = Queue(config, load=lambda p: None, replicated=True)
    for p, key in enumerate("xxy"):
        q.enqueue(p, 0.0, ident=ident_of(7, p), ordering_key=key)
    q.add_consumer(Consumer("c", "o", max_backlog=10), 0.0)
    assert [d.position for d in q.dispatch(0.0)] == [0, 2]
    q.acknowledge([0, 2], by=None, option=AckOption.NONE, now=1.0)
    assert q.replica.position(ident_of(7, 0)) is None and q.replica.position(ident_of(7, 2)) is None
    assert q.replica.position_recorded(ident_of(7, 0)) == 0 and q.replica.size == 1
    assert [d.position for d in q.dispatch(1.0)] == [1]  # x's next, released by the key part
    q.keys.check()
    q.check_invariants()
