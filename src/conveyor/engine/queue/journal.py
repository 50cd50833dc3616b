"""One table each way between queue events and journal records.

A queue reports every transition as an event (:mod:`conveyor.engine.queue.events`); the
engine journals it as a record (:mod:`conveyor.records`), and recovery replays each
record through the queue verb that re-applies it. Rules:

1. **Every event has a record.** :data:`EVENT_RECORDS` maps each event type to the
   record type that journals it. An event type missing from the table raises
   ``KeyError`` when journaled: an event nobody journals is a bug the simulations catch,
   never a silent gap after a restart.
2. **Batched per call and kind.** The events of one call become one record per record
   type, in the order the kinds first appear (:func:`batch`), except ``Expired``: each
   expiry is its own record, because it carries its reasons and may carry dead letters
   (the engine journals it with :class:`~conveyor.engine.delivery.QueueDelivery`).
   The order of kinds within one call does not matter to replay (queue/recovery.py rule 3).
   A ``CancelledRec`` carries each cancel's delayed retry and failure reason in two
   lists, one item per position, only when one of its cancels has either (docs/queues.md).
3. **Every queue record has a replay verb.** :data:`RECORD_REPLAY` maps each queue record
   type to the queue's ``replay`` verb; :func:`replay` applies a record to the part
   of a queue at or above its recovery point.
"""

from __future__ import annotations

from typing import Callable, Iterable, Union, cast

from conveyor import records
from conveyor.engine.queue.queue import Queue
from conveyor.engine.queue.events import (
    Acknowledged,
    BarrierDelivered,
    Cancelled,
    DeliveredAtMostOnce,
    Event,
    Expired,
    Leased,
    LeaseExpired,
    Returned,
)

#: The records of queue events that hold only the queue and positions, and all of them.
PositionsRec = Union[records.DeliveredRec, records.AckedRec, records.CancelledRec, records.ReturnedRec, records.BarrierRec]
QueueRec = Union[records.LeasedRec, PositionsRec, records.ExpiredRec]

#: Rule 1: event type -> the record type that journals it.
EVENT_RECORDS: dict[type[Event], type[QueueRec]] = {
    Leased: records.LeasedRec,
    DeliveredAtMostOnce: records.DeliveredRec,
    Acknowledged: records.AckedRec,
    Cancelled: records.CancelledRec,
    LeaseExpired: records.ReturnedRec,
    Returned: records.ReturnedRec,
    Expired: records.ExpiredRec,
    BarrierDelivered: records.BarrierRec,
}


def batch(events: Iterable[Event]) -> tuple[list[tuple[type[QueueRec], list[Event]]], list[Expired]]:
    """Rule 2: the events of one call grouped by record type (first appearance first),
    and the expiries apart."""
    groups: dict[type[QueueRec], list[Event]] = {}
    expired: list[Expired] = []
    for ev in events:
        rec_type = EVENT_RECORDS[type(ev)]
        if rec_type is records.ExpiredRec:
            expired.append(cast(Expired, ev))  # the one event journaled as ExpiredRec
        else:
            groups.setdefault(rec_type, []).append(ev)
    return list(groups.items()), expired


def record(queue: str, rec_type: type[QueueRec], events: list[Event]) -> records.LeasedRec | PositionsRec:
    """The one record journaling ``events`` (all of ``rec_type``) of ``queue``."""
    positions = [ev.position for ev in events]
    if rec_type is records.LeasedRec:
        return records.LeasedRec(queue, positions, [ev.count for ev in cast("list[Leased]", events)])
    if rec_type is records.CancelledRec:
        cancels = cast("list[Cancelled]", events)
        if any(ev.not_before or ev.reason for ev in cancels):
            return records.CancelledRec(queue, positions, [ev.not_before for ev in cancels],
                                        [ev.reason for ev in cancels])
    return cast("type[PositionsRec]", rec_type)(queue, positions)  # batch keeps ExpiredRec apart


def _leased(q: Queue, rec: records.LeasedRec, now: float, keep: Callable[[int], bool]) -> None:
    for position, count in zip(rec.positions, rec.counts):
        if keep(position):
            q.replay.delivered(position, now, count=count)


def _delivered(q: Queue, rec: records.DeliveredRec, now: float, keep: Callable[[int], bool]) -> None:
    for position in rec.positions:
        if keep(position):
            q.replay.delivered(position, now)


def _each(verb: str) -> Callable[[Queue, PositionsRec, float, Callable[[int], bool]], None]:
    def apply(q: Queue, rec: PositionsRec, now: float, keep: Callable[[int], bool]) -> None:
        method = getattr(q.replay, verb)
        for position in rec.positions:
            if keep(position):
                method(position)

    apply.__name__ = f"_{verb}"
    return apply


def _cancelled(q: Queue, rec: records.CancelledRec, now: float, keep: Callable[[int], bool]) -> None:
    times, reasons = rec.not_before, rec.reasons
    for i, position in enumerate(rec.positions):
        if keep(position):
            q.replay.cancelled(position, not_before=times[i] if times else 0.0, reason=reasons[i] if reasons else "",
                               now=now)


def _expired(q: Queue, rec: records.ExpiredRec, now: float, keep: Callable[[int], bool]) -> None:
    if keep(rec.position):
        q.replay.expired(rec.position)


#: Rule 3: queue record type -> how to replay it (each verb takes its own record type).
RECORD_REPLAY: dict[type[QueueRec], Callable[..., None]] = {
    records.LeasedRec: _leased,
    records.DeliveredRec: _delivered,
    records.AckedRec: _each("acknowledged"),
    records.CancelledRec: _cancelled,
    records.ReturnedRec: _each("returned"),
    records.ExpiredRec: _expired,
    records.BarrierRec: _each("barrier_delivered"),
}

QUEUE_RECORDS = tuple(RECORD_REPLAY)


def _everything(position: int) -> bool:
    return True


def replay(queue: Queue, rec: QueueRec, now: float, point: int = 0) -> None:
    """Apply a queue record to ``queue``: only its positions at or above ``point``."""
    keep = _everything if not point else (lambda p: p >= point)
    RECORD_REPLAY[type(rec)](queue, rec, now, keep)
