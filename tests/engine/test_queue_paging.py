"""FileBackedMetadata paging (queue_paging) and snapshots (queue_snapshot): the paged
store against a sorted dict with tiny chunks (``chunk_slots=4``) and two resident
chunks, so every path pages; the queue with a paged store against the same queue in
memory; snapshots."""

from __future__ import annotations

import random

import msgspec
import pytest

from conveyor.config.model import QueueConfig
from conveyor.engine.queue import paging as queue_paging
from conveyor.engine.queue import snapshot as queue_snapshot
from conveyor.engine.queue import store as queue_store
from conveyor.engine.queue.queue import AckOption, Consumer, Queue
from conveyor.engine.queue.budget import PagingBudget
from conveyor.engine.queue.paging import PagedMessageStore, PageCorrupt, PageSpace
from conveyor.server.page_files import PageFiles


def PageFile(directory, queue, generation, *, fresh):  # noqa: N802
    return PageFiles(directory).open(queue, generation, fresh=fresh)


#: Messages per chunk where every path of the paged store must be reached.
TINY = 4


def budget_of(chunks: int, slots: int = queue_store.CHUNK_SLOTS) -> PagingBudget:
    """A budget of ``chunks`` full chunks of ``slots`` messages (16 bytes each)."""
    return PagingBudget(chunks * slots * 16)


def paged(file, chunks: int, slots: int | None = None) -> PagedMessageStore:
    """A paged store over ``file`` under a budget of its own, ``chunks`` chunks big."""
    budget = budget_of(chunks, slots or queue_store.CHUNK_SLOTS)
    return PagedMessageStore(PageSpace(file, budget), chunk_slots=slots)


def check_budget(store: PagedMessageStore) -> None:
    """The budget counts exactly the store's resident chunks, and they fit in it but
    for the head, the tail and the one in use (each at most two chunks' worth)."""
    budget = store.space.budget
    resident = [ch for ch in store._chunks if ch.positions is not None]
    assert len(budget) == len(resident) and all(ch in budget for ch in resident)
    assert store.resident_bytes <= budget.limit + 3 * 2 * 16 * store.chunk_slots


def check(store: queue_store.MessageStore, model: dict[int, float]) -> None:
    assert len(store) == len(model)
    assert list(store.items()) == sorted(model.items())
    if model:
        first = min(model)
        assert (store.head(), store.head_time()) == (first, model[first])
    for p in list(model)[:3]:
        assert p in store and store.time_of(p) == model[p]
        assert list(store.scan(p)) == sorted(q for q in model if q >= p)


@pytest.mark.parametrize("seed", range(40))
def test_paged_store_matches_a_dict(tmp_path, seed):
    rng = random.Random(seed)
    store = paged(PageFile(tmp_path, "Q", 0, fresh=True), 2, TINY)
    model: dict[int, float] = {}
    gone: list[int] = []
    nxt = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.4:
            nxt += rng.randint(1, 3)
            store.append(nxt, float(nxt))
            model[nxt] = float(nxt)
        elif op < 0.45:
            run = [nxt + k for k in range(1, rng.randint(2, 14))]  # a run of publishes, across chunks
            store.extend(run, [float(q) for q in run])
            model.update((q, float(q)) for q in run)
            nxt = run[-1]
        elif op < 0.6 and model:
            p = min(model)
            assert store.discard(p) == model.pop(p)
            gone.append(p)
        elif op < 0.8 and model:
            p = rng.choice(list(model))
            assert store.discard(p) == model.pop(p)
            gone.append(p)
        elif op < 0.85 and model:
            n = rng.randint(0, 12)  # a named consumer's lease of a batch at the head
            upto = rng.choice(list(model)) + rng.randint(0, 1)
            taken = sorted(q for q in model if q < upto)[:n]
            assert store.take_head(n, upto) == (taken, [model[q] for q in taken])
            for q in taken:
                del model[q]
            gone.extend(taken)
        elif op < 0.9 and gone:
            p = gone.pop(rng.randrange(len(gone)))
            store.restore(p, float(p))
            model[p] = float(p)
        else:
            assert store.discard(-5) is None and (nxt + 1) not in store
        check_budget(store)
        if rng.random() < 0.1:
            check(store, model)
    check(store, model)
    assert store.paged_chunks >= 0


def test_memory_is_bounded_and_pages_come_back(tmp_path):
    store = paged(PageFile(tmp_path, "Q", 0, fresh=True), 4)
    n = 200_000
    for p in range(n):
        store.append(p, float(p))
    assert store.resident_chunks <= 5
    check_budget(store)
    assert store.paged_chunks >= n // queue_store.CHUNK_SLOTS - 4
    assert store.file.size >= 16 * (n - 4 * queue_store.CHUNK_SLOTS)
    # ack a message deep in the queue (by bookmark), then drain from the head
    assert store.discard(123_457) == 123_457.0
    got = []
    while store:
        p = store.head()
        got.append(p)
        store.discard(p)
        assert store.resident_chunks <= 6
    assert got == [p for p in range(n) if p != 123_457]


def test_corrupt_page_is_refused(tmp_path):
    store = paged(PageFile(tmp_path, "Q", 0, fresh=True), 2)
    for p in range(5 * queue_store.CHUNK_SLOTS):
        store.append(p, 1.0)
    path = store.file.path
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PageCorrupt):
        list(store.items())


def test_file_compacts_into_a_new_generation(tmp_path, monkeypatch):
    monkeypatch.setattr(queue_paging, "COMPACT_MIN_BYTES", 64 * 1024)
    store = paged(PageFile(tmp_path, "Q", 0, fresh=True), 2)
    p = 0
    for _ in range(30):  # a standing backlog while the head moves
        for _ in range(queue_store.CHUNK_SLOTS):
            store.append(p, float(p))
            p += 1
        for _ in range(queue_store.CHUNK_SLOTS - 100):
            store.discard(store.head())
    assert store.file.generation > 0
    assert store.file.size <= 3 * max(queue_paging.COMPACT_MIN_BYTES, store.live_page_bytes())
    files = PageFiles(tmp_path)
    assert set(files.generations("Q")) >= {store.file.generation}
    files.prune("Q", below=store.file.generation)
    assert set(files.generations("Q")) == {store.file.generation}
    assert [q for q, _ in store.items()] == sorted(q for q, _ in store.items())
    assert len(list(store.items())) == len(store)


def test_file_names_of_odd_queue_names(tmp_path):
    f = PageFile(tmp_path, "a/b*c", 3, fresh=True)
    assert f.path.parent == tmp_path and "/" not in f.path.name
    assert PageFiles(tmp_path).generations("a/b*c") == {3: f.path}
    assert PageFiles(tmp_path).generations("a_b_c") == {}


# --- the queue over a paged store, against the same queue in memory --------------------------


def config(**kw) -> QueueConfig:
    kw.setdefault("max_cancels", 3)
    return QueueConfig(name="Q", message_type="json", file_backed_metadata=True, **kw)


def counts(q: Queue) -> tuple[dict, dict]:
    """(delivery counts, cancel counts) of the messages in the queue."""
    rows = q.details().messages
    return ({r.position: r.deliveries for r in rows if r.deliveries},
            {r.position: r.cancels for r in rows if r.cancels})


def drive(rng: random.Random, queues: list[Queue], steps: int = 250) -> list[list[Consumer]]:
    """The same random calls on every queue; every answer must be the same. The
    consumers of each queue."""
    consumers = [[Consumer((1, f"s{i}"), 1, filter=None if i else (lambda v, now: v[0] % 3 == 0), max_backlog=5)
                  for i in range(2)] for _ in queues]
    for q, cs in zip(queues, consumers):
        for c in cs:
            q.add_consumer(c, 0.0)
    pos, now = 0, 0.0
    for _ in range(steps):
        op = rng.random()
        now += 0.01
        if op < 0.5:
            for _ in range(rng.randint(1, 30)):
                pos += rng.randint(1, 5)
                assert len({q.enqueue(pos, now) for q in queues}) == 1
        elif op < 0.7:
            out = [[(d.consumer.key, d.position) for d in q.dispatch(now)] for q in queues]
            assert out[0] == out[1]
        elif op < 0.85:
            leased = sorted(r.position for r in queues[0].details().messages if r.state == "leased")
            pick = rng.sample(leased, min(len(leased), 3))
            opt = rng.choice([AckOption.NONE, AckOption.CANCEL])
            res = [q.acknowledge(pick, by=None, option=opt, now=now).events for q in queues]
            assert res[0] == res[1]
        elif op < 0.92:
            deep = [rng.randint(0, pos) for _ in range(5)]  # by bookmark, deep in the queue
            res = [q.acknowledge(deep, by=None, option=AckOption.NONE, now=now).events for q in queues]
            assert res[0] == res[1]
        elif op < 0.95:
            k = rng.randint(0, 6)
            res = [q.acknowledge_matching(lambda v, now: v[0] % 7 == k, by=None, option=AckOption.NONE, now=now).events
                   for q in queues]
            assert res[0] == res[1]
        else:
            evs = [q.remove_consumer(cs[0], now) for q, cs in zip(queues, consumers)]
            assert evs[0] == evs[1]
            for q, cs in zip(queues, consumers):
                q.add_consumer(cs[0], now)
        assert list(queues[0].available()) == list(queues[1].available())
        assert queues[0].recovery_point() == queues[1].recovery_point()
    return consumers


@pytest.mark.parametrize("seed", range(10))
def test_paged_queue_behaves_as_in_memory(tmp_path, seed):
    rng = random.Random(seed)
    load = lambda p: (p,)  # noqa: E731
    paged = Queue(config(), load=load, chunk_slots=TINY)
    paged.page_to(PageFile(tmp_path, "Q", 0, fresh=True), budget=budget_of(2, TINY))
    plain = Queue(config(), load=load, chunk_slots=TINY)
    drive(rng, [paged, plain])


@pytest.mark.parametrize("seed", range(10))
def test_snapshot_restores_the_state_replay_would_build(tmp_path, seed):
    """A snapshot then restore equals the queue with every lease broken (rule 2)."""
    rng = random.Random(seed)
    load = lambda p: (p,)  # noqa: E731
    cfg = config(barrier_expression="/b = 1") if seed % 2 else config()
    q = Queue(cfg, load=load, chunk_slots=TINY)
    q.page_to(PageFile(tmp_path, "Q", 0, fresh=True), budget=budget_of(2, TINY))
    twin = Queue(cfg, load=load, chunk_slots=TINY)
    consumers = drive(rng, [q, twin], steps=200)[1]
    snap = q.snapshot(events_from=10**9, publishes_from=10**9)
    snap = queue_snapshot.decode(queue_snapshot.encode(snap))
    restored = Queue(cfg, load=load, chunk_slots=TINY)
    file = PageFile(tmp_path, "Q", 0, fresh=False)
    queue_snapshot.check(snap, cfg, file)
    restored.page_to(file)
    restored.restore_snapshot(snap)
    assert restored.end_replay(1e6) is not None
    for consumer in consumers:
        twin.remove_consumer(consumer, 1e6)
    assert list(restored.available()) == list(twin.available())
    assert counts(restored) == counts(twin)
    assert restored.recovery_point() == twin.recovery_point()
    assert restored.last_position == twin.last_position


def test_snapshot_checks(tmp_path):
    q = Queue(config(), load=lambda p: None)
    q.page_to(PageFile(tmp_path, "Q", 0, fresh=True), budget=budget_of(2))
    for p in range(3 * queue_store.CHUNK_SLOTS * 4):
        q.enqueue(p, 1.0)
    snap = q.snapshot(events_from=5, publishes_from=5)
    data = queue_snapshot.encode(snap)
    with pytest.raises(queue_snapshot.SnapshotInvalid):
        queue_snapshot.decode(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(queue_snapshot.SnapshotInvalid, match="configuration"):
        queue_snapshot.check(snap, config(filter="/x = 1"), PageFile(tmp_path, "Q", 0, fresh=False))
    with pytest.raises(queue_snapshot.SnapshotInvalid, match="page file"):
        queue_snapshot.check(snap, config(), None)
    file = PageFile(tmp_path, "Q", 0, fresh=False)
    path = file.path
    raw = bytearray(path.read_bytes())
    raw[3] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(queue_snapshot.SnapshotInvalid):
        queue_snapshot.check(snap, config(), file)
    with pytest.raises(queue_snapshot.SnapshotInvalid, match="configuration"):
        queue_snapshot.check(snap, config(priority="/p"), file)


def test_priority_snapshot_checks():
    cfg = QueueConfig(name="Q", message_type="json", priority="/p", barrier_expression="/b = 1")
    q = Queue(cfg, load=lambda p: None)
    for p in range(40):
        q.enqueue(p, 1.0, priority=p % 3 if p % 7 else -1, barrier=p == 20)
    snap = q.snapshot(events_from=40, publishes_from=40)
    assert len(snap.epochs) == 2  # one per side of the barrier
    queue_snapshot.check(snap, cfg, None)
    restored = Queue(cfg, load=lambda p: None)
    restored.restore_snapshot(snap)
    assert list(restored.available()) == list(q.available())
    with pytest.raises(queue_snapshot.SnapshotInvalid, match="epochs"):
        queue_snapshot.check(msgspec.structs.replace(snap, epochs=snap.epochs[:1]), cfg, None)
    ranks, positions, nan_positions, stale = snap.epochs[0]
    cut = [(ranks[:-8], positions, nan_positions, stale), snap.epochs[1]]
    with pytest.raises(queue_snapshot.SnapshotInvalid, match="cut short"):
        queue_snapshot.check(msgspec.structs.replace(snap, epochs=cut), cfg, None)
