"""The on-disk format of the journal: file header, record frame, and a frame reader.

Rules this module keeps (docs/journal.md has the byte-by-byte layout):

- Everything is little-endian and packed with :mod:`struct`; nothing here does I/O.
  Readers take a ``read(offset, n) -> bytes`` callable, so the same code checks a
  file, a memory buffer or a slice handed over by a test.
- A segment file is a :data:`FILE_HEADER` followed by frames. A frame is a u32 payload
  length, a u32 CRC32C over the four length bytes *and* the payload (so a torn or
  flipped length is caught like a flipped payload byte), then the payload.
- A **position** is a byte offset in the stream of frames with the file headers left
  out: the frame at file offset ``o`` of the segment whose base is ``B`` has position
  ``B + o - FILE_HEADER_LEN``.
- Formats evolve by rule (STYLE 7): the header carries a magic number and a version.
  A reader refuses a version or a flag bit it does not know instead of guessing; a
  new version gets a new number and never changes what an old one meant.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import NamedTuple

from crc32c import crc32c

# --- limits (STYLE 9) ----------------------------------------------------------------

#: Largest payload one record may carry. The engine refuses larger messages long
#: before this (frame_bytes_max is 16 MiB); the bound exists so that a corrupt length
#: field is recognised as corrupt instead of making a reader allocate gigabytes.
RECORD_BYTES_MAX = 64 * 1024 * 1024

#: Default segment size: the reference server's JournalSize default.
SEGMENT_BYTES_DEFAULT = 1024 * 1024 * 1024

#: Largest segment size accepted. A segment is the unit of retention and of a Spark
#: partition, and recovery rescans the whole last segment: beyond this, all three get
#: too coarse to be useful.
SEGMENT_BYTES_MAX = 64 * 1024 * 1024 * 1024

#: Bytes read per system call when scanning: large enough that the call costs nothing
#: next to decoding, small enough to stay in the CPU caches.
SCAN_CHUNK_BYTES = 1024 * 1024

# --- file header ---------------------------------------------------------------------

FILE_MAGIC = b"CNVYLOG\x00"

#: Version 1: this header and the length/CRC32C frame below.
FORMAT_VERSION = 1

#: Flag bits a version-1 reader understands. None are defined yet; a reader refuses a
#: file with any other bit set, so a later writer can give a bit a meaning safely.
FLAGS_KNOWN = 0

# magic (8s), version (u16), flags (u16), base position (u64), CRC32C of the 20
# bytes before it (u32): 24 bytes.
_HEADER_BODY = struct.Struct("<8sHHQ")
_HEADER_CRC = struct.Struct("<I")
FILE_HEADER_LEN = _HEADER_BODY.size + _HEADER_CRC.size

# --- record frame --------------------------------------------------------------------

_FRAME = struct.Struct("<II")  # payload length, CRC32C(length bytes + payload)
_LENGTH = struct.Struct("<I")
FRAME_HEADER_LEN = _FRAME.size

pack_frame_header = _FRAME.pack
unpack_frame_header = _FRAME.unpack_from
pack_length = _LENGTH.pack


def encode_header(base: int) -> bytes:
    """The file header of a segment whose first record has position ``base``."""
    body = _HEADER_BODY.pack(FILE_MAGIC, FORMAT_VERSION, 0, base)
    return body + _HEADER_CRC.pack(crc32c(body))


class HeaderProblem(NamedTuple):
    """Why a file header was refused. ``kind`` decides what recovery may do with it:
    ``torn`` (shorter than a header) and ``damaged`` (CRC mismatch) may be a crash
    while the segment was created; ``foreign`` (a valid header that is not ours) and
    ``unsupported`` (a version or flag from a newer writer) never are."""

    kind: str
    text: str

    def __str__(self) -> str:
        return self.text


def decode_header(data: bytes) -> tuple[int, None] | tuple[None, HeaderProblem]:
    """``(base, None)`` for a valid header, ``(None, problem)`` otherwise.

    The checks run in an order that gives the most useful message: a short file is a
    torn creation, a bad CRC is damage, and only a header that checks out can be
    refused for a version or flag this reader does not know.
    """
    if len(data) < FILE_HEADER_LEN:
        return None, HeaderProblem("torn", f"file header torn ({len(data)} of {FILE_HEADER_LEN} bytes)")
    body = data[: _HEADER_BODY.size]
    (crc,) = _HEADER_CRC.unpack_from(data, _HEADER_BODY.size)
    if crc32c(body) != crc:
        return None, HeaderProblem("damaged", "file header CRC mismatch")
    magic, version, flags, base = _HEADER_BODY.unpack(body)
    if magic != FILE_MAGIC:
        return None, HeaderProblem("foreign", f"not a conveyor journal segment (magic {magic!r})")
    if version != FORMAT_VERSION:
        text = f"format version {version} is not supported (this reader knows {FORMAT_VERSION})"
        return None, HeaderProblem("unsupported", text)
    if flags & ~FLAGS_KNOWN:
        return None, HeaderProblem("unsupported", f"unknown header flags {flags:#06x}")
    return base, None


def encode_frame(payload: bytes) -> bytes:
    """One record frame. The journal's hot path inlines this; tests and tools use it."""
    n = len(payload)
    return pack_frame_header(n, crc32c(payload, crc32c(pack_length(n)))) + payload


def frame_crc(length: int, payload: bytes) -> int:
    return crc32c(payload, length_crc(length))


#: Payload lengths below this have the CRC32C of their four length bytes cached: most
#: records are small, and it saves a third of the CRC work on the append hot path.
_LENGTH_CRC_CACHED_BELOW = 65536
length_crcs: dict[int, int] = {}


def length_crc(n: int) -> int:
    """CRC32C of the 4 length bytes of a frame (the state the payload's CRC continues)."""
    lc = length_crcs.get(n)
    if lc is None:
        lc = crc32c(pack_length(n))
        if n < _LENGTH_CRC_CACHED_BELOW:
            length_crcs[n] = lc
    return lc


# --- reading frames ------------------------------------------------------------------


class FrameReader:
    """Iterates over the valid frames of one segment, in large chunks.

    ``read(offset, n)`` returns up to ``n`` bytes of the segment file from ``offset``.
    Iterating yields ``(file_offset, payload)`` for each valid frame from ``offset``
    up to ``limit`` (the file size, or the durable end). It stops at ``limit`` or at
    the first invalid frame; afterwards ``offset`` is where it stopped and ``problem``
    says why (``None`` when it reached ``limit`` cleanly).

    A frame is invalid when its header is cut by ``limit`` (torn), when its length is
    over :data:`RECORD_BYTES_MAX` or runs past ``limit`` (torn or damaged), or when
    its CRC does not match (damaged).
    """

    __slots__ = ("_read", "offset", "limit", "problem", "_chunk_bytes")

    def __init__(
        self,
        read: Callable[[int, int], bytes],
        offset: int,
        limit: int,
        *,
        chunk_bytes: int = SCAN_CHUNK_BYTES,
    ) -> None:
        self._read = read
        self.offset = offset
        self.limit = limit
        self.problem: str | None = None
        self._chunk_bytes = max(chunk_bytes, FRAME_HEADER_LEN)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        # Locals, not attributes, in the loop: this is the scan and recovery hot path.
        read = self._read
        limit = self.limit
        at = self.offset  # file offset of chunk[0]
        chunk = b""
        o = 0
        unpack = unpack_frame_header
        cached_length_crc = length_crcs.get
        problem = None
        while True:
            if o + FRAME_HEADER_LEN > len(chunk):
                # Refill: keep the unread tail and read the next chunk behind it.
                at += o
                o = 0
                want = min(self._chunk_bytes, limit - at)
                if want <= 0:
                    chunk = b""
                    break
                chunk = read(at, want)
                if len(chunk) < FRAME_HEADER_LEN:
                    problem = f"torn frame header ({len(chunk)} of {FRAME_HEADER_LEN} bytes)"
                    break
            n, crc = unpack(chunk, o)
            e = o + FRAME_HEADER_LEN + n
            if e > len(chunk):
                if n > RECORD_BYTES_MAX:
                    problem = f"record length {n} is over record_bytes_max ({RECORD_BYTES_MAX})"
                    break
                if at + e > limit:
                    problem = f"torn record (frame says {n} bytes, {limit - at - o - FRAME_HEADER_LEN} present)"
                    break
                # The frame runs past this chunk: read it whole, from its start.
                at += o
                chunk = read(at, min(max(self._chunk_bytes, e - o), limit - at))
                o = 0
                e = FRAME_HEADER_LEN + n
                if e > len(chunk):
                    problem = "segment shorter than expected while reading"
                    break
            payload = chunk[o + FRAME_HEADER_LEN : e]
            lc = cached_length_crc(n)
            if lc is None:
                lc = length_crc(n)
            if crc32c(payload, lc) != crc:
                problem = "CRC mismatch"
                break
            yield at + o, payload
            o = e
        self.offset = at + o
        self.problem = problem


def frame_length_at(data: bytes, o: int) -> int:
    """Payload length of the frame starting at ``data[o]`` (no checks)."""
    length: int = _LENGTH.unpack_from(data, o)[0]
    return length
