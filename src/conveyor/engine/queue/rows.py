"""The msgspec records of a queue's state: a lease, and a replicated queue's tombstones
and transfer epochs as checkpoints and snapshots keep them.

They live in a module of their own, which the compiled build leaves uncompiled: mypyc
builds a Struct subclass without its class options (``frozen``, ``gc``), and one that
names a compiled class in a field needs that class's module imported first
(docs/architecture.md, "The compiled build")."""

from __future__ import annotations

import msgspec

from conveyor.engine.queue.seats import Seat


class Lease(msgspec.Struct, gc=False):
    """One message's lease. Not tracked by the cyclic collector (``gc=False``): it refers
    to its seat and numbers only, and nothing refers back to it but the table, so it is
    never part of a cycle; a batch of leases then costs no collector passes over it."""

    seat: Seat
    deadline: float
    published_at: float
    key: int  # order key: the position, or (priority queue) rank and position


class Tombstone(msgspec.Struct, array_like=True, frozen=True):
    """A removal of a message that was not here (engine/replication/ownership.py rule 3), as a
    checkpoint and a snapshot keep it: a row ``[publisher, seq, kind, when]``."""

    publisher: int
    seq: int
    kind: str
    when: float | None = None  # None: a checkpoint of an older version (counts from the restart)


class TransferEpoch(msgspec.Struct, array_like=True, frozen=True):
    """The transfer that won for a message (rule 5): a row ``[publisher, seq, epoch,
    owner, granter]``."""

    publisher: int
    seq: int
    epoch: int
    owner: str
    granter: str


class OwnershipState(msgspec.Struct, frozen=True):
    """One replicated queue's tombstones and transfers in a checkpoint or a snapshot
    (the JSON and msgpack layouts of the untyped dict it replaces: old files load)."""

    tombstones: list[Tombstone] = []
    epochs: list[TransferEpoch] = []
