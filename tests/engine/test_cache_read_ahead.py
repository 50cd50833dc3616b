"""The message cache's read-ahead (engine/cache.py, "Read-ahead"): a reader moving
forward through the journal past what the cache holds reads it sequentially, not one
record at a time; any other miss reads its record alone; a damaged record further on
does not fail the one asked for. And its admission ("Admission"): what a queue
delivers next is kept, not the far tail of its backlog."""

from __future__ import annotations

import pytest

from conveyor import errors, records
from conveyor.protocol import messages as m
from conveyor.engine import cache as cache_mod
from conveyor.engine.cache import MessageCache
from conveyor.journal import MemoryJournal

from .engine_harness import Harness, config_xml, decode, queue_xml


def journal_of(n: int, every: int = 0) -> tuple[MemoryJournal, list[int]]:
    """``n`` publishes (a lease record after every ``every``-th), durable; their positions."""
    j = MemoryJournal()
    positions = []
    for i in range(n):
        positions.append(j.append(records.encode_publish("t", 1, i + 1, 1000.0 + i, b'{"i":%d}' % i, None)))
        if every and i % every == 0:
            j.append(records.encode(records.LeasedRec("Q", [positions[-1]], [1])))
    j.commit()
    return j, positions


class Counting:
    def __init__(self, j: MemoryJournal) -> None:
        self.j, self.reads, self.scans = j, 0, 0

    def read(self, position: int) -> bytes:
        self.reads += 1
        return self.j.read(position)

    def scan(self, start: int, end: int):
        self.scans += 1
        return self.j.scan(start, end)


def damaged_at(j: MemoryJournal, position: int):
    """(read, scan) of ``j`` whose record at ``position`` is damaged: a scan stops there
    with JournalCorrupt, a read of it raises JournalCorrupt."""
    def scan(start: int, end: int):
        yield from j.scan(start, position)
        raise errors.JournalCorrupt("a damaged record")

    def read(p: int) -> bytes:
        if p == position:
            raise errors.JournalCorrupt(f"record at {p}: bad checksum")
        return j.read(p)

    return read, scan


def test_a_forward_reader_reads_sequentially_and_then_hits():
    j, positions = journal_of(2000, every=7)
    io = Counting(j)
    cache = MessageCache(io.read, scan=io.scan)
    for i, p in enumerate(positions):
        assert cache.get(p).seq == i + 1
    # the first miss alone, then one scan per READ_AHEAD_SPAN_BYTES of journal
    assert io.reads == 1 and 1 <= io.scans <= 1 + j.end // cache_mod.READ_AHEAD_SPAN_BYTES
    assert cache.misses == io.reads + io.scans


def test_a_miss_that_is_not_the_next_reads_its_record_alone():
    j, positions = journal_of(3000)
    io = Counting(j)
    cache = MessageCache(io.read, scan=io.scan)
    for p in reversed(positions[::500]):  # backwards: never just after the last miss
        cache.get(p)
    assert io.scans == 0 and io.reads == 6


def test_a_damaged_record_further_on_does_not_fail_the_one_asked_for():
    j, positions = journal_of(100)
    _, damaged = damaged_at(j, positions[5])
    cache = MessageCache(j.read, scan=damaged)
    cache.get(positions[0])
    assert cache.get(positions[1]).seq == 2  # read ahead to the damage, no further
    assert cache.get(positions[4]).seq == 5


def test_a_read_ahead_at_a_record_that_is_not_a_publish_is_refused():
    j, positions = journal_of(10, every=1)
    cache = MessageCache(j.read, scan=j.scan)
    cache.get(positions[0])
    lease = j.position_after(positions[0])
    with pytest.raises(LookupError):
        cache.get(lease)


def test_a_small_budget_reads_ahead_less_than_it_holds():
    """A span never larger than an eighth of the budget, so what a read-ahead brings is
    still there when the reader gets to it: one read per span, not per message."""
    j, positions = journal_of(5000)
    io = Counting(j)
    cache = MessageCache(io.read, scan=io.scan, bytes_max=64 * 1024)
    for p in positions:
        cache.get(p)
    assert io.reads == 1 and io.scans <= 1 + 5000 * (len(b"{\"i\":1234}") + 330) // (64 * 1024 // 8)


# --- get_many: a named consumer's fetch ---------------------------------------------------------


def test_get_many_serves_hits_and_scans_the_misses_without_keeping_them():
    """A FIFO backlog four times the budget, fetched in pages as the Spark source does:
    one scan per page, answers in the order asked, and the cache keeps what it held (no
    entry of the fetch pushes out the next page's)."""
    j, positions = journal_of(4000, every=7)
    io = Counting(j)
    cache = MessageCache(io.read, scan=io.scan, bytes_max=1000 * (10 + 330))
    for p in positions[-900:]:  # the newest, as publishes leave them
        cache.put(p, cache.peek(p))
    held = list(cache._entries)
    io.reads = cache.misses = 0
    for page in range(0, 4000, 500):
        got = cache.get_many(positions[page:page + 500])
        assert [e.seq for e in got] == list(range(page + 1, page + 501))
    assert list(cache._entries) == held  # nothing added, nothing pushed out
    assert io.reads == 0 and io.scans == 7  # one per page with misses: six whole, and 3000..3099
    assert cache.misses == 3100


def test_get_many_in_any_order_and_far_apart():
    j, positions = journal_of(20000)
    assert positions[10000] - positions[1] > cache_mod.READ_AHEAD_SPAN_BYTES
    io = Counting(j)
    cache = MessageCache(io.read, scan=io.scan)
    wanted = [positions[19999], positions[0], positions[1], positions[10000], positions[0]]
    assert [e.seq for e in cache.get_many(wanted)] == [20000, 1, 2, 10001, 1]
    assert io.scans == 3 and io.reads == 0  # runs of misses more than a span apart: a scan each


def test_get_many_reports_a_damaged_record_by_its_own_read():
    j, positions = journal_of(100)
    _, damaged = damaged_at(j, positions[5])
    read, _ = damaged_at(j, positions[7])
    cache = MessageCache(read, scan=damaged)
    assert [e.seq for e in cache.get_many(positions[:7])] == [1, 2, 3, 4, 5, 6, 7]  # 6, 7 read alone
    with pytest.raises(errors.JournalCorrupt, match="bad checksum"):
        cache.get_many(positions[:10])


def test_get_many_reads_every_layout_of_publish_a_miss_may_find():
    """A miss comes back as the record the scan decoded: a plain publish (its lighter
    layout) and a publish with fields of its own (a transaction's row, a replica's, a
    SOW topic's) read the same to a fetch."""
    j = MemoryJournal()
    payloads = [
        records.encode_publish("t", 7, 1, 1000.5, b'{"a":1}', "c1"),
        records.encode_txn_publish("r", 8, 2, 1001.5, b'{"b":2}', 0, 1),
        records.Arrival("A", "east", ["A"]).encode(records.encode_publish("u", 9, 3, 1002.5, b"x", None),
                                                   records.decode(records.encode_publish("u", 9, 3, 1002.5, b"x", None))),
        records.encode_sow_publish("s", 10, 4, 1003.5, b'{"k":1}', None, 2000.0, "k1"),
    ]
    positions = [j.append(p) for p in payloads]
    j.commit()
    got = MessageCache(j.read, scan=j.scan).get_many(positions)
    assert [(e.topic, e.data, e.timestamp, e.publisher, e.seq, e.correlation_id) for e in got] == [
        ("t", b'{"a":1}', 1000.5, 7, 1, "c1"), ("r", b'{"b":2}', 1001.5, 8, 2, None), ("u", b"x", 1002.5, 9, 3, None),
        ("s", b'{"k":1}', 1003.5, 10, 4, None)]
    assert type(got[0]) is records.PlainPublish
    # and a fetch's columns read each kind alike: a cache entry, a plain publish, the rest
    mixed = [cache_mod.Entry("e", b"hit", 999.5, 6, 9, "c0"), *got]
    fields = [(e.data, e.topic, e.publisher, e.seq, e.timestamp, e.correlation_id) for e in mixed]
    assert cache_mod.fetched_columns(mixed) == tuple(list(column) for column in zip(*fields))


# --- admission: the head of each queue, not its far tail ----------------------------------------


def test_admit_keeps_a_message_while_the_queue_ahead_of_it_is_shorter_than_the_head():
    j, positions = journal_of(3)
    cost = len(b'{"i":0}') + cache_mod._ENTRY_OVERHEAD_BYTES
    cache = MessageCache(j.read, scan=j.scan, bytes_max=4 * cost)  # head_bytes: the budget, 4 entries
    entries = [cache.peek(p) for p in positions]
    assert cache.admit(positions[0], entries[0], 3) == 4  # 3 entries ahead: kept
    assert cache.admit(positions[1], entries[1], 4) == 5  # 4: not
    assert cache.admit(positions[2], entries[2], 0) == 1
    assert list(cache._entries) == [positions[0], positions[2]]


def _filled(n: int, head_entries: int, reader: bool = False, **queue) -> tuple[Harness, list[int]]:
    """A queue with ``n`` publishes, each made durable alone, and no consumer (``reader``:
    one with a backlog of 1 that never acknowledges), the cache's head ``head_entries``
    of these messages: the harness, and the positions still available."""
    h = Harness(config_xml(queue_xml("Q", **queue), topics=("Work",)))
    body_len = len(b'{"i":10}')
    h.engine.cache.head_bytes = head_entries * (body_len + cache_mod._ENTRY_OVERHEAD_BYTES)
    if reader:
        w = h.connect("reader")
        h.subscribe(w, "Q", options="max_backlog=1")
    pub = h.connect("pub")
    for i in range(n):
        h.publish(pub, "Work", {"i": 10 + i})
        h.commit()  # one group commit each: the depth is read again for each
    if reader:
        assert len(h.messages(w)) == 1
    return h, sorted(h.engine.queues["Q"].available())


def test_a_deep_queue_keeps_only_its_head_in_the_cache_and_delivers_the_rest_from_the_journal():
    """With nobody reading it, a queue's messages count twice: of a head of 40, the
    first 20 are kept. The consumer that comes gets every message in order, the ones
    past the head read ahead from the journal."""
    h, positions = _filled(60, 40)
    assert set(h.engine.cache._entries) == set(positions[:20])
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=100")
    got = h.messages(w)
    assert [decode(msg)["i"] for msg in got] == list(range(10, 70))
    assert h.engine.cache.misses <= 3  # the first miss alone, then the read-ahead: not one read each


def test_a_queue_with_a_consumer_keeps_a_whole_head():
    """A queue someone reads keeps the whole head: 40 messages ahead, the one leased
    to the consumer among them."""
    h, positions = _filled(60, 40, reader=True)
    leased = set(h.engine.cache._entries) - set(positions)
    assert len(leased) == 1 and set(h.engine.cache._entries) == leased | set(positions[:39])


def test_a_priority_queue_keeps_every_message():
    """A message may go to the front of a priority queue: nothing counts as ahead of it."""
    h, positions = _filled(40, 5, Priority="/i")
    assert set(h.engine.cache._entries) == set(positions)


def test_a_message_held_back_by_the_target_depth_is_not_kept():
    """TargetQueueDepth: what is held back is read back from the journal when the
    active part has room, so the cache does not keep it meanwhile."""
    h = Harness(config_xml(queue_xml("Q", TargetQueueDepth="10"), topics=("Work",)))
    pub = h.connect("pub")
    for i in range(30):
        h.publish(pub, "Work", {"i": i})
        h.commit()
    assert len(h.engine.cache._entries) == 10


# --- a leased batch read ahead of its fetch ----------------------------------------------------


def test_a_leased_batch_is_read_ahead_in_turns_and_its_fetch_takes_it():
    """plan_leased notes the batch; each read_leased_ahead turn reads at most its budget
    of what the cache does not hold, in one scan; the fetch takes those from the store
    (hits of the read-ahead, not misses), the cache's own entries unchanged."""
    j, positions = journal_of(1000, every=7)
    io = Counting(j)
    cache = MessageCache(io.read, scan=io.scan)
    for p in positions[:300]:
        cache.put(p, cache.peek(p))  # the head, as admission leaves it
    held = list(cache._entries)
    io.reads = cache.misses = 0
    cache.plan_leased(positions)
    turns = 0
    while cache.read_leased_ahead(budget=400):
        turns += 1
    assert turns == 2 and not cache.reading_ahead  # three turns of 400: the last says it is done
    assert io.scans == 3  # 300..399, 400..799, 800..999: one scan a turn
    assert sorted(cache._ahead) == positions[300:] and io.reads == 0
    got = cache.get_many(positions[250:650])
    assert [e.seq for e in got] == list(range(251, 651))
    assert cache.misses == 0 and cache.read_ahead_hits == 350 and len(cache._ahead) == 350
    assert list(cache._entries) == held
    cache.get_many(positions[650:])
    assert cache._ahead == {} and cache._ahead_bytes == 0 and cache.misses == 0


def test_a_leased_read_ahead_stops_at_the_budget_and_a_full_store_nobody_read_is_dropped():
    """The store holds at most the cache's budget again: reading ahead stops there and
    the fetch reads the rest itself. A full store no fetch emptied (a query gone) is
    dropped when the next batch is leased."""
    j, positions = journal_of(2000)
    cache = MessageCache(j.read, scan=j.scan, bytes_max=500 * (10 + 330))
    cache.plan_leased(positions[:1500])
    while cache.read_leased_ahead(budget=100):
        pass
    kept = len(cache._ahead)
    assert 500 <= kept <= 600 and cache._ahead_bytes >= cache.bytes_max  # a turn that crosses it ends
    assert [e.seq for e in cache.get_many(positions[1400:1500])] == list(range(1401, 1501))
    assert cache.misses == 100  # past the store: read by the fetch, as without a read-ahead
    cache.plan_leased(positions[1500:])  # the store is full and no fetch came: dropped
    assert cache._ahead == {} and cache.reading_ahead
    while cache.read_leased_ahead():
        pass
    assert sorted(cache._ahead) == positions[1500:]


def test_a_leased_read_ahead_past_a_damaged_record_leaves_it_to_the_fetch():
    j, positions = journal_of(100)
    read, damaged = damaged_at(j, positions[40])
    cache = MessageCache(read, scan=damaged)
    cache.plan_leased(positions)
    while cache.read_leased_ahead():
        pass
    assert sorted(cache._ahead) == positions[:40]
    assert [e.seq for e in cache.get_many(positions[:40])] == list(range(1, 41))
    with pytest.raises(errors.JournalCorrupt, match="bad checksum"):
        cache.get_many(positions[40:])


def test_a_named_consumers_lease_is_read_ahead_by_the_engines_background_turns():
    """Engine level: a lease plans the read-ahead, which says it has background work
    (fanout_pending) until pump_replays (the harness pumps it after each call, as the
    server does after each turn) has read it; the fetch finds every delivery the cache
    did not hold."""
    h = Harness(config_xml(queue_xml("Q", LeasePeriod="30s"), topics=("Work",)))
    pub, drv = h.connect("pub"), h.connect("drv")
    for i in range(50):
        h.publish(pub, "Work", {"i": i})
    h.commit()
    h.handle(drv, m.Claim(queue="Q", consumer="c", token="t", cid="k"))
    h.commit()
    cache = h.engine.cache
    for p in list(cache._entries)[10:]:
        cache.discard(p)  # as if the budget had kept only the first ten
    assert not h.engine.fanout_pending
    cache.plan_leased([1])
    assert h.engine.fanout_pending  # until a background turn has read it
    cache._plans.clear()
    h.handle(drv, m.Lease(queue="Q", consumer="c", after=0, max=0, ttl=30.0, epoch=1, cid="l"))
    h.commit()
    assert len(cache._ahead) == 40 and not h.engine.fanout_pending
    h.take(drv)
    cache.misses = 0
    h.handle(drv, m.Fetch(queue="Q", consumer="c", lo=0, hi=50, cid="f"))
    got = [x for x in h.take(drv) if isinstance(x, m.Message)]
    assert [decode(x)["i"] for x in got] == list(range(50)) and cache.misses == 0
    assert cache.read_ahead_hits == 40 and cache._ahead == {}


def test_what_a_fetch_read_first_is_not_read_ahead_again():
    """A fetch that comes before the read-ahead got to its deliveries reads them itself;
    the read-ahead then skips them (nothing is read twice, nothing is left in the store)."""
    j, positions = journal_of(1000)
    io = Counting(j)
    cache = MessageCache(io.read, scan=io.scan)
    cache.plan_leased(positions)
    assert cache.read_leased_ahead(budget=200)  # 0..199 read ahead
    got = cache.get_many(positions[500:700])  # a second task's first page, before the read-ahead
    assert [e.seq for e in got] == list(range(501, 701)) and cache.misses == 200
    while cache.read_leased_ahead(budget=200):
        pass
    assert sorted(cache._ahead) == positions[:500] + positions[700:]
    assert cache._fetched == set()  # forgotten once nothing is planned
