"""Subscriptions to the records of a SOW topic or a view: full records, deltas and
out-of-focus notifications (reference G.1.5, G.5.2; docs/sow-and-views.md).

A :class:`RecordChange` says one record changed (inserted, replaced, deleted, expired);
:func:`deliver` decides what one subscription gets for it. Rules:

1. A record that passes the subscription's filter after the change is sent: whole, or
   for a delta subscription that had the record before, its key fields (``send_keys``,
   on by default; for a view, its grouping fields) and the fields that changed
   (:mod:`conveyor.engine.sow.delta`). ``no_empties`` skips a delta with no change. A record
   the subscription did not have (new, or back in focus) is sent whole.
2. ``oof``: the subscription remembers the keys it was sent; when such a record stops
   qualifying it gets an :class:`~conveyor.protocol.messages.OutOfFocus` with reason
   ``match`` (body: the new state), ``deleted`` or ``expired`` (body: the last state),
   and forgets the key. Without ``oof`` nothing is remembered and nothing is sent.
3. Live messages of a journaled record carry its bookmark; view records have none.
   Every message carries the SowKey unless ``no_sowkey``.
4. A change that fails for one subscription (its filter, the delta, the encoding) is
   skipped for that subscription only, counted and logged (engine/poison.py); a filter
   that fails counts as not matching.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, cast

import msgspec

from conveyor.engine import poison
from conveyor.engine.sow import delta
from conveyor.engine.cache import Entry
from conveyor.engine.outbox import Outbox
from conveyor.protocol import messages as m

if TYPE_CHECKING:
    from conveyor.expr import Expression

_encode = msgspec.json.Encoder().encode


class RecordChange:
    """Record ``key`` of ``topic`` changed from ``old`` to ``new`` (None: absent);
    ``reason``: ``publish``, ``deleted`` or ``expired``; ``bookmark`` and ``position``:
    the new record's, for a journaled record. ``old`` may be given as a position and a
    loader instead: it is read only if a subscription needs it (a delta, an oof)."""

    __slots__ = ("topic", "key", "key_text", "_old", "new", "reason", "bookmark", "position", "_load")

    def __init__(self, topic: str, key: Hashable, key_text: str, old: Entry | int | None, new: Entry | None,
                 reason: str = "publish", bookmark: str | None = None, position: int | None = None,
                 load: Callable[[int], Entry] | None = None) -> None:
        self.topic = topic
        self.key = key
        self.key_text = key_text
        self._old = old
        self.new = new
        self.reason = reason
        self.bookmark = bookmark
        self.position = position
        self._load = load

    @property
    def old(self) -> Entry | None:
        old = self._old
        if type(old) is int:
            assert self._load is not None
            old = self._old = self._load(old)
        return cast("Entry | None", old)  # a position was loaded above

    @property
    def had_old(self) -> bool:
        return self._old is not None


@dataclass(eq=False)
class RecordSubscription:
    sub_id: str
    conn_id: int
    topic: str
    filter: Expression | None = None
    oof: bool = False
    delta: bool = False
    no_empties: bool = False
    send_keys: bool = True
    no_sowkey: bool = False
    key_paths: tuple[tuple[str, ...], ...] = ()  # what a delta always carries (rule 1)
    seen: set[Hashable] = field(default_factory=set)  # rule 2: keys sent, with oof

    def matches(self, entry: Entry | None, bookmark: str | None, now: float) -> bool:
        if entry is None:
            return False
        flt = self.filter
        return flt is None or poison.matches(flt, entry, bookmark, now, f"subscription {self.sub_id!r} of connection "
                                                                         f"{self.conn_id}")


def record_message(sub: RecordSubscription, topic: str, entry: Entry, key_text: str, bookmark: str | None,
                   data: bytes | None = None, query_id: str | None = None) -> m.Message:
    return m.Message(
        topic=topic, data=entry.data if data is None else data, sub_id=sub.sub_id if query_id is None else None,
        bookmark=bookmark, seq=entry.seq if bookmark else None, timestamp=entry.timestamp,
        correlation_id=entry.correlation_id, query_id=query_id, sow_key=None if sub.no_sowkey else key_text,
    )


def deliver(sub: RecordSubscription, change: RecordChange, now: float, outbox: Outbox) -> None:
    """Rules 1-4 for one subscription and one change."""
    try:
        _deliver(sub, change, now, outbox)
    except Exception as exc:  # noqa: BLE001 - rule 4: this change, this subscription only
        what = change.new if change.new is not None else f"record {change.key_text} of {change.topic!r}"
        poison.skipped("delta", what, exc, f"subscription {sub.sub_id!r} of connection {sub.conn_id}")


def _deliver(sub: RecordSubscription, change: RecordChange, now: float, outbox: Outbox) -> None:
    new = change.new
    new_ok = sub.matches(new, change.bookmark, now)
    if not new_ok and not sub.oof:
        return
    if sub.oof:
        had = change.key in sub.seen
    elif sub.delta:
        had = change.had_old and sub.matches(change.old, None, now)
    else:
        had = False
    if new_ok:
        assert new is not None
        data = None
        old = change.old if sub.delta and had else None
        if old is not None:
            diff = delta.changes(old.decoded(), new.decoded())
            if not diff and sub.no_empties:
                return
            if sub.send_keys:
                diff = delta.with_fields(diff, new.decoded(), sub.key_paths)
            data = _encode(diff)
        if sub.oof:
            sub.seen.add(change.key)
        outbox.send(sub.conn_id, record_message(sub, change.topic, new, change.key_text, change.bookmark, data))
        return
    if sub.oof and had:
        sub.seen.discard(change.key)
        body: Entry | None
        if new is not None:
            reason, body = "match", new
        else:
            reason, body = change.reason, change.old
        outbox.send(sub.conn_id, m.OutOfFocus(
            topic=change.topic, sow_key=change.key_text, reason=reason, data=body.data if body is not None else b"",
            sub_id=sub.sub_id, correlation_id=body.correlation_id if body is not None else None,
        ))
