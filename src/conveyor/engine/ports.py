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

from typing import Iterator, Protocol, runtime_checkable


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
