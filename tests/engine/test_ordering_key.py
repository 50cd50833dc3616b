"""Per-key ordering (docs/queues.md, "Per-key ordering"; engine/queue/keys.py): with
``OrderingKey`` at most ``MaxInFlightPerKey`` messages of one key are leased at a time,
in publish order; other keys flow; cancels, lease expiries and restarts never reorder a
key. Virtual time (tests/engine/engine_harness.py), through the whole engine."""

from __future__ import annotations

import pytest

from conveyor.config import load_text
from conveyor.config.model import QueueConfig
from conveyor.engine.explain import explain_message
from conveyor.engine.queue.queue import AckOption, Consumer, Queue
from conveyor.errors import ConfigError

from .engine_harness import Harness, config_xml, decode, queue_xml


def setup(messages: list[tuple[str, int]], workers: int = 2, backlog: int = 5,
          **elements) -> tuple[Harness, int, list[int]]:
    """Queue Q over Work with OrderingKey /c; ``messages`` ({"c": key, "i": i}) published
    before ``workers`` subscribers (backlog ``backlog``) arrive."""
    elements.setdefault("OrderingKey", "/c")
    h = Harness(config_xml(queue_xml("Q", **elements), topics=("Work",)))
    pub = h.connect("pub")
    for c, i in messages:
        h.publish(pub, "Work", {"c": c, "i": i} if c else {"i": i})
    h.commit()
    ws = []
    for n in range(workers):
        w = h.connect(f"w{n}")
        h.subscribe(w, "Q", "s", options=f"max_backlog={backlog}")
        ws.append(w)
    h.commit()
    return h, pub, ws


def taken(h: Harness, w: int) -> list:
    return h.messages(w, "Q")


def ids(msgs) -> list[tuple[str, int]]:
    return [(decode(m).get("c"), decode(m)["i"]) for m in msgs]


def test_n1_one_message_per_key_in_flight_in_publish_order_with_two_workers():
    h, _, (a, b) = setup([("x", 0), ("x", 1), ("y", 2), ("x", 3), ("y", 4)])
    first = taken(h, a) + taken(h, b)
    assert sorted(ids(first)) == [("x", 0), ("y", 2)]  # one per key, the oldest
    order = {"x": [], "y": []}
    pending = first
    while pending:
        nxt = []
        for msg in pending:
            c, i = decode(msg)["c"], decode(msg)["i"]
            order[c].append(i)
            h.ack(a, "Q", msg)  # Leasing sublet: any connection may acknowledge
        h.commit()
        nxt = taken(h, a) + taken(h, b)
        for c in ("x", "y"):
            assert sum(1 for m in nxt if decode(m)["c"] == c) <= 1
        pending = nxt
    assert order == {"x": [0, 1, 3], "y": [2, 4]}
    assert h.stats("Q").queue_depth == 0


def test_n2_two_in_flight_per_key():
    h, _, (a, b) = setup([("x", i) for i in range(5)], MaxInFlightPerKey=2)
    first = taken(h, a) + taken(h, b)
    assert sorted(ids(first)) == [("x", 0), ("x", 1)]
    h.ack(a, "Q", first[1] if decode(first[1])["i"] == 1 else first[0])  # 1 finishes before 0
    h.commit()
    assert ids(taken(h, a) + taken(h, b)) == [("x", 2)]


def test_other_keys_flow_while_one_key_waits_for_a_slow_consumer():
    h, pub, (a, b) = setup([("slow", 0), ("slow", 1)], backlog=1)
    held = taken(h, a) + taken(h, b)
    assert ids(held) == [("slow", 0)]  # one worker holds it and does not ack
    free = b if h.queue("Q").details().consumers[0][1] == 1 else a
    for i in range(2, 6):
        h.publish(pub, "Work", {"c": f"k{i}", "i": i})
        h.commit()
        (msg,) = taken(h, free) + taken(h, a if free == b else b)
        assert decode(msg)["i"] == i
        h.ack(free, "Q", msg)
        h.commit()
    verdict = explain_message(h.engine, "Q", str(h.queue("Q").recovery_point() + 0), h.now)
    assert verdict.state in ("leased", "available")


def test_explain_says_ordering_key_and_details_show_no_not_before():
    h, _, (a, b) = setup([("x", 0), ("x", 1)])
    q = h.queue("Q")
    (row0, row1) = q.details().messages
    assert row1.not_before is None and row1.state == "available"
    verdict = explain_message(h.engine, "Q", str(row1.position), h.now)
    assert verdict.verdict == "ordering_key" and "'x'" in verdict.summary and "1 in flight" in verdict.summary
    assert q.statistics().available == 1 and q.statistics().queue_depth == 2
    assert q.keys.held_count() == 1


@pytest.mark.parametrize("how", ["cancel", "lease_expiry", "disconnect"])
def test_cancel_lease_expiry_and_broken_leases_never_reorder_a_key(how):
    h, _, (a, b) = setup([("x", 0), ("x", 1), ("x", 2)], LeasePeriod="5s")
    (msg,) = taken(h, a) + taken(h, b)
    holder = a if h.queue("Q").details().consumers[0][1] == 1 else b
    other = b if holder == a else a
    assert decode(msg)["i"] == 0
    if how == "cancel":
        h.ack(holder, "Q", msg, options="cancel")
        h.commit()
    elif how == "lease_expiry":
        h.advance(6)
    else:
        h.disconnect(holder)
        h.commit()
    again = taken(h, a) + taken(h, other) + (taken(h, b) if how != "disconnect" else [])
    assert ids(again) == [("x", 0)]  # 0 again, never 1 before it


def test_a_delayed_retry_keeps_its_place_in_its_key():
    h, _, (a,) = setup([("x", 0), ("x", 1), ("y", 2)], workers=1)
    msgs = taken(h, a)
    assert sorted(ids(msgs)) == [("x", 0), ("y", 2)]
    x0 = next(m for m in msgs if decode(m)["i"] == 0)
    h.ack(a, "Q", x0, options="cancel,delay=5")
    h.commit()
    assert taken(h, a) == []  # 1 waits for 0, which waits for its time
    h.advance(5.5)
    assert ids(taken(h, a)) == [("x", 0)]


def test_messages_without_the_key_field_are_unordered():
    h, _, (a,) = setup([(None, 0), (None, 1), (None, 2)], workers=1)
    assert sorted(ids(taken(h, a))) == [(None, 0), (None, 1), (None, 2)]


def test_acknowledging_a_held_message_removes_it_and_the_key_goes_on():
    h, _, (a,) = setup([("x", 0), ("x", 1), ("x", 2)], workers=1)
    (m0,) = taken(h, a)
    q = h.queue("Q")
    held = [r.position for r in q.details().messages][1]
    h.ack_filter(a, "Q", "/i = 1")  # the held one: gone, 0 still leased
    h.commit()
    assert taken(h, a) == []
    h.ack(a, "Q", [m0])
    h.commit()
    assert ids(taken(h, a)) == [("x", 2)]
    assert held not in [r.position for r in q.details().messages]


@pytest.mark.parametrize("checkpoint", [False, True], ids=["journal", "snapshot"])
def test_a_restart_keeps_the_holds(checkpoint):
    h, _, (a,) = setup([("x", 0), ("x", 1), ("y", 2), ("x", 3)], workers=1)
    msgs = taken(h, a)
    assert sorted(ids(msgs)) == [("x", 0), ("y", 2)]
    h.ack(a, "Q", [m for m in msgs if decode(m)["c"] == "y"])
    h.commit()
    if checkpoint:
        h.checkpoint()
        h.commit()
    h.crash(checkpoint=checkpoint)
    q = h.queue("Q")
    assert q.keys.held_count() == 2  # 1 and 3 behind 0 (available again: its lease broke)
    w = h.connect("w")
    h.subscribe(w, "Q", "s", options="max_backlog=5")
    h.commit()
    order = []
    while msgs := taken(h, w):
        assert len(msgs) == 1
        order.append(decode(msgs[0])["i"])
        h.ack(w, "Q", msgs)
        h.commit()
    assert order == [0, 1, 3]


def test_priority_applies_among_the_deliverable_messages():
    h, _, (a,) = setup([("x", 0), ("x", 1), ("y", 2), ("z", 3)], workers=1, backlog=1, Priority="/i")
    order = []
    while msgs := taken(h, a):
        order.append(decode(msgs[0])["i"])
        h.ack(a, "Q", msgs)
        h.commit()
    # highest priority first among what each key allows: 1 waits for 0 (same key)
    assert order == [3, 2, 0, 1]


def test_a_barrier_waits_for_held_messages_before_it():
    h, pub, (a,) = setup([("x", 0), ("x", 1)], workers=1, backlog=5, BarrierExpression="/b = 1")
    h.publish(pub, "Work", {"b": 1, "i": 9})
    h.publish(pub, "Work", {"c": "y", "i": 10})
    h.commit()
    order = []
    while msgs := h.messages(a):  # a barrier comes on its underlying topic
        order += [decode(m)["i"] for m in msgs]
        h.ack(a, "Q", [m for m in msgs if not m.barrier])
        h.commit()
    assert order == [0, 1, 9, 10]


# --- the bare queue -------------------------------------------------------------------------------


def test_bare_queue_n1_holds_and_releases_in_order():
    cfg = QueueConfig(name="Q", message_type="json", ordering_key="/c")
    q = Queue(cfg, load=lambda p: None)
    for p, key in enumerate("xxyx"):
        q.enqueue(p, 0.0, ordering_key=key)
    c = Consumer("c", "o", max_backlog=10)
    q.add_consumer(c, 0.0)
    assert [d.position for d in q.dispatch(0.0)] == [0, 2]
    q.acknowledge([0], by=None, option=AckOption.NONE, now=0.0)
    assert [d.position for d in q.dispatch(0.0)] == [1]
    q.acknowledge([1], by=None, option=AckOption.CANCEL, now=0.0)
    assert [d.position for d in q.dispatch(0.0)] == [1]
    q.keys.check()
    q.check_invariants()


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize("elements, words, where", [
    ({"OrderingKey": "/c", "TargetQueueDepth": "5"}, "TargetQueueDepth", "TargetQueueDepth"),
    ({"OrderingKey": "/c", "FileBackedMetadata": "enabled"}, "FileBackedMetadata", "FileBackedMetadata"),
    ({"OrderingKey": "/c", "Semantics": "at-most-once"}, "at-least-once", "OrderingKey"),
    ({"MaxInFlightPerKey": "2"}, "needs an <OrderingKey>", "MaxInFlightPerKey"),
    ({"OrderingKey": "/c", "MaxInFlightPerKey": "0"}, "MaxInFlightPerKey", "MaxInFlightPerKey"),
    ({"OrderingKey": "/c = ("}, "OrderingKey", "OrderingKey"),
])
def test_config_errors_name_the_element(elements, words, where):
    with pytest.raises(ConfigError) as err:
        load_text(config_xml(queue_xml("Q", **elements), topics=("Work",)))
    assert words in str(err.value)
    assert (err.value.path or "").endswith(where)


def test_group_local_queue_is_refused():
    with pytest.raises(ConfigError) as err:
        load_text(config_xml(queue_xml("Q", tag="GroupLocalQueue", InitialOwner="a", OrderingKey="/c"),
                             topics=("Work",)))
    assert "OrderingKey" in (err.value.path or "")


def test_config_reads_the_key_and_defaults_n_to_1():
    qc = load_text(config_xml(queue_xml("Q", OrderingKey="/customer"), topics=("Work",))).queues[0]
    assert (qc.ordering_key, qc.max_in_flight_per_key) == ("/customer", 1)
    qc = load_text(config_xml(queue_xml("Q", OrderingKey="/c", MaxInFlightPerKey="3"), topics=("Work",))).queues[0]
    assert qc.max_in_flight_per_key == 3
