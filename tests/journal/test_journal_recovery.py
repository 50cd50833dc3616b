"""Crash consistency: torn tails, flipped bits, damaged sealed segments, gaps, repair."""

from __future__ import annotations

import logging
import os
import random
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.errors import JournalCorrupt, JournalError
from conveyor.journal import journal as journal_module
from conveyor.journal import (
    FILE_HEADER_LEN,
    FRAME_HEADER_LEN,
    Journal,
    MemoryJournal,
    MemoryStore,
    dump,
    encode_header,
    repair,
    scan_segment,
    segment_name,
    verify,
)

from .conftest import payload_for

SEGMENT_BYTES = 400
LOGGER = "conveyor.journal"


def build(directory: Path) -> list[tuple[int, bytes]]:
    """A committed journal of 40-odd varied records over several segments, with five
    records in the last one."""
    j = Journal.open(directory, segment_bytes=SEGMENT_BYTES, fsync=False)
    records = []
    while len(records) < 40 or sum(1 for p, _ in records if p >= j._seg_base) != 5:
        payload = payload_for(len(records))
        records.append((j.append(payload), payload))
    j.close()
    return records


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.log"))}


def restore(directory: Path, files: dict[str, bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)


def last_segment(files: dict[str, bytes]) -> tuple[str, int]:
    name = max(files)
    return name, int(name[:20])


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pristine")
    records = build(directory)
    files = snapshot(directory)
    assert len(files) >= 4
    name, base = last_segment(files)
    assert sum(1 for p, _ in records if p >= base) >= 4, "the last segment needs a few records"
    return records, files


def truncation_points(records, files) -> list[int]:
    """Every file offset inside the file header and the last three records of the last segment."""
    name, base = last_segment(files)
    size = len(files[name])
    tail = [p for p, _ in records if p >= base][-3:]
    first = FILE_HEADER_LEN + tail[0] - base
    return list(range(0, FILE_HEADER_LEN + 1)) + list(range(first, size))


def test_truncating_the_last_segment_anywhere_keeps_exactly_the_valid_prefix(pristine, tmp_path, caplog):
    records, files = pristine
    name, base = last_segment(files)
    points = truncation_points(records, files)
    assert len(points) > 60
    for case, cut in enumerate(points):
        directory = tmp_path / f"case{case}"
        restore(directory, files)
        path = directory / name
        os.truncate(path, cut)
        # What must survive: every record whose frame is whole below the cut.
        limit = base + max(0, cut - FILE_HEADER_LEN)
        kept = [(p, v) for p, v in records if p + FRAME_HEADER_LEN + len(v) <= limit or p < base]
        new_end = kept[-1][0] + FRAME_HEADER_LEN + len(kept[-1][1]) if kept[-1][0] >= base else base
        clean = cut == FILE_HEADER_LEN or (cut > FILE_HEADER_LEN and limit == new_end)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            j = Journal.open(directory, segment_bytes=SEGMENT_BYTES, fsync=False)
        logged = warnings_of(caplog)
        ctx = f"cut at {cut}"
        assert list(j.scan()) == kept, ctx
        assert j.end == j.durable_end == new_end, ctx
        if clean:
            assert logged == [], ctx
            assert j.recovery.problem is None, ctx
        else:
            assert len(logged) == 1, ctx
            message = logged[0].getMessage()
            assert str(path) in message, ctx
            offset = 0 if cut < FILE_HEADER_LEN else FILE_HEADER_LEN + new_end - base
            dropped = cut - offset if cut >= FILE_HEADER_LEN else 0
            assert f"at offset {offset} " in message, ctx
            assert f"dropping {dropped} bytes" in message, ctx
            assert (j.recovery.truncated_offset, j.recovery.bytes_dropped) == (offset, dropped), ctx
            assert j.recovery.truncated_path == str(path), ctx
        assert os.path.getsize(path) == FILE_HEADER_LEN + new_end - base, ctx
        # New appends continue right after the valid prefix, and survive a reopen.
        more = [payload_for(1000 + i) for i in range(3)]
        added = [(j.append(v), v) for v in more]
        assert added[0][0] == new_end, ctx
        j.close()
        j = Journal.open(directory, segment_bytes=SEGMENT_BYTES, fsync=False)
        assert list(j.scan()) == kept + added, ctx
        assert j.recovery.problem is None, ctx
        j.close()


def flip_bits(data: bytes, offsets: list[int], bits: list[int]) -> bytes:
    out = bytearray(data)
    for o, b in zip(offsets, bits):
        out[o] ^= 1 << b
    return bytes(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bit_flips_in_the_last_records_trim_only_a_torn_tail(pristine, data):
    """Flips in the last records of the open segment. When a record after the first
    damaged one is intact, that is damage, not a torn write: the open refuses and
    changes nothing (it used to drop every record from the damage on, intact or not).
    Otherwise the damage is indistinguishable from a torn last write, and it is trimmed."""
    records, files = pristine
    name, base = last_segment(files)
    tail = [(p, v) for p, v in records if p >= base][-3:]
    start = FILE_HEADER_LEN + tail[0][0] - base
    size = len(files[name])
    flips = data.draw(st.lists(st.tuples(st.integers(start, size - 1), st.integers(0, 7)), min_size=1, max_size=3, unique_by=lambda f: f[0]))
    offsets = [o for o, _ in flips]
    damaged = bytes(files[name])
    damaged = flip_bits(damaged, offsets, [b for _, b in flips])
    first_bad = base + min(offsets) - FILE_HEADER_LEN  # a position inside the first damaged frame
    kept = [(p, v) for p, v in records if p + FRAME_HEADER_LEN + len(v) <= first_bad]

    def hit(p: int, v: bytes) -> bool:
        return any(p <= base + o - FILE_HEADER_LEN < p + FRAME_HEADER_LEN + len(v) for o in offsets)

    intact_after = [(p, v) for p, v in tail if p > first_bad and not hit(p, v)]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        restore(directory, {**files, name: damaged})
        handler = _Capture()
        logger = logging.getLogger("test.journal.flips")
        logger.addHandler(handler)
        try:
            if intact_after:
                with pytest.raises(JournalCorrupt) as err:
                    Journal.open(directory, segment_bytes=SEGMENT_BYTES, fsync=False, logger=logger)
                message = str(err.value)
                assert str(directory / name) in message and "conveyor journal repair" in message
                assert "still check out" in message
                assert snapshot(directory) == {**files, name: damaged}  # nothing dropped
                return
            j = Journal.open(directory, segment_bytes=SEGMENT_BYTES, fsync=False, logger=logger)
        finally:
            logger.removeHandler(handler)
        assert list(j.scan()) == kept
        assert len(handler.records) == 1
        assert str(directory / name) in handler.records[0].getMessage()
        assert j.recovery.records_after_damage == 0
        j.append(b"after")
        j.close()
        j = Journal.open(directory, fsync=False)
        assert list(j.scan()) == [*kept, (j.end - 13, b"after")]
        j.close()


def durable_prefix_journal(directory: Path, count: int = 20) -> tuple[list[tuple[int, bytes]], Path]:
    """One segment of ``count`` records, all durable, with the verified prefix saved
    (what a running server leaves at each checkpoint)."""
    j = Journal.open(directory, fsync=False)
    records = [(j.append(payload_for(i)), payload_for(i)) for i in range(count)]
    j.commit()
    assert j.save_prefix()
    j._storage.close()  # a crash: no close, the prefix stays what the checkpoint saved
    return records, directory / segment_name(0)


@pytest.mark.parametrize("which", ["last", "middle"])
def test_damage_inside_the_durable_prefix_refuses_to_open(tmp_path, which):
    """The issue's second trial: damage at the tail, but in bytes the verified prefix
    recorded as durable. They were acknowledged: trimming them would lose (or, for an
    at-most-once queue, redeliver) messages. The open refuses, even for the last record."""
    records, path = durable_prefix_journal(tmp_path)
    p, v = records[-1] if which == "last" else records[10]
    before = bytearray(path.read_bytes())
    before[FILE_HEADER_LEN + p + FRAME_HEADER_LEN + len(v) // 2] ^= 0x10
    path.write_bytes(bytes(before))
    with pytest.raises(JournalCorrupt) as err:
        Journal.open(tmp_path, fsync=False)
    message = str(err.value)
    assert str(path) in message and f"offset {FILE_HEADER_LEN + p}" in message
    assert "durable" in message and "conveyor journal repair" in message
    assert path.read_bytes() == bytes(before)


def test_a_torn_tail_after_the_durable_prefix_is_trimmed(tmp_path, caplog):
    records, path = durable_prefix_journal(tmp_path)
    j = Journal.open(tmp_path, fsync=False)
    more = [(j.append(payload_for(100 + i)), payload_for(100 + i)) for i in range(3)]
    j.commit()
    j._storage.close()
    os.truncate(path, os.path.getsize(path) - 3)  # the last write, torn
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        j = Journal.open(tmp_path, fsync=False)
    assert list(j.scan()) == records + more[:-1]
    [line] = warnings_of(caplog)
    assert "torn" in line.getMessage()
    j.close()


def test_a_segment_shorter_than_its_durable_prefix_refuses_to_open(tmp_path):
    records, path = durable_prefix_journal(tmp_path)
    p, _ = records[-5]
    os.truncate(path, FILE_HEADER_LEN + p)  # whole records gone, at a record boundary
    with pytest.raises(JournalCorrupt, match="shorter than the durable end") as err:
        Journal.open(tmp_path, fsync=False)
    assert "conveyor journal repair" in str(err.value)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_torn_tail_of_zeros_is_not_reported_as_damage(pristine, tmp_path, caplog):
    records, files = pristine
    name, _ = last_segment(files)
    restore(tmp_path, files)
    with open(tmp_path / name, "ab") as f:
        f.write(bytes(5000))  # what a crash can leave past the end of a write
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        j = Journal.open(tmp_path, fsync=False)
    assert list(j.scan()) == records
    assert j.recovery.bytes_dropped == 5000 and j.recovery.records_after_damage == 0
    [line] = warnings_of(caplog)
    assert "still checked out" not in line.getMessage()
    j.close()


@pytest.mark.parametrize("seed", range(12))
def test_a_flipped_bit_in_a_sealed_segment_refuses_to_open_until_repaired(pristine, tmp_path, caplog, seed):
    records, files = pristine
    rng = random.Random(seed)
    names = sorted(files)
    name = rng.choice(names[:-1])  # not the last segment
    base = int(name[:20])
    seg_records = [(p, v) for p, v in records if base <= p and p + FRAME_HEADER_LEN + len(v) <= base + len(files[name]) - FILE_HEADER_LEN]
    offset = rng.randrange(FILE_HEADER_LEN, len(files[name]))
    restore(tmp_path, {**files, name: flip_bits(files[name], [offset], [rng.randrange(8)])})
    before = snapshot(tmp_path)
    with pytest.raises(JournalCorrupt) as err:
        Journal.open(tmp_path, fsync=False)
    message = str(err.value)
    assert str(tmp_path / name) in message and "conveyor journal repair" in message
    bad = next(p for p, v in seg_records if base + offset - FILE_HEADER_LEN < p + FRAME_HEADER_LEN + len(v))
    record_offset = FILE_HEADER_LEN + bad - base
    assert f"offset {record_offset}" in message
    assert err.value.details["offset"] == record_offset
    # verify reports it and changes nothing.
    report = verify(tmp_path)
    assert not report.ok and any(str(tmp_path / name) in p for p in report.problems)
    assert f"problem: {tmp_path / name}" in str(report)
    assert snapshot(tmp_path) == before
    # repair truncates there and removes every later segment, and says so.
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fixed = repair(tmp_path)
    assert fixed.repaired and fixed.path == str(tmp_path / name)
    assert f"kept the log up to position {bad}" in str(fixed)
    assert (fixed.offset, fixed.position) == (record_offset, bad)
    assert len(fixed.segments_removed) == len(names) - 1 - names.index(name)
    assert fixed.bytes_dropped == sum(len(files[n]) for n in names[names.index(name) + 1 :]) + len(files[name]) - record_offset
    assert len(warnings_of(caplog)) == 1
    assert verify(tmp_path).ok
    j = Journal.open(tmp_path, fsync=False)
    kept = [(p, v) for p, v in records if p < bad]
    assert list(j.scan()) == kept
    assert j.append(b"next") == bad
    j.close()
    assert repair(tmp_path).problem is None  # nothing left to repair


def test_a_gap_between_segments_refuses_to_open(pristine, tmp_path):
    records, files = pristine
    names = sorted(files)
    restore(tmp_path, {n: d for n, d in files.items() if n != names[2]})
    with pytest.raises(JournalCorrupt, match="gap between segments") as err:
        Journal.open(tmp_path, fsync=False)
    assert str(tmp_path / names[3]) in str(err.value)
    assert "conveyor journal repair" in str(err.value)
    report = repair(tmp_path)
    assert report.segments_removed == tuple(str(tmp_path / n) for n in names[3:])
    j = Journal.open(tmp_path, fsync=False)
    assert list(j.scan()) == [(p, v) for p, v in records if p < int(names[2][:20])]
    j.close()


def test_a_renamed_segment_refuses_to_open(pristine, tmp_path):
    records, files = pristine
    names = sorted(files)
    renamed = dict(files)
    renamed[segment_name(int(names[-1][:20]) + 1)] = renamed.pop(names[-1])
    restore(tmp_path, renamed)
    with pytest.raises(JournalCorrupt, match="between segments|file name says"):
        Journal.open(tmp_path, fsync=False)


def test_a_damaged_header_with_records_behind_it_is_not_taken_for_a_torn_creation(pristine, tmp_path):
    _records, files = pristine
    name, _ = last_segment(files)
    restore(tmp_path, {**files, name: flip_bits(files[name], [3], [0])})
    with pytest.raises(JournalCorrupt, match="file header CRC mismatch"):
        Journal.open(tmp_path, fsync=False)
    report = repair(tmp_path)
    assert report.offset == 0 and report.path == str(tmp_path / name)
    j = Journal.open(tmp_path, fsync=False)
    assert j.end == int(name[:20])
    j.close()


def test_a_newer_format_version_is_refused_and_never_repaired(pristine, tmp_path):
    _records, files = pristine
    name, base = last_segment(files)
    from crc32c import crc32c

    body = struct.pack("<8sHHQ", b"CNVYLOG\x00", 2, 0, base)
    newer = body + struct.pack("<I", crc32c(body)) + files[name][FILE_HEADER_LEN:]
    restore(tmp_path, {**files, name: newer})
    with pytest.raises(JournalError, match="version 2 is not supported") as err:
        Journal.open(tmp_path, fsync=False)
    assert not isinstance(err.value, JournalCorrupt)
    with pytest.raises(JournalError, match="newer conveyor"):
        repair(tmp_path)
    assert (tmp_path / name).read_bytes() == newer


def test_verify_dump_and_scan_segment_read_a_clean_journal(pristine, tmp_path):
    records, files = pristine
    restore(tmp_path, files)
    report = verify(tmp_path)
    assert report.ok and report.records == len(records)
    assert "no problem found" in str(report)
    assert (report.first_position, report.last_position) == (0, records[-1][0])
    assert report.end == records[-1][0] + FRAME_HEADER_LEN + len(records[-1][1])
    assert len(report.segments) == len(files)
    assert list(dump(tmp_path)) == records
    assert list(dump(tmp_path, start=records[10][0])) == records[10:]
    by_segment = [r for name in sorted(files) for r in scan_segment(tmp_path / name)]
    assert by_segment == records
    name, base = last_segment(files)
    assert list(scan_segment(tmp_path / name, end=base)) == []
    with pytest.raises(JournalError, match="not named like"):
        list(scan_segment(tmp_path / "other.log"))


def test_dump_stops_quietly_at_a_torn_tail_and_scan_segment_refuses_damage(pristine, tmp_path):
    records, files = pristine
    name, _ = last_segment(files)
    restore(tmp_path, {**files, name: files[name][:-3]})
    assert list(dump(tmp_path)) == records[:-1]
    with pytest.raises(JournalCorrupt, match="torn"):
        list(scan_segment(tmp_path / name))
    first = sorted(files)[0]
    restore(tmp_path, {first: flip_bits(files[first], [FILE_HEADER_LEN + 9], [1])})
    with pytest.raises(JournalCorrupt, match="CRC mismatch"):
        list(dump(tmp_path))
    with pytest.raises(JournalCorrupt, match="CRC mismatch"):
        list(scan_segment(tmp_path / first))


def test_repair_of_a_clean_journal_changes_nothing(pristine, tmp_path):
    _records, files = pristine
    restore(tmp_path, files)
    assert not repair(tmp_path).repaired
    assert snapshot(tmp_path) == files


def test_repair_of_a_torn_tail_matches_what_open_would_do(pristine, tmp_path):
    records, files = pristine
    name, _ = last_segment(files)
    restore(tmp_path, {**files, name: files[name][:-5]})
    report = repair(tmp_path)
    assert report.repaired and report.bytes_dropped == len(files[name]) - 5 - report.offset
    j = Journal.open(tmp_path, fsync=False)
    assert list(j.scan()) == records[:-1]
    assert j.recovery.problem is None
    j.close()


def test_read_detects_damage_after_open(tmp_path, monkeypatch):
    j = Journal.open(tmp_path, fsync=False)
    p = j.append(b"payload")
    j.commit()
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    data[FILE_HEADER_LEN + FRAME_HEADER_LEN] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt, match="CRC mismatch"):
        j.read(p)
    # The newest batch is scanned from memory: the frames as this process wrote them.
    assert list(j.scan()) == [(p, b"payload")]
    monkeypatch.setattr(journal_module, "RECENT_BYTES", 0)
    j.append(b"next")
    j.commit()  # pushes every batch out of memory: a scan reads (and checks) the file
    with pytest.raises(JournalCorrupt, match="CRC mismatch"):
        list(j.scan())
    j.close()


def test_memory_journal_recovers_a_torn_store_like_a_directory(caplog):
    store = MemoryStore()
    j = MemoryJournal.open(store)
    kept = [(j.append(payload_for(i)), payload_for(i)) for i in range(5)]
    j.close()
    store.files[0] += b"\x05\x00\x00"  # a torn frame header
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        j = MemoryJournal.open(store)
    assert list(j.scan()) == kept
    [line] = warnings_of(caplog)
    assert "<memory>/00000000000000000000.log" in line.getMessage()


def test_an_empty_last_segment_file_is_a_torn_creation(pristine, tmp_path, caplog):
    records, files = pristine
    name, base = last_segment(files)
    end = records[-1][0] + FRAME_HEADER_LEN + len(records[-1][1])
    restore(tmp_path, files)
    (tmp_path / segment_name(end)).write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        j = Journal.open(tmp_path, fsync=False)
    assert len(warnings_of(caplog)) == 1
    assert (tmp_path / segment_name(end)).read_bytes() == encode_header(end)
    assert list(j.scan()) == records
    assert j.append(b"x") == end
    j.close()
