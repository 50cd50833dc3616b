"""The commands and messages of the wire protocol, as frozen msgspec structs.

Each struct is one entry of a frame (see :mod:`conveyor.protocol.codec`). On the wire it
is a MessagePack map whose keys are the short header names of the reference
(spec/reference.md B.1: ``c`` command, ``cid`` command id, ``t`` topic, ``f`` filter,
``o`` options, ``a`` ack types, ``bm`` bookmark, ``s`` sequence, ``lp`` lease period...)
and whose ``c`` field selects the type. Fields are only ever appended, with defaults;
a tag or a key never changes meaning (STYLE 7).
"""

from __future__ import annotations

from typing import Union

import msgspec
from msgspec import field


class _Msg(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="c"):
    pass


# --- client -> server ------------------------------------------------------------------


class Logon(_Msg, tag="logon"):
    client_name: str = ""
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    user_id: str | None = None
    password: str | None = field(default=None, name="pw")
    version: str | None = field(default=None, name="v")


class Publish(_Msg, tag="publish"):
    topic: str = field(name="t")
    data: bytes = field(name="d")
    seq: int | None = field(default=None, name="s")
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    correlation_id: str | None = field(default=None, name="x")
    expiration: float | None = field(default=None, name="e")


class Subscribe(_Msg, tag="subscribe"):
    topic: str = field(name="t")
    sub_id: str | None = None
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    filter: str | None = field(default=None, name="f")
    options: str | None = field(default=None, name="o")
    bookmark: str | None = field(default=None, name="bm")


class Sow(_Msg, tag="sow"):
    topic: str = field(name="t")
    query_id: str | None = None
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    filter: str | None = field(default=None, name="f")
    options: str | None = field(default=None, name="o")
    batch_size: int | None = field(default=None, name="bs")
    top_n: int | None = None


class SowAndSubscribe(_Msg, tag="sow_and_subscribe"):
    topic: str = field(name="t")
    sub_id: str | None = None
    query_id: str | None = None
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")
    filter: str | None = field(default=None, name="f")
    options: str | None = field(default=None, name="o")
    batch_size: int | None = field(default=None, name="bs")
    top_n: int | None = None


class Unsubscribe(_Msg, tag="unsubscribe"):
    sub_id: str = "all"
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")


class SowDelete(_Msg, tag="sow_delete"):
    """Deletes from a SOW; on a queue topic: the acknowledgement (by bookmarks or filter)."""

    topic: str = field(name="t")
    bookmark: str | None = field(default=None, name="bm")  # comma-separated list
    filter: str | None = field(default=None, name="f")
    options: str | None = field(default=None, name="o")
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")


class Heartbeat(_Msg, tag="heartbeat"):
    options: str | None = field(default=None, name="o")
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")


class Flush(_Msg, tag="flush"):
    cid: str | None = None
    ack_type: str | None = field(default=None, name="a")


Command = Union[Logon, Publish, Subscribe, Sow, SowAndSubscribe, Unsubscribe, SowDelete, Heartbeat, Flush]
COMMAND_TYPES = (Logon, Publish, Subscribe, Sow, SowAndSubscribe, Unsubscribe, SowDelete, Heartbeat, Flush)
COMMAND_NAMES = frozenset(t.__struct_config__.tag for t in COMMAND_TYPES)

# --- server -> client ------------------------------------------------------------------


class Ack(_Msg, tag="ack"):
    ack_type: str = field(name="a")
    cid: str | None = None
    status: str = "success"  # success | failure | duplicate
    reason: str | None = None
    code: str | None = None  # stable error code (conveyor.errors) when status=failure
    details: dict | None = None
    client_name: str | None = None
    seq: int | None = field(default=None, name="s")
    bookmark: str | None = field(default=None, name="bm")
    sub_id: str | None = None
    query_id: str | None = None
    version: str | None = field(default=None, name="v")
    records_deleted: int | None = None
    records_returned: int | None = None
    matches: int | None = None


class Message(_Msg, tag="p"):
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


class GroupBegin(_Msg, tag="group_begin"):
    query_id: str | None = None
    cid: str | None = None


class GroupEnd(_Msg, tag="group_end"):
    query_id: str | None = None
    cid: str | None = None


class ServerHeartbeat(_Msg, tag="hb"):
    pass


ServerMessage = Union[Ack, Message, GroupBegin, GroupEnd, ServerHeartbeat]

#: Ack types the reference names (B.9).
ACK_TYPES = frozenset({"received", "processed", "persisted", "completed", "stats", "none"})


_ACK_TYPES_CACHE: dict[str, frozenset[str]] = {}


def ack_types(value: str | None) -> frozenset[str]:
    """Parse an ``ack_type`` header (comma list); cached, as a few values recur."""
    if not value:
        return frozenset()
    hit = _ACK_TYPES_CACHE.get(value)
    if hit is None:
        hit = frozenset(part.strip() for part in value.split(",") if part.strip() and part.strip() != "none")
        if len(_ACK_TYPES_CACHE) < 256:
            _ACK_TYPES_CACHE[value] = hit
    return hit
