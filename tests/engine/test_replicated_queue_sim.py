"""Deterministic simulation of a replicated queue across instances (engine/replication/ownership.py).

One seed drives the topology (a third of the seeds with a priority queue), the
publishers, the workers (attached to random instances: they take messages, acknowledge,
cancel, leave), the network (frames move a few at a time, links are cut and come back),
crashes that lose what was not fsynced, and the clock (leases expire, transfers become
due). A second generator, seeded from the seed, draws the delayed retries and failure
reasons (docs/queues.md, "Delayed retry" and "Failure reasons"), so the main one, and
with it each seed's topology, steps and faults, is what it was without them: a
``RetryBackoff`` for about half of the seeds (one value, rising, falling, with ``0s``),
more acknowledgements turned into cancels, a ``delay=N`` on most cancels (``delay=0``
too: at once, whatever the backoff), a ``reason="..."`` (with quotes, a backslash,
non-ASCII) on a third, and a worker that often leaves after its cancel, so that another
instance asks for the message while it waits out its delay and gets it with its time
(``TransferRec.not_before``). The same generator gives a third of the seeds an
``OrderingKey`` with 1 or 2 in flight per key, each key published on one instance.
Checked on every delivery and every acknowledgement:

- a message is never delivered while a lease on it is held, on this instance or on
  another (leases end by an ack, a cancel, the worker leaving, a crash, or the deadline);
- a message is never delivered, on any instance, before the time of its latest delayed
  cancel: the asked delay, or the backoff by its cancel count (the engine's count lies
  between the cancels the sim made and those less the ones a crash may have lost: the
  backoff is taken at its least over that range); a crash that loses a cancel not yet
  fsynced loses its delay too, and the check with it;
- a message is never acknowledged (persisted) twice, anywhere; every cancel (with a
  reason or a delay) is accepted, and the instance shows its reason at once;
- with an ``OrderingKey``, after every step: each running instance's key lines hold
  (queue/keys.py ``check``), and no key has more than its N messages leased across all
  running instances;
- at most one running instance owns a message (checked after every step); an owner
  that granted a message it holds for a delayed retry keeps it, held, only until its
  time, and does not count;
- after every restart, the queue (messages, owners, counts, identities, delayed retries
  and their times, the messages granted away while held or leased, failure reasons) is
  what a replay of the whole journal builds (once the first tick has woken a delayed
  retry whose time passed during the restart, which a snapshot restores as held);

and once the faults stop, every instance restarts, every link reconnects, a worker
joins every instance and time runs on until the queue is drained:

- every message that became durable was acknowledged exactly once (none lost, none
  stuck behind a delay);
- no instance holds anything of the queue any more (every copy converged).

A failure names its seed. Replay one: ``CONVEYOR_SIM_SEED=123 pytest
tests/engine/test_replicated_queue_sim.py``; more seeds: ``CONVEYOR_SIM_SEEDS=20000``.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field

import pytest

from conveyor.protocol.bookmarks import bookmark_position
from conveyor.engine.replication.ownership import WAIT_DEFAULT_S
from conveyor.journal import MemoryJournal

from .cluster import Cluster, destination, instance_xml
from .engine_harness import Harness, queue_xml
from tests.engine.seeds import seed_batches

SEEDS_DEFAULT = 2000
STEPS = 70
LEASE_S = 5.0
# A RetryBackoff for a share of the seeds (None: none): one value, rising, falling, with 0s
BACKOFFS = [None, None, None, "1s", "0.5s,3s", "2s,0s,6s", "4s,1s"]
DELAYS = [0.0, 0.5, 1.0, 2.5, 5.0, 10.0]  # a cancel's delay=N (0: at once, whatever the backoff)
LEAVE_AFTER_CANCEL = 0.4  # a worker leaves after its cancel (of the retries' generator)
REASONS = ["db timeout", 'said "no"', "back\\slash", "été – réessayer"]


class SimFailure(AssertionError):
    pass


@dataclass
class Worker:
    name: str
    node: str
    conn: int | None = None
    held: dict = field(default_factory=dict)  # ident -> (bookmark, lease deadline)


class Sim:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = rng = random.Random(seed)
        names = ["A", "B"] if rng.random() < 0.6 else ["A", "B", "C"]
        sync = rng.random() < 0.5
        priority = seed % 3 == 2  # a third of the seeds: a priority queue (its index moves with transfers)
        # Delayed retries and failure reasons are drawn from a generator of their own, so
        # the main stream (and with it each seed's topology, steps and faults) is as before.
        self.rd = rd = random.Random(f"{seed}/retries")
        backoff = rd.choice(BACKOFFS)
        self.backoff = tuple(float(x.rstrip("s")) for x in backoff.split(",")) if backoff else ()
        # Per-key ordering (queue/keys.py rule 6) for a third of the seeds, from the same
        # generator: each key is published on one instance (its order is the same everywhere).
        self.per_key = rd.choice([1, 2]) if rd.random() < 1 / 3 else 0
        # TargetQueueDepth (bindings.py rule 7) for a third of the others (not with Priority)
        self.window = rd.choice([2, 3, 5]) if not self.per_key and not priority and rd.random() < 1 / 3 else None
        sow = queue_xml("WorkQ", underlying="Work", LeasePeriod=f"{LEASE_S:g}s",
                        Priority="/v % 7" if priority else None, RetryBackoff=backoff,
                        OrderingKey="/k" if self.per_key else None,
                        MaxInFlightPerKey=self.per_key if self.per_key else None, TargetQueueDepth=self.window)
        pass_through = ".*" if len(names) == 3 else None
        self.kind = (f"{len(names)} instances, {'sync' if sync else 'async'}{', priority' if priority else ''}"
                     f"{f', RetryBackoff {backoff}' if backoff else ''}"
                     f"{f', OrderingKey, {self.per_key} per key' if self.per_key else ''}"
                     f"{f', TargetQueueDepth {self.window}' if self.window else ''}")
        self.c = Cluster({
            n: instance_xml(n, [destination(d, sync=sync, pass_through=pass_through) for d in names if d != n], sow=sow)
            for n in names
        })
        self.c.connect_all()
        self.names = names
        self.workers = [Worker(f"w{i}", rng.choice(names)) for i in range(3)]
        self.publishers = {n: None for n in names}
        self.leases: dict[tuple, tuple[str, float]] = {}  # ident -> (worker, deadline)
        self.acked: dict[tuple, str] = {}  # ident -> worker whose ack was persisted
        self.trace: list[str] = []
        self.next_value = 0
        self.pending_acks: dict[str, tuple[str, list]] = {}  # cid -> (worker, idents)
        self.uncertain: set = set()  # acknowledged by a worker that left before it was persisted
        # delayed retries: ident -> (not before, node, journal end after the cancel) of its
        # latest cancel; the cancels each message had, and how many of them a crash lost;
        # per node, (journal end, ident) of the cancels made there since its last crash
        self.not_before: dict[tuple, tuple[float, str, int]] = {}
        self.cancels_made: dict[tuple, int] = {}
        self.cancels_lost: dict[tuple, int] = {}
        self.cancelled_on: dict[str, list[tuple[int, tuple]]] = {n: [] for n in names}
        self.pending_cancels: dict[str, str] = {}  # cid -> worker

    def fail(self, what: str) -> None:
        tail = "\n  ".join(self.trace[-15:])
        raise SimFailure(f"seed {self.seed} ({self.kind}): {what}\n  last steps:\n  {tail}\n"
                         f"  replay: CONVEYOR_SIM_SEED={self.seed}")

    # --- workers -------------------------------------------------------------------------

    def attach(self, w: Worker) -> None:
        h = self.c.nodes[w.node]
        w.conn = h.connect(w.name)
        h.subscribe(w.conn, "WorkQ", options=f"max_backlog={self.rng.choice([1, 2, 5])}")
        self.collect()

    def detach(self, w: Worker) -> None:
        """The worker's connection ended: its leases are over, and its acknowledgements
        still waiting for their persisted ack may or may not have taken effect."""
        for ident in w.held:
            if self.leases.get(ident, ("",))[0] == w.name:
                del self.leases[ident]
        w.held.clear()
        w.conn = None
        for cid in [cid for cid, (name, _) in self.pending_acks.items() if name == w.name]:
            self.uncertain.update(self.pending_acks.pop(cid)[1])
        for cid in [cid for cid, name in self.pending_cancels.items() if name == w.name]:
            del self.pending_cancels[cid]  # its acknowledgement is not coming

    def collect(self) -> None:
        now = self.c.now
        for w in self.workers:
            if w.conn is None or w.node in self.c.down:
                continue
            h = self.c.nodes[w.node]
            if w.conn not in h.conns:
                self.detach(w)
                continue
            for msg in h.messages(w.conn, "WorkQ"):
                ident = tuple(int(x) for x in msg.bookmark.split("|")[:2])
                holder = self.leases.get(ident)
                if holder is not None and holder[0] != w.name and holder[1] > now:
                    self.fail(f"{ident} delivered to {w.name}@{w.node} while {holder[0]} holds its lease")
                if ident in self.acked:
                    self.fail(f"{ident} delivered to {w.name}@{w.node} after {self.acked[ident]} acknowledged it")
                self.uncertain.discard(ident)  # delivered again: that acknowledgement did not count
                held = self.not_before.get(ident)
                if held is not None and now < held[0]:
                    self.fail(f"{ident} delivered to {w.name}@{w.node} {held[0] - now:g}s before its "
                              f"delayed retry's time (cancelled on {held[1]})")
                self.leases[ident] = (w.name, msg.lease_deadline)
                w.held[ident] = (msg.bookmark, msg.lease_deadline)
            for ack in h.acks(w.conn):
                if ack.cid in self.pending_cancels and ack.ack_type == "persisted":
                    del self.pending_cancels[ack.cid]
                    if ack.status != "success":
                        self.fail(f"the cancel {ack.cid} of {w.name}@{w.node} failed: {ack.reason}")
                if ack.ack_type == "persisted" and ack.status == "success" and ack.cid in self.pending_acks:
                    for ident in self.pending_acks.pop(ack.cid)[1]:
                        if ident in self.acked:
                            self.fail(f"{ident} acknowledged by {w.name} after {self.acked[ident]} did")
                        self.acked[ident] = w.name
        self.check_one_owner()
        if self.per_key:
            self.check_keys()

    def check_keys(self) -> None:
        """queue/keys.py rules 2 and 6: on each running instance its lines hold (none of
        its leased messages beyond its key's first N, every message of its own beyond
        them held), and across the instances no key has more than N messages leased."""
        out: dict[str, list[str]] = {}
        for n in self.names:
            if n in self.c.down:
                continue
            h = self.c.nodes[n]
            q = h.engine.queues["WorkQ"]
            try:
                q.keys.check()
            except AssertionError as exc:
                self.fail(f"on {n}: {exc}")
            for row in q.details().messages:
                if row.state == "leased":
                    key = json.loads(h.engine.cache.get(row.position).data)["k"]
                    out.setdefault(key, []).append(n)
        for key, where in out.items():
            if len(where) > self.per_key:
                self.fail(f"key {key!r} has {len(where)} messages leased (on {', '.join(where)}), over {self.per_key}")

    def check_one_owner(self) -> None:
        """At most one running instance owns a message at any time (every publisher here
        publishes on one instance and proxied transfer is off, so rule 7's two copies
        never arise). An owner that granted a message it holds for a delayed retry keeps
        it, held, until its time and then lets it go (docs/queues.md, "Delayed retry"),
        as a leased one goes when its lease ends: it no longer counts as an owner (that
        it never offers it is the delivery checks' part)."""
        owners: dict[tuple, str] = {}
        for n in self.names:
            if n in self.c.down:
                continue
            own = self.c.nodes[n].engine.replicated_queues.by_queue["WorkQ"]
            leaving = own.queue.replica._leaving
            for ident in own.owned_here():
                if leaving and own.queue.replica.position(ident) in leaving:
                    continue
                if ident in owners:
                    self.fail(f"{ident} is owned by {owners[ident]} and by {n}")
                owners[ident] = n

    def ack(self, w: Worker, cancel: bool = False) -> None:
        now = self.c.now
        live = [(i, b) for i, (b, d) in w.held.items() if d > now]
        if not live:
            return
        chosen = live[: self.rng.randint(1, len(live))]
        h = self.c.nodes[w.node]
        cid = f"ack-{self.next_value}"
        self.next_value += 1
        from conveyor.protocol import messages as m

        delay: float | None = None
        reason = ""
        options = None
        if cancel:
            rd = self.rd
            delay = rd.choice(DELAYS) if rd.random() < 0.6 else None
            reason = rd.choice(REASONS) if rd.random() < 0.35 else ""
            options = "cancel" + (f",delay={delay:g}" if delay is not None else "")
            if reason:
                options += ',reason="' + reason.replace("\\", "\\\\").replace('"', '\\"') + '"'
        h.handle(w.conn, m.SowDelete(topic="WorkQ", bookmark=",".join(b for _, b in chosen), cid=cid,
                                     options=options, ack_type="persisted"))
        for ident, _ in chosen:
            del w.held[ident]
            if self.leases.get(ident, ("",))[0] == w.name:
                del self.leases[ident]
        if cancel:
            self.pending_cancels[cid] = w.name
            self.cancelled([ident for ident, _ in chosen], w.node, delay, reason,
                           [bookmark_position(b) for _, b in chosen])
        else:
            self.pending_acks[cid] = (w.name, [ident for ident, _ in chosen])
        what = "ack" if not cancel else options
        self.trace.append(f"{what} {w.name}@{w.node} {[i for i, _ in chosen]}")
        if cancel and self.rd.random() < LEAVE_AFTER_CANCEL:
            # the worker gives up and goes: another instance's worker asks for the message
            # while it waits out its delay here, and gets it with its time
            self.trace.append(f"leave {w.name}@{w.node}")
            h.disconnect(w.conn)
            self.detach(w)

    def cancelled(self, idents: list, node: str, delay: float | None, reason: str, positions: list[int]) -> None:
        """Note what the cancels just made on ``node`` promise (docs/queues.md, "Delayed
        retry"): no delivery anywhere before ``now + delay`` (the asked delay, else the
        backoff by the message's cancel count). The count is the cancels the sim made,
        less those a crash may have lost (:meth:`crashed`), so the engine's is between
        the two: the backoff is taken at its least over that range."""
        now, h = self.c.now, self.c.nodes[node]
        end = h.journal.end  # the cancel's record ends at or before this
        for ident in idents:
            made = self.cancels_made[ident] = self.cancels_made.get(ident, 0) + 1
            least = max(1, made - self.cancels_lost.get(ident, 0))
            if delay is not None:
                wait = delay
            elif self.backoff:
                b = self.backoff
                wait = min(b[min(k, len(b)) - 1] for k in range(least, made + 1))
            else:
                wait = 0.0
            self.not_before[ident] = (now + wait if wait > 0 else 0.0, node, end)
            self.cancelled_on[node].append((end, ident))
        if reason:  # the owner shows the reason at once (the message is back, or held, here)
            rows = {r.position: r for r in h.engine.queues["WorkQ"].details().messages}
            for p in positions:
                row = rows.get(p)
                if row is not None and row.state != "elsewhere" and row.reason != reason:
                    self.fail(f"position {p} on {node} shows the reason {row.reason!r}, not {reason!r}")

    def crashed(self, n: str) -> None:
        """Node ``n`` crashed: its cancels not yet fsynced may be lost, and with them their
        delays (the message is offered at once after the restart) and their counts."""
        durable = self.c.nodes[n].journal.durable_end
        for end, ident in self.cancelled_on[n]:
            if end > durable:
                self.cancels_lost[ident] = self.cancels_lost.get(ident, 0) + 1
                if self.not_before.get(ident, (0.0, "", 0))[1:] == (n, end):
                    del self.not_before[ident]
        self.cancelled_on[n].clear()

    # --- steps ---------------------------------------------------------------------------------

    def step(self) -> None:
        rng, c = self.rng, self.c
        up = [n for n in self.names if n not in c.down]
        roll = rng.random()
        if roll < 0.22 and up:
            n = rng.choice(up)
            h = c.nodes[n]
            if self.publishers[n] is None or self.publishers[n] not in h.conns:
                self.publishers[n] = h.connect(f"pub-{n}")
            body = {"v": self.next_value}
            if self.per_key:
                body["k"] = f"{n}{self.rd.randrange(3)}"
            h.publish(self.publishers[n], "Work", body)
            self.trace.append(f"publish @{n}")
            self.next_value += 1
        elif roll < 0.40 and up:
            n = rng.choice(up)
            self.trace.append(f"commit {n}")
            c.commit(n)
        elif roll < 0.60:
            live = [k for k, link in c.links.items() if link.up]
            if live:
                src, dest = rng.choice(live)
                self.trace.append(f"deliver {src}->{dest}")
                c.deliver(src, dest, rng.choice([1, 2, None]))
        elif roll < 0.72:
            w = rng.choice(self.workers)
            if w.conn is not None and w.node not in c.down:
                cancel = rng.random() < 0.15
                more = self.rd.random() < 0.3  # of its own generator: more cancels, the main stream as before
                self.ack(w, cancel=cancel or more)
        elif roll < 0.76:
            w = rng.choice(self.workers)
            if w.conn is not None and w.node not in c.down:
                self.trace.append(f"leave {w.name}@{w.node}")
                c.nodes[w.node].disconnect(w.conn)
                self.detach(w)
            elif up:
                w.node = rng.choice(up)
                self.trace.append(f"join {w.name}@{w.node}")
                self.attach(w)
        elif roll < 0.80:
            live = [k for k, link in c.links.items() if link.up]
            if live:
                src, dest = rng.choice(live)
                self.trace.append(f"cut {src}->{dest}")
                c.cut(src, dest)
        elif roll < 0.86:
            for src, dest in c.links:
                c.connect(src, dest)
            self.trace.append("reconnect")
        elif roll < 0.88 and len(up) > 1:
            n = rng.choice(up)
            self.trace.append(f"crash {n}")
            c.crash(n)
            self.crashed(n)
            for w in self.workers:
                if w.node == n:
                    self.detach(w)
        elif roll < 0.91 and c.down:
            n = rng.choice(sorted(c.down))
            self.trace.append(f"restart {n}")
            self.restart(n)
        elif roll < 0.93 and up:
            n = rng.choice(up)
            self.trace.append(f"checkpoint {n}")
            c.nodes[n].checkpoint()  # written once the journal covers it, with WorkQ's snapshot
        else:
            dt = rng.choice([0.5, 1.0, WAIT_DEFAULT_S + 0.1, LEASE_S + 0.1])
            self.trace.append(f"advance {dt}")
            c.advance(dt)
        self.collect()

    def restart(self, n: str) -> None:
        """Restart node ``n`` from its last written checkpoint (the queue's snapshot), and
        check that the queue is as a replay of the whole journal leaves it."""
        journal = copy.deepcopy(self.c.nodes[n].journal.store)  # what the crash left
        self.c.restart(n)
        h = self.c.nodes[n]
        full = Harness(h.config, now=self.c.now, journal=MemoryJournal(journal), journal_id=h.journal_id)
        due = h.engine.queues["WorkQ"]._returns.next_deadline()
        if due is not None and due <= self.c.now:
            # A snapshot restores a delayed retry whose time passed during the restart as
            # held, woken by the first tick; a replay never holds it (queue/recovery.py
            # rule 7): the same once the clock has run.
            h.advance(0.0)
            full.advance(0.0)
        mine, theirs = queue_image(h), queue_image(full)
        if mine != theirs:
            diff = [f"{k}: {mine[k]} != {theirs[k]}" for k in mine if mine[k] != theirs[k]]
            self.fail(f"{n} restarted from its snapshot differs from a full replay: {'; '.join(diff)}")

    def heal_and_drain(self) -> None:
        c = self.c
        for n in sorted(c.down):
            self.restart(n)
        for src, dest in c.links:
            c.connect(src, dest)
        c.settle()
        for w in self.workers:
            if w.conn is None or w.conn not in c.nodes[w.node].conns:
                self.detach(w)
                self.attach(w)
        extra = [Worker(f"drain-{n}", n) for n in self.names]
        for w in extra:
            self.attach(w)
        self.workers += extra
        for _ in range(60):
            c.settle()
            self.collect()
            for w in self.workers:
                if w.conn is not None and w.held:
                    self.ack(w)
            c.settle()
            self.collect()
            if self.done():
                return
            c.advance(WAIT_DEFAULT_S + 0.1)
        self.fail("the queue did not drain: " + self.left())

    def durable_idents(self) -> set:
        out = set()
        for n in self.names:
            out |= {(p, s) for p, s, _ in self.c.identities(n, "Work")}
        return out

    def done(self) -> bool:
        if self.pending_acks:
            return False
        return all(
            (st := self.c.nodes[n].engine.queues["WorkQ"].statistics()).queue_depth == 0 and st.elsewhere == 0
            for n in self.names
        )

    def left(self) -> str:
        return "; ".join(
            f"{n}: owned {st.owned} elsewhere {st.elsewhere} backlog {st.backlog}"
            for n in self.names for st in [self.c.nodes[n].engine.queues["WorkQ"].statistics()]
        )

    def run(self) -> None:
        for w in self.workers:
            self.attach(w)
        for _ in range(STEPS):
            self.step()
        self.heal_and_drain()
        missing = self.durable_idents() - set(self.acked) - self.uncertain
        if missing:
            self.fail(f"{len(missing)} durable messages never acknowledged, e.g. {sorted(missing)[:3]}")




def queue_image(h: Harness) -> dict:
    """WorkQ on node ``h``, as a restart must leave it whether or not it had a snapshot."""
    q = h.engine.queues["WorkQ"]
    replica = q.replica
    rows = q.details().messages
    return {
        "available": list(q.available()),
        "owners": {r.position: replica.owner_of(r.position) for r in rows},
        "deliveries": {r.position: r.deliveries for r in rows if r.deliveries},
        "cancels": {r.position: r.cancels for r in rows if r.cancels},
        "identities": {p: replica.ident(p) for p in sorted(r.position for r in rows)},
        "not_before": {r.position: r.not_before for r in rows if r.not_before},
        "leaving": dict(replica._leaving),  # held (or leased) here, granted to another instance
        "reasons": {r.position: r.reason for r in rows if r.reason},
        # OrderingKey: the messages held behind their key, and each key's line (keys.py rule 6)
        "held_by_key": sorted(r.position for r in rows if q.keys is not None and q.keys.held(r.position)),
        "lines": {r.position: q.keys.line_of(r.position) for r in rows} if q.keys is not None else {},
        # not the last position: a message whose removal came first (a tombstone) never
        # entered the queue live, nor after a snapshot; a full replay that starts after
        # that removal lets it in, then removes it again
    }


@pytest.mark.parametrize("seeds", seed_batches(SEEDS_DEFAULT, 100), ids=lambda s: f"seeds{s[0]}-{s[-1]}")
def test_replicated_queue_simulation(seeds):
    for seed in seeds:
        Sim(seed).run()
