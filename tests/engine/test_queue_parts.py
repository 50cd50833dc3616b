"""The queue's parts alone: the lease table, the seats, the active window, the delivery
order and the checked transitions (each module's rules, without a Queue around them)."""

from __future__ import annotations

import random

import pytest

from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.queue import priority as queue_priority
from conveyor.engine.queue.queue import AckOption, Queue
from conveyor.engine.queue.consumer import Consumer
from conveyor.engine.queue.events import ExpiryReason
from conveyor.engine.queue.leases import HEAP_SLACK, HEAP_SLACK_MIN, LeaseTable
from conveyor.engine.queue.order import DeliveryOrder
from conveyor.engine.queue.priority import order_key
from conveyor.engine.queue.seats import CANDIDATES_SLACK_MIN, Seats
from conveyor.engine.queue.state import IllegalTransition, MessageState, Transitions, Verb
from conveyor.engine.queue.window import ActiveWindow

S = MessageState


def table(**limits) -> LeaseTable:
    return LeaseTable(
        expiration_s=limits.get("expiration_s"), max_cancels=limits.get("max_cancels"),
        max_deliveries=limits.get("max_deliveries"),
    )


def seats(*consumers: Consumer, matches=lambda flt, p, now: flt(p)) -> tuple[Seats, list]:
    s = Seats("Q", priority=False, matches=matches)
    return s, [s.add(c) for c in consumers]


# --- LeaseTable (queue_leases) ---------------------------------------------------------------


def test_lease_table_keeps_the_backlog_and_the_held_set():
    """Rule 2: a lease or an at-most-once delivery takes a backlog slot, its end gives it
    back, exactly once."""
    s, (seat,) = seats(Consumer("A", "A", max_backlog=5))
    t = table()
    assert t.lease(1, seat, 10.0, 0.0, 1, delivery=True) == 1
    t.consume(2, seat)
    assert seat.held == {1, 2} and seat.consumer.outstanding == 2
    assert t.end(1).deadline == 10.0
    assert t.release(2) is seat
    assert seat.held == set() and seat.consumer.outstanding == 0
    t.check(lambda p: p == 1)  # 1 is back in the queue, with its delivery count


def test_lease_table_counts_deliveries_but_not_re_offers():
    s, (seat,) = seats(Consumer("A", "A", max_backlog=5))
    t = table()
    assert t.lease(1, seat, 1.0, 0.0, 1, delivery=True) == 1
    t.end(1)
    assert t.lease(1, seat, 2.0, 0.0, 1, delivery=True) == 2
    t.end(1)
    assert t.lease(1, seat, 3.0, 0.0, 1, delivery=False) == 2  # a take_back
    assert t.deliveries_of(1) == 2


def test_lease_deadline_heap_stays_bounded_and_due_skips_stale_entries():
    """Rule 3: acked and renewed leases leave stale entries; they are swept so the heap
    stays O(leases), and due() yields only live leases, in deadline order."""
    s, (seat,) = seats(Consumer("A", "A", max_backlog=10_000))
    t = table()
    for p in range(1000):
        t.lease(p, seat, 100.0 + p, 0.0, p, delivery=True)
        if p < 990:
            t.acknowledge(p)
        t.trim()
    assert t.deadlines_size <= HEAP_SLACK * 10 + HEAP_SLACK_MIN
    t.renew(995, t.leased[995], 50.0)  # earlier than every other
    assert t.next_deadline() == 50.0
    due = []
    for p, _ in t.due(1094.0):  # the caller ends each lease due
        due.append(p)
        t.end(p)
    assert due == [995, 990, 991, 992, 993, 994]
    t.check(lambda p: p in t.leased or p in due)


@pytest.mark.parametrize("seed", range(40))
def test_runs_and_single_deadlines_fall_due_together_in_order(seed):
    """Rule 3's runs (lease_all, renew_held) read with the single entries (lease, renew)
    against a model of the live leases: due() gives exactly those at or before now, in
    (deadline, position) order; next_deadline() is the earliest live one; check() holds;
    after a sweep the entries are bounded as with one heap."""
    rng = random.Random(seed)
    s, (seat, other) = seats(Consumer("A", "A", max_backlog=10**6), Consumer("B", "B", max_backlog=10**6))
    t = table()
    live: dict[int, float] = {}  # the model: position -> deadline
    free = list(range(1, 400))
    rng.shuffle(free)
    now = 0.0
    for _ in range(300):
        op = rng.random()
        if op < 0.25 and free:  # a batch, one deadline
            batch = sorted(free.pop() for _ in range(min(len(free), rng.randint(1, 20))))
            d = now + rng.choice([5.0, 10.0, 10.0, 20.0])
            t.lease_all(batch, seat, d, [0.0] * len(batch), batch)
            live.update(dict.fromkeys(batch, d))
        elif op < 0.4 and free:
            p = free.pop()
            d = now + rng.choice([3.0, 10.0, 15.0])
            t.lease(p, rng.choice([seat, other]), d, 0.0, p, delivery=True)
            live[p] = d
        elif op < 0.5:  # the named consumer's heartbeat: everything A holds
            d = now + rng.choice([10.0, 12.0])
            t.renew_held(seat, None, d)
            live.update({p: d for p in seat.held if p in live})
        elif op < 0.55 and live:
            p = rng.choice(sorted(live))
            d = now + rng.choice([1.0, 30.0])
            t.renew(p, t.leased[p], d)
            live[p] = d
        elif op < 0.8 and live:
            for p in rng.sample(sorted(live), min(len(live), rng.randint(1, 10))):
                t.acknowledge(p)
                del live[p]
                free.append(p)
            t.trim()
        else:
            now += rng.choice([1.0, 4.0, 9.0])
            expected = sorted((d, p) for p, d in live.items() if d <= now)
            got = []
            for p, lease in t.due(now):
                got.append((lease.deadline, p))
                t.end(p)
                t.forget(p)  # expired for good, as far as this test goes
                del live[p]
                free.append(p)
            assert got == expected
        assert t.next_deadline() == (min(live.values()) if live else None)
        t.check(lambda p: p in live)
        t.trim()  # the sweep, as the queue calls it after acks and renewals
        assert t.deadlines_size <= HEAP_SLACK * len(live) + HEAP_SLACK_MIN


def test_a_renewed_lease_is_not_due_at_its_old_deadline():
    """Rule 3: the entry a renewal leaves behind is stale."""
    s, (seat,) = seats(Consumer("A", "A", max_backlog=5))
    t = table()
    t.lease(1, seat, 10.0, 0.0, 1, delivery=True)
    t.renew(1, t.leased[1], 20.0)
    assert list(t.due(15.0)) == [] and t.next_deadline() == 20.0
    assert [p for p, _ in t.due(20.0)] == [1]


def test_lease_table_renews_only_the_seats_own_leases():
    s, (a, b) = seats(Consumer("A", "A", max_backlog=5), Consumer("B", "B", max_backlog=5))
    t = table()
    t.lease(1, a, 1.0, 0.0, 1, delivery=True)
    t.lease(2, b, 1.0, 0.0, 2, delivery=True)
    assert t.renew_held(a, [1, 2, 3], 9.0) == 1
    assert (t.leased[1].deadline, t.leased[2].deadline) == (9.0, 1.0)
    assert t.renew_held(b, None, 7.0) == 1 and t.next_deadline() == 7.0


def test_a_batch_lease_counts_first_and_repeated_deliveries():
    """lease_all of a batch: a message delivered before counts on from its count, the
    others start at 1 (a batch of first deliveries takes a path of its own)."""
    s, (seat,) = seats(Consumer("A", "A", max_backlog=100))
    t = table()
    assert t.lease_all(list(range(10)), seat, 5.0, [0.0] * 10, list(range(10))) == [1] * 10
    for p in (3, 7):
        t.end(p)
    t.acknowledge_all([0, 1, 2, 4, 5, 6, 8, 9], seat)
    assert t.lease_all([3, 7, 10, 11, 12, 13, 14, 15], seat, 9.0, [0.0] * 8, [3, 7, 10, 11, 12, 13, 14, 15]) == [
        2, 2, 1, 1, 1, 1, 1, 1]
    assert (t.deliveries_of(3), t.deliveries_of(10), t.deliveries_of(0)) == (2, 1, 0)
    t.check(lambda p: p in t.leased)


def test_acknowledging_every_lease_of_the_table_keeps_what_others_need():
    """acknowledge_all when the seat holds every lease of the table (emptied whole) and
    when another seat holds some (key by key): the other seat's leases, a waiting
    message's delivery count, cancel count and failure note all stay."""
    s, (a, b) = seats(Consumer("A", "A", max_backlog=100), Consumer("B", "B", max_backlog=100))
    t = table()
    t.lease(50, b, 5.0, 0.0, 50, delivery=True)
    t.end(50)
    t.cancel(50)
    t.note(50, "B", "busy")  # 50 waits in the queue, delivered and cancelled once
    batch = list(range(20))
    t.lease_all(batch, a, 5.0, [0.0] * 20, batch)
    t.cancel(4)
    t.acknowledge_all(batch, a)  # every lease of the table: emptied whole
    assert t.leased == {} and a.held == set() and a.consumer.outstanding == 0
    assert (t.deliveries_of(50), t.cancels_of(50), t.note_of(50)) == (1, 1, ("busy", "B"))
    assert (t.deliveries_of(4), t.cancels_of(4), t.counted()) == (0, 0, [50])
    t.lease_all(batch, a, 6.0, [0.0] * 20, batch)
    t.lease(50, b, 6.0, 0.0, 50, delivery=True)  # another seat holds a lease too
    t.acknowledge_all(batch, a)
    assert list(t.leased) == [50] and b.held == {50} and a.held == set()
    assert t.deliveries_of(50) == 2 and t.counted() == [50]
    t.check(lambda p: p == 50)


def test_lease_table_limit_reasons_in_reason_order():
    """Rule 5: every limit a returning message is over, in REASON_ORDER."""
    s, (seat,) = seats(Consumer("A", "A", max_backlog=5))
    t = table(expiration_s=5.0, max_cancels=1, max_deliveries=1)
    t.lease(1, seat, 1.0, 0.0, 1, delivery=True)
    t.end(1)
    t.cancel(1)
    assert t.limit_reasons(1, 0.0, 5.0) == (
        ExpiryReason.TIME_LIMIT, ExpiryReason.MAX_CANCELS, ExpiryReason.MAX_DELIVERIES,
    )
    assert t.limit_reasons(1, 0.0, 4.9) == (ExpiryReason.MAX_CANCELS, ExpiryReason.MAX_DELIVERIES)
    t.forget(1)
    assert t.limit_reasons(1, 0.0, 0.0) == () and t.counted() == []


def test_lease_table_check_finds_counts_of_a_message_that_left():
    """Rule 4, checked: counts are kept only for messages still in the queue."""
    s, (seat,) = seats(Consumer("A", "A", max_backlog=5))
    t = table()
    t.lease(1, seat, 1.0, 0.0, 1, delivery=True)
    t.end(1)  # ... and the queue forgot to call forget(1)
    with pytest.raises(AssertionError, match="counts kept"):
        t.check(lambda p: False)


# --- Seats (queue_seats) ---------------------------------------------------------------------


def test_round_robin_cursor_moves_back_when_a_consumer_before_it_leaves():
    """Rule 2: nobody is skipped when the consumer list shrinks."""
    s, (a, b, c) = seats(*(Consumer(k, k, max_backlog=5) for k in "ABC"))
    assert s.choose(Fairness.ROUND_ROBIN, [0, 1, 2]) == 0
    assert s.choose(Fairness.ROUND_ROBIN, [0, 1, 2]) == 1  # next: C (index 2)
    s.remove(a)  # C is now index 1
    assert [x.consumer.key for x in s.active] == ["B", "C"]
    assert s.active[s.choose(Fairness.ROUND_ROBIN, [0, 1])].consumer.key == "C"


def test_filtered_cursor_evaluates_each_message_once():
    """Rule 3: a message before the cursor is not evaluated again."""
    calls = []

    def matches(flt, p, now):
        calls.append(p)
        return flt(p)

    store = DeliveryOrder(priority=False, chunk_slots=None, on_first_epoch_grew=lambda: None).store
    for p in range(10):
        store.append(p, 0.0)
    s, (seat,) = seats(Consumer("A", "A", filter=lambda p: p % 3 == 2), matches=matches)
    assert s.next_for(seat, store.__contains__, store, 10, 0.0) == 2
    assert s.next_for(seat, store.__contains__, store, 10, 0.0) == 2  # from the candidate heap
    store.discard(2)
    assert s.next_for(seat, store.__contains__, store, 10, 0.0) == 5
    assert calls == [0, 1, 2, 3, 4, 5]
    for p in (5, 8):
        store.discard(p)
    assert s.next_for(seat, store.__contains__, store, 10, 0.0) is None and seat.cursor == 10


def test_candidates_of_a_full_filtered_consumer_stay_bounded():
    """Rule 4: messages that keep coming back behind a full consumer's cursor do not grow
    its candidate heap without bound."""
    store = DeliveryOrder(priority=False, chunk_slots=None, on_first_epoch_grew=lambda: None).store
    for p in range(4):
        store.append(p, 0.0)
    s, (seat,) = seats(Consumer("slow", "s", filter=lambda p: True))
    seat.cursor = 4  # it evaluated everything before 4
    for _ in range(500):
        for p in range(3):
            s.came_back(p, store.__contains__, 0.0)
    assert len(seat.candidates) <= 2 * 3 + CANDIDATES_SLACK_MIN + 1


# --- ActiveWindow (queue_window) ---------------------------------------------------------------


def test_window_holds_in_order_and_a_deferred_ack_is_consumed_by_its_offer():
    """Rules 2 and 4: once one message is inactive every later one is; an offer of a
    position whose ack was deferred never activates it; passed deferred acks are dropped."""
    w = ActiveWindow(2, start=0)
    assert not w.holds_back(1) and w.holds_back(2)
    w.enter(0)
    for p in (3, 5, 7):
        w.hold(p)
    assert w.holds_back(0) and w.inactive == 3 and w.refill_from() == 3
    assert w.is_inactive(5) and not w.is_inactive(0) and not w.is_inactive(8)
    w.defer_ack(4)  # a position the queue cannot tell is not one of its messages
    w.defer_ack(5)
    assert w.deferred_ack_count == 2 and w.wants(0) == 2
    assert w.offer(3) is True
    assert w.offer(5) is False  # consumed by its deferred ack; 4 was passed: dropped
    assert w.deferred_ack_count == 0 and w.inactive == 1
    assert w.offer(7) is True
    assert w.inactive == 0 and w.refill_from() is None and w.wants(0) == 0


@pytest.mark.parametrize("seed", range(30))
def test_window_against_a_list_of_held_positions(seed):
    """Rules 2-4 against the obvious model: the held positions in order, the deferred
    acks (of held messages and of other journal positions in the inactive part, which
    the window cannot tell apart), each refill offering the next held message."""
    rng = random.Random(seed)
    w = ActiveWindow(3, start=0)
    held: list[int] = []  # inactive messages, in order
    deferred: set[int] = set()
    offered, last, refill = -1, -1, None
    for _ in range(200):
        op = rng.random()
        if op < 0.4:
            last += rng.randint(1, 3)  # the gaps are other journal records
            if not held and not w.holds_back(rng.randint(0, 3)):
                w.enter(last)
                offered = last
            else:
                w.hold(last)
                refill = last if not held else refill
                held.append(last)
        elif op < 0.7 and held:
            p = rng.randint(offered + 1, last)
            assert w.is_inactive(p)
            if p not in deferred:
                w.defer_ack(p)
                deferred.add(p)
        elif held:
            p = held.pop(0)
            assert w.offer(p) is (p not in deferred)
            deferred = {d for d in deferred if d > p}
            offered = refill = p
            if not held:
                deferred.clear()
        assert (w.inactive, w.deferred_ack_count, w.offered) == (len(held), len(deferred), offered)
        assert w.refill_from() == (refill if held else None)
        assert all(w.acked(d) for d in deferred)


def test_window_export_and_restore():
    w = ActiveWindow(1, start=10)
    w.enter(10)
    w.hold(11)
    w.hold(12)
    w.defer_ack(12)
    inactive, refill_from, acks = w.export()
    other = ActiveWindow(1, start=0)
    other.restore(offered=w.offered, inactive=inactive, refill_from=refill_from, acks=acks, last=12)
    assert (other.inactive, other.refill_from(), other.acked(12), other.is_inactive(11)) == (
        2, 11, True, True,
    )


# --- DeliveryOrder (queue_order) ----------------------------------------------------------------


def test_fifo_order_stops_at_the_first_barrier():
    """Rule 3: nothing at or after the first pending barrier is deliverable."""
    o = DeliveryOrder(priority=False, chunk_slots=None, on_first_epoch_grew=lambda: None)
    for p, barrier in ((1, False), (2, True), (3, False)):
        o.append(p, 0.0, p, barrier)
    assert o.head() == 1 and o.gate() == 2 and o.barrier_due() is None
    assert o.take(1) == 0.0
    assert o.head() is None and o.barrier_due() == 2
    o.remove(2)
    assert o.head() == 3 and o.barriers == [] and list(o) == [3]


def test_priority_epochs_join_when_a_barrier_leaves(monkeypatch):
    """Rules 2 and 4: a barrier that leaves joins its epochs; the first one grew, so the
    filtered cursors are rebuilt. queue/priority.py rule 4: lazily removed entries are
    swept once they outnumber the live ones."""
    monkeypatch.setattr(queue_priority, "_STALE_SLACK", 8)
    grew = []
    o = DeliveryOrder(priority=True, chunk_slots=None, on_first_epoch_grew=lambda: grew.append(1))
    o.append(1, 0.0, order_key(1, 1), False)
    o.append(2, 0.0, 2, True)
    o.append(3, 0.0, order_key(9, 3), False)
    assert o.head() == order_key(1, 1) and list(o) == [1, 2, 3]
    o.remove(2)
    assert grew == [1] and o.head() == order_key(9, 3) and list(o) == [3, 1]
    keys = [order_key(p % 7, p) for p in range(10, 410)]
    for p, k in zip(range(10, 410), keys):
        o.append(p, 0.0, k, False)
    for p in range(10, 410):
        if p % 5:
            o.remove(p)
    index = o.deliverable()
    assert len(index) == 82 and index.stale <= len(index) + 8


# --- Transitions (queue_state) ----------------------------------------------------------------


def test_a_move_checks_where_the_message_is():
    """queue/state.py rule 1: under __debug__, a move from a state the message is not in
    fails before anything changes; step() trusts its caller; the table refuses a pair
    it does not have."""
    where = {7: S.AVAILABLE}
    t = Transitions(Semantics.AT_LEAST_ONCE, lambda p: where.get(p, S.ABSENT))
    assert t.move(7, Verb.LEASE, S.AVAILABLE) is S.LEASED
    if __debug__:
        with pytest.raises(AssertionError, match="is available, not leased"):
            t.move(7, Verb.ACKNOWLEDGE, S.LEASED)
    assert t.step(7, Verb.RETURN, S.LEASED) is S.AVAILABLE
    with pytest.raises(IllegalTransition):
        t.move(7, Verb.DELIVER, S.AVAILABLE)  # at-least-once has no DELIVER


@pytest.mark.parametrize("semantics", list(Semantics))
def test_every_way_out_leaves_the_parts_consistent(semantics):
    """Queue.check_invariants after each way a message leaves: acknowledged, cancelled
    over MaxCancels, forced expiry, lease expiry over MaxDeliveries, Expiration, a broken
    lease, an at-most-once delivery acknowledged (no counts are kept for a message that
    is gone, no backlog slot is held for it)."""
    alo = semantics is Semantics.AT_LEAST_ONCE
    cfg = QueueConfig(
        name="Q", message_type="json", semantics=semantics, lease_period_s=1.0,
        expiration_s=50.0, max_cancels=1 if alo else None, max_deliveries=1 if alo else None,
        fairness=Fairness.ROUND_ROBIN,
    )
    q = Queue(cfg, load=lambda p: {})
    for p in range(8):
        q.enqueue(p, 0.0)
    c = Consumer("A", "A", max_backlog=10)
    q.add_consumer(c, 0.0)
    got = [d.position for d in q.dispatch(0.0, max_deliveries=6)]
    q.check_invariants()
    option = (AckOption.NONE, AckOption.CANCEL, AckOption.EXPIRE)
    for i, p in enumerate(got[:3]):
        q.acknowledge([p], by="A", option=option[i], now=0.5)
        q.check_invariants()
    q.expire(2.0)  # got[3:5]: the lease expires, at MaxDeliveries
    q.check_invariants()
    q.remove_consumer(c, 2.0)  # what is left is returned
    q.check_invariants()
    q.expire(60.0)  # Expiration of everything still there
    q.check_invariants()
    assert q.statistics().queue_depth == 0 and c.outstanding == 0
