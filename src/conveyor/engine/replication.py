"""Replication between instances: the transaction log shipped, resumed, deduplicated.

This part decides everything about replication; the shell (``replication/`` and
``server/``) only moves link frames between sockets and these methods. As a *source*,
it keeps one :class:`OutLink` per configured ``Destination``; as a *destination*, one
:class:`InLink` per instance connected to its incoming replication transport. Rules:

1. **What a destination gets.** Publishes recorded here whose topic matches one of the
   destination's ``Topic`` regexes: those published here, and those that arrived by
   replication from an instance whose group matches the destination's ``PassThrough``
   regex. Never a record that has already passed the destination (its ``path``), and
   only durable records (read back from the journal, never kept in memory: a slow
   destination costs the source nothing but its window of
   :data:`WINDOW_BYTES_MAX_DEFAULT`). Dead-letter publishes go as plain publishes (the
   expiry they carry is local). A transaction is never split across batches.
2. **What a destination keeps.** Each received publish is recorded with its origin
   (instance, group), its path, its publisher, sequence and original timestamp, through
   the same duplicate detection as a client's publish: ``(publisher, seq)`` is the
   message's identity everywhere, so a message that arrives twice (two paths, a resend
   after a reconnect, a publisher that failed over and published it again) is recorded
   once. After each batch a :class:`~conveyor.records.ReceivedRec` marks how far the
   source's journal is covered; it is durable only if the batch is, and recovery reads
   it back, so a link resumes exactly where the destination's disk says.
3. **Acknowledgements.** The destination acknowledges a batch once its records are
   durable; the source then knows the destination holds everything below ``through``.
4. **Sync.** A publish is persisted, for its publisher, once it is durable here and on
   every ``sync`` destination (:meth:`Replication.persisted_floor`); ``async``
   destinations are never waited for. A sync destination that is down holds persisted
   acks (the publisher's store keeps the messages). With ``DowngradeAge``, a sync
   destination whose oldest unacknowledged record is older than that is treated as
   async (logged), and as sync again once it is back under ``UpgradeAge``.
5. **Loops are impossible**: a record is never sent to an instance on its path, and a
   destination drops a record whose path or origin is itself; duplicate detection
   catches anything else.
6. **Queues.** A replicated message never enters a ``Queue`` or ``GroupLocalQueue``
   whose own topic is replicated (those queues follow message ownership); it enters
   every other queue of its topic, which delivers its own copy.
7. **Named consumers** of a queue that follows ownership (the Spark source's, engine/
   consumers.py rule 7): their lease, ack and claim records travel with the queue's
   records, as :class:`~conveyor.records.ConsumerReplicatedRec` naming messages by
   identity, so that a query can continue on a destination with its position.
8. **SOW topics.** A publish to a SOW topic travels like any publish (a delta publish
   is journaled merged, so the destination gets the full message) and changes the
   destination's record when durable there. A ``sow_delete`` travels when its topic
   matches, naming each deleted record by its SowKey and its identity (journal
   positions are local); the destination removes a key only if its current record is
   that publish. Record expiry is not replicated: every instance expires a record at
   the time stamped in its message. A view's records (journaled when the view feeds a
   queue) are never sent: every instance computes its own views.
9. **Gaps** are loud: when a destination needs records the source's retention has
   removed, the source sends what is left, says so in the batch, and both ends log it
   and count it.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import msgspec

from conveyor import errors, records
from conveyor.config.model import Config, QueueKind, RecordedTopic, ReplicationDestination, topic_matcher
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort
from conveyor.engine.publish_log import PublishLog
from conveyor.protocol import replication as p

if TYPE_CHECKING:
    from conveyor.engine.consumers import NamedConsumers
    from conveyor.engine.ownership import QueueRecord, ReplicatedQueues
    from conveyor.engine.sow.state import StateOfTheWorld

log = logging.getLogger("conveyor.replication")

WINDOW_BYTES_MAX_DEFAULT = 8 * 1024 * 1024  # journal bytes sent and not acknowledged, per link
BATCH_BYTES_MAX = 1024 * 1024  # one Batch frame
SAMPLE_INTERVAL_S = 0.1  # how often the durable end is sampled, to age what a link lacks
SAMPLES_MAX = 100_000
#: Batches of duplicates only still leave a marker this often, so a reconnect does not
#: resend a long stretch the destination already holds.
MARK_STRIDE_BYTES = 1024 * 1024  # bounded history (about 3 hours at one sample every 0.1 s)


class LinkState(enum.Enum):
    DISCONNECTED = "disconnected"
    STREAMING = "streaming"
    REFUSED = "refused"  # the last handshake was refused (a configuration rule)


class LinkStats(msgspec.Struct, frozen=True):
    destination: str
    peer: str | None
    state: str
    sync: bool  # configured sync
    downgraded: bool
    acked: int  # source position the destination holds everything below
    sent: int
    bytes_behind: int
    records_sent: int
    batches_sent: int
    seconds_behind: float
    gaps: int
    last_error: str | None


class InLinkStats(msgspec.Struct, frozen=True):
    source: str
    group: str
    received_through: int
    records_received: int
    records_recorded: int  # the others were duplicates
    gaps: int


TOPIC_VERDICTS_MAX = 10_000  # per destination: topic names whose verdict is remembered


def travels_on(pass_through: Callable[[str], bool] | None, origin: str, origin_group: str, path: list[str],
               peer: str) -> bool:
    """Rules 1 and 5 for a record that arrived here by replication (``origin`` set):
    whether it goes on to ``peer``. Only when this link passes its origin's group
    through (PassThrough), and never back to its origin or to an instance it passed."""
    if pass_through is None or not pass_through(origin_group):
        return False
    return origin != peer and peer not in path


def came_back(instance: str, origin: str, path: list[str]) -> bool:
    """Rule 5 on the receiving side: a record that started at ``instance`` or passed
    it has been here before."""
    return origin == instance or instance in path


OwnershipRecord = (records.QueueRemovedRec | records.TransferRequestRec | records.TransferRec
                   | records.ConsumerReplicatedRec)
RemovalRecord = (records.AckedRec | records.DeliveredRec | records.ConsumerAckedRec | records.ConsumerLeasedRec
                 | records.ConsumerClaimedRec)
#: A row of the send table: ``send(link, record, payload, peer, payloads)``.
Send = Callable[["OutLink", Any, bytes, str, list[bytes]], None]
#: A row of the receive table: ``record(record, source profile, now)`` -> records journaled.
Receive = Callable[[Any, p.Profile, float], int]
_NO_ROUTE: Any = object()
#: A record that travels with where it was first recorded and the instances it passed
#: (rules 5-8), as it arrives from another instance.
_Travelling = TypeVar("_Travelling", bound=OwnershipRecord | records.SowDeletedRec)


def _matches_any(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a topic name matches any of ``patterns``; verdicts are remembered per
    name (a link asks once per record it reads), up to :data:`TOPIC_VERDICTS_MAX` names."""
    matchers = [topic_matcher(t) for t in patterns]
    verdicts: dict[str, bool] = {}

    def matches(name: str) -> bool:
        verdict = verdicts.get(name)
        if verdict is None:
            verdict = any(m(name) for m in matchers)
            if len(verdicts) >= TOPIC_VERDICTS_MAX:
                verdicts.clear()
            verdicts[name] = verdict
        return verdict

    return matches


class OutLink:
    """The source side of one ``Destination`` (rules 1, 3, 4, 7)."""

    def __init__(self, dest: ReplicationDestination, never: frozenset[str] = frozenset()) -> None:
        self.dest = dest
        self._never = never  # topics whose publishes never travel (views: rule 8)
        # Rule 1 for the publishes recorded here first, by their topic as encoded
        # (records.plain_publish_topic_key).
        self._plain: dict[bytes, bool] = {}
        self.name = dest.name
        self.sync = dest.sync_type == "sync"
        self.topic_matches = _matches_any(tuple(t.name for t in dest.topics))
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

    def plain_verdict(self, key: bytes) -> bool:
        """Rule 1 for a publish recorded here first (no origin): whether its topic, as
        ``key`` encodes it, goes to this destination. Verdicts are remembered per key."""
        verdict = self._plain.get(key)
        if verdict is None:
            if len(self._plain) >= TOPIC_VERDICTS_MAX:
                self._plain.clear()
            topic = records.topic_of_key(key)
            verdict = self._plain[key] = self.topic_matches(topic) and topic not in self._never
        return verdict

    def wants(self, rec: records.PublishRec, peer_instance: str) -> bool:
        """Rule 1: whether this destination needs the publish ``rec``."""
        if not self.topic_matches(rec.topic):
            return False
        return not rec.origin or travels_on(self.pass_through, rec.origin, rec.origin_group, rec.path, peer_instance)

    @property
    def holds_persisted(self) -> bool:
        return self.sync and not self.downgraded


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


class PeerLinks:
    """This instance's replication links, both ways: outgoing by destination name,
    incoming by connection. A part of its own so that the replicated queues can ask
    whether a peer is reachable (proxied transfer) without holding the replication
    part that holds them."""

    def __init__(self, config: Config) -> None:
        views = frozenset(v.name for v in config.views)
        repl = config.replication
        self.out: dict[str, OutLink] = {d.name: OutLink(d, views) for d in (repl.destinations if repl else ())}
        self.incoming: dict[int, InLink] = {}

    def reachable(self, instance: str) -> bool:
        """Whether a link to or from ``instance`` is up (proxied transfer acts only for an
        owner that is not)."""
        if any(link.state is LinkState.STREAMING and link.peer is not None and link.peer.instance == instance
               for link in self.out.values()):
            return True
        return any(link.profile.instance == instance for link in self.incoming.values())


class Replication:
    def __init__(
        self, config: Config, journal: JournalPort, publishes: PublishLog, outbox: Outbox, peers: PeerLinks, *,
        journal_id: str, queues: ReplicatedQueues | None = None, sow: StateOfTheWorld | None = None,
        consumers: NamedConsumers | None = None, window_bytes_max: int = WINDOW_BYTES_MAX_DEFAULT,
    ) -> None:
        """``queues``: the replicated queues (None: none here, rule 6); ``sow``: the State
        of the World (rule 8); ``consumers``: the named consumers (rule 7)."""
        self.instance = config.name
        self.group = config.group or config.name  # an instance without a Group is its own group
        self.journal_id = journal_id
        self._config = config
        self._journal = journal
        self._publishes = publishes
        self._outbox = outbox
        self._window = window_bytes_max
        repl = config.replication
        self._by_conn: dict[int, OutLink] = {}
        self._incoming = peers.incoming
        # source instance -> what this instance holds of its journal (rule 2)
        self._sources: dict[str, SourceState] = {}
        self._views = frozenset(v.name for v in config.views)  # never sent (rule 8)
        self.links = peers.out
        self._samples: deque[tuple[int, float]] = deque()  # (durable end, when), rising
        self._profile = self._make_profile()
        self.queues = queues
        self.sow = sow
        self.consumers = consumers
        #: Rule 6: queues whose replicated messages follow ownership, not local delivery.
        self.owned_queues = repl.replicated_queues(config.queues) if repl else frozenset()
        self._send = self._send_table()
        self._receive = self._receive_table()

    # --- profile and rules -------------------------------------------------------------

    def _make_profile(self) -> p.Profile:
        cfg = self._config
        return p.Profile(
            instance=self.instance,
            group=self.group,
            journal_id=self.journal_id,
            queues=[
                p.QueueProfile(q.name, q.kind.value, q.underlying, q.filter, q.initial_owner) for q in cfg.queues
            ],
            destinations=[
                p.DestinationProfile(link.name, [t.name for t in link.dest.topics], link.dest.pass_through, link.sync)
                for link in self.links.values()
            ],
        )

    @property
    def profile(self) -> p.Profile:
        return self._profile

    @property
    def enabled(self) -> bool:
        return bool(self.links)

    # --- source side ---------------------------------------------------------------------

    def hello(self, destination: str) -> p.Hello:
        return p.Hello(profile=self._profile)

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
        log.info("replication to %s (%s, group %s): streaming from position %d%s", link.name, peer.instance,
                 peer.group, resume, " (sync)" if link.sync else "")

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

    def acked(self, conn_id: int, through: int, now: float) -> None:
        link = self._by_conn.get(conn_id)
        if link is None:
            return
        if through > link.sent:
            raise errors.ProtocolError(f"replication ack through {through} is past what was sent ({link.sent})")
        if through > link.acked:
            link.acked = through

    def pump(self, now: float) -> None:
        """Send every streaming link what it lacks, up to its window (rule 1)."""
        for link in self.links.values():
            if link.state is LinkState.STREAMING:
                self._fill(link)

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
        for pos, payload in self._journal.scan(start, end):
            if size >= BATCH_BYTES_MAX and not in_run:
                break
            last = pos
            size += len(payload)
            if prefix is None or not payload.startswith(prefix):
                key = topic_key(payload)
                if key is None:
                    prefix = None
                else:
                    prefix = records.plain_publish_prefix(key)
                    wanted = link.plain_verdict(key)
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
        through = end if last is None else self._journal.position_after(last)
        return p.Batch(through=through, records=payloads)

    @property
    def routed(self) -> tuple[frozenset[type], frozenset[type]]:
        """The record types (other than a publish) with a row in the send table and in
        the receive table."""
        return frozenset(self._send), frozenset(self._receive)

    def _send_table(self) -> dict[type, Send | None]:
        """What each kind of record (other than a publish) sends to a destination, one
        row per type, None for "nothing" (rules 6-8); a type with no row stops the link."""
        table: dict[type, Send | None] = dict.fromkeys(
            (records.LeasedRec, records.CancelledRec, records.ReturnedRec, records.BarrierRec, records.ReceivedRec))
        table[records.SowDeletedRec] = self._sow_delete
        for t in (records.QueueRemovedRec, records.TransferRequestRec, records.TransferRec,
                  records.ConsumerReplicatedRec):
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
        if not self._owned(link, rec.queue):
            return
        if rec.origin and not travels_on(link.pass_through, rec.origin, rec.origin_group, rec.path, peer):
            return
        payloads.append(payload)

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
        if isinstance(rec, records.ConsumerLeasedRec):
            queues = self.queues
            assert queues is not None  # the queue is owned (_removal_record): the engine gave the replicated queues
            idents = [queues.identify(p) for p in rec.positions]
            out = records.ConsumerReplicatedRec(rec.queue, rec.consumer, "lease", rec.first,
                                                [i[0] for i in idents], [i[1] for i in idents], epoch=rec.epoch)
        elif isinstance(rec, records.ConsumerAckedRec):
            out = records.ConsumerReplicatedRec(rec.queue, rec.consumer, "ack", rec.through, epoch=rec.epoch)
        else:
            out = records.ConsumerReplicatedRec(rec.queue, rec.consumer, "claim", rec.epoch, token=rec.token,
                                                through=rec.d)
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
        if not gone or not link.topic_matches(queue) or self.queues is None:
            return
        idents = [self.queues.identify(p) for p in gone]
        rec = records.QueueRemovedRec(queue, [i[0] for i in idents], [i[1] for i in idents], kind)
        payloads.append(records.encode(rec))

    def persisted_floor(self) -> int | None:
        """Rule 4: the lowest position every sync destination holds (None: no sync
        destination holds persisted acks)."""
        floors = [link.acked for link in self.links.values() if link.holds_persisted]
        return min(floors) if floors else None

    # --- destination side -------------------------------------------------------------------

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
        problems += check_pair(self._profile, src, incoming=True, local_links=list(self.links.values()))
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

    # --- recovery, time, statistics -------------------------------------------------------------

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

    def received(self) -> dict[str, tuple[str, int]]:
        """How far each source's journal is durable here (for the checkpoint)."""
        return {name: (st.journal_id, st.durable_through) for name, st in self._sources.items()}

    def durable(self, now: float) -> None:
        """The durable end moved: acknowledge sources (rule 3) and sample the end (to age
        what each destination lacks)."""
        if self._sources:
            by_source = {link.source: link for link in self._incoming.values()}
            for state in self._sources.values():
                if state.pending:
                    self._acknowledge(state, by_source.get(state))
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


    def statistics(self, now: float) -> tuple[tuple[LinkStats, ...], tuple[InLinkStats, ...]]:
        end = self._journal.durable_end
        out = tuple(
            LinkStats(
                destination=link.name, peer=link.peer.instance if link.peer else None, state=link.state.value,
                sync=link.sync, downgraded=link.downgraded, acked=link.acked, sent=link.sent,
                bytes_behind=max(0, end - link.acked), records_sent=link.records_sent,
                batches_sent=link.batches_sent, seconds_behind=self.seconds_behind(link, now), gaps=link.gaps,
                last_error=link.last_error,
            )
            for link in self.links.values()
        )
        inc = tuple(
            InLinkStats(source=link.profile.instance, group=link.profile.group,
                        received_through=link.source.durable_through, records_received=link.records_received,
                        records_recorded=link.records_recorded, gaps=link.gaps)
            for link in self._incoming.values()
        )
        return out, inc


# --- the configuration rules for replicated queues ------------------------------------------------


def check_pair(local: p.Profile, peer: p.Profile, *, outgoing: OutLink | None = None, incoming: bool = False,
               local_links: list[OutLink] | None = None) -> list[str]:
    """The rules for replicated queues that ``local`` and ``peer`` break together, as
    sentences naming both instances and the rule (docs/replication.md, "Replicated
    queues"). ``outgoing``: local replicates to peer through this link; ``incoming``:
    peer replicates to local."""
    problems: list[str] = []
    who = f"{local.instance!r} and {peer.instance!r}"
    peer_queues = {q.name: q for q in peer.queues}
    local_queues = {q.name: q for q in local.queues}
    if outgoing is not None:
        replicated = _matches_any(tuple(t.name for t in outgoing.dest.topics))
        back = [d for d in peer.destinations if d.name == local.instance]
        for q in local.queues:
            if q.kind == QueueKind.LOCAL.value or not replicated(q.name):
                continue
            other = peer_queues.get(q.name)
            if other is None:
                problems.append(f"{who}: {q.name!r} is a queue on {local.instance!r} and is replicated, so it must "
                                f"be a queue on {peer.instance!r} too")
                continue
            if (other.kind, other.underlying, other.filter, other.initial_owner) != (
                q.kind, q.underlying, q.filter, q.initial_owner
            ):
                problems.append(
                    f"{who}: queue {q.name!r} must have the same definition on both (kind, UnderlyingTopic, "
                    f"Filter, InitialOwner): {local.instance!r} has {_shape(q)}, {peer.instance!r} has {_shape(other)}"
                )
            if not _covers(outgoing.dest.topics, q.underlying):
                problems.append(f"{who}: the underlying topic {q.underlying!r} of replicated queue {q.name!r} must "
                                f"be replicated too (a Topic of destination {outgoing.name!r})")
            if not any(_matches_any(tuple(d.topics))(q.name) for d in back):
                problems.append(f"{who}: queue {q.name!r} is replicated from {local.instance!r} to "
                                f"{peer.instance!r} but not back: replicated queues need replication both ways "
                                f"(a Destination named {local.instance!r} on {peer.instance!r})")
    if incoming:
        for q in peer.queues:
            if q.kind == QueueKind.LOCAL.value:
                continue
            mine = local_queues.get(q.name)
            sent = [d for d in peer.destinations if d.name == local.instance]
            if mine is None or not any(_matches_any(tuple(d.topics))(q.name) for d in sent):
                continue  # the peer does not replicate this queue to us
            for link in local_links or ():
                if link.name == peer.instance or not link.topic_matches(q.name):
                    continue
                if link.pass_through is None or not link.pass_through(peer.group):
                    problems.append(
                        f"{who}: queue {q.name!r} arrives on {local.instance!r} from {peer.instance!r} (group "
                        f"{peer.group!r}) and is replicated on to {link.name!r}, so destination {link.name!r} needs a "
                        f"PassThrough matching {peer.group!r} (acknowledgements and transfers must reach every copy)"
                    )
    return problems


def _shape(q: p.QueueProfile) -> str:
    return f"({q.kind}, {q.underlying!r}, {q.filter!r}, {q.initial_owner!r})"


def _covers(topics: tuple[RecordedTopic, ...], underlying: str) -> bool:
    names = [t.name for t in topics]
    if underlying in names or any(n in (".*", ".+", "^.*$") for n in names):
        return True
    return _matches_any(tuple(names))(underlying)
