"""A view, and a queue as a view's source (reference G.2; docs/sow-and-views.md). How
views are built and fed from SOW topics, other views and queues, and rendered:
:mod:`conveyor.engine.sow.views`.

A :class:`View` is an :class:`~conveyor.engine.sow.aggregation.Aggregation` with an output:
its records (one per group) are a topic that answers queries and subscriptions like a
SOW topic. A :class:`QueueWatch` makes a queue's *available* messages a source.
Rules:

1. **Incremental.** A source reports member changes (a SOW record replaced, deleted or
   expired; a view record changed; a queue message entering or leaving the available
   messages); the aggregation updates the member's group only.
2. **Over a queue, only what is available counts** (spec 000, "Views and Aggregated
   Subscriptions over Queues"): the queue tells the watch every message that moved and
   where to (:meth:`conveyor.engine.queue.Queue.watch`); at the end of the engine's
   step the watch adds or removes each one by its last state. A leased message
   leaves, a returned one comes back, an acknowledged or expired one leaves for good,
   one beyond TargetQueueDepth is not there yet. The watch never changes the queue.
   In a replicated queue a message another instance owns (ELSEWHERE) counts like an
   available one, as the queue's ``sow`` shows it, until it leaves the queue there
   (acknowledged, expired): its leases on its owner are not replicated, so views over
   the same queue on two instances differ by the messages leased on either.
3. **One update per group per step.** Changed groups are rendered at the end of the
   step (:meth:`View.flush`), in configuration order, so a view over a view sees its
   source's changes in the same step; a group that lost its last member is deleted.
4. **Synthetic records**: a view record has no bookmark and no correlation id; its
   SowKey is the checksum of the view's key domain and the grouping values. It is not
   journaled, unless a queue takes the view as its underlying topic: then each new
   state of a record is published on the view's topic (:attr:`View.feeds_queue`).
5. **Restart**: a view is rebuilt from its sources during recovery (SOW topics replay;
   queue views are filled from the queue's available messages at the end).
"""

from __future__ import annotations

import logging
from typing import Callable, Hashable

import msgspec

from conveyor import errors
from conveyor.config.model import ViewConfig
from conveyor.protocol.bookmarks import format_bookmark
from conveyor.engine import poison
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.queue.queue import Queue
from conveyor.engine.queue.state import MessageState
from conveyor.engine.sow.aggregation import Aggregation, MemberSink
from conveyor.engine.sow.focus import RecordChange
from conveyor.engine.sow.topic import generated_key
from conveyor.expr.projection import key_value
from conveyor.expr.values import to_text

log = logging.getLogger("conveyor.engine")
_encode = msgspec.json.Encoder().encode
#: The states Queue.available lists: what a view over the queue counts (rule 2).
_SHOWN = frozenset({MessageState.AVAILABLE, MessageState.ELSEWHERE})


def view_key(domain: str, group: tuple[Hashable, ...]) -> int:
    """Rule 4: the key of a view record."""
    return generated_key(domain, [to_text(key_value(v)) for v in group])


class View:
    """One configured view: its aggregation and its current records (rules 1, 3, 4)."""

    __slots__ = ("config", "name", "aggregation", "records", "feeds_queue", "_seq", "listeners", "key_paths", "_keys")

    def __init__(self, config: ViewConfig, aggregation: Aggregation, *, feeds_queue: bool = False) -> None:
        self.config = config
        self.name = config.name
        self.aggregation = aggregation
        self.records: dict[int, Entry] = {}  # view key -> the record
        self._keys: dict[tuple[Hashable, ...], tuple[int, str]] = {}  # group -> its view key and its text (a checksum: kept)
        self.feeds_queue = feeds_queue  # rule 4: a queue takes the view as its underlying topic
        self._seq = 0
        #: Called with the RecordChanges of each flush: subscriptions, downstream views.
        self.listeners: list[Callable[[list[RecordChange], float], None]] = []
        # A delta carries the grouping fields that are plain paths (reference G.5.2).
        self.key_paths = tuple(
            tuple(s for s in g.tree.steps if isinstance(s, str))
            for g in aggregation.projection.grouping
            if hasattr(g.tree, "steps")
        )

    def __len__(self) -> int:
        return len(self.records)

    def parse_keys(self, sow_keys: str) -> list[int]:
        """The keys a ``sow_keys`` option names: a view's keys are numbers (a word names none)."""
        keys = []
        for t in sow_keys.split(","):
            try:
                keys.append(int(t.strip()))
            except ValueError:
                continue
        return keys

    def flush(self, now: float) -> list[RecordChange]:
        """Rule 3: the records of the groups changed since the last flush."""
        changes = []
        keys = self._keys
        for group, record in self.aggregation.take_changes():
            known = keys.get(group)
            if known is None:
                key = view_key(self.config.domain, group)
                known = keys[group] = (key, str(key))
            key, text = known
            old = self.records.get(key)
            if record is None:
                del keys[group]
                if old is None:
                    continue
                del self.records[key]
                changes.append(RecordChange(self.name, key, text, old, None, "deleted"))
                continue
            try:
                data = _encode(record)
            except Exception as exc:  # noqa: BLE001 - engine/poison.py: this record is not sent, its last one stands
                poison.skipped("encode", f"record {text} of view {self.name!r}", exc)
                continue
            self._seq += 1
            new = Entry(self.name, data, now, 0, self._seq, None)
            self.records[key] = new
            changes.append(RecordChange(self.name, key, text, old, new))
        if changes:
            for listener in self.listeners:
                listener(changes, now)
        return changes


def _meta(entry: Entry, position: int) -> dict[str, object]:
    # Message functions in a view describe the queued message (expressions.md 7.3).
    return entry.meta(format_bookmark(entry.publisher, entry.seq, position), entry.timestamp)


class QueueWatch:
    """Rule 2: the available messages of one queue, as member changes for the
    aggregations over it (views and aggregated subscriptions)."""

    __slots__ = ("queue", "name", "_cache", "touched", "aggregations")

    def __init__(self, queue: Queue, cache: MessageCache) -> None:
        self.queue = queue
        self.name = queue.name
        self._cache = cache
        #: position -> its state after its last move since the last reconcile
        self.touched: dict[int, MessageState] = {}
        self.aggregations: list[Aggregation] = []
        queue.watch(self.touched.__setitem__, _SHOWN)

    def attach(self, agg: Aggregation) -> None:
        """Count the queue's available messages in ``agg`` now; it follows from here."""
        self.aggregations.append(agg)
        self.fill(agg)

    def detach(self, agg: Aggregation) -> None:
        if agg in self.aggregations:
            self.aggregations.remove(agg)

    def fill(self, agg: Aggregation) -> None:
        load = self._load
        for p in list(self.queue.available()):
            entry = load(p)
            if entry is not None:
                agg.add(p, p, entry.decoded(), _meta(entry, p))

    def _load(self, position: int) -> Entry | None:
        """The message at ``position``; None (logged) if its journal record is damaged:
        a view cannot count what it cannot read, and the queue goes on without it."""
        try:
            return self._cache.get(position)
        except errors.JournalCorrupt as exc:
            log.error("queue %s: the message at position %d is left out of its views, its journal record is "
                      "damaged (%s)", self.name, position, exc)
            return None

    def reconcile(self) -> None:
        """Rule 2: every message that moved since the last call is counted where it is now."""
        touched = self.touched
        if not touched:
            return
        load = self._load
        # (positions are unique orders: the order of the adds does not matter)
        for agg in self.aggregations:
            members = agg.members
            for p, state in touched.items():
                if state in _SHOWN:
                    if p not in members:
                        entry = load(p)
                        if entry is not None:
                            agg.add(p, p, entry.decoded(), _meta(entry, p))
                elif p in members:
                    agg.remove(p)
        touched.clear()


def member_of_record(agg: MemberSink, change: RecordChange, now: float) -> None:
    """Apply one SOW or view record change to an aggregation over that topic (rule 1).
    The newest-message order is the record's journal position, or a view record's
    sequence number."""
    new = change.new
    if new is None:
        agg.remove(change.key)
        return
    order = change.position if change.position is not None else new.seq
    agg.add(change.key, order, new.decoded(), new.meta(change.bookmark, now))
