"""PublishLog.append_arrived, a replica's hot path: publishes that came from one place
are journaled exactly when they are new (rule 2 of publish_log.py), in their order,
with the same records and bookkeeping as one append_encoded each."""

from __future__ import annotations

import random

import pytest

from conveyor import records
from conveyor.engine.publish_log import PublishLog
from conveyor.errors import JournalError
from conveyor.journal import MemoryJournal
from conveyor.journal import journal as journal_module

ARRIVAL = records.Arrival("A", "east", ["A"])


def _publish(publisher: int, seq: int) -> tuple[records.PublishRec, bytes]:
    payload = records.encode_publish("Orders", publisher, seq, 1.5e9 + seq, b'{"n":%d}' % seq, None)
    return records.decode(payload), payload


def _one_at_a_time(log: PublishLog, items, duplicates: list) -> int:
    """The reference: rule 2 and one append_encoded per publish."""
    journaled = 0
    for rec, payload in items:
        if log.is_recorded(rec.publisher, rec.seq):
            duplicates.append(rec)
            continue
        log.append_encoded(rec, ARRIVAL.encode(payload, rec), ARRIVAL.origin)
        journaled += 1
    return journaled


def _state(log: PublishLog, journal: MemoryJournal):
    journal.commit()
    pending = [(p.position, p.end, p.topic, p.publisher, p.seq, p.timestamp, p.data, p.correlation_id, p.origin,
                p.expiration, p.sow_key) for p in log.pending]
    return list(journal.scan()), pending, log.sequences(), log.holes()


@pytest.mark.parametrize("seed", range(30))
def test_the_same_records_and_bookkeeping_as_one_append_each(seed):
    rng = random.Random(seed)
    logs = [(PublishLog(j, None), j) for j in (MemoryJournal(), MemoryJournal())]
    for _ in range(20):
        # Runs in sequence, interleaved publishers, resends (duplicates), and gaps that
        # later arrivals fill: what failovers and second paths bring.
        items = [_publish(rng.randrange(3), rng.randint(1, 60)) for _ in range(rng.randint(0, 30))]
        if rng.random() < 0.5:
            publisher = rng.randrange(3)
            start = logs[0][0].sequences().get(publisher, 0) + 1
            items += [_publish(publisher, s) for s in range(start, start + rng.randint(1, 40))]
        dup_fast, dup_ref = [], []
        fast = logs[0][0].append_arrived([r for r, _ in items], [p for _, p in items], ARRIVAL, dup_fast.append)
        ref = _one_at_a_time(logs[1][0], items, dup_ref)
        assert fast == ref
        assert dup_fast == dup_ref
    assert _state(*logs[0]) == _state(*logs[1])


def test_a_refused_run_notes_nothing(monkeypatch):
    journal = MemoryJournal()
    log = PublishLog(journal, None)
    small, big = _publish(1, 1), _publish(1, 2)
    monkeypatch.setattr(journal_module, "RECORD_BYTES_MAX", len(ARRIVAL.encode(small[1], small[0])))
    with pytest.raises(JournalError):
        log.append_arrived([small[0], big[0]], [small[1], big[1] + b"padding"], ARRIVAL, lambda rec: None)
    # The journal took nothing, so nothing counts as recorded: a resend is journaled.
    assert not log.is_recorded(1, 1)
    assert not log.pending and journal.end == 0
