"""The replication link protocol between two instances, as frozen structs (no I/O).

A link runs from a *source* (the instance whose journal is shipped) to a *destination*
(the instance that records what it receives), over the destination's incoming
replication transport. It uses the framing of :mod:`conveyor.protocol.codec` (a 4-byte
length, then a MessagePack array of entries). Rules:

1. **Handshake.** The source sends :class:`Hello` with its :class:`Profile` (instance,
   group, journal identity, protocol version, queue definitions, destinations). The
   destination answers :class:`Welcome` with its own profile and ``resume_from``: the
   source position below which it already holds everything it needs from this source's
   journal ``journal_id`` (0 when the journal is new to it), or :class:`Refused` with a
   reason (a configuration rule that the two instances break together, a wrong version).
   ``Hello.journal_end`` is the source's durable journal end when it says hello: the
   destination counts the source as caught up once the stream has brought it that far
   (docs/replication.md, "After a restart: catching up"). A source that predates the
   field sends none (None): the destination counts it as caught up at once.
   ``Hello.catching_up``: the source still waits for this destination to catch it up;
   the destination's own link to it then dials at once instead of waiting out a backoff.
2. **Stream.** The source sends :class:`Batch` entries in journal order: the journal
   payloads of the records the destination needs, and ``through``: every record below
   it that the destination needs is in this batch or an earlier one (a batch with no
   records only moves ``through``). A batch never splits a transaction.
3. **Acknowledgement.** The destination answers :class:`Acked` with the highest
   ``through`` whose records are durable in its own journal. The source keeps at most a
   window of bytes sent and not acknowledged, so a slow destination never grows the
   source's memory: records are read back from the journal, not kept.
4. Fields are only appended, with defaults; a tag never changes meaning (``version``
   says which fields a peer knows). A field that no peer reads may be dropped: a
   peer's decoder ignores a field it does not know (``Batch.positions``, the source
   positions of its records, went that way).
5. **Reach.** Either end may attach its link-state table (:class:`Reach` entries: which
   instances stream to which now) to a ``Batch`` or an ``Acked``, whenever the table
   changed since that connection last had it; a ``Batch`` may carry only that. Each
   instance floods what it learns, so every instance knows which owners its requests
   reach through chains of PassThrough links (engine/replication/reach.py). Peers that
   predate the field ignore it.
6. **Versions.** ``Profile.version`` is the incompatible step: a destination refuses a
   source whose version is above its own. ``Profile.revision`` is the compatible one:
   it names the record kinds a peer can take beyond those of revision 0, and a source
   sends a record kind only to a destination whose revision has it (what an older
   destination lacks it does without, as before). Revision 1:
   :class:`~conveyor.records.QueueCancelledRec` (a delayed retry or failure reason on a
   replicated queue, so it survives a failover). Older peers send no revision (0) and
   ignore the field.
"""

from __future__ import annotations

from typing import Union

import msgspec

from conveyor.protocol.codec import FRAME_BYTES_MAX_DEFAULT, _Decoder

PROTOCOL_VERSION = 1
PROTOCOL_REVISION = 1  # rule 6


class QueueProfile(msgspec.Struct, frozen=True):
    """A queue as the replication rules compare it across instances."""

    name: str
    kind: str  # Queue | LocalQueue | GroupLocalQueue
    underlying: str
    filter: str | None = None
    initial_owner: str | None = None
    # GroupLocalQueue: the group whose instances share it, its identity with its name
    # (docs/replication.md, "Which queues are replicated"): its GroupLocalQueueDomain,
    # else the instance's Group, else "" (an instance without a Group). None: the peer
    # predates the field (read as the instance's group).
    group: str | None = None


class DestinationProfile(msgspec.Struct, frozen=True):
    """An outgoing destination of the instance that sends the profile."""

    name: str
    topics: list[str] = []  # topic name regexes
    pass_through: str | None = None
    sync: bool = False


class Profile(msgspec.Struct, frozen=True):
    instance: str
    group: str
    journal_id: str
    version: int = PROTOCOL_VERSION
    queues: list[QueueProfile] = []
    destinations: list[DestinationProfile] = []
    revision: int = 0  # rule 6; 0: a peer that predates the field


class _Repl(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="c"):
    pass


class Hello(_Repl, tag="r_hello", frozen=True):
    profile: Profile
    user: str | None = None
    password: str | None = None
    # The source's durable journal end as it says hello (rule 1); None: a source that
    # predates the field.
    journal_end: int | None = None
    # The source waits for this destination's stream to catch it up (rule 1).
    catching_up: bool = False


class Welcome(_Repl, tag="r_welcome", frozen=True):
    profile: Profile
    resume_from: int = 0


class Refused(_Repl, tag="r_refused", frozen=True):
    reason: str
    code: str = "replication_refused"


class ReachLink(msgspec.Struct, frozen=True, array_like=True):
    """One outgoing link that streams now: the destination's instance, its PassThrough."""

    instance: str
    pass_through: str | None = None


class Reach(msgspec.Struct, frozen=True, array_like=True):
    """An instance's word on its streaming links (engine/replication/reach.py rule 1):
    a higher ``(epoch, seq)`` replaces a lower one."""

    instance: str
    epoch: float
    seq: int
    links: list[ReachLink] = []


class Batch(_Repl, tag="r_batch", frozen=True):
    through: int
    records: list[bytes] = []
    # The source could not send records in [gap_from, gap_to) any more (retention removed
    # them before this destination had them): reported loudly on both ends.
    gap_from: int = -1
    gap_to: int = -1
    # The sender's link-state table, when it changed since this connection last had it
    # (rule 5; a batch may carry only this, with no records).
    reach: list[Reach] = []


class Acked(_Repl, tag="r_acked", frozen=True):
    through: int
    # As Batch.reach, from the destination to the source (rule 5).
    reach: list[Reach] = []


LinkMessage = Union[Hello, Welcome, Refused, Batch, Acked]


class LinkDecoder(_Decoder[LinkMessage]):
    """Either end of a replication link: decodes what the other end sends."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        super().__init__(LinkMessage, frame_bytes_max)
