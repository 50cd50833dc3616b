"""Sealed segments verified once: a ``<segment>.verified`` sidecar lets a later open skip them.

Opening a journal checks every record's CRC (recovery.py), which costs about 0.7 s per
million records: the floor of a restart with a deep queue. A sealed segment never
changes once written (retention removes it whole; ``journal repair`` and a recovery
truncation shorten it, which changes its size and time). Rules:

- The open that checks a clean, **sealed** segment (not the last one) fsyncs it and
  writes what the check found beside it: record count, end, sparse index, keyed by the
  segment's size, modification time (ns) and inode. Written atomically; best effort
  (a read-only directory only costs the next open a full check).
- A later open trusts the sidecar instead of reading the segment only when all of the
  key still matches and the sidecar decodes; anything else (missing, stale, torn,
  foreign) means the full check. The last segment is always checked in full: it is the
  one a crash can leave torn.
- ``conveyor journal verify`` and ``repair`` always read everything, and reads check
  each record's CRC as they go, so a sealed segment damaged on disk after it was
  verified is still reported when it is read.
- Removing a segment (retention, truncation) removes its sidecar.
"""

from __future__ import annotations

import os
from array import array
from contextlib import suppress

import msgspec

VERIFIED_SUFFIX = ".verified"
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


def save(segment_path: str, base: int, records: int, end: int, valid_bytes: int, last_position: int | None, index: array) -> None:
    """Record a clean check of a sealed segment (best effort)."""
    tmp = sidecar_path(segment_path) + ".tmp"
    try:
        fd = os.open(segment_path, os.O_RDONLY)
        try:
            os.fsync(fd)  # what was checked is what is on disk
            st = os.fstat(fd)
        finally:
            os.close(fd)
        v = _Verified(FORMAT_VERSION, base, st.st_size, st.st_mtime_ns, st.st_ino, records, end, valid_bytes,
                      last_position, index.tolist())
        with open(tmp, "wb") as f:
            f.write(_encoder.encode(v))
        os.replace(tmp, sidecar_path(segment_path))
    except OSError:
        with suppress(OSError):
            os.unlink(tmp)


def remove(segment_path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(sidecar_path(segment_path))
