"""Conflated topics (reference G.1.6; docs/sow-and-views.md, "Conflated topics"): a
read-only copy of a SOW topic, a view or another conflated topic whose records change
at most once per key per ``Interval``. Rules:

1. **Keys.** A conflated topic keeps its underlying's keys: the same SowKeys, the same
   ``sow_keys`` in a query, the same key fields in a delta message.
2. **Conflation.** Each change of an underlying record (a publish, delete or expiry of a
   SOW record, a new state of a view or conflated record) replaces the key's pending
   change. The first pending change opens an interval; at its end
   (:meth:`ConflatedTopics.tick`, at the deadline :meth:`ConflatedTopics.next_deadline`
   gives the engine's timer) the latest pending change of every key is applied to the
   records and sent to the topic's followers (:mod:`conveyor.engine.sow.followers`), one
   :class:`~conveyor.engine.sow.focus.RecordChange` per key, in the order of the keys'
   last changes. So a key changes at most once per interval, and while the underlying
   is quiet nothing is pending and there is no deadline.
3. **Filter.** A pending state is in the topic only if it matches ``Filter`` (evaluated
   at the flush): a record that stops matching leaves the topic as a delete (out-of-focus
   reason ``deleted``, as a view group that loses its last member); a delete or expiry
   of the underlying record is a delete (``deleted``) or an expiry (``expired``).
4. **Synthetic records.** Nothing is journaled on a conflated topic, so its messages
   carry no bookmark; the body, timestamp and correlation id are the underlying
   record's. A publish or ``sow_delete`` on it is refused
   (:meth:`~conveyor.engine.sow.state.StateOfTheWorld.read_only`); views, aggregated
   queries and aggregated subscriptions over it are refused (by the configuration, by
   the command).
5. **Restart.** At the end of recovery each conflated topic is filled from its
   underlying's records, in configuration order (one over another conflated topic sees
   it filled), and nothing is pending: a restart is a flush.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping

from conveyor import errors, expr
from conveyor.config.model import ConflatedTopicConfig
from conveyor.config.sow import check_conflated_topics
from conveyor.engine import poison
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.filters import compile_filter
from conveyor.engine.queue.expiry import earliest
from conveyor.engine.sow.focus import RecordChange
from conveyor.engine.sow.followers import Followers
from conveyor.engine.sow.topic import SowTopic
from conveyor.engine.sow.view import View

log = logging.getLogger("conveyor.engine")

#: The pending change of one key: its SowKey text, the underlying's new state (None:
#: gone) and why it went (``deleted``, ``expired``).
_Pending = tuple[str, Entry | None, str]


class ConflatedTopic:
    """One conflated topic: its records as of the last flush and the pending change per
    key (rules 1 to 3)."""

    __slots__ = ("config", "name", "interval", "filter", "records", "pending", "due", "key_paths", "_parse")

    def __init__(self, config: ConflatedTopicConfig, flt: expr.Expression | None,
                 key_paths: tuple[tuple[str, ...], ...], parse_keys: Callable[[str], list[Any]]) -> None:
        self.config = config
        self.name = config.name
        self.interval = config.interval_s
        self.filter = flt
        self.records: dict[Any, Entry] = {}  # key -> the record as of the last flush (the underlying's keys)
        self.pending: dict[Hashable, _Pending] = {}  # rule 2, in the order of the keys' last changes
        self.due: float | None = None  # the end of the open interval (None: nothing pending)
        self.key_paths = key_paths  # what a delta always carries (the underlying's)
        self._parse = parse_keys

    def __len__(self) -> int:
        return len(self.records)

    def parse_keys(self, sow_keys: str) -> list[Any]:
        """The keys a ``sow_keys`` option names, as the underlying reads them (rule 1)."""
        return [k for k in self._parse(sow_keys) if k is not None]

    def changed(self, change: RecordChange, now: float) -> None:
        """Rule 2: a change of the underlying replaces the key's pending change."""
        pending = self.pending
        pending.pop(change.key, None)
        pending[change.key] = (change.key_text, change.new, change.reason)
        if self.due is None:
            self.due = now + self.interval

    def flush(self, now: float) -> list[RecordChange]:
        """Rules 2 and 3: apply the latest pending change of each key; what changed."""
        pending, self.pending, self.due = self.pending, {}, None
        records = self.records
        changes = []
        for key, (text, new, reason) in pending.items():
            old = records.get(key)
            if new is not None and self._admits(new, now):
                entry = self._record(new)
                records[key] = entry
                changes.append(RecordChange(self.name, key, text, old, entry))
            elif old is not None:
                del records[key]
                changes.append(RecordChange(self.name, key, text, old, None, reason if new is None else "deleted"))
        return changes

    def fill(self, rows: Iterable[tuple[Hashable, Entry]], now: float) -> None:
        """Rule 5: the records are the underlying's (those the Filter admits); nothing pending."""
        self.pending.clear()
        self.due = None
        self.records.clear()
        for key, entry in rows:
            if self._admits(entry, now):
                self.records[key] = self._record(entry)

    def _admits(self, entry: Entry, now: float) -> bool:
        flt = self.filter
        return flt is None or poison.matches(flt, entry, None, now, f"the Filter of conflated topic {self.name!r}")

    def _record(self, entry: Entry) -> Entry:
        """Rule 4: the underlying record's message, as a record of this topic."""
        return Entry(self.name, entry.data, entry.timestamp, entry.publisher, entry.seq, entry.correlation_id,
                     entry.expiration)


class ConflatedTopics:
    """Every configured conflated topic, each following its underlying through the
    :class:`~conveyor.engine.sow.followers.Followers` and flushed by the engine's timer."""

    def __init__(self, configs: Iterable[ConflatedTopicConfig], topics: Mapping[str, SowTopic],
                 views: Mapping[str, View], cache: MessageCache, followers: Followers) -> None:
        self._topics = topics
        self._views = views
        self._cache = cache
        self._followers = followers
        self.topics: dict[str, ConflatedTopic] = {}
        for config in configs:
            self._build(config)

    def _build(self, config: ConflatedTopicConfig) -> None:
        check_conflated_topics((config,))  # the Filter compiles (config/validation.py)
        under = config.underlying
        source: SowTopic | View | ConflatedTopic | None = self._topics.get(under)
        if source is None:
            source = self._views.get(under)
        if source is None:
            source = self.topics.get(under)
        if source is None:
            raise errors.ConfigError(f"conflated topic {config.name!r}: its underlying topic {under!r} is not a SOW "
                                     "topic, view or conflated topic declared before it",
                                     path=f"{config.path}/UnderlyingTopic")
        ct = ConflatedTopic(config, compile_filter(config.filter), source.key_paths, source.parse_keys)
        self.topics[config.name] = ct
        self._followers.listen(under, ct.changed)

    # --- time (rule 2) ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Flush the conflated topics whose interval ended by ``now``, in configuration
        order (one over another takes the other's flush as a pending change)."""
        followers = self._followers
        for ct in self.topics.values():
            if ct.due is not None and ct.due <= now:
                changes = ct.flush(now)
                if changes:
                    followers.views_changed(ct.name, changes, now)

    def next_deadline(self) -> float | None:
        deadline: float | None = None
        for ct in self.topics.values():
            deadline = earliest(deadline, ct.due)
        return deadline

    # --- restart (rule 5) -------------------------------------------------------------------------

    def end_recovery(self, now: float) -> None:
        for ct in self.topics.values():
            ct.fill(self._rows(ct.config.underlying), now)

    def _rows(self, under: str) -> Iterator[tuple[Hashable, Entry]]:
        st = self._topics.get(under)
        if st is None:
            view = self._views.get(under)
            yield from (view.records if view is not None else self.topics[under].records).items()
            return
        for key, position in st.items():
            try:
                yield key, self._cache.get(position)
            except errors.JournalCorrupt as exc:
                log.error("SOW topic %s: the record at position %d is left out of its conflated topics, its journal "
                          "record is damaged (%s)", under, position, exc)

    # --- statistics -------------------------------------------------------------------------------

    def statistics(self) -> dict[str, dict[str, int]]:
        return {name: {"records": len(ct), "pending": len(ct.pending)} for name, ct in self.topics.items()}
