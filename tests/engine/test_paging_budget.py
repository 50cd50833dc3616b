"""FileBackedMetadata paged only as necessary (engine/queue/budget.py): one budget shared
by every paged queue; nothing is paged out under it; over it the least recently used
chunks of any queue go first and the resident bytes come back under it (but for each
queue's head and tail); a priority queue pages its delivery index under the same
budget, delivers in exact priority order, and restarts from a snapshot that names its
index pages."""

from __future__ import annotations

import random

import pytest

from conveyor.config.model import QueueConfig
from conveyor.engine.queue import priority as queue_priority
from conveyor.engine.queue import snapshot as queue_snapshot
from conveyor.engine.queue import store as queue_store
from conveyor.engine.queue.budget import PagingBudget
from conveyor.engine.queue.paging import PagedMessageStore
from conveyor.engine.queue.queue import AckOption, Consumer, Queue
from conveyor.server.page_files import PageFiles

CHUNK = 16 * queue_store.CHUNK_SLOTS  # bytes of a full store chunk


def fbm(name: str = "Q", **kw) -> QueueConfig:
    return QueueConfig(name=name, message_type="json", file_backed_metadata=True, **kw)


def paged_queue(tmp_path, name: str, budget: PagingBudget, **kw) -> Queue:
    q = Queue(fbm(name, **kw), load=lambda p: (p,))
    q.page_to(PageFiles(tmp_path).open(name, 0, fresh=True), budget=budget)
    return q


def store(q: Queue) -> PagedMessageStore:
    s = q._order.store
    assert isinstance(s, PagedMessageStore)
    return s


def test_nothing_is_paged_under_the_budget(tmp_path):
    budget = PagingBudget(64 * CHUNK)
    a, b = paged_queue(tmp_path, "A", budget), paged_queue(tmp_path, "B", budget)
    for p in range(25 * queue_store.CHUNK_SLOTS):  # 50 chunks in all: under 64
        a.enqueue(2 * p, 1.0)
        b.enqueue(2 * p + 1, 1.0)
    assert a.paged_chunks == b.paged_chunks == 0
    assert store(a).file.size == store(b).file.size == 0  # not a byte written
    assert budget.page_outs == 0 and len(budget) == 50
    assert budget.resident <= budget.limit


def test_over_the_budget_pages_out_and_stays_under_it(tmp_path):
    budget = PagingBudget(8 * CHUNK)
    q = paged_queue(tmp_path, "Q", budget)
    n = 40 * queue_store.CHUNK_SLOTS
    for p in range(n):
        q.enqueue(p, float(p))
        if p % 1000 == 0:
            # the count is at most the budget, but for the growing tail (measured once full)
            assert budget.resident <= budget.limit + CHUNK
    s = store(q)
    assert q.paged_chunks >= 40 - 9
    assert budget.page_outs >= 31
    assert s.resident_bytes <= budget.limit + CHUNK  # the tail, always resident
    # counted exactly, but for the tail's growth (measured when the next chunk starts)
    assert budget.resident <= s.resident_bytes <= budget.resident + CHUNK
    # drain from the head, with acks by bookmark deep in the queue: still within the budget
    rng = random.Random(3)
    gone = set()
    for p in rng.sample(range(n), 200):
        q.acknowledge([p], by=None, option=AckOption.NONE, now=1.0)
        gone.add(p)
        assert budget.resident <= budget.limit + 2 * CHUNK  # head and tail
    assert list(q.available()) == [p for p in range(n) if p not in gone]
    assert s.resident_bytes <= budget.limit + 2 * CHUNK


def test_the_least_recently_used_chunks_go_first_across_queues(tmp_path):
    budget = PagingBudget(30 * CHUNK)
    a, b = paged_queue(tmp_path, "A", budget), paged_queue(tmp_path, "B", budget)
    slots = queue_store.CHUNK_SLOTS
    for p in range(20 * slots):
        a.enqueue(p, 1.0)
    assert a.paged_chunks == 0
    for p in range(20 * slots):
        b.enqueue(10**9 + p, 1.0)
    # B's chunks are the recent ones: only A's (the oldest) were paged out
    assert b.paged_chunks == 0
    assert a.paged_chunks >= 9
    # A's middle is used again (acks by bookmark, chunk by chunk): now B's oldest go
    for c in range(1, 19):
        a.acknowledge([c * slots + 5], by=None, option=AckOption.NONE, now=1.0)
    assert a.paged_chunks == 0
    assert b.paged_chunks >= 9
    assert store(b)._chunks[1].positions is None  # B's oldest but its head
    assert store(b)._chunks[-2].positions is not None  # B's newest stay
    assert budget.resident <= budget.limit + 2 * CHUNK


# --- priority queues -------------------------------------------------------------------------


PRIORITIES = [0, 1, 5, 9, 2**64 - 1, -1]  # -1: NaN, the lowest


def expected_order(msgs: dict[int, int]) -> list[int]:
    return sorted(msgs, key=lambda p: (msgs[p] == -1, -msgs[p], p))


def drain(q: Queue, now: float = 1.0) -> list[int]:
    """Deliver everything to one consumer, acknowledging as it goes: positions in the
    order delivered."""
    c = Consumer((1, "w"), 1, filter=None, max_backlog=7)
    q.add_consumer(c, now)
    got: list[int] = []
    while True:
        out = [d.position for d in q.dispatch(now)]
        if not out:
            break
        got += out
        q.acknowledge(out, by=None, option=AckOption.NONE, now=now)
    q.remove_consumer(c, now)
    return got


@pytest.fixture
def tiny_index(monkeypatch):
    monkeypatch.setattr(queue_priority, "CHUNK_SLOTS", 8)
    monkeypatch.setattr(queue_priority, "_CUT_MIN", 2)


def check_index_budget(q: Queue, budget: PagingBudget) -> None:
    """Every resident chunk of the store and of the index is counted, no paged-out one."""
    chunks = [*store(q)._chunks, *q._order._index_chunks()]
    for ch in chunks:
        resident = ch.positions is not None if isinstance(ch, queue_store._Chunk) else bool(ch.ranks)
        assert (ch in budget) == resident


def test_priority_queue_pages_its_index_and_delivers_in_order(tmp_path, tiny_index):
    rng = random.Random(11)
    budget = PagingBudget(16 * 8 * 4)  # four index chunks' worth: store and index both page
    q = Queue(fbm(priority="/p"), load=lambda p: (p,), chunk_slots=8)
    q.page_to(PageFiles(tmp_path).open("Q", 0, fresh=True), budget=budget)
    msgs = {}
    for p in range(2_000):
        msgs[p] = rng.choice(PRIORITIES)
        q.enqueue(p, 1.0, priority=msgs[p])
    index = q._order._epochs[0]
    assert index.paged_chunks > 10 and store(q).paged_chunks > 10
    check_index_budget(q, budget)
    # some acknowledged by bookmark (lazy removals in the index), deep in the queue
    for p in rng.sample(sorted(msgs), 300):
        q.acknowledge([p], by=None, option=AckOption.NONE, now=1.0)
        del msgs[p]
    check_index_budget(q, budget)
    assert drain(q) == expected_order(msgs)
    assert budget.page_ins > 0
    assert budget.resident <= budget.limit + 4 * 16 * 2 * 8  # store head and tail, index head, in use


@pytest.mark.parametrize("seed", range(6))
def test_priority_queue_restarts_from_a_snapshot_naming_index_pages(tmp_path, tiny_index, seed):
    """A paged priority queue with barriers, leases and lazy removals: a snapshot names
    index pages; restored into a new queue over the same file (a restart), it delivers
    exactly as the queue it was taken from."""
    rng = random.Random(seed)
    cfg = fbm(priority="/p", barrier_expression="/b = 1")
    files = PageFiles(tmp_path)
    q = Queue(cfg, load=lambda p: (p,), chunk_slots=8)
    q.page_to(files.open("Q", 0, fresh=True), budget=PagingBudget(16 * 8 * 3))
    twin = Queue(cfg, load=lambda p: (p,), chunk_slots=8)  # in memory
    for p in range(1_500):
        pr = rng.choice(PRIORITIES)
        barrier = rng.random() < 0.01
        for x in (q, twin):
            x.enqueue(p, 1.0, priority=pr, barrier=barrier)
    for p in rng.sample(range(1_500), 200):  # by bookmark: lazy removals (barriers included)
        assert q.acknowledge([p], by=None, option=AckOption.NONE, now=1.0).events == \
            twin.acknowledge([p], by=None, option=AckOption.NONE, now=1.0).events
    worker = Consumer((1, "w"), 1, filter=None, max_backlog=5)
    for x in (q, twin):  # a few leased: they come back after the restart
        x.add_consumer(worker, 1.0)
        x.dispatch(1.0)
    snap = q.snapshot(events_from=10**9, publishes_from=10**9)
    assert snap.epoch_pages  # index chunks by reference
    snap = queue_snapshot.decode(queue_snapshot.encode(snap))
    file = files.open("Q", 0, fresh=False)
    queue_snapshot.check(snap, cfg, file)
    restored = Queue(cfg, load=lambda p: (p,), chunk_slots=8)
    budget = PagingBudget(16 * 8 * 3)
    restored.page_to(file, budget=budget)
    restored.restore_snapshot(snap)
    restored.end_replay(2.0)
    twin.remove_consumer(worker, 2.0)
    assert list(restored.available()) == list(twin.available())
    check_index_budget(restored, budget)
    assert drain(restored, 3.0) == drain(twin, 3.0)


def test_a_damaged_index_page_invalidates_the_snapshot(tmp_path, tiny_index):
    cfg = fbm(priority="/p")
    files = PageFiles(tmp_path)
    q = Queue(cfg, load=lambda p: (p,), chunk_slots=8)
    q.page_to(files.open("Q", 0, fresh=True), budget=PagingBudget(16 * 8 * 3))
    for p in range(400):
        q.enqueue(p, 1.0, priority=p % 7)
    snap = q.snapshot(events_from=10**9, publishes_from=10**9)
    (num, _), = snap.epoch_pages
    offset, count, _crc = next(seg[2:] for seg in num if seg[2] >= 0)
    path = files.path("Q", 0)
    data = bytearray(path.read_bytes())
    data[offset + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(queue_snapshot.SnapshotInvalid):
        queue_snapshot.check(snap, cfg, files.open("Q", 0, fresh=False))
