"""Engine part: FileBackedMetadata (spec 000; reference.md A.2): paging and snapshots.

With ``FileBackedMetadata`` enabled, a FIFO queue keeps its available messages in a paged
store (:mod:`conveyor.engine.queue_paging`: memory bounded whatever the depth) and every
checkpoint carries a snapshot of its state (:mod:`conveyor.engine.queue_snapshot`), so a
restart replays the journal only after the snapshot. A mixin of
:class:`conveyor.engine.recovery.Recovery`. Rules:

1. Paging needs page files (``recover(pages=...)``: a
   :class:`conveyor.server.page_files.PageFiles` over ``<JournalDirectory>/queues``). Without one, FileBackedMetadata queues stay in memory
   and their snapshots hold every chunk inline (the engine tests' case).
2. A snapshot is used only if it lies inside the durable journal, names a page file
   that exists, matches the queue's configuration and checks (queue_snapshot rule 4).
   Otherwise the queue replays from its recovery point, which is always correct.
3. At startup every page file generation of the queue but the one in use is deleted;
   the checkpoint writer deletes older generations once a snapshot naming a newer one
   is durable.
"""

from __future__ import annotations

import logging

from conveyor.engine import queue_snapshot

log = logging.getLogger("conveyor.engine")
class SnapshotRecovery:
    """FileBackedMetadata (queue_paging, queue_snapshot): paging set-up, snapshots taken
    at checkpoints and restored by :meth:`Recovery.recover`."""

    _snapshot_events: dict[str, int] = {}  # queue -> events_from of its restored snapshot

    def _queue_snapshots(self, end: int) -> dict:
        """Every FileBackedMetadata queue's state at this checkpoint (queue_snapshot rule 1:
        events below ``end``, publishes below the first one not yet applied)."""
        publishes_from = self._pending[0][0] if self._pending else end
        return {
            name: q.snapshot(events_from=end, publishes_from=publishes_from)
            for name, q in self.queues.items()
            if queue_snapshot.supported(q.config)
        }

    def _restore_snapshots(self, checkpoint, pages, starts: dict) -> None:
        """Page the FileBackedMetadata queues (when ``pages`` is given) and load their
        snapshots; a queue with one starts its replay at the snapshot (``starts``)."""
        self._snapshot_events = {}
        first = getattr(self.journal, "first_position", 0)
        durable = self.journal.durable_end
        for name, queue in self.queues.items():
            if not queue_snapshot.supported(queue.config):
                continue
            snap = checkpoint.snapshots.get(name) if checkpoint is not None else None
            if snap is not None and not (first <= snap.publishes_from <= snap.events_from <= durable):
                log.warning("queue %s: snapshot outside the journal: replaying from the recovery point", name)
                snap = None
            file = None
            if pages is not None:
                existing = pages.generations(name)
                if snap is not None and snap.page_file in existing:
                    file = pages.open(name, snap.page_file, fresh=False)
                else:
                    file = pages.open(name, max(existing, default=-1) + 1, fresh=True)
            if snap is not None:
                try:
                    queue_snapshot.check(snap, queue.config, file)
                except queue_snapshot.SnapshotInvalid as exc:
                    log.warning("queue %s: ignoring its snapshot (%s): replaying from the recovery point", name, exc)
                    snap = None
                    if file is not None and file.size:
                        file.close()
                        file = pages.open(name, max(pages.generations(name)) + 1, fresh=True)
            if file is not None:
                pages.prune(name, keep=file.generation)
                queue.page_to(file)
            if snap is not None:
                queue.restore_snapshot(snap)
                starts[name] = (snap.publishes_from, None)
                self._snapshot_events[name] = snap.events_from

