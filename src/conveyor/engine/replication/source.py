"""The source side of replication (package rules 1, 3, 4 and 6-9 outgoing): one
:class:`~conveyor.engine.replication.links.OutLink` per configured ``Destination``; what
each destination needs, read back from the durable journal in batches up to its window;
acknowledgements; the persisted floor of the sync destinations and their downgrade by
the age of what they lack. Kept apart from the destination side, which shares nothing
with it but the journal and the profile."""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, cast

import msgspec

from conveyor import errors, expr, records
from conveyor.config.model import Config, ReplicationDestination, topic_matcher
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort, QueueIdentity, ReplicaSow
from conveyor.engine.replication.checks import check_pair
from conveyor.engine.replication.route import TOPIC_VERDICTS_MAX, matches_any, travels_on
from conveyor.engine.rows import LinkStats
from conveyor.protocol import replication as p
from conveyor.protocol.payload import decode_json

if TYPE_CHECKING:
    from conveyor.engine.replication.links import PeerLinks

log = logging.getLogger("conveyor.replication")

WINDOW_BYTES_MAX_DEFAULT = 8 * 1024 * 1024  # journal bytes sent and not acknowledged, per link
BATCH_BYTES_MAX = 1024 * 1024  # one Batch frame
SAMPLE_INTERVAL_S = 0.1  # how often the durable end is sampled, to age what a link lacks
SAMPLES_MAX = 100_000  # bounded history (about 3 hours at one sample every 0.1 s)

class LinkState(enum.Enum):
    DISCONNECTED = "disconnected"
    STREAMING = "streaming"
    REFUSED = "refused"  # the last handshake was refused (a configuration rule)


_UNDECODED: Any = object()  # not there yet: a verdict not known, a body not decoded (OutLink)


class OutLink:
    """The source side of one ``Destination`` (rules 1, 3, 4, 7)."""

    def __init__(self, dest: ReplicationDestination, never: frozenset[str] = frozenset()) -> None:
        self.dest = dest
        self._never = never  # topics whose publishes never travel (views: rule 8)
        # Rule 1 for the publishes recorded here first, by their topic as encoded
        # (records.plain_publish_topic_key).
        self._plain: dict[bytes, bool | None] = {}
        self.name = dest.name
        self.sync = dest.sync_type == "sync"
        self.topic_matches = matches_any(tuple(t.name for t in dest.topics))
        # Rule 1's content filters (a destination Topic's Filter, reference E.1): for each
        # Topic, its matcher and compiled filter (None: every message); empty when no
        # Topic has one, so an unfiltered destination decides by topic alone.
        self._filters: tuple[tuple[Callable[[str], bool], expr.Expression | None], ...] = (
            tuple((topic_matcher(t.name), expr.compile(t.filter) if t.filter else None) for t in dest.topics)
            if any(t.filter for t in dest.topics) else ())
        self.pass_through = topic_matcher(dest.pass_through) if dest.pass_through else None
        self.state = LinkState.DISCONNECTED
        self.conn_id: int | None = None
        self.peer: p.Profile | None = None
        self.acked = 0
        self.sent = 0
        self.downgraded = False
        self.records_sent = 0
        self.batches_sent = 0
        self.gaps = 0
        self.last_error: str | None = None

    def plain_verdict(self, key: bytes) -> bool | None:
        """Rule 1 for a publish recorded here first (no origin): whether its topic, as
        ``key`` encodes it, goes to this destination; None when a content filter decides
        message by message (:meth:`wants`). Verdicts are remembered per key."""
        # One lookup (None is a verdict here); typed object, because compiled code checks
        # a `bool | None` annotation and the sentinel is neither.
        known: object = self._plain.get(key, _UNDECODED)
        if known is not _UNDECODED:
            return cast("bool | None", known)
        if len(self._plain) >= TOPIC_VERDICTS_MAX:
            self._plain.clear()
        topic = records.topic_of_key(key)
        verdict: bool | None = self.topic_matches(topic) and topic not in self._never
        if verdict and self._filters and not any(m(topic) and flt is None for m, flt in self._filters):
            verdict = None  # every Topic that takes it filters its messages
        self._plain[key] = verdict
        return verdict

    def wants(self, rec: records.PublishRec, peer_instance: str) -> bool:
        """Rule 1: whether this destination needs the publish ``rec``."""
        if not self.topic_matches(rec.topic):
            return False
        if self._filters and not self._passes(rec):
            return False
        return not rec.origin or travels_on(self.pass_through, rec.origin, rec.origin_group, rec.path, peer_instance)

    def _passes(self, rec: records.PublishRec) -> bool:
        """A Topic that takes ``rec`` has no filter, or one its body matches (a body that
        is not JSON, or over a parse limit, is NULL to the filter)."""
        data: Any = _UNDECODED
        for matches, flt in self._filters:
            if not matches(rec.topic):
                continue
            if flt is None:
                return True
            if data is _UNDECODED:
                try:
                    data = decode_json(rec.data)
                except errors.BadMessage:
                    data = None
            meta = {"topic": rec.topic, "sequence": rec.seq, "timestamp": rec.timestamp,
                    "correlation_id": rec.correlation_id, "length": len(rec.data), "now": rec.timestamp}
            try:
                if flt.matches(data, meta):
                    return True
            except Exception:  # noqa: BLE001 - a filter that fails on one message keeps it back
                continue
        return False

    @property
    def holds_persisted(self) -> bool:
        return self.sync and not self.downgraded

    @property
    def revision(self) -> int:
        """The protocol revision of the connected destination (protocol/replication.py
        rule 6): which record kinds it can take."""
        return self.peer.revision if self.peer is not None else 0



OwnershipRecord = (records.QueueRemovedRec | records.TransferRequestRec | records.TransferRec
                   | records.ConsumerReplicatedRec | records.QueueCancelledRec)
#: The protocol revision a destination needs to take a record kind (protocol/replication.py
#: rule 6); kinds not listed are revision 0.
REVISION_OF: dict[type, int] = {records.QueueCancelledRec: 1}
RemovalRecord = (records.AckedRec | records.DeliveredRec | records.ConsumerAckedRec | records.ConsumerLeasedRec
                 | records.ConsumerClaimedRec)
#: A row of the send table: ``send(link, record, payload, peer, payloads)``.
Send = Callable[[OutLink, Any, bytes, str, list[bytes]], None]
_NO_ROUTE: Any = object()


class ReplicationSource:
    def __init__(self, config: Config, journal: JournalPort, outbox: Outbox, peers: PeerLinks, profile: p.Profile, *,
                 queues: QueueIdentity | None, sow: ReplicaSow | None,
                 window_bytes_max: int = WINDOW_BYTES_MAX_DEFAULT) -> None:
        """``queues``: the replicated queues (None: none here, rule 6); ``sow``: the State
        of the World (rule 8)."""
        self.instance = config.name
        self._journal = journal
        self._outbox = outbox
        self._window = window_bytes_max
        self._profile = profile
        self._by_conn: dict[int, OutLink] = {}
        self._views = frozenset(v.name for v in config.views)  # never sent (rule 8)
        self.links = peers.out
        self._peers = peers  # the link-state table (reach.py): learnt from acks, announced by pump and tick
        self._catch_up = peers.catch_up  # whether this instance still waits for a destination (hello)
        self._samples: deque[tuple[int, float]] = deque()  # (durable end, when), rising
        self.queues = queues
        self.sow = sow
        repl = config.replication
        #: Rule 6: queues whose replicated messages follow ownership, not local delivery.
        self.owned_queues = repl.replicated_queues(config.queues) if repl else frozenset()
        self._send = self._send_table()
        # The removals of the batch being read (rule 6), encoded when it is complete.
        self._removals: list[_Removals] = []

    @property
    def routed(self) -> frozenset[type]:
        """The record types (other than a publish) with a row in the send table."""
        return frozenset(self._send)

    def hello(self, destination: str) -> p.Hello:
        """The handshake's first message, with where this journal's durable part ends
        now: the destination counts this instance as having caught it up once the stream
        has brought it that far (engine/replication/catch_up.py rule 2); and whether this
        instance still waits for it (its link to this instance should dial now)."""
        catch_up = self._catch_up
        return p.Hello(profile=self._profile, journal_end=self._journal.durable_end,
                       catching_up=not catch_up.done and destination in catch_up.peers)

    def link_up(self, destination: str, conn_id: int, welcome: p.Welcome, now: float) -> None:
        """The destination answered the handshake: check the rules, then stream from
        where it says it is. Raises :class:`~conveyor.errors.ReplicationRefused`."""
        link = self.links[destination]
        peer = welcome.profile
        problems = []
        if peer.instance != link.name:
            problems.append(
                f"destination {link.name!r} answered as instance {peer.instance!r}: a Destination's Name must "
                "be the Name of the instance it replicates to"
            )
        if peer.instance == self.instance:
            problems.append(f"destination {link.name!r} is this instance ({self.instance!r})")
        problems += check_pair(self._profile, peer, outgoing=link)
        if problems:
            link.state = LinkState.REFUSED
            link.last_error = "; ".join(problems)
            raise errors.ReplicationRefused(link.last_error)
        resume = welcome.resume_from
        if resume > self._journal.end:
            log.warning("replication to %s: it says it has our journal up to %d, past our end %d: resending "
                        "everything we have", link.name, resume, self._journal.end)
            resume = 0
        link.state = LinkState.STREAMING
        link.conn_id = conn_id
        link.peer = peer
        link.acked = link.sent = resume
        link.last_error = None
        self._by_conn[conn_id] = link
        log.info("replication to %s (%s, group %s, revision %d): streaming from position %d%s", link.name,
                 peer.instance, peer.group, peer.revision, resume, " (sync)" if link.sync else "")

    def link_down(self, destination: str, reason: str | None, now: float) -> None:
        link = self.links[destination]
        if link.conn_id is not None:
            self._by_conn.pop(link.conn_id, None)
        if link.state is LinkState.STREAMING:
            log.warning("replication to %s: link down (%s)", link.name, reason or "closed")
            link.state = LinkState.DISCONNECTED
        link.conn_id = None
        if reason:
            link.last_error = reason
        link.sent = link.acked  # what was in flight is sent again on the next link

    def acked(self, conn_id: int, through: int, now: float, reach: list[p.Reach] | None = None) -> None:
        link = self._by_conn.get(conn_id)
        if link is None:
            return
        if reach:
            self._peers.learn(reach)
        if through > link.sent:
            raise errors.ProtocolError(f"replication ack through {through} is past what was sent ({link.sent})")
        if through > link.acked:
            link.acked = through

    def pump(self, now: float) -> None:
        """Send every streaming link what it lacks, up to its window (rule 1)."""
        for link in self.links.values():
            if link.state is LinkState.STREAMING:
                self._fill(link)
        self._peers.announce(self._outbox, now)

    def _fill(self, link: OutLink) -> None:
        conn_id = link.conn_id
        assert conn_id is not None  # a streaming link is connected (link_up)
        journal = self._journal
        durable = journal.durable_end
        first = journal.first_position
        while link.sent < durable and link.sent - link.acked < self._window:
            gap = None
            if link.sent < first:
                gap = (link.sent, first)
                link.gaps += 1
                link.last_error = f"records [{link.sent}, {first}) were removed by retention before they were sent"
                log.error("replication to %s: GAP: %s; sending from %d", link.name, link.last_error, first)
                link.sent = first
            batch = self._read_batch(link, link.sent, durable)
            if gap is not None:
                batch = msgspec.structs.replace(batch, gap_from=gap[0], gap_to=gap[1])
            link.sent = batch.through
            link.batches_sent += 1
            link.records_sent += len(batch.records)
            self._outbox.send(conn_id, batch)

    def _read_batch(self, link: OutLink, start: int, end: int) -> p.Batch:
        """The records ``link`` needs from ``[start, end)``, up to about
        :data:`BATCH_BYTES_MAX` of journal, never ending inside a transaction."""
        payloads: list[bytes] = []
        size = 0
        last = None
        peer = link.peer.instance if link.peer is not None else link.name
        in_run = False
        topic_key = records.plain_publish_topic_key
        # The usual record is a publish made here, on its own, to the topic of the one
        # before: one startswith() decides it.
        prefix, wanted = None, False
        self._removals = []
        for pos, payload in self._journal.scan(start, end):
            if size >= BATCH_BYTES_MAX and not in_run:
                break
            last = pos
            size += len(payload)
            if prefix is None or not payload.startswith(prefix):
                key = topic_key(payload)
                verdict = None if key is None else link.plain_verdict(key)
                if key is None or verdict is None:
                    prefix = None  # decoded below (a filtered topic: message by message)
                else:
                    prefix = records.plain_publish_prefix(key)
                    wanted = verdict
            if prefix is not None:  # a plain publish
                in_run = False
                if wanted:
                    payloads.append(payload)
                continue
            rec = records.decode(payload)
            if type(rec) is records.PublishRec:
                in_run = rec.txn_total > 0 and rec.txn_index < rec.txn_total - 1
                if link.wants(rec, peer) and rec.topic not in self._views:
                    payloads.append(payload)
                if rec.expired_queue is not None and rec.expired_queue in self.owned_queues:
                    self._queue_removal(link, rec.expired_queue, [rec.expired_position], "expire", payloads)
            else:
                in_run = False
                send = self._send.get(type(rec), _NO_ROUTE)
                if send is _NO_ROUTE:
                    raise errors.JournalError(f"replication to {link.name}: no route for {type(rec).__name__}")
                if send is not None:
                    send(link, rec, payload, peer, payloads)
        for r in self._removals:
            payloads[r.index] = records.encode(records.QueueRemovedRec(r.queue, r.publishers, r.seqs, r.kind))
        self._removals = []
        through = end if last is None else self._journal.position_after(last)
        return p.Batch(through=through, records=payloads)

    def _send_table(self) -> dict[type, Send | None]:
        """What each kind of record (other than a publish) sends to a destination, one
        row per type, None for "nothing" (rules 6-8); a type with no row stops the link."""
        table: dict[type, Send | None] = dict.fromkeys(
            (records.LeasedRec, records.ReturnedRec, records.BarrierRec, records.ReceivedRec))
        table[records.SowDeletedRec] = self._sow_delete
        table[records.CancelledRec] = self._cancelled_record
        for t in (records.QueueRemovedRec, records.TransferRequestRec, records.TransferRec,
                  records.ConsumerReplicatedRec, records.QueueCancelledRec):
            table[t] = self._ownership_record
        table[records.ExpiredRec] = self._expired_record
        for removal in (records.AckedRec, records.DeliveredRec, records.ConsumerAckedRec, records.ConsumerLeasedRec,
                        records.ConsumerClaimedRec):
            table[removal] = self._removal_record
        return table

    def _owned(self, link: OutLink, queue: str) -> bool:
        """Rule 6: a record of a queue whose messages follow ownership, replicated to ``link``."""
        return queue in self.owned_queues and link.topic_matches(queue)

    def _ownership_record(self, link: OutLink, rec: OwnershipRecord, payload: bytes, peer: str,
                          payloads: list[bytes]) -> None:
        """Rule 6: the ownership records (and a named consumer's replicated ones) travel
        as they are."""
        if not self._owned(link, rec.queue) or link.revision < REVISION_OF.get(type(rec), 0):
            return
        if rec.origin and not travels_on(link.pass_through, rec.origin, rec.origin_group, rec.path, peer):
            return
        payloads.append(payload)

    def _cancelled_record(self, link: OutLink, rec: records.CancelledRec, payload: bytes, peer: str,
                          payloads: list[bytes]) -> None:
        """Rule 6: a cancel with a delayed retry or a failure reason goes by identity
        (to a destination that takes it: protocol/replication.py rule 6), so an instance
        that takes the message over from this one while it is down holds it as well; a
        plain cancel changes nothing another instance keeps."""
        if (not (rec.not_before or rec.reasons) or not self._owned(link, rec.queue)
                or link.revision < REVISION_OF[records.QueueCancelledRec] or self.queues is None):
            return
        queues = self.queues
        idents = [queues.identify(p) for p in rec.positions]
        counts = [queues.counts_of(rec.queue, p) for p in rec.positions]  # as they are now: they only grow
        n = len(idents)
        payloads.append(records.encode(records.QueueCancelledRec(
            rec.queue, *_columns(idents),
            rec.not_before or [0.0] * n, rec.reasons or [""] * n,
            deliveries=[c[0] for c in counts], cancels=[c[1] for c in counts])))

    def _expired_record(self, link: OutLink, rec: records.ExpiredRec, payload: bytes, peer: str,
                        payloads: list[bytes]) -> None:
        if self._owned(link, rec.queue):
            self._queue_removal(link, rec.queue, [rec.position], "expire", payloads)

    _REMOVALS = {records.AckedRec: "ack", records.DeliveredRec: "deliver", records.ConsumerAckedRec: "ack"}

    def _removal_record(self, link: OutLink, rec: RemovalRecord, payload: bytes, peer: str,
                        payloads: list[bytes]) -> None:
        """Rule 6: a removal goes by identity; rule 7: a named consumer's record goes as
        its replicated form (an ack of a named consumer is both)."""
        if not self._owned(link, rec.queue):
            return
        if isinstance(rec, (records.AckedRec, records.DeliveredRec, records.ConsumerAckedRec)):
            self._queue_removal(link, rec.queue, rec.positions, self._REMOVALS[type(rec)], payloads)
        if not isinstance(rec, (records.AckedRec, records.DeliveredRec)):
            self._consumer_record(rec, payloads)

    def _consumer_record(self, rec: records.ConsumerLeasedRec | records.ConsumerAckedRec | records.ConsumerClaimedRec,
                         payloads: list[bytes]) -> None:
        """Rule 7: a named consumer's record, its messages named by identity."""
        queues = self.queues
        assert queues is not None  # the queue is owned (_removal_record): the engine gave the replicated queues
        if isinstance(rec, records.ConsumerLeasedRec):
            idents = [queues.identify(p) for p in rec.positions]
            out = records.ConsumerReplicatedRec(rec.queue, rec.consumer, "lease", rec.first,
                                                *_columns(idents), epoch=rec.epoch)
        elif isinstance(rec, records.ConsumerAckedRec):
            out = records.ConsumerReplicatedRec(rec.queue, rec.consumer, "ack", rec.through, epoch=rec.epoch)
        else:  # the claimer's unacknowledged deliveries go by identity too (consumers.py rule 8)
            idents = [(records.GONE, records.GONE) if p == records.GONE else queues.identify(p) for p in rec.positions]
            out = records.ConsumerReplicatedRec(rec.queue, rec.consumer, "claim", rec.epoch, *_columns(idents),
                                                token=rec.token, through=rec.d, acked=rec.acked)
        payloads.append(records.encode(out))

    def _sow_delete(self, link: OutLink, rec: records.SowDeletedRec, payload: bytes, peer: str,
                    payloads: list[bytes]) -> None:
        """Rule 8: a ``sow_delete`` goes where its topic's publishes go, by identity."""
        if not link.topic_matches(rec.topic) or self.sow is None:
            return
        if rec.origin:  # it arrived here by replication: already by identity
            if not travels_on(link.pass_through, rec.origin, rec.origin_group, rec.path, peer):
                return
        else:
            named = [(k, ident) for k, p in zip(rec.keys, rec.positions) if (ident := self.sow.identify(p)) is not None]
            if not named:
                return
            payload = records.encode(records.SowDeletedRec(
                rec.topic, [k for k, _ in named], [], publishers=[i[0] for _, i in named],
                seqs=[i[1] for _, i in named]))
        payloads.append(payload)

    def _queue_removal(self, link: OutLink, queue: str, gone: list[int], kind: str, payloads: list[bytes]) -> None:
        """Rule 6: messages that left a queue, by identity. Removals of one queue and
        kind that follow each other in the batch (one a subscriber's acknowledgement)
        travel as one record: the destination applies and journals one record for them,
        in the same place among the others."""
        if not gone or not link.topic_matches(queue) or self.queues is None:
            return
        publishers, seqs = _columns([self.queues.identify(p) for p in gone])
        removals = self._removals
        if removals:
            last = removals[-1]
            if last.index == len(payloads) - 1 and last.queue == queue and last.kind == kind:
                last.publishers += publishers
                last.seqs += seqs
                return
        removals.append(_Removals(len(payloads), queue, kind, publishers, seqs))
        payloads.append(b"")  # encoded at the end of the batch (_read_batch)

    def persisted_floor(self) -> int | None:
        """Rule 4: the lowest position every sync destination holds (None: no sync
        destination holds persisted acks)."""
        floors = [link.acked for link in self.links.values() if link.holds_persisted]
        return min(floors) if floors else None

    def acknowledged(self) -> dict[str, int]:
        """How far each destination had acknowledged (for the checkpoint)."""
        return {name: link.acked for name, link in self.links.items()}

    def restore_acknowledged(self, acked: dict[str, int]) -> None:
        """After a restart: each destination holds at least what it acknowledged before
        (its Welcome says more once it connects)."""
        for name, through in acked.items():
            link = self.links.get(name)
            if link is not None:
                link.acked = link.sent = through

    def seconds_behind(self, link: OutLink, now: float) -> float:
        """Age of the oldest record the destination lacks (0 when it has everything)."""
        if link.acked >= self._journal.durable_end:
            return 0.0
        for end, when in self._samples:
            if end > link.acked:
                return max(0.0, now - when)
        return 0.0

    def tick(self, now: float) -> None:
        """Rule 4: downgrade and upgrade sync destinations by the age of what they lack."""
        floor = min((link.acked for link in self.links.values()), default=None)
        samples = self._samples
        while floor is not None and len(samples) > 1 and samples[1][0] <= floor:
            samples.popleft()  # every link has what this sample covers
        for link in self.links.values():
            age_max = link.dest.downgrade_age_s
            if not link.sync or age_max is None:
                continue
            age = self.seconds_behind(link, now)
            if not link.downgraded and age > age_max:
                link.downgraded = True
                log.warning("replication to %s: DOWNGRADED to async: its oldest unacknowledged record is %.1f s "
                            "old (DowngradeAge %.1f s); publishers no longer wait for it", link.name, age, age_max)
            elif link.downgraded and age <= link.dest.upgrade_age_s:
                link.downgraded = False
                log.warning("replication to %s: UPGRADED back to sync: %.1f s behind (UpgradeAge %.1f s)",
                            link.name, age, link.dest.upgrade_age_s)
        self._peers.announce(self._outbox, now)  # a link that went down is told to the others (reach.py)

    def sample(self, now: float) -> None:
        """The durable end moved: sample it (to age what each destination lacks)."""
        end = self._journal.durable_end
        samples = self._samples
        if samples and end <= samples[-1][0]:
            return
        if samples and now - samples[-1][1] < SAMPLE_INTERVAL_S:
            # Within one interval: records durable now count as that old (an age is
            # overstated by at most SAMPLE_INTERVAL_S, never understated).
            samples[-1] = (end, samples[-1][1])
            return
        samples.append((end, now))
        if len(samples) > SAMPLES_MAX:
            samples.popleft()

    def statistics(self, now: float) -> tuple[LinkStats, ...]:
        end = self._journal.durable_end
        return tuple(
            LinkStats(
                destination=link.name, peer=link.peer.instance if link.peer else None, state=link.state.value,
                sync=link.sync, downgraded=link.downgraded, acked=link.acked, sent=link.sent,
                bytes_behind=max(0, end - link.acked), records_sent=link.records_sent,
                batches_sent=link.batches_sent, seconds_behind=self.seconds_behind(link, now), gaps=link.gaps,
                last_error=link.last_error,
            )
            for link in self.links.values()
        )


@dataclass(slots=True)
class _Removals:
    """Removals of one queue and kind next to each other in a batch (rule 6): the
    QueueRemovedRec that goes at ``index`` among its payloads."""

    index: int
    queue: str
    kind: str
    publishers: list[int]
    seqs: list[int]


def _columns(idents: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """The publishers and the sequence numbers of messages named by identity: the two
    columns a record that names them carries."""
    return [i[0] for i in idents], [i[1] for i in idents]
