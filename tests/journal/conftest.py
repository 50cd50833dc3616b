"""Fixtures shared by the journal tests: one conformance suite, two implementations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conveyor.journal import Journal, MemoryJournal, MemoryStore


class FileKind:
    """Opens a file-backed Journal; a crash drops what was not written."""

    name = "file"

    def __init__(self, directory: Path, *, fsync: bool = False) -> None:
        self.directory = directory
        self.fsync = fsync

    def open(self, **kw) -> Journal:
        kw.setdefault("fsync", self.fsync)
        return Journal.open(self.directory, **kw)

    def crash(self, journal: Journal, **kw) -> Journal:
        """Reopen as after a crash: appended but unwritten records are lost."""
        journal._storage.close()  # no commit: the process died
        journal._closed = True
        return self.open(**kw)

    def reopen(self, journal: Journal, **kw) -> Journal:
        journal.close()
        return self.open(**kw)

    def segment_bytes_on_disk(self, journal: Journal) -> list[int]:
        return [os.path.getsize(s.path) for s in journal.segments()]


class MemoryKind:
    name = "memory"

    def __init__(self) -> None:
        self.store = MemoryStore()

    def open(self, **kw) -> MemoryJournal:
        kw.pop("fsync", None)
        return MemoryJournal.open(self.store, **kw)

    def crash(self, journal: MemoryJournal, **kw) -> MemoryJournal:
        journal._closed = True
        return self.open(**kw)

    def reopen(self, journal: MemoryJournal, **kw) -> MemoryJournal:
        journal.close()
        return self.open(**kw)

    def segment_bytes_on_disk(self, journal: MemoryJournal) -> list[int]:
        return [len(self.store.files[s.base]) for s in journal.segments()]


@pytest.fixture(params=["file", "memory"])
def kind(request, tmp_path):
    """Each conformance test runs once per implementation (STYLE 12)."""
    if request.param == "file":
        return FileKind(tmp_path / "journal")
    return MemoryKind()


def payload_for(i: int, size: int | None = None) -> bytes:
    """A payload that names its index, of a size that varies with it."""
    head = f"record {i};".encode()
    size = len(head) + (i * 7) % 41 if size is None else size
    return (head * (size // len(head) + 1))[:size]
