"""Deterministic simulation of a named consumer (the Spark source's position) on a
replicated queue, failing over between two instances (engine/consumers.py rules 7
and 8; docs/spark.md, "Failover between instances").

One seed drives the links (sync or async each way), publishers on both instances, one
query that claims the consumer, leases, reads and acknowledges on one instance and
fails over to the other when its instance is down or does not answer, crashes that
lose what was not fsynced, checkpoints, links cut and frames moved a few at a time,
proxied transfer switched on while the other instance is down, and the clock.
Checked as it runs, on every seed:

- a query never holds one message under two unacknowledged delivery numbers (leases
  here outlast the run: a lapsed lease lets its message go out again, by design);
- a delivery the query was told of names the same message on every read, on either
  instance, for as long as the query's claim holds (a read of a delivery whose message
  was acknowledged on that instance before the delivery reached it is refused, never
  answered with another message), and after it claims again where those deliveries
  are promised: on the same instance, or on one its last instance replicates to
  synchronously (a claim there knows every delivery the query was told of). After a
  claim was tried across an asynchronous link, the instance may lack them, which is the
  limit docs/spark.md states: the query's view starts again (about half of the seeds
  with an async link; none with two sync links);
- two instances never claim with one epoch (the claimer's tag is in the epoch);

and once the faults stop, both instances restart, the links reconnect and everything
settles: both copies of the consumer agree on D, the acknowledged pointer, the epoch
and the message of every unacknowledged delivery (claims carry the claimer's
deliveries by identity, and the later claim wins everywhere).

A failure names its seed. Replay one: ``CONVEYOR_SIM_SEED=123 pytest
tests/engine/test_replicated_consumer_sim.py``; more seeds: ``CONVEYOR_SIM_SEEDS=20000``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from conveyor.protocol import messages as m

from .cluster import Cluster, destination, instance_xml
from .engine_harness import decode, queue_xml
from tests.engine.seeds import seed_batches

SEEDS_DEFAULT = 2000
STEPS = 60
NAMES = ("A", "B")


class SimFailure(AssertionError):
    pass


@dataclass
class Query:
    node: str = "A"
    conn: int | None = None
    epoch: int | None = None  # None: must claim (first run, fenced, or a reply never came)
    d: int = 0  # the last delivery it was told of
    acked: int = 0
    seen: dict[int, int] = field(default_factory=dict)  # delivery -> message it read, under this claim
    held_on: str | None = None  # the instance of the last claim it was answered
    lossy: bool = False  # a claim since was tried where its deliveries may be missing


class Sim:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.sync = {n: rng.random() < 0.5 for n in NAMES}  # n's link to the other is sync
        sow = queue_xml("WorkQ", underlying="Work", LeasePeriod="1000s")
        self.c = Cluster({n: instance_xml(n, [destination(o, sync=self.sync[n]) for o in NAMES if o != n], sow=sow)
                          for n in NAMES})
        self.c.connect_all()
        self.q = Query()
        self.claims: dict[int, set[str]] = {}  # epoch -> instances that made a claim with it
        self.forgotten = 0  # claims after one tried over an async link (the query's view reset)
        self.value = 0
        self.trace: list[str] = []
        self.kind = ", ".join(f"{n}->{'sync' if s else 'async'}" for n, s in self.sync.items())

    def fail(self, what: str) -> None:
        tail = "\n  ".join(self.trace[-20:])
        raise SimFailure(f"seed {self.seed} ({self.kind}): {what}\n  last steps:\n  {tail}\n"
                         f"  replay: CONVEYOR_SIM_SEED={self.seed}")

    def up(self) -> list[str]:
        return [n for n in NAMES if n not in self.c.down]

    # --- the query -----------------------------------------------------------------------

    def call(self, cmd) -> m.Ack | None:
        """One command on the query's instance; its reply if one came before the
        network moved a little (a sync destination that is down holds it)."""
        h = self.c.nodes[self.q.node]
        h.handle(self.connection(), cmd)
        if type(cmd) is m.Claim:
            c = h.engine.named.get("WorkQ", "spark")  # what it journaled, answered or not
            claimers = self.claims.setdefault(c.epoch, set())
            claimers.add(self.q.node)
            if len(claimers) > 1:
                self.fail(f"epoch {c.epoch} claimed on two instances: {sorted(claimers)}")
        for _ in range(self.rng.randint(1, 3)):
            self.c.commit(self.q.node)
            self.network()
        if self.q.node in self.c.down:
            return None
        acks = [a for a in h.acks(self.q.conn) if a.cid == cmd.cid]
        return acks[-1] if acks else None

    def connection(self) -> int:
        h = self.c.nodes[self.q.node]
        if self.q.conn is None or self.q.conn not in h.conns:
            self.q.conn = h.connect(f"driver-{self.rng.random():.6f}")
        return self.q.conn

    def query_step(self) -> None:
        q = self.q
        if q.node in self.c.down:
            if not self.up():
                return
            self.failover()
            return
        if q.epoch is None:
            self.claim()
            return
        roll = self.rng.random()
        if roll < 0.45:
            ack = self.call(m.Lease(queue="WorkQ", consumer="spark", after=q.d, max=self.rng.randint(1, 3), ttl=1000,
                                    epoch=q.epoch, cid="lease"))
            if self.answered(ack, "lease"):
                q.d = ack.result.d
                self.read(q.acked, q.d)
        elif roll < 0.75:
            if q.d > q.acked:
                through = self.rng.randint(q.acked + 1, q.d)
                ack = self.call(m.AckThrough(queue="WorkQ", consumer="spark", d=through, epoch=q.epoch, cid="ack"))
                if self.answered(ack, f"ack through {through}"):
                    q.acked = max(q.acked, ack.result.acked)
        elif roll < 0.9:
            self.read(q.acked, q.d)
        else:
            self.failover()

    def answered(self, ack: m.Ack | None, what: str) -> bool:
        """A reply that never came or a failure: the query claims again (as the Spark
        source restarts its query from its checkpoint)."""
        q = self.q
        if ack is None:
            self.trace.append(f"  {what} on {q.node}: no reply")
            q.epoch = None
            return False
        if ack.status != "success":
            self.trace.append(f"  {what} on {q.node}: {ack.code}")
            if ack.code not in ("fenced", "bad_delivery_range"):
                self.fail(f"{what} on {q.node} failed: {ack.code} {ack.reason}")
            q.epoch = None
            return False
        self.trace.append(f"  {what} on {q.node}: {ack.result}")
        return True

    def claim(self) -> None:
        q = self.q
        if not (q.held_on in (None, q.node) or self.sync[q.held_on]):
            # this instance may lack deliveries the query was told of (an async link), and
            # its claim, answered or not, cuts them off everywhere
            q.lossy = True
        ack = self.call(m.Claim(queue="WorkQ", consumer="spark", token=f"t{self.seed}", cid="claim"))
        if not self.answered(ack, "claim"):
            return
        told = q.d
        q.epoch, q.d, q.acked = ack.result.epoch, ack.result.d, ack.result.acked
        if not q.lossy:
            # every delivery it was told of under its last claim was made on this
            # instance, or reached it before the query was told (a sync link), and no
            # claim was tried where they may be missing: they name the same messages here
            if q.d < told:
                self.fail(f"a claim on {q.node} knows deliveries up to {q.d}; the query was told of {told} "
                          f"on {q.held_on}, which replicates to it synchronously")
            q.seen = {d: v for d, v in q.seen.items() if q.acked < d <= q.d}
        else:
            # the limit docs/spark.md states for async links: the source cannot trust its
            # offsets here (the copies still agree once everything settles)
            self.trace.append(f"  a claim was tried over an async link from {q.held_on}: deliveries forgotten")
            self.forgotten += 1
            q.seen = {}
            q.lossy = False
        q.held_on = q.node
    def failover(self) -> None:
        others = [n for n in self.up() if n != self.q.node] or self.up()
        if not others:
            return
        self.q.node = self.rng.choice(others)
        self.q.conn = None
        self.q.epoch = None
        other = [n for n in NAMES if n != self.q.node][0]
        if other in self.c.down:  # the operator's disaster recovery step
            self.c.nodes[self.q.node].engine.set_proxied_transfer("WorkQ", True)
        self.trace.append(f"query fails over to {self.q.node}")
        self.claim()

    def read(self, lo: int, hi: int) -> None:
        """Fetch (lo, hi] on the query's instance: the same message for a delivery as
        every earlier read under this claim, and no message twice."""
        if hi <= lo or self.q.epoch is None:
            return
        q = self.q
        h = self.c.nodes[q.node]
        current = h.engine.named.get("WorkQ", "spark")
        if current is None or current.epoch != q.epoch:
            # claimed since by a newer holder (a claim that was never answered, arriving
            # late): reads are not fenced, the next lease or ack is, and the Spark sink's
            # commit checks the epoch, so what this read returns is never committed
            self.trace.append(f"  read on {q.node}: claimed since (epoch {current and current.epoch})")
            q.epoch = None
            return
        conn = self.connection()
        h.handle(conn, m.Fetch(queue="WorkQ", consumer="spark", lo=lo, hi=hi, cid="fetch"))
        out = h.take(conn)
        done = [x for x in out if isinstance(x, m.Ack) and x.cid == "fetch"]
        if done and done[-1].status != "success":
            if done[-1].code == "bad_delivery_range" and "acknowledged on this instance" in done[-1].reason:
                self.trace.append(f"  fetch ({lo}, {hi}] on {q.node}: a delivery's message was acknowledged here")
                return
            if done[-1].code == "bad_delivery_range" and current.acked > lo:
                # an acknowledgement whose reply never came (the query's instance died)
                # took effect after all: its deliveries are done
                self.trace.append(f"  fetch ({lo}, {hi}] on {q.node}: acknowledged through {current.acked} already")
                q.acked = current.acked
                return
            self.fail(f"fetch ({lo}, {hi}] on {q.node} failed: {done[-1].code} {done[-1].reason}")
        got = {x.delivery: decode(x)["n"] for x in out if isinstance(x, m.Message) and x.query_id == "fetch"}
        if sorted(got) != list(range(lo + 1, hi + 1)):
            self.fail(f"fetch ({lo}, {hi}] on {q.node} returned deliveries {sorted(got)}")
        if len(set(got.values())) != len(got):
            self.fail(f"a message under two unacknowledged deliveries on {q.node}: {got}")
        for d, v in got.items():
            if d in q.seen and q.seen[d] != v:
                self.fail(f"delivery {d} read as message {v} on {q.node}, earlier as {q.seen[d]}")
            q.seen.setdefault(d, v)

    # --- the rest of the world -------------------------------------------------------------

    def network(self) -> None:
        for (src, dest), link in self.c.links.items():
            if link.up and self.rng.random() < 0.7:
                self.c.deliver(src, dest, self.rng.randint(1, 4))

    def step(self) -> None:
        rng, c = self.rng, self.c
        roll = rng.random()
        if roll < 0.25:
            node = rng.choice(self.up() or [None])
            if node is not None:
                h = c.nodes[node]
                conn = h.connect(f"pub-{self.value}")
                for _ in range(rng.randint(1, 3)):
                    self.value += 1
                    h.publish(conn, "Work", {"n": self.value})
                self.trace.append(f"publish up to {self.value} on {node}")
        elif roll < 0.6:
            self.query_step()
        elif roll < 0.67:
            if len(self.up()) == 2:
                node = rng.choice(NAMES)
                self.trace.append(f"crash {node}")
                c.crash(node)
        elif roll < 0.77:
            for node in NAMES:
                if node in c.down:
                    self.trace.append(f"restart {node}")
                    c.restart(node)
            c.connect_all()
        elif roll < 0.8:
            src, dest = rng.choice(list(c.links))
            self.trace.append(f"cut {src}->{dest}")
            c.cut(src, dest)
        elif roll < 0.85:
            c.connect_all()
        elif roll < 0.9:
            node = rng.choice(self.up() or [None])
            if node is not None:
                c.nodes[node].commit()
                c.nodes[node].checkpoint()
        elif roll < 0.95:
            c.advance(rng.uniform(0, 8))
        else:
            for node in self.up():
                c.commit(node)
        self.network()
        c.advance(rng.uniform(0.001, 0.05))  # time passes between two steps (a claim's round is the clock)

    def run(self) -> None:
        for _ in range(STEPS):
            self.step()
        c = self.c
        for node in NAMES:
            if node in c.down:
                c.restart(node)
            c.nodes[node].engine.set_proxied_transfer("WorkQ", False)
        c.connect_all()
        c.settle()
        views = {}
        for node in NAMES:
            h = c.nodes[node]
            cons = h.engine.named.get("WorkQ", "spark")
            if cons is None:
                views[node] = None
                continue
            conn = h.connect(f"final-{node}")
            h.handle(conn, m.Fetch(queue="WorkQ", consumer="spark", lo=cons.acked, hi=cons.d, cid="final"))
            out = h.take(conn)
            ok = out and out[-1].status == "success"
            msgs = [decode(x)["n"] for x in out if isinstance(x, m.Message)] if ok else "refused"
            views[node] = (cons.d, cons.acked, cons.epoch, msgs)
        if views["A"] != views["B"]:
            self.fail(f"the copies differ after everything settled: {views}")


@pytest.mark.parametrize("seeds", seed_batches(SEEDS_DEFAULT, 200), ids=lambda s: f"seeds{s[0]}-{s[-1]}")
def test_replicated_consumer_simulation(seeds):
    for seed in seeds:
        Sim(seed).run()
