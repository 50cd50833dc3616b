"""Paths the spec tests and the simulation reach rarely: shared consumers changed through
another queue, re-attachment, the lease-deadline heap, refused input."""

from __future__ import annotations

import math

import pytest

from conveyor.config.model import QueueConfig
from conveyor.engine.queue.queue import AckOption, Consumer, Queue, QueueStateError
from conveyor.errors import InvalidOption


def make(name="Q", **kw):
    data: dict[int, dict] = {}
    return Queue(QueueConfig(name=name, message_type="json", **kw), load=data.__getitem__), data


def test_shared_consumer_filter_replaced_through_another_queue():
    """The engine may replace a shared consumer on one queue only; the other queue sees
    the new filter at its next dispatch (its cursor is rebuilt)."""
    q1, data = make("Q1")
    q2 = Queue(QueueConfig(name="Q2", message_type="json"), load=data.__getitem__)
    for p, k in ((1, 1), (2, 2)):
        data[p] = {"k": k}
        q2.enqueue(p, 0.0)
    c = Consumer("A", "A", filter=lambda d, now: d["k"] == 1, max_backlog=5)
    q1.add_consumer(c, 0.0)
    q2.add_consumer(c, 0.0)
    assert [d.position for d in q2.dispatch(0.0)] == [1]
    q1.replace_consumer(c, filter=lambda d, now: d["k"] == 2, max_backlog=5, now=0.0)
    assert [d.position for d in q2.dispatch(0.0)] == [2]


def test_detached_consumer_is_attached_again_by_replace():
    q, data = make()
    data[1] = {}
    q.enqueue(1, 0.0)
    c = Consumer("A", "A")
    q.add_consumer(c, 0.0)
    q.detach_consumer(c, 0.0)
    assert q.dispatch(0.0) == [] and q.statistics().consumers == 0
    q.replace_consumer(c, filter=None, max_backlog=1, now=0.0)
    assert [d.position for d in q.dispatch(0.0)] == [1]


def test_next_deadline_is_the_earliest_live_lease_after_many_acks():
    """Acked leases leave stale deadlines behind (queue/leases.py rule 3; the bound on the
    heap is tested in test_queue_parts); next_deadline skips them."""
    q, data = make(lease_period_s=100.0)
    c = Consumer("A", "A", max_backlog=1)
    q.add_consumer(c, 0.0)
    for i in range(1000):
        data[i] = {}
        q.enqueue(i, 0.0)
        (d,) = q.dispatch(float(i))
        if i < 999:
            q.acknowledge([d.position], by="A", option=AckOption.NONE, now=float(i))
    assert q.next_deadline() == 999.0 + 100.0
    assert [type(e).__name__ for e in q.expire(1099.0)] == ["LeaseExpired"]


def test_refused_input():
    q, data = make()
    with pytest.raises(QueueStateError):
        q.enqueue(1, math.nan)
    with pytest.raises(InvalidOption):
        Consumer("A", "A", max_backlog=-1)
    c = Consumer("A", "A")
    q.add_consumer(c, 0.0)
    with pytest.raises(InvalidOption):
        q.replace_consumer(c, filter=None, max_backlog=-2, now=0.0)
    assert "A" in repr(c) and "Q" in repr(q)


def test_dispatch_budget():
    q, data = make()
    for p in range(5):
        data[p] = {}
        q.enqueue(p, 0.0)
    q.add_consumer(Consumer("A", "A", max_backlog=5), 0.0)
    assert len(q.dispatch(0.0, max_deliveries=2)) == 2
    assert q.dispatch(0.0, max_deliveries=0) == []
    assert len(q.dispatch(0.0)) == 3


def test_candidates_of_a_full_filtered_consumer_stay_bounded():
    """Messages that keep coming back behind a full filtered consumer's cursor are
    offered to it once it has room (the bound on its candidate heap is tested in
    test_queue_parts)."""
    q, data = make(lease_period_s=1.0)
    for p in range(4):
        data[p] = {"k": 1}
        q.enqueue(p, 0.0)
    fast = Consumer("fast", "f", max_backlog=3)
    q.add_consumer(fast, 0.0)
    assert [d.position for d in q.dispatch(0.0)] == [0, 1, 2]
    slow = Consumer("slow", "s", filter=lambda d, now: d["k"] == 1, max_backlog=1)
    q.add_consumer(slow, 0.0)
    assert [d.position for d in q.dispatch(0.0)] == [3]  # slow's cursor is now past 0..2
    for i in range(500):
        q.acknowledge([0, 1, 2], by="f", option=AckOption.CANCEL, now=float(i))
        assert [d.position for d in q.dispatch(float(i))] == [0, 1, 2]  # slow is full
    q.acknowledge([3], by="s", option=AckOption.NONE, now=500.0)
    q.acknowledge([0], by="f", option=AckOption.CANCEL, now=500.0)
    assert [(d.consumer.key, d.position) for d in q.dispatch(500.0)] == [("slow", 0)]


def _state(q: Queue) -> tuple:
    s = q.export_state()
    return (s.last_position, s.last_time, [(c.first, list(c.positions or ()), list(c.times or ())) for c in s.chunks],
            s.expiries, q.statistics().enqueued, q.next_deadline())


@pytest.mark.parametrize("kw", [{}, {"expiration_s": 30.0}, {"target_queue_depth": 2}],
                         ids=["fifo", "expiration", "tqd"])
def test_a_run_enqueues_as_each_message_would(kw):
    """Queue.enqueue_run: the same state as enqueue of each (publish times clamped along
    positions), whether it goes in one pass (FIFO) or one by one (TargetQueueDepth)."""
    runs = [([3, 5, 8], [10.0, 9.0, 12.0]), ([9], [11.0]), ([], []), ([20, 21], [13.0, 13.0])]
    one, _ = make(**kw)
    each, _ = make(**kw)
    for positions, times in runs:
        one.enqueue_run(positions, times)
        for p, t in zip(positions, times):
            each.enqueue(p, t)
    assert _state(one) == _state(each)


def test_a_run_with_its_own_expiry_kept_per_message():
    """After a message with an expiry of its own, the queue keeps Expiration per message:
    a run's messages get theirs too."""
    one, _ = make(expiration_s=30.0)
    each, _ = make(expiration_s=30.0)
    for q in (one, each):
        q.enqueue(1, 5.0, expires_at=7.0)
    one.enqueue_run([2, 3], [6.0, 8.0])
    each.enqueue(2, 6.0)
    each.enqueue(3, 8.0)
    assert _state(one) == _state(each) and _state(one)[3]


@pytest.mark.parametrize("positions, times, error", [
    ([4, 6], [1.0, 2.0], "not above"),  # 4 is not above 5
    ([6, 7], [1.0, math.nan], "NaN"),
])
def test_a_refused_run_changes_nothing(positions, times, error):
    q, _ = make()
    q.enqueue(5, 0.0)
    before = _state(q)
    with pytest.raises(QueueStateError, match=error):
        q.enqueue_run(positions, times)
    assert _state(q) == before


def _two_consumers_holding(**kw):
    """A queue of messages 0..9 whose consumers A and B hold eight of them (backlog 4
    each)."""
    q, data = make(**kw)
    for p in range(10):
        data[p] = {}
        q.enqueue(p, 0.0)
    a, b = Consumer("A", "A", max_backlog=4), Consumer("B", "B", max_backlog=4)
    q.add_consumer(a, 0.0)
    q.add_consumer(b, 0.0)
    assert len(q.dispatch(0.0)) == 8
    return q, a, b


@pytest.mark.parametrize("asked, by, kw", [
    ([0, 1, 2, 3, 4, 5], None, {}),  # all leased, two seats: the one pass
    ([0, 1, 1, 2], None, {}),  # a message named twice
    ([0, 1, 9, 42], None, {}),  # one available, one unknown
    ([0, 1, 2, 3], "A", {"leasing": "strict"}),  # B's messages refused
    ([0, 2, 4], "A", {"leasing": "sublet"}),
])
def test_an_ack_in_one_pass_has_the_outcome_of_one_message_at_a_time(asked, by, kw):
    """Queue.acknowledge takes a list of leased messages, each named once and none
    refused, in one pass (module header, rule 5); anything else message by message. Both
    give the same result, statistics, backlogs and next deliveries as acknowledging the
    same messages one at a time (a tuple never takes the one pass)."""
    from conveyor.config.model import Leasing

    if "leasing" in kw:
        kw = {"leasing": Leasing(kw["leasing"])}
    q1, a1, b1 = _two_consumers_holding(**kw)
    q2, a2, b2 = _two_consumers_holding(**kw)
    one_pass = q1.acknowledge(list(asked), by=by, option=AckOption.NONE, now=1.0)
    each = q2.acknowledge(tuple(asked), by=by, option=AckOption.NONE, now=1.0)
    assert one_pass == each
    assert (a1.outstanding, b1.outstanding) == (a2.outstanding, b2.outstanding)
    assert q1.statistics(1.0) == q2.statistics(1.0)
    assert [(d.position, d.consumer.key) for d in q1.dispatch(1.0)] == [
        (d.position, d.consumer.key) for d in q2.dispatch(1.0)]
