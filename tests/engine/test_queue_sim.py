"""Deterministic simulation of queues against the reference model (STYLE item 11).

One seed drives everything: the queue configurations, publishes into one or two queues
over the same journal, consumers that come, go, are replaced and span both queues (one
backlog), dispatches, acknowledgements (none / cancel / expire, by bookmark and by
filter, from the holder, another owner or the server), lease expiries, clock jumps, and
crash-restarts: the Queue objects are dropped and rebuilt by replaying the journal from
the last stored recovery point, while the model applies "every lease is broken".

Queues are FIFO, priority, barrier, priority with barriers, or TargetQueueDepth ones
(the simulation plays the engine: it computes each message's priority and barrier flag
at publish and refills the active window from its journal, live and during replay).
About a third of the at-least-once ones that are not TargetQueueDepth have an
``OrderingKey`` (per-key ordering, N of 1 to 3; some messages have no key), checked
against the model and by the invariant that a key's leased messages are always among
its first N unfinished ones (so never more than N).

Each call is checked against :mod:`tests.engine.queue_model` (same deliveries, same
events, same state), and these invariants are checked independently of the model:
nothing acknowledged or expired reappears; nothing unacknowledged at-least-once is lost
(it is available, leased, inactive, or expired with an Expired event); nothing
at-most-once is delivered twice; a backlog is never exceeded except after a replace
lowered it; every delivery is the first message in delivery order (highest priority,
then oldest) the consumer's filter matches, and none is after a pending barrier; a
barrier is never delivered while an earlier message is unacknowledged; the active part
of a TargetQueueDepth queue never exceeds the target. The queue's own invariants
(``Queue.check_invariants``: the parts agree with each other) are checked after every
step, and every transition checks, under ``__debug__``, that the message is where the
calling branch believes it is.

A failure names its seed. Replay one: ``CONVEYOR_SIM_SEED=123 pytest tests/engine/test_queue_sim.py``.
More seeds (nightly): ``CONVEYOR_SIM_SEEDS=200000``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from conveyor.config.model import Fairness, Leasing, QueueConfig, Semantics
from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.queue.queue import AckOption, Consumer, Queue, effective_backlog
from conveyor.engine.queue.events import (
    Acknowledged,
    BarrierDelivered,
    Cancelled,
    DeliveredAtMostOnce,
    Expired,
    Leased,
)
from conveyor.engine.queue.state import MessageState

from .queue_model import MConsumer, ModelQueue, replay
from tests.engine.seeds import seed_batches

SEEDS_DEFAULT = 2000
BATCH = 100  # seeds per test case: a failing case still names the exact seed
STEPS = 70  # operations per seed
OWNERS = ("o1", "o2", "o3")




#: Priority values: few, so that equal priorities (oldest first) are common; -1 is NaN.
PRIORITIES = (-1, 0, 1, 2, 7, 2**64 - 1)
KINDS = (("fifo", 10), ("priority", 4), ("barrier", 3), ("priority+barrier", 2), ("tqd", 4))


def _random_config(rng: random.Random, name: str, seed: int = 0) -> QueueConfig:
    alo = rng.random() < 0.7
    kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
    # Drawn apart, so the seeds' other draws stay what they were before per-key ordering.
    krng = random.Random(f"{seed}/{name}")
    keyed = alo and kind != "tqd" and krng.random() < 0.35
    return QueueConfig(
        ordering_key="/g" if keyed else None,
        max_in_flight_per_key=krng.choice([1, 1, 2, 3]),
        priority="/p" if "priority" in kind else None,
        barrier_expression="/b = 1" if "barrier" in kind else None,
        target_queue_depth=rng.choice([1, 2, 3, 5]) if kind == "tqd" else None,
        name=name,
        message_type="json",
        semantics=Semantics.AT_LEAST_ONCE if alo else Semantics.AT_MOST_ONCE,
        fairness=rng.choice(list(Fairness)) if alo else Fairness.ROUND_ROBIN,
        lease_period_s=rng.choice([1.0, 2.0, 5.0]),
        expiration_s=rng.choice([None, None, 6.0, 20.0]),
        max_cancels=rng.choice([None, 1, 2, 3]),
        max_deliveries=rng.choice([None, None, 1, 2, 4]),
        leasing=rng.choice(list(Leasing)),
        max_per_subscription_backlog=rng.choice([None, None, 1, 2, 4]),
        retry_backoff_s=rng.choice([(), (), (1.0,), (0.5, 2.0)]),  # delayed retries (queue/returns.py)
    )


# Filters are module-level callables so the real and the model consumer share them.
# Each costs one tick of the filter budget (queue rule 12), which half the seeds give a
# few ticks per turn, so that dispatches are cut short and go on in later turns.
def _costed(flt):
    flt.cost_ticks = 1
    return flt


def _eq(k):
    return _costed(lambda d, now: d["k"] == k)


def _ne(k):
    return _costed(lambda d, now: d["k"] != k)


FILTERS = [None, None, _eq(0), _eq(1), _ne(2)]


@dataclass
class Sub:
    real: Consumer
    model: MConsumer
    qids: set[int]
    lowered: bool = False  # a replace lowered max_backlog below outstanding


@dataclass
class World:
    seed: int
    rng: random.Random
    configs: list[QueueConfig]
    now: float = 0.0
    journal: list[tuple] = field(default_factory=list)
    data: dict[int, dict] = field(default_factory=dict)
    subs: dict[str, Sub] = field(default_factory=dict)
    next_sub: int = 0
    batch: int = 0  # which call journaled an event
    stored_rp: list[int] = field(default_factory=list)
    # ground truth, from the events seen
    enqueued: list[set[int]] = field(default_factory=list)
    done: list[set[int]] = field(default_factory=list)  # acked, expired, delivered a-m-o
    queues: list[Queue] = field(default_factory=list)
    models: list[ModelQueue] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)  # paths taken, for the coverage test

    def __post_init__(self) -> None:
        n = len(self.configs)
        # Not drawn from rng: the seeds' workloads stay what they were without a budget.
        self.budget = None if self.seed % 2 else FilterBudget(1 + self.seed % 5)
        self.queues = [Queue(c, load=self.data.__getitem__, budget=self.budget) for c in self.configs]
        self.models = [ModelQueue(c, self.data.__getitem__) for c in self.configs]
        self.stored_rp = [0] * n
        self.enqueued = [set() for _ in range(n)]
        self.done = [set() for _ in range(n)]

    def fail(self, what: str) -> None:
        pytest.fail(f"seed {self.seed} at t={self.now}: {what}", pytrace=False)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.fail(what)

    # --- journal --------------------------------------------------------------------

    def journal_events(self, qid: int, events) -> None:
        self.batch += 1
        for e in events:
            self.journal.append(("ev", qid, e, self.batch))
            match e:
                case Acknowledged(position=p) | Expired(position=p) | DeliveredAtMostOnce(
                    position=p
                ) | BarrierDelivered(position=p):
                    self.expect(p not in self.done[qid], f"q{qid}: {p} done twice ({e})")
                    self.done[qid].add(p)

    def see(self, what: str, n: int = 1) -> None:
        self.seen[what] = self.seen.get(what, 0) + n

    # --- the engine's part: priority and barrier at publish, TargetQueueDepth refill ---

    def refill_queue(self, qid: int, q: Queue) -> None:
        """Read the journal from refill_from() and offer each message of the queue to
        activate() while the queue wants more (queue/window.py rule 3)."""
        i = q.refill_from()
        while q.wants():
            self.expect(i is not None and i < len(self.journal), f"q{qid}: refill ran dry")
            rec = self.journal[i]
            if rec[0] == "pub" and qid in rec[1]:
                if q.activate(rec[2], rec[3]):
                    self.see("activated")
            i += 1

    def refill(self) -> None:
        for qid, (q, m) in enumerate(zip(self.queues, self.models)):
            if q.config.target_queue_depth is None:
                continue
            self.expect(q.wants() == m.wants(), f"q{qid} wants {q.wants()} != {m.wants()}")
            consumed = len(m.deferred)
            self.refill_queue(qid, q)
            m.refill()
            self.see("deferred ack consumed", consumed - len(m.deferred))

    # --- operations -------------------------------------------------------------------

    def publish(self) -> None:
        qids = self.rng.choice([[0], [1], [0, 1]]) if len(self.queues) == 2 else [0]
        p = len(self.journal)
        self.data[p] = {
            "k": self.rng.randrange(3),
            "p": self.rng.choice(PRIORITIES),
            "b": int(self.rng.random() < 0.12),
        }
        g = (p * 2654435761 + self.seed) % 5  # the ordering key: not drawn from rng (see _random_config)
        if g < 3:
            self.data[p]["g"] = g
        self.journal.append(("pub", tuple(qids), p, self.now))
        for qid in qids:
            got = self.enqueue(self.queues[qid], qid, p, self.now)
            want = self.models[qid].enqueue(p, self.now, *self.message_args(qid, p))
            self.expect(got == want, f"q{qid} enqueue {p}: active {got} != {want}")
            self.enqueued[qid].add(p)

    def message_args(self, qid: int, p: int) -> tuple:
        """(priority, barrier, ordering key) as the engine computes them from the queue's
        expressions (a barrier has no key; no g field, no key)."""
        cfg = self.configs[qid]
        d = self.data[p]
        barrier = cfg.barrier_expression is not None and d["b"] == 1
        g = d.get("g")
        return (
            d["p"] if cfg.priority is not None else None,
            barrier,
            None if cfg.ordering_key is None or barrier or g is None else str(g),
        )

    def enqueue(self, q: Queue, qid: int, p: int, t: float) -> bool:
        prio, barrier, key = self.message_args(qid, p)
        return q.enqueue(p, t, prio, barrier, ordering_key=key)

    def add_consumer(self) -> None:
        qids = self.rng.choice([{0}, {1}, {0, 1}]) if len(self.queues) == 2 else {0}
        requested = self.rng.choice([None, 0, 1, 2, 3, 5])
        backlog = effective_backlog(requested, [self.configs[i] for i in qids])
        key = f"c{self.next_sub}"
        self.next_sub += 1
        owner = self.rng.choice(OWNERS)
        flt = self.rng.choice(FILTERS)
        sub = Sub(Consumer(key, owner, filter=flt, max_backlog=backlog),
                  MConsumer(key, owner, flt, backlog), set(qids))
        self.subs[key] = sub
        for qid in sorted(qids):
            self.queues[qid].add_consumer(sub.real, self.now)
            self.models[qid].add(sub.model)

    def remove_consumer(self) -> None:
        key = self.rng.choice(sorted(self.subs))
        sub = self.subs.pop(key)
        for qid in range(len(self.queues)):
            if key not in self.models[qid].attached:
                continue
            events = self.queues[qid].remove_consumer(sub.real, self.now)
            expected = self.models[qid].remove(sub.model, self.now)
            self.expect(events == expected, f"q{qid} remove {key}: {events} != {expected}")
            self.journal_events(qid, events)

    def replace_consumer(self) -> None:
        key = self.rng.choice(sorted(self.subs))
        sub = self.subs[key]
        flt = self.rng.choice(FILTERS)
        qids = set(sub.qids)
        if len(self.queues) == 2 and self.rng.random() < 0.3:
            qids = self.rng.choice([{0}, {1}, {0, 1}])  # the topic changed
        requested = self.rng.choice([None, 0, 1, 2, 3, 5])
        backlog = effective_backlog(requested, [self.configs[i] for i in qids])
        for qid in range(len(self.queues)):
            q, m = self.queues[qid], self.models[qid]
            if qid in qids:
                if key in m.attached:
                    q.replace_consumer(sub.real, filter=flt, max_backlog=backlog, now=self.now)
                    m.reattach(sub.model)
                else:
                    sub.real.filter, sub.real.max_backlog = flt, backlog
                    q.add_consumer(sub.real, self.now)
                    m.add(sub.model)
            elif key in m.attached:
                q.detach_consumer(sub.real, self.now)
                m.detach(sub.model)
        sub.real.filter = sub.model.filter = flt
        sub.real.max_backlog = sub.model.max_backlog = backlog
        sub.qids = qids
        sub.lowered = sub.real.outstanding > backlog

    def dispatch_in_turns(self, q: Queue, limit: int | None) -> list:
        """What the engine does: a dispatch the filter budget cut short goes on in the
        next turns; together they must deliver what one unbounded dispatch would."""
        out = q.dispatch(self.now, limit)
        while q.cut_short:
            self.seen["dispatch_cut_short"] = self.seen.get("dispatch_cut_short", 0) + 1
            self.budget.new_turn()
            out += q.dispatch(self.now, None if limit is None else limit - len(out))
        if self.budget is not None:
            self.budget.new_turn()
        return out

    def dispatch(self) -> None:
        qids = range(len(self.queues))
        if self.rng.random() < 0.5:
            qids = [self.rng.randrange(len(self.queues))]
        limit = self.rng.choice([None, None, None, 1, 2])
        self.refill()  # the engine refills before it dispatches
        for qid in qids:
            q, m = self.queues[qid], self.models[qid]
            before = m.available() + m.releasable()  # a dispatch releases held messages first
            awaiting = [p for p, _ in q.details().awaiting_ack]
            got = self.dispatch_in_turns(q, limit)
            want = m.dispatch(self.now, limit)
            got_t = [
                (None if d.barrier else d.consumer.key, d.position, d.lease_deadline,
                 d.delivery_count, d.barrier, tuple(c.key for c in d.recipients))
                for d in got
            ]
            want_t = [
                (d.consumer_key, d.position, d.lease_deadline, d.delivery_count, d.barrier,
                 d.recipients)
                for d in want
            ]
            self.expect(got_t == want_t, f"q{qid} dispatch: {got_t} != {want_t}")
            self.check_order(qid, before, awaiting, got)
            self.journal_events(qid, [d.event for d in got])
            self.expect(
                [d.event for d in got] == [m.delivery_event(d) for d in want],
                f"q{qid} delivery events differ",
            )

    def _rank(self, qid: int, p: int) -> tuple:
        prio = self.message_args(qid, p)[0]
        prio = -1 if prio is None else prio
        return (prio < 0, -prio, p)

    def check_order(self, qid: int, before: list[int], awaiting: list[int], deliveries) -> None:
        """Message Flow step 3: the first message in delivery order (the highest priority,
        the oldest at that priority) the consumer matches; step 4: nothing after a barrier
        that has not been delivered, and a barrier only once every earlier message is
        acknowledged."""
        avail = list(before)
        done = set(self.done[qid])
        barrier_of = lambda p: self.message_args(qid, p)[1]  # noqa: E731
        for d in deliveries:
            self.expect(d.position in avail, f"q{qid}: delivered {d.position}, not available")
            self.expect(d.position not in self.done[qid], f"q{qid}: {d.position} came back")
            pending = [p for p in avail if barrier_of(p)]
            if d.barrier:
                self.see("barrier")
                earlier = [p for p in self.enqueued[qid] if p < d.position and p not in done]
                self.expect(not earlier, f"q{qid}: barrier {d.position} before {earlier}")
                self.expect(not [p for p in awaiting if p < d.position],
                            f"q{qid}: barrier {d.position} before acks of {awaiting}")
                self.expect(d.position == min(pending), f"q{qid}: barrier out of order")
            else:
                first_barrier = min(pending, default=None)
                self.expect(first_barrier is None or d.position < first_barrier,
                            f"q{qid}: {d.position} delivered after barrier {first_barrier}")
                flt = d.consumer.filter
                better = [
                    p for p in avail
                    if not barrier_of(p) and (first_barrier is None or p < first_barrier)
                    and self._rank(qid, p) < self._rank(qid, d.position)
                    and (flt is None or flt(self.data[p], 0.0))
                ]
                self.expect(not better, f"q{qid}: {d.position} to {d.consumer.key} before {better}")
                if not self.queues[qid]._at_least_once:
                    awaiting.append(d.position)
            done.add(d.position) if d.barrier or not self.queues[qid]._at_least_once else None
            avail.remove(d.position)

    def _by(self):
        r = self.rng.random()
        if r < 0.15:
            return None
        if r < 0.7 and self.subs:
            return self.subs[self.rng.choice(sorted(self.subs))].real.owner
        return self.rng.choice(OWNERS)

    def _option(self) -> AckOption:
        return self.rng.choices(list(AckOption), weights=[6, 3, 1])[0]

    def _retry(self) -> tuple[float | None, str]:
        """A cancel's delayed retry (asked, or None: the backoff) and a failure reason."""
        delay = self.rng.choice([None, None, 0.0, 0.5, 3.0])
        return delay, self.rng.choice(["", "", "db timeout", "bad schema"])

    def ack_bookmarks(self) -> None:
        qid = self.rng.randrange(len(self.queues))
        m = self.models[qid]
        pool = [p for p, x in m.msgs.items() if x.holder is not None] + list(m.consumed)
        pool = pool * 3 + list(m.msgs) + sorted(self.enqueued[qid])[-5:] + [-7, 10**9]
        pool += m.inactive()[:3]
        positions = [self.rng.choice(pool) for _ in range(self.rng.randint(1, 4))]
        by, option = self._by(), self._option()
        delay, reason = self._retry() if option is not AckOption.NONE else (None, "")
        delay = delay if option is AckOption.CANCEL else None
        got = self.queues[qid].acknowledge(positions, by=by, option=option, now=self.now, delay=delay, reason=reason)
        want = m.acknowledge(positions, by, option, self.now, delay, reason)
        self.compare_ack(qid, got, want, f"ack {positions} by {by} {option}")

    def ack_filter(self) -> None:
        qid = self.rng.randrange(len(self.queues))
        k = self.rng.randrange(3)
        pred = lambda d, now: d["k"] == k  # noqa: E731
        by, option = self._by(), self._option()
        got = self.queues[qid].acknowledge_matching(pred, by=by, option=option, now=self.now)
        want = self.models[qid].acknowledge_matching(pred, by, option, self.now)
        self.compare_ack(qid, got, want, f"ack k=={k} by {by} {option}")

    def compare_ack(self, qid: int, got, want: dict, what: str) -> None:
        got_d = dict(
            acknowledged=got.acknowledged, cancelled=got.cancelled, expired=got.expired,
            released=got.released, refused=got.refused, ignored=got.ignored,
            deferred=got.deferred, events=list(got.events), freed=list(got.freed),
        )
        self.see("deferred ack", got.deferred)
        self.expect(got_d == want, f"q{qid} {what}: {got_d} != {want}")
        self.journal_events(qid, got.events)

    def expire(self) -> None:
        for qid, (q, m) in enumerate(zip(self.queues, self.models)):
            got, want = q.expire(self.now), m.expire(self.now)
            self.expect(got == want, f"q{qid} expire: {got} != {want}")
            self.journal_events(qid, got)

    def tick(self) -> None:
        if self.rng.random() < 0.15:
            self.now += self.rng.uniform(5, 40)  # a clock jump past leases and expirations
        else:
            self.now += self.rng.choice([0.0, 0.25, 0.5, 1.0, 1.5])

    def store_recovery_point(self) -> None:
        for qid, q in enumerate(self.queues):
            rp = q.recovery_point()
            self.expect(rp >= self.stored_rp[qid], f"q{qid}: recovery point went back")
            self.stored_rp[qid] = rp

    def crash(self) -> None:
        """Drop every Queue and consumer; rebuild from the journal and recovery points.

        Half the time the journal is replayed as written; otherwise as a lossy engine
        might write it: no Returned / LeaseExpired records, no counts, and each call's
        events regrouped with Expired first. Both must rebuild the same queue.
        """
        self.subs.clear()
        lossy = self.rng.random() < 0.5
        for qid, cfg in enumerate(self.configs):
            start = self.stored_rp[qid]
            q = Queue(cfg, load=self.data.__getitem__, start=start, budget=self.budget)
            records = self.journal[start:]
            if lossy:
                records = _lossy(records)
            for rec in records:
                if rec[0] == "pub":
                    if qid in rec[1]:
                        self.enqueue(q, qid, rec[2], rec[3])
                elif rec[1] == qid:
                    if lossy:
                        _replay_lossy(q, rec[2], self.now)
                    else:
                        replay(q, rec[2], self.now)
                    self.refill_queue(qid, q)  # as live: the window refills as it drains
            got = q.end_replay(self.now)
            want = self.models[qid].crash(self.now)
            self.expect(got == want, f"q{qid} restart (lossy={lossy}): {got} != {want}")
            self.queues[qid] = q
            self.journal_events(qid, got)
            if cfg.target_queue_depth is not None:
                # The replay refilled as it went; the engine refills after end_replay too.
                self.refill_queue(qid, q)
                self.models[qid].refill()

    # --- checks after every step ---------------------------------------------------------

    def check_keys(self, qid: int, rows: list[tuple]) -> None:
        """Per-key ordering, from the queue's own rows: the leased messages of a key are
        among its first N unfinished ones (so no key has more than N leased)."""
        n = self.configs[qid].max_in_flight_per_key
        lines: dict[str, list[tuple]] = {}
        for r in rows:  # in position order
            key = self.message_args(qid, r[0])[2]
            if key is not None:
                lines.setdefault(key, []).append(r)
        for key, line in lines.items():
            late = [r[0] for r in line[n:] if r[1] == "leased"]
            self.expect(not late, f"q{qid} key {key}: {late} leased beyond the first {n} of {[r[0] for r in line]}")
            if any(r[1] == "leased" for r in line):
                self.see("keyed lease")
            if len(line) > n:
                self.see("key held")

    def check(self) -> None:
        for qid, (q, m) in enumerate(zip(self.queues, self.models)):
            q.check_invariants()  # the parts agree with each other (AssertionError if not)
            st = q.statistics(None)
            self.expect(q.activity() == (st.queue_depth, st.backlog + st.awaiting_ack, st.enqueued, st.delivered,
                                         st.acknowledged), f"q{qid} activity differs from its statistics")
            avail = list(q.available())
            self.expect(avail == m.available(), f"q{qid} view: {avail} != {m.available()}")
            rows = [
                (r.position, r.state, r.published_at, r.deliveries, r.cancels, r.holder,
                 r.lease_deadline, r.priority, r.barrier)
                for r in q.details().messages
            ]
            self.expect(rows == m.rows(), f"q{qid} state: {rows} != {m.rows()}")
            if q.keys is not None:
                q.keys.check()
                self.check_keys(qid, rows)
            waiting = [p for p, _ in q.details().awaiting_ack]
            self.expect(waiting == sorted(m.consumed), f"q{qid} awaiting ack differs")
            self.expect(
                q.next_deadline() == m.next_deadline(),
                f"q{qid} next_deadline {q.next_deadline()} != {m.next_deadline()}",
            )
            target = q.config.target_queue_depth
            if target is None:
                self.expect(q.recovery_point() == m.recovery_point(), f"q{qid} recovery point")
            else:  # it may stay on the last message read back from the log
                self.expect(q.recovery_point() <= m.recovery_point(), f"q{qid} recovery point")
            stats = q.statistics(self.now)
            active = m.active_msgs()
            self.expect(stats.queue_depth == len(active), f"q{qid} queue_depth")
            inactive = m.inactive()
            self.expect(
                (stats.inactive_message_count, stats.deferred_ack_count)
                == (len(inactive), len(m.deferred)),
                f"q{qid} inactive/deferred counts",
            )
            self.expect(target is None or len(active) <= target, f"q{qid} over target depth")
            self.expect(
                all(q.state_of(p) is MessageState.INACTIVE
                    for p in inactive if p not in m.deferred),
                f"q{qid}: inactive messages not reported inactive",
            )
            # nothing lost, nothing back: every message is exactly one of tracked or done
            tracked = {r[0] for r in rows}
            self.expect(not (tracked & self.done[qid]), f"q{qid}: done message back")
            lost = self.enqueued[qid] - tracked - self.done[qid] - set(inactive)
            self.expect(not lost, f"q{qid}: lost {sorted(lost)}")
        for key, sub in self.subs.items():
            c = sub.real
            self.expect(c.outstanding == sub.model.outstanding, f"{key} outstanding differs")
            if c.outstanding <= c.max_backlog:
                sub.lowered = False
            self.expect(sub.lowered or c.outstanding <= c.max_backlog, f"{key} over backlog")


_LOSSY_ORDER = {"Expired": 0, "Acknowledged": 1, "Cancelled": 2}


def _lossy(records: list[tuple]) -> list[tuple]:
    """Regroup each call's events by kind, Expired first, and drop the returns."""
    out: list[tuple] = []
    i = 0
    while i < len(records):
        rec = records[i]
        if rec[0] == "pub" or isinstance(rec[2], (Leased, DeliveredAtMostOnce, BarrierDelivered)):
            out.append(rec)
            i += 1
            continue
        j = i
        while j < len(records) and records[j][0] == "ev" and records[j][3] == rec[3]:
            j += 1
        group = [r for r in records[i:j] if type(r[2]).__name__ in _LOSSY_ORDER]
        group.sort(key=lambda r: _LOSSY_ORDER[type(r[2]).__name__])
        out += group
        i = j
    return out


def _replay_lossy(q: Queue, event, now: float) -> None:
    match event:
        case BarrierDelivered(position=p):
            q.replay.barrier_delivered(p)
        case Leased(position=p) | DeliveredAtMostOnce(position=p):
            q.replay.delivered(p, now)
        case Acknowledged(position=p):
            q.replay.acknowledged(p)
        case Cancelled(position=p, not_before=not_before, reason=reason):
            q.replay.cancelled(p, not_before=not_before, reason=reason, now=now)
        case Expired(position=p):
            q.replay.expired(p)


OPS = [
    ("publish", 7),
    ("add_consumer", 2),
    ("remove_consumer", 1),
    ("replace_consumer", 1),
    ("dispatch", 6),
    ("ack_bookmarks", 5),
    ("ack_filter", 1),
    ("expire", 3),
    ("tick", 4),
    ("store_recovery_point", 1),
    ("refill", 1),
    ("crash", 0.4),
]


def run_seed(seed: int, steps: int = STEPS) -> World:
    rng = random.Random(seed)
    n = 2 if rng.random() < 0.4 else 1
    world = World(seed, rng, [_random_config(rng, f"Q{i}", seed) for i in range(n)])
    names = [o for o, _ in OPS]
    weights = [w for _, w in OPS]
    for _ in range(steps):
        op = rng.choices(names, weights)[0]
        if op in ("remove_consumer", "replace_consumer") and not world.subs:
            op = "add_consumer"
        getattr(world, op)()
        world.check()
    return world


@pytest.mark.parametrize("seeds", seed_batches(SEEDS_DEFAULT, BATCH), ids=lambda s: f"seeds{s[0]}-{s[-1]}")
def test_simulation(seeds: list[int]) -> None:
    for seed in seeds:
        run_seed(seed)


def test_simulation_exercises_every_path() -> None:
    """The workload is not vacuous: over a few seeds every kind of event happens, and
    barriers, activations and deferred acknowledgements (made and consumed) too."""
    kinds: set[str] = set()
    seen: dict[str, int] = {}
    for seed in range(80):
        w = run_seed(seed)
        kinds |= {type(rec[2]).__name__ for rec in w.journal if rec[0] == "ev"}
        kinds |= {r for rec in w.journal if rec[0] == "ev" and isinstance(rec[2], Expired)
                  for r in rec[2].reasons}
        for k, v in w.seen.items():
            seen[k] = seen.get(k, 0) + v
    assert {
        "Leased", "DeliveredAtMostOnce", "Acknowledged", "Cancelled", "LeaseExpired",
        "Returned", "Expired", "time_limit", "max_cancels", "max_deliveries", "forced_expire",
        "BarrierDelivered",
    } <= kinds, kinds
    assert all(
        seen.get(k, 0) >= 5
        for k in ("barrier", "activated", "deferred ack", "deferred ack consumed", "dispatch_cut_short",
                  "keyed lease", "key held")
    ), seen
