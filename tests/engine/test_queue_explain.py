"""MaxBacklog (a queue-wide cap on outstanding messages, queue rule 6) and the explain
verdicts (engine/explain.py), on a bare Queue with virtual time."""

from __future__ import annotations

from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.explain import explain
from conveyor.engine.queue.queue import AckOption, Consumer, Queue


def make(**kw):
    data: dict[int, dict] = {}
    return Queue(QueueConfig(name="Q", message_type="json", **kw), load=data.__getitem__), data


def fill(q, data, n, start=1, **body):
    for p in range(start, start + n):
        data[p] = {"n": p, **body}
        q.enqueue(p, 0.0)


def test_max_backlog_caps_the_whole_queue():
    q, data = make(max_backlog=2)
    fill(q, data, 5)
    a, b = Consumer("A", "A", max_backlog=5), Consumer("B", "B", max_backlog=5)
    q.add_consumer(a, 0.0)
    q.add_consumer(b, 0.0)
    assert len(q.dispatch(0.0)) == 2  # not 10: two subscribers with room, one queue cap
    assert q.dispatch(0.0) == []
    q.acknowledge([1], by=None, option=AckOption.NONE, now=1.0)
    assert [d.position for d in q.dispatch(1.0)] == [3]
    assert q.statistics().backlog == 2


def test_max_backlog_counts_at_most_once_deliveries_until_acked():
    q, data = make(max_backlog=1, semantics=Semantics.AT_MOST_ONCE, fairness=Fairness.ROUND_ROBIN)
    fill(q, data, 3)
    c = Consumer("A", "A", max_backlog=5)
    q.add_consumer(c, 0.0)
    assert [d.position for d in q.dispatch(0.0)] == [1]
    assert q.dispatch(0.0) == []
    q.acknowledge([1], by="A", option=AckOption.NONE, now=0.0)
    assert [d.position for d in q.dispatch(0.0)] == [2]


def verdict(q, p, now=0.0, **kw):
    return explain(q.explain(p, now), now, **kw)


def test_explain_verdicts():
    q, data = make(lease_period_s=30.0)
    fill(q, data, 3)
    assert verdict(q, 1).verdict == "no_consumer"
    c = Consumer(("c", "s1"), "c", filter=lambda d, now: d["n"] != 3, max_backlog=1)
    q.add_consumer(c, 0.0)
    (d,) = q.dispatch(0.0)
    e = verdict(q, d.position, 10.0, client_of=lambda key: "worker")
    assert e.verdict == "leased" and e.holder == "c/s1" and e.holder_client == "worker"
    assert e.lease_deadline == 30.0 and "20.0 s left" in e.summary
    assert verdict(q, 2).verdict == "backlog_full"
    e = verdict(q, 3, filter_of=lambda key: "/n <> 3")
    assert e.verdict == "filtered_out" and e.subscribers[0].filter == "/n <> 3"
    assert verdict(q, 99).verdict == "done"
    q.acknowledge([1], by="c", option=AckOption.NONE, now=1.0)
    assert verdict(q, 1).verdict == "done"
    e = verdict(q, 2)
    assert e.verdict == "deliverable" and e.ahead == 0


def test_explain_target_queue_depth_and_barrier():
    q, data = make(target_queue_depth=1)
    fill(q, data, 3)
    assert verdict(q, 1).verdict == "no_consumer"
    e = verdict(q, 2)
    assert e.verdict == "beyond_target_depth" and e.state == "inactive"
    q, data = make(barrier_expression="/b = 1")
    data[1], data[2], data[3] = {"b": 0}, {"b": 1}, {"b": 0}
    q.enqueue(1, 0.0)
    q.enqueue(2, 0.0, barrier=True)
    q.enqueue(3, 0.0)
    c = Consumer("A", "A", max_backlog=5)
    q.add_consumer(c, 0.0)
    assert [d.position for d in q.dispatch(0.0)] == [1]
    assert verdict(q, 2).verdict == "barrier_waiting"
    assert verdict(q, 3).verdict == "behind_barrier"


def test_explain_does_not_count_filter_errors():
    q, data = make()
    fill(q, data, 1)
    c = Consumer("A", "A", filter=lambda d, now: 1 / 0, max_backlog=1)
    q.add_consumer(c, 0.0)
    assert verdict(q, 1).verdict == "filtered_out"
    assert q.statistics().filter_errors == 0


def test_explain_says_where_a_message_comes_from_and_knows_a_made_up_bookmark():
    """Through the engine: a real message's explanation names its topic, publisher and
    sequence; an acknowledged one is "done"; a bookmark no publish has is "unknown"
    (it was "done", like an acknowledged message)."""
    from .engine_harness import Harness, config_xml, queue_xml

    h = Harness(config_xml(queue_xml("WorkToDo", underlying="Work"), topics=("Work",)))
    pub, worker = h.connect("pub"), h.connect("worker")
    h.publish(pub, "Work", {"n": 1})
    h.commit()
    h.subscribe(worker, "WorkToDo", options="max_backlog=1")
    (msg,) = h.messages(worker, "WorkToDo")
    e = h.engine.explain("WorkToDo", msg.bookmark, h.now)
    assert e.verdict == "leased" and any("published to topic 'Work'" in r for r in e.reasons), e
    h.ack(worker, "WorkToDo", msg)
    h.commit()
    assert h.engine.explain("WorkToDo", msg.bookmark, h.now).verdict == "done"
    publisher, seq, position = msg.bookmark.split("|")
    for made_up in (f"{publisher}|{int(seq) + 7}|{position}", f"{publisher}|{seq}|{int(position) + 3}", "123456"):
        assert h.engine.explain("WorkToDo", made_up, h.now).verdict == "unknown", made_up
