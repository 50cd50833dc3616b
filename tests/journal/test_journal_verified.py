"""Sealed segments verified once (journal/verified.py): a later open trusts the sidecar
only while it matches the segment exactly; damage after verification is still found."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conveyor.errors import JournalCorrupt
from conveyor.journal import Journal, recovery
from conveyor.journal.verified import VERIFIED_SUFFIX

from .test_journal_recovery import SEGMENT_BYTES, build


def _full_checks(monkeypatch) -> list[int]:
    """Count the segments an open reads in full."""
    seen: list[int] = []
    real = recovery.check_segment

    def counting(storage, base, **kw):
        seen.append(base)
        return real(storage, base, **kw)

    monkeypatch.setattr(recovery, "check_segment", counting)
    return seen


def _read_all(directory: Path) -> list[tuple[int, bytes]]:
    with Journal.open(directory, segment_bytes=SEGMENT_BYTES, fsync=False) as j:
        return list(j.scan())


def test_second_open_reads_only_the_last_segment(tmp_path, monkeypatch):
    records = build(tmp_path)
    _read_all(tmp_path)  # the first open verifies the sealed segments and writes sidecars
    sealed = sorted(tmp_path.glob("*.log"))[:-1]
    assert sealed and all(Path(str(p) + VERIFIED_SUFFIX).exists() for p in sealed)
    seen = _full_checks(monkeypatch)
    assert _read_all(tmp_path) == records  # same positions and payloads
    last = max(int(p.name[:20]) for p in tmp_path.glob("*.log"))
    assert seen == [last]


def test_a_segment_changed_after_verification_is_checked_again(tmp_path, monkeypatch):
    build(tmp_path)
    _read_all(tmp_path)
    victim = sorted(tmp_path.glob("*.log"))[1]
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0x40  # same size; the write changes the modification time
    victim.write_bytes(bytes(data))
    st = os.stat(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # even on a coarse clock
    with pytest.raises(JournalCorrupt):
        Journal.open(tmp_path, segment_bytes=SEGMENT_BYTES, fsync=False)


def test_torn_or_foreign_sidecars_are_ignored(tmp_path, monkeypatch):
    records = build(tmp_path)
    _read_all(tmp_path)
    sidecars = sorted(tmp_path.glob("*" + VERIFIED_SUFFIX))
    sidecars[0].write_bytes(b"\x93torn")
    sidecars[1].write_bytes(sidecars[2].read_bytes())  # another segment's
    seen = _full_checks(monkeypatch)
    assert _read_all(tmp_path) == records
    assert len(seen) == 3  # the two bad sidecars' segments and the last one


def test_removing_a_segment_removes_its_sidecar(tmp_path):
    build(tmp_path)
    _read_all(tmp_path)
    with Journal.open(tmp_path, segment_bytes=SEGMENT_BYTES, fsync=False) as j:
        first = j.segments()[0]
        j.apply_retention(keep_from=j.segments()[2].base, max_bytes=1)
        assert not os.path.exists(first.path)
        assert not os.path.exists(first.path + VERIFIED_SUFFIX)


# --- the open segment's verified prefix (saved by the running server) --------------------


def _resumes(monkeypatch) -> list:
    """The `resume` argument of each check_segment call."""
    seen: list = []
    real = recovery.check_segment

    def spying(storage, base, **kw):
        seen.append(kw.get("resume"))
        return real(storage, base, **kw)

    monkeypatch.setattr(recovery, "check_segment", spying)
    return seen


def _append(directory: Path, n: int, start: int = 0, *, save: bool = True) -> list[tuple[int, bytes]]:
    with Journal.open(directory, segment_bytes=1 << 20, fsync=False) as j:
        out = [(j.append(b"r%06d" % i), b"r%06d" % i) for i in range(start, start + n)]
        j.commit()
        if save:
            assert j.save_prefix()
    return out


def test_a_saved_prefix_is_rechecked_by_crc_and_only_the_rest_record_by_record(tmp_path, monkeypatch):
    records = _append(tmp_path, 5000)
    records += _append(tmp_path, 300, 5000, save=False)  # appended after the last save
    seen = _resumes(monkeypatch)
    with Journal.open(tmp_path, segment_bytes=1 << 20, fsync=False) as j:
        assert list(j.scan()) == records
        assert j.recovery.records == 5300
        assert all(j.read(p) == d for p, d in records[::97])  # the sparse index is right
        more = [(j.append(b"x%d" % i), b"x%d" % i) for i in range(10)]
        j.commit()
        assert j.save_prefix()  # the writer continued the CRC from the open
    (offset, count, _index), = seen
    assert count == 5000 and offset > 0
    seen.clear()
    assert _read_all_1m(tmp_path) == records + more
    assert seen[0][1] == 5310  # the new prefix covers everything


def _read_all_1m(directory: Path) -> list[tuple[int, bytes]]:
    with Journal.open(directory, segment_bytes=1 << 20, fsync=False) as j:
        return list(j.scan())


def test_a_prefix_that_no_longer_matches_is_not_trusted(tmp_path, monkeypatch, caplog):
    _append(tmp_path, 2000)
    seg = next(tmp_path.glob("*.log"))
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0x01  # damage inside the saved prefix
    seg.write_bytes(bytes(data))
    seen = _resumes(monkeypatch)
    with pytest.raises(JournalCorrupt, match="still check out|durable"):
        Journal.open(tmp_path, segment_bytes=1 << 20, fsync=False)
    assert seen == [None]  # checked record by record: the damage is found, not trusted
    assert seg.read_bytes() == bytes(data)  # and refused: those records were durable


def test_a_sealed_segment_with_a_prefix_is_checked_from_it(tmp_path, monkeypatch):
    with Journal.open(tmp_path, segment_bytes=4096, fsync=False) as j:
        records = [(j.append(b"s%05d" % i), b"s%05d" % i) for i in range(200)]
        j.commit()
        j.save_prefix()
        first = j.segments()[-1].base
        records += [(j.append(bytes(300)), bytes(300)) for _ in range(30)]  # seals it
        j.commit()
    seen = _resumes(monkeypatch)
    assert _read_all(tmp_path) == records  # (segment_bytes does not matter to reading)
    assert any(r is not None for r in seen)
    assert os.path.exists(os.path.join(tmp_path, f"{first:020d}.log" + VERIFIED_SUFFIX))


def test_a_prefix_saved_before_any_record_is_usable(tmp_path):
    with Journal.open(tmp_path, segment_bytes=1 << 20, fsync=False) as j:
        assert j.save_prefix()  # an empty segment: the prefix is the file header alone
    records = _append(tmp_path, 10)
    assert _read_all_1m(tmp_path) == records
