"""Journal.append_many buffers records exactly as one append each would: the same
positions, the same files, the same segments and sparse index, and it refuses a run
whole, writing nothing, when the journal is closed or a record is oversized."""

from __future__ import annotations

import random

import pytest

from conveyor.errors import JournalError
from conveyor.journal import FILE_HEADER_LEN, Journal, MemoryJournal
from conveyor.journal import format as journal_format
from conveyor.journal import journal as journal_module


def _runs(seed: int) -> list[list[bytes]]:
    rng = random.Random(seed)
    return [[bytes([rng.randrange(256)]) * rng.randint(0, 700) for _ in range(rng.randint(0, 40))]
            for _ in range(25)]


@pytest.mark.parametrize("seed", range(6))
def test_a_run_lands_as_one_append_each(tmp_path, seed):
    one = Journal.open(tmp_path / "one", segment_bytes=5000, fsync=False)
    many = Journal.open(tmp_path / "many", segment_bytes=5000, fsync=False)
    for i, run in enumerate(_runs(seed)):
        assert many.append_many(run) == [one.append(p) for p in run]
        assert many.end == one.end
        if i % 3 == 0:  # runs that span a batch, and batches of several runs
            a, b = one.take_batch(), many.take_batch()
            assert (a is None and b is None) or a.pieces == b.pieces
            for j, batch in ((one, a), (many, b)):
                if batch is not None:
                    j.mark_durable(j.write_batch(batch))
    one.commit()
    many.commit()
    assert list(many.scan()) == list(one.scan())
    shape = lambda j: [(s.base, s.end, s.size, s.sealed) for s in j.segments()]  # noqa: E731
    assert shape(many) == shape(one)
    one.close()
    many.close()
    for name in ("one", "many"):  # what recovery finds: every record, intact
        with Journal.open(tmp_path / name, fsync=False) as again:
            assert [p for _, p in again.scan()] == [p for run in _runs(seed) for p in run]
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == sorted(p.name for p in (tmp_path / "many").iterdir())
    for f in (tmp_path / "one").iterdir():
        if f.suffix != ".lock":
            # the frames, byte for byte (a file header carries its journal's own identity)
            assert f.read_bytes()[FILE_HEADER_LEN:] == (tmp_path / "many" / f.name).read_bytes()[FILE_HEADER_LEN:]


def test_positions_prove_themselves_by_the_sparse_index():
    j = MemoryJournal()
    payloads = [b"x" * 250] * 100  # crosses the index interval many times
    positions = j.append_many(payloads)
    j.commit()
    for pos in positions:
        assert j.read(pos) == b"x" * 250


def test_an_oversized_record_refuses_the_whole_run(monkeypatch):
    monkeypatch.setattr(journal_module, "RECORD_BYTES_MAX", 100)
    monkeypatch.setattr(journal_format, "RECORD_BYTES_MAX", 100)
    j = MemoryJournal()
    before = j.append(b"a")
    with pytest.raises(JournalError, match="record_bytes_max"):
        j.append_many([b"b" * 10, b"c" * 101, b"d"])
    assert j.end == before + len(b"a") + journal_format.FRAME_HEADER_LEN
    j.commit()
    assert list(j.scan()) == [(before, b"a")]


def test_a_closed_journal_refuses_a_run():
    j = MemoryJournal()
    j.close()
    with pytest.raises(JournalError, match="closed"):
        j.append_many([b"a"])


def test_an_empty_run_changes_nothing():
    j = MemoryJournal()
    assert j.append_many([]) == []
    assert j.end == 0 and j.take_batch() is None
