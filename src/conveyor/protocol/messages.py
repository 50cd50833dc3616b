"""The commands and messages of the wire protocol, as frozen msgspec structs.

Each struct is one entry of a frame (see :mod:`conveyor.protocol.codec`). On the wire it
is a MessagePack map whose keys are the short header names of the reference
(spec/reference.md B.1: ``c`` command, ``cid`` command id, ``t`` topic, ``f`` filter,
``o`` options, ``a`` ack types, ``bm`` bookmark, ``s`` sequence, ``lp`` lease period...)
and whose ``c`` field selects the type. Fields are only ever appended, with defaults;
a tag or a key never changes meaning (STYLE 7).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
from msgspec import field


class _Msg(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="c"):
    pass


# --- client -> server ------------------------------------------------------------------


class Logon(_Msg, tag="logon", frozen=True):
    client_name: str = ""
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    user_id: str | None = None
    password: str | None = field(default=None, name="pw")
    version: str | None = field(default=None, name="v")


class _PublishFields(_Msg, frozen=True):
    """What every kind of publish carries (not a command of its own)."""

    topic: str = field(name="t")
    data: bytes = field(name="d")
    seq: int | None = field(default=None, name="s")
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    correlation_id: str | None = field(default=None, name="x")
    expiration: float | None = field(default=None, name="e")


class Publish(_PublishFields, tag="publish", frozen=True):
    # Hash of the payload: a duplicate (publisher, seq) whose fingerprint differs from the
    # one recorded is a conflict (failure ``duplicate_conflict``), not a silent drop.
    fingerprint: int | None = field(default=None, name="fp")
    # SOW topic without Key fields: the record's key, chosen by the publisher.
    sow_key: str | None = field(default=None, name="k")


class DeltaPublish(_PublishFields, tag="delta_publish", frozen=True):
    """A publish merged into the current record of a SOW topic (docs/sow-and-views.md):
    fields present replace the stored ones, absent ones are kept; what is journaled and
    delivered is the merged message. On a topic without SOW: a plain publish."""

    sow_key: str | None = field(default=None, name="k")


class _SubscribeFields(_Msg, frozen=True):
    """What every kind of subscription carries (not a command of its own). The command
    classes do not derive from one another, so ``isinstance`` tells them apart."""

    topic: str = field(name="t")
    sub_id: str | None = None
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    filter: str | None = field(default=None, name="f")
    options: str | None = field(default=None, name="o")
    bookmark: str | None = field(default=None, name="bm")


class Subscribe(_SubscribeFields, tag="subscribe", frozen=True):
    pass


class DeltaSubscribe(_SubscribeFields, tag="delta_subscribe", frozen=True):
    """A subscription that receives, for an update of a SOW record it has seen, the key
    fields and the fields that changed (docs/sow-and-views.md)."""


class _SowFields(_Msg, frozen=True):
    """What every SOW query carries (not a command of its own)."""

    topic: str = field(name="t")
    query_id: str | None = None
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    filter: str | None = field(default=None, name="f")
    options: str | None = field(default=None, name="o")
    batch_size: int | None = field(default=None, name="bs")
    top_n: int | None = None
    orderby: str | None = None  # "/field [ASC|DESC] [TEXT], ..."
    sow_keys: str | None = None  # comma list of SowKeys: only these records


class Sow(_SowFields, tag="sow", frozen=True):
    pass


class SowAndSubscribe(_SowFields, tag="sow_and_subscribe", frozen=True):
    sub_id: str | None = None


class SowAndDeltaSubscribe(_SowFields, tag="sow_and_delta_subscribe", frozen=True):
    """``sow_and_subscribe`` whose live part is a delta subscription."""

    sub_id: str | None = None


class Unsubscribe(_Msg, tag="unsubscribe", frozen=True):
    sub_id: str = "all"
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")


class SowDelete(_Msg, tag="sow_delete", frozen=True):
    """Deletes from a SOW; on a queue topic: the acknowledgement (by bookmarks or filter)."""

    topic: str = field(name="t")
    bookmark: str | None = field(default=None, name="bm")  # comma-separated list
    filter: str | None = field(default=None, name="f")
    options: str | None = field(default=None, name="o")
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    sow_keys: str | None = None  # SOW topic: comma list of SowKeys to delete
    data: bytes | None = field(default=None, name="d")  # SOW topic: delete the record this would update


class Heartbeat(_Msg, tag="heartbeat", frozen=True):
    options: str | None = field(default=None, name="o")
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")


class Flush(_Msg, tag="flush", frozen=True):
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")



# --- client -> server: the Spark connector's operations (SPARK.md section 2) ---------------
# Each answers with one ``Ack(ack_type="processed", cid=...)`` whose ``result`` map carries
# the outcome (a failure carries ``code``: ``fenced``, ``bad_delivery_range``...). They
# work on a *named consumer* of a queue: a durable consumer, independent of connections,
# whose leases are numbered 1, 2, 3... (the delivery sequence ``d``).


class Claim(_Msg, tag="claim", frozen=True):
    """Fence a named consumer: the new epoch supersedes every older holder.
    result: {"epoch": e, "d": D, "acked": A}."""

    queue: str = field(name="q")
    consumer: str = field(name="cn")
    token: str = ""
    cid: str | None = None


class Lease(_Msg, tag="lease", frozen=True):
    """Lease after delivery ``after`` (== D: up to ``max`` new messages, 0 = all ready;
    < D: re-offer ``(after, min(D, after+max)]``; > D: failure ``bad_delivery_range``).
    ``upto``: never lease a message at a journal position >= upto (AvailableNow).
    result: {"d": new D, "leased": n, "reoffered": k}."""

    queue: str = field(name="q")
    consumer: str = field(name="cn")
    after: int = 0
    max: int = 0
    ttl: float = 60.0
    upto: int | None = None
    epoch: int = 0
    cid: str | None = None


class Fetch(_Msg, tag="fetch", frozen=True):
    """Deliveries ``lo < d <= hi`` of a consumer, in d order, whatever their lease state:
    one ``Message`` each (``delivery`` set, ``query_id`` = this cid), or with
    ``columns`` a few ``FetchPage`` holding them column by column; then the Ack.
    result: {"count": n}."""

    queue: str = field(name="q")
    consumer: str = field(name="cn")
    lo: int = 0
    hi: int = 0
    cid: str | None = None
    columns: bool = field(default=False, name="col")
    # With ``columns``: answered in ``FetchPacked`` pages (one buffer per field). A server
    # from before it ignores the field and answers in ``FetchPage`` pages.
    packed: bool = field(default=False, name="pk")


class AckThrough(_Msg, tag="ack_through", frozen=True):
    """Cumulative, idempotent ack of deliveries ``<= d``. result: {"acked": A}."""

    queue: str = field(name="q")
    consumer: str = field(name="cn")
    d: int = 0
    epoch: int = 0
    cid: str | None = None


class Extend(_Msg, tag="extend", frozen=True):
    """Heartbeat: renew every unacked lease of the consumer to now + ttl.
    result: {"renewed": n}."""

    queue: str = field(name="q")
    consumer: str = field(name="cn")
    ttl: float = 60.0
    epoch: int = 0
    cid: str | None = None


class Reclaim(_Msg, tag="reclaim", frozen=True):
    """Renew the leases of deliveries ``lo < d <= hi`` (a replayed batch), taking back
    ready ones. result: {"renewed": n, "held_elsewhere": k, "done": j}."""

    queue: str = field(name="q")
    consumer: str = field(name="cn")
    lo: int = 0
    hi: int = 0
    ttl: float = 60.0
    epoch: int = 0
    cid: str | None = None


class Head(_Msg, tag="head", frozen=True):
    """The journal position bounding what is queued now. result: {"upto": P}."""

    queue: str = field(name="q")
    cid: str | None = None


class ConsumerInfo(_Msg, tag="consumer_info", frozen=True):
    """result: {"d": D, "acked": A, "epoch": e, "unacked": n}."""

    queue: str = field(name="q")
    consumer: str = field(name="cn")
    cid: str | None = None


class Stage(_Msg, tag="stage", frozen=True):
    """Stage rows for ``topic`` under transaction handle ``txn`` (may repeat; rows add
    up). Not visible to anyone until committed. result: {"staged": total rows}."""

    txn: str
    topic: str = field(name="t")
    rows: list[bytes] = []
    cid: str | None = None


class ConsumerFence(msgspec.Struct, frozen=True, array_like=True):
    """A named consumer a commit derives from: the commit is refused with ``fenced``
    unless ``(queue, consumer)`` is still at ``epoch``, and acknowledges its deliveries
    through ``through`` in the same step (0: no acknowledgement)."""

    queue: str
    consumer: str
    epoch: int
    through: int = 0


class CommitTxn(_Msg, tag="commit_txn", frozen=True):
    """Publish every row staged under ``txns`` atomically, as one duplicate-detection
    unit ``(publisher, seq)``. status "duplicate" when seq <= the publisher's highest.
    ``fences``: checked before anything is published (``fenced``), and their
    deliveries acknowledged with the publish. result: {"published": n}."""

    publisher: str
    seq: int
    txns: list[str] = []
    cid: str | None = None
    fences: list[ConsumerFence] = field(default_factory=list, name="fc")


class AbortTxn(_Msg, tag="abort_txn", frozen=True):
    """Discard what is staged under ``txns``. result: {"discarded": n}."""

    txns: list[str] = []
    cid: str | None = None


class JournalSegments(_Msg, tag="journal_segments", frozen=True):
    """The journal's segment files, for a reader that plans over the network (the Spark
    journal reader with ``server``). result: protocol/replies.py ``JournalSegmentsReply``."""

    cid: str | None = None


class JournalRead(_Msg, tag="journal_read", frozen=True):
    """Up to ``n`` bytes of the segment file named by its first position ``base``, from
    byte ``offset`` of the file (its header included). ``journal``: the identity the
    reader planned against; another journal (a failover, a new journal) is refused, since
    positions differ between journals. result: ``JournalChunk``."""

    base: int
    offset: int = 0
    n: int = 0
    journal: str = field(default="", name="j")
    cid: str | None = None


Command = Union[
    Logon, Publish, Subscribe, Sow, SowAndSubscribe, Unsubscribe, SowDelete, Heartbeat, Flush,
    Claim, Lease, Fetch, AckThrough, Extend, Reclaim, Head, ConsumerInfo, Stage, CommitTxn, AbortTxn,
    DeltaPublish, DeltaSubscribe, SowAndDeltaSubscribe, JournalSegments, JournalRead,
]
COMMAND_TYPES = (
    Logon, Publish, Subscribe, Sow, SowAndSubscribe, Unsubscribe, SowDelete, Heartbeat, Flush,
    Claim, Lease, Fetch, AckThrough, Extend, Reclaim, Head, ConsumerInfo, Stage, CommitTxn, AbortTxn,
    DeltaPublish, DeltaSubscribe, SowAndDeltaSubscribe, JournalSegments, JournalRead,
)
COMMAND_NAMES = frozenset(t.__struct_config__.tag for t in COMMAND_TYPES)

# --- server -> client ------------------------------------------------------------------


class Ack(_Msg, tag="ack", frozen=True):
    ack_type: str = field(name="a")
    cid: str | None = None
    status: str = "success"  # success | failure | duplicate
    reason: str | None = None
    code: str | None = None  # stable error code (conveyor.errors) when status=failure
    # msgspec decodes by this annotation: any map, as a bare ``dict`` always accepted.
    details: dict[Any, Any] | None = None
    client_name: str | None = None
    seq: int | None = field(default=None, name="s")
    bookmark: str | None = field(default=None, name="bm")
    sub_id: str | None = None
    query_id: str | None = None
    version: str | None = field(default=None, name="v")
    records_deleted: int | None = None
    records_returned: int | None = None
    matches: int | None = None
    topic_matches: int | None = None  # sow / sow_delete stats: records examined
    # Outcome of a named-consumer or transaction command: a struct of protocol/replies.py
    # on the way out, a plain map on the way in (replies.decode types it).
    result: Any = field(default=None, name="r")
    # Logon: the highest sequence of this publisher that is persisted (durable here and on
    # every sync replication destination); ``seq`` is the highest recorded. A publish store
    # forgets up to ``persisted`` and numbers new publishes after ``seq``.
    persisted: int | None = field(default=None, name="ps")
    # Logon: the identity of the server's journal. Bookmarks name positions in one journal;
    # a client that fails over to an instance with another journal resumes its bookmark
    # subscriptions by time and by the messages it has seen (docs/replication.md).
    journal: str | None = field(default=None, name="j")


class Message(_Msg, tag="p", frozen=True):
    """A message delivered on a subscription (``publish`` from server to client)."""

    topic: str = field(name="t")
    data: bytes = field(name="d")
    sub_id: str | None = None
    bookmark: str | None = field(default=None, name="bm")
    seq: int | None = field(default=None, name="s")
    timestamp: float | None = field(default=None, name="ts")
    lease_deadline: float | None = field(default=None, name="lp")  # epoch seconds
    correlation_id: str | None = field(default=None, name="x")
    query_id: str | None = None
    queue: str | None = field(default=None, name="q")  # set on queue deliveries (ack target)
    barrier: bool = False
    # Fetch: the delivery number d. A queue delivery under Leasing=strict or to a
    # ``fenced_acks`` subscription: the message's delivery count, which its ack names
    # (``deliveries=[...]``; docs/queues.md, "Stale acknowledgements").
    delivery: int | None = field(default=None, name="dn")
    publisher: int | None = field(default=None, name="pb")  # publisher id (Fetch)
    sow_key: str | None = field(default=None, name="k")  # the record's SowKey (SOW topics, views)


class OutOfFocus(_Msg, tag="oof", frozen=True):
    """A record a subscription had received no longer qualifies (docs/sow-and-views.md):
    ``reason`` is ``deleted``, ``expired`` or ``match``; ``data`` the record's new state
    (``match``) or its last state (the others)."""

    topic: str = field(name="t")
    sow_key: str = field(name="k")
    reason: str
    data: bytes = field(default=b"", name="d")
    sub_id: str | None = None
    correlation_id: str | None = field(default=None, name="x")


class GroupBegin(_Msg, tag="group_begin", frozen=True):
    query_id: str | None = None
    cid: str | None = None


class GroupEnd(_Msg, tag="group_end", frozen=True):
    query_id: str | None = None
    cid: str | None = None


class ServerHeartbeat(_Msg, tag="hb", frozen=True):
    pass


class FetchPage(_Msg, tag="fp", frozen=True):
    """Part of the answer to a ``Fetch`` with ``columns``: deliveries ``lo < d <= lo + n``
    (``n`` = ``len(data)``), one list per field, entry i of every list for delivery
    ``lo + 1 + i``. The bookmark of entry i is ``publishers[i]|seqs[i]|positions[i]``.
    One object per page instead of one per message, on both sides of the connection."""

    query_id: str | None = None
    queue: str = field(default="", name="q")
    lo: int = 0
    data: list[bytes] = []
    topics: list[str] = []
    publishers: list[int] = []
    seqs: list[int] = []
    timestamps: list[float] = []
    positions: list[int] = []
    correlation_ids: list[str | None] = []


class FetchPacked(_Msg, tag="fk", frozen=True):
    """Part of the answer to a ``Fetch`` with ``columns`` and ``packed``: deliveries
    ``lo < d <= lo + n``, each field in one buffer, in Arrow's layout (little-endian), so
    a reader builds its columns from them without a Python object per message:
    ``data`` the bodies back to back, ``ends`` n + 1 int32 offsets into it (0 first);
    ``publishers`` n uint64, ``seqs`` and ``positions`` n int64, ``timestamps`` n float64;
    ``topics`` the distinct topics and ``topic_of`` n uint16 indexes into them (empty:
    every message has ``topics[0]``); ``correlation_ids`` empty when none has one, else
    n entries."""

    query_id: str | None = None
    queue: str = field(default="", name="q")
    lo: int = 0
    n: int = 0
    data: bytes = b""
    ends: bytes = b""
    topics: list[str] = []
    topic_of: bytes = b""
    publishers: bytes = b""
    seqs: bytes = b""
    timestamps: bytes = b""
    positions: bytes = b""
    correlation_ids: list[str | None] = []


ServerMessage = Union[Ack, Message, GroupBegin, GroupEnd, ServerHeartbeat, OutOfFocus, FetchPage, FetchPacked]
