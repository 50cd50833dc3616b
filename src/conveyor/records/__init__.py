"""Journal records: what the engine writes to the transaction log, one per event.

Records are MessagePack arrays (``array_like``) tagged by a small integer, so a publish
costs a few bytes of framing beyond its payload. The journal stores them as opaque
payloads. Rules (STYLE 7): a tag never changes meaning; new fields are appended with
defaults; an unknown tag in a journal written by a newer version stops recovery with
a clear error rather than being skipped.

The state of the engine is a fold over these records: recovery replays them through
the same transitions the live server applies, so "what survives a crash" is exactly
"what was journaled".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Union

import msgspec

from conveyor.records import plain

#: A named consumer's delivery whose message is gone on the instance that records it
#: (engine/consumers.py rule 8): its position there, and its publisher in a claim sent
#: by identity.
GONE = -1


class _Rec(msgspec.Struct, frozen=True, array_like=True, tag_field="k", omit_defaults=False):
    pass


class PublishRec(_Rec, tag=1, frozen=True):
    """A message recorded on a topic. ``publisher`` is the 64-bit publisher id."""

    topic: str
    publisher: int
    seq: int
    timestamp: float  # epoch seconds, server clock at acceptance
    data: bytes
    correlation_id: str | None = None
    # A dead-letter publish (amps-action-do-publish-message) carries the expiry that
    # caused it, so one record makes both durable, or neither: a crash can neither lose
    # the dead letter of an expired message nor publish it twice.
    expired_queue: str | None = None
    expired_position: int = -1
    expired_reasons: str = ""
    # Direct-mode Spark sink: the payload hash, so a conflicting duplicate is detected
    # (0: none given).
    fingerprint: int = 0
    # A committed transaction (CommitTxn) is a contiguous run of publish records with
    # txn_index 0..txn_total-1, appended in one step. Recovery truncates a run that a
    # crash cut short at the tail, so every reader sees whole transactions only.
    txn_index: int = -1
    txn_total: int = 0
    # Replication (docs/replication.md): where the message was first recorded, and the
    # instances it passed on its way here, origin first. Empty on the instance where it
    # was published. (publisher, seq) stays its identity on every instance.
    origin: str = ""
    origin_group: str = ""
    path: list[str] = []
    # State of the World (docs/sow-and-views.md): the absolute time (epoch seconds) the
    # message expires, stamped before it is journaled, so a queue over the topic and a
    # replica expire it at the same time (0: never); and its SowKey ("": not a SOW topic).
    expiration: float = 0.0
    sow_key: str = ""


class LeasedRec(_Rec, tag=2, frozen=True):
    """at-least-once: messages of ``queue`` were leased; ``counts`` are their delivery numbers."""

    queue: str
    positions: list[int]
    counts: list[int]


class DeliveredRec(_Rec, tag=3, frozen=True):
    """at-most-once: messages left ``queue`` by delivery (written before they are sent)."""

    queue: str
    positions: list[int]


class AckedRec(_Rec, tag=4, frozen=True):
    """Messages of ``queue`` acknowledged (removed as processed)."""

    queue: str
    positions: list[int]


class CancelledRec(_Rec, tag=5, frozen=True):
    """Messages returned to ``queue`` by a ``cancel`` acknowledgement. ``not_before`` and
    ``reasons`` (empty, or one per position): a delayed retry's time (0: none) and the
    application's failure reason ("": none); docs/queues.md."""

    queue: str
    positions: list[int]
    not_before: list[float] = []
    reasons: list[str] = []


class ExpiredRec(_Rec, tag=6, frozen=True):
    """A message expired from ``queue`` with the given reasons (comma list)."""

    queue: str
    position: int
    reasons: str
    reason: str = ""  # the application's failure reason (docs/queues.md), "": none


class ReturnedRec(_Rec, tag=7, frozen=True):
    """Leases that ended without an ack (expiry, disconnect): messages back in ``queue``."""

    queue: str
    positions: list[int]


class BarrierRec(_Rec, tag=8, frozen=True):
    """Barrier messages of ``queue`` delivered to every current subscriber (they need no
    ack); written before they are sent."""

    queue: str
    positions: list[int]



# --- named consumers (the Spark connector's delivery sequence, SPARK.md section 2) ------


class ConsumerLeasedRec(_Rec, tag=9, frozen=True):
    """Deliveries ``first, first+1, ...`` of named ``consumer`` on ``queue``: one per
    position, in d order; ``counts`` are the messages' delivery counts (as LeasedRec)."""

    queue: str
    consumer: str
    first: int
    positions: list[int]
    counts: list[int]
    epoch: int = 0  # the consumer's epoch when it leased (replicated claims fence older ones)


class ConsumerAckedRec(_Rec, tag=10, frozen=True):
    """Deliveries ``<= through`` of ``consumer`` acknowledged; ``positions`` are the
    messages this ack removed from ``queue``."""

    queue: str
    consumer: str
    through: int
    positions: list[int]
    epoch: int = 0  # the consumer's epoch when it acknowledged


class ConsumerClaimedRec(_Rec, tag=11, frozen=True):
    """``consumer`` of ``queue`` claimed by a new holder: ``epoch`` fences older ones.
    On a replicated queue it also names the claimer's unacknowledged deliveries
    (``acked`` < d <= ``d``, their messages at ``positions``; GONE: a message acknowledged
    here before its delivery arrived), which replication sends by identity."""

    queue: str
    consumer: str
    epoch: int
    token: str
    d: int = -1  # the deliveries the claimer knew (D); -1: not recorded (older journal)
    acked: int = -1  # the claimer's acknowledged pointer; -1: no deliveries recorded (not replicated, older)
    positions: list[int] = []


# --- replication (docs/replication.md) ------------------------------------------------------


class ReceivedRec(_Rec, tag=12, frozen=True):
    """Every record of ``source``'s journal ``journal_id`` below position ``through`` that
    this instance needs has been recorded here (appended after the records of each batch
    received over replication, so it is durable only if they are)."""

    source: str
    journal_id: str
    through: int


# --- replicated queues (docs/replication.md, "Replicated queues") --------------------------
# These name messages by their identity on every instance, (publisher, seq), not by a
# journal position (which is local). Like replicated publishes they carry where they were
# first recorded and the instances they passed, so they are never sent in a loop.


class QueueRemovedRec(_Rec, tag=13, frozen=True):
    """Messages of replicated ``queue`` left it on another instance: ``kind`` is ``ack``
    (acknowledged), ``expire`` (expired there; only that instance publishes dead letters)
    or ``deliver`` (delivered at-most-once there). Recorded where it is received."""

    queue: str
    publishers: list[int]
    seqs: list[int]
    kind: str
    origin: str = ""
    origin_group: str = ""
    path: list[str] = []


class TransferRequestRec(_Rec, tag=14, frozen=True):
    """Instance ``requester`` asks the owner of messages ``zip(publishers, seqs)`` of
    ``queue`` to transfer them (it has subscribers waiting); ``attempts`` counts each
    message's requests. One record per scan, not per message."""

    queue: str
    publishers: list[int]
    seqs: list[int]
    requester: str
    attempts: list[int]
    origin: str = ""
    origin_group: str = ""
    path: list[str] = []


class TransferRec(_Rec, tag=15, frozen=True):
    """Messages ``zip(publishers, seqs)`` of ``queue`` are owned by ``owner`` from now on,
    granted by ``granter`` (the owner, or an instance acting for an offline owner:
    ``proxied``). ``epochs`` count each message's transfers: the highest wins everywhere.
    Each message's delivery and cancel counts travel with it. One record per grant
    decision, not per message."""

    queue: str
    publishers: list[int]
    seqs: list[int]
    owner: str
    granter: str
    epochs: list[int]
    deliveries: list[int]
    cancels: list[int]
    proxied: bool = False
    origin: str = ""
    origin_group: str = ""
    path: list[str] = []
    # When each message may be offered again (a delayed retry held at the granter:
    # queue/returns.py rule 2); empty when none of them is held.
    not_before: list[float] = []


class QueueCancelledRec(_Rec, tag=18, frozen=True):
    """Messages of replicated ``queue`` cancelled on their owner with a delayed retry or
    a failure reason (docs/queues.md, "Delayed retry"): ``zip(publishers, seqs)`` are
    not offered before ``not_before[i]`` (0: at once), and failed for ``reasons[i]``
    ("": none given). Recorded where it is received, so an instance that takes a
    message over from an owner that is down (a proxied transfer) holds it as its owner
    did. ``deliveries`` and ``cancels``: each message's counts on its owner as the record
    left it (empty: not known), so MaxDeliveries and MaxCancels count across a takeover.
    Sent only to peers whose replication revision has it (protocol/replication.py
    rule 6). Carries where it was first recorded and the instances it passed."""

    queue: str
    publishers: list[int]
    seqs: list[int]
    not_before: list[float]
    reasons: list[str]
    origin: str = ""
    origin_group: str = ""
    path: list[str] = []
    deliveries: list[int] = []
    cancels: list[int] = []


class ConsumerReplicatedRec(_Rec, tag=17, frozen=True):
    """A named consumer's record of a replicated queue from another instance
    (docs/spark.md, "Failover between instances"): ``kind`` is ``lease`` (deliveries
    ``n, n+1, ...`` of the messages ``zip(publishers, seqs)``), ``ack`` (deliveries ``<=
    n`` acknowledged; the messages' removal travels as a QueueRemovedRec) or ``claim``
    (epoch ``n``, ``token``; ``through``: the deliveries the claimer knew; ``acked``: its
    acknowledged pointer, and deliveries ``acked+1 .. through`` are the messages
    ``zip(publishers, seqs)``, a publisher of GONE for a message gone on the claimer;
    ``acked`` -1: an older record without them). ``epoch``:
    the consumer's epoch when a lease or ack was made. Messages are named by identity;
    the instance that records it adds their ``positions`` there, so its recovery needs
    no lookup. It carries where it was first recorded and the instances it passed, like
    a replicated publish."""

    queue: str
    consumer: str
    kind: str
    n: int
    publishers: list[int] = []
    seqs: list[int] = []
    token: str = ""
    positions: list[int] = []
    origin: str = ""
    origin_group: str = ""
    path: list[str] = []
    epoch: int = 0
    through: int = -1
    acked: int = -1


# --- State of the World (docs/sow-and-views.md) -----------------------------------------------


class SowDeletedRec(_Rec, tag=16, frozen=True):
    """Records of SOW topic ``topic`` deleted by ``sow_delete``: each ``keys[i]`` (its
    SowKey) is removed if its current record is still the one at ``positions[i]``, so a
    publish recorded after the delete keeps its record whatever order the two are
    applied in.

    A delete that arrived by replication names the records by identity instead (journal
    positions are local): ``keys[i]`` goes if its current record is the publish
    ``(publishers[i], seqs[i])``; ``positions`` is empty, and it carries where it was
    first recorded and the instances it passed, like a replicated publish."""

    topic: str
    keys: list[str]
    positions: list[int]
    publishers: list[int] = []
    seqs: list[int] = []
    origin: str = ""
    origin_group: str = ""
    path: list[str] = []


Record = Union[
    PublishRec, LeasedRec, DeliveredRec, AckedRec, CancelledRec, ExpiredRec, ReturnedRec, BarrierRec,
    ConsumerLeasedRec, ConsumerAckedRec, ConsumerClaimedRec, ReceivedRec, QueueRemovedRec, TransferRequestRec,
    TransferRec, SowDeletedRec, ConsumerReplicatedRec, QueueCancelledRec,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)

encode = _encoder.encode
decode = _decoder.decode


# Publish records are by far the most frequent, and the server builds one per message:
# records/plain.py encodes one from a tuple, in the compiled group.
encode_publish = plain.encode_publish


_NO_PATH: list[str] = []  # PublishRec.path of a record made here (only ever read)


def encode_txn_publish(topic: str, publisher: int, seq: int, timestamp: float, data: bytes, index: int,
                       total: int) -> bytes:
    """``encode(PublishRec(topic, publisher, seq, timestamp, data, txn_index=index,
    txn_total=total))``, from a tuple (a committed transaction's rows, one per row). The
    layout must match PublishRec's fields; tests/engine/test_records.py checks it does."""
    return _encoder.encode((1, topic, publisher, seq, timestamp, data, None, None, -1, "", 0, index, total,
                            "", "", _NO_PATH, 0.0, ""))


_PLAIN_PUBLISH = 0x97  # the MessagePack header of encode_publish's 7-element array
_ARRIVED_HEADER = b"\xdc\x00\x10"  # an array of 16: those 7, then the fields up to PublishRec.path
#: What every plain publish starts with, and no other record (``encode_publish``'s array
#: header, then PublishRec's tag): ``decode_plain`` reads what starts with it.
PLAIN_PUBLISH_HEAD = bytes([_PLAIN_PUBLISH, 1])


class PlainPublish(msgspec.Struct, frozen=True, array_like=True, tag_field="k", tag=1, gc=False):
    """A plain publish (``encode_publish``'s layout) as a reader that needs only its own
    fields decodes it: a replica receives mostly these. It reads like the
    :class:`PublishRec` it encodes, whose other fields are at their defaults; decoding
    it skips setting those twelve defaults, and a record without a list is not tracked
    by the garbage collector. Only for a payload that starts with
    :data:`PLAIN_PUBLISH_HEAD`: a publish of a longer layout would decode too, its
    other fields dropped."""

    topic: str
    publisher: int
    seq: int
    timestamp: float
    data: bytes
    correlation_id: str | None
    expired_queue: ClassVar[str | None] = None
    expired_position: ClassVar[int] = -1
    expired_reasons: ClassVar[str] = ""
    fingerprint: ClassVar[int] = 0
    txn_index: ClassVar[int] = -1
    txn_total: ClassVar[int] = 0
    origin: ClassVar[str] = ""
    origin_group: ClassVar[str] = ""
    path: ClassVar[tuple[str, ...]] = ()
    expiration: ClassVar[float] = 0.0
    sow_key: ClassVar[str] = ""


decode_plain = msgspec.msgpack.Decoder(PlainPublish).decode


def plain_publish_topic_key(payload: bytes) -> bytes | None:
    """The topic of a plain publish record (``encode_publish``'s layout: no
    transaction, origin, expiry or SOW key) as it is encoded, its MessagePack string
    header included: a key for what a reader has decided about the topic, sliced
    without decoding anything. None for any other record. :func:`topic_of_key` reads it."""
    if not payload.startswith(PLAIN_PUBLISH_HEAD):
        return None
    h = payload[2]
    if 0xA0 <= h <= 0xBF:  # fixstr: up to 31 bytes
        return payload[2:3 + (h & 0x1F)]
    if h == 0xD9:  # str8
        return payload[2:4 + payload[3]]
    if h == 0xDA:  # str16
        return payload[2:5 + int.from_bytes(payload[3:5], "big")]
    return payload[2:7 + int.from_bytes(payload[3:7], "big")]  # str32


def topic_of_key(key: bytes) -> str:
    """The topic name a :func:`plain_publish_topic_key` holds."""
    return msgspec.msgpack.decode(key, type=str)


def plain_publish_prefix(key: bytes) -> bytes:
    """The bytes every plain publish to the topic of ``key`` starts with, and no other
    record: a reader that meets one topic after another tests ``startswith``."""
    return PLAIN_PUBLISH_HEAD + key


class Arrival:
    """Encodes publishes as a replica journals them when they come from one place:
    with ``origin``, ``origin_group`` and ``path``, and without the expiry by a queue
    where they were recorded (a replicated queue expires its own copies).

    A plain publish (``encode_publish``'s layout: the fields up to ``correlation_id``,
    the rest defaults) keeps its bytes: the missing fields, the same for every publish
    from that place, are appended behind them, with no copy of the message into a
    Struct and back."""

    __slots__ = ("origin", "origin_group", "path", "_tail")

    def __init__(self, origin: str, origin_group: str, path: list[str]) -> None:
        self.origin = origin
        self.origin_group = origin_group
        self.path = path
        self._tail: bytes | None = None  # on first use: a record that passed through is never plain

    def encode(self, payload: bytes, rec: PublishRec | PlainPublish) -> bytes:
        """``rec`` as journaled here; ``payload`` is its encoding where it came from."""
        if payload[0] == _PLAIN_PUBLISH:
            return _ARRIVED_HEADER + payload[1:] + self._plain_tail()
        return _encoder.encode(msgspec.structs.replace(
            rec, origin=self.origin, origin_group=self.origin_group, path=self.path,
            expired_queue=None, expired_position=-1, expired_reasons=""))

    def _plain_tail(self) -> bytes:
        """What follows a plain publish's fields here: the same for every one of them."""
        if self._tail is None:
            self._tail = _encoder.encode((None, -1, "", 0, -1, 0, self.origin, self.origin_group, self.path))[1:]
        return self._tail

    def encode_many(self, payloads: list[bytes], recs: Sequence[PublishRec | PlainPublish]) -> list[bytes]:
        """``encode`` of each, in one call: what comes from one place is mostly plain."""
        head, tail, encode = _ARRIVED_HEADER, self._plain_tail(), self.encode
        return [head + payload[1:] + tail if payload[0] == _PLAIN_PUBLISH else encode(payload, rec)
                for payload, rec in zip(payloads, recs)]


def encode_sow_publish(topic: str, publisher: int, seq: int, timestamp: float, data: bytes, correlation_id: str | None,
                       expiration: float, sow_key: str) -> bytes:
    """A publish to a SOW topic (the same layout as PublishRec, its defaults spelled out)."""
    return _encoder.encode((1, topic, publisher, seq, timestamp, data, correlation_id, None, -1, "", 0, -1, 0, "", "",
                            (), expiration, sow_key))
