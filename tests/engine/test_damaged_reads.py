"""A record found damaged when the engine reads it back fails that read only
(engine/delivery.py rule 5): here a TargetQueueDepth refill meets it."""

from __future__ import annotations

import logging

from conveyor.journal import FILE_HEADER_LEN, FRAME_HEADER_LEN
from conveyor.journal import journal as journal_module
from tests.engine.engine_harness import Harness, config_xml, queue_xml


def test_a_damaged_record_stops_the_refill_of_its_queue_only(caplog, monkeypatch):
    # Damage on disk is met by reads from disk: keep no batch in memory (journal.RECENT_BYTES).
    monkeypatch.setattr(journal_module, "RECENT_BYTES", 0)
    h = Harness(config_xml(queue_xml("Window", TargetQueueDepth=2) + queue_xml("Plain"), topics=("Work",)))
    pub = h.connect("pub")
    for n in range(6):
        h.publish(pub, "Work", {"n": n})
    h.commit()
    store = h.journal.store
    # the fourth publish: inactive in Window (outside its depth of 2), read back by a refill
    position = [p for p, _ in h.journal.scan()][3]
    store.files[0][FILE_HEADER_LEN + position + FRAME_HEADER_LEN + 2] ^= 0x01
    worker = h.connect("worker")
    h.subscribe(worker, "Window", sub_id="w", options="max_backlog=10")
    h.subscribe(worker, "Plain", sub_id="p", options="max_backlog=10")
    with caplog.at_level(logging.ERROR, logger="conveyor.engine"):
        for _ in range(3):
            got = h.messages(worker, "Window")
            h.ack(worker, "Window", got)
            h.commit()
    assert "Window: inactive messages are no longer read back from the journal" in caplog.text
    assert len(h.messages(worker, "Plain")) == 6  # the other queue is not affected
