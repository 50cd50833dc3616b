"""Publish stores: every publish is kept until the server reports it persisted.

Two implementations of one small interface (``add``, ``discard_up_to``, ``discard``,
``unpersisted``, ``last_seq``, ``sync``, ``close``):

- :class:`PublishStore` keeps messages in memory. It survives a lost connection, not
  the end of the process.
- :class:`FilePublishStore` also appends every change to a file, so a client that is
  restarted with the same client name and the same file republishes what the server
  never confirmed, under the same sequence numbers (the server drops the ones it has).

The file is append-only (STYLE 10)::

    header  : b"CVPS" | version u16 | flags u16           (8 bytes, big-endian)
    record  : length u32 | crc32c(body) u32 | body         (body: a MessagePack array)
    bodies  : [1, seq, topic, data, correlation_id]       a publish
              [1, seq, topic, data, correlation_id, extra] a publish with options
                                                           (extra: {"d": 1} a delta publish,
                                                           "k": sow_key, "e": expiration)
              [2, seq]                                     persisted: every seq <= it
              [3, seq]                                     done: one seq (a duplicate)
              [4, seq]                                     the highest seq used so far

On open the file is replayed; at the first record that is short, fails its checksum or
does not decode, the file is truncated and the loss is logged (a torn tail from a
crash, never something that was confirmed). Durability: records are buffered and
written by :meth:`sync`, which the client calls before it sends a batch of publishes, so
a message is in the file before the server can have seen it; with ``fsync=True`` (the
default) that write is fsynced too: one fsync per batch, not per message. Persisted
marks need no fsync: losing one only means a republish, which the server drops as a
duplicate. When the file holds little that is still needed (everything persisted, or
less than a quarter of it live), it is rewritten to a new file and renamed over the old.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
from collections import OrderedDict
from pathlib import Path

import msgspec
from crc32c import crc32c

from conveyor import errors

log = logging.getLogger("conveyor.client")

MAGIC = b"CVPS"
VERSION = 1
_HEADER = struct.Struct(">4sHH")
_RECORD = struct.Struct(">II")
PUBLISH, PERSISTED, DONE, MARK = 1, 2, 3, 4
RECORD_BYTES_MAX = 1 << 31  # a larger declared length can only be damage
COMPACT_BYTES_MIN = 1 << 20  # below 1 MiB a rewrite costs more than the space it saves
COMPACT_LIVE_FRACTION = 4  # rewrite when the file is 4x what is still live

Entry = tuple[int, str, bytes, "str | None"]

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class PublishStore:
    """In-memory publish store: messages kept until persisted, in sequence order."""

    def __init__(self) -> None:
        self._entries: OrderedDict[int, tuple[str, bytes, str | None]] = OrderedDict()
        self._extras: dict[int, dict] = {}  # seq -> the publish's options, when it has any
        self._last_seq = 0

    @property
    def last_seq(self) -> int:
        """The highest sequence number this store has seen (0: none)."""
        return self._last_seq

    def add(self, seq: int, topic: str, data: bytes, correlation_id: str | None, extra: dict | None = None) -> None:
        self._entries[seq] = (topic, data, correlation_id)
        if extra:
            self._extras[seq] = extra
        if seq > self._last_seq:
            self._last_seq = seq

    def extra(self, seq: int) -> dict | None:
        """The options of the publish ``seq`` (delta, sow_key, expiration), if any."""
        return self._extras.get(seq) if self._extras else None

    def discard_up_to(self, seq: int) -> None:
        """The server persisted every sequence up to ``seq``."""
        entries = self._entries
        extras = self._extras
        while entries:
            first = next(iter(entries))
            if first > seq:
                break
            del entries[first]
            if extras:
                extras.pop(first, None)
        if seq > self._last_seq:
            self._last_seq = seq

    def discard(self, seq: int) -> None:
        """One sequence is done (the server reported it a duplicate)."""
        self._entries.pop(seq, None)
        self._extras.pop(seq, None)

    def unpersisted(self) -> list[Entry]:
        return [(seq, *rest) for seq, rest in self._entries.items()]

    def sync(self) -> None:
        """Make every change so far durable (nothing to do in memory)."""

    def close(self) -> None:
        """Release what the store holds (nothing in memory)."""

    def __len__(self) -> int:
        return len(self._entries)


class FilePublishStore(PublishStore):
    """A publish store backed by an append-only file (see the module docstring).

    One client at a time: the store holds an exclusive lock on ``<path>.lock`` and
    refuses a second opener with a :class:`~conveyor.errors.ClientError`. Use one file
    per client name; the name is what lets the server recognise the republished
    sequence numbers.
    """

    def __init__(self, path: str | os.PathLike, *, fsync: bool = True) -> None:
        super().__init__()
        self.path = Path(path)
        self.fsync = fsync
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._buffer = bytearray()
        self._publishes_buffered = False
        self._file_bytes = 0
        self._live_bytes = 0
        self._sizes: dict[int, int] = {}
        self.dropped_bytes = 0  # torn tail truncated at open
        self._open(replay=True)

    # --- the interface ---------------------------------------------------------------

    def add(self, seq: int, topic: str, data: bytes, correlation_id: str | None, extra: dict | None = None) -> None:
        body = (PUBLISH, seq, topic, data, correlation_id, extra) if extra else (PUBLISH, seq, topic, data, correlation_id)
        record = _frame(_encode(body))
        self._append(record)
        self._publishes_buffered = True
        self._track_add(seq, len(record))
        super().add(seq, topic, data, correlation_id, extra)

    def discard_up_to(self, seq: int) -> None:
        if not self._entries or next(iter(self._entries)) > seq:
            super().discard_up_to(seq)
            return
        self._append(_frame(_encode((PERSISTED, seq))))
        self._drop_up_to(seq)
        self._maybe_compact()

    def _drop_up_to(self, seq: int) -> None:
        entries = self._entries
        while entries:
            first = next(iter(entries))
            if first > seq:
                break
            del entries[first]
            self._extras.pop(first, None)
            self._live_bytes -= self._sizes.pop(first, 0)
        if seq > self._last_seq:
            self._last_seq = seq

    def discard(self, seq: int) -> None:
        if seq in self._entries:
            self._append(_frame(_encode((DONE, seq))))
            self._live_bytes -= self._sizes.pop(seq, 0)
            super().discard(seq)
            self._maybe_compact()

    def sync(self) -> None:
        if not self._buffer:
            return
        fd = self._ensure_open()
        data = bytes(self._buffer)
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        self._file_bytes += len(data)
        self._buffer.clear()
        if self.fsync and self._publishes_buffered:
            os.fdatasync(fd)
        self._publishes_buffered = False

    def close(self) -> None:
        """Write what is buffered and release the file and its lock (reopened on use)."""
        if self._fd is None:
            return
        self.sync()
        os.close(self._fd)
        self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    @property
    def file_bytes(self) -> int:
        return self._file_bytes + len(self._buffer)

    def __enter__(self) -> "FilePublishStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the file --------------------------------------------------------------------

    def _lock(self) -> None:
        lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise errors.ClientError(f"publish store {self.path} is in use by another client") from None
        self._lock_fd = lock_fd

    def _open(self, *, replay: bool) -> int:
        self._lock()
        stale = Path(f"{self.path}.compact")
        if stale.exists():
            stale.unlink()  # a compaction that did not finish: the original is intact
        if not self.path.exists() or self.path.stat().st_size == 0:
            self._write_file(self.path, [])
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self._fd = fd
        if replay:
            self._replay(fd)
        else:
            self._file_bytes = os.fstat(fd).st_size
        return fd

    def _ensure_open(self) -> int:
        return self._fd if self._fd is not None else self._open(replay=False)

    def _replay(self, fd: int) -> None:
        raw = self.path.read_bytes()
        if len(raw) < _HEADER.size:
            raise errors.ClientError(f"{self.path} is not a publish store (too short)")
        magic, version, _flags = _HEADER.unpack_from(raw, 0)
        if magic != MAGIC:
            raise errors.ClientError(f"{self.path} is not a publish store (bad magic {magic!r})")
        if version > VERSION:
            raise errors.ClientError(f"{self.path} was written by a newer client (store version {version})")
        offset = _HEADER.size
        while offset < len(raw):
            body = _read_record(raw, offset)
            if body is None or not self._apply(body, _RECORD.size + len(body)):
                break
            offset += _RECORD.size + len(body)
        if offset < len(raw):
            self.dropped_bytes = len(raw) - offset
            log.warning("publish store %s: dropped %d byte(s) of a torn or damaged tail at offset %d",
                        self.path, self.dropped_bytes, offset)
            os.ftruncate(fd, offset)
            os.fsync(fd)
        self._file_bytes = offset

    def _apply(self, body: bytes, size: int) -> bool:
        try:
            rec = _decode(body)
            kind, seq = rec[0], rec[1]
            if kind == PUBLISH:
                _, _, topic, data, corr, *more = rec
                self._track_add(seq, size)
                PublishStore.add(self, seq, topic, data, corr, more[0] if more else None)
            elif kind == PERSISTED:
                self._drop_up_to(seq)
            elif kind == DONE:
                self._live_bytes -= self._sizes.pop(seq, 0)
                PublishStore.discard(self, seq)
            elif kind == MARK:
                self._last_seq = max(self._last_seq, seq)
            else:
                return False
        except (msgspec.DecodeError, ValueError, TypeError, IndexError):
            return False
        return True

    def _track_add(self, seq: int, size: int) -> None:
        self._live_bytes += size - self._sizes.get(seq, 0)
        self._sizes[seq] = size

    def _append(self, record: bytes) -> None:
        self._buffer += record

    def _maybe_compact(self) -> None:
        size = self.file_bytes
        if size < COMPACT_BYTES_MIN:
            return
        if self._entries and self._live_bytes * COMPACT_LIVE_FRACTION > size:
            return
        self.compact()

    def compact(self) -> None:
        """Rewrite the file with only what is still needed, then rename it over the old."""
        self._ensure_open()
        records = [_frame(_encode((MARK, self._last_seq)))]
        records += [
            _frame(_encode((PUBLISH, seq, t, d, c, x) if (x := self.extra(seq)) else (PUBLISH, seq, t, d, c)))
            for seq, t, d, c in self.unpersisted()
        ]
        tmp = Path(f"{self.path}.compact")
        self._write_file(tmp, records)
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        assert self._fd is not None
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self._buffer.clear()
        self._publishes_buffered = False
        self._file_bytes = _HEADER.size + sum(len(r) for r in records)

    @staticmethod
    def _write_file(path: Path, records: list[bytes]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _HEADER.pack(MAGIC, VERSION, 0) + b"".join(records))
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(path.parent)


def _frame(body: bytes) -> bytes:
    return _RECORD.pack(len(body), crc32c(body)) + body


def _read_record(raw: bytes, offset: int) -> bytes | None:
    """The body of the record at ``offset``, or None if it is short or damaged."""
    if offset + _RECORD.size > len(raw):
        return None
    length, crc = _RECORD.unpack_from(raw, offset)
    start = offset + _RECORD.size
    if length > RECORD_BYTES_MAX or start + length > len(raw):
        return None
    body = raw[start : start + length]
    return body if crc32c(body) == crc else None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
