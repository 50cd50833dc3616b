"""What the engine is handed: the seams it depends on, as Protocols.

The engine never opens a file or a socket; the shell hands it a journal (and, in the
tests, a :class:`~conveyor.journal.journal.MemoryJournal` over the same code). The
engine depends on the journal only through :class:`JournalPort`, so a type checker
follows every call across the seam, and a test double that drifts from it is a type
error instead of a silent ``getattr`` default.

``conveyor.journal.Journal`` satisfies :class:`JournalPort` (checked by mypy in
``tests/engine/test_ports.py`` and at run time there).
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, runtime_checkable

from conveyor import records


@runtime_checkable
class JournalPort(Protocol):
    """The transaction log, as the engine uses it.

    Positions are byte offsets: ``first_position <= durable_end <= end``. Records
    appended are buffered until the shell's group commit writes and syncs them;
    ``durable_end`` moves when it has. Reads see durable records only.
    """

    first_position: int  # the first retained position (older segments removed)
    end: int  # the position the next append gets
    durable_end: int  # every record before it is on disk

    def append(self, payload: bytes) -> int:
        """Buffer one record; its position."""
        ...

    def append_many(self, payloads: list[bytes]) -> list[int]:
        """Buffer records in order (all or nothing); their positions."""
        ...

    def read(self, position: int) -> bytes:
        """The payload of the durable record at ``position``."""
        ...

    def position_after(self, position: int) -> int:
        """The position of the record after the one at ``position``."""
        ...

    def scan(self, start: int | None = None, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """``(position, payload)`` of durable records with ``start <= position < end``."""
        ...

    def truncate(self, position: int) -> None:
        """Cut the log back to ``position`` (a durable record boundary)."""
        ...


# --- what replication calls on the parts it is handed (engine/replication/) -------------------
#
# The replication package depends on these, not on the classes that implement them
# (``ReplicatedQueues``, ``NamedConsumers``, ``StateOfTheWorld``), so it imports none of
# them, even for types; mypy checks each implementation where the engine hands it over.

#: The records of a replicated queue's ownership that replication carries.
QueueRecord = records.QueueRemovedRec | records.TransferRequestRec | records.TransferRec | records.QueueCancelledRec


class QueueIdentity(Protocol):
    """How a replicated queue's message is named to other instances: journal positions
    are local, ``(publisher, seq)`` is the same everywhere."""

    def identify(self, position: int) -> tuple[int, ...]:
        """(publisher, seq) of the message published at ``position``."""
        ...

    def counts_of(self, queue: str, position: int) -> tuple[int, int]:
        """(deliveries, cancels) of a message of replicated ``queue`` here (0, 0 once gone)."""
        ...


class ReplicaQueues(QueueIdentity, Protocol):
    """The replicated queues, as the replication sink feeds them."""

    def received(self, rec: QueueRecord, now: float) -> QueueRecord | None:
        """Apply a queue record from another instance; the record to journal here, or None."""
        ...

    def duplicate(self, rec: records.PublishRec | records.PlainPublish, origin: str, now: float) -> None:
        """A copy of a message recorded here arrived from ``origin`` (two owners to settle)."""
        ...


class ReplicaConsumers(Protocol):
    """The named consumers, as the replication sink feeds them."""

    def replicated(self, rec: records.ConsumerReplicatedRec,
                   pending: Callable[[int, int], int | None] | None = None) -> records.ConsumerReplicatedRec | None:
        """Apply a consumer's record from another instance; the record to journal here, or None."""
        ...


class ReplicaSow(Protocol):
    """The State of the World, as both sides of replication use it."""

    def identify(self, position: int) -> tuple[int, ...] | None:
        """(publisher, seq) of the SOW record at ``position`` (None: it cannot be named)."""
        ...

    def replicated_delete(self, rec: records.SowDeletedRec, now: float) -> bool:
        """A ``sow_delete`` that arrived by replication; False: not a SOW topic here."""
        ...
