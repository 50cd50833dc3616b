"""The publish bookkeeping: sequence numbers, publishes not yet durable, fingerprints.

Every path that records a message (a client's publish, a committed transaction, a
dead letter, recovery) goes through here, so none can forget the duplicate-detection
bookkeeping. Rules:

1. **Duplicates** (spec 002): a publisher's sequence must rise. :meth:`is_duplicate`
   says whether ``seq`` is at or below the highest recorded; :meth:`append` records the
   new highest. Publishes with no sequence get the server's next one for that publisher
   (:meth:`next_seq`).
2. **Holes.** Sequences skipped below the highest (a publisher's publishes to topics
   that are not recorded, or, with replication, messages still on their way from
   another instance after the publisher failed over) are kept as holes, at most
   :data:`HOLES_PER_PUBLISHER_MAX` per publisher (the oldest are forgotten first). A
   message that arrives by replication is recorded exactly when it is new:
   above the highest, or in a hole (:meth:`is_recorded`). A client's own publishes keep
   the rule of spec 002 (at or below the highest is a duplicate).
3. **Read-committed.** :meth:`append` puts the record in the journal's buffer and keeps a
   :class:`PendingPublish`; the engine applies it (fan-out, queues) only once durable
   (:meth:`take_durable`). The journal is the only copy of the payload afterwards.
4. **Persisted** means durable here and on every sync replication destination. A
   publisher that logs on is told both its highest sequence (to number what it
   publishes next) and the highest it can forget (:meth:`persisted_seq`): below the
   first of its publishes not yet persisted and below its first hole, so a publish store
   never drops a message a crash could still take, or one that is still on its way
   from another instance. The publishes not yet persisted are kept as notes of runs:
   one publisher's publishes share a note (up to :data:`UNPERSISTED_RUN_MAX` of them,
   interleaved with other publishers' or not), which holds the run's lowest sequence
   and is dropped once the whole run is persisted, notes in the order they were opened;
   until then the publisher is told the run's start, a little lower than exact, never
   higher. So a sync destination that is down costs the source one note per run, not
   one per publish.
5. ``applied_end`` is the end of the last applied publish: bookmark replays read the
   journal up to it, and live delivery takes over from there.
6. Checkpoints carry :meth:`sequences` and :meth:`holes` so duplicate detection
   survives retention removing old segments; recovery restores them (:meth:`restore`)
   and then notes every publish it replays (:meth:`recovered`).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterator

from conveyor import records
from conveyor.config.model import TransactionLog
from conveyor.engine.fingerprints import FingerprintWindow
from conveyor.engine.ports import JournalPort
from conveyor.engine.routes import RouteCache
from conveyor.records.plain import encode_publish


#: Holes kept per publisher (rule 2); 16 bytes each. Past it the oldest hole is
#: forgotten: a message of it that arrives by replication much later counts as a duplicate.
HOLES_PER_PUBLISHER_MAX = 1024
#: Consecutive unpersisted publishes of one publisher that share one note (rule 4): the
#: memory a down sync destination costs is divided by up to this; a logon's persisted
#: sequence may be up to this many publishes lower than exact.
UNPERSISTED_RUN_MAX = 1024


class PendingPublish:
    """A publish appended to the journal and not yet applied (durable); never changed
    once made. A class of the compiled group, not a msgspec Struct: the engine reads
    about a dozen of its fields per message, and compiled code reads a native class's
    field directly where a Struct's goes through Python's attribute lookup."""

    __slots__ = ("position", "end", "topic", "publisher", "seq", "timestamp", "data", "correlation_id", "origin",
                 "expiration", "sow_key")

    def __init__(self, position: int, end: int, topic: str, publisher: int, seq: int, timestamp: float,
                 data: bytes, correlation_id: str | None, origin: str = "", expiration: float = 0.0,
                 sow_key: str = "") -> None:
        self.position = position
        self.end = end  # the journal position after its record
        self.topic = topic
        self.publisher = publisher
        self.seq = seq
        self.timestamp = timestamp
        self.data = data
        self.correlation_id = correlation_id
        self.origin = origin  # the instance it was first recorded at ("": here)
        self.expiration = expiration  # absolute expiry stamped by a SOW topic (0: none)
        self.sow_key = sow_key  # its SowKey on a SOW topic


class PublishLog:
    def __init__(self, journal: JournalPort, transaction_log: TransactionLog | None, *,
                 track_persisted: bool = False) -> None:
        """``track_persisted``: some destination is sync, so a publish is persisted only
        once that destination holds it too (rule 4)."""
        self._journal = journal
        self._tlog = transaction_log
        self._highest: dict[int, int] = {}
        self._holes: dict[int, list[list[int]]] = {}  # publisher -> sorted [lo, hi] ranges (rule 2)
        self._recorded: RouteCache[bool] = RouteCache()  # topic -> recorded (bounded: routes.py)
        self._json: RouteCache[bool] = RouteCache()  # topic -> recorded with MessageType json (bounded)
        self.pending: deque[PendingPublish] = deque()
        # Durable, not yet persisted (rule 4): (position, publisher, seq), kept only when
        # sync destinations exist.
        # Rule 4: [last position, publisher, lowest sequence, publishes] per run, in the
        # order the runs were opened; each publisher's run that still takes publishes.
        self._unpersisted: deque[list[int]] = deque()
        self._open_runs: dict[int, list[int]] = {}
        self.track_persisted = track_persisted
        self.fingerprints = FingerprintWindow()
        self.applied_end: int = journal.first_position

    # --- what is recorded -------------------------------------------------------------

    def takes_json(self, topic: str) -> bool:
        """Whether ``topic`` is recorded with MessageType json (its first matching
        TransactionLog Topic): its publishes must be JSON."""
        hit = self._json.get(topic)
        if hit is None:
            tlog = self._tlog
            first = next((t for t in tlog.topics if t.matches(topic)), None) if tlog is not None else None
            hit = self._json.put(topic, first is not None and first.message_type.lower() == "json")
        return hit

    def recorded(self, topic: str) -> bool:
        """Whether publishes to ``topic`` are recorded in the transaction log."""
        hit = self._recorded.get(topic)
        if hit is None:
            hit = self._recorded.put(topic, self._tlog is not None and self._tlog.records(topic))
        return hit

    # --- sequences (rule 1) -----------------------------------------------------------

    def highest_seq(self, publisher: int) -> int:
        return self._highest.get(publisher, 0)

    def is_duplicate(self, publisher: int, seq: int) -> bool:
        return seq <= self._highest.get(publisher, 0)

    def next_seq(self, publisher: int) -> int:
        return self._highest.get(publisher, 0) + 1

    def is_recorded(self, publisher: int, seq: int) -> bool:
        """Whether message ``(publisher, seq)`` is recorded here (rule 2)."""
        if seq > self._highest.get(publisher, 0):
            return False
        holes = self._holes.get(publisher)
        return not holes or not any(lo <= seq <= hi for lo, hi in holes)

    def _note(self, publisher: int, seq: int) -> None:
        """``seq`` is recorded now: move the highest, or fill a hole."""
        highest = self._highest.get(publisher, 0)
        holes: list[list[int]] | None
        if seq > highest:
            if seq > highest + 1:
                holes = self._holes.setdefault(publisher, [])
                holes.append([highest + 1, seq - 1])
                if len(holes) > HOLES_PER_PUBLISHER_MAX:
                    del holes[0]
            self._highest[publisher] = seq
            return
        holes = self._holes.get(publisher)
        if not holes:
            return
        for i, (lo, hi) in enumerate(holes):
            if lo <= seq <= hi:
                pieces = [r for r in ([lo, seq - 1], [seq + 1, hi]) if r[0] <= r[1]]
                holes[i : i + 1] = pieces
                if not holes:
                    del self._holes[publisher]
                return

    def holes(self) -> dict[int, list[list[int]]]:
        """The holes per publisher (a copy, for the checkpoint)."""
        return {pub: [list(r) for r in ranges] for pub, ranges in self._holes.items()}

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
        correlation_id: str | None, fingerprint: int | None = None, expiration: float = 0.0,
    ) -> int:
        """Journal a publish (``seq`` already checked); its position. ``expiration``: the
        absolute time the message expires (0: never), from the publish's ``e``."""
        journal = self._journal
        if fingerprint is None and not expiration:
            position = journal.append(encode_publish(topic, publisher, seq, now, data, correlation_id))
        else:
            if fingerprint is not None:
                self.fingerprints.note(publisher, seq, fingerprint)
            rec = records.PublishRec(topic, publisher, seq, now, data, correlation_id, fingerprint=fingerprint or 0,
                                     expiration=expiration)
            position = journal.append(records.encode(rec))
        if seq == self._highest.get(publisher, 0) + 1:
            self._highest[publisher] = seq  # the usual case: in order
        else:
            self._note(publisher, seq)
        self.pending.append(PendingPublish(position, journal.end, topic, publisher, seq, now, data, correlation_id,
                                           "", expiration))
        return position

    def append_sow(self, topic: str, publisher: int, seq: int, now: float, data: bytes, correlation_id: str | None,
                   expiration: float, sow_key: str) -> int:
        """Journal a publish to a SOW topic (``seq`` already checked): its SowKey and
        expiry stamp travel in the record."""
        journal = self._journal
        position = journal.append(records.encode_sow_publish(topic, publisher, seq, now, data, correlation_id,
                                                              expiration, sow_key))
        self._note(publisher, seq)
        self.pending.append(PendingPublish(position, journal.end, topic, publisher, seq, now, data, correlation_id,
                                           "", expiration, sow_key))
        return position

    def append_record(self, rec: records.PublishRec) -> int:
        """Journal a publish record with fields of its own (dead letters, transactions)."""
        return self.append_encoded(rec, records.encode(rec), rec.origin)

    def append_encoded(self, rec: records.PublishRec | records.PlainPublish, payload: bytes, origin: str) -> int:
        """Journal publish ``rec`` as ``payload``, its record as kept here, first recorded
        at ``origin`` ("": here). A replica passes the bytes records.Arrival built and
        the origin they name."""
        journal = self._journal
        position = journal.append(payload)
        publisher, seq = rec.publisher, rec.seq
        if seq == self._highest.get(publisher, 0) + 1:
            self._highest[publisher] = seq  # the usual case: in order
        else:
            self._note(publisher, seq)
        self.pending.append(
            PendingPublish(position, journal.end, rec.topic, publisher, seq, rec.timestamp, rec.data,
                           rec.correlation_id, origin, rec.expiration, rec.sow_key)
        )
        return position

    def append_arrived(self, recs: list[records.PlainPublish], payloads: list[bytes], arrival: records.Arrival,
                       duplicate: Callable[[records.PlainPublish], None]) -> int:
        """Journal publishes that each stand alone and came from one place, as
        ``arrival`` encodes them, unless recorded here already (rule 2: those go to
        ``duplicate``); how many were journaled. A replica's hot path: the usual
        publishes, new and in sequence, go to the journal in one call."""
        highest = self._highest
        tops: dict[int, int] = {}  # the highest sequence per publisher with the run counted
        start = 0  # recs[start:i] are new and in sequence: the run being gathered
        journaled = 0
        for i, rec in enumerate(recs):
            publisher, seq = rec.publisher, rec.seq
            top = tops.get(publisher)
            if seq == (highest.get(publisher, 0) if top is None else top) + 1:
                tops[publisher] = seq
                continue
            if i > start:  # out of sequence: what came before goes first, then the full check
                journaled += self._append_run(recs[start:i], payloads[start:i], tops, arrival)
                tops = {}
            start = i + 1
            if self.is_recorded(publisher, seq):
                duplicate(rec)
                continue
            self.append_encoded(rec, arrival.encode(payloads[i], rec), arrival.origin)
            journaled += 1
        if start < len(recs):
            journaled += self._append_run(recs[start:], payloads[start:], tops, arrival)
        return journaled

    def _append_run(self, run: list[records.PlainPublish], payloads: list[bytes], tops: dict[int, int],
                    arrival: records.Arrival) -> int:
        """Journal a run of new publishes, then count them recorded (nothing is noted
        when the journal refuses the run)."""
        journal = self._journal
        positions = journal.append_many(arrival.encode_many(payloads, run))
        self._highest.update(tops)
        ends = positions[1:]
        ends.append(journal.end)
        origin = arrival.origin
        self.pending.extend([
            PendingPublish(position, end, rec.topic, rec.publisher, rec.seq, rec.timestamp, rec.data,
                           rec.correlation_id, origin, rec.expiration, rec.sow_key)
            for position, end, rec in zip(positions, ends, run)
        ])
        return len(run)

    def append_txn(self, rows: list[tuple[str, bytes]], publisher: int, seq: int, now: float) -> None:
        """Journal a committed transaction's rows (``seq`` already checked) as one
        contiguous run of publish records, ``txn_index`` 0..n-1 of ``txn_total`` n, in one
        journal call (nothing is noted when the journal refuses the run)."""
        n = len(rows)
        if not n:
            return
        encode = records.encode_txn_publish
        journal = self._journal
        positions = journal.append_many([encode(topic, publisher, seq, now, data, i, n)
                                         for i, (topic, data) in enumerate(rows)])
        self._note(publisher, seq)
        ends = positions[1:]
        ends.append(journal.end)
        self.pending.extend([
            PendingPublish(position, end, topic, publisher, seq, now, data, None, "", 0.0, "")
            for position, end, (topic, data) in zip(positions, ends, rows)
        ])

    def pending_position(self, publisher: int, seq: int) -> int | None:
        """The position of a publish journaled but not yet applied (None: not pending).
        A scan, newest first: for a record of the same replicated batch that names it."""
        for p in reversed(self.pending):
            if p.seq == seq and p.publisher == publisher:
                return p.position
        return None

    def take_durable(self) -> Iterator[PendingPublish]:
        """The pending publishes now durable, in journal order (each marks itself applied)."""
        end = self._journal.durable_end
        pending = self.pending
        track = self.track_persisted
        while pending and pending[0].position < end:
            p = pending.popleft()
            self.applied_end = p.end
            if track:
                self._note_unpersisted(p.position, p.publisher, p.seq)
            yield p

    def persisted(self, end: int) -> None:
        """Every record below ``end`` is persisted (rule 4)."""
        unpersisted, open_runs = self._unpersisted, self._open_runs
        while unpersisted and unpersisted[0][0] < end:
            run = unpersisted.popleft()
            if open_runs.get(run[1]) is run:
                del open_runs[run[1]]

    def _note_unpersisted(self, position: int, publisher: int, seq: int) -> None:
        """Rule 4: the publish extends its publisher's open run, or opens one."""
        run = self._open_runs.get(publisher)
        if run is not None and run[3] < UNPERSISTED_RUN_MAX:
            run[0] = position
            if seq < run[2]:
                run[2] = seq
            run[3] += 1
            return
        run = self._open_runs[publisher] = [position, publisher, seq, 1]
        self._unpersisted.append(run)

    @property
    def unpersisted_notes(self) -> int:
        """Notes kept for publishes not yet persisted (rule 4): what a lagging sync
        destination costs here."""
        return len(self._unpersisted)

    def persisted_seq(self, publisher: int) -> int:
        """The highest sequence of ``publisher`` below its first publish that is not yet
        persisted (rule 4). O(publishes in flight): called at logon only."""
        highest = self._highest.get(publisher, 0)
        waiting = [seq for _, pub, seq, _ in self._unpersisted if pub == publisher]
        waiting += [p.seq for p in self.pending if p.publisher == publisher]
        holes = self._holes.get(publisher)
        if holes:
            waiting.append(holes[0][0])  # not here at all (rule 2)
        return min(highest, min(waiting) - 1) if waiting else highest

    def first_unapplied(self, default: int) -> int:
        """The position of the first publish not yet applied, else ``default``."""
        return self.pending[0].position if self.pending else default

    # --- recovery (rule 4) ----------------------------------------------------------------

    def restore(self, sequences: dict[int, int], holes: dict[int, list[list[int]]] | None = None) -> None:
        self._highest.update(sequences)
        for pub, ranges in (holes or {}).items():
            self._holes[pub] = [list(r) for r in ranges]

    def recovered(self, position: int, rec: records.PublishRec | records.PlainPublish,
                  persisted_end: int | None) -> None:
        """A publish replayed by recovery; ``persisted_end``: where persistence was at the
        last checkpoint (None: no sync destinations)."""
        self._note(rec.publisher, rec.seq)
        if persisted_end is not None and position >= persisted_end:
            self._note_unpersisted(position, rec.publisher, rec.seq)
        if rec.fingerprint:
            self.fingerprints.note(rec.publisher, rec.seq, rec.fingerprint)
