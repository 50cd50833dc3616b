"""Priority queues (spec 000, "Priority Queues"; "Message Flow for Queues", step 3), and
the compact priority index behind them (conveyor.engine.queue.priority)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import expr
from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.queue import priority as queue_priority
from conveyor.engine.queue.queue import (
    Acknowledged,
    AckOption,
    Consumer,
    Expired,
    LeaseExpired,
    Leased,
    MessageState,
    Queue,
    QueueStateError,
)
from conveyor.engine.queue.priority import (
    KEY_END,
    POSITION_MASK,
    PRIORITY_MAX,
    PriorityIndex,
    order_key,
    priority_of_key,
)

from .queue_model import replay

ALO, AMO = Semantics.AT_LEAST_ONCE, Semantics.AT_MOST_ONCE
NONE, CANCEL = AckOption.NONE, AckOption.CANCEL


class PBench:
    """A priority queue whose priorities the test computes as the engine would."""

    def __init__(self, priority: str = "/p", **config) -> None:
        config.setdefault("lease_period_s", 10.0)
        if config.get("semantics") is AMO:
            config.setdefault("fairness", Fairness.ROUND_ROBIN)
        self.config = QueueConfig(name="Q", message_type="json", priority=priority, **config)
        self.expression = expr.compile(priority)
        self.data: dict[int, dict] = {}
        self.q = Queue(self.config, load=self.data.__getitem__)
        self.next = 100

    def pub(self, t: float = 0.0, **body) -> int:
        p = self.next
        self.next += 10
        self.data[p] = body
        self.q.enqueue(p, t, priority=self.expression.priority(body))
        return p

    def consumer(self, name: str, backlog: int = 1, flt=None) -> Consumer:
        c = Consumer(name, name, filter=flt, max_backlog=backlog)
        self.q.add_consumer(c, 0.0)
        return c

    def deliver(self, now: float = 0.0) -> list[int]:
        return [d.position for d in self.q.dispatch(now)]

    def drain(self, now: float = 0.0) -> list[int]:
        """Deliver and acknowledge one at a time until nothing is left."""
        out = []
        while True:
            got = self.q.dispatch(now, max_deliveries=1)
            if not got:
                return out
            out.append(got[0].position)
            self.q.acknowledge([got[0].position], by=None, option=NONE, now=now)


# --- the spec's example and the ordering rule ----------------------------------------------


def test_order_priority_example_delivers_by_price_times_qty():
    """Priority Queues: the OrderPriority queue, <Priority>/price * /qty</Priority>, "orders
    delivery based on a descending sort of the value calculated for the Priority rather
    than in descending order of age"."""
    b = PBench("/price * /qty", semantics=ALO)
    small = b.pub(price=1.5, qty=10)  # 15
    big = b.pub(price=100, qty=3)  # 300
    mid = b.pub(price=20, qty=2)  # 40
    tie = b.pub(price=3, qty=5)  # 15, younger than `small`
    b.consumer("A", backlog=10)
    assert b.deliver() == [big, mid, small, tie]


def test_equal_priorities_go_oldest_first():
    """Message Flow for Queues, step 3: "it has the highest priority value for messages in
    the queue and is the oldest message at that priority"."""
    b = PBench()
    ps = [b.pub(p=v) for v in (5, 1, 5, 1, 5)]
    b.consumer("A", backlog=10)
    assert b.deliver() == [ps[0], ps[2], ps[4], ps[1], ps[3]]


def test_null_and_non_numeric_priorities_are_lowest_and_values_are_unsigned_64_bit():
    """Priority Queues: "The results of the priority expression are interpreted as an
    unsigned long ... Non-numeric values or NULL are treated as NaN, and have the lowest
    priority"."""
    b = PBench()
    null = b.pub()  # /p is NULL
    text = b.pub(p="urgent")  # non-numeric
    zero = b.pub(p=0)
    top = b.pub(p=PRIORITY_MAX)  # 2**64 - 1, the highest
    negative = b.pub(p=-5)  # not an unsigned long: NaN
    too_big = b.pub(p=2**64)  # not representable in 64 bits: NaN
    fraction = b.pub(p=7.9)  # truncated to 7
    numeric_text = b.pub(p="8")  # numeric strings convert
    b.consumer("A", backlog=20)
    assert b.deliver() == [top, numeric_text, fraction, zero, null, text, negative, too_big]


def test_view_lists_in_delivery_order_and_details_report_priority():
    """Querying Queues as a View: the sow view lists what would be delivered, in order."""
    b = PBench()
    lo, hi, nan = b.pub(p=1), b.pub(p=9), b.pub()
    assert list(b.q.available()) == [hi, lo, nan]
    rows = {r.position: r.priority for r in b.q.details().messages}
    assert rows == {lo: 1, hi: 9, nan: -1}
    b.consumer("A")
    b.deliver()
    assert list(b.q.available()) == [lo, nan]
    assert {r.position: (r.state, r.priority) for r in b.q.details().messages}[hi] == ("leased", 9)


def test_a_later_higher_priority_message_overtakes_the_queue():
    """A message published later with a higher priority is delivered next."""
    b = PBench()
    first = [b.pub(p=1) for _ in range(3)]
    b.consumer("A", backlog=1)
    assert b.deliver() == [first[0]]
    urgent = b.pub(p=50)
    b.q.acknowledge([first[0]], by="A", option=NONE, now=0.0)
    assert b.deliver() == [urgent]


def test_returned_message_keeps_its_priority_and_place():
    """Delivery Semantics: an expired lease returns the message to the queue; its
    priority (computed once) still places it first."""
    b = PBench(lease_period_s=5.0)
    hi = b.pub(p=9)
    lo = b.pub(p=1)
    b.consumer("A")
    assert b.deliver(0.0) == [hi]
    assert b.q.expire(5.0) == [LeaseExpired(hi)]
    assert list(b.q.available()) == [hi, lo]
    (d,) = b.q.dispatch(5.0)
    assert (d.position, d.delivery_count) == (hi, 2)


def test_filtered_consumer_gets_the_highest_priority_oldest_message_it_matches():
    """Message Flow, step 3, per subscription: the subscription's filter first, then the
    highest priority and the oldest at that priority among what it matches; also for a
    message enqueued after the consumer has looked through the queue."""
    b = PBench()
    b.pub(p=9, k=0)
    m1 = b.pub(p=2, k=1)
    m2 = b.pub(p=5, k=1)
    a = b.consumer("A", backlog=1, flt=lambda d, now: d.get("k") == 1)
    assert b.deliver() == [m2]
    late = b.pub(p=7, k=1)  # sorts before A's cursor
    b.q.acknowledge([m2], by="A", option=NONE, now=0.0)
    assert b.deliver() == [late]
    b.q.acknowledge([late], by="A", option=NONE, now=0.0)
    assert b.deliver() == [m1]
    assert a.outstanding == 1


def test_fairness_models_still_pick_among_eligible_consumers():
    """Delivery Fairness applies to the message priority chose (round-robin here)."""
    b = PBench(fairness=Fairness.ROUND_ROBIN)
    ps = [b.pub(p=v) for v in (1, 2, 3, 4)]
    b.consumer("A", backlog=5)
    b.consumer("B", backlog=5)
    got = [(d.consumer.key, d.position) for d in b.q.dispatch(0.0)]
    assert got == [("A", ps[3]), ("B", ps[2]), ("A", ps[1]), ("B", ps[0])]


def test_at_most_once_priority_queue():
    """at-most-once: delivered in priority order, removed as sent."""
    b = PBench(semantics=AMO)
    lo, hi = b.pub(p=1), b.pub(p=2)
    b.consumer("A", backlog=2)
    got = b.q.dispatch(0.0)
    assert [d.position for d in got] == [hi, lo]
    assert b.q.state_of(hi) is MessageState.CONSUMED
    assert list(b.q.available()) == []


# --- removal other than delivery, expiry, recovery -----------------------------------------


def test_acknowledged_and_expired_available_messages_are_not_delivered():
    """Acknowledging Messages / Expiration: a message acknowledged (sow_delete) or expired
    before delivery never comes out of the priority order."""
    b = PBench(expiration_s=10.0)
    old = b.pub(t=0.0, p=9)
    gone = b.pub(t=5.0, p=8)
    keep = b.pub(t=6.0, p=1)
    r = b.q.acknowledge([gone], by=None, option=NONE, now=6.0)
    assert r.events == (Acknowledged(gone),)
    assert b.q.expire(10.0) == [Expired(old, ("time_limit",))]
    assert list(b.q.available()) == [keep]
    b.consumer("A")
    assert b.deliver(10.0) == [keep]


def test_many_removals_by_bookmark_keep_the_order_right(monkeypatch):
    """queue/priority.py rule 4: lazily removed entries are swept once they outnumber the
    live ones (the index's size is checked in test_queue_parts); the order stays right."""
    monkeypatch.setattr(queue_priority, "_STALE_SLACK", 8)
    b = PBench()
    ps = [b.pub(p=i % 7) for i in range(400)]
    drop = [p for i, p in enumerate(ps) if i % 5]
    b.q.acknowledge(drop, by=None, option=NONE, now=0.0)
    keep = [p for i, p in enumerate(ps) if not i % 5]
    want = sorted(keep, key=lambda p: (-b.data[p]["p"], p))
    assert list(b.q.available()) == want
    b.consumer("A", backlog=1000)
    assert b.deliver() == want


def test_recovery_rebuilds_priority_order():
    """Startup and Recovery for Queues: replaying the journal (the engine enqueues again
    with the same priorities) rebuilds the same delivery order; a lease the restart broke
    returns with its priority and delivery count."""
    b = PBench()
    ps = [b.pub(p=v) for v in (3, 9, 1, 9, 5)]
    b.consumer("A", backlog=2)
    leased = b.q.dispatch(0.0)
    events = [d.event for d in leased]
    r = b.q.acknowledge([leased[0].position], by="A", option=NONE, now=0.0)
    events += list(r.events)
    before = list(b.q.available())
    q2 = Queue(b.config, load=b.data.__getitem__)
    for p in ps:
        q2.enqueue(p, 0.0, priority=b.expression.priority(b.data[p]))
    for e in events:
        replay(q2, e, 1.0)
    assert q2.end_replay(1.0) == []
    assert list(q2.available()) == [leased[1].position, *before]
    assert events[1] == Leased(ps[3], "A", 1)
    assert {r.position: r.deliveries for r in q2.details().messages}[ps[3]] == 1


def test_enqueue_needs_a_priority_on_a_priority_queue_and_refuses_one_elsewhere():
    b = PBench()
    with pytest.raises(QueueStateError):
        b.q.enqueue(500, 0.0)
    with pytest.raises(QueueStateError):
        b.q.enqueue(500, 0.0, priority=2**64)
    assert list(b.q.available()) == [] and b.q.last_position == -1  # nothing changed
    plain = Queue(QueueConfig(name="P", message_type="json"), load=lambda p: None)
    with pytest.raises(QueueStateError):
        plain.enqueue(1, 0.0, priority=3)


def test_priority_queue_memory_per_message_is_small():
    """docs/queues.md: a queued message of a priority queue costs the 16 bytes of the
    store plus 16 in the priority index (target <= 64 bytes)."""
    n = 20_000
    cfg = QueueConfig(name="M", message_type="json", priority="/p")
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    q = Queue(cfg, load=lambda p: None)
    for i in range(n):
        q.enqueue(i, 1.0, priority=(i * 7919) % 1000)
    used = (tracemalloc.get_traced_memory()[0] - base) / n
    tracemalloc.stop()
    assert used < 64, used


# --- the index alone -------------------------------------------------------------------------


def test_order_keys_compare_as_the_delivery_order():
    keys = [order_key(p, pos) for p, pos in [(PRIORITY_MAX, 9), (5, 1), (5, 2), (0, 0), (-1, 3)]]
    assert keys == sorted(keys) and max(keys) < KEY_END
    assert [priority_of_key(k) for k in keys] == [PRIORITY_MAX, 5, 5, 0, -1]
    assert [k & POSITION_MASK for k in keys] == [9, 1, 2, 0, 3]
    with pytest.raises(ValueError):
        order_key(-2, 1)
    with pytest.raises(ValueError):
        order_key(1, -1)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "remove", "pop", "forget", "scan"]),
        st.sampled_from([-1, 0, 1, 2, 3, PRIORITY_MAX]),
        st.integers(0, 10_000),
    ),
    max_size=150,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops)
def test_priority_index_against_a_sorted_list(monkeypatch, ops):
    """The chunked index (tiny chunks, to reach splits and cuts) against a sorted list."""
    monkeypatch.setattr(queue_priority, "CHUNK_SLOTS", 3)
    monkeypatch.setattr(queue_priority, "_CUT_MIN", 2)
    monkeypatch.setattr(queue_priority, "_STALE_SLACK", 2)
    store: set[int] = set()  # positions "in the store"
    used: set[int] = set()  # a position that left the store never comes back (rule 4)
    index = PriorityIndex(store.__contains__)
    model: list[int] = []
    for op, prio, pos in ops:
        if op == "add" and pos not in used:
            k = order_key(prio, pos)
            store.add(pos)
            used.add(pos)
            index.add(k)
            model.append(k)
            model.sort()
        elif op == "remove" and model:
            k = model.pop(pos % len(model))
            index.remove(k)
            store.discard(k & POSITION_MASK)
        elif op == "pop" and model:
            k = index.head()
            assert k == model[0]
            index.pop_head(k)
            store.discard(model.pop(0) & POSITION_MASK)
        elif op == "forget" and model:
            k = model.pop(pos % len(model))
            store.discard(k & POSITION_MASK)
            index.forget()
        elif op == "scan" and model:
            start = model[pos % len(model)]
            assert list(index.scan(start)) == [k for k in model if k >= start]
        assert len(index) == len(model)
        assert index.head() == (model[0] if model else None)
    assert list(index) == model
    other = PriorityIndex(store.__contains__)
    extra = [order_key(2, 20_000 + i) for i in range(5)]
    for k in extra:
        store.add(k & POSITION_MASK)
        other.add(k)
    index.merge(other)
    assert list(index) == sorted(model + extra)


def test_a_message_transferred_away_and_back_is_in_the_order_once():
    """A replicated priority queue: a message owned away (transfer out) and back
    (transfer in) is available once, delivered once, and leaves nothing behind in the
    priority index (the transfer out removes its key exactly, not lazily)."""
    q = Queue(QueueConfig(name="Q", message_type="json", priority="/p"), load=lambda p: None)
    for p, prio in ((1, 5), (2, 9), (3, 1)):
        q.enqueue(p, 1.0, priority=prio)
    assert q.transfers.transfer_out(2, "B", 2.0)
    assert list(q._order) == [1, 3]  # the delivery order (the view also shows 2, owned by B)
    assert q.transfers.transfer_in(2, 3.0)
    assert list(q._order) == [2, 1, 3]
    c = Consumer("c", "c", max_backlog=10)
    q.add_consumer(c, 4.0)
    assert [d.position for d in q.dispatch(4.0)] == [2, 1, 3]
    assert list(q._order) == [] and q.dispatch(4.0) == []
