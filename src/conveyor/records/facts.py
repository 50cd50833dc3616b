"""What a journal record is about, for segment summaries (conveyor.journal.index).

The journal stores opaque payloads and must not import the engine, so whoever writes
or reads summaries passes :func:`describe_record` in (the server at seal time, the
Spark journal reader when a summary is missing). The op names here are also the
``op`` column of the Spark journal reader.
"""

from __future__ import annotations

from conveyor import records as r

#: Record type -> op name, in tag order. A new record type needs a name here
#: (tests/spark/test_journal_source.py checks that every tag has one).
OPS: dict[type, str] = {
    r.PublishRec: "publish",
    r.LeasedRec: "lease",
    r.DeliveredRec: "deliver",
    r.AckedRec: "ack",
    r.CancelledRec: "cancel",
    r.ExpiredRec: "expire",
    r.ReturnedRec: "return",
    r.BarrierRec: "barrier",
    r.ConsumerLeasedRec: "consumer_lease",
    r.ConsumerAckedRec: "consumer_ack",
    r.ConsumerClaimedRec: "consumer_claim",
    r.ReceivedRec: "replica_received",
    r.QueueRemovedRec: "queue_removed",
    r.TransferRequestRec: "transfer_request",
    r.TransferRec: "transfer",
    r.SowDeletedRec: "sow_delete",
    r.ConsumerReplicatedRec: "consumer_replicated",
    r.QueueCancelledRec: "queue_cancelled",
}
OP_NAMES: tuple[str, ...] = tuple(OPS.values())


def describe_record(payload: bytes) -> tuple[str, float | None, str | None, str | None, int | None, str | None]:
    """``(op, timestamp, topic, queue, publisher, consumer)`` of an encoded record;
    None where the record has no such field (only publishes have a timestamp)."""
    rec = r.decode(payload)
    op = OPS[type(rec)]
    if op == "publish":
        return op, rec.timestamp, rec.topic, None, rec.publisher, None
    if op == "replica_received":
        return op, None, None, None, None, None
    if op == "sow_delete":
        return op, None, rec.topic, None, None, None
    return op, None, None, rec.queue, None, getattr(rec, "consumer", None)
