"""``<TransactionLog>``: where the journal lives and which topics it records (A.5).

Rules:

- ``JournalDirectory`` is required. Paths are kept as written; a relative path is
  relative to the server's working directory, as in AMPS.
- ``JournalSize`` and its synonym ``MinJournalSize`` set the segment size; give one of
  them. It may not be below ``JOURNAL_SEGMENT_BYTES_MIN`` (1 MiB; the reference's
  minimum is 10M, conveyor allows smaller segments for tests and small installations)
  nor above ``JOURNAL_SEGMENT_BYTES_MAX`` (64 GiB, the most the journal takes).
- ``PreallocatedJournalFiles`` is a positive count; ``FlushInterval`` a duration that
  may be zero ("commit as soon as the previous commit finishes").
- Each ``Topic`` has a ``Name`` (literal, or a regex that must compile) and a
  ``MessageType`` (default ``json``).
- ``Retention`` (a conveyor extension) bounds sealed segments by ``MaxAge`` and/or
  ``MaxSize``; without it nothing is removed.
- ``FreeSpaceWarning`` (a conveyor extension) is a size, ``0`` allowed (never warn).
- ``Scrub`` (a conveyor extension): ``Rate`` a size per second, ``0`` allowed (no
  background scrub); ``Interval`` a positive duration.
- ``CheckpointSize`` (a conveyor extension) is a size, ``0`` allowed (only the periodic
  checkpoint).
"""

from __future__ import annotations

import re
from pathlib import Path

from conveyor.config.model import (
    JOURNAL_SEGMENT_BYTES_MAX,
    JOURNAL_SEGMENT_BYTES_MIN,
    RecordedTopic,
    Retention,
    Scrub,
    TransactionLog,
    is_regex_topic,
)
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, Document, Node

_TRANSACTION_LOG = {
    "JournalDirectory": REQUIRED,
    "JournalArchiveDirectory": OPTIONAL,
    "PreallocatedJournalFiles": OPTIONAL,
    "JournalSize": OPTIONAL,
    "MinJournalSize": OPTIONAL,
    "FlushInterval": OPTIONAL,
    "Topic": MANY,
    "Retention": OPTIONAL,
    "FreeSpaceWarning": OPTIONAL,
    "Scrub": OPTIONAL,
    "CheckpointSize": OPTIONAL,
}
_TOPIC = {"Name": REQUIRED, "MessageType": OPTIONAL}
_DESTINATION_TOPIC = {**_TOPIC, "Filter": OPTIONAL}  # a Replication/Destination's Topic
_RETENTION = {"MaxAge": OPTIONAL, "MaxSize": OPTIONAL}
_SCRUB = {"Rate": OPTIONAL, "Interval": OPTIONAL}


def read_transaction_log(doc: Document, node: Node) -> TransactionLog:
    kids = doc.children(node, _TRANSACTION_LOG)
    values: dict[str, object] = {}
    journal = kids.one("JournalDirectory")
    assert journal is not None  # REQUIRED
    if (n := kids.one("JournalArchiveDirectory")) is not None:
        values["archive_directory"] = Path(doc.text(n))
    if (n := kids.one("PreallocatedJournalFiles")) is not None:
        values["preallocated_journal_files"] = doc.positive_int(n)
    if "JournalSize" in kids and "MinJournalSize" in kids:
        n = kids.one("MinJournalSize")
        assert n is not None
        raise doc.error(
            n.path,
            "<JournalSize> and <MinJournalSize> both set the segment size",
            "keep one of them (MinJournalSize is the older name)",
        )
    if (n := kids.one("JournalSize") or kids.one("MinJournalSize")) is not None:
        values["segment_bytes"] = _segment_bytes(doc, n)
    if (n := kids.one("FlushInterval")) is not None:
        values["flush_interval_s"] = doc.duration(n, positive=False)
    if (n := kids.one("Retention")) is not None:
        values["retention"] = _read_retention(doc, n)
    if (n := kids.one("FreeSpaceWarning")) is not None:
        values["free_space_warning_bytes"] = doc.size(n, positive=False)
    if (n := kids.one("Scrub")) is not None:
        values["scrub"] = _read_scrub(doc, n)
    if (n := kids.one("CheckpointSize")) is not None:
        values["checkpoint_bytes"] = doc.size(n, positive=False)
    topics = tuple(read_recorded_topic(doc, t) for t in kids.many("Topic"))
    return TransactionLog(journal_directory=Path(doc.text(journal)), topics=topics, **values)  # type: ignore[arg-type]


def read_recorded_topic(doc: Document, node: Node, *, filter_allowed: bool = False) -> RecordedTopic:
    """A ``Topic`` with ``Name`` and ``MessageType`` (also used by replication, whose
    destination topics may have a ``Filter``: ``filter_allowed``)."""
    kids = doc.children(node, _DESTINATION_TOPIC if filter_allowed else _TOPIC)
    name_node = kids.one("Name")
    assert name_node is not None  # REQUIRED
    name = topic_name(doc, name_node, regex_allowed=True)
    type_node = kids.one("MessageType")
    filter_node = kids.one("Filter") if filter_allowed else None
    return RecordedTopic(name=name, message_type=doc.text(type_node) if type_node is not None else "json",
                         filter=doc.text(filter_node) if filter_node is not None else None)


def topic_name(doc: Document, node: Node, *, regex_allowed: bool) -> str:
    """A topic name; a regex must compile, and is refused where only a name will do."""
    name = doc.text(node)
    if not is_regex_topic(name):
        return name
    if not regex_allowed:
        raise doc.error(
            node.path,
            f"<{node.tag}> must be a topic name, not a regular expression: {name!r}",
            "use a literal name (without ^ $ * + ? ( ) [ ] { } | \\)",
        )
    try:
        re.compile(name)
    except (re.error, OverflowError, RecursionError) as e:  # RecursionError: "((((..." thousands deep
        raise doc.error(
            node.path,
            f"{name!r} is not a valid regular expression: {e}",
            "topic patterns use Python regular-expression syntax (close to PCRE)",
        ) from None
    return name


def _segment_bytes(doc: Document, node: Node) -> int:
    value = doc.size(node)
    if value < JOURNAL_SEGMENT_BYTES_MIN:
        raise doc.error(
            node.path,
            f"<{node.tag}> of {value} bytes is below the minimum of "
            f"{JOURNAL_SEGMENT_BYTES_MIN} bytes",
            "use at least 1M (the default is 1G)",
        )
    if value > JOURNAL_SEGMENT_BYTES_MAX:
        raise doc.error(
            node.path,
            f"<{node.tag}> of {value} bytes is above the maximum of {JOURNAL_SEGMENT_BYTES_MAX} bytes",
            "use at most 64G (the default is 1G): a segment is the unit of retention, of a Spark partition "
            "and of the rescan at startup",
        )
    return value


def _read_retention(doc: Document, node: Node) -> Retention:
    kids = doc.children(node, _RETENTION)
    age = kids.one("MaxAge")
    size = kids.one("MaxSize")
    return Retention(
        max_age_s=doc.duration(age) if age is not None else None,
        max_bytes=doc.size(size) if size is not None else None,
    )


def _read_scrub(doc: Document, node: Node) -> Scrub:
    kids = doc.children(node, _SCRUB)
    rate = kids.one("Rate")
    interval = kids.one("Interval")
    return Scrub(
        bytes_per_s=doc.size(rate, positive=False) if rate is not None else Scrub.bytes_per_s,
        interval_s=doc.duration(interval) if interval is not None else Scrub.interval_s,
    )
