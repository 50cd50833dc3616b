"""The transaction log: append-only segment files of checksummed records.

The journal stores opaque payloads (the engine encodes its records itself) and gives
each a position, the logical byte offset of its frame, contiguous across segments.
It imports nothing from conveyor but :mod:`conveyor.errors` (tests/journal checks).
The format, the group-commit contract and the recovery rules are in docs/journal.md.
"""

from .format import (
    FILE_HEADER_LEN,
    FILE_MAGIC,
    FORMAT_VERSION,
    FRAME_HEADER_LEN,
    RECORD_BYTES_MAX,
    SEGMENT_BYTES_DEFAULT,
    encode_frame,
    encode_header,
)
from .journal import Batch, Journal, JournalStatistics, MemoryJournal, Piece, SegmentInfo
from .recovery import INDEX_INTERVAL_BYTES, RecoveryReport, SegmentCheck
from .storage import MemoryStore, segment_name
from .tools import RepairReport, VerifyReport, dump, repair, scan_segment, verify

__all__ = [
    "FILE_HEADER_LEN",
    "FILE_MAGIC",
    "FORMAT_VERSION",
    "FRAME_HEADER_LEN",
    "INDEX_INTERVAL_BYTES",
    "RECORD_BYTES_MAX",
    "SEGMENT_BYTES_DEFAULT",
    "Batch",
    "Journal",
    "JournalStatistics",
    "MemoryJournal",
    "MemoryStore",
    "Piece",
    "RecoveryReport",
    "RepairReport",
    "SegmentCheck",
    "SegmentInfo",
    "VerifyReport",
    "dump",
    "encode_frame",
    "encode_header",
    "repair",
    "scan_segment",
    "segment_name",
    "verify",
]
