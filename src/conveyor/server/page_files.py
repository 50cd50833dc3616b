"""FileBackedMetadata page files: the I/O half of :mod:`conveyor.engine.queue.paging`.

``<JournalDirectory>/queues/<queue>.<generation>.fbm``: append-only, read at offsets
(the rules are queue_paging's). :class:`PageFiles` is what the server hands to
``Engine.recover(pages=...)``: it lists, opens and deletes the generations of a queue,
and carries the server-wide :class:`~conveyor.engine.queue.budget.PagingBudget` every
FileBackedMetadata queue pages under (``<Limits><QueueMetadataMemory>``).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from conveyor.engine.queue.budget import DEFAULT_LIMIT, PagingBudget
from conveyor.engine.queue.paging import PageCorrupt

SUFFIX = ".fbm"


def file_stem(queue: str) -> str:
    """A file name for a queue name (anything outside [A-Za-z0-9_.-] is hashed in)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", queue)
    if safe != queue:
        safe += "-" + hashlib.sha1(queue.encode()).hexdigest()[:8]
    return safe


class PageFiles:
    """The page files of every queue in one directory, and the budget their queues'
    resident state shares (``memory`` bytes)."""

    def __init__(self, directory: Path, memory: int = DEFAULT_LIMIT) -> None:
        self.directory = Path(directory)
        self.budget = PagingBudget(memory)

    def path(self, queue: str, generation: int) -> Path:
        return self.directory / f"{file_stem(queue)}.{generation}{SUFFIX}"

    def generations(self, queue: str) -> dict[int, Path]:
        """generation -> path, for ``queue``."""
        stem = file_stem(queue)
        found = {}
        if self.directory.is_dir():
            for path in self.directory.iterdir():
                name = path.name
                if name.startswith(stem + ".") and name.endswith(SUFFIX):
                    middle = name[len(stem) + 1 : -len(SUFFIX)]
                    if middle.isdigit():
                        found[int(middle)] = path
        return found

    def open(self, queue: str, generation: int, *, fresh: bool) -> PageFile:
        return PageFile(self, queue, generation, fresh=fresh)

    def prune(self, queue: str, *, keep: int | None = None, below: int | None = None) -> None:
        """Delete generations: every one but ``keep`` (startup), or those below ``below``
        (after a snapshot naming ``below`` is durable: newer ones may be in use)."""
        for gen, path in self.generations(queue).items():
            if (keep is not None and gen != keep) or (below is not None and gen < below):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass

    def sync(self, queue: str, generation: int) -> None:
        fd = os.open(self.path(queue, generation), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class PageFile:
    """One generation of a queue's page file: append-only, read at offsets."""

    def __init__(self, files: PageFiles, queue: str, generation: int, *, fresh: bool) -> None:
        self.files = files
        self.queue = queue
        self.generation = generation
        self.path = files.path(queue, generation)
        self.name = str(self.path)
        files.directory.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if fresh else 0)
        self._fd = os.open(self.path, flags, 0o644)
        self.size = os.fstat(self._fd).st_size

    def next_generation(self) -> PageFile:
        return PageFile(self.files, self.queue, self.generation + 1, fresh=True)

    def append(self, data: bytes) -> int:
        offset = self.size
        os.pwrite(self._fd, data, offset)
        self.size += len(data)
        return offset

    def read(self, offset: int, n: int) -> bytes:
        data = os.pread(self._fd, n, offset)
        if len(data) != n:
            raise PageCorrupt(f"{self.path}: short read at {offset}")
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # an engine dropped without a shutdown (tests, crashes)
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)


