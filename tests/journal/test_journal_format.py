"""The byte format is pinned (STYLE 7), the frame reader is chunk-proof, the layering holds."""

from __future__ import annotations

import ast
import random
import struct
from pathlib import Path

import pytest
from crc32c import crc32c

import conveyor.journal
from conveyor.journal import FILE_HEADER_LEN, FRAME_HEADER_LEN, encode_frame, encode_header
from conveyor.journal.format import FrameReader, decode_header


def test_file_header_bytes_are_pinned():
    # magic, version 1, flags 0, base (u64), CRC32C of the 20 bytes before it.
    assert FILE_HEADER_LEN == 24
    assert encode_header(0).hex() == "434e56594c4f47000100000000000000000000005a381f27"
    assert encode_header(1234).hex() == "434e56594c4f470001000000d2040000000000002753f0ba"
    assert decode_header(encode_header(1234)) == (1234, None)


def test_frame_bytes_are_pinned():
    # length (u32), CRC32C over the length bytes and the payload (u32), payload.
    assert FRAME_HEADER_LEN == 8
    assert encode_frame(b"abc").hex() == "03000000f8831455616263"
    assert encode_frame(b"").hex() == "00000000c74b6748"
    assert int.from_bytes(encode_frame(b"abc")[4:8], "little") == crc32c(b"\x03\x00\x00\x00abc")


def _header(magic=b"CNVYLOG\x00", version=1, flags=0, base=5):
    body = struct.pack("<8sHHQ", magic, version, flags, base)
    return body + struct.pack("<I", crc32c(body))


@pytest.mark.parametrize(
    "data, kind, text",
    [
        (b"", "torn", "torn (0 of 24 bytes)"),
        (encode_header(5)[:10], "torn", "torn (10 of 24 bytes)"),
        (b"X" + encode_header(5)[1:], "damaged", "CRC mismatch"),
        (_header(magic=b"OTHERLOG"), "foreign", "not a conveyor journal segment"),
        (_header(version=2), "unsupported", "version 2 is not supported"),
        (_header(flags=4), "unsupported", "unknown header flags 0x0004"),
    ],
)
def test_bad_headers_say_why(data, kind, text):
    assert _header() == encode_header(5)
    base, why = decode_header(data)
    assert base is None and why.kind == kind and text in str(why)


@pytest.mark.parametrize("chunk_bytes", [8, 9, 13, 64, 1000, 1 << 20])
def test_frame_reader_is_independent_of_chunk_size(chunk_bytes):
    rng = random.Random(chunk_bytes)
    payloads = [rng.randbytes(rng.choice([0, 1, 7, 100, 3000])) for _ in range(200)]
    data = b"".join(encode_frame(p) for p in payloads)
    reader = FrameReader(lambda o, n: data[o : o + n], 0, len(data), chunk_bytes=chunk_bytes)
    assert [p for _, p in reader] == payloads
    assert (reader.offset, reader.problem) == (len(data), None)


@pytest.mark.parametrize("chunk_bytes", [8, 50, 1 << 20])
def test_frame_reader_stops_at_the_first_invalid_frame(chunk_bytes):
    frames = [encode_frame(bytes([i]) * 20) for i in range(5)]
    data = bytearray(b"".join(frames))
    data[3 * 28 + 10] ^= 0x40  # payload of the fourth record
    reader = FrameReader(lambda o, n: bytes(data[o : o + n]), 0, len(data), chunk_bytes=chunk_bytes)
    assert len(list(reader)) == 3
    assert (reader.offset, reader.problem) == (3 * 28, "CRC mismatch")
    torn = bytes(data[: 3 * 28 + 5])
    reader = FrameReader(lambda o, n: torn[o : o + n], 0, len(torn), chunk_bytes=chunk_bytes)
    assert len(list(reader)) == 3 and "torn frame header" in reader.problem
    huge = b"".join(frames[:2]) + (0xFFFFFFF0).to_bytes(4, "little") + bytes(4)
    reader = FrameReader(lambda o, n: huge[o : o + n], 0, len(huge), chunk_bytes=chunk_bytes)
    assert len(list(reader)) == 2 and "record_bytes_max" in reader.problem


def test_frame_reader_never_reads_past_its_limit():
    data = b"".join(encode_frame(b"x" * 10) for _ in range(4))
    seen = []

    def read(o, n):
        seen.append(o + n)
        return data[o : o + n]

    reader = FrameReader(read, 0, 36, chunk_bytes=5)
    assert len(list(reader)) == 2
    assert max(seen) <= 36


def test_the_journal_imports_nothing_from_conveyor_but_errors():
    """Layering (STYLE 5): the journal is below the engine, the server and the rest."""
    package = Path(conveyor.journal.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name == "conveyor" or name.startswith("conveyor."):
                    assert name == "conveyor.errors", f"{path.name} imports {name}"
