"""TargetQueueDepth (spec 000, "Limiting Currently Deliverable Messages"; reference.md
A.2 and D.1): the active window, deferred acknowledgements, and the engine's refill
(conveyor.engine.queue.window)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.queue.queue import (
    Acknowledged,
    AckOption,
    Consumer,
    Expired,
    MessageState,
    Queue,
    QueueStateError,
)

from .queue_model import replay

ALO, AMO = Semantics.AT_LEAST_ONCE, Semantics.AT_MOST_ONCE
NONE, CANCEL, EXPIRE = AckOption.NONE, AckOption.CANCEL, AckOption.EXPIRE


class TBench:
    """A TargetQueueDepth queue and the engine's part: a journal of records (publishes of
    this queue's topic, of other topics, and queue events) read back by the refill."""

    def __init__(self, depth: int, **config) -> None:
        config.setdefault("lease_period_s", 10.0)
        if config.get("semantics") is AMO:
            config.setdefault("fairness", Fairness.ROUND_ROBIN)
        self.config = QueueConfig(name="Q", message_type="json", target_queue_depth=depth, **config)
        self.data: dict[int, dict] = {}
        self.journal: dict[int, tuple] = {}  # position -> ("pub", time) | ("other",) | ("ev", e)
        self.next = 100
        self.q = Queue(self.config, load=self.data.__getitem__)

    def _append(self, rec: tuple) -> int:
        p = self.next
        self.next += 10
        self.journal[p] = rec
        return p

    def pub(self, t: float = 0.0, **body) -> int:
        p = self._append(("pub", t))
        self.data[p] = body
        self.q.enqueue(p, t)
        return p

    def other(self) -> int:
        """A record of another topic (not a message of this queue)."""
        return self._append(("other",))

    def journal_events(self, events) -> None:
        for e in events:
            self._append(("ev", e))

    def refill(self, q: Queue | None = None, upto: int | None = None) -> list[int]:
        """What the engine does: read from refill_from() and offer this queue's messages
        while it wants more. Returns the positions activated."""
        q = q or self.q
        got = []
        start = q.refill_from()
        for p in sorted(self.journal):
            if not q.wants() or (upto is not None and p >= upto):
                break
            if start is None or p < start or self.journal[p][0] != "pub":
                continue
            if q.activate(p, self.journal[p][1]):
                got.append(p)
        return got

    def consumer(self, name: str, backlog: int = 1, flt=None) -> Consumer:
        c = Consumer(name, name, filter=flt, max_backlog=backlog)
        self.q.add_consumer(c, 0.0)
        return c

    def deliver(self, now: float = 0.0) -> list[int]:
        got = self.q.dispatch(now)
        self.journal_events([d.event for d in got])
        return [d.position for d in got]

    def ack(self, *positions: int, by=None, option=NONE, now: float = 0.0):
        r = self.q.acknowledge(positions, by=by, option=option, now=now)
        self.journal_events(r.events)
        return r

    def restart(self, now: float = 0.0, start: int = 0) -> Queue:
        """Replay as the engine does: publishes and events in journal order, refilling
        after each event (queue/window.py rule 6), then end_replay and a last refill."""
        q = Queue(self.config, load=self.data.__getitem__, start=start)
        for p in sorted(self.journal):
            if p < start:
                continue
            rec = self.journal[p]
            if rec[0] == "pub":
                q.enqueue(p, rec[1])
            elif rec[0] == "ev":
                replay(q, rec[1], now)
                self.refill(q, upto=p)
        self.journal_events(q.end_replay(now))
        self.refill(q)
        self.q = q
        return q


# --- the window --------------------------------------------------------------------------------


def test_only_the_first_messages_up_to_the_target_depth_are_active():
    """"If the number of messages for the queue exceeds the TargetQueueDepth ... messages
    beyond the specified depth are considered to be inactive ... They do not appear in a
    sow query of the queue"; queue_depth counts the active part, inactive_message_count the
    rest (reference.md D.1)."""
    b = TBench(3)
    ps = [b.pub() for _ in range(5)]
    assert list(b.q.available()) == ps[:3]
    s = b.q.statistics()
    assert (s.queue_depth, s.inactive_message_count, s.deferred_ack_count) == (3, 2, 0)
    assert [b.q.state_of(p) for p in ps] == [MessageState.AVAILABLE] * 3 + [MessageState.INACTIVE] * 2
    assert b.q.recovery_point() == ps[0]


def test_enqueue_reports_whether_the_message_is_active():
    b = TBench(1)
    p1 = b.next
    assert b.q.enqueue(p1, 0.0) is True
    assert b.q.enqueue(p1 + 1, 0.0) is False


def test_inactive_messages_are_not_deliverable_even_if_only_they_match():
    """"Those messages are not deliverable to subscribers ... if no messages within the
    TargetQueueDepth match a given subscription, no messages will be delivered to that
    subscription even if later messages in the transaction log match"."""
    b = TBench(2)
    b.pub(k=1)
    b.pub(k=1)
    b.pub(k=2)
    b.consumer("twos", backlog=5, flt=lambda d, now: d["k"] == 2)
    assert b.deliver() == []
    assert b.refill() == []  # the window is full: nothing to add


def test_filtered_ack_applies_only_to_the_active_part():
    """"A sow_delete that uses a filter will only apply to the messages in the queue that
    are currently deliverable.\""""
    b = TBench(2)
    ps = [b.pub(k=1) for _ in range(4)]
    r = b.q.acknowledge_matching(lambda d, now: d["k"] == 1, by=None, option=NONE, now=0.0)
    assert r.events == (Acknowledged(ps[0]), Acknowledged(ps[1]))
    assert b.q.statistics().inactive_message_count == 2


def test_the_window_refills_as_messages_are_acknowledged():
    """"As messages are acknowledged from the queue, AMPS will add messages to the active
    part of the queue until the active part of the queue once again reaches the
    TargetQueueDepth": the engine reads the log from refill_from() while wants() > 0."""
    b = TBench(2)
    ps = []
    for _ in range(5):
        ps.append(b.pub())
        b.other()  # records of other topics in between
    b.consumer("A", backlog=5)
    assert b.deliver() == ps[:2]
    assert b.q.wants() == 0 and b.q.refill_from() == ps[2]
    b.ack(ps[0])
    assert b.q.wants() == 1
    assert b.refill() == [ps[2]]
    assert b.q.refill_from() == ps[2]  # the last position offered: a record boundary
    b.ack(ps[1], ps[2])
    assert b.q.wants() == 2
    assert b.refill() == ps[3:5]
    assert b.q.wants() == 0 and b.q.refill_from() is None
    s = b.q.statistics()
    assert (s.queue_depth, s.inactive_message_count) == (2, 0)
    nxt = b.pub()  # caught up and room... no: the window is full again
    assert b.q.state_of(nxt) is MessageState.INACTIVE


def test_leased_messages_count_in_the_depth_and_a_caught_up_queue_enqueues_directly():
    b = TBench(2)
    p1, p2 = b.pub(), b.pub()
    b.consumer("A", backlog=2)
    assert b.deliver() == [p1, p2]  # leased: still "unacknowledged messages"
    p3 = b.pub()
    assert b.q.state_of(p3) is MessageState.INACTIVE
    b.ack(p1, p2)
    assert b.refill() == [p3]
    p4 = b.pub()  # nothing inactive and room: active at once
    assert b.q.state_of(p4) is MessageState.AVAILABLE


def test_activate_is_idempotent_and_checked():
    b = TBench(1)
    p1, p2, p3 = b.pub(), b.pub(), b.pub()
    with pytest.raises(QueueStateError):
        b.q.activate(p2, 0.0)  # no room (the engine must check wants())
    b.ack(p1)
    assert b.q.activate(p1, 0.0) is False  # offered before: ignored
    assert b.q.activate(p2, 0.0) is True
    assert b.q.activate(p2, 0.0) is False
    with pytest.raises(QueueStateError):
        b.q.activate(p3 + 1000, 0.0)  # not enqueued yet
    plain = Queue(QueueConfig(name="P", message_type="json"), load=lambda p: None)
    with pytest.raises(QueueStateError):
        plain.activate(1, 0.0)


# --- deferred acknowledgements --------------------------------------------------------------


def test_ack_of_an_inactive_message_is_deferred_and_it_never_becomes_active():
    """"AMPS keeps a list of acknowledgments that have been received for messages that
    are not in the queue. When a message that would be added to the active part of the
    queue has already been acknowledged, AMPS does not add that message to the queue.\""""
    b = TBench(1)
    p1, p2, p3 = b.pub(), b.pub(), b.pub()
    r = b.ack(p2, by="someone")
    assert (r.deferred, r.deleted, r.events) == (1, 1, (Acknowledged(p2),))
    assert b.ack(p2).ignored == 1  # already held
    s = b.q.statistics()
    assert (s.inactive_message_count, s.deferred_ack_count) == (2, 1)
    assert b.q.state_of(p2) is MessageState.ABSENT
    b.consumer("A")
    assert b.deliver() == [p1]
    b.ack(p1)
    assert b.refill() == [p3]  # p2 was skipped, without taking room
    s = b.q.statistics()
    assert (s.inactive_message_count, s.deferred_ack_count) == (0, 0)
    b.ack(p3)
    assert b.deliver() == []


def test_deferred_ack_waits_while_the_window_is_full():
    """The ack is honoured "when a message ... would be added": not before."""
    b = TBench(1)
    p1, p2 = b.pub(), b.pub()
    b.ack(p2)
    assert b.q.wants() == 0 and b.refill() == []
    assert b.q.statistics().deferred_ack_count == 1
    b.ack(p1)
    assert b.refill() == []
    assert b.q.statistics().deferred_ack_count == 0
    assert b.q.statistics().inactive_message_count == 0


def test_cancel_and_expire_of_an_inactive_message_are_ignored():
    """Our choice: nothing is leased to cancel, and an expiry (forced_expire) needs the
    message to report it (actions), so both leave an inactive message alone; at-most-once
    ignores ack options, so there an ack with expire is a plain (deferred) ack."""
    b = TBench(1)
    _, p2 = b.pub(), b.pub()
    assert b.ack(p2, option=CANCEL).ignored == 1
    assert b.ack(p2, option=EXPIRE).ignored == 1
    assert b.q.statistics().deferred_ack_count == 0
    m = TBench(1, semantics=AMO)
    _, q2 = m.pub(), m.pub()
    assert m.ack(q2, option=EXPIRE).deferred == 1


def test_deferred_acks_of_positions_that_are_not_queue_messages_are_dropped():
    """The queue cannot tell an inactive message from another record: an ack there is
    held, and dropped once the refill passes its position or nothing is inactive."""
    b = TBench(1)
    p1, p2 = b.pub(), b.pub()
    stray = b.other()
    p3 = b.pub()
    assert b.ack(stray).deferred == 1
    assert b.ack(p2 + 5).deferred == 1  # between records
    assert b.ack(p3 + 10_000).ignored == 1  # beyond the last message: not in the log yet
    b.ack(p1)
    assert b.refill() == [p2]
    assert b.q.statistics().deferred_ack_count == 2
    b.ack(p2)
    assert b.refill() == [p3]
    assert b.q.statistics().deferred_ack_count == 0


# --- time and limits --------------------------------------------------------------------------


def test_inactive_messages_do_not_expire_until_active():
    """Expiration applies to messages in the queue's state; an inactive one has none. One
    that is already too old when it becomes active expires at the next sweep."""
    b = TBench(1, expiration_s=10.0, lease_period_s=100.0)
    p1 = b.pub(t=0.0)
    p2 = b.pub(t=1.0)
    b.consumer("A")
    assert b.deliver(0.0) == [p1]
    assert b.q.expire(50.0) == []  # p1 leased, p2 inactive
    assert b.q.next_deadline() == 100.0
    b.ack(p1, now=50.0)
    assert b.refill() == [p2]
    assert b.q.next_deadline() == 11.0
    assert b.q.expire(50.0) == [Expired(p2, ("time_limit",))]


def test_at_most_once_window():
    """at-most-once: delivered messages leave the queue, so they leave the window."""
    b = TBench(2, semantics=AMO)
    ps = [b.pub() for _ in range(4)]
    b.consumer("A", backlog=1)
    assert b.deliver() == [ps[0]]
    assert b.q.wants() == 1
    assert b.refill() == [ps[2]]
    s = b.q.statistics()
    assert (s.queue_depth, s.awaiting_ack, s.inactive_message_count) == (2, 1, 1)


# --- recovery ---------------------------------------------------------------------------------


def test_recovery_rebuilds_the_window_and_deferred_acks():
    """Startup and Recovery: replaying the journal (refilling as live) rebuilds the same
    active part, delivery counts, inactive count and deferred acks."""
    b = TBench(2)
    ps = [b.pub() for _ in range(6)]
    b.consumer("A", backlog=1)
    assert b.deliver() == [ps[0]]
    b.ack(ps[0], by="A")
    b.refill()
    assert b.deliver() == [ps[1]]
    b.ack(ps[4])  # deferred
    b.deliver()
    before = (list(b.q.available()), b.q.statistics().inactive_message_count)
    q = b.restart(now=1.0)
    assert (list(q.available()), q.statistics().inactive_message_count) == (
        [ps[1], ps[2]], 3
    )
    assert before == ([ps[2]], 3)  # ps[1] was leased before the restart
    assert q.statistics().deferred_ack_count == 1
    assert {r.position: r.deliveries for r in q.details().messages} == {ps[1]: 1, ps[2]: 0}
    b.consumer("B", backlog=5)
    assert b.deliver() == [ps[1], ps[2]]
    b.ack(ps[1], ps[2])
    assert b.refill() == [ps[3], ps[5]]


def test_recovery_from_the_recovery_point():
    """recovery_point() never passes refill_from() while messages are inactive, so a
    replay from it finds every inactive message."""
    b = TBench(1)
    ps = [b.pub() for _ in range(4)]
    b.consumer("A")
    for p in ps[:2]:
        b.deliver()
        b.ack(p, by="A")
        b.refill()
    point = b.q.recovery_point()
    assert point == ps[2]
    q = b.restart(start=point)
    assert list(q.available()) == [ps[2]] and q.statistics().inactive_message_count == 1


def test_replayed_delivery_of_an_inactive_message_means_the_engine_did_not_refill():
    b = TBench(1)
    p1, p2 = b.pub(), b.pub()
    q = Queue(b.config, load=b.data.__getitem__)
    q.enqueue(p1, 0.0)
    q.enqueue(p2, 0.0)
    q.replay.acknowledged(p1)
    with pytest.raises(QueueStateError, match="refill"):
        q.replay.delivered(p2, 0.0, count=1)


def test_inactive_messages_cost_no_memory():
    """"For messages that are not currently deliverable, AMPS will not read those messages
    from the transaction log and will not maintain queue state for those messages.\""""
    q = Queue(QueueConfig(name="T", message_type="json", target_queue_depth=10), load=lambda p: None)
    for i in range(10):
        q.enqueue(i, 0.0)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(10, 20_010):
        q.enqueue(i, 0.0)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert q.statistics().inactive_message_count == 20_000
    assert grown < 1_000, grown
