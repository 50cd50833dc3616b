"""The checker's partition mode: three instances, one replicated queue, a network that
the checker cuts, delays and heals, publishers and workers that move between instances.

What runs (beside checker.py, whose server, faults and wire-protocol links it reuses):

- three real ``conveyor serve`` processes, A, B and C, in one of two **topologies**:
  ``chain`` (A -> B -> C and back, B passing every group through: the shape of
  tests/integration/test_replicated_queues_three.py's line) or ``mesh`` (every pair,
  both ways, passing through). Every instance has the topic ``jobs`` and a ``<Queue>``
  ``Work`` over it; every destination replicates both, ``sync`` (as checker.py's
  replicated mode): a persisted ack means the publish is on the disks of this instance
  and of each of its neighbours. So ``Work`` is one replicated queue over the three
  (docs/replication.md, "Replicated queues");
- every replication link (one per ``Destination``: source -> destination) goes through
  a :class:`~tests.faults.netproxy.NetProxy`, and the destination addresses in each
  instance's configuration are the proxies' ports;
- publishers that **fail over**: a publisher whose instance refuses it, drops it, stops
  acknowledging for a while (a cut ``sync`` link holds persisted acks) or that the
  nemesis moves, logs on to another instance under the same name and publishes again
  every message not yet acknowledged as persisted, with the same sequence numbers (as
  the client's publish store does): the instance must drop what it already has;
- queue workers (at-least-once, acknowledging in batches) that **move** between
  instances, by the nemesis or because theirs went away;
- a **nemesis** that, again and again, either changes the network (``cut``: both
  directions of a link refused; ``one-way``: one direction; ``isolate``: every link of
  one instance; ``blackhole``: a link's bytes dropped, connections left open; ``delay``:
  latency on a link), healing each after 0.3-3 s, or strikes one instance, chosen at
  random, with one of checker.py's faults (kill, power cut, kill during recovery, torn
  write, damaged record).

At the end: every link is healed, every instance is running, publishers wait until all
they sent is acknowledged, the workers stop and replication settles (every link
streaming, nothing behind, twice in a row); then **owners** are read on every instance
(a sow of the queue, the queue's ``details`` for the messages owned there and
``explain`` for the others, through the admin interface); all three are stopped
gracefully and restarted, settle again, and workers on every instance drain the queue.

The verdict (keys are ``(publisher, seq)``):

- ``lost``: an acknowledged publish missing from some instance's replay of ``jobs``
  (each holds everything: chain and mesh both carry every record everywhere), or never
  processed by a worker (acknowledged, or acknowledged with the answer lost);
- ``duplicated``: a publish recorded twice in some instance's replay of ``jobs``;
- ``unexpected``: a delivery or record no publisher sent like this (and a ``journal
  verify`` that fails after the run);
- ``processed twice``: a message whose acknowledgement two workers were told succeeded
  (on two instances, or twice on one), or delivered again after one was; counted apart
  **in the window** docs/replication.md states ("Publisher failover: at least once, not
  exactly once": a message published on two instances by a publisher's failover may
  be processed twice until each instance has seen the other's copy) and **outside** it
  (a message only ever published on one instance: 0 expected);
- ``stuck``: messages still in some instance's queue after healing and draining;
- ``owner disagreement``: messages that two instances, after healing and settling, hold
  with different owners (read from the admin interface, not derived).

Every run is driven by one seed (``CONVEYOR_CHECKER_SEED`` replays it in the tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from conveyor import records
from conveyor.journal import Journal
from conveyor.protocol import messages as m
from tests.faults import checker
from tests.faults.checker import CheckerError, History, Link, ServerUnderTest, body
from tests.faults.netproxy import NetProxy
from tests.integration.instances import free_port

NAMES = ("A", "B", "C")
TOPIC = "jobs"
QUEUE = "Work"
TOPOLOGIES = ("chain", "mesh")
PARTITIONS = ("cut", "one-way", "isolate", "blackhole", "delay")
PROCESS_FAULTS = checker.FAULTS
PARTITION_SHARE = 0.6  # of the nemesis's faults: the rest strike a process
HEAL_S = (0.3, 3.0)  # how long a partition lasts
PARTITIONS_AT_ONCE = 2
STALL_S = (0.5, 2.0)  # a publisher fails over after so long without an ack
WINDOW_MAX = 200  # unacknowledged publishes a publisher keeps in flight
SETTLE_S_MAX = 150.0  # links back (their backoff reaches 30 s) and nothing behind
DRAIN_S_MAX = 150.0
QUIET_S = 4.0  # longer than a transfer request waits (2 s before any sample)
RECONNECT_S = 0.05
VERBOSE = bool(os.environ.get("CONVEYOR_CHECKER_VERBOSE"))


def _say(what: str) -> None:
    if VERBOSE:
        print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


CONFIG = """\
<AMPSConfig>
    <Name>{name}</Name>
    <Transports>
        <Transport><Name>tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport>
        <Transport><Name>replication</Name><Type>amps-replication</Type><InetAddr>127.0.0.1:{replication_port}</InetAddr></Transport>
    </Transports>
    <TransactionLog>
        <JournalDirectory>{journal}</JournalDirectory>
        <JournalSize>1M</JournalSize>
        <Topic><Name>{topic}</Name><MessageType>json</MessageType></Topic>
    </TransactionLog>
    <SOW>
        <Queue><Name>{queue}</Name><MessageType>json</MessageType><UnderlyingTopic>{topic}</UnderlyingTopic>
               <MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog><LeasePeriod>60s</LeasePeriod></Queue>
    </SOW>
    <Replication>{destinations}
    </Replication>
    <Admin><InetAddr>127.0.0.1:{admin_port}</InetAddr></Admin>
</AMPSConfig>
"""
#: One destination: its address is the proxy of this link; it carries the queue's topic
#: and its underlying topic (both must be replicated, docs/replication.md "Validation").
DESTINATION = """
        <Destination><Name>{name}</Name><SyncType>sync</SyncType>
            <Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:{port}</InetAddr></Transport>
            <Topic><Name>{topic}</Name><MessageType>json</MessageType></Topic>
            <Topic><Name>{queue}</Name><MessageType>json</MessageType></Topic>{pass_through}
        </Destination>"""


def topology_links(topology: str) -> list[tuple[str, str, str | None]]:
    """(source, destination, PassThrough) of every replication link."""
    a, b, c = NAMES
    if topology == "chain":  # tests/integration/test_replicated_queues_three.py, the line
        return [(a, b, None), (b, a, ".*"), (b, c, ".*"), (c, b, None)]
    if topology == "mesh":
        return [(s, d, ".*") for s in NAMES for d in NAMES if s != d]
    raise ValueError(f"topology {topology!r}: one of {TOPOLOGIES}")


class Instance(ServerUnderTest):
    """One of A, B, C: checker.py's server under test with this mode's configuration."""

    def __init__(self, directory: Path, rng: random.Random, name: str, replication_port: int) -> None:
        super().__init__(directory, rng, name=name, replication_port=replication_port)
        self.admin_port = free_port()
        self.destinations: list[tuple[str, int, str | None]] = []  # (name, proxy port, PassThrough)

    def _write_config(self, port: int) -> None:
        self.config.write_text(CONFIG.format(
            name=self.name, port=port, replication_port=self.replication_port, journal=self.journal,
            topic=TOPIC, queue=QUEUE, admin_port=self.admin_port,
            destinations="".join(DESTINATION.format(
                name=dest, port=proxy_port, topic=TOPIC, queue=QUEUE,
                pass_through=f"<PassThrough>{pt}</PassThrough>" if pt else "")
                for dest, proxy_port, pt in self.destinations),
        ))

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and self.port != 0

    async def admin(self, path: str, timeout: float = 10.0):
        url = f"http://127.0.0.1:{self.admin_port}{path}"

        def get():
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return json.loads(resp.read())

        return await asyncio.to_thread(get)


class Cluster:
    """The three instances and the proxies between them."""

    def __init__(self, directory: Path, topology: str, rng: random.Random) -> None:
        self.topology = topology
        self.links = topology_links(topology)
        self.instances: dict[str, Instance] = {
            n: Instance(directory / n, random.Random(rng.random()), n, free_port()) for n in NAMES}
        self.proxies: dict[tuple[str, str], NetProxy] = {}
        for src, dst, pt in self.links:
            proxy = NetProxy(self.instances[dst].replication_port, port=free_port(), name=f"{src}->{dst}")
            self.proxies[(src, dst)] = proxy
            self.instances[src].destinations.append((dst, proxy.port, pt))

    async def start(self) -> None:
        for proxy in self.proxies.values():
            await proxy.start()
        for inst in self.instances.values():
            await inst.spawn()
        for inst in self.instances.values():
            await inst.wait_ready()

    async def heal_all(self) -> None:
        for proxy in self.proxies.values():
            await proxy.heal()

    async def close(self) -> None:
        for inst in self.instances.values():
            await inst.kill()
        for proxy in self.proxies.values():
            await proxy.close()

    def pairs(self) -> list[tuple[str, str]]:
        """The linked pairs (either direction), each once."""
        return sorted({tuple(sorted((s, d))) for s, d, _ in self.links})  # type: ignore[misc]

    def proxies_of_pair(self, a: str, b: str) -> list[NetProxy]:
        return [p for (s, d), p in self.proxies.items() if {s, d} == {a, b}]

    def proxies_of(self, name: str) -> list[NetProxy]:
        return [p for (s, d), p in self.proxies.items() if name in (s, d)]


@dataclass
class PartitionHistory(History):
    """checker.History plus where each message went (keys: (publisher, seq))."""

    acked_singles: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))  # "duplicate" acks
    sent_on: dict = field(default_factory=lambda: defaultdict(dict))  # key -> {instance: first send time}
    deliveries: dict = field(default_factory=lambda: defaultdict(list))  # key -> [(instance, time)]
    confirmed: dict = field(default_factory=lambda: defaultdict(list))  # key -> [(instance, time)] acks confirmed
    after_ack: dict = field(default_factory=dict)  # key -> (instance, time): delivered after a confirmed ack
    disturbed: list = field(default_factory=list)  # (start, end) of every fault, network or process
    publisher_failovers: int = 0
    republished: int = 0  # publishes sent again to another instance than before
    consumer_moves: int = 0

    def acknowledged(self) -> set[tuple[str, int]]:
        out = super().acknowledged()
        for p, seqs in self.acked_singles.items():
            out.update((p, s) for s in seqs)
        return out


class Moved(Exception):
    """The nemesis moves this client to another instance, or it stalled."""


class FailoverPublisher:
    """A publisher with one name and one sequence, on whichever instance answers."""

    def __init__(self, name: str, history: PartitionHistory, rng: random.Random, cluster: Cluster) -> None:
        self.name, self.history, self.rng, self.cluster = name, history, rng, cluster
        self.instance = rng.choice(NAMES)
        self.next_seq = 1
        self.paused = asyncio.Event()
        self.done = False
        self.move_now = False
        self.logged_on = False

    @property
    def acked(self) -> int:
        return self.history.acked_through.get(self.name, 0)

    def unacked(self) -> list[int]:
        singles = self.history.acked_singles[self.name]
        return [s for s in range(self.acked + 1, self.next_seq) if s not in singles]

    async def run(self) -> None:
        while True:
            inst = self.cluster.instances[self.instance]
            self.logged_on = False
            try:
                if inst.port == 0:
                    raise ConnectionRefusedError("not started yet")
                await self._session(await Link.open(inst.port, self.name), inst.name)
            except (OSError, asyncio.IncompleteReadError, Moved):
                pass
            # Fail over: another instance, chosen at random (a client cycles its URIs).
            self.instance = self.rng.choice([n for n in NAMES if n != self.instance])
            self.history.publisher_failovers += self.logged_on  # from a session, not a refused dial
            await asyncio.sleep(RECONNECT_S)

    async def _session(self, link: Link, where: str) -> None:
        await link.next()  # the logon ack: a store republishes whatever is not persisted, whatever it says
        self.logged_on = True
        resend = self.unacked()
        if resend:
            self._publish(link, resend, where)
        reading = asyncio.ensure_future(self._read(link))
        stall_s = self.rng.uniform(*STALL_S)
        progress, progress_at = self._progress(), time.monotonic()
        try:
            while not reading.done():
                now = time.monotonic()
                if self.move_now:
                    self.move_now = False
                    raise Moved("moved by the nemesis")
                if self._progress() != progress:
                    progress, progress_at = self._progress(), now
                elif self.next_seq - 1 > self.acked and now - progress_at > stall_s:
                    raise Moved(f"no persisted ack for {stall_s:.1f} s")
                wait = 0.02
                if not self.done and not self.paused.is_set() and self.next_seq - self.acked <= WINDOW_MAX:
                    n = self.rng.randint(1, 20)
                    seqs = list(range(self.next_seq, self.next_seq + n))
                    self.next_seq += n
                    self.history.sent_through[self.name] = self.next_seq - 1
                    self._publish(link, seqs, where)
                    await link.writer.drain()
                    wait = self.rng.choice([0.002, 0.005, 0.01])
                await asyncio.wait([reading], timeout=wait)
            reading.result()
        finally:
            reading.cancel()
            link.abort()

    def _progress(self) -> tuple[int, int]:
        return self.acked, len(self.history.acked_singles[self.name])

    def _publish(self, link: Link, seqs, where: str) -> None:
        now = time.monotonic()
        for s in seqs:
            sent = self.history.sent_on[(self.name, s)]
            if sent and where not in sent:
                self.history.republished += 1
            sent.setdefault(where, now)
        link.send(*(m.Publish(topic=TOPIC, data=body(self.name, s), seq=s, ack_type="persisted") for s in seqs))

    async def _read(self, link: Link) -> None:
        h = self.history
        while True:
            item = await link.next()
            if not isinstance(item, m.Ack) or item.ack_type != "persisted" or item.seq is None:
                continue
            if item.status == "failure":
                raise AssertionError(f"{self.name}: publish refused: {item.reason}")
            if item.status == "duplicate":  # one sequence, not conflated (client/core.py)
                if item.seq > self.acked:
                    h.acked_singles[self.name].add(item.seq)
            elif item.seq > self.acked:  # conflated: everything up to seq
                h.acked_through[self.name] = min(item.seq, self.next_seq - 1)
            singles = h.acked_singles[self.name]
            top = self.acked
            while top + 1 in singles:
                top += 1
            if top != self.acked:
                h.acked_through[self.name] = top
            for s in [s for s in singles if s <= top]:
                singles.discard(s)


class MovingConsumer:
    """A worker of the replicated queue: it acknowledges in batches and moves between
    instances (or stays on one: ``pinned``)."""

    def __init__(self, name: str, history: PartitionHistory, rng: random.Random, cluster: Cluster,
                 pinned: str | None = None) -> None:
        self.name, self.history, self.rng, self.cluster = name, history, rng, cluster
        self.pinned = pinned
        self.instance = pinned or rng.choice(NAMES)
        self.move_now = False
        self.paused = False  # set: leave the instance (leases go back) and stay away
        self.last_delivery = time.monotonic()

    async def run(self) -> None:
        while True:
            while self.paused:
                await asyncio.sleep(0.05)
            inst = self.cluster.instances[self.instance]
            try:
                if inst.port == 0:
                    raise ConnectionRefusedError("not started yet")
                await self._session(await Link.open(inst.port, self.name), inst.name)
            except (OSError, asyncio.IncompleteReadError, Moved):
                pass
            if self.pinned is None:
                self.instance = self.rng.choice([n for n in NAMES if n != self.instance])
                self.history.consumer_moves += not self.paused
            await asyncio.sleep(RECONNECT_S)

    async def _session(self, link: Link, where: str) -> None:
        h = self.history
        backlog = self.rng.randint(1, 40)
        link.send(m.Subscribe(topic=QUEUE, sub_id="s", options=f"max_backlog={backlog}"))
        pending_acks: dict[str, list] = {}
        batch: list[tuple[str, tuple]] = []
        cids = 0
        try:
            while True:
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the
                    # cancellation that ends this worker (server/links.py says the same)
                    async with asyncio.timeout(0.05 if batch else 0.5):
                        item = await link.next()
                except TimeoutError:
                    item = None
                now = time.monotonic()
                if isinstance(item, m.Message):
                    self.last_delivery = now
                    key = h.check_body(item.data, f"{QUEUE} delivery on {where}")
                    if key is not None:
                        if h.confirmed.get(key) and key not in h.after_ack:
                            h.after_ack[key] = (where, now)
                        h.deliveries[key].append((where, now))
                        h.work_deliveries[key] += 1
                        batch.append((item.bookmark, key))
                elif isinstance(item, m.Ack) and item.cid in pending_acks:
                    keys = pending_acks.pop(item.cid)
                    if item.status == "success":
                        for key in keys:
                            h.confirmed[key].append((where, now))
                        h.work_confirmed.update(keys)
                    else:  # refused (a lease that moved away): it may or may not have counted
                        h.work_ack_unknown.update(keys)
                if (self.move_now or self.paused) and not pending_acks and not batch:
                    self.move_now = False
                    raise Moved("moved or paused by the nemesis")
                if batch and (item is None or len(batch) >= self.rng.randint(1, backlog)):
                    cids += 1
                    cid = f"ack-{cids}"
                    pending_acks[cid] = [k for _, k in batch]
                    link.send(m.SowDelete(topic=QUEUE, bookmark=",".join(b for b, _ in batch), cid=cid,
                                          ack_type="persisted"))
                    batch = []
        finally:
            for keys in pending_acks.values():
                h.work_ack_unknown.update(keys)
            link.abort()


@dataclass
class PartitionVerdict:
    topology: str
    faults: Counter  # process faults, by kind
    partitions: Counter  # network faults, by kind
    kills: int
    acknowledged: int
    lost: int
    duplicated: int
    processed_twice: int
    processed_twice_in_window: int
    unexpected: int
    stuck: int
    owner_disagreement: int
    owners_compared: int  # messages held by two or more instances when owners were read
    two_copies: int  # messages recorded as published on two instances (docs/replication.md's window)
    transfers: int  # messages whose owner changed (journaled transfers: grants and rule 7)
    unsettled: int  # runs whose replication did not settle after healing (0 expected)
    window_s: float  # the longest from a second copy's publish to the last delivery, processed twice
    quiet_window_s: float | None  # the same, over those with no fault in force meanwhile
    publisher_failovers: int
    republished: int
    consumer_moves: int
    redelivered: int
    seconds: float
    details: list[str]

    @property
    def processed_twice_outside_window(self) -> int:
        return self.processed_twice - self.processed_twice_in_window

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 and self.stuck == 0
                and self.owner_disagreement == 0 and self.processed_twice_outside_window == 0
                and self.unsettled == 0)

    def table(self) -> str:
        process = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        network = ", ".join(f"{k} {v}" for k, v in sorted(self.partitions.items()))
        rows = [
            ("topologies", self.topology),
            ("faults", f"{sum(self.faults.values()) + sum(self.partitions.values())}"),
            ("partitions (network faults)", f"{sum(self.partitions.values())} ({network})"),
            ("process faults", f"{sum(self.faults.values())} ({process}); {self.kills} SIGKILLs"),
            ("publisher failovers / publishes sent to a second instance",
             f"{self.publisher_failovers} / {self.republished}"),
            ("worker moves", self.consumer_moves),
            ("ownership transfers (journaled: grants, two copies settled)", self.transfers),
            ("publishes acknowledged as persisted", self.acknowledged),
            ("lost", self.lost),
            ("duplicated (in a topic replay)", self.duplicated),
            ("processed twice, in the stated window (two copies)", self.processed_twice_in_window),
            ("processed twice, outside it", self.processed_twice_outside_window),
            ("messages recorded as published on two instances (two copies)", self.two_copies),
            ("longest window measured (second copy published -> last delivery)",
             f"{self.window_s:.1f} s; with no fault in force: "
             + ("none" if self.quiet_window_s is None else f"{self.quiet_window_s:.2f} s")),
            ("unexpected", self.unexpected),
            ("stuck (in a queue after healing and draining)", self.stuck),
            ("owner disagreement (admin interface)", f"{self.owner_disagreement} of {self.owners_compared}"),
            ("runs whose replication did not settle after healing", self.unsettled),
            ("redelivered before an ack (at-least-once, allowed)", self.redelivered),
            ("seconds", f"{self.seconds:.0f}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows)


# --- the nemesis ---------------------------------------------------------------------------------


@dataclass
class Partition:
    kind: str
    label: str
    proxies: list[NetProxy]
    heal_at: float
    since: float = field(default_factory=time.monotonic)


async def _partition_step(cluster: Cluster, kind: str, rng: random.Random) -> Partition:
    pairs = cluster.pairs()
    heal_at = time.monotonic() + rng.uniform(*HEAL_S)
    if kind == "cut":
        a, b = rng.choice(pairs)
        proxies, label = cluster.proxies_of_pair(a, b), f"cut {a}<->{b}"
    elif kind == "one-way":
        (s, d), proxy = rng.choice(sorted(cluster.proxies.items(), key=lambda kv: kv[0]))
        proxies, label = [proxy], f"cut {s}->{d} only"
    elif kind == "isolate":
        name = rng.choice(NAMES)
        proxies, label = cluster.proxies_of(name), f"isolate {name}"
    elif kind == "blackhole":
        a, b = rng.choice(pairs)
        proxies, label = cluster.proxies_of_pair(a, b), f"blackhole {a}<->{b}"
    elif kind == "delay":
        a, b = rng.choice(pairs)
        seconds = rng.choice([0.01, 0.05, 0.2, 0.5])
        proxies, label = cluster.proxies_of_pair(a, b), f"delay {a}<->{b} {seconds * 1000:.0f} ms"
        for p in proxies:
            p.delay(seconds)
        return Partition(kind, label, proxies, heal_at)
    else:
        raise ValueError(kind)
    for p in proxies:
        p.cut("blackhole" if kind == "blackhole" else "refuse")
    return Partition(kind, label, proxies, heal_at)


async def _heal(partition: Partition, active: list[Partition], history: PartitionHistory) -> None:
    active.remove(partition)
    history.disturbed.append((partition.since, time.monotonic()))
    still = {id(p) for other in active for p in other.proxies}
    for proxy in partition.proxies:
        if id(proxy) not in still:
            await proxy.heal()


async def run(directory: Path, *, seed: int, faults: int, topology: str | None = None, publishers: int = 2,
              consumers: int = 3, process_faults: tuple[str, ...] = PROCESS_FAULTS,
              partitions: tuple[str, ...] = PARTITIONS, restart: bool = True) -> PartitionVerdict:
    """Drive three instances through ``faults`` faults (network or process, at random);
    return the verdict. ``topology``: ``chain`` or ``mesh`` (None: chosen by the seed).
    ``restart``: stop and restart all three gracefully before the final drain."""
    rng = random.Random(seed)
    topology = topology or rng.choice(TOPOLOGIES)
    started = time.monotonic()
    history = PartitionHistory()
    cluster = Cluster(directory, topology, random.Random(rng.random()))
    details: list[str] = [f"seed {seed}, topology {topology}"]
    tasks: list[asyncio.Future] = []
    try:
        await cluster.start()
        pubs = [FailoverPublisher(f"pub-{i}", history, random.Random(rng.random()), cluster) for i in range(publishers)]
        cons = [MovingConsumer(f"work-{i}", history, random.Random(rng.random()), cluster) for i in range(consumers)]
        tasks = [asyncio.ensure_future(c.run()) for c in [*pubs, *cons]]
        done: Counter = Counter()
        cuts: Counter = Counter()
        active: list[Partition] = []
        for k in range(faults):
            # acking: publishers wait, workers catch up; backlog: workers stay away, so
            # that messages pile up in the queue (owned here and there) for the faults.
            phase = rng.choice(["publishing", "publishing", "acking", "backlog"])
            for p in pubs:
                (p.paused.set if phase == "acking" else p.paused.clear)()
            for c in cons:
                c.paused = phase == "backlog"
            for _ in range(rng.randint(1, 3)):
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                checker._raise_if_failed(tasks)
                now = time.monotonic()
                for part in [p for p in active if p.heal_at <= now]:
                    await _heal(part, active, history)
                    details.append(f"  healed {part.label}")
                if rng.random() < 0.3:
                    rng.choice(cons).move_now = True
                if rng.random() < 0.15:
                    rng.choice(pubs).move_now = True
            if rng.random() < PARTITION_SHARE:
                kind = rng.choice(partitions)
                if len(active) >= PARTITIONS_AT_ONCE:
                    oldest = min(active, key=lambda p: p.heal_at)
                    await _heal(oldest, active, history)
                    details.append(f"  healed {oldest.label}")
                part = await _partition_step(cluster, kind, rng)
                active.append(part)
                cuts[kind] += 1
                details.append(f"fault {k + 1}: {part.label} while {phase}")
                _say(details[-1])
            else:
                fault = rng.choice(process_faults)
                victim = cluster.instances[rng.choice(NAMES)]
                details.append(f"fault {k + 1}: {fault} of {victim.name} while {phase}")
                _say(details[-1])
                struck = time.monotonic()
                await checker._nemesis_step(victim, fault, rng, details)
                history.disturbed.append((struck, time.monotonic()))
                done[fault] += 1
        for part in list(active):
            await _heal(part, active, history)
        return await _finish(cluster, history, pubs, cons, tasks, done, cuts, details, started, rng, restart)
    finally:
        for t in tasks:
            t.cancel()
        await cluster.close()


async def _stop(tasks: list[asyncio.Future]) -> None:
    for t in tasks:
        t.cancel()
    _, pending = await asyncio.wait(tasks, timeout=10)
    if pending:
        raise CheckerError(f"{len(pending)} client tasks did not end when cancelled")


async def _settle(cluster: Cluster, details: list[str], what: str) -> bool:
    """Until every link streams with nothing behind, the same twice in a row."""
    deadline = time.monotonic() + SETTLE_S_MAX
    last = None
    wanted = {(s, d) for s, d, _ in cluster.links}
    while time.monotonic() < deadline:
        state = []
        try:
            for inst in cluster.instances.values():
                repl = await inst.admin("/amps/instance/replication")
                for link in repl["outgoing"]:
                    state.append((inst.name, link["destination"], link["state"], link["bytes_behind"], link["acked"]))
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            state = []
        streaming = {(s, d) for s, d, st, behind, _ in state if st == "streaming" and behind == 0}
        if state and streaming >= wanted and state == last:
            return True
        last = state
        await asyncio.sleep(0.5)
    details.append(f"replication did not settle within {SETTLE_S_MAX:.0f} s ({what}): {last}")
    return False


async def _queue_messages(inst: Instance, history: PartitionHistory) -> dict[tuple, str]:
    """key -> bookmark of every message in the queue on ``inst`` (a sow of the queue)."""
    link = await Link.open(inst.port, f"sow-{inst.name}-{time.monotonic_ns()}")
    out: dict[tuple, str] = {}
    try:
        await link.next()  # logon
        link.send(m.Sow(topic=QUEUE, cid="sow", query_id="sow", ack_type="completed"))
        while True:
            item = await asyncio.wait_for(link.next(), 60)
            if isinstance(item, m.Message):
                key = history.check_body(item.data, f"sow of {QUEUE} on {inst.name}")
                if key is not None:
                    out[key] = item.bookmark
            elif isinstance(item, m.Ack) and item.cid == "sow":
                if item.status == "failure":
                    raise CheckerError(f"sow of {QUEUE} on {inst.name} failed: {item.reason}")
                if item.ack_type == "completed":
                    return out
    finally:
        link.abort()


async def _owners(inst: Instance, history: PartitionHistory) -> dict[tuple, str]:
    """key -> owner, as ``inst`` sees each message in its queue (a sow of the queue):
    the queue's ``details`` give each message's state (``available`` or ``leased``:
    owned here; ``elsewhere``: its ``holder`` is the owner); a message the details do not
    list is asked about with ``explain`` ("owned by instance X")."""
    held = await _queue_messages(inst, history)
    details = await inst.admin(f"/amps/instance/queues/{QUEUE}/details?limit=100000")
    listed = {msg["bookmark"]: msg for msg in details["messages"]}
    owners: dict[tuple, str] = {}
    for key, bookmark in held.items():
        msg = listed.get(bookmark)
        if msg is not None and msg["state"] in ("available", "leased"):
            owners[key] = inst.name
            continue
        if msg is not None and msg["state"] == "elsewhere" and msg.get("holder"):
            owners[key] = msg["holder"]
            continue
        quoted = urllib.parse.quote(bookmark, safe="")
        e = await inst.admin(f"/amps/instance/queues/{QUEUE}/explain?bookmark={quoted}")
        summary = e.get("summary", "")
        if e.get("verdict") == "not_owned" and summary.startswith("owned by instance "):
            owners[key] = summary[len("owned by instance "):].split(",")[0]
        elif e.get("state") in ("available", "leased"):
            owners[key] = inst.name
        else:
            owners[key] = f"? ({e.get('verdict')}: {summary})"
    return owners


async def _finish(cluster, history, pubs, cons, tasks, done, cuts, details, started, rng, restart) -> PartitionVerdict:
    # Heal everything; every instance runs (a fault restarts its victim; be sure).
    await cluster.heal_all()
    for inst in cluster.instances.values():
        if not inst.running:
            details.append(f"{inst.name} was not running at the end: started")
            await inst.start()
    # The workers stay away and the publishers publish a little more, on the healed
    # network, so that every instance's queue holds messages of every owner when the
    # owners are read; then they stop and wait until everything is acknowledged.
    for c in cons:
        c.paused = True
    for p in pubs:
        p.paused.clear()
    await asyncio.sleep(1.0)
    for p in pubs:
        p.done = True
    deadline = time.monotonic() + DRAIN_S_MAX
    while any(p.unacked() for p in pubs):
        checker._raise_if_failed(tasks)
        if time.monotonic() > deadline:
            raise CheckerError("publishers were not all acknowledged:\n"
                               + "\n".join(f"{i.name}:\n{i.tail()}" for i in cluster.instances.values()))
        await asyncio.sleep(0.05)
    _say("publishers acknowledged")
    # The workers go; replication settles; owners are read everywhere.
    n_pubs = len(pubs)
    await _stop(tasks[n_pubs:])
    settled = await _settle(cluster, details, "after healing")
    _say("settled; reading owners")
    views = {name: await _owners(inst, history) for name, inst in cluster.instances.items()}
    _say("owners read")
    disagreement, compared = 0, 0
    for key in set().union(*views.values()):
        seen = {name: v[key] for name, v in views.items() if key in v}
        if len(seen) >= 2:
            compared += 1
            if len(set(seen.values())) > 1:
                disagreement += 1
                if disagreement <= 20:
                    details.append(f"owner disagreement on {key}: {seen}")
    held_counts = {name: len(v) for name, v in views.items()}
    details.append(f"after healing and settling, the queue holds {held_counts}")
    # A graceful stop and restart of all three: what is left must come back, with its owners.
    if restart:
        for inst in cluster.instances.values():
            if (code := await inst.stop()) != 0:
                raise CheckerError(f"graceful stop of {inst.name} exited {code}:\n{inst.tail()}")
        for inst in cluster.instances.values():
            await inst.spawn()
        for inst in cluster.instances.values():
            await inst.wait_ready()
        settled = await _settle(cluster, details, "after the restart") and settled
    _say("draining")
    # Workers on every instance drain the queue.
    acknowledged = history.acknowledged()
    drainers = [MovingConsumer(f"drain-{n}", history, random.Random(rng.random()), cluster, pinned=n) for n in NAMES]
    drain_tasks = [asyncio.ensure_future(c.run()) for c in drainers]
    deadline = time.monotonic() + DRAIN_S_MAX
    try:
        while time.monotonic() < deadline:
            checker._raise_if_failed(drain_tasks)
            processed = history.work_confirmed | history.work_ack_unknown
            quiet = time.monotonic() - max(c.last_delivery for c in drainers) > QUIET_S
            if acknowledged <= processed and quiet:
                depths = [(await inst.admin(f"/amps/instance/queues/{QUEUE}"))["queue_depth"]
                          for inst in cluster.instances.values()]
                if not any(depths):
                    break
            await asyncio.sleep(0.2)
    finally:
        await _stop(drain_tasks)
    _say("drained")
    # Stuck: whatever is still in some instance's queue.
    stuck_keys: set = set()
    for name, inst in cluster.instances.items():
        left = await _queue_messages(inst, history)
        if left:
            owners = await _owners(inst, history)
            details.append(f"{len(left)} messages stuck in {QUEUE} on {name}, e.g. "
                           + ", ".join(f"{k} owned by {owners.get(k)}" for k in sorted(left)[:8]))
        stuck_keys |= set(left)
    # Every instance holds every acknowledged publish in its topic, once.
    lost_topic: set = set()
    duplicated = 0
    code = 0
    for name, inst in cluster.instances.items():
        replayed = await checker._replay_topic(inst.port, history)
        missing = acknowledged - set(replayed)
        twice = sum(n - 1 for n in Counter(replayed).values() if n > 1)
        for key in sorted(missing)[:10]:
            details.append(f"lost from the {TOPIC} replay on {name}: {key}")
        if twice:
            details.append(f"{twice} publishes recorded twice on {name}")
        lost_topic |= missing
        duplicated += twice
        vcode, out = await checker._verify_journal(inst.journal)
        if vcode != 0:
            details.append(f"verify of {name} after the run: exit {vcode}\n{out}")
            code = code or vcode
    _say("replayed and verified")
    # Which messages each instance recorded as published there (no origin): a message
    # recorded so on two instances is the two copies of docs/replication.md's window.
    for inst in cluster.instances.values():
        if (code_ := await inst.stop()) != 0:
            raise CheckerError(f"graceful stop of {inst.name} exited {code_}:\n{inst.tail()}")
    copies, transfers = await asyncio.to_thread(_local_copies, cluster)
    two_copies = {k for k, where in copies.items() if len(where) > 1}
    lost_queue = acknowledged - history.work_confirmed - history.work_ack_unknown
    for key in sorted(lost_queue - lost_topic)[:20]:
        details.append(f"never processed by a worker: {key} (sent on {dict(history.sent_on.get(key, {}))})")
    twice, in_window, window, quiet_window = _processed_twice(history, two_copies, details)
    details.extend(history.unexpected[:20])
    return PartitionVerdict(
        topology=cluster.topology,
        faults=done,
        partitions=cuts,
        kills=sum(i.kills for i in cluster.instances.values()),
        acknowledged=len(acknowledged),
        lost=len(lost_topic | lost_queue),
        duplicated=duplicated,
        processed_twice=twice,
        processed_twice_in_window=in_window,
        unexpected=len(history.unexpected) + (code != 0),
        stuck=len(stuck_keys),
        owner_disagreement=disagreement,
        owners_compared=compared,
        two_copies=len(two_copies),
        transfers=transfers,
        unsettled=0 if settled else 1,
        window_s=window,
        quiet_window_s=quiet_window,
        publisher_failovers=history.publisher_failovers,
        republished=history.republished,
        consumer_moves=history.consumer_moves,
        redelivered=sum(n - 1 for n in history.work_deliveries.values() if n > 1),
        seconds=time.monotonic() - started,
        details=details,
    )


def _local_copies(cluster: Cluster) -> tuple[dict[tuple, set[str]], int]:
    """key -> the instances whose journal (read once they are stopped) records the
    message as published there (``origin`` empty), not as replicated in; and how many
    messages changed owner (each journaled transfer counted once, where it was made)."""
    out: dict[tuple, set[str]] = defaultdict(set)
    transfers = 0
    for name, inst in cluster.instances.items():
        journal = Journal.open(inst.journal, create=False)
        try:
            for _, payload in journal.scan():
                rec = records.decode(payload)
                if type(rec) is records.PublishRec and rec.topic == TOPIC and not rec.origin:
                    d = json.loads(rec.data)
                    out[(d["p"], d["s"])].add(name)
                elif type(rec) is records.TransferRec and rec.queue == QUEUE and not rec.origin:
                    transfers += len(rec.seqs)
        finally:
            journal.close()
    return out, transfers


def _processed_twice(history: PartitionHistory, two_copies: set, details: list[str]
                     ) -> tuple[int, int, float, float | None]:
    """Messages processed twice: two acknowledgements confirmed (on two instances or
    one), or a delivery after a confirmed one. In the window: recorded as published on
    two instances (a publisher's failover before the first copy was replicated). Also
    the longest time from the second copy's publish to the message's last delivery, over
    all of them and over those during which no fault was in force (None: there were none)."""
    keys = {k for k, acks in history.confirmed.items() if len(acks) > 1} | set(history.after_ack)
    in_window = 0
    window = 0.0
    quiet: float | None = None
    for key in sorted(keys):
        sent = history.sent_on.get(key, {})
        delivered = history.deliveries.get(key, [])
        if key in two_copies:
            in_window += 1
            copy_at = sorted(sent.values())[1] if len(sent) > 1 else min(sent.values(), default=0.0)
            last = max((t for _, t in delivered), default=copy_at)
            window = max(window, last - copy_at)
            if not any(a < last and copy_at < b for a, b in history.disturbed):
                quiet = max(quiet or 0.0, last - copy_at)
        else:
            confirmed = history.confirmed.get(key, [])
            details.append(f"processed twice outside the window: {key}, sent on {sorted(sent)}, "
                           f"acknowledged on {[w for w, _ in confirmed]}, delivered on {[w for w, _ in delivered]}"
                           + (f", delivered on {history.after_ack[key][0]} after its ack was confirmed"
                              if key in history.after_ack else ""))
    return len(keys), in_window, window, quiet


def run_sync(directory: Path, *, seed: int, faults: int, **kw) -> PartitionVerdict:
    return asyncio.run(run(directory, seed=seed, faults=faults, **kw))
