"""Engine part: recovery and checkpoints (spec 000, "Startup and Recovery for Queues").

Recovery replays the journal through the same transitions the live engine applies,
each queue from its recovery point; a :class:`Checkpoint` (``queues.ack`` and
``publishers.seq``, written by the server) says where those points are. A mixin of
:class:`conveyor.engine.core.Engine`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from conveyor import records
from conveyor.engine.bookmarks import parse_replay_start
from conveyor.engine.cache import Entry
from conveyor.engine.snapshots import SnapshotRecovery
from conveyor.engine.consumers import CONSUMER_RECORDS

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
    # Named consumers (consumers.py): queue -> name -> {d, acked, epoch, token, positions},
    # so a restart does not need their records below the queues' recovery points.
    consumers: dict = field(default_factory=dict)
    # FileBackedMetadata: queue -> QueueSnapshot (queue_snapshot.py), each valid at its
    # own positions; recovery replays such a queue only from there.
    snapshots: dict = field(default_factory=dict)

class Recovery(SnapshotRecovery):
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
        return Checkpoint(position=end, queues=queues, publishers=dict(self._highest_seq),
                          consumers=self._named_snapshot(), snapshots=self._queue_snapshots(end))

    def retention_floor(self, checkpoint: Checkpoint) -> int:
        """The lowest position anything still needs: queues, replays, the checkpoint."""
        floor = min([checkpoint.position, *(p for p, _ in checkpoint.queues.values())])
        for sub in self._replaying:
            floor = min(floor, sub.cursor)
        named = self._named_floor()  # fetch reads unacked deliveries' bodies from the log
        if named is not None:
            floor = min(floor, named)
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
        self, now: float, progress: Callable[[int], None] | None = None, checkpoint: Checkpoint | None = None,
        pages=None,
    ) -> int:
        """Rebuild state from the journal: publisher sequences, then every queue.

        Each queue is rebuilt from its recovery point: the one in the checkpoint when
        its configured ``RecoveryPoint`` is unchanged, else the configured one (spec 000,
        "Startup and Recovery for Queues"). The scan starts at the oldest point needed.
        A FileBackedMetadata queue with a valid snapshot in the checkpoint starts from
        it instead; ``pages`` provides the page files (server/page_files.py; None: no paging).
        """
        self._now = now
        starts: dict[str, tuple[int, float | None]] = {}
        if checkpoint is not None:
            self._highest_seq.update(checkpoint.publishers)
            self._restore_named(checkpoint.consumers)
        for name, queue in self.queues.items():
            saved = checkpoint.queues.get(name) if checkpoint is not None else None
            if saved is not None and saved[1] == (queue.config.recovery_point or ""):
                starts[name] = (saved[0], None)
            else:
                starts[name] = self._configured_start(queue)
        self._restore_snapshots(checkpoint, pages, starts)
        first = getattr(self.journal, "first_position", 0)
        scan_from = min([checkpoint.position if checkpoint is not None else 0, *(p for p, _ in starts.values())])
        scan_from = max(scan_from, first)
        points = {name: p for name, (p, _) in starts.items()}
        times = {name: t for name, (_, t) in starts.items() if t is not None}
        count = 0
        run: list = []  # an open transaction run (txn.py rule 3): applied once complete
        for pos, payload in self.journal.scan(scan_from):
            rec = records.decode(payload)
            count += 1
            if type(rec) is records.PublishRec:
                if rec.txn_total:
                    run.append((pos, rec))
                    if rec.txn_index == rec.txn_total - 1:
                        for p, r in run:
                            self._recover_publish(p, r, points, times)
                        run = []
                else:
                    if run:  # cannot happen (runs are contiguous): apply what there is
                        log.error("journal: transaction run at %d interrupted at %d", run[0][0], pos)
                        for p, r in run:
                            self._recover_publish(p, r, points, times)
                        run = []
                    self._recover_publish(pos, rec, points, times)
            elif type(rec) in CONSUMER_RECORDS:
                self._replay_consumer_record(pos, rec, now, points)
            else:
                queue = self.queues.get(rec.queue)
                if queue is None:
                    continue  # a queue no longer configured
                if rec.queue in self._snapshot_events:
                    if pos < self._snapshot_events[rec.queue]:
                        continue  # already in the snapshot
                    self._replay_queue_record(queue, rec, now, 0)
                else:
                    self._replay_queue_record(queue, rec, now, points[rec.queue])
                if queue.config.target_queue_depth is not None:
                    self._refill(queue, upto=pos)
            if progress is not None and count % 10000 == 0:
                progress(count)
        if run:
            first = run[0][1]
            log.warning(
                "journal: transaction of publisher %d seq %d cut short by a crash (%d of %d records): "
                "truncated the journal at position %d", first.publisher, first.seq, len(run), first.txn_total, run[0][0],
            )
            self.journal.truncate(run[0][0])
        self.applied_end = self.journal.durable_end
        for queue in self.queues.values():
            # Messages already at MaxCancels / MaxDeliveries expire now, journaled.
            self._journal_queue_events(queue, queue.end_replay(now))
            self._refill(queue)
            self._dirty_queues.add(queue)
        self._lease_named_after_restart(now)
        return count

    def _recover_publish(self, pos: int, rec: records.PublishRec, points: dict, times: dict) -> None:
        if rec.seq > self._highest_seq.get(rec.publisher, 0):
            self._highest_seq[rec.publisher] = rec.seq
        if rec.fingerprint:
            self._fingerprints.note(rec.publisher, rec.seq, rec.fingerprint)
        self._apply_recovered_publish(pos, rec, points, times)
        if rec.expired_queue is not None:
            expired = self.queues.get(rec.expired_queue)
            since = self._snapshot_events.get(rec.expired_queue)
            if expired is not None and (
                rec.expired_position >= points[rec.expired_queue] if since is None else pos >= since
            ):
                expired.replay_expired(rec.expired_position)
                if expired.config.target_queue_depth is not None:
                    self._refill(expired, upto=pos)  # as after any queue record: room freed

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
