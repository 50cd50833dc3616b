"""Barrier messages (spec 000, "Synchronizing Work with Barrier Messages"; "Message Flow
for Queues", step 4; reference.md B.10)."""

from __future__ import annotations

import pytest

from conveyor import expr
from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.queue.queue import (
    Acknowledged,
    AckOption,
    BarrierDelivered,
    Consumer,
    Expired,
    MessageState,
    Queue,
    QueueStateError,
    Returned,
)

from .queue_model import replay

ALO, AMO = Semantics.AT_LEAST_ONCE, Semantics.AT_MOST_ONCE
NONE, EXPIRE = AckOption.NONE, AckOption.EXPIRE


class BBench:
    """A queue with <BarrierExpression>/eod = 1</BarrierExpression>; the test marks
    barriers as the engine would, by evaluating the expression at publish."""

    def __init__(self, **config) -> None:
        config.setdefault("lease_period_s", 10.0)
        if config.get("semantics") is AMO:
            config.setdefault("fairness", Fairness.ROUND_ROBIN)
        self.config = QueueConfig(
            name="Q", message_type="json", barrier_expression="/eod = 1", **config
        )
        self.barrier = expr.compile(self.config.barrier_expression)
        self.priority = expr.compile(config["priority"]) if config.get("priority") else None
        self.data: dict[int, dict] = {}
        self.q = Queue(self.config, load=self.data.__getitem__)
        self.next = 100
        self.journal: list = []  # ("pub", p, t) and ("ev", event)

    def pub(self, t: float = 0.0, **body) -> int:
        p = self.next
        self.next += 10
        self.data[p] = body
        self.journal.append(("pub", p, t))
        self._enqueue(self.q, p, t)
        return p

    def _enqueue(self, q: Queue, p: int, t: float) -> None:
        body = self.data[p]
        prio = self.priority.priority(body) if self.priority else None
        q.enqueue(p, t, priority=prio, barrier=self.barrier.matches(body))

    def eod(self, t: float = 0.0, **body) -> int:
        return self.pub(t, eod=1, **body)

    def consumer(self, name: str, backlog: int = 1, flt=None) -> Consumer:
        c = Consumer(name, name, filter=flt, max_backlog=backlog)
        self.q.add_consumer(c, 0.0)
        return c

    def dispatch(self, now: float = 0.0):
        got = self.q.dispatch(now)
        self.journal += [("ev", d.event) for d in got]
        return got

    def deliver(self, now: float = 0.0) -> list:
        """(consumer key, position), or ("barrier", position, recipient keys)."""
        return [
            ("barrier", d.position, tuple(c.key for c in d.recipients))
            if d.barrier
            else (d.consumer.key, d.position)
            for d in self.dispatch(now)
        ]

    def ack(self, *positions: int, by=None, option=NONE, now: float = 0.0):
        r = self.q.acknowledge(positions, by=by, option=option, now=now)
        self.journal += [("ev", e) for e in r.events]
        return r

    def restart(self, now: float = 0.0) -> Queue:
        q = Queue(self.config, load=self.data.__getitem__)
        for rec in self.journal:
            if rec[0] == "pub":
                self._enqueue(q, rec[1], rec[2])
            else:
                replay(q, rec[1], now)
        q.end_replay(now)
        self.q = q
        return q


# --- the rules -------------------------------------------------------------------------------


def test_barrier_waits_until_every_previous_message_is_acknowledged():
    """"AMPS does not deliver the message until all previous messages in the queue are
    acknowledged"; then "delivers the barrier message to all current subscribers"."""
    b = BBench()
    m1, m2 = b.pub(), b.pub()
    bar = b.eod()
    b.consumer("A", backlog=5)
    b.consumer("B", backlog=5)
    assert b.deliver() == [("A", m1), ("B", m2)]
    b.ack(m1)
    assert b.deliver() == []  # m2 is still leased
    b.ack(m2)
    assert b.deliver() == [("barrier", bar, ("A", "B"))]


def test_messages_after_the_barrier_wait_until_it_is_delivered():
    """"AMPS does not deliver messages that are after the barrier message until the
    barrier message is sent to subscribers", even to consumers with room."""
    b = BBench()
    m1 = b.pub()
    bar = b.eod()
    after = [b.pub(), b.pub()]
    b.consumer("A", backlog=1)
    b.consumer("B", backlog=5)
    assert b.deliver() == [("A", m1)]
    assert b.deliver() == []  # B has room, but everything else is after the barrier
    b.ack(m1)
    assert b.deliver() == [("barrier", bar, ("A", "B")), ("A", after[0]), ("B", after[1])]


def test_barrier_ignores_backlog_and_does_not_count_toward_it():
    """"A barrier message sent to a subscriber does not count toward that subscriber's
    backlog ... subscribers that request max_backlog=0 or which ... have their backlog
    filled by messages from other topics will still receive the barrier message"."""
    b = BBench()
    other = Queue(QueueConfig(name="Other", message_type="json"), load=lambda p: {})
    other.enqueue(1, 0.0)
    full = Consumer("F", "F", max_backlog=1)
    other.add_consumer(full, 0.0)
    b.q.add_consumer(full, 0.0)
    assert [d.position for d in other.dispatch(0.0)] == [1]  # F's backlog is full
    zero = b.consumer("Z", backlog=0)
    bar = b.eod()
    (d,) = b.dispatch()
    assert d.barrier and d.position == bar and d.recipients == (full, zero)
    assert (full.outstanding, zero.outstanding) == (1, 0)
    assert d.consumer is None and d.lease_deadline is None and d.delivery_count == 0


def test_barrier_leaves_the_queue_without_acknowledgement():
    """"AMPS immediately removes the message from the queue, without requiring
    acknowledgment from any subscriber": journaled as BarrierDelivered; a later ack of it
    is ignored."""
    b = BBench()
    bar = b.eod()
    b.consumer("A")
    (d,) = b.dispatch()
    assert d.event == BarrierDelivered(bar)
    assert b.q.state_of(bar) is MessageState.ABSENT
    assert list(b.q.available()) == []
    assert b.ack(bar, by="A").ignored == 1
    s = b.q.statistics()
    assert (s.barriers_delivered, s.barriers_pending, s.delivered, s.queue_depth) == (1, 0, 0, 0)


def test_content_filters_apply_per_subscription_and_a_non_matching_one_still_waits():
    """"AMPS does, however, apply content filters ... If the content filter ... does not
    match the barrier message, that subscription will not receive the message ... A
    subscription that does not match the message will still see message delivery pause
    until the barrier is released"."""
    b = BBench()
    m1 = b.pub(k=1)
    bar = b.eod(k=1)
    m2 = b.pub(k=2)
    b.consumer("ones", backlog=5, flt=lambda d, now: d.get("k") == 1)
    b.consumer("twos", backlog=5, flt=lambda d, now: d.get("k") == 2)
    assert b.deliver() == [("ones", m1)]  # twos matches m2, but m2 is after the barrier
    b.ack(m1)
    assert b.deliver() == [("barrier", bar, ("ones",)), ("twos", m2)]


def test_barrier_nobody_matches_is_still_released():
    """Our reading: the barrier itself is released once everything before it is
    acknowledged, even when no current subscription matches it (none receives it)."""
    b = BBench()
    bar = b.eod(k=3)
    after = b.pub(k=1)
    b.consumer("A", flt=lambda d, now: d.get("k") == 1)
    assert b.deliver() == [("barrier", bar, ()), ("A", after)]


def test_barrier_waits_for_a_subscriber():
    """Delivered to "all current subscribers": with none, it waits (nothing is sent)."""
    b = BBench()
    bar = b.eod()
    assert b.deliver() == []
    assert list(b.q.available()) == [bar]
    b.consumer("A")
    assert b.deliver() == [("barrier", bar, ("A",))]


def test_detached_subscription_is_not_a_current_subscriber():
    """Replacing Queue Subscriptions: a subscription whose topic moved off the queue gets
    nothing more from it, barriers included."""
    b = BBench()
    a = b.consumer("A")
    b.consumer("B")
    b.q.detach_consumer(a, 0.0)
    bar = b.eod()
    assert b.deliver() == [("barrier", bar, ("B",))]


def test_at_most_once_barrier_waits_for_the_acknowledgements():
    """at-most-once: the earlier messages left the queue when sent, but "all previous
    messages have been acknowledged" (Message Flow, at-most-once, step 4) means the
    subscribers' acks (step 6), which we wait for."""
    b = BBench(semantics=AMO)
    m1 = b.pub()
    bar = b.eod()
    b.consumer("A", backlog=5)
    assert b.deliver() == [("A", m1)]
    assert b.deliver() == []
    assert b.ack(m1, by="A").released == 1
    assert b.deliver() == [("barrier", bar, ("A",))]


def test_a_subscriber_leaving_releases_what_it_held():
    """A disconnect returns the leased message (Delivery Semantics); the barrier waits
    for it to be delivered again and acknowledged."""
    b = BBench()
    m1 = b.pub()
    bar = b.eod()
    a = b.consumer("A")
    assert b.deliver() == [("A", m1)]
    assert b.q.remove_consumer(a, 0.0) == [Returned(m1)]
    b.consumer("B")
    assert b.deliver() == [("B", m1)]
    b.ack(m1, by="B")
    assert b.deliver() == [("barrier", bar, ("B",))]


def test_consecutive_barriers_go_one_after_the_other():
    b = BBench()
    b1, b2 = b.eod(), b.eod()
    m = b.pub()
    b.consumer("A")
    assert b.deliver() == [("barrier", b1, ("A",)), ("barrier", b2, ("A",)), ("A", m)]


def test_dispatch_budget_counts_a_barrier_as_one_delivery():
    b = BBench()
    bar = b.eod()
    m = b.pub()
    b.consumer("A", backlog=5)
    (d,) = b.q.dispatch(0.0, max_deliveries=1)
    assert d.barrier and d.position == bar
    assert [d.position for d in b.q.dispatch(0.0)] == [m]


def test_a_barrier_is_a_queued_message_until_delivered_view_ack_and_expiration():
    """Until delivered, a barrier is a message in the queue: in the view (in its place),
    removable by sow_delete and by Expiration; the messages after it are then released."""
    b = BBench(expiration_s=100.0, lease_period_s=1000.0)
    m1 = b.pub(t=0.0)
    bar = b.eod(t=0.0)
    m2 = b.pub(t=50.0)
    b.consumer("A", backlog=5)
    assert b.deliver(0.0) == [("A", m1)]
    assert list(b.q.available()) == [bar, m2]
    assert [r.barrier for r in b.q.details().messages] == [False, True, False]
    assert b.q.expire(100.0) == [Expired(bar, ("time_limit",))]
    assert b.deliver(100.0) == [("A", m2)]
    # and by sow_delete
    bar2 = b.eod(t=100.0)
    m3 = b.pub(t=100.0)
    assert b.ack(bar2).events == (Acknowledged(bar2),)
    assert b.deliver(100.0) == [("A", m3)]


def test_barrier_cuts_a_priority_queue_into_epochs():
    """Priority with barriers: priority order among the messages before the barrier; a
    higher-priority message published after the barrier still waits for it (step 4)."""
    b = BBench(priority="/p")
    lo = b.pub(p=1)
    hi = b.pub(p=5)
    bar = b.eod()
    urgent = b.pub(p=99)
    mid = b.pub(p=3)
    assert list(b.q.available()) == [hi, lo, bar, urgent, mid]
    b.consumer("A", backlog=5)
    assert b.deliver() == [("A", hi), ("A", lo)]
    b.ack(hi, lo)
    assert b.deliver() == [("barrier", bar, ("A",)), ("A", urgent), ("A", mid)]


def test_priority_barrier_removed_by_ack_joins_the_epochs():
    b = BBench(priority="/p")
    lo = b.pub(p=1)
    bar = b.eod()
    hi = b.pub(p=9)
    b.consumer("A", backlog=5, flt=lambda d, now: d.get("p") is not None)
    b.ack(bar)
    assert list(b.q.available()) == [hi, lo]
    assert b.deliver() == [("A", hi), ("A", lo)]


def test_recovery_never_resends_a_delivered_barrier():
    """Startup and Recovery: a journaled BarrierDelivered removes the barrier for good."""
    b = BBench()
    bar = b.eod()
    m = b.pub()
    b.consumer("A", backlog=5)
    assert b.deliver() == [("barrier", bar, ("A",)), ("A", m)]
    q = b.restart()
    assert list(q.available()) == [m]  # the lease the restart broke; not the barrier
    b.consumer("B", backlog=5)
    assert b.deliver() == [("B", m)]


def test_recovery_holds_a_barrier_that_was_not_delivered():
    """A barrier not delivered before the crash (or delivered but not journaled) is held
    again, and goes out once its rule holds after the restart."""
    b = BBench()
    m1 = b.pub()
    bar = b.eod()
    m2 = b.pub()
    b.consumer("A", backlog=5)
    assert b.deliver() == [("A", m1)]
    q = b.restart()
    assert list(q.available()) == [m1, bar, m2]
    b.consumer("B", backlog=5)
    assert b.deliver() == [("B", m1)]
    b.ack(m1, by="B")
    assert b.deliver() == [("barrier", bar, ("B",)), ("B", m2)]


def test_enqueue_of_a_barrier_needs_a_barrier_expression():
    q = Queue(QueueConfig(name="P", message_type="json"), load=lambda p: None)
    with pytest.raises(QueueStateError):
        q.enqueue(1, 0.0, barrier=True)
    assert list(q.available()) == []
