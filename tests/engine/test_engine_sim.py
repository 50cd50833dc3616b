"""Deterministic simulation of the Engine over its journal (STYLE item 11).

One seed drives everything: the configuration of two queues over shared topics (QA
at-least-once, QB at-most-once; MaxCancels, MaxDeliveries, Expiration, a queue Filter,
MaxPerSubscriptionBacklog and Leasing on some seeds), publishes (client-numbered with
duplicates, and server-numbered), subscribes (various max_backlog, with and without
filters, a bad filter now and then), replaces, unsubscribes, acknowledgements (none,
cancel, expire; by bookmark and by filter; from the holder and from others), commits at
random points (whole, or one round: the durable records are applied and the new ones
are not yet durable), checkpoints (queues.ack / publishers.seq, written once durable as
the server does), clock moves with ticks, disconnects, and crash-restarts: the engine is
dropped, a new one recovers from what was committed, from the last written checkpoint
or (on some crashes) from the whole journal.

The reference model (``Model`` below) is the spec in a few lines: every message is an
object, every decision walks them all, a crash is "rebuild from the durable events,
every lease is broken, limits apply". The engine is checked against it after every call:

- each delivery is of a message the model has available (so nothing acknowledged,
  expired or delivered at-most-once comes back), to a consumer with room whose filter
  matches it, and is the oldest such message for that consumer (FIFO); its lease
  deadline and delivery count are right;
- a consumer never holds more than its backlog (except after a replace lowered it);
- no consumer with room is left idle while the model has a message for it (so no
  message is lost or stuck); at-least-once deliveries are sent at once, at-most-once
  ones exactly when their record is durable, and never twice, even across crashes;
- ``records_deleted`` of every acknowledgement and every sow equal the model's;
- a publish enters the journal unless it is a duplicate, and the logon ack after a
  crash reports the highest durable sequence;
- a bookmark subscription to every topic, resumed after its last bookmark at each
  restart, has seen exactly the durable publishes, in journal order, once each;
- at the end every worker leaves, a consumer takes and acknowledges everything, and
  every durable message must have been acknowledged or expired, in the model and in
  the engine, also after one more crash.

The engine is observed through its output and one seam: ``QueueDelivery.on_dispatch``
reports each dispatch when it happens (an at-most-once message is sent
later, once durable); every message a connection receives must match one of them.

A failure names its seed. Replay one: ``CONVEYOR_SIM_SEED=123 pytest
tests/engine/test_engine_sim.py``; more seeds: ``CONVEYOR_SIM_SEEDS=50000``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import pytest

from conveyor.config import MAX_PER_SUBSCRIPTION_BACKLOG_DEFAULT, Config, load_text
from conveyor.protocol.bookmarks import bookmark_position
from conveyor.protocol import messages as m

from .engine_harness import Harness, config_xml, decode, queue_xml
from tests.engine.seeds import seed_batches

SEEDS_DEFAULT = 2000
BATCH = 100  # seeds per test case: a failing case still names the exact seed
STEPS = 80  # operations per seed (small: the many seeds do the exploring)
DRAIN_ROUNDS_MAX = 400

Pred = Callable[[dict], bool] | None

#: Subscription filters: (text, the same rule in Python).
FILTERS: list[tuple[str | None, Pred]] = [
    (None, None),
    (None, None),
    ("/k = 0", lambda d: d["k"] == 0),
    ("/k != 1", lambda d: d["k"] != 1),
    ("/k < 2", lambda d: d["k"] < 2),
]
ACK_FILTERS: list[tuple[str, Pred]] = [
    ("/k = 0", lambda d: d["k"] == 0),
    ("/k = 2", lambda d: d["k"] == 2),
    ("/k >= 1", lambda d: d["k"] >= 1),
]
BAD_FILTER = "/k = = 0"
QUEUE_FILTER = ("/k != 3", lambda d: d["k"] != 3)
TOPICS = ("Work", "A", "B")
WATCH_TOPIC = "^(Work|A|B)$"  # a regex matching every topic and no queue name




class SimFailure(AssertionError):
    pass


# --- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What the model needs to know of one queue."""

    name: str
    alo: bool
    topics: frozenset[str]
    lease_s: float
    expiration_s: float | None
    max_cancels: int | None
    max_deliveries: int | None
    max_per_sub: int | None
    strict: bool
    filter: Pred


def random_specs(rng: random.Random) -> tuple[Spec, Spec]:
    limits = rng.random() < 0.5  # MaxCancels / MaxDeliveries / Expiration on half the seeds
    qa = Spec(
        name="QA",
        alo=True,
        topics=frozenset({"Work", "A"}),
        lease_s=rng.choice([2.0, 5.0]),
        expiration_s=rng.choice([None, 30.0, 60.0]) if limits else None,
        max_cancels=rng.choice([None, 1, 2, 3]) if limits else None,
        max_deliveries=rng.choice([None, 2, 3]) if limits else None,
        max_per_sub=rng.choice([None, 1_000, 1_000, 2]),  # None: the reference's default, 1
        strict=rng.random() < 0.5,
        filter=QUEUE_FILTER[1] if rng.random() < 0.2 else None,
    )
    qb = Spec(
        name="QB",
        alo=False,
        topics=frozenset({"Work", "B"}),
        lease_s=60.0,
        expiration_s=rng.choice([None, 20.0]) if limits else None,
        max_cancels=None,
        max_deliveries=None,
        max_per_sub=rng.choice([None, 1_000, 1_000, 2]),  # None: the reference's default, 1
        strict=rng.random() < 0.5,
        filter=QUEUE_FILTER[1] if rng.random() < 0.2 else None,
    )
    return qa, qb


def spec_xml(spec: Spec, fairness: str) -> str:
    underlying = "^(" + "|".join(sorted(spec.topics)) + ")$"
    return queue_xml(
        spec.name,
        underlying=underlying,
        DefaultPublishTarget=min(spec.topics),  # required with a regex UnderlyingTopic
        Semantics="at-least-once" if spec.alo else "at-most-once",
        FairnessModel=fairness,
        LeasePeriod=f"{spec.lease_s:g}s",
        Expiration=None if spec.expiration_s is None else f"{spec.expiration_s:g}s",
        MaxCancels=spec.max_cancels,
        MaxDeliveries=spec.max_deliveries,
        MaxPerSubscriptionBacklog=spec.max_per_sub,
        Leasing="strict" if spec.strict else "sloppy",
        Filter=QUEUE_FILTER[0] if spec.filter is not None else None,
    )


@lru_cache(maxsize=None)
def load(xml: str) -> Config:
    return load_text(xml)


# --- the reference model -------------------------------------------------------------------------


@dataclass(eq=False)
class MMsg:
    pos: int
    ts: float
    data: dict
    holder: tuple | None = None  # consumer key (conn, sub_id) of the lease (at-least-once)
    deadline: float | None = None
    deliveries: int = 0
    cancels: int = 0


@dataclass(eq=False)
class MCons:
    key: tuple  # (conn, sub_id)
    queue: str
    pred: Pred
    backlog: int
    held: set = field(default_factory=set)  # leased, or delivered at-most-once and not acked
    lowered: bool = False  # a replace left it above its backlog

    @property
    def conn(self) -> int:
        return self.key[0]


@dataclass(eq=False)
class MQueue:
    spec: Spec
    msgs: dict = field(default_factory=dict)  # available or leased, in position order
    consumed: dict = field(default_factory=dict)  # at-most-once: pos -> consumer key

    def overdue(self, msg: MMsg, now: float) -> bool:
        e = self.spec.expiration_s
        return e is not None and now >= msg.ts + e

    def available(self):
        return [x for x in self.msgs.values() if x.holder is None]


class Model:
    """Spec 000 as plain objects. Journal events are ("kind", queue, pos[, n]) tuples and
    ("pub", pos, topic, data, ts, publisher, seq); ``pending`` ones die in a crash."""

    def __init__(self, specs: tuple[Spec, ...]) -> None:
        self.refused = 0  # refusals of the last bookmark ack (Leasing=strict)
        self.specs = {s.name: s for s in specs}
        self.pending: list[tuple] = []
        self.durable: list[tuple] = []
        self.acked_durable: dict[str, set] = {s.name: set() for s in specs}
        self._reset()

    def _reset(self) -> None:
        self.queues = {name: MQueue(spec) for name, spec in self.specs.items()}
        self.consumers: dict[tuple, MCons] = {}
        self.highest: dict[str, int] = {}  # client-numbered publishers, durable + pending
        self.unapplied: list[tuple] = []  # publishes appended, not yet durable

    # --- journal ----------------------------------------------------------------------------

    def log(self, *event) -> None:
        self.pending.append(event)

    def mark_durable(self) -> None:
        """Everything appended is durable: apply the publishes (read-committed)."""
        for ev in self.pending:
            self.durable.append(ev)
            if ev[0] == "ack":
                self.acked_durable[ev[1]].add(ev[2])
        self.pending = []
        for pub in self.unapplied:
            self._enqueue(*pub)
        self.unapplied = []

    def _enqueue(self, pos, topic, data, ts) -> None:
        for q in self.queues.values():
            if topic in q.spec.topics and (q.spec.filter is None or q.spec.filter(data)):
                q.msgs[pos] = MMsg(pos, ts, data)

    def publish(self, pos, topic, data, ts, publisher, seq) -> None:
        self.log("pub", pos, topic, data, ts, publisher, seq)
        if seq is not None:
            self.highest[publisher] = seq
        self.unapplied.append((pos, topic, data, ts))

    def durable_highest(self, publisher: str) -> int:
        seqs = [ev[6] for ev in self.durable if ev[0] == "pub" and ev[5] == publisher and ev[6] is not None]
        return max(seqs, default=0)

    # --- crash: rebuild from durable events (Startup and Recovery for Queues) ----------------

    def crash(self) -> None:
        self.pending = []
        self._reset()
        for ev in self.durable:
            kind = ev[0]
            if kind == "pub":
                _, pos, topic, data, ts, publisher, seq = ev
                self._enqueue(pos, topic, data, ts)
                if seq is not None:
                    self.highest[publisher] = max(self.highest.get(publisher, 0), seq)
                continue
            q = self.queues[ev[1]]
            msg = q.msgs.get(ev[2])
            if msg is None:
                continue
            if kind == "lease":
                msg.deliveries = ev[3]
            elif kind == "cancel":
                msg.cancels += 1
            elif kind in ("ack", "expire", "deliver"):
                del q.msgs[ev[2]]
        # Every lease was broken by the restart: a message at a limit expires now.
        for q in self.queues.values():
            for msg in list(q.msgs.values()):
                if self._limits(q, msg, now=None):
                    del q.msgs[msg.pos]
                    self.log("expire", q.spec.name, msg.pos)

    # --- time -------------------------------------------------------------------------------

    def _limits(self, q: MQueue, msg: MMsg, now: float | None) -> bool:
        s = q.spec
        return (
            (now is not None and q.overdue(msg, now))
            or (s.max_cancels is not None and msg.cancels >= s.max_cancels)
            or (s.max_deliveries is not None and msg.deliveries >= s.max_deliveries)
        )

    def _end_lease(self, q: MQueue, msg: MMsg, now: float, *, cancel: bool) -> bool:
        """Cancel, lease expiry or broken lease; True when the message expired instead."""
        self.consumers[msg.holder].held.discard(msg.pos)
        msg.holder = msg.deadline = None
        if cancel:
            msg.cancels += 1
            self.log("cancel", q.spec.name, msg.pos)
        else:
            self.log("return", q.spec.name, msg.pos)
        if self._limits(q, msg, now):
            del q.msgs[msg.pos]
            self.log("expire", q.spec.name, msg.pos)
            return True
        return False

    def tick(self, now: float) -> None:
        for q in self.queues.values():
            for msg in list(q.msgs.values()):
                if msg.holder is not None and msg.deadline <= now:
                    self._end_lease(q, msg, now, cancel=False)
        self.expire_overdue(now)

    def expire_overdue(self, now: float) -> None:
        for q in self.queues.values():
            for msg in q.available():
                if q.overdue(msg, now):
                    del q.msgs[msg.pos]
                    self.log("expire", q.spec.name, msg.pos)

    # --- consumers --------------------------------------------------------------------------

    def backlog(self, queue: str, requested: int | None) -> int:
        b = 1 if requested is None else requested
        cap = self.specs[queue].max_per_sub
        return min(b, MAX_PER_SUBSCRIPTION_BACKLOG_DEFAULT if cap is None else cap)

    def subscribe(self, key, queue, pred, requested) -> None:
        self.consumers[key] = MCons(key, queue, pred, self.backlog(queue, requested))

    def replace(self, key, pred, requested) -> None:
        c = self.consumers[key]
        c.pred = pred
        c.backlog = self.backlog(c.queue, requested)
        c.lowered = len(c.held) > c.backlog

    def remove(self, key, now: float) -> None:
        c = self.consumers[key]
        q = self.queues[c.queue]
        for pos in sorted(c.held):
            if q.spec.alo:
                self._end_lease(q, q.msgs[pos], now, cancel=False)
            else:
                del q.consumed[pos]
        c.held.clear()
        del self.consumers[key]

    # --- acknowledgement (sow_delete; docs/queues.md table) -----------------------------------

    def _ack_one(self, q: MQueue, pos: int, by: int, option: str, now: float) -> int:
        """One message of a sow_delete; returns what it adds to records_deleted."""
        s = q.spec
        msg = q.msgs.get(pos)
        if s.alo and msg is not None and msg.holder is not None:
            holder = self.consumers[msg.holder]
            if s.strict and holder.conn != by:
                self.refused += 1
                return 0  # refused
            if option == "cancel":
                return int(self._end_lease(q, msg, now, cancel=True))
            holder.held.discard(pos)
            del q.msgs[pos]
            self.log("ack" if option == "none" else "expire", s.name, pos)
            return 1
        if not s.alo and pos in q.consumed:
            holder = self.consumers[q.consumed[pos]]
            if s.strict and holder.conn != by:
                self.refused += 1
                return 0
            del q.consumed[pos]
            holder.held.discard(pos)
            return 1
        if msg is not None:  # available, never leased now
            if s.alo and option == "cancel":
                return 0
            del q.msgs[pos]
            self.log("expire" if s.alo and option == "expire" else "ack", s.name, pos)
            return 1
        return 0

    def ack(self, queue: str, positions, by: int, option: str, now: float) -> int:
        q = self.queues[queue]
        self.refused = 0
        return sum(self._ack_one(q, p, by, option, now) for p in positions)

    def ack_matching(self, queue: str, pred, by: int, option: str, now: float) -> int:
        q = self.queues[queue]
        hits = sorted(p for p, x in q.msgs.items() if pred(x.data))
        return sum(self._ack_one(q, p, by, option, now) for p in hits)

    # --- delivery (Message Flow for Queues, step 3) ---------------------------------------------

    def wants(self, c: MCons, msg: MMsg) -> bool:
        return c.pred is None or c.pred(msg.data)

    def idle(self) -> list[str]:
        """Consumers with room and a message they match: the engine must not leave them."""
        out = []
        for c in self.consumers.values():
            if len(c.held) >= c.backlog:
                continue
            q = self.queues[c.queue]
            work = [x.pos for x in q.available() if self.wants(c, x)]
            if work:
                out.append(f"{c.key} on {c.queue} has {len(c.held)}/{c.backlog} and could take {work}")
        return out


# --- the simulation ---------------------------------------------------------------------------------


@dataclass
class Expected:
    key: tuple
    queue: str
    pos: int
    durable: bool = False


class Sim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        rng = self.rng = random.Random(seed)
        self.specs = random_specs(rng)
        fairness = rng.choice(["fast", "round-robin", "proportional"])
        xml = config_xml(
            spec_xml(self.specs[0], fairness) + spec_xml(self.specs[1], "round-robin"),
            topics=TOPICS,
        )
        self.h = Harness(load(xml))
        self.h.replay_budget = rng.choice([None, 1, 3])
        self.model = Model(self.specs)
        self.dispatched: list[tuple] = []
        self._instrument()
        self.next_i = 0
        self.next_worker = 0
        self.publishers: dict[str, int] = {}
        self.workers: dict[int, dict[str, tuple]] = {}  # conn -> sub_id -> (queue, requested, filter)
        self.bookmarks: dict[int, str] = {}
        self.received: dict[tuple, list[int]] = {}  # consumer key -> positions it holds, received
        self.expect_now: list[Expected] = []  # at-least-once deliveries of this call
        self.unsent: list[Expected] = []  # at-most-once deliveries awaiting durability
        self.amo_received: set[int] = set()
        self.trace: list[str] = []
        self.watcher: int | None = None  # a bookmark subscription to every topic
        self.watched: list[int] = []  # positions it received, across restarts
        self.watch_live = False  # its replay caught up (the completed ack came)
        self.last_bookmark = "0"
        self.connect_publishers()

    # --- plumbing -------------------------------------------------------------------------------

    def fail(self, what: str) -> None:
        tail = "\n  ".join(self.trace[-12:])
        raise SimFailure(
            f"seed {self.seed} at t={self.h.now - 1_000_000:.2f} (crashes {self.h.crashes}): {what}\n"
            f"  last steps:\n  {tail}\n  replay: CONVEYOR_SIM_SEED={self.seed}"
        )

    def expect(self, ok: bool, what) -> None:
        if not ok:
            self.fail(what() if callable(what) else what)

    def _instrument(self) -> None:
        log = self.dispatched

        def spy(binding, deliveries, now):
            log.append(
                (binding.name, now, [(d.consumer.key, d.position, d.lease_deadline, d.delivery_count) for d in deliveries])
            )

        self.h.engine.delivery.on_dispatch = spy

    @property
    def now(self) -> float:
        return self.h.now

    def connect_publishers(self) -> None:
        for name in ("p1", "p2"):
            conn = self.h.connect(name, ack_type="processed")
            (ack,) = self.h.acks(conn)
            want = self.model.durable_highest(name)
            self.expect(ack.seq == want, f"logon of {name}: highest sequence {ack.seq}, durable is {want}")
            self.model.highest[name] = want
            self.publishers[name] = conn
            self.after_call()
        # The watcher resumes after the last bookmark it saw: no gap, no duplicate
        # (Bookmark Subscriptions; the replay/live seam of engine.pump_replays).
        self.watcher = self.h.connect("watcher")
        self.watch()

    def watch(self) -> None:
        self.watch_live = False
        self.h.subscribe(self.watcher, WATCH_TOPIC, "w", bookmark=self.last_bookmark, ack_type="processed,completed")
        self.after_call()

    def rewatch(self) -> None:
        """The watcher unsubscribes and resumes after its last bookmark."""
        self.trace.append(f"rewatch after {self.last_bookmark}")
        self.h.unsubscribe(self.watcher, "w")
        self.after_call()
        self.watch()

    # --- checks after every engine call -------------------------------------------------------------

    def after_call(self) -> None:
        model, now = self.model, self.now
        model.expire_overdue(now)
        for queue, at, deliveries in self.dispatched:
            q = model.queues[queue]
            for key, pos, deadline, count in deliveries:
                self.check_delivery(q, key, pos, deadline, count, at)
        self.dispatched.clear()
        self.check_received()
        idle = model.idle()
        self.expect(not idle, lambda: "idle consumer: " + "; ".join(idle))
        for c in model.consumers.values():
            if len(c.held) <= c.backlog:
                c.lowered = False
            self.expect(c.lowered or len(c.held) <= c.backlog, f"{c.key} holds {len(c.held)} > {c.backlog}")

    def check_delivery(self, q: MQueue, key, pos, deadline, count, at) -> None:
        model, name = self.model, q.spec.name
        c = model.consumers.get(key)
        self.expect(c is not None and c.queue == name, f"{name}: delivery of {pos} to unknown consumer {key}")
        self.expect(pos not in model.acked_durable[name], f"{name}: acknowledged {pos} delivered again")
        msg = q.msgs.get(pos)
        self.expect(msg is not None and msg.holder is None, f"{name}: delivered {pos}, not available in the model")
        self.expect(not q.overdue(msg, at), f"{name}: delivered {pos} past its Expiration")
        self.expect(len(c.held) < c.backlog, f"{name}: {pos} to {key}, full ({len(c.held)}/{c.backlog})")
        self.expect(model.wants(c, msg), f"{name}: {pos} to {key}, which does not match its filter")
        older = [x.pos for x in q.available() if x.pos < pos and model.wants(c, x)]
        self.expect(not older, f"{name}: {pos} to {key} before older {older} (FIFO)")
        c.held.add(pos)
        if q.spec.alo:
            msg.deliveries += 1
            msg.holder, msg.deadline = key, at + q.spec.lease_s
            self.expect(deadline == msg.deadline, f"{name}: lease deadline {deadline} != {msg.deadline}")
            self.expect(count == msg.deliveries, f"{name}: delivery count {count} != {msg.deliveries}")
            model.log("lease", name, pos, count)
            self.expect_now.append(Expected(key, name, pos))
        else:
            self.expect(deadline is None, f"{name}: at-most-once delivery with a lease")
            del q.msgs[pos]
            q.consumed[pos] = key
            model.log("deliver", name, pos)
            self.unsent.append(Expected(key, name, pos))

    def check_received(self) -> None:
        h = self.h
        expected = self.expect_now + [e for e in self.unsent if e.durable]
        self.expect_now = []
        self.unsent = [e for e in self.unsent if not e.durable]
        for conn in sorted(h.conns):
            for msg in h.messages(conn):
                if conn == self.watcher and msg.sub_id == "w" and msg.queue is None:
                    self.watched.append(bookmark_position(msg.bookmark))
                    self.last_bookmark = msg.bookmark
                    continue
                if msg.queue is None:
                    self.fail(f"conn {conn} received a non-queue message {msg}")
                pos = bookmark_position(msg.bookmark)
                match = [e for e in expected if e.key == (conn, msg.sub_id) and e.queue == msg.queue and e.pos == pos]
                self.expect(match, f"conn {conn} received {msg.queue} {pos} on {msg.sub_id}, never dispatched there")
                expected.remove(match[0])
                self.expect(msg.topic == msg.queue, f"queue message with topic {msg.topic}")
                self.bookmarks[pos] = msg.bookmark
                q = self.model.queues[msg.queue]
                if q.spec.alo:
                    self.expect(decode(msg) == q.msgs[pos].data, f"{msg.queue} {pos}: wrong body")
                else:
                    self.expect(pos not in self.amo_received, f"{msg.queue}: at-most-once {pos} delivered twice")
                    self.amo_received.add(pos)
                if (conn, msg.sub_id) in self.model.consumers and pos in self.model.consumers[(conn, msg.sub_id)].held:
                    self.received.setdefault((conn, msg.sub_id), []).append(pos)
            self.take_acks(conn)  # subscribe and sow_delete acks were checked by their steps
        lost = [e for e in expected if e.key[0] in h.conns]
        self.expect(not lost, f"dispatched but not sent: {lost}")
        if self.watcher in h.conns:
            want = [ev[1] for ev in self.model.durable if ev[0] == "pub"]
            seen = self.watched
            ok = seen == want if self.watch_live else seen == want[: len(seen)]
            self.expect(ok, lambda: f"watcher (live={self.watch_live}) saw {seen}, durable publishes {want}")

    def take_acks(self, conn: int) -> list[m.Ack]:
        """The acks ``conn`` received, less those of the watcher's subscription."""
        out = []
        for ack in self.h.acks(conn):
            if conn == self.watcher and ack.sub_id == "w":
                self.expect(ack.status == "success", f"watcher: {ack}")
                self.watch_live |= ack.ack_type == "completed"
            else:
                out.append(ack)
        return out

    # --- steps ----------------------------------------------------------------------------------------

    def step(self) -> None:
        rng = self.rng
        ops = [
            (self.publish, 30),
            (self.subscribe, 9),
            (self.unsubscribe, 2),
            (self.replace, 3),
            (self.ack, 18),
            (self.ack_filter, 3),
            (self.commit, 12),
            (self.commit_one_round, 4),
            (self.advance, 10),
            (self.disconnect, 3),
            (self.crash, 3),
            (self.checkpoint, 4),
            (self.rewatch, 2),
            (self.sow, 3),
        ]
        op = rng.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
        op()

    def publish(self) -> None:
        rng, model, h = self.rng, self.model, self.h
        name = rng.choice(["p1", "p1", "p2"])
        conn = self.publishers[name]
        topic = rng.choice(TOPICS)
        seq = None
        if name == "p1":
            high = model.highest.get("p1", 0)
            seq = rng.randint(1, high) if high and rng.random() < 0.2 else high + 1
        data = {"i": self.next_i, "k": rng.randrange(4)}
        self.next_i += 1
        pos = h.journal.end
        before = h.engine.statistics().pending_publishes
        duplicate = seq is not None and seq <= model.highest.get("p1", 0)
        self.trace.append(f"publish {name} seq={seq} {topic} {data} at {pos}{' (dup)' if duplicate else ''}")
        h.publish(conn, topic, data, seq=seq)
        appended = h.engine.statistics().pending_publishes - before
        self.expect(appended == (0 if duplicate else 1), f"publish seq={seq}: {appended} appended, duplicate={duplicate}")
        if not duplicate:
            model.publish(pos, topic, data, self.now, name, seq)
        self.after_call()

    def _worker(self) -> int:
        if self.workers and self.rng.random() < 0.7:
            return self.rng.choice(sorted(self.workers))
        self.next_worker += 1
        conn = self.h.connect(f"w{self.next_worker}")
        self.workers[conn] = {}
        self.trace.append(f"connect w{self.next_worker} as {conn}")
        self.after_call()
        return conn

    def subscribe(self) -> None:
        rng, h, model = self.rng, self.h, self.model
        conn = self._worker()
        queue = rng.choice(["QA", "QB"])
        sub_id = rng.choice(["a", "b", "c"])
        if sub_id in self.workers[conn]:
            return
        requested = rng.choice([None, 0, 1, 2, 3, 5])
        bad = rng.random() < 0.04
        text, pred = (BAD_FILTER, None) if bad else rng.choice(FILTERS)
        options = None if requested is None else f"max_backlog={requested}"
        self.trace.append(f"subscribe {conn}/{sub_id} {queue} {options} {text}")
        if not bad:
            model.subscribe((conn, sub_id), queue, pred, requested)
            self.workers[conn][sub_id] = (queue, requested, text)
        h.subscribe(conn, queue, sub_id, options=options, filter=text)
        (ack,) = h.acks(conn)
        if bad:
            self.expect(ack.status == "failure" and ack.code == "bad_filter", f"bad filter: {ack}")
        else:
            self.expect(ack.status == "success", f"subscribe: {ack}")
        self.after_call()

    def _pick_sub(self):
        subs = [(conn, sub_id) for conn, s in self.workers.items() for sub_id in s]
        return self.rng.choice(sorted(subs)) if subs else None

    def unsubscribe(self) -> None:
        key = self._pick_sub()
        if key is None:
            return
        conn, sub_id = key
        self.trace.append(f"unsubscribe {key}")
        self.model.remove(key, self.now)
        del self.workers[conn][sub_id]
        self.received.pop(key, None)
        self.h.unsubscribe(conn, sub_id)
        self.after_call()

    def replace(self) -> None:
        key = self._pick_sub()
        if key is None:
            return
        conn, sub_id = key
        queue, _, _ = self.workers[conn][sub_id]
        requested = self.rng.choice([None, 0, 1, 2, 4])
        text, pred = self.rng.choice(FILTERS)
        options = "replace" if requested is None else f"max_backlog={requested},replace"
        self.trace.append(f"replace {key} {options} {text}")
        self.model.replace(key, pred, requested)
        self.workers[conn][sub_id] = (queue, requested, text)
        self.h.subscribe(conn, queue, sub_id, options=options, filter=text)
        (ack,) = self.h.acks(conn)
        self.expect(ack.status == "success", f"replace: {ack}")
        self.after_call()

    def _option(self, queue: str) -> str:
        cancels = self.model.specs[queue].max_cancels is not None
        return self.rng.choices(["none", "cancel", "expire"], weights=[4, 5 if cancels else 3, 1])[0]

    def ack(self) -> None:
        rng, h, model = self.rng, self.h, self.model
        held = [(key, pos) for key, ps in self.received.items() for pos in ps if pos in model.consumers[key].held]
        if held and rng.random() < 0.85:
            key, _ = rng.choice(held)
            conn = key[0] if rng.random() < 0.85 else rng.choice(sorted(h.conns))
            queue = model.consumers[key].queue
            mine = [p for k, p in held if k == key]
            positions = rng.sample(mine, rng.randint(1, len(mine)))
        else:  # anything known: someone else's, done, unknown to this queue
            if not self.bookmarks:
                return
            conn = rng.choice(sorted(h.conns))
            queue = rng.choice(["QA", "QB"])
            positions = [rng.choice(sorted(self.bookmarks)) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.1:
            positions = positions + positions[:1]  # the same bookmark twice in one command
        option = self._option(queue)
        opts = None if option == "none" else option
        self.trace.append(f"ack {queue} {positions} by {conn} {option}")
        want = model.ack(queue, positions, conn, option, self.now)
        h.ack(conn, queue, [self.bookmarks[p] for p in positions], options=opts, ack_type="processed")
        self._check_deleted(conn, want, refused=model.refused)
        self._forget_done()
        self.after_call()

    def ack_filter(self) -> None:
        rng, h, model = self.rng, self.h, self.model
        conn = rng.choice(sorted(h.conns))
        queue = rng.choice(["QA", "QB"])
        text, pred = rng.choice(ACK_FILTERS)
        option = self._option(queue)
        self.trace.append(f"ack {queue} filter {text} by {conn} {option}")
        want = model.ack_matching(queue, pred, conn, option, self.now)
        h.ack_filter(conn, queue, text, options=None if option == "none" else option, ack_type="processed")
        self._check_deleted(conn, want)
        self._forget_done()
        self.after_call()

    def _check_deleted(self, conn: int, want: int, refused: int = 0) -> None:
        acks = self.take_acks(conn)
        if refused:
            # Leasing=strict: a bookmark ack naming a message leased to another connection
            # fails with not_lease_holder; the rest of the batch took effect.
            self.expect(len(acks) == 1 and acks[0].code == "not_lease_holder", f"sow_delete acks: {acks}")
            got = acks[0].details.get("records_deleted")
            self.expect(got == want, f"records_deleted {got}, model {want}")
            return
        self.expect(len(acks) == 1 and acks[0].status == "success", f"sow_delete acks: {acks}")
        self.expect(acks[0].records_deleted == want, f"records_deleted {acks[0].records_deleted}, model {want}")

    def _forget_done(self) -> None:
        for key in list(self.received):
            c = self.model.consumers.get(key)
            if c is None:
                del self.received[key]
            else:
                self.received[key] = [p for p in self.received[key] if p in c.held]

    def _commit_round(self) -> None:
        self.h.journal_commit()
        self.model.mark_durable()
        for e in self.unsent:
            e.durable = True
        self.h.engine.on_durable(self.now)
        self.h._collect()
        self.after_call()

    def commit(self) -> None:
        self.trace.append("commit")
        for _ in range(4):
            self._commit_round()
            if self.h.journal.end == self.h.journal.durable_end:
                return
        self.fail("commit did not settle in 4 rounds")

    def commit_one_round(self) -> None:
        self.trace.append("commit one round")
        self._commit_round()

    def advance(self, seconds: float | None = None) -> None:
        if seconds is None:
            seconds = self.rng.uniform(5, 40) if self.rng.random() < 0.15 else self.rng.choice([0.5, 1.0, 2.0, 3.0])
        self.trace.append(f"advance {seconds:.2f}")
        self.h.now += seconds
        self.model.tick(self.now)
        self.h.engine.tick(self.now)
        self.h._collect()
        self.after_call()

    def disconnect(self, conn: int | None = None) -> None:
        if conn is None:
            if not self.workers:
                return
            conn = self.rng.choice(sorted(self.workers))
        self.trace.append(f"disconnect {conn}")
        for sub_id in self.workers.pop(conn):
            self.model.remove((conn, sub_id), self.now)
            self.received.pop((conn, sub_id), None)
        self.unsent = [e for e in self.unsent if e.key[0] != conn]
        self.h.disconnect(conn)
        self.after_call()

    def crash(self) -> None:
        self.trace.append("crash")
        if self.rng.random() < 0.2:
            # The batch reached the disk but the process died before it learnt so.
            batch = self.h.journal.take_batch()
            if batch is not None:
                self.h.journal.write_batch(batch)
                self.model.mark_durable()
        self.model.crash()
        use_checkpoint = self.rng.random() < 0.8  # else the file is missing or unreadable
        self.workers.clear()
        self.received.clear()
        self.unsent.clear()
        self.expect_now.clear()
        self.dispatched.clear()
        self.h.crash(checkpoint=use_checkpoint)
        self._instrument()
        self.connect_publishers()

    def checkpoint(self) -> None:
        """The server's checkpoint timer (queues.ack, publishers.seq): it changes nothing
        the model can see, but the next crash recovers from it once it is written."""
        self.trace.append("checkpoint")
        self.h.checkpoint()

    def sow(self) -> None:
        h = self.h
        conn = self.publishers["p2"]
        queue = self.rng.choice(["QA", "QB"])
        self.trace.append(f"sow {queue}")
        got = [bookmark_position(x.bookmark) for x in h.sow(conn, queue)]
        want = [x.pos for x in self.model.queues[queue].available()]
        self.expect(got == want, f"sow {queue}: {got} != model {want}")
        self.after_call()

    # --- the end: drain ---------------------------------------------------------------------------------

    def drain(self) -> None:
        """Every worker leaves; one consumer takes and acknowledges everything."""
        if self.rng.random() < 0.3:
            self.crash()
        for conn in sorted(self.workers):
            self.disconnect(conn)
        self.commit()
        self.trace.append("drain")
        h, model = self.h, self.model
        d = h.connect("drainer")
        self.workers[d] = {}
        self.after_call()
        for queue, sub_id in (("QA", "da"), ("QB", "db")):
            model.subscribe((d, sub_id), queue, None, 100)
            self.workers[d][sub_id] = (queue, 100, None)
            h.subscribe(d, queue, sub_id, options="max_backlog=100")
            h.acks(d)
            self.after_call()
        for _ in range(DRAIN_ROUNDS_MAX):
            self.commit()
            for key in list(self.received):
                positions = self.received.pop(key)
                if positions:
                    queue = model.consumers[key].queue
                    want = model.ack(queue, positions, d, "none", self.now)
                    h.ack(d, queue, [self.bookmarks[p] for p in positions], ack_type="processed")
                    self._check_deleted(d, want)
                    self.after_call()
            self.commit()
            busy = any(q.msgs or q.consumed for q in model.queues.values()) or self.unsent
            if not busy:
                break
            self.advance(max(s.lease_s for s in self.specs) + 1.0)
        else:
            self.fail("the drain did not finish")
        self.check_empty("after the drain")
        self.h.replay_budget = None
        self.commit()
        self.expect(self.watch_live, "the watcher's replay never caught up")
        self.crash()
        self.commit()
        self.check_empty("after the drain and a crash")
        self.check_ledger()

    def check_ledger(self) -> None:
        """Every durable message that entered a queue left it, durably, exactly once: at-least-
        once by an ack or an expiry; at-most-once also by a delivery. None lost."""
        out: dict[str, list[int]] = {name: [] for name in self.model.queues}
        for ev in self.model.durable:
            if ev[0] in ("ack", "expire", "deliver"):
                out[ev[1]].append(ev[2])
        for name, q in self.model.queues.items():
            spec = q.spec
            entered = sorted(
                ev[1] for ev in self.model.durable
                if ev[0] == "pub" and ev[2] in spec.topics and (spec.filter is None or spec.filter(ev[3]))
            )
            self.expect(sorted(out[name]) == entered, f"{name}: entered {entered}, left {sorted(out[name])}")

    def check_empty(self, when: str) -> None:
        for name, q in self.model.queues.items():
            self.expect(not q.msgs and not q.consumed, f"model {name} not empty {when}")
            stats = self.h.stats(name)
            self.expect(
                stats.queue_depth == 0 and stats.awaiting_ack == 0,
                f"engine {name} not empty {when}: {stats}",
            )

    def run(self, steps: int = STEPS) -> None:
        for _ in range(steps):
            self.step()
        self.drain()


@pytest.mark.parametrize("seeds", seed_batches(SEEDS_DEFAULT, BATCH), ids=lambda b: f"seeds{b[0]}-{b[-1]}")
def test_engine_simulation(seeds):
    for seed in seeds:
        failure = None
        try:
            Sim(seed).run()
        except SimFailure as exc:
            failure = str(exc)
        except Exception as exc:  # an engine exception fails that seed too, with its traceback
            raise AssertionError(f"seed {seed}: {type(exc).__name__}: {exc}; replay: CONVEYOR_SIM_SEED={seed}") from exc
        if failure is not None:
            pytest.fail(failure, pytrace=False)
