"""The publish bookkeeping: sequence numbers, publishes not yet durable, fingerprints.

Every path that records a message (a client's publish, a committed transaction, a
dead letter, recovery) goes through here, so none can forget the duplicate-detection
bookkeeping. Rules:

1. **Duplicates** (spec 002): a publisher's sequence must rise. :meth:`is_duplicate`
   says whether ``seq`` is at or below the highest recorded; :meth:`append` records the
   new highest. Publishes with no sequence get the server's next one for that publisher
   (:meth:`next_seq`).
2. **Read-committed.** :meth:`append` puts the record in the journal's buffer and keeps a
   :class:`PendingPublish`; the engine applies it (fan-out, queues) only once durable
   (:meth:`take_durable`). The journal is the only copy of the payload afterwards.
3. ``applied_end`` is the end of the last applied publish: bookmark replays read the
   journal up to it, and live delivery takes over from there.
4. Checkpoints carry :meth:`sequences` so duplicate detection survives retention
   removing old segments; recovery restores them (:meth:`restore`) and then notes every
   publish it replays (:meth:`recovered`).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator

import msgspec

from conveyor import records
from conveyor.engine.fingerprints import FingerprintWindow

_encode_publish = records.encode_publish


class PendingPublish(msgspec.Struct, frozen=True, gc=False):
    """A publish appended to the journal and not yet applied (durable)."""

    position: int
    end: int  # the journal position after its record
    topic: str
    publisher: int
    seq: int
    timestamp: float
    data: bytes
    correlation_id: str | None


class PublishLog:
    def __init__(self, journal: Any, transaction_log: Any) -> None:
        self._journal = journal
        self._tlog = transaction_log
        self._highest: dict[int, int] = {}
        self._recorded: dict[str, bool] = {}
        self.pending: deque[PendingPublish] = deque()
        self.fingerprints = FingerprintWindow()
        self.applied_end: int = getattr(journal, "first_position", 0)

    # --- what is recorded -------------------------------------------------------------

    def recorded(self, topic: str) -> bool:
        """Whether publishes to ``topic`` are recorded in the transaction log."""
        hit = self._recorded.get(topic)
        if hit is None:
            hit = self._tlog is not None and self._tlog.records(topic)
            self._recorded[topic] = hit
        return hit

    # --- sequences (rule 1) -----------------------------------------------------------

    def highest_seq(self, publisher: int) -> int:
        return self._highest.get(publisher, 0)

    def is_duplicate(self, publisher: int, seq: int) -> bool:
        return seq <= self._highest.get(publisher, 0)

    def next_seq(self, publisher: int) -> int:
        return self._highest.get(publisher, 0) + 1

    def knows(self, publisher: int) -> bool:
        return publisher in self._highest

    def sequences(self) -> dict[int, int]:
        """The highest sequence per publisher (a copy, for the checkpoint)."""
        return dict(self._highest)

    @property
    def publishers(self) -> int:
        return len(self._highest)

    # --- appending (rule 2) -------------------------------------------------------------

    def append(
        self, topic: str, publisher: int, seq: int, now: float, data: bytes,
        correlation_id: str | None, fingerprint: int | None = None,
    ) -> int:
        """Journal a publish (``seq`` already checked); its position."""
        journal = self._journal
        if fingerprint is None:
            position = journal.append(_encode_publish(topic, publisher, seq, now, data, correlation_id))
        else:
            self.fingerprints.note(publisher, seq, fingerprint)
            rec = records.PublishRec(topic, publisher, seq, now, data, correlation_id, fingerprint=fingerprint)
            position = journal.append(records.encode(rec))
        self._highest[publisher] = seq
        self.pending.append(PendingPublish(position, journal.end, topic, publisher, seq, now, data, correlation_id))
        return position

    def append_record(self, rec: records.PublishRec) -> int:
        """Journal a publish record with fields of its own (dead letters, transactions)."""
        journal = self._journal
        position = journal.append(records.encode(rec))
        if rec.seq > self._highest.get(rec.publisher, 0):
            self._highest[rec.publisher] = rec.seq
        self.pending.append(
            PendingPublish(position, journal.end, rec.topic, rec.publisher, rec.seq, rec.timestamp, rec.data,
                           rec.correlation_id)
        )
        return position

    def take_durable(self) -> Iterator[PendingPublish]:
        """The pending publishes now durable, in journal order (each marks itself applied)."""
        end = self._journal.durable_end
        pending = self.pending
        while pending and pending[0].position < end:
            p = pending.popleft()
            self.applied_end = p.end
            yield p

    def first_unapplied(self, default: int) -> int:
        """The position of the first publish not yet applied, else ``default``."""
        return self.pending[0].position if self.pending else default

    # --- recovery (rule 4) ----------------------------------------------------------------

    def restore(self, sequences: dict[int, int]) -> None:
        self._highest.update(sequences)

    def recovered(self, rec: records.PublishRec) -> None:
        if rec.seq > self._highest.get(rec.publisher, 0):
            self._highest[rec.publisher] = rec.seq
        if rec.fingerprint:
            self.fingerprints.note(rec.publisher, rec.seq, rec.fingerprint)
