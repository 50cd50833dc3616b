"""One conformance suite for Journal and MemoryJournal (the ``kind`` fixture)."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conveyor.errors import JournalError
from conveyor.journal import (
    FILE_HEADER_LEN,
    FRAME_HEADER_LEN,
    INDEX_INTERVAL_BYTES,
    RECORD_BYTES_MAX,
    Journal,
    MemoryJournal,
    encode_frame,
)

from .conftest import payload_for

FAR_FUTURE = time.time() + 10 * 365 * 86400


def append_all(journal, payloads):
    return [journal.append(p) for p in payloads]


def test_empty_journal(kind):
    j = kind.open()
    assert (j.end, j.durable_end, j.first_position) == (0, 0, 0)
    assert j.recovery.created and j.recovery.records == 0
    assert j.take_batch() is None
    assert j.commit() == 0
    assert list(j.scan()) == []
    [seg] = j.segments()
    assert (seg.base, seg.end, seg.size, seg.sealed) == (0, 0, FILE_HEADER_LEN, False)
    with pytest.raises(JournalError):
        j.read(0)
    j.close()


def test_positions_are_contiguous_and_increasing(kind):
    j = kind.open()
    payloads = [payload_for(i) for i in range(50)] + [b""]
    positions = append_all(j, payloads)
    assert positions[0] == 0
    for p, q, payload in zip(positions, positions[1:], payloads):
        assert q == p + FRAME_HEADER_LEN + len(payload)
    assert j.end == positions[-1] + FRAME_HEADER_LEN
    j.close()


def test_appended_records_are_not_durable_until_committed(kind):
    j = kind.open()
    p = j.append(b"hello")
    assert j.durable_end == 0 and j.end == 13
    with pytest.raises(JournalError):
        j.read(p)
    assert list(j.scan()) == []
    assert j.commit() == 13 == j.durable_end
    assert j.read(p) == b"hello"
    assert j.take_batch() is None
    j.close()


@pytest.mark.parametrize("sizes", [[0, 1, 2, 3], [5000, 0, 70000, 10], [300] * 200])
def test_read_and_scan_return_what_was_appended(kind, sizes):
    j = kind.open()
    payloads = [payload_for(i, size) for i, size in enumerate(sizes)]
    positions = append_all(j, payloads)
    j.commit()
    assert [j.read(p) for p in positions] == payloads
    assert list(j.scan()) == list(zip(positions, payloads))
    # Random order too: the read hint must never make a wrong walk.
    order = list(range(len(positions)))
    random.Random(7).shuffle(order)
    assert [j.read(positions[i]) for i in order] == [payloads[i] for i in order]
    j.close()


def test_scan_bounds(kind):
    j = kind.open(segment_bytes=400)
    payloads = [payload_for(i) for i in range(60)]
    positions = append_all(j, payloads)
    j.commit()
    records = list(zip(positions, payloads))
    assert list(j.scan(positions[10])) == records[10:]
    assert list(j.scan(positions[10], positions[20])) == records[10:20]
    assert list(j.scan(None, positions[5])) == records[:5]
    assert list(j.scan(positions[7], positions[7])) == []
    assert list(j.scan(positions[7], positions[7] + 1)) == records[7:8]
    assert list(j.scan(j.durable_end)) == []
    assert list(j.scan(positions[-1], 10**12)) == records[-1:]
    with pytest.raises(JournalError, match="not a record boundary"):
        j.scan(positions[3] + 1)
    with pytest.raises(JournalError, match="past the end"):
        j.scan(j.end + 1)
    # Appended but not durable: not seen, and scan bounds are fixed when it is called.
    it = j.scan(positions[-1])
    j.append(b"late")
    assert list(it) == records[-1:]
    j.close()


def test_position_after_walks_the_log(kind):
    j = kind.open(segment_bytes=300)
    positions = append_all(j, [payload_for(i) for i in range(40)])
    j.commit()
    walked = [positions[0]]
    while (after := j.position_after(walked[-1])) < j.durable_end:
        walked.append(after)
    assert walked == positions
    assert j.position_after(positions[-1]) == j.durable_end
    j.close()


def test_read_refuses_positions_that_are_not_record_boundaries(kind):
    j = kind.open(segment_bytes=500)
    payloads = [payload_for(i) for i in range(80)]
    positions = append_all(j, payloads)
    j.commit()
    boundaries = set(positions)
    for q in range(j.durable_end):
        if q in boundaries:
            continue
        with pytest.raises(JournalError):
            j.read(q)
        with pytest.raises(JournalError):
            j.position_after(q)
    with pytest.raises(JournalError):
        j.read(-1)
    with pytest.raises(JournalError):
        j.read(j.durable_end)
    j.close()


def test_a_payload_that_contains_a_frame_cannot_be_read_as_a_record(kind):
    """A producer may embed a valid frame in its payload; its offset is not a record."""
    j = kind.open()
    forged = encode_frame(b"forged record")
    p = j.append(b"xx" + forged + b"yy")
    j.commit()
    with pytest.raises(JournalError, match="not a record boundary"):
        j.read(p + FRAME_HEADER_LEN + 2)
    j.close()


def test_large_journal_uses_the_sparse_index(kind):
    j = kind.open()
    payloads = [payload_for(i, 100 + i % 50) for i in range(3 * INDEX_INTERVAL_BYTES // 100)]
    positions = append_all(j, payloads)
    j.commit()
    for i in range(0, len(positions), 17):
        assert j.read(positions[i]) == payloads[i]
    j.close()


def test_rotation_cuts_segments_at_segment_bytes(kind):
    j = kind.open(segment_bytes=200)
    payloads = [payload_for(i) for i in range(40)]
    positions = append_all(j, payloads)
    j.commit()
    segs = j.segments()
    assert len(segs) > 3
    assert [s.sealed for s in segs] == [True] * (len(segs) - 1) + [False]
    assert segs[0].base == 0 and segs[-1].end == j.end
    for a, b in zip(segs, segs[1:]):
        assert a.end == b.base  # contiguous
    for size in kind.segment_bytes_on_disk(j):
        assert size <= 200
    # Every segment starts at a record, and the records are the same ones in order.
    assert {s.base for s in segs} <= set(positions)
    assert list(j.scan()) == list(zip(positions, payloads))
    j.close()


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(kind):
    j = kind.open(segment_bytes=100)
    small1 = j.append(b"a" * 10)
    big = j.append(b"b" * 500)
    small2 = j.append(b"c" * 10)
    j.commit()
    assert [s.base for s in j.segments()] == [small1, big, small2]
    assert j.read(big) == b"b" * 500
    j.close()
    # The first record of an empty journal does not rotate.
    j = kind.open(segment_bytes=100)
    j.close()


def test_batches_carry_one_piece_per_segment(kind):
    j = kind.open(segment_bytes=100)
    assert j.take_batch() is None
    positions = append_all(j, [b"x" * 30] * 7)  # 38 bytes each: 2 per segment
    batch = j.take_batch()
    assert (batch.start, batch.end, batch.records) == (0, j.end, 7)
    assert [(p.base, p.start, p.create) for p in batch.pieces] == [
        (0, 0, False), (76, 76, True), (152, 152, True), (228, 228, True)
    ]
    assert sum(len(p.data) for p in batch.pieces) == batch.end - batch.start
    assert j.write_batch(batch) == batch.end
    j.mark_durable(batch.end)
    # The next batch continues the open segment: no creation.
    j.append(b"y" * 30)
    batch = j.take_batch()
    assert [(p.base, p.start, p.create) for p in batch.pieces] == [(228, positions[-1] + 38, False)]
    j.mark_durable(j.write_batch(batch))
    assert j.read(positions[-1] + 38) == b"y" * 30
    j.close()


def test_write_batch_runs_in_a_worker_thread_while_the_loop_appends(kind):
    """The group-commit contract: append on one thread, write_batch on another."""
    j = kind.open(segment_bytes=4096)
    expected = []
    with ThreadPoolExecutor(max_workers=1) as writer:
        future = None
        for i in range(3000):
            p = payload_for(i)
            expected.append((j.append(p), p))
            if future is not None and future.done():
                j.mark_durable(future.result())
                future = None
            if future is None and i % 7 == 0:
                batch = j.take_batch()
                if batch is not None:
                    future = writer.submit(j.write_batch, batch)
        if future is not None:
            j.mark_durable(future.result())
        batch = j.take_batch()
        if batch is not None:
            j.mark_durable(writer.submit(j.write_batch, batch).result())
    assert j.durable_end == j.end
    assert list(j.scan()) == expected
    j = kind.reopen(j)
    assert list(j.scan()) == expected
    j.close()


def test_write_batch_refuses_batches_out_of_order(kind):
    j = kind.open()
    j.append(b"one")
    first = j.take_batch()
    j.append(b"two")
    second = j.take_batch()
    with pytest.raises(JournalError, match="batch starts at"):
        j.write_batch(second)
    j.mark_durable(j.write_batch(first))
    j.mark_durable(j.write_batch(second))
    assert [p for _, p in j.scan()] == [b"one", b"two"]
    j.close()


def test_mark_durable_never_goes_back(kind):
    j = kind.open()
    j.append(b"x")
    end = j.commit()
    j.mark_durable(0)
    assert j.durable_end == end
    j.close()


def test_reopen_sees_the_same_records_and_appends_continue(kind):
    j = kind.open(segment_bytes=300)
    payloads = [payload_for(i) for i in range(100)]
    positions = append_all(j, payloads)
    j.commit()
    segs = [(s.base, s.end) for s in j.segments()]
    j = kind.reopen(j, segment_bytes=300)
    assert j.recovery.records == 100 and j.recovery.problem is None
    assert j.recovery.segments == len(segs)
    assert [(s.base, s.end) for s in j.segments()] == segs
    assert (j.end, j.durable_end) == (segs[-1][1], segs[-1][1])
    assert list(j.scan()) == list(zip(positions, payloads))
    p = j.append(b"after")
    assert p == segs[-1][1]
    j.commit()
    j = kind.reopen(j)  # a different segment_bytes is fine: it only steers rotation
    assert j.read(p) == b"after"
    j.close()


def test_a_crash_loses_exactly_what_was_not_written(kind):
    j = kind.open(segment_bytes=200)
    kept = append_all(j, [payload_for(i) for i in range(30)])
    j.commit()
    append_all(j, [payload_for(i) for i in range(30, 60)])  # never written
    j = kind.crash(j, segment_bytes=200)
    assert [p for p, _ in j.scan()] == kept
    assert j.end == j.durable_end == kept[-1] + FRAME_HEADER_LEN + len(payload_for(29))
    j.close()


def test_a_crash_after_take_batch_before_write_loses_the_batch(kind):
    j = kind.open(segment_bytes=100)
    j.append(b"a" * 50)
    j.commit()
    j.append(b"b" * 80)  # rotates: the new segment exists only in memory
    j.take_batch()
    assert [s.base for s in j.segments()] == [0]  # not on disk yet
    j = kind.crash(j, segment_bytes=100)
    assert [p for _, p in j.scan()] == [b"a" * 50]
    assert j.append(b"c") == 58
    j.close()


def test_retention_removes_only_eligible_sealed_segments(kind):
    j = kind.open(segment_bytes=200)
    positions = append_all(j, [payload_for(i) for i in range(60)])
    j.commit()
    segs = j.segments()
    assert len(segs) >= 5
    # Nothing is removed while a consumer still needs segment 0.
    assert j.apply_retention(keep_from=segs[0].end - 1, max_age_s=0, now=FAR_FUTURE) == []
    # Not old enough: stays.
    assert j.apply_retention(keep_from=j.durable_end, max_age_s=3600, now=time.time() - 10) == []
    # No limit set: keep for ever.
    assert j.apply_retention(keep_from=j.durable_end) == []
    # Consumers need everything from segment 2 on: exactly segments 0 and 1 go.
    removed = j.apply_retention(keep_from=segs[2].base, max_age_s=60, now=FAR_FUTURE)
    assert [s.base for s in removed] == [segs[0].base, segs[1].base]
    assert j.first_position == segs[2].base
    assert [s.base for s in j.segments()] == [s.base for s in segs[2:]]
    with pytest.raises(JournalError):
        j.read(positions[0])
    assert j.read(segs[2].base) is not None
    # A scan from below the first retained position starts there.
    assert next(iter(j.scan(0)))[0] == segs[2].base
    assert next(iter(j.scan()))[0] == segs[2].base
    # Everything is unneeded and old: all sealed segments go, never the last one.
    removed = j.apply_retention(keep_from=j.durable_end, max_age_s=0, now=FAR_FUTURE)
    assert [s.base for s in removed] == [s.base for s in segs[2:-1]]
    [last] = j.segments()
    assert last.base == segs[-1].base and not last.sealed
    j = kind.reopen(j, segment_bytes=200)
    assert j.first_position == segs[-1].base
    assert j.end == segs[-1].end
    j.close()


def test_retention_by_size(kind):
    j = kind.open(segment_bytes=200)
    append_all(j, [payload_for(i) for i in range(60)])
    j.commit()
    segs = j.segments()
    total = sum(s.size for s in segs)
    # Over by a little: only the oldest goes.
    removed = j.apply_retention(keep_from=j.durable_end, max_bytes=total - 1, now=0)
    assert [s.base for s in removed] == [segs[0].base]
    # Under the limit: nothing.
    assert j.apply_retention(keep_from=j.durable_end, max_bytes=total, now=0) == []
    # Size says go, but a consumer still needs segment 3: stop there.
    removed = j.apply_retention(keep_from=segs[3].base, max_bytes=0, now=0)
    assert [s.base for s in removed] == [segs[1].base, segs[2].base]
    j.close()


def test_retention_keeps_a_segment_until_its_successor_is_on_disk(kind):
    j = kind.open(segment_bytes=100)
    j.append(b"a" * 80)
    j.commit()
    j.append(b"b" * 80)  # rotates in memory only
    assert j.apply_retention(keep_from=10**9, max_age_s=0, now=FAR_FUTURE) == []
    j.commit()
    [removed] = j.apply_retention(keep_from=10**9, max_age_s=0, now=FAR_FUTURE)
    assert removed.base == 0
    j.close()


def test_scan_in_progress_survives_retention(kind):
    j = kind.open(segment_bytes=200)
    payloads = [payload_for(i) for i in range(40)]
    positions = append_all(j, payloads)
    j.commit()
    segs = j.segments()
    it = j.scan()
    first = next(it)
    # Remove the segment being read (a caller's mistake, but it must not crash): the
    # scan finishes the segment it holds open, then carries on.
    j.apply_retention(keep_from=segs[1].base, max_age_s=0, now=FAR_FUTURE)
    rest = list(it)
    assert [first, *rest] == list(zip(positions, payloads))
    j.close()


def test_close_commits_and_refuses_further_use(kind):
    j = kind.open()
    p = j.append(b"pending")
    j.close()
    j.close()  # idempotent
    with pytest.raises(JournalError, match="closed"):
        j.append(b"more")
    with pytest.raises(JournalError, match="closed"):
        j.read(p)
    j = kind.open()
    assert j.read(p) == b"pending"
    j.close()


def test_a_record_over_the_limit_is_refused_and_changes_nothing(kind):
    j = kind.open()
    j.append(b"ok")
    with pytest.raises(JournalError, match="record_bytes_max"):
        j.append(bytes(RECORD_BYTES_MAX + 1))
    assert j.end == 10
    j.commit()
    assert list(j.scan()) == [(0, b"ok")]
    j.close()


def test_statistics(kind):
    j = kind.open(segment_bytes=100)
    append_all(j, [b"x" * 50] * 3)
    stats = j.statistics()
    assert (stats.pending_records, stats.pending_bytes, stats.segments) == (3, 174, 3)
    j.commit()
    stats = j.statistics()
    assert (stats.pending_records, stats.pending_bytes) == (0, 0)
    assert (stats.batches_written, stats.records_written, stats.bytes_written) == (1, 3, 174)
    j.close()


def test_random_workload_matches_a_model(kind):
    """A seeded random workload against a tiny reference model (dict of records)."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    j = kind.open(segment_bytes=512)
    model: dict[int, bytes] = {}
    durable = 0
    pending: list[tuple[int, bytes]] = []
    for step in range(600):
        op = rng.random()
        ctx = f"seed={seed} step={step}"
        if op < 0.6:
            payload = rng.randbytes(rng.choice([0, 1, 10, 100, 600]))
            pending.append((j.append(payload), payload))
        elif op < 0.75:
            durable = j.commit()
            model.update(pending)
            pending.clear()
        elif op < 0.85 and model:
            p = rng.choice(list(model))
            if p >= j.first_position:
                assert j.read(p) == model[p], ctx
        elif op < 0.9:
            lo = rng.choice([None, *list(model)[-5:]])
            expected = [(p, v) for p, v in model.items() if lo is None or p >= lo]
            expected = [(p, v) for p, v in expected if p >= j.first_position]
            assert list(j.scan(lo)) == expected, ctx
        elif op < 0.95:
            j = kind.crash(j, segment_bytes=512)
            pending.clear()
            assert j.end == durable, ctx
        else:
            keep = rng.choice([0, durable])
            removed = j.apply_retention(keep_from=keep, max_age_s=0, now=FAR_FUTURE)
            assert all(s.end <= keep and s.sealed for s in removed), ctx
            segs = j.segments()
            assert segs[0].base == j.first_position, ctx
            assert all(a.end == b.base for a, b in zip(segs, segs[1:])), ctx
    j.close()


def test_memory_journal_needs_no_arguments():
    j = MemoryJournal()
    p = j.append(b"x")
    assert j.commit() == 9 and j.read(p) == b"x"
    again = MemoryJournal(j.store)
    assert list(again.scan()) == [(0, b"x")]


def test_two_journals_cannot_share_a_directory(tmp_path):
    j = Journal.open(tmp_path, fsync=False)
    with pytest.raises(JournalError, match="in use"):
        Journal.open(tmp_path, fsync=False)
    j.close()
    Journal.open(tmp_path, fsync=False).close()


def test_open_without_create(tmp_path):
    with pytest.raises(JournalError, match="does not exist"):
        Journal.open(tmp_path / "missing", create=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(JournalError, match="not a directory"):
        Journal.open(tmp_path / "file")
    with pytest.raises(JournalError, match="no journal segments"):
        Journal.open(tmp_path, create=False)
    j = Journal.open(tmp_path / "a" / "b")  # created, parents too
    j.close()


def test_fsync_counts(tmp_path):
    j = Journal.open(tmp_path, segment_bytes=100)
    j.append(b"x" * 50)
    j.append(b"y" * 50)  # new segment
    j.commit()
    # Two segments touched, one created: two file fsyncs and one directory fsync.
    assert j.statistics().fsyncs == 3
    j.close()


def test_a_failed_write_stops_the_journal(kind, monkeypatch):
    j = kind.open()
    j.append(b"x")
    batch = j.take_batch()

    def fail(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(j._storage, "write", fail)
    with pytest.raises(JournalError, match="No space left"):
        j.write_batch(batch)
    monkeypatch.undo()
    with pytest.raises(JournalError, match="earlier failure"):
        j.write_batch(batch)
    assert j.durable_end == 0
    j.close()  # does not try to write again
