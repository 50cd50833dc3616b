"""Scans of the newest batches come from memory (journal.RECENT_BYTES) and must be
indistinguishable from scans of the files: same positions, same payloads, across
segment boundaries, while batches are evicted under a scan that is under way, and
after a truncation."""

from __future__ import annotations

import random
import shutil

import pytest

from conveyor.journal import Journal
from conveyor.journal import journal as journal_module


def _fill(j: Journal, rng: random.Random, batches: int) -> None:
    for _ in range(batches):
        for _ in range(rng.randint(1, 12)):
            j.append(bytes([rng.randrange(256)]) * rng.randint(0, 300))
        j.commit()


def _from_files(path) -> list[tuple[int, bytes]]:
    copy = path.parent / f"{path.name}-copy"  # the open journal holds its directory's lock
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy)
    with Journal.open(copy, fsync=False) as fresh:  # as a new process: nothing in memory
        return list(fresh.scan())


@pytest.mark.parametrize("recent", [0, 700, 5000, 1 << 20])
@pytest.mark.parametrize("seed", range(4))
def test_every_scan_sees_what_the_files_hold(tmp_path, monkeypatch, recent, seed):
    monkeypatch.setattr(journal_module, "RECENT_BYTES", recent)
    rng = random.Random(seed)
    j = Journal.open(tmp_path, segment_bytes=900, fsync=False)
    _fill(j, rng, 30)
    everything = list(j.scan())
    assert everything == _from_files(tmp_path)
    positions = [pos for pos, _ in everything]
    for _ in range(50):  # any boundary to any end, as replication and replays ask
        a, b = sorted(rng.sample(range(len(positions)), 2))
        assert list(j.scan(positions[a], positions[b])) == everything[a:b]
    j.close()


def test_a_scan_under_way_survives_eviction_of_the_batches_ahead(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_module, "RECENT_BYTES", 2000)
    rng = random.Random(7)
    j = Journal.open(tmp_path, segment_bytes=1500, fsync=False)
    _fill(j, rng, 10)
    expected = list(j.scan())
    it = j.scan()
    got = [next(it) for _ in range(3)]
    _fill(j, rng, 20)  # evicts every batch the scan has yet to read
    got.extend(it)  # bounds were fixed when the scan began
    assert got == expected
    j.close()


def test_truncation_forgets_what_it_cut(tmp_path):
    j = Journal.open(tmp_path, fsync=False)
    keep = [(j.append(b"a" * 10), b"a" * 10)]
    j.commit()
    cut = j.append(b"b" * 10)
    j.commit()
    j.truncate(cut)
    again = j.append(b"c" * 20)
    j.commit()
    assert again == cut
    assert list(j.scan()) == [*keep, (cut, b"c" * 20)] == _from_files(tmp_path)
    j.close()


def test_a_batch_larger_than_the_window_is_not_kept_and_neither_is_what_came_before(tmp_path, monkeypatch):
    from conveyor.errors import JournalCorrupt
    from conveyor.journal import FILE_HEADER_LEN, FRAME_HEADER_LEN, segment_name

    monkeypatch.setattr(journal_module, "RECENT_BYTES", 100)
    j = Journal.open(tmp_path, fsync=False)
    j.append(b"small")
    j.commit()
    for _ in range(5):
        j.append(b"x" * 40)  # 240 bytes of frames in one batch
    j.commit()
    assert list(j.scan()) == _from_files(tmp_path)
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    data[FILE_HEADER_LEN + FRAME_HEADER_LEN] ^= 1  # damage the first batch on disk
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt):  # so it is read from the file, not memory
        list(j.scan())
    j.close()
