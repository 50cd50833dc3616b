"""The destination side of replication (package rules 2, 3 and 5-8 incoming): one
:class:`~conveyor.engine.replication.links.InLink` per connected source; each record
recorded once (duplicate detection by ``(publisher, seq)``), the replicated queues',
named consumers' and SOW records applied, ``ReceivedRec`` markers, and acknowledgements
once durable. Kept apart from the source side, which shares nothing with it but the
journal and the profile."""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import msgspec

from conveyor import errors, records
from conveyor.config.model import Config
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort, QueueRecord, ReplicaConsumers, ReplicaQueues, ReplicaSow
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.replication.checks import check_pair
from conveyor.engine.replication.route import came_back
from conveyor.engine.replication.source import OwnershipRecord
from conveyor.engine.rows import InLinkStats
from conveyor.protocol import replication as p

if TYPE_CHECKING:
    from conveyor.engine.replication.links import PeerLinks

log = logging.getLogger("conveyor.replication")

#: Batches of duplicates only still leave a marker this often, so a reconnect does not
#: resend a long stretch the destination already holds.
MARK_STRIDE_BYTES = 1024 * 1024


class SourceState:
    """What this instance holds of one source's journal, whether connected or not."""

    def __init__(self, journal_id: str, through: int) -> None:
        self.journal_id = journal_id
        self.durable_through = through  # everything needed below it is durable here
        self.received_through = through  # ... or at least recorded (in the journal's buffer)
        self.marked_through = through  # the through of the last ReceivedRec written
        self.pending: deque[tuple[int, int]] = deque()  # (journal end to be durable, through)


class InLink:
    """The destination side of one connected source."""

    def __init__(self, conn_id: int, profile: p.Profile, source: SourceState) -> None:
        self.conn_id = conn_id
        self.profile = profile
        self.source = source
        self.records_received = 0
        self.records_recorded = 0
        self.gaps = 0
        # How the source's own publishes are journaled here (rule 2).
        self.arrival = records.Arrival(profile.instance, profile.group, [profile.instance])
        # This instance waits for the source to catch it up (catch_up.py): the stream's
        # progress is reported until it has.
        self.catching_up = False



#: A row of the receive table: ``record(record, source profile, now)`` -> records journaled.
Receive = Callable[[Any, p.Profile, float], int]
#: A record that travels with where it was first recorded and the instances it passed
#: (rules 5-8), as it arrives from another instance.
_Travelling = TypeVar("_Travelling", bound=OwnershipRecord | records.SowDeletedRec)


class ReplicationSink:
    def __init__(self, config: Config, journal: JournalPort, publishes: PublishLog, outbox: Outbox, peers: PeerLinks,
                 profile: p.Profile, *, queues: ReplicaQueues | None, sow: ReplicaSow | None,
                 consumers: ReplicaConsumers | None) -> None:
        """``queues``: the replicated queues (None: none here, rule 6); ``sow``: the State
        of the World (rule 8); ``consumers``: the named consumers (rule 7)."""
        self.instance = config.name
        self._journal = journal
        self._publishes = publishes
        self._outbox = outbox
        self._profile = profile
        self._peers = peers
        self._incoming = peers.incoming
        # source instance -> what this instance holds of its journal (rule 2)
        self._sources: dict[str, SourceState] = {}
        self.queues = queues
        self.sow = sow
        self.consumers = consumers
        self._receive = self._receive_table()

    @property
    def routed(self) -> frozenset[type]:
        """The record types (other than a publish) with a row in the receive table."""
        return frozenset(self._receive)

    def accept(self, conn_id: int, hello: p.Hello, now: float) -> p.Welcome:
        """A source connected: check the rules (raises ReplicationRefused) and say where
        to resume."""
        src = hello.profile
        problems = []
        if src.version > p.PROTOCOL_VERSION:
            problems.append(f"instance {src.instance!r} speaks replication version {src.version}, "
                            f"this instance {p.PROTOCOL_VERSION}")
        if src.instance == self.instance:
            problems.append(f"instance {src.instance!r} replicates to itself")
        # Every rule the source checks, checked here too: a destination refuses a link
        # that would bring it messages of a replicated queue its source lacks or defines
        # otherwise (docs/replication.md, "Validation").
        problems += check_pair(self._profile, src, incoming=True)
        if problems:
            raise errors.ReplicationRefused("; ".join(problems))
        for other in self._incoming.values():
            if other.profile.instance == src.instance:
                raise errors.ReplicationRefused(f"instance {src.instance!r} is already connected")
        state = self._sources.get(src.instance)
        if state is None or state.journal_id != src.journal_id:
            if state is not None:
                log.warning("replication from %s: its journal is new (%s, was %s): taking it from the start",
                            src.instance, src.journal_id, state.journal_id)
            state = self._sources[src.instance] = SourceState(src.journal_id, 0)
        # Resume from what is durable: a batch received but not yet fsynced could be lost.
        state.received_through = state.durable_through
        link = InLink(conn_id, src, state)
        self._incoming[conn_id] = link
        log.info("replication from %s (group %s): resuming at its position %d", src.instance, src.group,
                 state.durable_through)
        link.catching_up = self._peers.catch_up.link_up(src.instance, hello.journal_end, state.durable_through, now)
        return p.Welcome(profile=self._profile, resume_from=state.durable_through)

    def closed(self, conn_id: int) -> None:
        link = self._incoming.pop(conn_id, None)
        if link is not None:
            log.warning("replication from %s: link closed", link.profile.instance)

    def receive(self, conn_id: int, batch: p.Batch, now: float) -> None:
        """Record a batch (rule 2), then acknowledge it once durable (rule 3)."""
        link = self._incoming.get(conn_id)
        if link is None:
            raise errors.ProtocolError("a replication batch before the handshake")
        src = link.profile
        if batch.reach:
            self._peers.learn(batch.reach)
            self._peers.announce(self._outbox, now)
        if batch.gap_from >= 0:
            link.gaps += 1
            log.error("replication from %s: GAP: its records [%d, %d) were removed before they reached this "
                      "instance", src.instance, batch.gap_from, batch.gap_to)
        run: list[tuple[records.PublishRec, bytes]] = []
        plain: list[records.PlainPublish] = []  # consecutive publishes made at the source, each on its own
        plain_bytes: list[bytes] = []
        received = recorded = 0
        decode, decode_plain, plain_head = records.decode, records.decode_plain, records.PLAIN_PUBLISH_HEAD
        for payload in batch.records:
            if payload.startswith(plain_head):  # a publish made at the source, on its own
                plain.append(decode_plain(payload))  # recorded together, before any other kind of record
                plain_bytes.append(payload)
                continue
            rec = decode(payload)
            t = type(rec)
            if plain:
                received += len(plain)
                recorded += self._record_plain(plain, plain_bytes, link, now)
                plain, plain_bytes = [], []
            if t is records.PublishRec:
                received += 1
                if not rec.txn_total:
                    recorded += self._record_publish(rec, payload, link, now)
                    continue
                run.append((rec, payload))
                if rec.txn_index == rec.txn_total - 1:
                    recorded += self._record_run(run, link, now)
                    run = []
            else:
                record = self._receive.get(t)
                if record is None:
                    raise errors.ProtocolError(f"replication from {src.instance}: a {t.__name__} is not replicated")
                received += 1
                recorded += record(rec, src, now)
        if plain:
            received += len(plain)
            recorded += self._record_plain(plain, plain_bytes, link, now)
        link.records_received += received
        link.records_recorded += recorded
        state = link.source
        if batch.through > state.received_through:
            state.received_through = batch.through
            if recorded or (batch.records and batch.through - state.marked_through >= MARK_STRIDE_BYTES):
                # Only when something was recorded (or much was skipped as duplicates): a
                # marker for a batch with nothing new would itself be a new record, which
                # the other direction of a two-way link would answer with a batch...
                self._journal.append(records.encode(records.ReceivedRec(src.instance, src.journal_id, batch.through)))
                state.marked_through = batch.through
        state.pending.append((self._journal.end, state.received_through))
        self._acknowledge(state, link)
        if link.catching_up and self._peers.catch_up.progress(src.instance, state.received_through, now):
            link.catching_up = False

    def _arrived(self, rec: _Travelling, src: p.Profile) -> _Travelling | None:
        """A record other than a publish as it is kept here: with its origin and path;
        None when it has been here before (rule 5)."""
        origin = rec.origin or src.instance
        if came_back(self.instance, origin, rec.path):
            return None
        path = [*rec.path, src.instance] if rec.origin else [src.instance]
        return msgspec.structs.replace(rec, origin=origin, origin_group=rec.origin_group or src.group, path=path)

    def _record_queue_record(self, rec: QueueRecord, src: p.Profile, now: float) -> int:
        """A replicated queue's record (rule 6): applied, and journaled when it changed
        something here or must travel on."""
        kept = self._arrived(rec, src)
        if kept is not None and self.queues is not None:
            kept = self.queues.received(kept, now)
        if kept is None:
            return 0
        self._journal.append(records.encode(kept))
        return 1

    def _receive_table(self) -> dict[type, Receive]:
        """How each kind of record (other than a publish) is recorded here when it arrives
        (rules 6-8); a type with no row is a protocol error of the peer."""
        return {
            records.QueueRemovedRec: self._record_queue_record,
            records.TransferRequestRec: self._record_queue_record,
            records.TransferRec: self._record_queue_record,
            records.QueueCancelledRec: self._record_queue_record,
            records.ConsumerReplicatedRec: self._record_consumer_record,
            records.SowDeletedRec: self._record_sow_delete,
        }

    def _record_consumer_record(self, rec: records.ConsumerReplicatedRec, src: p.Profile, now: float) -> int:
        """Rule 7: a named consumer's record, journaled with this instance's positions
        when it changed the consumer here."""
        arrived = self._arrived(rec, src)
        if arrived is None or self.consumers is None:
            return 0
        kept = self.consumers.replicated(arrived, pending=self._publishes.pending_position)
        if kept is None:
            return 0
        self._journal.append(records.encode(kept))
        return 1

    def _record_sow_delete(self, rec: records.SowDeletedRec, src: p.Profile, now: float) -> int:
        """Rule 8: a replicated ``sow_delete``, journaled and applied here when its topic
        is a SOW topic here."""
        arrived = self._arrived(rec, src)
        if arrived is None or self.sow is None or not self.sow.replicated_delete(arrived, now):
            return 0
        return 1

    def _admit(self, head: records.PublishRec, link: InLink, now: float) -> records.Arrival | None:
        """How a publish (or a transaction, by its first record) from ``link`` is
        journaled here; None when it is here already: it came back (rule 5), or came by
        another path, was resent, or its publisher failed over (rule 2)."""
        if not head.origin:
            arrival = link.arrival  # published at the source itself
        elif came_back(self.instance, head.origin, head.path):
            return None
        else:
            src = link.profile
            arrival = records.Arrival(head.origin, head.origin_group or src.group, [*head.path, src.instance])
        if self._publishes.is_recorded(head.publisher, head.seq):
            if self.queues is not None:
                self.queues.duplicate(head, arrival.origin, now)
            return None
        return arrival

    def _record_publish(self, rec: records.PublishRec, payload: bytes, link: InLink, now: float) -> int:
        """Record one publish unless already here (the hot path of a replica)."""
        arrival = self._admit(rec, link, now)
        if arrival is None:
            return 0
        self._publishes.append_encoded(rec, arrival.encode(payload, rec), arrival.origin)
        return 1

    def _record_plain(self, recs: list[records.PlainPublish], payloads: list[bytes], link: InLink, now: float) -> int:
        """Record publishes made at the source, each on its own, unless already here
        (the hot path of a replica: rule 2 for all of them in one call)."""
        queues = self.queues
        origin = link.arrival.origin

        def duplicate(rec: records.PlainPublish) -> None:
            if queues is not None:
                queues.duplicate(rec, origin, now)

        return self._publishes.append_arrived(recs, payloads, link.arrival, duplicate)

    def _record_run(self, run: list[tuple[records.PublishRec, bytes]], link: InLink, now: float) -> int:
        """Record one whole transaction unless already here."""
        arrival = self._admit(run[0][0], link, now)
        if arrival is None:
            return 0
        for rec, payload in run:
            self._publishes.append_encoded(rec, arrival.encode(payload, rec), arrival.origin)
        return len(run)

    def _acknowledge(self, state: SourceState, link: InLink | None) -> None:
        """Rule 3: acknowledge what is durable now."""
        durable = self._journal.durable_end
        pending = state.pending
        through = None
        while pending and pending[0][0] <= durable:
            through = pending.popleft()[1]
        if through is None or through <= state.durable_through:
            return
        state.durable_through = through
        if link is not None:
            self._outbox.send(link.conn_id, p.Acked(through=through))

    def recovered(self, rec: records.ReceivedRec) -> None:
        state = self._sources.get(rec.source)
        if state is None or state.journal_id != rec.journal_id or rec.through > state.durable_through:
            self._sources[rec.source] = SourceState(rec.journal_id, rec.through)

    def received(self) -> dict[str, tuple[str, int]]:
        """How far each source's journal is durable here (for the checkpoint)."""
        return {name: (st.journal_id, st.durable_through) for name, st in self._sources.items()}

    def durable(self) -> None:
        """The durable end moved: acknowledge sources (rule 3)."""
        if self._sources:
            by_source = {link.source: link for link in self._incoming.values()}
            for state in self._sources.values():
                if state.pending:
                    self._acknowledge(state, by_source.get(state))

    def statistics(self) -> tuple[InLinkStats, ...]:
        return tuple(
            InLinkStats(source=link.profile.instance, group=link.profile.group,
                        received_through=link.source.durable_through, records_received=link.records_received,
                        records_recorded=link.records_recorded, gaps=link.gaps)
            for link in self._incoming.values()
        )
