"""Typed replies of the named-consumer and transaction commands (``Ack.result``).

The server builds one of these structs for each ``claim``, ``lease``, ``fetch``,
``ack_through``, ``extend``, ``reclaim``, ``head``, ``consumer_info``, ``stage``,
``commit_txn``, ``abort_txn``, ``journal_segments`` and ``journal_read``; on the wire
it is the MessagePack map of its fields (so replies from servers that wrote plain maps
decode the same). Clients turn the map back into the struct with :func:`decode`, so a misspelt or missing key fails at the
seam with a clear error instead of as a ``KeyError`` deep inside a Spark executor.

Rules (STYLE 7): fields are only appended, each with a default; a field never changes
meaning.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from conveyor import errors


class _Reply(msgspec.Struct, frozen=True, kw_only=True):
    pass


class ClaimReply(_Reply, frozen=True):
    """The consumer is now fenced at ``epoch``; ``d`` its last delivery, ``acked`` A."""

    epoch: int
    d: int = 0
    acked: int = 0


class LeaseReply(_Reply, frozen=True):
    """``d``: the last delivery this call covers; ``leased`` new deliveries; ``reoffered``
    deliveries re-offered (a replayed batch), of which ``renewed`` were still held,
    ``taken`` were available again, ``held_elsewhere`` leased to another subscriber and
    ``done`` already acknowledged or expired. ``D``: the consumer's last delivery."""

    d: int
    leased: int = 0
    reoffered: int = 0
    D: int = 0
    renewed: int = 0
    taken: int = 0
    held_elsewhere: int = 0
    done: int = 0


class ReclaimReply(_Reply, frozen=True):
    renewed: int = 0
    held_elsewhere: int = 0
    done: int = 0


class AckThroughReply(_Reply, frozen=True):
    acked: int


class ExtendReply(_Reply, frozen=True):
    renewed: int = 0


class HeadReply(_Reply, frozen=True):
    upto: int


class ConsumerInfoReply(_Reply, frozen=True):
    d: int = 0
    acked: int = 0
    epoch: int = 0
    unacked: int = 0


class FetchDone(_Reply, frozen=True):
    """Ends a fetch: ``count`` messages were sent before it."""

    count: int = 0


class StageReply(_Reply, frozen=True):
    staged: int = 0


class CommitReply(_Reply, frozen=True):
    published: int = 0


class AbortReply(_Reply, frozen=True):
    discarded: int = 0


class SegmentInfo(_Reply, frozen=True):
    """One segment file: its first position, the bytes a reader may read (the header
    included; for the newest segment, up to what is durable), whether it is sealed, and
    its summary (conveyor.journal.index, as JSON) when a valid one exists."""

    base: int
    size: int
    sealed: bool
    summary: bytes | None = None


class JournalSegmentsReply(_Reply, frozen=True):
    journal: str  # the journal's identity: JournalRead names it
    segments: list[SegmentInfo] = []


class JournalChunk(_Reply, frozen=True):
    data: bytes = b""


R = TypeVar("R", bound=_Reply)


def decode(result: Any, reply_type: type[R]) -> R:
    """The ``Ack.result`` map as ``reply_type``; :class:`conveyor.errors.BadReply` when
    the server's map does not fit it."""
    if isinstance(result, reply_type):
        return result
    try:
        return msgspec.convert(result or {}, reply_type)
    except msgspec.ValidationError as exc:
        raise errors.BadReply(f"malformed {reply_type.__name__} from the server: {exc}") from None
