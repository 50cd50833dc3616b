"""The scrub (journal/scrub.py): bounded steps over every segment, damage reported with
its file, offset and position, segments removed under it skipped."""

from __future__ import annotations

import os

from conveyor.journal import FILE_HEADER_LEN, FRAME_HEADER_LEN, Journal
from conveyor.journal.scrub import Scrubber, forget_verified, targets_of
from conveyor.journal.verified import VERIFIED_SUFFIX

from .conftest import payload_for


def journal_of(directory, count: int = 400) -> tuple[Journal, list[tuple[int, bytes]]]:
    j = Journal.open(directory, segment_bytes=8192, fsync=False)
    records = [(j.append(payload_for(i, 100)), payload_for(i, 100)) for i in range(count)]
    j.commit()
    return j, records


def scrub_all(scrubber: Scrubber, bytes_max: int) -> list:
    steps = []
    while not scrubber.done:
        steps.append(scrubber.step(bytes_max))
    return steps


def test_a_clean_journal_is_checked_whole_in_bounded_steps(tmp_path):
    j, records = journal_of(tmp_path)
    segments = j.segments()
    assert len(segments) > 3
    scrubber = Scrubber(targets_of(segments))
    steps = scrub_all(scrubber, bytes_max=1000)
    assert scrubber.records_checked == len(records)
    assert scrubber.bytes_checked == sum(s.size - FILE_HEADER_LEN for s in segments)
    assert not scrubber.problems
    assert max(s.bytes for s in steps) < 1000 + FRAME_HEADER_LEN + 100  # the bound, plus one record
    j.close()


def test_damage_is_reported_with_file_offset_and_position_and_the_pass_goes_on(tmp_path):
    j, records = journal_of(tmp_path)
    segments = j.segments()
    victim = segments[1]
    pos, _ = next((p, v) for p, v in records if p > victim.base + 500)
    offset = FILE_HEADER_LEN + pos - victim.base
    with open(victim.path, "r+b") as f:
        f.seek(offset + FRAME_HEADER_LEN + 3)
        f.write(b"\xff")
    scrubber = Scrubber(targets_of(segments))
    scrub_all(scrubber, bytes_max=4096)
    [problem] = scrubber.problems
    assert (problem.path, problem.offset, problem.position) == (victim.path, offset, pos)
    assert "CRC mismatch" in problem.describe() and victim.path in problem.describe()
    # everything but the damaged record and the rest of its segment was checked
    assert scrubber.records_checked == len(records) - sum(1 for p, _ in records if pos <= p < segments[2].base)
    j.close()


def test_a_segment_removed_before_the_scrub_reaches_it_is_skipped(tmp_path):
    j, records = journal_of(tmp_path)
    segments = j.segments()
    targets = targets_of(segments)
    j.close()
    os.unlink(segments[0].path)
    scrubber = Scrubber(targets)
    scrub_all(scrubber, bytes_max=1 << 20)
    assert not scrubber.problems
    assert scrubber.records_checked == sum(1 for p, _ in records if p >= segments[1].base)


def test_the_open_segment_is_checked_up_to_its_durable_end(tmp_path):
    j, records = journal_of(tmp_path, count=20)
    j.append(b"not durable yet")
    with open(j.segments()[-1].path, "ab") as f:
        f.write(b"\x07\x00\x00\x00torn")  # what a write in progress looks like past the durable end
    scrubber = Scrubber(targets_of(j.segments()))
    scrub_all(scrubber, bytes_max=1 << 20)
    assert scrubber.records_checked == 20 and not scrubber.problems
    j._storage.close()


def test_forget_verified_drops_the_sidecar(tmp_path):
    j, _ = journal_of(tmp_path)
    j.close()
    j = Journal.open(tmp_path, segment_bytes=8192, fsync=False)  # this open writes the sidecars
    sealed = j.segments()[0].path
    assert os.path.exists(sealed + VERIFIED_SUFFIX)
    forget_verified(sealed)
    forget_verified(sealed)  # twice is harmless
    assert not os.path.exists(sealed + VERIFIED_SUFFIX)
    j.close()
