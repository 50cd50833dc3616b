"""FileBackedMetadata and queue snapshots at the engine level: the same random workload
(publishes, leases, acks, cancels, expiries into a dead-letter action, sow_delete by
filter, sow views, lease expiries, checkpoints, crash-restarts) driven into two engines,
one with paged queues and snapshots, one whose checkpoints hold no snapshot (every
restart replays the journal); everything they send must be the same, their queues the
same after every restart, and the FBM engine must replay only the journal after its
snapshots.

The dead-letter invariant is checked on both (issue 5: "a dead-letter message exists
for every expiry, exactly once"): in the durable journal, every message of Jobs has at
most one terminal record (an acknowledgement, or the dead letter that carries its
expiry), no expiry is dead-lettered twice, and at the end (a worker drains the queue)
every durable message has exactly one.

Shapes: FIFO, barrier, TargetQueueDepth, Expiration, priority with barriers.

A failure names its seed: ``CONVEYOR_SIM_SEED=7 pytest tests/engine/test_fbm_recovery.py``.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from conveyor import records
from conveyor.engine.queue import priority as queue_priority
from conveyor.engine.queue import store as queue_store
from conveyor.protocol import messages as m
from conveyor.server.page_files import PageFiles

from .engine_harness import Harness
from .seeds import sim_seeds



def jobs_xml(fbm: bool, *, barrier: bool = False, tqd: bool = False, expiration: bool = False,
             priority: bool = False) -> str:
    extra = "<FileBackedMetadata>enabled</FileBackedMetadata>" if fbm else ""
    jobs_extra = extra
    if barrier:
        jobs_extra += "<BarrierExpression>/b = 1</BarrierExpression>"
    if tqd:
        jobs_extra += "<TargetQueueDepth>7</TargetQueueDepth>"
    if expiration:
        jobs_extra += "<Expiration>6s</Expiration>"
    if priority:  # its delivery index is paged too (queue/priority.py rule 5)
        jobs_extra += "<Priority>/k</Priority>"
    return f"""<AMPSConfig><Name>fbm</Name>
<TransactionLog><JournalDirectory>./journals</JournalDirectory>
<Topic><Name>Jobs</Name><MessageType>json</MessageType></Topic>
<Topic><Name>FailedJobs</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW>
<Queue><Name>Jobs</Name><MessageType>json</MessageType><MaxCancels>3</MaxCancels><MaxDeliveries>4</MaxDeliveries>
<LeasePeriod>1s</LeasePeriod><MaxPerSubscriptionBacklog>50</MaxPerSubscriptionBacklog>{jobs_extra}</Queue>
<Queue><Name>FailedJobs</Name><MessageType>json</MessageType>{extra}</Queue>
</SOW>
<Actions><Action>
<On><Module>amps-action-on-sow-expire-message</Module><Options><Topic>Jobs</Topic><MessageType>json</MessageType></Options></On>
<Do><Module>amps-action-do-publish-message</Module><Options><Topic>FailedJobs</Topic><MessageType>json</MessageType>
<Data>{{ "message": {{{{AMPS_DATA}}}}, "reason": "{{{{AMPS_REASON}}}}" }}</Data></Options></Do>
</Action></Actions>
</AMPSConfig>"""


class PagedHarness(Harness):
    """The harness with paged queues: page files in ``pages``, as the server does, under
    a budget of ``chunks`` full chunks (None: the default budget, 1 GiB)."""

    def __init__(self, config: str, pages: Path | None, chunks: int | None = 3, **kw) -> None:
        files = None
        if pages is not None:
            files = PageFiles(pages) if chunks is None else PageFiles(pages, chunks * queue_store.CHUNK_SLOTS * 16)
        super().__init__(config, pages=files, **kw)


def terminal_records(journal) -> tuple[Counter, Counter, set]:
    """(acks and barrier deliveries per Jobs position, dead letters per expired Jobs position, durable Jobs
    publish positions) in the durable journal."""
    acked, dead, published = Counter(), Counter(), set()
    for pos, payload in journal.scan():
        rec = records.decode(payload)
        if type(rec) is records.PublishRec:
            if rec.topic == "Jobs":
                published.add(pos)
            if rec.expired_queue == "Jobs":
                dead[rec.expired_position] += 1
                assert msgspec.json.decode(rec.data)["reason"]
        elif type(rec) in (records.AckedRec, records.BarrierRec) and rec.queue == "Jobs":
            acked.update(rec.positions)  # a delivered barrier leaves the queue for good
        elif type(rec) is records.ExpiredRec and rec.queue == "Jobs":
            raise AssertionError("an expiry without its dead letter")
    return acked, dead, published


def check_ledger(h: Harness, *, final: bool) -> None:
    acked, dead, published = terminal_records(h.journal)
    twice = {p: n for p, n in (acked + dead).items() if n > 1}
    assert not twice, f"terminal records twice: {twice}"
    if final:
        assert set(acked) | set(dead) == published, "a durable message with no terminal record"


def state(h: Harness) -> list:
    out = []
    for name, q in sorted(h.engine.queues.items()):
        rows = q.details().messages
        out.append((name, list(q.available()), sorted(r.position for r in rows if r.state == "leased"),
                    {r.position: r.deliveries for r in rows if r.deliveries},
                    {r.position: r.cancels for r in rows if r.cancels},
                    q.statistics().inactive_message_count))
    return out, h.engine.checkpoint().queues  # the recovery points as stored


def positions(msgs) -> list:
    return [(x.topic, x.bookmark, x.data) for x in msgs if isinstance(x, m.Message)]


class Twin:
    """One random workload driven into two harnesses (FBM paged, and plain)."""

    def __init__(self, seed: int, pages: Path, **shape) -> None:
        self.rng = random.Random(seed)
        self.paged = PagedHarness(jobs_xml(True, **shape), pages)
        self.plain = PagedHarness(jobs_xml(False, **shape), None, snapshots=False)
        self.h = (self.paged, self.plain)
        self.barrier = shape.get("barrier", False)
        self.n = 0
        self.scanned = [0, 0]
        self.reconnect()

    def reconnect(self) -> None:
        self.pub = [h.connect("pub") for h in self.h]
        self.work = [h.connect("w") for h in self.h]
        for h, w in zip(self.h, self.work):
            h.subscribe(w, "Jobs", options="max_backlog=5")
        self.inbox: list = []

    def both(self, fn) -> None:
        for i, h in enumerate(self.h):
            fn(i, h)

    def received(self) -> list:
        got = [positions(h.messages(w, "Jobs")) for h, w in zip(self.h, self.work)]
        assert got[0] == got[1], "the two engines delivered differently"
        return got[0]

    def step(self) -> None:
        rng = self.rng
        op = rng.random()
        if op < 0.3:
            k = rng.randint(1, 25)
            for _ in range(k):
                self.n += 1
                body = {"n": self.n, "k": self.n % 5, "b": 1 if self.barrier and rng.random() < 0.1 else 0}
                self.both(lambda i, h: h.publish(self.pub[i], "Jobs", body))
        elif op < 0.45:
            self.both(lambda i, h: h.commit())
        elif op < 0.5:
            self.both(lambda i, h: h.commit(rounds=1))
        elif op < 0.7:
            self.inbox += self.received()
            if self.inbox:
                take = rng.sample(self.inbox, min(len(self.inbox), rng.randint(1, 5)))
                option = rng.choice([None, None, "cancel", "expire"])
                for t in take:
                    self.inbox.remove(t)
                marks = [b for _, b, _ in take]
                self.both(lambda i, h: h.ack(self.work[i], "Jobs", marks, options=option))
        elif op < 0.74:
            k = rng.randint(0, 4)
            self.both(lambda i, h: h.ack_filter(self.pub[i], "Jobs", f"/k = {k}"))
        elif op < 0.77:
            sows = [[x.bookmark for x in h.sow(self.pub[i], "Jobs", filter="/k < 3")] for i, h in enumerate(self.h)]
            assert sows[0] == sows[1]
        elif op < 0.85:
            dt = rng.choice([0.3, 0.7, 1.2, 2.5])
            self.both(lambda i, h: h.advance(dt))
            self.inbox = []  # leases may have run out: what comes again is delivered again
        elif op < 0.92:
            self.both(lambda i, h: h.checkpoint())
        else:
            full = rng.random() < 0.2
            self.both(lambda i, h: h.crash(checkpoint=not full))
            self.scanned = [h.recovered for h in self.h]
            if not full:
                assert self.paged.recovered <= self.plain.recovered
            assert state(self.paged) == state(self.plain)
            for h in self.h:
                check_ledger(h, final=False)
            self.reconnect()
        self.received_into_inbox()

    def received_into_inbox(self) -> None:
        self.inbox += self.received()

    def drain(self) -> None:
        for h in self.h:
            h.commit()
        for r in range(1000):
            if r % 10 == 9:
                # Leases whose delivery the workload dropped (the inbox is not kept across
                # every step) expire: otherwise they hold the worker's backlog forever.
                self.both(lambda i, h: h.advance(1.5))
                self.both(lambda i, h: h.commit())
            self.inbox += self.received()
            if not self.inbox:
                self.both(lambda i, h: h.advance(1.5))
                self.both(lambda i, h: h.commit())
                self.inbox += self.received()
                if not self.inbox:
                    break
            marks = [b for _, b, _ in self.inbox]
            self.inbox = []
            self.both(lambda i, h: h.ack(self.work[i], "Jobs", marks))
            self.both(lambda i, h: h.commit())
        for h in self.h:
            assert h.stats("Jobs").queue_depth == 0
            check_ledger(h, final=True)
        self.both(lambda i, h: h.crash())
        for h in self.h:
            assert h.stats("Jobs").queue_depth == 0
            check_ledger(h, final=True)


SHAPES = [{}, {"barrier": True}, {"tqd": True}, {"expiration": True}, {"priority": True, "barrier": True}]


@pytest.mark.parametrize("seed", sim_seeds(60))
def test_fbm_engine_matches_plain_engine_across_crashes(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(queue_store, "CHUNK_SLOTS", 4)
    monkeypatch.setattr(queue_store, "_COMPACT_MIN_SLOTS", 2)
    monkeypatch.setattr(queue_priority, "CHUNK_SLOTS", 4)
    shape = SHAPES[seed % len(SHAPES)]
    twin = Twin(seed, tmp_path / "queues", **shape)
    try:
        for _ in range(120):
            twin.step()
        twin.drain()
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} ({shape}): {exc}") from exc


def test_restart_replays_only_after_the_snapshot(tmp_path, monkeypatch):
    """10,000 queued and half of them consumed before the checkpoint: the restart reads
    only what came after it, and the queue is the same as after a full replay."""
    monkeypatch.setattr(queue_store, "CHUNK_SLOTS", 64)
    pages = tmp_path / "queues"
    h = PagedHarness(jobs_xml(True), pages)
    pub, w = h.connect("pub"), h.connect("w")
    for n in range(10_000):
        h.publish(pub, "Jobs", {"n": n, "k": 0, "b": 0})
    h.commit()
    h.subscribe(w, "Jobs", options="max_backlog=50")
    done = 0
    while done < 5_000:
        msgs = h.messages(w, "Jobs")
        h.ack(w, "Jobs", msgs)
        h.commit()
        done += len(msgs)
    h.checkpoint()
    h.commit()
    for n in range(10_000, 10_010):
        h.publish(pub, "Jobs", {"n": n, "k": 0, "b": 0})
    h.commit()
    assert h.engine.queues["Jobs"].paged_chunks > 0
    jobs = h.engine.queues["Jobs"]
    leased = [r.position for r in jobs.details().messages if r.state == "leased"]
    before = sorted([*jobs.available(), *leased])  # the leases come back
    h.crash()
    assert h.recovered < 100  # the 10 publishes, the leases and acks after the checkpoint
    assert list(h.engine.queues["Jobs"].available()) == before
    full = PagedHarness(jobs_xml(True), tmp_path / "other")
    full.journal = h.journal
    full.crash(checkpoint=False)
    assert full.recovered > 10_000
    assert list(full.engine.queues["Jobs"].available()) == before


def test_a_corrupt_or_stale_snapshot_falls_back_to_the_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(queue_store, "CHUNK_SLOTS", 64)
    pages = tmp_path / "queues"
    h = PagedHarness(jobs_xml(True), pages)
    pub = h.connect("pub")
    for n in range(3_000):
        h.publish(pub, "Jobs", {"n": n, "k": 0, "b": 0})
    h.commit()
    h.checkpoint()
    h.commit()
    want = list(h.engine.queues["Jobs"].available())
    for path in pages.glob("Jobs.*.fbm"):
        data = bytearray(path.read_bytes())
        data[20] ^= 0xFF
        path.write_bytes(bytes(data))
    h.crash()
    assert h.recovered >= 3_000  # the snapshot did not check: replayed from the journal
    assert list(h.engine.queues["Jobs"].available()) == want


@pytest.mark.parametrize("fbm", [False, True])
def test_a_priority_queue_restarts_from_its_snapshot(tmp_path, monkeypatch, fbm):
    """A priority queue with barriers: 3,000 queued at mixed priorities (NaN ones
    included), some leased and some acknowledged by bookmark (stale entries in the
    index) before the checkpoint. The restart reads only what came after it and
    delivers in the same order as a full replay. With FileBackedMetadata under a budget
    of a few chunks, its store and its index are paged, and the snapshot names their
    pages."""
    monkeypatch.setattr(queue_priority, "CHUNK_SLOTS", 16)
    monkeypatch.setattr(queue_store, "CHUNK_SLOTS", 64)
    rng = random.Random(5)
    h = PagedHarness(jobs_xml(fbm, priority=True, barrier=True), tmp_path / "queues" if fbm else None)
    pub, w = h.connect("pub"), h.connect("w")
    for n in range(3_000):
        k = rng.choice([0, 1, 5, 9, "x"])  # "x": not numeric, the lowest priority
        h.publish(pub, "Jobs", {"n": n, "k": k, "b": int(n % 700 == 699)})
    h.commit()
    h.subscribe(w, "Jobs", options="max_backlog=30")
    msgs = h.messages(w, "Jobs")
    h.ack(w, "Jobs", msgs[:20])  # 10 stay leased: they come back after the restart
    h.commit()
    jobs = h.engine.queues["Jobs"]
    acked = rng.sample([p for p in jobs.available() if not jobs._order.is_barrier(p)], 300)
    bookmarks = [f"0|0|{p}" for p in acked]  # an ack names a position
    h.ack(pub, "Jobs", bookmarks)  # by bookmark, not leased: lazy removals
    h.commit()
    h.checkpoint()
    h.commit()
    assert h.written_checkpoint.snapshots["Jobs"].epochs
    if fbm:
        assert h.written_checkpoint.snapshots["Jobs"].epoch_pages  # index chunks by reference
        assert jobs.paged_chunks > 0
    for n in range(3_000, 3_010):
        h.publish(pub, "Jobs", {"n": n, "k": 3, "b": 0})
    h.commit()
    h.crash()
    assert h.recovered < 100  # the 10 publishes after the checkpoint
    full = PagedHarness(jobs_xml(False, priority=True, barrier=True), None)
    full.journal = h.journal
    full.crash(checkpoint=False)
    assert full.recovered > 3_000
    order = list(h.engine.queues["Jobs"].available())
    assert order == list(full.engine.queues["Jobs"].available())
    assert len(order) == 3_010 - 20 - 300
    assert h.engine.queues["Jobs"]._order.priorities() == full.engine.queues["Jobs"]._order.priorities()
