"""Deterministic simulation of several replicating engines (docs/replication.md).

One seed drives the topology, the workload, the network and the faults, in virtual
time (tests/engine/cluster.py). Each step is one of: a publisher publishes, a node
commits (fsync), frames move on a link (some of them), a link is cut or reconnected, a
node crashes (losing what it had not fsynced) or restarts, a publisher fails over to
another node (republishing what it was not told is persisted, as a client's publish
store does), time passes, a checkpoint is taken.

Checked at every persisted acknowledgement:

- the message is durable on the node that acknowledged it and on every sync
  destination of that node that is not downgraded and that the node sends it to
  (rule 4);

and once the faults stop, every node restarts, every link reconnects and the cluster
settles:

- no node records a message twice (``(publisher, seq)`` is recorded once per node);
- every message a publisher was told is persisted is on the node that said so, and on
  every node that the topology makes it reach;
- every node holds the same messages as every other it is joined to (convergence).

A failure names its seed. Replay one: ``CONVEYOR_SIM_SEED=123 pytest
tests/engine/test_replication_sim.py``; more seeds: ``CONVEYOR_SIM_SEEDS=20000``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from conveyor import records
from conveyor.protocol.bookmarks import publisher_id
from conveyor.protocol import messages as m

from .cluster import Cluster, destination, instance_xml
from tests.engine.seeds import seed_batches

SEEDS_DEFAULT = 2000
STEPS = 80


class SimFailure(AssertionError):
    pass


def topology(rng: random.Random) -> tuple[str, dict[str, str], dict[str, set[str]]]:
    """(name, configs, reach): reach[n] = the nodes every message published on n ends up on."""
    kind = rng.choice(["pair-sync", "pair-async", "pair-one-way", "chain", "ring", "mesh"])
    sync = lambda: rng.random() < 0.5  # noqa: E731
    if kind == "pair-sync":
        cfg = {"A": instance_xml("A", [destination("B", sync=True)]), "B": instance_xml("B", [destination("A", sync=True)])}
        reach = {"A": {"A", "B"}, "B": {"A", "B"}}
    elif kind == "pair-async":
        cfg = {"A": instance_xml("A", [destination("B")]), "B": instance_xml("B", [destination("A")])}
        reach = {"A": {"A", "B"}, "B": {"A", "B"}}
    elif kind == "pair-one-way":
        cfg = {"A": instance_xml("A", [destination("B", sync=sync())]), "B": instance_xml("B")}
        reach = {"A": {"A", "B"}, "B": {"B"}}
    elif kind == "chain":
        cfg = {
            "A": instance_xml("A", [destination("B", sync=sync())], group="gA"),
            "B": instance_xml("B", [destination("C", sync=sync(), pass_through="gA")], group="gB"),
            "C": instance_xml("C", group="gC"),
        }
        reach = {"A": {"A", "B", "C"}, "B": {"B", "C"}, "C": {"C"}}
    elif kind == "ring":
        cfg = {n: instance_xml(n, [destination(d, sync=sync(), pass_through=".*")])
               for n, d in (("A", "B"), ("B", "C"), ("C", "A"))}
        reach = {n: {"A", "B", "C"} for n in "ABC"}
    else:
        names = ["A", "B", "C"]
        cfg = {n: instance_xml(n, [destination(d, sync=sync()) for d in names if d != n]) for n in names}
        reach = {n: set(names) for n in names}
    return kind, cfg, reach


@dataclass
class Publisher:
    name: str
    node: str
    conn: int | None = None
    next_seq: int = 1
    unpersisted: dict[int, bytes] = field(default_factory=dict)  # its publish store
    persisted: dict[int, str] = field(default_factory=dict)  # seq -> node that acknowledged it


class Sim:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.kind, configs, self.reach = topology(self.rng)
        self.c = Cluster(configs)
        self.c.connect_all()
        names = list(configs)
        self.publishers = [Publisher(f"p{i}", self.rng.choice(names)) for i in range(3)]
        self.trace: list[str] = []

    def fail(self, what: str) -> None:
        tail = "\n  ".join(self.trace[-15:])
        raise SimFailure(f"seed {self.seed} ({self.kind}): {what}\n  last steps:\n  {tail}\n"
                         f"  replay: CONVEYOR_SIM_SEED={self.seed}")

    # --- publishers ---------------------------------------------------------------------

    def attach(self, pub: Publisher) -> None:
        """(Re)connect to its node: the logon says the highest sequence the node has; the
        store republishes what is above it."""
        h = self.c.nodes[pub.node]
        pub.conn = h.connect(pub.name, ack_type="processed")
        (logon,) = [a for a in h.acks(pub.conn) if a.client_name]
        for seq in sorted(pub.unpersisted):
            if seq <= logon.persisted:
                del pub.unpersisted[seq]  # persisted on that node (published or replicated)
                pub.persisted[seq] = pub.node
                self.check_persisted(pub, seq, pub.node)
                continue
            h.publish(pub.conn, "Work", pub.unpersisted[seq], seq=seq, ack_type="persisted")

    def publish(self, pub: Publisher) -> None:
        seq, pub.next_seq = pub.next_seq, pub.next_seq + 1
        data = f'{{"p":"{pub.name}","s":{seq}}}'.encode()
        pub.unpersisted[seq] = data
        self.c.nodes[pub.node].publish(pub.conn, "Work", data, seq=seq, ack_type="persisted")

    def collect_acks(self) -> None:
        for pub in self.publishers:
            if pub.conn is None or pub.node in self.c.down:
                continue
            h = self.c.nodes[pub.node]
            for ack in h.acks(pub.conn):
                if ack.ack_type != "persisted":
                    continue
                if ack.status == "duplicate":
                    done = [ack.seq] if ack.seq in pub.unpersisted else []
                elif ack.status == "success":
                    done = [s for s in pub.unpersisted if s <= ack.seq]
                else:
                    self.fail(f"{pub.name}: persisted ack failed: {ack.reason}")
                for seq in done:
                    del pub.unpersisted[seq]
                    pub.persisted[seq] = pub.node
                    self.check_persisted(pub, seq, pub.node)

    def check_persisted(self, pub: Publisher, seq: int, node: str) -> None:
        """Rule 4 at the moment of the ack."""
        ident = (publisher_id(pub.name), seq)
        mine = [r for r in self.c.publishes(node) if (r.publisher, r.seq) == ident]
        if not mine:
            self.fail(f"{pub.name} seq {seq} acknowledged as persisted by {node}, not durable there")
        repl = self.c.nodes[node].engine.replication
        # A sync destination covers what this node sends it (its topics, PassThrough).
        holders = [link.name for link in repl.source.links.values() if link.holds_persisted and link.wants(mine[0], link.name)]
        for n in holders:
            have = {(r.publisher, r.seq) for r in self.c.publishes(n)}  # durable: survives a crash of n
            if ident not in have:
                self.fail(f"{pub.name} seq {seq} acknowledged as persisted by {node}, not durable on {n}")

    # --- steps --------------------------------------------------------------------------------

    def step(self) -> None:
        rng, c = self.rng, self.c
        up = [n for n in c.nodes if n not in c.down]
        roll = rng.random()
        if roll < 0.30:
            pub = rng.choice(self.publishers)
            if pub.node in c.down:
                return
            if pub.conn is None or pub.conn not in c.nodes[pub.node].conns:
                self.attach(pub)
            self.trace.append(f"publish {pub.name}@{pub.node} seq {pub.next_seq}")
            self.publish(pub)
        elif roll < 0.50 and up:
            n = rng.choice(up)
            self.trace.append(f"commit {n}")
            c.commit(n)
        elif roll < 0.75:
            live = [k for k, link in c.links.items() if link.up]
            if live:
                src, dest = rng.choice(live)
                frames = rng.choice([1, 2, None])
                self.trace.append(f"deliver {src}->{dest} {frames or 'all'}")
                c.deliver(src, dest, frames)
        elif roll < 0.80:
            live = [k for k, link in c.links.items() if link.up]
            if live:
                src, dest = rng.choice(live)
                self.trace.append(f"cut {src}->{dest}")
                c.cut(src, dest)
        elif roll < 0.86:
            down = [k for k, link in c.links.items() if not link.up]
            if down:
                src, dest = rng.choice(down)
                self.trace.append(f"connect {src}->{dest}")
                c.connect(src, dest)
        elif roll < 0.89 and len(up) > 1:
            n = rng.choice(up)
            self.trace.append(f"crash {n}")
            c.crash(n)
            for pub in self.publishers:
                if pub.node == n:
                    pub.conn = None
        elif roll < 0.93 and c.down:
            n = rng.choice(sorted(c.down))
            self.trace.append(f"restart {n}")
            c.restart(n)
        elif roll < 0.96:
            pub = rng.choice(self.publishers)
            others = [n for n in up if n != pub.node]
            if others:
                pub.node = rng.choice(others)
                self.trace.append(f"failover {pub.name} -> {pub.node}")
                self.attach(pub)
        elif roll < 0.98:
            self.trace.append("advance 1s")
            c.advance(1.0)
        elif up:
            n = rng.choice(up)
            self.trace.append(f"checkpoint {n}")
            c.nodes[n].checkpoint()
        self.collect_acks()

    def heal(self) -> None:
        c = self.c
        for n in sorted(c.down):
            c.restart(n)
        for pub in self.publishers:
            if pub.conn is None or pub.conn not in c.nodes[pub.node].conns:
                self.attach(pub)
        c.connect_all()
        c.settle()
        self.collect_acks()

    # --- checks ------------------------------------------------------------------------------

    def check_end(self) -> None:
        c = self.c
        held: dict[str, set] = {}
        for n in c.nodes:
            ids = [(r.publisher, r.seq) for r in c.publishes(n) if r.topic == "Work"]
            twice = [k for k, v in Counter(ids).items() if v > 1]
            if twice:
                self.fail(f"{n} recorded {twice[:3]} more than once")
            held[n] = set(ids)
        for pub in self.publishers:
            pid = publisher_id(pub.name)
            for seq, node in pub.persisted.items():
                for n in self.reach[node]:
                    if (pid, seq) not in held[n]:
                        self.fail(f"{pub.name} seq {seq}, persisted by {node}, is missing on {n}")
            if pub.unpersisted:
                self.fail(f"{pub.name}: {sorted(pub.unpersisted)} never acknowledged as persisted after healing")
        for n in c.nodes:
            for other in c.nodes:
                origin_here = {i for i in held[n] if self.published_on(i) in self.reach and other in self.reach[self.published_on(i)]}
                missing = origin_here - held[other]
                if missing:
                    self.fail(f"{other} lacks {sorted(missing)[:3]} that {n} has and the topology sends it")

    def published_on(self, ident: tuple[int, int]) -> str:
        """Where a message was first recorded (the node with no origin for it)."""
        for n in self.c.nodes:
            for r in self.c.publishes(n):
                if (r.publisher, r.seq) == ident and not r.origin:
                    return n
        return ""

    def run(self) -> None:
        for pub in self.publishers:
            self.attach(pub)
        for _ in range(STEPS):
            self.step()
        self.heal()
        self.check_end()




@pytest.mark.parametrize("seeds", seed_batches(SEEDS_DEFAULT, 250), ids=lambda s: f"seeds{s[0]}-{s[-1]}")
def test_replication_simulation(seeds):
    for seed in seeds:
        Sim(seed).run()


def test_the_simulation_catches_a_lost_record(monkeypatch):
    """The checker is not vacuous: a sink that acknowledges every batch but records none
    of its publishes is caught. The publishes are taken out of each batch on the
    simulated network, not by patching the sink, whose class is compiled in the
    compiled build."""
    import msgspec

    from conveyor.protocol import replication as p_repl

    def is_publish(payload: bytes) -> bool:
        return payload.startswith(records.PLAIN_PUBLISH_HEAD) or type(records.decode(payload)) is records.PublishRec

    pull = Cluster._pull

    def losing_pull(self, link) -> None:
        pull(self, link)
        link.to_dst = type(link.to_dst)(
            msgspec.structs.replace(x, records=[r for r in x.records if not is_publish(r)])
            if isinstance(x, p_repl.Batch) else x for x in link.to_dst)

    monkeypatch.setattr(Cluster, "_pull", losing_pull)
    with pytest.raises(SimFailure):
        for seed in range(50):
            Sim(seed).run()
