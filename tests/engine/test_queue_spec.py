"""One test per rule of the queue chapter (spec 000) in scope; each names its section."""

from __future__ import annotations

import math

import pytest

from conveyor.config.model import Fairness, Leasing, QueueConfig, Semantics
from conveyor.engine.queue.queue import (
    Acknowledged,
    AckOption,
    Cancelled,
    Consumer,
    DeliveredAtMostOnce,
    Expired,
    Leased,
    LeaseExpired,
    MessageState,
    PositionOutOfOrder,
    Queue,
    QueueStateError,
    Returned,
    effective_backlog,
)
from conveyor.errors import (
    ConfigError,
    DuplicateSubscription,
    InvalidOption,
    NotLeaseHolder,
    UnknownSubscription,
)

from .queue_model import replay

ALO, AMO = Semantics.AT_LEAST_ONCE, Semantics.AT_MOST_ONCE
NONE, CANCEL, EXPIRE = AckOption.NONE, AckOption.CANCEL, AckOption.EXPIRE


class Bench:
    """A queue with a message store and helpers."""

    def __init__(self, **config) -> None:
        config.setdefault("lease_period_s", 10.0)
        if config.get("semantics") is AMO:
            config.setdefault("fairness", Fairness.ROUND_ROBIN)
        self.config = QueueConfig(name="Q", message_type="json", **config)
        self.data: dict[int, dict] = {}
        self.q = Queue(self.config, load=self.data.__getitem__)
        self.next = 100

    def pub(self, t: float = 0.0, **body) -> int:
        p = self.next
        self.next += 10  # gaps, as journal positions have
        self.data[p] = body
        self.q.enqueue(p, t)
        return p

    def consumer(self, name: str, backlog: int = 1, flt=None, owner=None) -> Consumer:
        c = Consumer(name, owner or name, filter=flt, max_backlog=backlog)
        self.q.add_consumer(c, 0.0)
        return c

    def deliver(self, now: float = 0.0) -> list[tuple[str, int]]:
        return [(d.consumer.key, d.position) for d in self.q.dispatch(now)]


def k_is(v):
    return lambda d, now: d.get("k") == v


# --- Understanding AMPS Queuing / Delivery Semantics ----------------------------------------


def test_understanding_queuing_each_message_goes_to_one_subscriber_once():
    """Understanding AMPS Queuing: each subscriber receives one message, each message is
    delivered to only one subscriber (the WorkToDo diagram: 3 messages, 3 consumers)."""
    b = Bench()
    msgs = [b.pub() for _ in range(3)]
    for name in "ABC":
        b.consumer(name)
    got = b.deliver()
    assert sorted(p for _, p in got) == msgs
    assert sorted(k for k, _ in got) == ["A", "B", "C"]
    assert b.deliver() == []  # nothing is delivered twice


def test_delivery_semantics_at_least_once_leases_until_lease_period():
    """Delivery Semantics, at-least-once: the message is leased for the lease period and
    the lease time is provided with the message (Message Flow, step 3)."""
    b = Bench(lease_period_s=30.0)
    p = b.pub()
    b.consumer("A")
    (d,) = b.q.dispatch(5.0)
    assert (d.position, d.lease_deadline, d.delivery_count) == (p, 35.0, 1)
    assert d.event == Leased(p, "A", 1)
    assert b.q.state_of(p) is MessageState.LEASED
    assert b.q.next_deadline() == 35.0


def test_delivery_semantics_lease_revoked_message_available_to_another_subscriber():
    """Delivery Semantics: "If the subscriber has not responded by removing the message
    within the lease period, AMPS revokes the lease and the message is available to
    another subscriber"."""
    b = Bench(lease_period_s=10.0, fairness=Fairness.ROUND_ROBIN)
    p = b.pub()
    a = b.consumer("A")
    b.consumer("B")
    assert b.deliver(0.0) == [("A", p)]
    assert b.q.expire(9.99) == []
    assert b.q.expire(10.0) == [LeaseExpired(p)]
    assert a.outstanding == 0
    (d,) = b.q.dispatch(10.0)
    assert (d.consumer.key, d.position, d.delivery_count) == ("B", p, 2)


def test_delivery_semantics_ack_removes_message():
    """Delivery Semantics: the subscriber removes the message with sow_delete by bookmark."""
    b = Bench()
    p = b.pub()
    a = b.consumer("A")
    b.deliver()
    r = b.q.acknowledge([p], by="A", option=NONE, now=1.0)
    assert (r.acknowledged, r.events, r.freed) == (1, (Acknowledged(p),), ("A",))
    assert b.q.state_of(p) is MessageState.ABSENT and a.outstanding == 0
    assert list(b.q.available()) == [] and b.q.next_deadline() is None


def test_delivery_semantics_at_most_once_removes_at_once_but_counts_in_backlog():
    """Delivery Semantics, at-most-once: removed as soon as sent; the subscriber still
    acknowledges so that AMPS can track the backlog."""
    b = Bench(semantics=AMO)
    p1, p2 = b.pub(), b.pub()
    a = b.consumer("A", backlog=1)
    (d,) = b.q.dispatch(0.0)
    assert (d.position, d.lease_deadline, d.event) == (p1, None, DeliveredAtMostOnce(p1))
    assert b.q.state_of(p1) is MessageState.CONSUMED
    assert list(b.q.available()) == [p2]
    assert a.outstanding == 1 and b.q.dispatch(0.0) == []  # backlog full
    r = b.q.acknowledge([p1], by="A", option=NONE, now=1.0)
    assert (r.released, r.events, r.freed) == (1, (), ("A",))
    assert b.deliver() == [("A", p2)]


def test_delivery_semantics_leases_broken_when_holder_disconnects():
    """Delivery Semantics: "Leases are broken and messages are returned to the queue if
    the lease holder disconnects" (and on unsubscribe, reference.md B.6)."""
    b = Bench()
    p1, p2 = b.pub(), b.pub()
    a = b.consumer("A", backlog=2)
    b.deliver()
    b.consumer("B", backlog=2)
    assert b.q.remove_consumer(a, 3.0) == [Returned(p1), Returned(p2)]
    assert a.outstanding == 0
    assert list(b.q.available()) == [p1, p2]
    assert b.deliver(3.0) == [("B", p1), ("B", p2)]  # "immediately processed by another"


def test_delivery_semantics_at_most_once_not_redelivered_after_disconnect():
    """Choosing Delivery Semantics: with at-most-once the message is not redelivered even
    if the subscriber fails to process it."""
    b = Bench(semantics=AMO)
    p = b.pub()
    a = b.consumer("A")
    b.deliver()
    assert b.q.remove_consumer(a, 1.0) == []
    b.consumer("B")
    assert b.deliver() == [] and b.q.state_of(p) is MessageState.ABSENT


# --- Subscription Backlog -----------------------------------------------------------------


def cfg(**kw) -> QueueConfig:
    return QueueConfig(name=kw.pop("name", "Q"), message_type="json", **kw)


def test_subscription_backlog_default_is_one():
    """Subscription Backlog: with no max_backlog, AMPS defaults to a max_backlog of 1."""
    assert effective_backlog(None, [cfg()]) == 1
    assert effective_backlog(None, [cfg(max_per_subscription_backlog=10)]) == 1


def test_subscription_backlog_is_minimum_of_request_and_queue_settings():
    """Subscription Backlog: the minimum of max_backlog and the minimum
    MaxPerSubscriptionBacklog of the queues matched."""
    qs = [cfg(name="A", max_per_subscription_backlog=7), cfg(name="B", max_per_subscription_backlog=None),
          cfg(name="C", max_per_subscription_backlog=4)]
    assert effective_backlog(10, qs) == 4
    assert effective_backlog(3, qs) == 3
    assert effective_backlog(10, [cfg(max_per_subscription_backlog=None)]) == 10
    assert effective_backlog(10, [cfg()]) == 1  # the reference's MaxPerSubscriptionBacklog default
    with pytest.raises(InvalidOption):
        effective_backlog(-1, qs)


def test_subscription_backlog_limits_outstanding_messages():
    """Subscription Backlog: a consumer gets messages while it has fewer outstanding than
    its backlog; an ack makes room for the next."""
    b = Bench()
    p1, p2, p3 = b.pub(), b.pub(), b.pub()
    b.consumer("A", backlog=2)
    assert b.deliver() == [("A", p1), ("A", p2)]
    b.q.acknowledge([p1], by="A", option=NONE, now=1.0)
    assert b.deliver() == [("A", p3)]


def test_subscription_backlog_zero_receives_nothing():
    b = Bench()
    b.pub()
    b.consumer("A", backlog=0)
    assert b.deliver() == []


def test_subscription_backlog_one_backlog_across_two_queues():
    """Subscription Backlog: a subscription matching several queues has one backlog
    (min MaxPerSubscriptionBacklog "for the queues matched by the subscription")."""
    data = {1: {}, 2: {}}
    q1 = Queue(cfg(name="Q1", max_per_subscription_backlog=5), load=data.__getitem__)
    q2 = Queue(cfg(name="Q2", max_per_subscription_backlog=2), load=data.__getitem__)
    q1.enqueue(1, 0.0)
    q2.enqueue(2, 0.0)
    q1.enqueue(3, 0.0)
    data[3] = {}
    c = Consumer("A", "A", max_backlog=effective_backlog(None, [q1.config, q2.config]))
    assert c.max_backlog == 1
    q1.add_consumer(c, 0.0)
    q2.add_consumer(c, 0.0)
    assert [d.position for d in q1.dispatch(0.0)] == [1]
    assert q2.dispatch(0.0) == []  # the one backlog slot is taken by Q1
    r = q1.acknowledge([1], by="A", option=NONE, now=0.0)
    assert r.freed == ("A",)  # the engine dispatches the consumer's other queues too
    assert [d.position for d in q2.dispatch(0.0)] == [2]
    assert c.outstanding == 1


# --- Delivery Fairness, table 15.1 ---------------------------------------------------------


def ghosts(b: Bench, outstanding: dict[str, int]) -> None:
    """Inky, Blinky and Clyde of table 15.1, each with its unacknowledged messages."""
    for name, backlog in (("Inky", 2), ("Blinky", 4), ("Clyde", 10)):
        c = b.consumer(name, backlog=backlog)
        c.outstanding = outstanding[name]  # held on another queue: one shared backlog


def test_delivery_fairness_table_15_1_proportional_picks_clyde():
    """Delivery Fairness, table 15.1: Inky 1/2 (50%), Blinky 3/4 (75%), Clyde 4/10 (40%):
    with proportional delivery a new message goes to Clyde."""
    b = Bench(fairness=Fairness.PROPORTIONAL)
    ghosts(b, {"Inky": 1, "Blinky": 3, "Clyde": 4})
    p = b.pub()
    assert b.deliver() == [("Clyde", p)]


def test_delivery_fairness_proportional_tie_goes_to_first_found():
    """Delivery Fairness, table 15.1: "If more than one subscription has the same unused
    capacity, AMPS delivers the message to the first subscription found"."""
    b = Bench(fairness=Fairness.PROPORTIONAL)
    ghosts(b, {"Inky": 1, "Blinky": 2, "Clyde": 5})  # all at 50%
    p = b.pub()
    assert b.deliver() == [("Inky", p)]


def test_delivery_fairness_proportional_is_the_default():
    """Delivery Fairness: proportional is the default for at-least-once queues."""
    assert cfg().fairness is Fairness.PROPORTIONAL
    b = Bench()
    ghosts(b, {"Inky": 1, "Blinky": 3, "Clyde": 4})
    p = b.pub()
    assert b.deliver() == [("Clyde", p)]


def test_delivery_fairness_fast_first_subscription_with_room():
    """Delivery Fairness, table 15.1, fast: "the first subscription found that does not
    have a full backlog"."""
    b = Bench(fairness=Fairness.FAST)
    ps = [b.pub() for _ in range(5)]
    b.consumer("A", backlog=3)
    b.consumer("B", backlog=3)
    assert b.deliver() == [("A", ps[0]), ("A", ps[1]), ("A", ps[2]), ("B", ps[3]), ("B", ps[4])]


def test_delivery_fairness_round_robin_evenly_among_subscriptions_with_room():
    """Delivery Fairness, table 15.1, round-robin: "the next available subscription that
    does not have a full backlog ... evenly among the subscribers that have space"."""
    b = Bench(fairness=Fairness.ROUND_ROBIN)
    ps = [b.pub() for _ in range(7)]
    b.consumer("A", backlog=5)
    b.consumer("B", backlog=1)
    b.consumer("C", backlog=5)
    got = b.deliver()
    assert got == [("A", ps[0]), ("B", ps[1]), ("C", ps[2]), ("A", ps[3]), ("C", ps[4]),
                   ("A", ps[5]), ("C", ps[6])]


def test_delivery_fairness_round_robin_continues_across_dispatches():
    b = Bench(fairness=Fairness.ROUND_ROBIN)
    b.consumer("A", backlog=9)
    b.consumer("B", backlog=9)
    p1 = b.pub()
    assert b.deliver() == [("A", p1)]
    p2 = b.pub()
    assert b.deliver() == [("B", p2)]
    p3 = b.pub()
    assert b.deliver() == [("A", p3)]


@pytest.mark.parametrize("fairness", [Fairness.FAST, Fairness.PROPORTIONAL])
def test_delivery_fairness_at_most_once_supports_only_round_robin(fairness):
    """Delivery Fairness: "For at-most-once delivery, AMPS supports only the round-robin
    method" (the config loader refuses it; the Queue refuses it too)."""
    with pytest.raises(ConfigError, match="round-robin"):
        Queue(cfg(semantics=AMO, fairness=fairness), load=lambda p: None)


def test_delivery_fairness_only_among_subscriptions_whose_filter_matches():
    """Message Flow, step 3: "There is a subscription that matches the message"; fairness
    picks among those only."""
    b = Bench(fairness=Fairness.PROPORTIONAL)
    b.consumer("A", backlog=10, flt=k_is(1))
    b.consumer("B", backlog=10, flt=k_is(2))
    p1, p2, p3 = b.pub(k=2), b.pub(k=1), b.pub(k=3)
    assert sorted(b.deliver()) == [("A", p2), ("B", p1)]
    assert list(b.q.available()) == [p3]


# --- Message Flow for Queues: the oldest matching message ----------------------------------


def test_message_flow_oldest_message_that_matches_the_subscription():
    """Message Flow, step 3: "The message is the oldest message in the queue that matches
    the subscription"."""
    b = Bench()
    p1, p2, p3, p4 = b.pub(k=1), b.pub(k=2), b.pub(k=1), b.pub(k=2)
    b.consumer("A", backlog=1, flt=k_is(2))
    assert b.deliver() == [("A", p2)]
    b.q.acknowledge([p2], by="A", option=NONE, now=0.0)
    assert b.deliver() == [("A", p4)]
    assert list(b.q.available()) == [p1, p3]


def test_message_flow_returned_message_is_again_the_oldest():
    """Message Flow, step 6: a message returned to the queue keeps its place, so it is
    delivered before newer ones."""
    b = Bench(lease_period_s=1.0)
    p1, p2 = b.pub(k=1), b.pub(k=1)
    b.consumer("A", backlog=1, flt=k_is(1))
    assert b.deliver(0.0) == [("A", p1)]
    b.q.acknowledge([p1], by="A", option=CANCEL, now=0.5)
    assert b.deliver(0.5) == [("A", p1)]
    b.q.expire(1.5)
    assert list(b.q.available()) == [p1, p2]
    assert b.deliver(1.5) == [("A", p1)]


def test_message_flow_filter_that_raises_is_no_match():
    b = Bench()
    _, p2 = b.pub(), b.pub(k=1)
    b.consumer("A", flt=lambda d, now: d["k"] == 1)  # KeyError on p1
    assert b.deliver() == [("A", p2)]
    assert b.q.statistics().filter_errors == 1


# --- Acknowledging Messages -------------------------------------------------------------------


def test_acknowledging_cancel_returns_message_and_counts():
    """Acknowledging Messages, cancel: "returns the message to the queue just as though the
    lease had expired ... The count of cancels for this message is incremented"."""
    b = Bench()
    p = b.pub()
    a = b.consumer("A")
    b.deliver()
    r = b.q.acknowledge([p], by="A", option=CANCEL, now=1.0)
    assert (r.cancelled, r.expired, r.events, r.freed) == (1, 0, (Cancelled(p, 1),), ("A",))
    assert a.outstanding == 0 and list(b.q.available()) == [p]
    assert b.q.details().messages[0].cancels == 1


def test_acknowledging_expire_removes_at_once_with_forced_expire():
    """Acknowledging Messages, expire: "immediately expires the message from the queue"
    (reason forced_expire, reference.md C.1)."""
    b = Bench()
    p = b.pub()
    b.consumer("A")
    b.deliver()
    r = b.q.acknowledge([p], by="A", option=EXPIRE, now=1.0)
    assert (r.expired, r.events) == (1, (Expired(p, ("forced_expire",)),))
    assert b.q.state_of(p) is MessageState.ABSENT


def test_handling_unprocessed_messages_third_cancel_expires_with_max_cancels_3():
    """Handling Unprocessed Messages: "AMPS will automatically expire a message from Jobs
    on the 3rd time it receives a sow_delete with the cancel operation" (MaxCancels 3).

    Discrepancy (reference.md A.2, MaxCancels): the option table of "Acknowledging
    Messages" says the message expires when the count "is greater than" MaxCancels,
    which would be the 4th cancel. We follow the worked example: count >= MaxCancels.
    """
    b = Bench(max_cancels=3, max_deliveries=10)
    p = b.pub()
    b.consumer("A")
    for n in (1, 2):
        b.deliver()
        r = b.q.acknowledge([p], by="A", option=CANCEL, now=0.0)
        assert r.events == (Cancelled(p, n),)
    b.deliver()
    r = b.q.acknowledge([p], by="A", option=CANCEL, now=0.0)
    assert r.events == (Cancelled(p, 3), Expired(p, ("max_cancels",)))
    assert (r.cancelled, r.expired) == (1, 1)
    assert b.q.state_of(p) is MessageState.ABSENT


def test_acknowledging_at_most_once_options_have_no_effect():
    """Acknowledging Messages: "For at-most-once queues, these options to acknowledgments
    have no effect" (the ack only frees backlog, reference.md B.7)."""
    b = Bench(semantics=AMO)
    p1, p2 = b.pub(), b.pub()
    a = b.consumer("A", backlog=2)
    b.deliver()
    r = b.q.acknowledge([p1], by="A", option=CANCEL, now=0.0)
    r2 = b.q.acknowledge([p2], by="A", option=EXPIRE, now=0.0)
    assert (r.released, r.events, r2.released, r2.events) == (1, (), 1, ())
    assert a.outstanding == 0 and list(b.q.available()) == []


def test_acknowledging_by_filter_acknowledges_every_matching_message_leased_or_not():
    """Acknowledging Messages: a sow_delete with a filter "acknowledges all messages that
    match the filter, regardless of whether the application ... has a current lease"."""
    b = Bench(leasing=Leasing.SLOPPY)
    p1, p2, p3 = b.pub(k=1), b.pub(k=2), b.pub(k=1)
    a = b.consumer("A")
    assert b.deliver() == [("A", p1)]
    r = b.q.acknowledge_matching(k_is(1), by="other", option=NONE, now=0.0)
    assert (r.acknowledged, r.events) == (2, (Acknowledged(p1), Acknowledged(p3)))
    assert a.outstanding == 0 and list(b.q.available()) == [p2]


def test_acknowledging_leasing_strict_refuses_ack_of_message_leased_to_another():
    """Acknowledging Messages: "The Leasing parameter on the queue specifies whether AMPS
    allows a client to successfully acknowledge messages that it does not currently have
    leased" (strict: refused, message by message, and counted)."""
    b = Bench(leasing=Leasing.STRICT)
    p1, p2, p3 = b.pub(), b.pub(), b.pub()
    a = b.consumer("A", owner="conn1")
    b.deliver()
    r = b.q.acknowledge([p1, p2], by="conn2", option=NONE, now=0.0)
    assert (r.refused, r.refused_positions, r.acknowledged) == (1, (p1,), 1)
    assert isinstance(r.error(), NotLeaseHolder)
    assert a.outstanding == 1 and b.q.state_of(p1) is MessageState.LEASED
    # the holder, the server (by=None) and the same connection may
    r = b.q.acknowledge([p1], by="conn1", option=NONE, now=0.0)
    assert r.acknowledged == 1 and r.error() is None
    b.deliver()
    assert b.q.acknowledge([p3], by=None, option=NONE, now=0.0).acknowledged == 1


def test_acknowledging_leasing_strict_refuses_filtered_ack_of_others_leases():
    b = Bench(leasing=Leasing.STRICT)
    _, p2 = b.pub(k=1), b.pub(k=1)
    b.consumer("A", owner="conn1")
    b.deliver()
    r = b.q.acknowledge_matching(k_is(1), by="conn2", option=NONE, now=0.0)
    assert (r.refused, r.acknowledged, r.events) == (1, 1, (Acknowledged(p2),))


def test_acknowledging_leasing_sloppy_accepts_and_frees_the_holders_backlog():
    b = Bench(leasing=Leasing.SLOPPY)
    p = b.pub()
    a = b.consumer("A", owner="conn1")
    b.deliver()
    r = b.q.acknowledge([p], by="conn2", option=CANCEL, now=0.0)
    assert (r.cancelled, r.freed, a.outstanding) == (1, ("A",), 0)


def test_acknowledging_is_idempotent():
    """Acknowledging Messages: unknown or already acknowledged bookmarks change nothing
    (counted as ignored), also twice in one batch."""
    b = Bench()
    p = b.pub()
    b.consumer("A")
    b.deliver()
    r = b.q.acknowledge([p, p, 12345], by="A", option=NONE, now=0.0)
    assert (r.acknowledged, r.ignored, r.events) == (1, 2, (Acknowledged(p),))
    r = b.q.acknowledge([p], by="A", option=EXPIRE, now=0.0)
    assert (r.ignored, r.events) == (1, ())


def test_acknowledging_an_unleased_message_by_bookmark():
    """An ack of an available message removes it (strict only guards leases); a cancel
    has nothing to return; an expire expires it."""
    b = Bench(leasing=Leasing.STRICT)
    p1, p2, p3 = b.pub(), b.pub(), b.pub()
    assert b.q.acknowledge([p1], by="x", option=NONE, now=0.0).events == (Acknowledged(p1),)
    assert b.q.acknowledge([p2], by="x", option=CANCEL, now=0.0).ignored == 1
    assert b.q.acknowledge([p3], by="x", option=EXPIRE, now=0.0).events == (
        Expired(p3, ("forced_expire",)),
    )
    assert list(b.q.available()) == [p2]


# --- Message Flow for Queues: MaxDeliveries and Expiration -----------------------------------


def test_message_flow_max_deliveries_expires_after_the_nth_unsuccessful_delivery():
    """Message Flow (at-least-once), step 6 / Handling Unprocessed Messages: with
    MaxDeliveries 10 the message expires "after the 10th unsuccessful delivery"."""
    b = Bench(max_deliveries=10, lease_period_s=1.0)
    p = b.pub()
    b.consumer("A")
    now = 0.0
    for n in range(1, 11):
        (d,) = b.q.dispatch(now)
        assert d.delivery_count == n
        now += 1.0
        events = b.q.expire(now)
    assert events == [LeaseExpired(p), Expired(p, ("max_deliveries",))]
    assert b.q.dispatch(now) == [] and b.q.state_of(p) is MessageState.ABSENT


def test_message_flow_broken_lease_counts_toward_max_deliveries():
    """A delivery whose lease a disconnect broke is an unsuccessful delivery (our choice,
    docs/queues.md): a poison message that kills its consumer still reaches the limit."""
    b = Bench(max_deliveries=2)
    p = b.pub()
    for name in ("A", "B"):
        c = b.consumer(name)
        b.deliver()
        events = b.q.remove_consumer(c, 0.0)
    assert events == [Returned(p), Expired(p, ("max_deliveries",))]


def test_acknowledging_cancel_counts_as_an_unsuccessful_delivery():
    """A cancel returns the message "just as though the lease had expired", so the
    MaxDeliveries limit applies to it too."""
    b = Bench(max_deliveries=1)
    p = b.pub()
    b.consumer("A")
    b.deliver()
    r = b.q.acknowledge([p], by="A", option=CANCEL, now=0.0)
    assert r.events == (Cancelled(p, 1), Expired(p, ("max_deliveries",)))


def test_message_flow_at_most_once_expiration_of_undelivered_message():
    """Message Flow (at-most-once), step 5: "If no subscription has requested the message,
    and the message has been in the queue longer than the Expiration time, AMPS removes
    the message"."""
    b = Bench(semantics=AMO, expiration_s=60.0)
    p1, p2 = b.pub(t=0.0), b.pub(t=30.0)
    assert b.q.next_deadline() == 60.0
    assert b.q.expire(59.9) == []
    assert b.q.expire(60.0) == [Expired(p1, ("time_limit",))]
    b.consumer("A")
    assert b.deliver(61.0) == [("A", p2)]
    assert b.q.expire(1000.0) == []  # a delivered message is gone, not expired


def test_message_flow_at_least_once_expiration_only_when_not_leased():
    """Message Flow (at-least-once), step 5: "If the message has been in the queue longer
    than the Expiration time, and there is no current lease on the message, AMPS removes
    the message"; step 6: a lease that expires after that is not returned."""
    b = Bench(expiration_s=60.0, lease_period_s=50.0)
    p1, p2 = b.pub(t=0.0), b.pub(t=0.0)
    b.consumer("A")
    assert b.deliver(40.0) == [("A", p1)]
    assert b.q.expire(60.0) == [Expired(p2, ("time_limit",))]
    assert b.q.state_of(p1) is MessageState.LEASED  # leased: not expired
    assert b.q.expire(90.0) == [LeaseExpired(p1), Expired(p1, ("time_limit",))]


def test_message_flow_lease_expiry_inside_expiration_returns_the_message():
    b = Bench(expiration_s=60.0, lease_period_s=10.0)
    p = b.pub(t=0.0)
    b.consumer("A")
    b.deliver(0.0)
    assert b.q.expire(10.0) == [LeaseExpired(p)]
    assert list(b.q.available()) == [p] and b.q.next_deadline() == 60.0


def test_handling_unprocessed_messages_several_reasons_at_once():
    """AMPS_REASON is a list: one expiry may carry several reasons (reference.md C.1)."""
    b = Bench(expiration_s=5.0, max_deliveries=1, max_cancels=1, lease_period_s=10.0)
    p = b.pub(t=0.0)
    b.consumer("A")
    b.deliver(0.0)
    r = b.q.acknowledge([p], by="A", option=CANCEL, now=6.0)
    assert r.events == (Cancelled(p, 1), Expired(p, ("time_limit", "max_cancels", "max_deliveries")))


def test_expiration_is_a_normal_exit_and_counted():
    b = Bench(expiration_s=1.0)
    b.pub(t=0.0)
    b.q.expire(2.0)
    s = b.q.statistics(2.0)
    assert (s.expired, s.queue_depth) == (1, 0)


# --- Startup and Recovery ---------------------------------------------------------------------


def record(b: Bench, journal: list, events) -> None:
    journal.extend(("ev", e) for e in events)


def rebuild(b: Bench, journal: list, now: float, start: int = 0) -> tuple[Queue, list]:
    q = Queue(b.config, load=b.data.__getitem__, start=start)
    for kind, *rest in journal:
        if kind == "pub":
            if rest[0] >= start:
                q.enqueue(rest[0], rest[1])
        else:
            replay(q, rest[0], now)
    return q, q.end_replay(now)


def test_recovery_rebuilds_queue_state_from_the_journal():
    """Startup and Recovery: the state is rebuilt from the transaction log. After a restart
    every lease is gone; acknowledged, expired and at-most-once-delivered messages never
    come back; unacknowledged messages come back with their counts."""
    b = Bench(max_cancels=5)
    journal: list = []
    ps = []
    for _ in range(4):
        ps.append(b.pub())
        journal.append(("pub", ps[-1], 0.0))
    b.consumer("A", backlog=4)
    dels = b.q.dispatch(0.0)
    record(b, journal, [d.event for d in dels])
    record(b, journal, b.q.acknowledge([ps[0]], by="A", option=NONE, now=0.0).events)
    record(b, journal, b.q.acknowledge([ps[1]], by="A", option=EXPIRE, now=0.0).events)
    record(b, journal, b.q.acknowledge([ps[2]], by="A", option=CANCEL, now=0.0).events)
    record(b, journal, [d.event for d in b.q.dispatch(0.0)])  # ps[2] again, 2nd delivery
    q, events = rebuild(b, journal, now=100.0)
    assert events == []
    assert list(q.available()) == [ps[2], ps[3]]  # leases gone: both available again
    rows = {r.position: (r.deliveries, r.cancels) for r in q.details().messages}
    assert rows == {ps[2]: (2, 1), ps[3]: (1, 0)}
    assert q.state_of(ps[0]) is q.state_of(ps[1]) is MessageState.ABSENT


def test_recovery_at_most_once_delivered_messages_never_come_back():
    b = Bench(semantics=AMO)
    journal = []
    p1, p2 = b.pub(), b.pub()
    journal += [("pub", p1, 0.0), ("pub", p2, 0.0)]
    b.consumer("A")
    record(b, journal, [d.event for d in b.q.dispatch(0.0)])
    q, _ = rebuild(b, journal, now=1.0)
    assert list(q.available()) == [p2]


def test_recovery_lease_broken_by_restart_at_max_deliveries_expires():
    """A restart breaks every lease like a disconnect does: a message whose lease ended
    with its MaxDeliveries-th delivery expires when the replay ends."""
    b = Bench(max_deliveries=1)
    journal = []
    p = b.pub()
    journal.append(("pub", p, 0.0))
    b.consumer("A")
    record(b, journal, [d.event for d in b.q.dispatch(0.0)])
    q, events = rebuild(b, journal, now=5.0)
    assert events == [Expired(p, ("max_deliveries",))]
    assert list(q.available()) == []


def test_recovery_torn_tail_between_cancelled_and_expired():
    """A journal torn after Cancelled(3) and before its Expired: the limit check at the end
    of the replay expires the message anyway."""
    b = Bench(max_cancels=3)
    p = b.pub()
    journal = [("pub", p, 0.0)] + [("ev", e) for e in (
        Leased(p, "A", 1), Cancelled(p, 1), Leased(p, "A", 2), Cancelled(p, 2),
        Leased(p, "A", 3), Cancelled(p, 3))]
    q, events = rebuild(b, journal, now=0.0)
    assert events == [Expired(p, ("max_cancels",))]
    assert list(q.available()) == []


def test_recovery_without_end_replay_the_next_expire_reports_the_events():
    b = Bench(max_deliveries=1)
    p = b.pub()
    q = Queue(b.config, load=b.data.__getitem__)
    q.enqueue(p, 0.0)
    q.replay.delivered(p, 0.0, count=1)
    assert q.next_deadline() == -math.inf
    q.add_consumer(Consumer("B", "B"), 1.0)  # the first live call settles the replay
    assert q.dispatch(1.0) == []
    assert q.expire(1.0) == [Expired(p, ("max_deliveries",))]
    assert q.next_deadline() is None


def test_recovery_replay_into_a_queue_with_consumers_is_refused():
    b = Bench()
    p = b.pub()
    b.consumer("A")
    with pytest.raises(QueueStateError):
        b.q.replay.delivered(p, 0.0, count=1)


def test_recovery_point_is_the_oldest_unfinished_message():
    """Startup and Recovery: recovery starts at "the most recent point in the transaction
    log at which all previous messages have been acknowledged" (queues.ack)."""
    b = Bench()
    assert b.q.recovery_point() == 0
    p1, p2, p3 = b.pub(), b.pub(), b.pub()
    assert b.q.recovery_point() == p1
    b.consumer("A")
    b.deliver()
    assert b.q.recovery_point() == p1  # leased is not done
    b.q.acknowledge([p1, p3], by="A", option=NONE, now=0.0)
    assert b.q.recovery_point() == p2
    b.q.acknowledge([p2], by=None, option=NONE, now=0.0)
    assert b.q.recovery_point() == p3 + 1
    assert Queue(b.config, load=b.data.__getitem__, start=500).recovery_point() == 500


def test_recovery_replay_from_the_recovery_point_ignores_older_messages():
    b = Bench()
    p1, p2 = b.pub(), b.pub()
    journal = [("pub", p1, 0.0), ("pub", p2, 0.0)]
    b.consumer("A", backlog=2)
    record(b, journal, [d.event for d in b.q.dispatch(0.0)])
    record(b, journal, b.q.acknowledge([p1], by="A", option=NONE, now=0.0).events)
    rp = b.q.recovery_point()
    assert rp == p2
    q, events = rebuild(b, journal, now=1.0, start=rp)  # Leased(p1), Acknowledged(p1) ignored
    assert events == [] and list(q.available()) == [p2]


# --- Querying Queues as a View ----------------------------------------------------------------


def test_querying_queues_as_a_view_excludes_leased_and_is_read_only():
    """Querying Queues as a View: the view shows the currently available messages; a query
    is read-only. Views and Aggregated Subscriptions: a leased message is no longer
    available, a returned message is again."""
    b = Bench(lease_period_s=1.0)
    p1, p2 = b.pub(), b.pub()
    b.consumer("A")
    b.deliver(0.0)
    before = b.q.statistics(0.0)
    assert list(b.q.available()) == [p2]
    assert list(b.q.available()) == [p2]
    assert b.q.statistics(0.0) == before
    b.q.expire(1.0)
    assert list(b.q.available()) == [p1, p2]


def test_view_refuses_changes_while_iterating():
    b = Bench()
    b.pub()
    b.pub()
    it = b.q.available()
    p = next(it)
    b.q.acknowledge([p], by=None, option=NONE, now=0.0)
    with pytest.raises(RuntimeError):
        next(it)


# --- Replacing Queue Subscriptions --------------------------------------------------------------


def test_replacing_keeps_leases_and_recomputes_backlog_10_to_5():
    """Replacing Queue Subscriptions, 2: "if the consumer has a requested max_backlog of 10
    and updates a subscription from a queue with a configured maximum of 10 to a queue with
    a configured maximum of 5, the new backlog for the subscription will be 5. However, the
    consumer may still have 10 messages outstanding"; no new message until it drops below."""
    b = Bench(max_per_subscription_backlog=10)
    ps = [b.pub() for _ in range(12)]
    c = b.consumer("A", backlog=effective_backlog(10, [b.config]))
    assert len(b.deliver()) == 10
    five = QueueConfig(name="Q5", message_type="json", max_per_subscription_backlog=5)
    b.q.replace_consumer(c, filter=None, max_backlog=effective_backlog(10, [five]), now=1.0)
    assert (c.max_backlog, c.outstanding) == (5, 10)
    assert b.q.statistics().backlog == 10  # "AMPS does not break message leases"
    b.q.acknowledge(ps[:5], by="A", option=NONE, now=1.0)
    assert b.deliver(1.0) == []  # 5 outstanding: not below the maximum
    b.q.acknowledge(ps[5:6], by="A", option=NONE, now=1.0)
    assert b.deliver(1.0) == [("A", ps[10])]


def test_replacing_new_filter_applies_to_later_deliveries_only():
    """Replacing Queue Subscriptions: "after the replace occurs, only messages that match
    the new subscription will be delivered"; leases of messages that no longer match are
    kept and can be acknowledged."""
    b = Bench()
    p1, p2, p3 = b.pub(k=1), b.pub(k=1), b.pub(k=2)
    c = b.consumer("A", backlog=1, flt=k_is(1))
    assert b.deliver() == [("A", p1)]
    b.q.replace_consumer(c, filter=k_is(2), max_backlog=2, now=0.0)
    assert b.deliver() == [("A", p3)]
    assert b.q.acknowledge([p1], by="A", option=NONE, now=0.0).acknowledged == 1
    assert list(b.q.available()) == [p2]


def test_replacing_to_another_topic_detaches_without_breaking_leases():
    b = Bench()
    p1, p2 = b.pub(), b.pub()
    c = b.consumer("A")
    b.deliver()
    b.q.detach_consumer(c, 0.0)
    b.q.acknowledge([p1], by="A", option=NONE, now=0.0)
    assert b.deliver() == [] and list(b.q.available()) == [p2]
    assert b.q.remove_consumer(c, 0.0) == []


def test_consumers_are_known_by_key():
    b = Bench()
    c = b.consumer("A")
    with pytest.raises(DuplicateSubscription):
        b.q.add_consumer(c, 0.0)
    with pytest.raises(UnknownSubscription):
        b.q.remove_consumer(Consumer("Z", "Z"), 0.0)
    with pytest.raises(UnknownSubscription):
        b.q.replace_consumer(Consumer("A", "A"), filter=None, max_backlog=1, now=0.0)


# --- statistics, deadlines, positions ------------------------------------------------------------


def test_statistics_follow_reference_d1():
    b = Bench(lease_period_s=10.0)
    b.pub(t=1.0), b.pub(t=2.0)
    b.consumer("A")
    b.deliver(3.0)
    s = b.q.statistics(5.0)
    assert (s.queue_depth, s.available, s.backlog, s.consumers) == (2, 1, 1, 1)
    assert (s.age_of_oldest_lease, s.seconds_behind) == (2.0, 4.0)
    b.q.expire(13.0)
    assert b.q.statistics().expired_leases == 1
    assert b.q.statistics().age_of_oldest_lease is None


def test_enqueue_positions_must_increase_and_times_never_go_back():
    b = Bench(expiration_s=10.0)
    p = b.pub(t=100.0)
    with pytest.raises(PositionOutOfOrder):
        b.q.enqueue(p, 0.0)
    assert list(b.q.available()) == [p]
    p2 = b.pub(t=50.0)  # a clock that stepped back: clamped, expiry order kept
    assert b.q.details().messages[1].published_at == 100.0
    assert b.q.expire(110.0) == [Expired(p, ("time_limit",)), Expired(p2, ("time_limit",))]


@pytest.mark.parametrize(
    "fields",
    [dict(priority="/p", target_queue_depth=5),  # Limiting Currently Deliverable Messages
     dict(barrier_expression="/eod = 1", target_queue_depth=5),
     dict(target_queue_depth=0), dict(priority="/p +"), dict(barrier_expression="AND"),
     dict(max_cancels=0), dict(max_deliveries=0), dict(lease_period_s=-1.0)],
)
def test_configuration_the_queue_cannot_honour_is_refused(fields):
    with pytest.raises(ConfigError):
        Queue(cfg(**fields), load=lambda p: None)
