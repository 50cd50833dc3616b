"""Verified sidecars: what lets an open skip checking every record of every segment.

Opening a journal checks every record's CRC (recovery.py), which costs about 0.7 s per
million records: the floor of a restart with a deep queue. Two sidecars remove it:

- ``<segment>.verified``, for a **sealed** segment (never changes once written;
  retention removes it whole; ``journal repair`` and a recovery truncation shorten it,
  which changes its size and time). The open that checks it clean fsyncs it and writes
  what the check found: record count, end, sparse index, keyed by the segment's size,
  modification time (ns) and inode. A later open trusts it while all of the key still
  matches.
- ``<segment>.prefix``, for the **open** segment, whose size and time keep changing.
  The writer thread keeps the CRC32C of everything it wrote to that segment (computed
  in hardware as it writes), and the server saves the durable prefix's end, record
  count, sparse index and CRC with each checkpoint (``Journal.save_prefix``). An open
  re-reads that prefix in one CRC32C pass (GB/s) and checks only what follows record by
  record, as before; a sealed segment without a ``.verified`` uses it the same way.

Rules: a missing, torn, stale or foreign sidecar, or a prefix whose CRC no longer
matches, means the full check (never a trusted guess); both are written atomically and
best effort (a read-only directory only costs the next open a full check);
``conveyor journal verify`` and ``repair`` always read everything; every read checks
the record's CRC again, so damage after verification is still reported when the record
is read; removing a segment removes its sidecars.
"""

from __future__ import annotations

import os
from array import array
from contextlib import suppress

import msgspec
from crc32c import crc32c

from .files import write_atomic
from .format import FILE_HEADER_LEN

VERIFIED_SUFFIX = ".verified"
PREFIX_SUFFIX = ".prefix"
_READ_BYTES = 1024 * 1024  # fits a core's cache: the CRC reads what the read just wrote
FORMAT_VERSION = 1


class _Verified(msgspec.Struct, array_like=True):
    version: int
    base: int
    size: int
    mtime_ns: int
    ino: int
    records: int
    end: int
    valid_bytes: int
    last_position: int | None
    index: list[int]
    # The CRC32C of file bytes [FILE_HEADER_LEN, valid_bytes): what keys a prefix of the
    # open segment (``.prefix`` sidecars), whose size and time keep changing.
    prefix_crc: int = -1


_decoder = msgspec.msgpack.Decoder(_Verified)
_encoder = msgspec.msgpack.Encoder()


def sidecar_path(segment_path: str) -> str:
    return segment_path + VERIFIED_SUFFIX


def load(segment_path: str, base: int) -> _Verified | None:
    """The sidecar of a segment, if it still describes the file exactly."""
    try:
        st = os.stat(segment_path)
        with open(sidecar_path(segment_path), "rb") as f:
            v = _decoder.decode(f.read())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if (v.version, v.base, v.size, v.mtime_ns, v.ino) != (FORMAT_VERSION, base, st.st_size, st.st_mtime_ns, st.st_ino):
        return None
    return v


def save(segment_path: str, base: int, records: int, end: int, valid_bytes: int, last_position: int | None, index: array[int]) -> None:
    """Record a clean check of a sealed segment (best effort)."""
    try:
        fd = os.open(segment_path, os.O_RDONLY)
        try:
            os.fsync(fd)  # what was checked is what is on disk
            st = os.fstat(fd)
        finally:
            os.close(fd)
        v = _Verified(FORMAT_VERSION, base, st.st_size, st.st_mtime_ns, st.st_ino, records, end, valid_bytes,
                      last_position, index.tolist())
        # Not durable: a lost or torn sidecar only costs the next open a full check.
        write_atomic(sidecar_path(segment_path), _encoder.encode(v), durable=False)
    except OSError:
        pass


def remove(segment_path: str) -> None:
    for path in (sidecar_path(segment_path), segment_path + PREFIX_SUFFIX):
        with suppress(FileNotFoundError):
            os.unlink(path)


# --- the open segment: a verified prefix, keyed by its CRC32C ------------------------------
#
# The running server knows the CRC32C of everything it wrote to the open segment (the
# writer thread computes it as it writes, in hardware), so at each checkpoint it saves
# ``<segment>.prefix``: the durable prefix's end, record count, sparse index and CRC.
# An open re-reads that prefix with one CRC32C pass (GB/s, against about 0.7 s per
# million records for the record-by-record check) and checks only what follows.


def file_crc(path: str, start: int, end: int, crc: int = 0) -> int:
    """CRC32C of file bytes [start, end), continuing from ``crc``. Read into one reused
    buffer: a new bytes object per read costs its page faults and a copy, which doubled
    the pass over a 300 MB prefix (the floor of a restart, issue 38)."""
    buffer = memoryview(bytearray(min(_READ_BYTES, max(end - start, 0))))
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        left = end - start
        while left > 0:
            n = f.readinto(buffer[: min(_READ_BYTES, left)])
            if not n:
                raise OSError(f"{path}: ends before offset {end}")
            crc = crc32c(buffer[:n], crc)
            left -= n
    return crc


def read_prefix(segment_path: str, base: int) -> _Verified | None:
    """The saved prefix sidecar of a segment as written, without checking the segment
    against it: what the server recorded as durable (``valid_bytes``), for recovery to
    tell a torn last write (after it) from damage to acknowledged records (before it)."""
    try:
        with open(segment_path + PREFIX_SUFFIX, "rb") as f:
            v = _decoder.decode(f.read())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if v.version != FORMAT_VERSION or v.base != base or v.prefix_crc < 0 or not v.index or v.index[0] != base:
        return None
    return v


def load_prefix(segment_path: str, base: int) -> _Verified | None:
    """The saved prefix of a segment, if the file still starts with exactly those bytes."""
    v = read_prefix(segment_path, base)
    if v is None:
        return None
    try:
        if os.stat(segment_path).st_size < v.valid_bytes:
            return None
        if file_crc(segment_path, FILE_HEADER_LEN, v.valid_bytes) != v.prefix_crc:
            return None
    except OSError:
        return None
    return v


def save_prefix(segment_path: str, base: int, records: int, end: int, valid_bytes: int, index: list[int], crc: int) -> None:
    """Save a prefix of the open segment that is durable and whose CRC32C is ``crc``
    (best effort; no fsync: a lost or torn sidecar only costs the next open a full check)."""
    v = _Verified(FORMAT_VERSION, base, valid_bytes, 0, 0, records, end, valid_bytes, None, index, crc)
    try:
        write_atomic(segment_path + PREFIX_SUFFIX, _encoder.encode(v), durable=False)
    except OSError:
        pass
