"""Where segments live: a directory of files, or a dictionary of buffers in memory.

The journal talks to its segments only through the narrow interface below, so one
implementation of the log (journal.py), of recovery and of the tools serves both the
file-backed :class:`~conveyor.journal.Journal` and the
:class:`~conveyor.journal.MemoryJournal`. Segments are named by their base position.

Threads (the group-commit contract in docs/journal.md): :meth:`write` runs on the one
writer thread and owns the write descriptor; every other method runs on the thread
that owns the journal (the event loop). The two share no mutable state here.

Durability rules a :class:`FileStorage` keeps:

- a segment is created with ``O_EXCL``, its header and first records in one
  ``writev``, then the file and the directory are fsynced, so a segment that is named
  in the directory after a crash has a header unless its creation was never reported;
- a removal fsyncs the directory before the next removal, so a crash leaves a suffix
  of the segments, never a gap;
- one process at a time: the directory is locked with ``flock`` for as long as a
  journal (or ``repair``) has it open, and the holder names itself in it (lock.py).
"""

from __future__ import annotations

import errno
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from conveyor.errors import JournalError

from . import lock as lock_directory
from . import verified
from .format import encode_header

SEGMENT_SUFFIX = ".log"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")

#: Read descriptors kept open for ``read()``; beyond this the least recently used is
#: closed. A server reads mostly from the last few segments, and a descriptor per
#: retained segment could run into the process's file limit.
READ_FDS_MAX = 32


def segment_name(base: int) -> str:
    """The file name of the segment whose first record has position ``base``."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    match = _SEGMENT_NAME.match(name)
    return int(match.group(1)) if match else None


class SegmentReader:
    """A private read handle on one segment, for a scan that may outlive retention."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def pread(self, offset: int, n: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class FileStorage:
    """Segments as files ``<base:020d>.log`` in one directory."""

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True, lock: bool = True) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self._read_fds: OrderedDict[int, int] = OrderedDict()
        self._write_fd = -1
        self._write_base = -1
        try:
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise JournalError(f"cannot open journal directory {self.directory}: {exc.strerror}") from exc
        self._locked = lock
        if lock:
            try:
                lock_directory.acquire(self._dir_fd, self.directory)  # JournalError names the holder
            except BaseException:
                os.close(self._dir_fd)
                self._dir_fd = -1
                raise

    # --- catalogue ---------------------------------------------------------------------

    def list_bases(self) -> list[int]:
        bases = (parse_segment_name(name) for name in os.listdir(self.directory))
        return sorted(b for b in bases if b is not None)

    def path(self, base: int) -> str:
        return str(self.directory / segment_name(base))

    def size(self, base: int) -> int:
        return os.stat(self.path(base)).st_size

    def stat(self, base: int) -> tuple[int, float]:
        st = os.stat(self.path(base))
        return st.st_size, st.st_mtime

    # --- reads (journal's thread) --------------------------------------------------------

    def pread(self, base: int, offset: int, n: int) -> bytes:
        fds = self._read_fds
        fd = fds.get(base)
        if fd is None:
            fd = os.open(self.path(base), os.O_RDONLY)
            fds[base] = fd
            if len(fds) > READ_FDS_MAX:
                os.close(fds.popitem(last=False)[1])
        else:
            fds.move_to_end(base)
        return os.pread(fd, n, offset)

    def reader(self, base: int) -> SegmentReader:
        return SegmentReader(os.open(self.path(base), os.O_RDONLY))

    # --- writes ----------------------------------------------------------------------

    def write(self, base: int, data: bytes | bytearray, *, create: bool) -> None:
        """Append ``data`` to segment ``base`` (creating it, header first) and sync it.

        Writer thread only. One ``writev``/``write`` system call in the normal case; a
        short write (a full disk, a signal) is continued, then reported by the error
        of the call that could not continue.
        """
        if base != self._write_base:
            self._close_writer()
            flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
            self._write_fd = os.open(self.path(base), flags, 0o644)
            self._write_base = base
        fd = self._write_fd
        if create:
            header = encode_header(base)
            done = os.writev(fd, [header, data])
            expected = len(header) + len(data)
            if done < expected:
                _write_rest(fd, memoryview(header + bytes(data))[done:])
        else:
            done = os.write(fd, data)
            if done < len(data):
                _write_rest(fd, memoryview(data)[done:])
        if self.fsync:
            os.fsync(fd)
            if create:
                os.fsync(self._dir_fd)

    def create_empty(self, base: int) -> None:
        """Create segment ``base`` with its header only (a new or a reset journal)."""
        fd = os.open(self.path(base), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_rest(fd, memoryview(encode_header(base)))
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._sync_dir()

    def truncate(self, base: int, size: int) -> None:
        self._forget_reader(base)
        # Sidecars describe the segment before the cut (a durable prefix past the new
        # end would make the next open refuse a log that is now consistent): drop them
        # first, so a crash part-way leaves at worst a segment without sidecars.
        verified.remove(self.path(base))
        self._sync_dir()
        fd = os.open(self.path(base), os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, base: int) -> None:
        self._forget_reader(base)
        os.unlink(self.path(base))
        verified.remove(self.path(base))
        self._sync_dir()

    def close(self) -> None:
        self._close_writer()
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._dir_fd >= 0:
            if self._locked:
                lock_directory.release(self.directory)  # forget the holder while still holding it
            os.close(self._dir_fd)  # also releases the flock
            self._dir_fd = -1

    # --- helpers ----------------------------------------------------------------------

    def _close_writer(self) -> None:
        if self._write_fd >= 0:
            os.close(self._write_fd)
        self._write_fd = -1
        self._write_base = -1

    def _forget_reader(self, base: int) -> None:
        fd = self._read_fds.pop(base, None)
        if fd is not None:
            os.close(fd)

    def _sync_dir(self) -> None:
        if self.fsync:
            os.fsync(self._dir_fd)


def _write_rest(fd: int, view: memoryview) -> None:
    while view:
        done = os.write(fd, view)
        view = view[done:]


class _MemoryReader:
    def __init__(self, data: bytearray) -> None:
        self._data = data

    def pread(self, offset: int, n: int) -> bytes:
        return bytes(self._data[offset : offset + n])

    def close(self) -> None:
        pass


class MemoryStore:
    """The durable state of a :class:`~conveyor.journal.MemoryJournal`.

    It plays the part of the directory: a journal opened again on the same store sees
    what was written (``write_batch``) and nothing that was only appended, which is
    what a crash leaves. ``files`` maps base position to the bytes of that segment,
    header included, so tests can damage them. ``clock`` stamps modification times
    (for retention by age) so simulations can run in virtual time.
    """

    fsync = False

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        import time

        self.clock = clock or time.time
        self.files: dict[int, bytearray] = {}
        self.mtimes: dict[int, float] = {}
        self.directory = "<memory>"

    def list_bases(self) -> list[int]:
        return sorted(self.files)

    def path(self, base: int) -> str:
        return f"<memory>/{segment_name(base)}"

    def size(self, base: int) -> int:
        return len(self.files[base])

    def stat(self, base: int) -> tuple[int, float]:
        return len(self.files[base]), self.mtimes[base]

    def pread(self, base: int, offset: int, n: int) -> bytes:
        return bytes(self.files[base][offset : offset + n])

    def reader(self, base: int) -> _MemoryReader:
        return _MemoryReader(self.files[base])

    def write(self, base: int, data: bytes | bytearray, *, create: bool) -> None:
        if create:
            if base in self.files:
                raise FileExistsError(errno.EEXIST, "segment exists", self.path(base))
            self.files[base] = bytearray(encode_header(base))
        self.files[base] += data
        self.mtimes[base] = self.clock()

    def create_empty(self, base: int) -> None:
        self.files[base] = bytearray(encode_header(base))
        self.mtimes[base] = self.clock()

    def truncate(self, base: int, size: int) -> None:
        del self.files[base][size:]
        self.mtimes[base] = self.clock()

    def remove(self, base: int) -> None:
        del self.files[base]
        del self.mtimes[base]

    def close(self) -> None:
        pass
