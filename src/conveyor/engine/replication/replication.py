"""The replication part of the engine: this instance's profile (what a handshake shows
and checks) and the two sides, which share nothing but the journal and the profile, as
a replica and a primary keep separate state machines: :class:`ReplicationSource` (what
each destination needs, package rules 1, 3, 4) and :class:`ReplicationSink` (what each
source sends, rules 2, 3, 5). The engine calls each side directly; this part answers
only what needs both."""

from __future__ import annotations

from conveyor.config.model import Config, QueueKind
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort, ReplicaConsumers, ReplicaQueues, ReplicaSow
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.replication.checks import configured_queue_group
from conveyor.engine.replication.links import PeerLinks
from conveyor.engine.replication.sink import ReplicationSink
from conveyor.engine.replication.source import WINDOW_BYTES_MAX_DEFAULT, ReplicationSource
from conveyor.engine.rows import InLinkStats, LinkStats
from conveyor.protocol import replication as p


class Replication:
    def __init__(
        self, config: Config, journal: JournalPort, publishes: PublishLog, outbox: Outbox, peers: PeerLinks, *,
        journal_id: str, queues: ReplicaQueues | None = None, sow: ReplicaSow | None = None,
        consumers: ReplicaConsumers | None = None, window_bytes_max: int = WINDOW_BYTES_MAX_DEFAULT,
    ) -> None:
        """``queues``: the replicated queues (None: none here, rule 6); ``sow``: the State
        of the World (rule 8); ``consumers``: the named consumers (rule 7)."""
        self.instance = config.name
        self.group = config.group or config.name  # an instance without a Group is its own group
        self.journal_id = journal_id
        self.profile = p.Profile(
            instance=self.instance,
            group=self.group,
            journal_id=journal_id,
            revision=p.PROTOCOL_REVISION,
            queues=[
                p.QueueProfile(q.name, q.kind.value, q.underlying, q.filter, q.initial_owner,
                               group=configured_queue_group(q, config) if q.kind is QueueKind.GROUP_LOCAL else None)
                for q in config.queues
            ],
            destinations=[
                p.DestinationProfile(link.name, [t.name for t in link.dest.topics], link.dest.pass_through, link.sync)
                for link in peers.out.values()
            ],
        )
        self.source = ReplicationSource(config, journal, outbox, peers, self.profile, queues=queues, sow=sow,
                                        window_bytes_max=window_bytes_max)
        self.sink = ReplicationSink(config, journal, publishes, outbox, peers, self.profile, queues=queues, sow=sow,
                                    consumers=consumers)

    @property
    def enabled(self) -> bool:
        return bool(self.source.links)

    @property
    def routed(self) -> tuple[frozenset[type], frozenset[type]]:
        """The record types (other than a publish) with a row in the send table and in
        the receive table."""
        return self.source.routed, self.sink.routed

    def durable(self, now: float) -> None:
        """The durable end moved: the sink acknowledges its sources (rule 3), the source
        samples the end (to age what each destination lacks)."""
        self.sink.durable()
        self.source.sample(now)

    def statistics(self, now: float) -> tuple[tuple[LinkStats, ...], tuple[InLinkStats, ...]]:
        return self.source.statistics(now), self.sink.statistics()
