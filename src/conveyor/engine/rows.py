"""The engine's msgspec records: a named consumer as the checkpoint keeps it, and the
statistics the engine reports (a replicated queue's ownership counters among them).

They live in a module of their own, which the compiled build leaves uncompiled: mypyc
builds a Struct subclass without its class options (``frozen``, ``gc``, ``tag``) and with
its fields' generic types cut to the bare class (``list[tuple[int, int]]`` decodes as a
list of lists), see docs/architecture.md, "The compiled build". engine/queue/rows.py is
the same for the queue's records."""

from __future__ import annotations

import msgspec

from conveyor.engine.queue.events import QueueStats


class NamedConsumerState(msgspec.Struct, frozen=True):
    """One named consumer in the checkpoint (rule 6), as the consumers file keeps it."""

    d: int
    acked: int
    epoch: int
    token: str
    positions: list[int]
    claim_d: int = -1  # D when the epoch was claimed (-1: a file written before it was kept)
    cuts: list[tuple[int, int]] = []  # NamedConsumer.cuts ([]: a file written before they were kept)


class NamedConsumerStats(msgspec.Struct, frozen=True):
    queue: str
    name: str
    d: int
    acked: int
    epoch: int
    unacked: int
    leased: int
    reoffered: int
    taken_back: int
    expired_leases: int


class StagingStats(msgspec.Struct, frozen=True):
    txns: int
    bytes: int
    expired: int


class OwnershipStats(msgspec.Struct, frozen=True):
    queue: str
    proxied_transfer: bool
    requests_sent: int
    grants: int  # requests this instance granted
    proxied_claims: int
    conflicts: int  # rule 7
    typical_ack_s: float | None  # what a message waits here before it is requested


class EngineStats(msgspec.Struct, frozen=True):
    connections: int
    publishers: int
    journal_end: int
    journal_durable_end: int
    pending_publishes: int
    held_sends: int
    cache_misses: int
    topic_subscriptions: int
    replays: int
    queue_consumers: int
    queues: dict[str, QueueStats]
    sow: dict[str, dict[str, int]]
    named_consumers: tuple[NamedConsumerStats, ...]
    staging: StagingStats
    replicated_queues: tuple[OwnershipStats, ...] = ()


class LinkStats(msgspec.Struct, frozen=True):
    """One outgoing replication link, as the statistics report it."""

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
    """One incoming replication link, as the statistics report it."""

    source: str
    group: str
    received_through: int
    records_received: int
    records_recorded: int  # the others were duplicates
    gaps: int
