"""Acknowledgements of one frame are journaled together (engine/delivery.py rule 6).

Consecutive ``sow_delete`` commands of a frame on one queue with one option write the
records one command with all their bookmarks would write; each command keeps its own
reply, its own count and its own refusal; a persisted ack still waits for the fsync of
the record that holds its acknowledgement; records keep the order of the commands, so
recovery rebuilds the same queue.
"""

from __future__ import annotations

from conveyor import records
from conveyor.protocol.bookmarks import bookmark_positions
from conveyor.protocol import messages as m

from .engine_harness import Harness, config_xml, decode, queue_xml


def _queue(**elements) -> Harness:
    elements.setdefault("LeasePeriod", "10s")
    return Harness(config_xml(queue_xml("Q", **elements), topics=("Work",)))


def _setup(h: Harness, n: int, backlog: int = 10) -> tuple[int, list[m.Message]]:
    pub = h.connect("pub")
    for i in range(n):
        h.publish(pub, "Work", {"i": i})
    h.commit()
    w = h.connect("w")
    h.subscribe(w, "Q", options=f"max_backlog={backlog}")
    h.acks(w)
    return w, h.messages(w)


def _queue_records(h: Harness) -> list:
    """The committed records of these kinds (a MemoryJournal scans what is committed)."""
    kinds = (records.AckedRec, records.CancelledRec, records.ReturnedRec, records.ExpiredRec, records.PublishRec)
    return [r for _, p in h.journal.scan() if isinstance(r := records.decode(p), kinds)]


def _acks(msgs, *, cid: str, options: str | None = None, ack_type: str = "persisted") -> m.SowDelete:
    return m.SowDelete(topic="Q", bookmark=",".join(x.bookmark for x in msgs), options=options, cid=cid, ack_type=ack_type)


def test_acks_of_one_frame_are_one_record_and_each_persisted_ack_waits_for_its_fsync():
    h = _queue()
    w, got = _setup(h, 4)
    h.commit()
    before = len(_queue_records(h))
    h.handle(w, *(_acks([x], cid=f"a{i}") for i, x in enumerate(got)))
    assert h.acks(w) == []  # nothing persisted before the fsync
    h.commit()
    replies = h.acks(w)
    assert [a.cid for a in replies] == ["a0", "a1", "a2", "a3"]
    assert all(a.ack_type == "persisted" and a.status == "success" and a.records_deleted == 1 for a in replies)
    (acked,) = _queue_records(h)[before:]
    assert type(acked) is records.AckedRec
    assert acked.positions == [p for x in got for p in bookmark_positions(x.bookmark)]


def test_different_options_in_one_frame_keep_their_order_and_recovery_agrees():
    h = _queue()
    w, got = _setup(h, 4)
    h.commit()
    before = len(_queue_records(h))
    h.handle(
        w,
        _acks(got[:1], cid="ack"),
        _acks(got[1:2], cid="cancel", options="cancel"),
        _acks(got[2:3], cid="ack2"),
    )
    h.commit()
    assert [a.cid for a in h.acks(w)] == ["ack", "cancel", "ack2"]
    kinds = [type(r) for r in _queue_records(h)[before:]]
    assert kinds == [records.AckedRec, records.CancelledRec, records.AckedRec]
    h.crash()  # leases end with the server: what is left is what was not acknowledged
    assert sorted(decode(x)["i"] for x in h.sow(h.connect("viewer"), "Q")) == [1, 3]


def test_a_refused_ack_in_a_batch_fails_alone_after_the_replies_before_it():
    h = _queue(Leasing="strict")  # only the lease holder may acknowledge
    w, got = _setup(h, 2, backlog=1)
    other = h.connect("other")
    h.subscribe(other, "Q", sub_id="o", options="max_backlog=1")
    h.acks(other)
    (theirs,) = h.messages(other)
    h.handle(
        w,
        _acks(got[:1], cid="mine", ack_type="processed,persisted"),
        _acks([theirs], cid="theirs", ack_type="processed,persisted"),
    )
    out = [(a.cid, a.ack_type, a.status) for a in h.acks(w)]
    assert out == [("mine", "processed", "success"), ("theirs", "processed", "failure")]
    h.commit()
    assert [(a.cid, a.ack_type, a.status) for a in h.acks(w)] == [("mine", "persisted", "success")]


def test_a_publish_between_acks_closes_the_batch():
    h = _queue()
    w, got = _setup(h, 2)
    h.commit()
    before = len(_queue_records(h))
    h.handle(w, _acks(got[:1], cid="a"), m.Publish(topic="Work", data=b'{"i":9}'), _acks(got[1:], cid="b"))
    h.commit()
    kinds = [type(r) for r in _queue_records(h)[before:]]
    assert kinds == [records.AckedRec, records.PublishRec, records.AckedRec]
