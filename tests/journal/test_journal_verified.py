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
