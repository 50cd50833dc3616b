"""Engine part: recovery and checkpoints (spec 000, "Startup and Recovery for Queues").

Recovery replays the journal through the same transitions the live engine applies,
each queue from its recovery point; a :class:`Checkpoint` (``queues.ack`` and
``publishers.seq``, written by the server) says where those points are. A mixin of
:class:`conveyor.engine.core.Engine`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from conveyor.engine import records
from conveyor.engine.bookmarks import parse_replay_start
from conveyor.engine.cache import Entry

log = logging.getLogger("conveyor.engine")


@dataclass(frozen=True)
class Checkpoint:
    """What lets recovery skip the part of the journal that no longer matters.

    ``queues`` maps each queue to ``(recovery point, configured RecoveryPoint text)``:
    every message of the queue below the point is done (spec 000, ``queues.ack``).
    ``publishers`` holds the highest sequence per publisher, so duplicate detection
    survives retention removing old segments. Valid only once the journal is durable
    up to ``position`` (the server writes it after that).
    """

    position: int
    queues: dict[str, tuple[int, str]]
    publishers: dict[int, int]

class Recovery:
    def checkpoint(self) -> Checkpoint:
        end = self.journal.end
        queues = {}
        for name, q in self.queues.items():
            point = q.recovery_point()
            if point > q.last_position:
                # Nothing pending: everything up to the end of the log is done. (The
                # scan must start on a record boundary, which the end of the log is.)
                point = self._pending[0][0] if self._pending else end  # not past an unapplied publish
            queues[name] = (point, q.config.recovery_point or "")
        return Checkpoint(position=end, queues=queues, publishers=dict(self._highest_seq))

    def retention_floor(self, checkpoint: Checkpoint) -> int:
        """The lowest position anything still needs: queues, replays, the checkpoint."""
        floor = min([checkpoint.position, *(p for p, _ in checkpoint.queues.values())])
        for sub in self._replaying:
            floor = min(floor, sub.cursor)
        return floor

    def _configured_start(self, queue) -> tuple[int, float | None]:
        """Where a new (or re-pointed) queue starts: its RecoveryPoint, else the beginning."""
        text = queue.config.recovery_point
        if not text:
            return 0, None
        start = parse_replay_start(text)
        if start.after_position is not None:
            return self.journal.position_after(start.after_position), None
        if start.live_only:
            return self.journal.durable_end, None
        if start.at_time is not None:
            return 0, start.at_time
        return 0, None

    def recover(
        self, now: float, progress: Callable[[int], None] | None = None, checkpoint: Checkpoint | None = None
    ) -> int:
        """Rebuild state from the journal: publisher sequences, then every queue.

        Each queue is rebuilt from its recovery point: the one in the checkpoint when
        its configured ``RecoveryPoint`` is unchanged, else the configured one (spec 000,
        "Startup and Recovery for Queues"). The scan starts at the oldest point needed.
        """
        self._now = now
        starts: dict[str, tuple[int, float | None]] = {}
        if checkpoint is not None:
            self._highest_seq.update(checkpoint.publishers)
        for name, queue in self.queues.items():
            saved = checkpoint.queues.get(name) if checkpoint is not None else None
            if saved is not None and saved[1] == (queue.config.recovery_point or ""):
                starts[name] = (saved[0], None)
            else:
                starts[name] = self._configured_start(queue)
        first = getattr(self.journal, "first_position", 0)
        scan_from = min([checkpoint.position if checkpoint is not None else 0, *(p for p, _ in starts.values())])
        scan_from = max(scan_from, first)
        points = {name: p for name, (p, _) in starts.items()}
        times = {name: t for name, (_, t) in starts.items() if t is not None}
        count = 0
        for pos, payload in self.journal.scan(scan_from):
            rec = records.decode(payload)
            count += 1
            if type(rec) is records.PublishRec:
                if rec.seq > self._highest_seq.get(rec.publisher, 0):
                    self._highest_seq[rec.publisher] = rec.seq
                self._apply_recovered_publish(pos, rec, points, times)
                if rec.expired_queue is not None:
                    expired = self.queues.get(rec.expired_queue)
                    if expired is not None and rec.expired_position >= points[rec.expired_queue]:
                        expired.replay_expired(rec.expired_position)
            else:
                queue = self.queues.get(rec.queue)
                if queue is None:
                    continue  # a queue no longer configured
                self._replay_queue_record(queue, rec, now, points[rec.queue])
                if queue.config.target_queue_depth is not None:
                    self._refill(queue, upto=pos)
            if progress is not None and count % 10000 == 0:
                progress(count)
        self.applied_end = self.journal.durable_end
        for queue in self.queues.values():
            # Messages already at MaxCancels / MaxDeliveries expire now, journaled.
            self._journal_queue_events(queue, queue.end_replay(now))
            self._refill(queue)
            self._dirty_queues.add(queue)
        return count

    def _apply_recovered_publish(self, pos: int, rec: records.PublishRec, points: dict, times: dict) -> None:
        for queue in self._queues_for(rec.topic):
            name = queue.config.name
            if pos < points[name]:
                continue
            since = times.get(name)
            if since is not None and rec.timestamp < since:
                continue
            if name in self._plain_queues:
                queue.enqueue(pos, rec.timestamp)  # no filter, priority or barrier: skip the Entry
                continue
            entry = Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id)
            self._offer(queue, pos, entry)

    def _replay_queue_record(self, queue, rec, now: float, point: int = 0) -> None:
        if point:
            rec = _above(rec, point)
            if rec is None:
                return
        match rec:
            case records.LeasedRec():
                for position, count in zip(rec.positions, rec.counts):
                    queue.replay_delivered(position, now, count=count)
            case records.DeliveredRec():
                for position in rec.positions:
                    queue.replay_delivered(position, now)
            case records.AckedRec():
                for position in rec.positions:
                    queue.replay_acknowledged(position)
            case records.CancelledRec():
                for position in rec.positions:
                    queue.replay_cancelled(position)
            case records.ExpiredRec():
                queue.replay_expired(rec.position)
            case records.ReturnedRec():
                for position in rec.positions:
                    queue.replay_returned(position)
            case records.BarrierRec():
                for position in rec.positions:
                    queue.replay_barrier_delivered(position)


def _above(rec, point: int):
    """The part of a queue record about positions at or above ``point`` (or None)."""
    if hasattr(rec, "positions"):
        keep = [i for i, p in enumerate(rec.positions) if p >= point]
        if not keep:
            return None
        if len(keep) == len(rec.positions):
            return rec
        if isinstance(rec, records.LeasedRec):
            return records.LeasedRec(rec.queue, [rec.positions[i] for i in keep], [rec.counts[i] for i in keep])
        return type(rec)(rec.queue, [rec.positions[i] for i in keep])
    return rec if rec.position >= point else None

