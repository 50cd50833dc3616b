"""Recovery and checkpoints (spec 000, "Startup and Recovery for Queues").

Recovery replays the journal into the engine's parts through the same transitions the
live engine applies, each queue from its recovery point. Rules:

1. **Where each queue starts.** A :class:`Checkpoint` (``queues.ack``, ``publishers.seq``,
   ``consumers.state``, FileBackedMetadata snapshots; written by the server) gives each
   queue's recovery point: used when the queue's configured ``RecoveryPoint`` is
   unchanged, else the configured point (the beginning, a bookmark, a time, ``NOW`` or
   ``creation``). A queue's **creation point** is the end of the journal when this
   instance first saw the queue configured (kept in the checkpoint while the queue stays
   configured): ``creation`` starts there, so a queue whose RecoveryPoint changes to it
   replays its own history and nothing published before it existed.
   A FileBackedMetadata queue with a valid snapshot starts from the snapshot instead
   (rule 4). The scan starts at the oldest point needed.
2. **Publishes** are offered to queues exactly as live (the queue filter evaluated at the
   message's publish time, :mod:`conveyor.engine.queue.bindings` rule 1); queue records
   replay through :mod:`conveyor.engine.queue.journal`; named-consumer records through
   :class:`~conveyor.engine.consumers.NamedConsumers`.
3. **Transactions are whole or absent**: a run of transaction records is applied only
   once its last record is seen; a run a crash cut short at the tail is truncated.
4. **FileBackedMetadata** (:mod:`conveyor.engine.queue.snapshot`): a snapshot is used only
   if it lies inside the durable journal, names a page file that exists, matches the
   queue's configuration and checks; otherwise the queue replays from its recovery
   point, which is always correct. Paging needs page files (``pages``: the server's
   :class:`~conveyor.server.page_files.PageFiles`); without them such queues stay in
   memory and their snapshots hold every chunk inline.
5. After the scan every queue's ``end_replay`` runs (messages already at a limit
   expire, journaled), TargetQueueDepth windows refill, and named consumers get their
   unacked deliveries back for one LeasePeriod.
6. **State of the World** (:mod:`conveyor.engine.sow.state`): SOW topics are a fold
   over their publishes and deletes, replayed from each topic's floor in the checkpoint
   (the whole journal for a topic without one); views are rebuilt from their sources.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Protocol

import msgspec

from conveyor import errors, records
from conveyor.engine.queue import journal as queue_journal
from conveyor.engine.queue import snapshot as queue_snapshot
from conveyor.protocol.bookmarks import parse_replay_start
from conveyor.engine.cache import Entry
from conveyor.engine.consumers import CONSUMER_RECORDS, ConsumerRecord, NamedConsumers
from conveyor.engine.rows import NamedConsumerState
from conveyor.engine.delivery import QueueDelivery
from conveyor.engine.ports import JournalPort
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.queue.paging import PageFile, PagingBudget
from conveyor.engine.queue.bindings import PlainRuns, QueueBinding, QueueBindings
from conveyor.engine.replication.replication import Replication
from conveyor.engine.topics import Topics

if TYPE_CHECKING:
    from conveyor.engine.replication.ownership import ReplicatedQueues
    from conveyor.engine.queue.rows import OwnershipState
    from conveyor.engine.sow.state import StateOfTheWorld

log = logging.getLogger("conveyor.engine")

#: A replicated queue's snapshot lists the identity of each of its messages, a loop per
#: message on the engine's thread (about 0.3-0.6 µs each): above this many, a checkpoint
#: leaves its last snapshot in place (still valid: the restart replays more after it)
#: rather than pause the engine for longer.
REPLICATED_SNAPSHOT_MESSAGES_MAX = 200_000

_OWNERSHIP_RECORDS = (records.QueueRemovedRec, records.TransferRec, records.TransferRequestRec,
                      records.QueueCancelledRec)
OwnershipRecord = (records.QueueRemovedRec | records.TransferRec | records.TransferRequestRec
                   | records.QueueCancelledRec)


@dataclass
class _Scan:
    """What one recovery scan carries from record to record."""

    points: dict[str, int]  # queue -> its recovery point
    times: dict[str, float]  # queue -> its RecoveryPoint time, when it has one
    run: list[tuple[int, records.PublishRec]] = field(default_factory=list)  # an open transaction run


#: A row of the recovery table: ``route(position, record, scan, now)``.
Route = Callable[[int, Any, _Scan, float], None]


class PageFiles(Protocol):
    """The page files of the FileBackedMetadata queues, provided by the shell
    (:class:`conveyor.server.page_files.PageFiles`; rule 4): the engine does no I/O itself."""

    budget: PagingBudget  # shared by every FileBackedMetadata queue (queue/budget.py)

    def generations(self, queue: str) -> Collection[int]: ...
    def open(self, queue: str, generation: int, *, fresh: bool) -> PageFile: ...
    def prune(self, queue: str, *, keep: int | None = None, below: int | None = None) -> None: ...


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
    # Sequences skipped below each publisher's highest (publish_log rule 2).
    holes: dict[int, list[list[int]]] = field(default_factory=dict)
    # Named consumers: queue -> name -> its state (d, acked, epoch, token...), so a restart
    # does not need their records below the queues' recovery points.
    consumers: dict[str, dict[str, NamedConsumerState]] = field(default_factory=dict)
    # FileBackedMetadata: queue -> QueueSnapshot, each valid at its own positions;
    # recovery replays such a queue only from there.
    snapshots: dict[str, queue_snapshot.QueueSnapshot] = field(default_factory=dict)
    # Replication: source instance -> (its journal id, through): how far each source's
    # journal is recorded here (ReceivedRec), so links resume where the disk says.
    replication: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Replication: destination -> the position below which it had acknowledged everything,
    # so publishes it may lack stay unpersisted after a restart.
    links: dict[str, int] = field(default_factory=dict)
    # Replicated queues: queue -> ownership state (tombstones, transfers) the journal
    # above the queue's recovery point may not hold (engine/replication/ownership.py).
    ownership: dict[str, OwnershipState] = field(default_factory=dict)
    # State of the World: SOW topic (or "view:<name>", a view's journaled records) -> the
    # position its rebuild starts at (every record below it was replaced or deleted).
    sow: dict[str, int] = field(default_factory=dict)
    # Queue -> its creation point (rule 1); missing for a queue first seen now.
    created: dict[str, int] = field(default_factory=dict)


class Recovery:
    def __init__(self, journal: JournalPort, bindings: QueueBindings, publishes: PublishLog, delivery: QueueDelivery,
                 named: NamedConsumers, topics: Topics, replication: Replication, sow: StateOfTheWorld | None = None,
                 queues: ReplicatedQueues | None = None) -> None:
        self._sow = sow
        self._queues = queues  # the replicated queues, if any
        self._journal = journal
        self._bindings = bindings
        self._publishes = publishes
        self._delivery = delivery
        self._named = named
        self._topics = topics
        self._replication = replication
        self._persisted_end: int | None = None
        self._runs = PlainRuns()  # plain queues: a run of publishes enqueued in one pass
        self._created: dict[str, int] = {}  # rule 1: each configured queue's creation point
        self._deep: set[str] = set()  # replicated queues too deep to snapshot now
        self._routes = self._route_table()

    # --- checkpoints ------------------------------------------------------------------------

    def checkpoint(self, *, snapshots: bool = True) -> Checkpoint:
        end = self._journal.end
        first_unapplied = self._publishes.first_unapplied(end)
        queues = {}
        for b in self._bindings:
            point = b.queue.recovery_point()
            if point > b.queue.last_position:
                # Nothing pending: everything up to the end of the log is done, but not
                # past an unapplied publish (the scan must start on a record boundary).
                point = first_unapplied
            queues[b.name] = (point, b.config.recovery_point or "")
        taken = {
            b.name: self._snapshot(b, end, first_unapplied) for b in self._bindings if self._snapshots_taken(b)
        } if snapshots else {}
        return Checkpoint(position=end, queues=queues, publishers=self._publishes.sequences(),
                          holes=self._publishes.holes(),
                          consumers=self._named.export_state(), snapshots=taken,
                          replication=self._replication.sink.received(), links=self._replication.source.acknowledged(),
                          ownership=self._queues.export_state() if self._queues else {},
                          sow=self._sow.floors(first_unapplied) if self._sow is not None else {},
                          created={b.name: self._created.get(b.name, end) for b in self._bindings})

    def retention_floor(self, checkpoint: Checkpoint) -> int:
        """The lowest position anything still needs: queues, replays, named consumers,
        the checkpoint, and every replication destination (what it has not acknowledged
        is still to be sent from the journal: removing it would be a gap)."""
        lows = [checkpoint.position, *(p for p, _ in checkpoint.queues.values()), *checkpoint.sow.values(),
                *checkpoint.links.values()]
        for low in (self._topics.replay_floor(), self._named.floor()):
            if low is not None:
                lows.append(low)
        return min(lows)

    def _snapshots_taken(self, b: QueueBinding) -> bool:
        """False for a replicated queue above REPLICATED_SNAPSHOT_MESSAGES_MAX (said once
        each way in the log: the restart then replays more)."""
        over = b.ownership is not None and b.queue.replica.size > REPLICATED_SNAPSHOT_MESSAGES_MAX
        if over != (b.name in self._deep):
            if over:
                self._deep.add(b.name)
                log.info("queue %s holds %d messages, over %d: its last snapshot is kept, not retaken, until it "
                         "holds fewer", b.name, b.queue.replica.size, REPLICATED_SNAPSHOT_MESSAGES_MAX)
            else:
                self._deep.discard(b.name)
                log.info("queue %s: snapshots are taken again", b.name)
        return not over

    @staticmethod
    def _snapshot(b: QueueBinding, end: int, first_unapplied: int) -> queue_snapshot.QueueSnapshot:
        snap = b.queue.snapshot(events_from=end, publishes_from=first_unapplied)
        if b.ownership is not None:  # queue/snapshot.py rule 6
            snap = msgspec.structs.replace(snap, **b.ownership.snapshot_fields())
        return snap

    # --- recovery ----------------------------------------------------------------------------

    def recover(self, now: float, progress: Callable[[int], None] | None = None,
                checkpoint: Checkpoint | None = None, pages: PageFiles | None = None) -> int:
        """Rebuild state from the journal (rules 1-5); the number of records read."""
        journal = self._journal
        starts: dict[str, tuple[int, float | None]] = {}
        if checkpoint is not None:
            self._publishes.restore(checkpoint.publishers, checkpoint.holes)
            self._named.restore(checkpoint.consumers, checkpoint.position)
            for source, (journal_id, through) in checkpoint.replication.items():
                self._replication.sink.recovered(records.ReceivedRec(source, journal_id, through))
            self._replication.source.restore_acknowledged(checkpoint.links)
            if self._queues is not None:
                self._queues.restore(checkpoint.ownership, now)
        created = checkpoint.created if checkpoint is not None else {}
        self._created = {b.name: created.get(b.name, journal.durable_end) for b in self._bindings}
        for b in self._bindings:
            saved = checkpoint.queues.get(b.name) if checkpoint is not None else None
            if saved is not None and saved[1] == (b.config.recovery_point or ""):
                starts[b.name] = (saved[0], None)
            else:
                starts[b.name] = self._configured_start(b)
        self._restore_snapshots(checkpoint, pages, starts, now)
        first = journal.first_position
        scan_from = min([checkpoint.position if checkpoint is not None else 0, *(p for p, _ in starts.values())])
        sow = self._sow
        if sow is not None:
            sow.begin_recovery()
            floors = checkpoint.sow if checkpoint is not None else {}
            for name in sow.configured_floors():
                scan_from = min(scan_from, floors.get(name, 0))  # rule 6
        persisted_end = None
        if self._publishes.track_persisted:
            # Publishes a sync destination may lack must stay unpersisted (publish_log rule 4).
            persisted_end = self._replication.source.persisted_floor() or 0
            scan_from = min(scan_from, persisted_end)
        scan_from = max(scan_from, first)
        self._persisted_end = persisted_end
        points = {name: p for name, (p, _) in starts.items()}
        times = {name: t for name, (_, t) in starts.items() if t is not None}
        scan = _Scan(points, times)
        routes = self._routes
        count = 0
        plain_head, decode_plain, publish = records.PLAIN_PUBLISH_HEAD, records.decode_plain, self._publish
        for pos, payload in journal.scan(scan_from):
            count += 1
            if payload.startswith(plain_head) and not scan.run:
                # Most records: a plain publish (no transaction, expiry, origin or SowKey),
                # decoded as its own six fields only (records.PlainPublish), routed directly.
                publish(pos, decode_plain(payload), points, times, now)
            else:
                self._runs.flush_all()  # what a record of another kind may touch is in its queue
                rec = records.decode(payload)
                route = routes.get(type(rec))
                if route is None:
                    raise errors.JournalError(
                        f"journal record at {pos}: recovery has no route for {type(rec).__name__}")
                route(pos, rec, scan, now)
            if progress is not None and count % 10000 == 0:
                progress(count)
        self._runs.flush_all()
        if scan.run:
            head = scan.run[0][1]
            log.warning(
                "journal: transaction of publisher %d seq %d cut short by a crash (%d of %d records): "
                "truncated the journal at position %d", head.publisher, head.seq, len(scan.run), head.txn_total,
                scan.run[0][0],
            )
            journal.truncate(scan.run[0][0])
        self._publishes.applied_end = journal.durable_end
        for b in self._bindings:
            # Messages already at MaxCancels / MaxDeliveries expire now, journaled (rule 5).
            self._delivery.journal_events(b, b.queue.end_replay(now), now)
            b.refill(journal, now=now)
            self._delivery.mark(b)
        self._named.lease_after_restart(now)
        if sow is not None:
            sow.end_recovery(now)
        return count

    def _route_table(self) -> dict[type, Route]:
        """Rule 2: one row per record type. Built once; a record type with no row stops
        recovery (a new record that recovery forgot fails the simulations, it does not
        silently vanish after a restart). tests/engine/test_record_routes.py checks that
        every type of :data:`conveyor.records.Record` has a row."""
        table: dict[type, Route] = {
            records.PublishRec: self._publish_record,
            records.ReceivedRec: self._received_record,
            records.SowDeletedRec: self._sow_deleted_record,
        }
        table.update(dict.fromkeys(_OWNERSHIP_RECORDS, self._ownership_record))
        table.update(dict.fromkeys(CONSUMER_RECORDS, self._consumer_record))
        table.update(dict.fromkeys(queue_journal.QUEUE_RECORDS, self._queue_record))
        return table

    @property
    def routed(self) -> frozenset[type]:
        """The record types recovery has a row for."""
        return frozenset(self._routes)

    def _publish_record(self, pos: int, rec: records.PublishRec, scan: _Scan, now: float) -> None:
        """A publish, or a part of a transaction run (applied once whole: rule 3)."""
        run = scan.run
        if rec.txn_total:
            run.append((pos, rec))
            if rec.txn_index == rec.txn_total - 1:
                for p, r in run:
                    self._publish(p, r, scan.points, scan.times, now)
                run.clear()
            return
        if run:  # cannot happen (runs are contiguous): apply what there is
            log.error("journal: transaction run at %d interrupted at %d", run[0][0], pos)
            for p, r in run:
                self._publish(p, r, scan.points, scan.times, now)
            run.clear()
        self._publish(pos, rec, scan.points, scan.times, now)

    def _received_record(self, pos: int, rec: records.ReceivedRec, scan: _Scan, now: float) -> None:
        self._replication.sink.recovered(rec)

    def _ownership_record(self, pos: int, rec: OwnershipRecord, scan: _Scan, now: float) -> None:
        queues = self._queues
        if queues is not None and pos >= self._ownership_from(rec.queue, scan.points):
            queues.replay(rec, now)
            b = self._bindings.get(rec.queue)
            if b is not None and b.config.target_queue_depth is not None:
                b.refill(self._journal, upto=pos, now=now)  # a removal frees room, as live

    def _sow_deleted_record(self, pos: int, rec: records.SowDeletedRec, scan: _Scan, now: float) -> None:
        if self._sow is not None:
            self._sow.recovered(pos, rec, now)

    def _consumer_record(self, pos: int, rec: ConsumerRecord, scan: _Scan, now: float) -> None:
        self._named.replay(pos, rec, now, scan.points.get(rec.queue, 0), self._binding_since(rec.queue))

    def _ownership_from(self, queue: str, points: dict[str, int]) -> int:
        """Where a replicated queue's ownership records start to apply: after its
        snapshot, or from its recovery point."""
        since = self._binding_since(queue)
        return points.get(queue, 0) if since is None else since

    def _binding_since(self, queue: str) -> int | None:
        b = self._bindings.get(queue)
        return None if b is None else b.snapshot_events_from

    def _configured_start(self, binding: QueueBinding) -> tuple[int, float | None]:
        """Where a new (or re-pointed) queue starts: its RecoveryPoint, else the beginning."""
        text = binding.config.recovery_point
        if not text:
            return 0, None
        if text.lower() == "creation":
            return self._created[binding.name], None
        start = parse_replay_start(text)
        if start.after_position is not None:
            return self._journal.position_after(start.after_position), None
        if start.live_only:
            return self._journal.durable_end, None
        if start.at_time is not None:
            return 0, start.at_time
        return 0, None

    def _publish(self, pos: int, rec: records.PublishRec | records.PlainPublish, points: dict[str, int],
                 times: dict[str, float], now: float) -> None:
        self._publishes.recovered(pos, rec, self._persisted_end)
        sow = self._sow
        # Only a SOW topic's publish, or a view's output (it has a SowKey), is the SOW's.
        if sow is not None and (rec.sow_key or rec.topic in sow.topics):
            sow.recovered(pos, rec, now)
        for b in self._bindings.for_topic(rec.topic):
            if pos < points[b.name]:
                continue
            since = times.get(b.name)
            if since is not None and rec.timestamp < since:
                continue
            if b.plain:  # no filter, priority or barrier: enqueued with its queue's run
                if rec.expiration:
                    self._runs.flush(b)
                    b.queue.enqueue(pos, rec.timestamp, expires_at=rec.expiration)
                else:
                    self._runs.add(b, pos, rec.timestamp)
                continue
            b.offer(pos, Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id,
                               rec.expiration),
                    rec.origin)
        if rec.expired_queue is not None:
            # A dead letter carries the expiry that caused it (delivery rule 4).
            dead = self._bindings.get(rec.expired_queue)
            if dead is None:
                return
            self._runs.flush(dead)
            since = dead.snapshot_events_from
            if rec.expired_position >= points[dead.name] if since is None else pos >= since:
                dead.queue.replay.expired(rec.expired_position)
                if dead.config.target_queue_depth is not None:
                    dead.refill(self._journal, upto=pos, now=now)  # as after any queue record: room freed

    def _queue_record(self, pos: int, rec: queue_journal.QueueRec, scan: _Scan, now: float) -> None:
        points = scan.points
        b = self._bindings.get(rec.queue)
        if b is None:
            return  # a queue no longer configured
        if b.snapshot_events_from is not None:
            if pos < b.snapshot_events_from:
                return  # already in the snapshot
            queue_journal.replay(b.queue, rec, now)
        else:
            queue_journal.replay(b.queue, rec, now, points[b.name])
        if b.config.target_queue_depth is not None:
            b.refill(self._journal, upto=pos, now=now)

    # --- FileBackedMetadata (rule 4) -----------------------------------------------------------

    def _restore_snapshots(self, checkpoint: Checkpoint | None, pages: PageFiles | None,
                           starts: dict[str, tuple[int, float | None]], now: float) -> None:
        """Page the FileBackedMetadata queues (when ``pages`` is given) and load their
        snapshots; a queue with one starts its replay at the snapshot (``starts``)."""
        first = self._journal.first_position
        durable = self._journal.durable_end
        if pages is not None:
            pages.budget.clear()  # this engine's queues only (an earlier one in this process is gone)
        for b in self._bindings:
            name = b.name
            snap = checkpoint.snapshots.get(name) if checkpoint is not None else None
            if snap is not None and not (first <= snap.publishes_from <= snap.events_from <= durable):
                log.warning("queue %s: snapshot outside the journal: replaying from the recovery point", name)
                snap = None
            if snap is not None and snap.replicated != (b.ownership is not None):
                log.warning("queue %s: ignoring its snapshot (taken while the queue was%s replicated): replaying "
                            "from the recovery point", name, "" if snap.replicated else " not")
                snap = None
            file = None
            if pages is not None and b.config.file_backed_metadata:
                existing = pages.generations(name)
                if snap is not None and snap.page_file is not None and snap.page_file in existing:
                    file = pages.open(name, snap.page_file, fresh=False)
                else:
                    file = pages.open(name, max(existing, default=-1) + 1, fresh=True)
            if snap is not None:
                try:
                    queue_snapshot.check(snap, b.config, file)
                except queue_snapshot.SnapshotInvalid as exc:
                    log.warning("queue %s: ignoring its snapshot (%s): replaying from the recovery point", name, exc)
                    snap = None
                    if file is not None and file.size:
                        assert pages is not None  # a file comes from pages
                        file.close()
                        file = pages.open(name, max(pages.generations(name)) + 1, fresh=True)
            if file is not None:
                assert pages is not None  # a file comes from pages
                pages.prune(name, keep=file.generation)
                b.queue.page_to(file, budget=pages.budget)  # one budget for every paged queue
            if snap is not None:
                b.queue.restore_snapshot(snap)
                if b.ownership is not None:
                    b.ownership.restore_snapshot(snap, now)
                starts[name] = (snap.publishes_from, None)
                b.snapshot_events_from = snap.events_from
