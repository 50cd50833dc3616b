"""The State of the World part of the engine: SOW topics, views, their queries and
subscriptions, aggregated subscriptions, and views over queues (reference G;
docs/sow-and-views.md).

:class:`StateOfTheWorld` is owned by the :class:`~conveyor.engine.core.Engine`, which
routes to it the publishes of SOW topics, the durable records, the passage of time and
the commands on SOW topics and views; the commands still enter through the engine's
command dispatch (so its checks apply to them too). Rules:

1. **Publish** (:meth:`prepare`): the final message (a delta publish merged into the
   latest state of its record), its SowKey and its expiry stamp are decided before the
   message is journaled; the record changes when the publish is durable
   (:meth:`applied`), in journal order, like every other effect of a publish.
2. **Every change is one** :class:`~conveyor.engine.focus.RecordChange`: record
   subscriptions get it at once (:mod:`conveyor.engine.focus`); views and aggregated
   subscriptions count it and are rendered at the end of the engine's step
   (:meth:`flush`): queue watches first, then views in configuration order, then
   aggregated subscriptions.
3. **Queries are read-committed**: a ``sow`` sees durable records only. A
   ``sow_delete`` selects from the latest state (what is appended included), journals a
   :class:`~conveyor.records.SowDeletedRec`, and takes effect when that is durable.
4. **Queues are never changed here.** A view or an aggregated subscription over a queue
   reads its available messages through a :class:`~conveyor.engine.views.QueueWatch`.
   A queue over a SOW topic is an ordinary queue over the topic's journaled messages:
   every publish is a new queue message, a delete or an expiry of the record leaves the
   queue alone, and the message carries the expiry the topic stamped.
5. **A view that is a queue's underlying topic publishes its records**: each new state
   of one of its records is journaled on the view's topic (publisher ``views@<instance>``)
   and enters the queue like any publish. After a restart, a record whose last state
   never made it to the journal (a crash in between) is published again.
6. **Restart**: recovery replays publishes and deletes (:meth:`recovered`); then
   :meth:`end_recovery` drops expired records, fills the views over queues, and
   catches up rule 5. The checkpoint keeps each topic's floor (:meth:`floors`).
7. **Replication** (engine/replication.py rule 8): a replicated publish changes the
   record of the key *this* instance's ``Key`` computes from the message (live and
   after a restart alike), and keeps the expiry stamped where it was first published.
   A ``sow_delete`` travels by identity: here it removes a key only if its current
   record is the very publish the delete removed there (:meth:`replicated_delete`),
   applied when durable, in journal order like a local delete, so it commutes with a
   later publish of the key on either side.
8. **A view nobody follows is rendered when read.** With no record subscription, no
   view or aggregated subscription over it and no queue fed by it, a view's changed
   groups stay pending (one entry per group) and are rendered when a query or a new
   subscription reads it (:meth:`_render`): the incremental counting goes on, only the
   output records wait, so a view over a busy queue costs its drain little more than
   the counting.
9. **Filter work per turn** (engine/filter_budget.py): a record or delta subscription's
   filter is charged to the turn's budget before a change is delivered to it; what the
   turn cannot pay waits, in order, for later turns (the shell pumps it), so a hundred
   slow filters on one SOW topic cannot stall every other client.
10. **A query's result is produced as its connection drains it** (engine/sow_query.py
    rules 4 to 8): the records of the step of the command (a SOW topic's keys and
    positions, references to a view's records) are sent a turn at a time between one
    ``group_begin`` and ``group_end``. The subscription of a ``sow_and_subscribe`` is
    made in the step of the command, and the updates it gets until its query's
    ``group_end`` is sent are held (:class:`_Held`), then delivered in order: the client
    sees the records of that step, then every change after it, as when a query ran in
    one step. Held updates past ``Limits/OutputBudget`` (payload and framing) close the
    connection as a slow consumer.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from collections import deque
from typing import Any, Callable, Iterable, Iterator

import msgspec

from conveyor import errors, expr, records
from conveyor.config.model import Config, SowTopicConfig, ViewConfig, topic_matcher
from conveyor.engine import poison
from conveyor.engine.aggregation import Aggregation, MemberSink
from conveyor.protocol.bookmarks import format_bookmark, publisher_id
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.filters import check_connection_filters, filter_cost_ticks
from conveyor.engine.focus import RecordChange, RecordSubscription, deliver, record_message
from conveyor.engine.joins import Join, rewrite_identifiers, unknown_roots
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.queue_bindings import QueueBindings
from conveyor.engine.sessions import Session, SessionSubscription, SubKind
from conveyor.engine.sow import SowTopic, key_text
from conveyor.engine.sow_query import (QUERY_MESSAGE_OVERHEAD, OrderBy, Production, Queries, Snapshot, Tally,
                                       check_batch_size, frozen_keyed_positions, frozen_references, query_failed,
                                       record_messages, selection)
from conveyor.engine.views import QueueWatch, View, member_of_record, view_key
from conveyor.expr.projection import NON_DETERMINISTIC, Projection
from conveyor.protocol import messages as m
from conveyor.protocol.messages import ack_types
from conveyor.protocol.options import Options, parse_options
from conveyor.protocol.payload import BodyRefused, decode_json

log = logging.getLogger("conveyor.engine")

#: A SOW query: ``sow``, or the query part of a ``sow_and_subscribe`` / ``sow_and_delta_subscribe``.
SowQuery = m.Sow | m.SowAndSubscribe | m.SowAndDeltaSubscribe
#: A subscription to a SOW topic's or view's records (with a query, or aggregated).
RecordsSubscribe = m.Subscribe | m.DeltaSubscribe | m.SowAndSubscribe | m.SowAndDeltaSubscribe

VIEWS_CLIENT_NAME = "views"  # the publisher of view records that feed queues (rule 5)
_encode = msgspec.json.Encoder().encode


class _PendingDelete:
    __slots__ = ("end", "topic", "victims", "replicated")

    def __init__(self, end: int, topic: str, victims: list[tuple[Any, int]],
                 replicated: records.SowDeletedRec | None = None) -> None:
        self.end = end
        self.topic = topic
        self.victims = victims
        self.replicated = replicated  # a delete by identity (rule 7): victims are found when it applies


class _Held:
    """Rule 10: the updates of a subscription waiting for its query's group_end."""

    __slots__ = ("changes", "bytes", "over")

    def __init__(self) -> None:
        self.changes: list[tuple[RecordChange, float]] = []
        self.bytes = 0
        self.over = False  # past the bound: the connection is being closed


class AggregatedSubscription:
    """``projection`` + ``grouping`` on a subscription: a private view over one source,
    whose group records go to one subscription (reference G.4)."""

    __slots__ = ("sub", "source", "aggregation", "sent", "domain")

    def __init__(self, sub: RecordSubscription, source: str, aggregation: Aggregation) -> None:
        self.sub = sub
        self.source = source
        self.aggregation = aggregation
        self.sent: dict[int, Entry] = {}  # view key -> the record last sent
        self.domain = f"{source}/{sub.sub_id}"

    def flush(self, now: float, send: Callable[[RecordSubscription, RecordChange, float], None]) -> None:
        for group, record in self.aggregation.take_changes():
            key = view_key(self.domain, group)
            old = self.sent.get(key)
            if record is None:
                if old is not None:
                    del self.sent[key]
                    send(self.sub, RecordChange(self.sub.topic, key, str(key), old, None, "deleted"), now)
                continue
            new = Entry(self.sub.topic, _encode(record), now, 0, 0, None)
            self.sent[key] = new
            send(self.sub, RecordChange(self.sub.topic, key, str(key), old, new), now)


class StateOfTheWorld:
    def __init__(self, config: Config, journal: JournalPort, cache: MessageCache, outbox: Outbox, publishes: PublishLog,
                 bindings: QueueBindings, budget: FilterBudget | None = None, *, queries: Queries) -> None:
        self._journal = journal
        self._cache = cache
        self._outbox = outbox
        self._queries = queries  # rule 10: results on their way, pumped by the engine
        # Rule 10: the updates of a sow_and_subscribe whose query is on its way, held
        # until its group_end, and what they weigh (bounded by Limits/OutputBudget).
        self._held: dict[RecordSubscription, _Held] = {}
        self._held_bytes_max = config.limits.output_budget_bytes
        self._publishes = publishes
        self._bindings = bindings
        self._publisher = publisher_id(VIEWS_CLIENT_NAME, instance=config.name)
        self.topics: dict[str, SowTopic] = {t.name: SowTopic(t) for t in config.sow_topics}
        self.views: dict[str, View] = {}
        self._outputs: dict[str, SowTopic] = {}  # rule 5: what each view feeding a queue has journaled
        self._watches: dict[str, QueueWatch] = {}
        self._topic_aggs: dict[str, list[MemberSink]] = {}  # SOW topic -> aggregations over it
        self._view_aggs: dict[str, list[MemberSink]] = {}  # view -> aggregations over it
        self._record_subs: dict[str, list[RecordSubscription]] = {}  # SOW topic or view -> subscriptions
        self._aggregated: list[AggregatedSubscription] = []
        self._deletes: deque[_PendingDelete] = deque()
        # Rule 9: the turn's filter budget, and the deliveries waiting for later turns.
        self._budget = budget
        self._waiting: deque[tuple[RecordSubscription, RecordChange, float]] = deque()
        self._recovering = False
        for vc in config.views:
            self._build_view(vc)

    # --- configuration ------------------------------------------------------------------------

    def _build_view(self, vc: ViewConfig) -> None:
        if vc.joins:
            self._build_join_view(vc)
            return
        projection = _view_projection(vc, vc.projection, vc.grouping)
        flt = None
        if vc.filter is not None:
            flt = _filter(vc.filter, lambda msg: errors.ConfigError(f"view {vc.name!r}: invalid Filter: {msg}",
                                                                    path=f"{vc.path}/Filter"))
        aggregation = Aggregation(projection, flt)
        (source,) = vc.underlying
        self._attach(source, aggregation)
        self._add_view(vc, aggregation)

    def _build_join_view(self, vc: ViewConfig) -> None:
        """A view over left outer joins (engine/joins.py)."""
        join_topics = vc.underlying  # in join order, the driving topic first
        fields = tuple(rewrite_identifiers(f) for f in vc.projection)
        grouping = tuple(rewrite_identifiers(g) for g in vc.grouping)
        projection = _view_projection(vc, fields, grouping)
        for section, texts, originals in (("Projection", fields, vc.projection), ("Grouping", grouping, vc.grouping)):
            for text, original in zip(texts, originals):
                stray = unknown_roots(text, join_topics)
                if stray:
                    raise errors.ConfigError(
                        f"view {vc.name!r}: field {original!r} of a join names no joined topic ({', '.join(stray)})",
                        path=f"{vc.path}/{section}",
                        hint=" or ".join(f"[{t}].[/path]" for t in join_topics).join(("write ", "")),
                    )
        aggregation = Aggregation(projection)
        join = Join(vc.joins, aggregation, null_equivalency=vc.join_null_equivalency)
        for topic in join_topics:
            self._attach(topic, join.side(topic))
        self._add_view(vc, aggregation)

    def _add_view(self, vc: ViewConfig, aggregation: Aggregation) -> None:
        view = View(vc, aggregation)
        view.listeners.append(self._view_changed)
        self.views[vc.name] = view
        if any(topic_matcher(b.config.underlying)(vc.name) for b in self._bindings):
            view.feeds_queue = True
            self._outputs[vc.name] = SowTopic(SowTopicConfig(name=vc.name, message_type="json"))

    def _attach(self, source: str, aggregation: MemberSink, now: float | None = None) -> None:
        """Feed ``aggregation`` from ``source`` (a SOW topic, a view or a queue), counting
        what the source holds now (``now``: when a client asks; None: at startup, when
        no view has anything to render yet)."""
        if source in self.topics:
            self._topic_aggs.setdefault(source, []).append(aggregation)
            load = self._cache.get
            for key, position in self.topics[source].items():
                entry = load(position)
                aggregation.add(key, position, entry.decoded(),
                                entry.meta(format_bookmark(entry.publisher, entry.seq, position), entry.timestamp))
        elif source in self.views:
            if now is not None:
                self._render(source, now)
            self._view_aggs.setdefault(source, []).append(aggregation)
            for key, entry in self.views[source].records.items():
                aggregation.add(key, entry.seq, entry.decoded(), entry.meta(None, entry.timestamp))
        else:
            binding = self._bindings.get(source)
            assert binding is not None, source  # the configuration checked it
            assert isinstance(aggregation, Aggregation), source  # no join over a queue (config/sow.py)
            watch = self._watches.get(source)
            if watch is None:
                watch = self._watches[source] = QueueWatch(binding.queue, self._cache)
            watch.attach(aggregation)

    def _detach(self, source: str, aggregation: Aggregation) -> None:
        for table in (self._topic_aggs, self._view_aggs):
            aggs = table.get(source)
            if aggs is not None and aggregation in aggs:
                aggs.remove(aggregation)
        watch = self._watches.get(source)
        if watch is not None:
            watch.detach(aggregation)

    # --- what is what ---------------------------------------------------------------------------

    def topic(self, name: str) -> SowTopic | None:
        return self.topics.get(name)

    def owns(self, name: str) -> bool:
        """Whether ``name`` is a SOW topic or a view (queries and record subscriptions)."""
        return name in self.topics or name in self.views

    def is_view(self, name: str) -> bool:
        return name in self.views

    # --- publishing (rule 1) ------------------------------------------------------------------------

    def prepare(self, st: SowTopic, cmd: m.Publish | m.DeltaPublish, now: float, *, is_delta: bool
                ) -> tuple[bytes, Any, float, str | None]:
        """(message to journal, key, expiry stamp, correlation id) of a publish to ``st``."""
        data, key, expires_at = st.prepare(cmd.data, cmd.sow_key, cmd.expiration, now, is_delta=is_delta,
                                           load=self._load_data)
        correlation_id = cmd.correlation_id
        if is_delta and correlation_id is None:
            # reference G.5.1: the update's correlation id, else the stored record's
            latest = st.pending.get(key)
            if latest is None and key in st.records:
                correlation_id = self._cache.get(st.records[key]).correlation_id
        return data, key, expires_at, correlation_id

    def _load_data(self, position: int) -> bytes:
        return self._cache.get(position).data

    def appended(self, st: SowTopic, key: Any, position: int, data: bytes) -> None:
        st.appended(key, position, data)

    def applied(self, position: int, topic: str, sow_key: str, expiration: float, now: float,
                entry_of: Callable[[], Entry]) -> None:
        """A durable publish carrying a SowKey: the record changes (rule 1). ``entry_of()``
        builds the message, only if someone needs it (subscriptions, views)."""
        out = self._outputs.get(topic)
        if out is not None:
            out.apply(position, sow_key, 0.0)
            return
        st = self.topics.get(topic)
        if st is None:
            return  # a SowKey on a topic no longer kept in the SOW
        key = st.parse_key(sow_key)
        if key is None:
            return
        old = st.apply(position, key, expiration)
        subs = self._record_subs.get(topic)
        if not subs and not self._topic_aggs.get(topic):
            return  # nobody follows the topic: the record is its position, nothing more
        entry = entry_of()
        if self._recovering:
            self._count(topic, RecordChange(topic, key, sow_key, old, entry, position=position), now)
            return
        self._cache.put(position, entry)
        bookmark = format_bookmark(entry.publisher, entry.seq, position)
        self._changed(RecordChange(topic, key, sow_key, old, entry, "publish", bookmark, position, self._cache.get), now)

    def _changed(self, change: RecordChange, now: float) -> None:
        """Rule 2: one record changed."""
        for sub in self._record_subs.get(change.topic, ()):
            self._send(sub, change, now)
        self._count(change.topic, change, now)

    def _count(self, topic: str, change: RecordChange, now: float) -> None:
        for agg in self._topic_aggs.get(topic, ()):
            member_of_record(agg, change, now)

    # --- durability, time (rules 3 and 6) --------------------------------------------------------

    def durable(self, now: float) -> None:
        """Apply the deletes now durable (after the publishes before them); a record that
        expired before its publish became durable goes at once."""
        end = self._journal.durable_end
        deletes = self._deletes
        while deletes and deletes[0].end <= end:
            d = deletes.popleft()
            if d.replicated is not None:
                self._delete(d.topic, self._victims_by_identity(d.replicated), now)
            else:
                self._delete(d.topic, d.victims, now, d.end)
        self.tick(now)

    def _delete(self, topic: str, victims: Iterable[tuple[Any, int]], now: float, end: int | None = None) -> int:
        st = self.topics[topic]
        done = 0
        for key, position in victims:
            hit = st.pending.get(key)
            if hit is not None and hit[1] is None and hit[0] == end:
                del st.pending[key]  # the tombstone of this delete (see sow_delete)
            if st.delete(key, position):
                done += 1
                if self._recovering:
                    self._count(topic, RecordChange(topic, key, key_text(key), position, None, "deleted"), now)
                else:
                    self._changed(RecordChange(topic, key, key_text(key), position, None, "deleted",
                                               load=self._cache.get), now)
        return done

    def tick(self, now: float) -> None:
        """Expire the records due at ``now``."""
        for st in self.topics.values():
            for key, position in st.expire_due(now):
                change = RecordChange(st.name, key, key_text(key), position, None, "expired", load=self._cache.get)
                if self._recovering:
                    self._count(st.name, change, now)
                else:
                    self._changed(change, now)

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (st.next_deadline() for st in self.topics.values()) if d is not None]
        return min(deadlines) if deadlines else None

    def flush(self, now: float) -> None:
        """Rule 2: render what changed in this step."""
        for watch in self._watches.values():
            watch.reconcile()
        for view in self.views.values():
            if self._followed(view):
                view.flush(now)
        for agg_sub in self._aggregated:
            agg_sub.flush(now, self._send)

    # --- delivery within the turn's filter budget (rule 9) -------------------------------------

    def _send(self, sub: RecordSubscription, change: RecordChange, now: float) -> None:
        """Deliver now if the turn can pay the subscription's filter and nothing waits
        before it; else after what waits, in a later turn. Held while the subscription's
        query is on its way (rule 10)."""
        if self._held:
            held = self._held.get(sub)
            if held is not None:
                self._hold(sub, held, change, now)
                return
        if self._waiting or not self._afford(sub):
            self._waiting.append((sub, change, now))
            return
        deliver(sub, change, now, self._outbox)

    def _hold(self, sub: RecordSubscription, held: _Held, change: RecordChange, now: float) -> None:
        """Rule 10: keep ``change`` for after the query's group_end, within the bound."""
        if held.over:
            return
        held.changes.append((change, now))
        new = change.new
        held.bytes += (len(new.data) if new is not None else 0) + QUERY_MESSAGE_OVERHEAD
        if held.bytes > self._held_bytes_max:
            held.over = True
            held.changes = []
            self._outbox.close(sub.conn_id, f"slow consumer: the updates of subscription {sub.sub_id!r} waiting for "
                                            f"the end of its query passed Limits/OutputBudget "
                                            f"({self._held_bytes_max} bytes)")

    def _release(self, sub: RecordSubscription) -> None:
        """Rule 10: the query's group_end is out: the held updates go, in order."""
        held = self._held.pop(sub, None)
        if held is not None and not held.over:
            for change, now in held.changes:
                self._send(sub, change, now)

    def _afford(self, sub: RecordSubscription) -> bool:
        if self._budget is None or sub.filter is None:
            return True
        # A delta or oof subscription may evaluate its filter on the old record too.
        return self._budget.take(_filter_ticks(sub.filter) * (2 if sub.delta or sub.oof else 1))

    @property
    def delivery_pending(self) -> bool:
        """Deliveries wait for a later turn's filter budget (:meth:`continue_delivery`)."""
        return bool(self._waiting)

    def continue_delivery(self) -> None:
        """A new turn: deliver what waits, in order, while the budget lasts."""
        waiting = self._waiting
        while waiting:
            sub, change, now = waiting[0]
            if not self._afford(sub):
                return
            waiting.popleft()
            deliver(sub, change, now, self._outbox)

    def _followed(self, view: View) -> bool:
        """Rule 8: whether anything takes the view's changes as they happen."""
        name = view.name
        return view.feeds_queue or bool(self._record_subs.get(name)) or bool(self._view_aggs.get(name))

    def view_records(self, name: str, now: float) -> dict[int, Entry]:
        """The current records of view ``name`` (view key -> record), rendered now."""
        self._render(name, now)
        return self.views[name].records

    def _render(self, name: str, now: float) -> None:
        """Rule 8: bring a view nobody follows up to date before its records are read."""
        view = self.views.get(name)
        if view is not None:
            view.flush(now)

    def _view_changed(self, changes: list[RecordChange], now: float) -> None:
        """A view's records changed (views rule 3): its subscriptions, the views and
        aggregated subscriptions over it, and the queue it feeds (rule 5)."""
        name = changes[0].topic
        for agg in self._view_aggs.get(name, ()):
            for change in changes:
                member_of_record(agg, change, now)
        if self._recovering:
            return
        for sub in self._record_subs.get(name, ()):
            for change in changes:
                self._send(sub, change, now)
        if self.views[name].feeds_queue:
            for change in changes:
                if change.new is not None:
                    self._publish_view_record(name, change.key_text, change.new.data, now)

    def _publish_view_record(self, view: str, sow_key: str, data: bytes, now: float) -> None:
        publishes = self._publishes
        seq = publishes.next_seq(self._publisher)
        publishes.append_record(records.PublishRec(view, self._publisher, seq, now, data, None, sow_key=sow_key))

    # --- recovery (rule 6) ------------------------------------------------------------------------

    def begin_recovery(self) -> None:
        self._recovering = True

    def recovered(self, position: int, rec: records.PublishRec | records.PlainPublish | records.SowDeletedRec,
                  now: float) -> None:
        """A record replayed by recovery: a publish with a SowKey, or a delete."""
        if type(rec) is records.SowDeletedRec:
            st = self.topics.get(rec.topic)
            if st is not None:
                if rec.publishers:  # it arrived by replication (rule 7)
                    victims = self._victims_by_identity(rec)
                else:
                    victims = [(k, p) for k, p in ((st.parse_key(t), p) for t, p in zip(rec.keys, rec.positions))
                               if k is not None]
                self._delete(rec.topic, victims, now)
            return
        assert not isinstance(rec, records.SowDeletedRec)  # it returned above
        topic = rec.topic
        out = self._outputs.get(topic)
        if out is not None and rec.sow_key:
            out.apply(position, rec.sow_key, 0.0)
            return
        st = self.topics.get(topic)
        if st is None:
            return
        sow_key = self.local_key(position, topic, rec.data, rec.sow_key)
        if sow_key is None:
            return
        self.applied(position, topic, sow_key, rec.expiration, now, lambda: Entry(
            topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id, rec.expiration))

    def local_key(self, position: int, topic: str, data: bytes, supplied: str) -> str | None:
        """The SowKey of a journaled message of SOW topic ``topic`` as this instance's
        configuration defines it now (Key or KeyDomain may have changed since, or differ
        on the instance a replicated publish comes from); None: it has no usable key."""
        st = self.topics[topic]
        if not st.keyed:
            return supplied or None
        try:
            return key_text(st.key_of(decode_json(data), supplied))
        except Exception as exc:  # noqa: BLE001 - a body it cannot read, a key it cannot make (poison.py rule 1)
            log.warning("SOW topic %s: the message at %d has no usable key (%s): not kept", topic, position, exc)
            return None

    # --- replication (rule 7) -----------------------------------------------------------------------

    def identify(self, position: int) -> tuple[int, int] | None:
        """(publisher, seq) of the record at ``position`` (None: its journal record is
        damaged; it cannot be named to another instance)."""
        try:
            entry = self._cache.get(position)
        except errors.JournalCorrupt as exc:
            log.error("SOW: the record at position %d cannot be named to a replica, its journal record is damaged "
                      "(%s)", position, exc)
            return None
        return entry.publisher, entry.seq

    def replicated_delete(self, rec: records.SowDeletedRec, now: float) -> bool:
        """A ``sow_delete`` that arrived by replication (with its origin and path): journaled
        here, so it survives a restart and travels on, and applied when durable. False:
        its topic is not kept in the SOW here (nothing to do, nothing journaled)."""
        if rec.topic not in self.topics:
            return False
        self._journal.append(records.encode(msgspec.structs.replace(rec, positions=[])))
        self._deletes.append(_PendingDelete(self._journal.end, rec.topic, [], rec))
        return True

    def _victims_by_identity(self, rec: records.SowDeletedRec) -> list[tuple[Any, int]]:
        """Rule 7: the keys whose current record is the publish the delete names."""
        st = self.topics[rec.topic]
        victims = []
        for text, publisher, seq in zip(rec.keys, rec.publishers, rec.seqs):
            key = st.parse_key(text)
            position = st.records.get(key) if key is not None else None
            if position is not None and self.identify(position) == (publisher, seq):
                victims.append((key, position))
        return victims

    def end_recovery(self, now: float) -> None:
        """Rule 6, after the replay."""
        self.tick(now)  # records already past their expiry go (reference G.1.4)
        for watch in self._watches.values():
            watch.touched.clear()
            for agg in watch.aggregations:
                watch.fill(agg)
        for view in self.views.values():
            view.flush(now)
        self._recovering = False
        for name, out in self._outputs.items():
            load = self._load_data
            for key, entry in self.views[name].records.items():
                text = str(key)
                journaled = out.records.get(text)
                if journaled is None or load(journaled) != entry.data:
                    self._publish_view_record(name, text, entry.data, now)

    def floors(self, first_unapplied: int) -> dict[str, int]:
        """Per SOW topic (and view output), where recovery must start to rebuild it."""
        out = {}
        for name, st in (*self.topics.items(), *((f"view:{n}", o) for n, o in self._outputs.items())):
            floor = st.floor()
            out[name] = first_unapplied if floor is None else min(floor, first_unapplied)
        return out

    def configured_floors(self) -> list[str]:
        return [*self.topics, *(f"view:{n}" for n in self._outputs)]

    # --- queries (rule 3) -------------------------------------------------------------------------

    def query(self, conn_id: int, cmd: SowQuery, now: float, *, sub: RecordSubscription | None = None,
              opts: Options | None = None) -> None:
        """A ``sow`` (or the query part of a ``sow_and_subscribe``) on a SOW topic or view:
        the records of this step, produced as the connection drains them (rule 10)."""
        if opts is None:
            opts = parse_options("sow", cmd.options)
        check_batch_size(cmd.batch_size)
        top_n = cmd.top_n if cmd.top_n is not None else opts.get("top_n")
        skip_n = opts.get("skip_n") or 0
        if skip_n and top_n is None:
            raise errors.InvalidOption("skip_n needs top_n", option="skip_n")
        flt = _filter(cmd.filter, errors.BadFilter)
        orderby = OrderBy(cmd.orderby) if cmd.orderby else None
        topic = cmd.topic
        self._render(topic, now)
        source, load = _query_rows(self.topics.get(topic), self.views.get(topic), self._cache, cmd.sow_keys)
        matches: Callable[[Any], bool] | None = None
        if flt is not None:
            where = f"a sow query of connection {conn_id}"

            def matches(ref: Any) -> bool:
                return poison.matches(flt, load(ref), None, now, where)

        tally = Tally()
        source, rows = selection(source, matches, orderby=orderby, top_n=top_n, skip_n=skip_n,
                                 data_of=lambda ref: load(ref).decoded(), key_text=key_text,
                                 copy=frozen_keyed_positions if topic in self.topics else frozen_references,
                                 tally=tally)
        cost = _filter_ticks(flt) if flt is not None and orderby is None and not skip_n else 0  # paid as it goes
        qid = cmd.query_id or cmd.cid
        messages = record_messages(rows, load, topic=topic, query_id=qid,
                                   key_text=None if sub is not None and sub.no_sowkey else key_text,
                                   seen=sub.seen if sub is not None and sub.oof else None)
        self._produce(conn_id, cmd, qid, source, messages, cost, tally, sub)

    def _produce(self, conn_id: int, cmd: SowQuery, qid: str | None, source: Snapshot[Any],
                 messages: Iterator[m.Message | None], cost: int, tally: Tally, sub: RecordSubscription | None) -> None:
        """Rule 10: group_begin, the result as the connection drains it, group_end and the
        acks; a subscription's updates are held until then."""
        outbox = self._outbox
        if sub is not None:
            self._held[sub] = _Held()

        def finish(error: errors.JournalError | None) -> None:
            outbox.send(conn_id, m.GroupEnd(query_id=qid, cid=cmd.cid))
            if error is None:
                self._query_acks(conn_id, cmd, qid, tally.returned, tally.matches, tally.examined)
            else:
                outbox.send(conn_id, query_failed(cmd.cid, qid, error))
            if sub is not None:
                self._release(sub)

        self._queries.start(Production(conn_id, m.GroupBegin(query_id=qid, cid=cmd.cid), messages, finish, source, cost))

    def _query_acks(self, conn_id: int, cmd: SowQuery, qid: str | None, returned: int, hits: int, examined: int) -> None:
        subscribing = not isinstance(cmd, m.Sow)
        for kind in ack_types(cmd.ack_type) & {"completed", "stats", "processed"}:
            if subscribing and kind == "processed":
                continue  # the subscribe part acknowledges
            self._outbox.send(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, query_id=qid, records_returned=returned,
                                             matches=hits, topic_matches=examined))

    def _rows(self, topic: str, now: float) -> list[tuple[Any, Entry]]:
        """(key, record) of every current record of a SOW topic or view."""
        self._render(topic, now)
        if topic in self.topics:
            load = self._cache.get
            return [(k, load(p)) for k, p in self.topics[topic].items()]
        return list(self.views[topic].records.items())

    # --- sow_delete (rule 3) -------------------------------------------------------------------------

    def sow_delete(self, conn_id: int, cmd: m.SowDelete, now: float) -> None:
        st = self.topics[cmd.topic]
        if cmd.options:
            raise errors.InvalidOption(f"sow_delete on SOW topic {st.name!r} takes no options (cancel and expire "
                                       "are for queue messages)")
        forms = [f for f in ("filter", "sow_keys", "data", "bookmark") if getattr(cmd, f)]
        if len(forms) != 1:
            raise errors.InvalidOption(
                f"sow_delete on SOW topic {st.name!r} takes exactly one of filter, sow_keys or data "
                f"(got {', '.join(forms) or 'none'})"
            )
        if cmd.bookmark:
            raise errors.InvalidOption(f"{st.name!r} is a SOW topic: delete by filter, sow_keys or data, "
                                       "not by bookmark (bookmarks acknowledge queue messages)")
        examined = 0
        victims: list[tuple[Any, int]] = []
        position: int | None
        if cmd.filter:
            flt = _filter(cmd.filter, errors.BadFilter)
            load = self._cache.get
            for key, position, data in list(st.latest_items()):
                examined += 1
                entry = load(position) if data is None else Entry(st.name, data, now, 0, 0, None)
                if flt is None or poison.matches(flt, entry, None, now, f"a sow_delete of connection {conn_id}"):
                    victims.append((key, position))
        else:
            if cmd.sow_keys:
                keys = _topic_keys(st, cmd.sow_keys)
            else:
                assert cmd.data is not None  # the one form given (checked above)
                try:
                    data = decode_json(cmd.data)
                except BodyRefused as exc:
                    raise errors.BadMessage(f"sow_delete data is not JSON: {exc}", **exc.details) from None
                keys = [st.key_of(data, None)]
            latest = st.latest_positions()
            for key in dict.fromkeys(keys):
                examined += 1
                position = latest.get(key)
                if position is not None:
                    victims.append((key, position))
        if victims:
            rec = records.SowDeletedRec(st.name, [key_text(k) for k, _ in victims], [p for _, p in victims])
            self._journal.append(records.encode(rec))
            end = self._journal.end
            self._deletes.append(_PendingDelete(end, st.name, victims))
            for key, _ in victims:
                st.pending[key] = (end, None)  # a tombstone: a delta publish now starts afresh
        outbox = self._outbox
        acks = ack_types(cmd.ack_type)
        count = len(victims)
        for kind in acks & {"processed", "stats"}:
            outbox.send(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=count, matches=count,
                                       topic_matches=examined))
        for kind in acks & {"persisted", "completed"}:
            outbox.send_when_durable(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=count))

    # --- subscriptions ------------------------------------------------------------------------------

    def subscribe(self, session: Session, cmd: RecordsSubscribe, now: float, *, query: bool, is_delta: bool) -> None:
        """``sow_and_subscribe`` / ``sow_and_delta_subscribe`` (``query``), ``delta_subscribe``
        or ``subscribe`` on a SOW topic or view; or any of them with projection and
        grouping (an aggregated subscription, on a queue too)."""
        command = {(True, False): "sow_and_subscribe", (True, True): "sow_and_delta_subscribe",
                   (False, True): "delta_subscribe", (False, False): "subscribe"}[(query, is_delta)]
        opts = parse_options(command, cmd.options)
        sub_id = cmd.sub_id or cmd.cid or session.new_sub_id()
        if opts.has("replace"):
            self._replace(session, sub_id, cmd, opts, now, query=query)
            self._ack_subscribe(session, cmd, sub_id)
            return
        if sub_id in session.subs:
            raise errors.DuplicateSubscription(f"subscription {sub_id!r} already exists (use the replace option)")
        if getattr(cmd, "bookmark", None):
            raise errors.InvalidOption("a delta subscription cannot replay from a bookmark", option="bookmark")
        if opts.get("max_backlog") is not None:
            raise errors.InvalidOption(f"max_backlog applies to queue subscriptions; {cmd.topic!r} is not a queue "
                                       "(an aggregated subscription takes no lease)", option="max_backlog")
        if query and opts.get("skip_n") is not None:
            raise errors.InvalidOption("paginated subscriptions (skip_n on sow_and_subscribe) are not supported",
                                       option="skip_n")
        flt = _filter(cmd.filter, errors.BadFilter)
        check_connection_filters([s.filter for s in session.subs.values()], flt)  # filters.py
        if opts.has("oof") and flt is not None:
            _deterministic(flt)
        sub = RecordSubscription(
            sub_id, session.conn_id, cmd.topic, filter=flt, oof=opts.has("oof"), delta=is_delta,
            no_empties=opts.has("no_empties"), no_sowkey=opts.has("no_sowkey"),
        )
        projection = opts.list("projection")
        grouping = opts.list("grouping")
        if projection is not None or grouping is not None:
            self._subscribe_aggregated(session, cmd, sub, projection, grouping, now, query=query, opts=opts)
        else:
            if cmd.topic not in self.topics and cmd.topic not in self.views:
                raise errors.UnknownTopic(f"{cmd.topic!r} is not a SOW topic or a view")
            sub.key_paths = self._key_paths(cmd.topic)
            self._render(cmd.topic, now)  # what changed before it subscribed is not news to it
            if query:
                assert not isinstance(cmd, (m.Subscribe, m.DeltaSubscribe))  # a query is a sow_and_* command
                self.query(session.conn_id, cmd, now, sub=sub, opts=opts)
            self._record_subs.setdefault(cmd.topic, []).append(sub)
        session.subs[sub_id] = SessionSubscription(
            sub_id, session.conn_id, cmd.topic, topic_matcher(cmd.topic), SubKind.RECORDS, flt, cmd.cid, consumer=sub,
        )
        self._ack_subscribe(session, cmd, sub_id)

    def _ack_subscribe(self, session: Session, cmd: RecordsSubscribe, sub_id: str) -> None:
        acks = ack_types(cmd.ack_type)
        if "processed" in acks or not acks:
            self._outbox.send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, sub_id=sub_id))

    def _key_paths(self, topic: str) -> tuple[tuple[str, ...], ...]:
        if topic in self.topics:
            return self.topics[topic].key_paths
        return self.views[topic].key_paths

    def _replace(self, session: Session, sub_id: str, cmd: RecordsSubscribe, opts: Options, now: float, *, query: bool) -> None:
        """reference G.1.2: the query runs again; records newly in scope are sent; with
        oof, records that no longer match get an oof."""
        held = session.subs.get(sub_id)
        if held is None or held.kind is not SubKind.RECORDS:
            raise errors.UnknownSubscription(f"no SOW subscription {sub_id!r} to replace")
        sub: RecordSubscription = held.consumer
        if any(a.sub is sub for a in self._aggregated):
            raise errors.InvalidOption("an aggregated subscription cannot be replaced", option="replace")
        if cmd.topic != sub.topic:
            raise errors.InvalidOption("replace cannot change the topic of a SOW subscription", option="replace")
        flt = _filter(cmd.filter, errors.BadFilter)
        check_connection_filters([s.filter for s in session.subs.values() if s is not held], flt)
        if sub.oof and flt is not None:
            _deterministic(flt)
        old_flt, sub.filter = sub.filter, flt
        held.filter = flt
        if not query:
            return
        for key, entry in self._rows(sub.topic, now):
            now_in = sub.matches(entry, None, now)
            was_in = key in sub.seen if sub.oof else (old_flt is None or poison.matches(old_flt, entry, None, now))
            if now_in and not was_in:
                self._outbox.send(sub.conn_id, record_message(sub, sub.topic, entry, key_text(key), None))
                if sub.oof:
                    sub.seen.add(key)
            elif was_in and not now_in and sub.oof:
                sub.seen.discard(key)
                self._outbox.send(sub.conn_id, m.OutOfFocus(topic=sub.topic, sow_key=key_text(key), reason="match",
                                                            data=entry.data, sub_id=sub.sub_id))

    def _subscribe_aggregated(self, session: Session, cmd: RecordsSubscribe, sub: RecordSubscription,
                              projection: tuple[str, ...] | None, grouping: tuple[str, ...] | None,
                              now: float, *, query: bool, opts: Options) -> None:
        if not query:
            raise errors.InvalidOption("projection and grouping need sow, sow_and_subscribe or "
                                       "sow_and_delta_subscribe", option="projection")
        assert not isinstance(cmd, (m.Subscribe, m.DeltaSubscribe))  # a query is a sow_and_* command
        aggregation = self._aggregation(cmd.topic, projection, grouping, sub.filter)
        agg_sub = AggregatedSubscription(sub, cmd.topic, aggregation)
        sub.filter = None  # it applied to the source messages (reference G.4)
        sub.key_paths = ()
        self._attach(cmd.topic, aggregation, now)
        aggregation.take_changes()  # what it holds now is the query's answer
        rows = [(view_key(agg_sub.domain, g), Entry(cmd.topic, _encode(r), now, 0, 0, None))
                for g, r in aggregation.records()]
        agg_sub.sent = dict(rows)
        # The list is the query's snapshot (rule 10): references to the records the
        # subscription remembers in ``sent`` anyway.
        self._send_rows(session.conn_id, cmd, Snapshot(rows), opts, sub)
        self._aggregated.append(agg_sub)

    def _aggregation(self, topic: str, projection: tuple[str, ...] | None, grouping: tuple[str, ...] | None,
                     flt: expr.Expression | None) -> Aggregation:
        if projection is None or grouping is None:
            raise errors.InvalidOption("an aggregated query needs both projection and grouping", option="projection")
        if topic not in self.topics and topic not in self.views and self._bindings.get(topic) is None:
            raise errors.UnknownTopic(f"{topic!r} is not a SOW topic, view or queue: nothing to aggregate")
        try:
            return Aggregation(Projection(projection, grouping), flt)
        except expr.ExpressionError as exc:
            raise errors.InvalidOption(f"invalid projection or grouping: {exc}", option="projection") from None

    def aggregated_query(self, conn_id: int, cmd: m.Sow, opts: Options, now: float) -> None:
        """An aggregated ``sow`` (reference G.4): the groups of the source's current
        contents (a queue's available messages), computed once. The aggregation, which
        nothing feeds once detached, is the snapshot: each group's record is rendered
        as it is sent (rule 10)."""
        check_batch_size(cmd.batch_size)
        aggregation = self._aggregation(cmd.topic, opts.list("projection"), opts.list("grouping"),
                                         _filter(cmd.filter, errors.BadFilter))
        self._attach(cmd.topic, aggregation, now)
        self._detach(cmd.topic, aggregation)
        domain = f"{cmd.topic}/query"
        rows = ((view_key(domain, g), Entry(cmd.topic, _encode(r), now, 0, 0, None)) for g, r in aggregation.records())
        self._send_rows(conn_id, cmd, Snapshot(rows), opts, None)

    def _send_rows(self, conn_id: int, cmd: SowQuery, source: Snapshot[tuple[int, Entry]], opts: Options,
                   sub: RecordSubscription | None) -> None:
        top_n = cmd.top_n if cmd.top_n is not None else opts.get("top_n")
        skip_n = opts.get("skip_n") or 0
        orderby = OrderBy(cmd.orderby) if cmd.orderby else None
        tally = Tally()
        source, rows = selection(source, None, orderby=orderby, top_n=top_n, skip_n=skip_n,
                                 data_of=lambda entry: entry.decoded(), key_text=str, copy=frozen_references,
                                 tally=tally)
        qid = cmd.query_id or cmd.cid
        messages = record_messages(rows, _same, topic=cmd.topic, query_id=qid, key_text=str,
                                   seen=sub.seen if sub is not None and sub.oof else None)
        self._produce(conn_id, cmd, qid, source, messages, 0, tally, sub)

    def remove(self, sub: SessionSubscription) -> None:
        """Unsubscribe or the end of a session."""
        rs: RecordSubscription = sub.consumer
        self._held.pop(rs, None)  # rule 10: nothing more for it
        subs = self._record_subs.get(rs.topic)
        if subs is not None and rs in subs:
            subs.remove(rs)
        if self._waiting:  # rule 9: nothing more for it
            self._waiting = deque(w for w in self._waiting if w[0] is not rs)
        for agg_sub in self._aggregated:
            if agg_sub.sub is rs:
                self._aggregated.remove(agg_sub)
                self._detach(agg_sub.source, agg_sub.aggregation)
                break

    # --- statistics -------------------------------------------------------------------------------

    def statistics(self) -> dict[str, dict[str, int]]:
        out = {name: {"records": len(st), "expiring": len(st.expiry)} for name, st in self.topics.items()}
        for name, view in self.views.items():
            out[name] = {"records": len(view.aggregation), "members": len(view.aggregation.members)}
        return out


def _view_projection(vc: ViewConfig, fields: tuple[str, ...], grouping: tuple[str, ...]) -> Projection:
    try:
        return Projection(fields, grouping)
    except expr.ExpressionError as exc:
        raise errors.ConfigError(f"view {vc.name!r}: invalid projection or grouping: {exc}",
                                 path=f"{vc.path}/Projection") from None


def _filter(text: str | None, error: Callable[[str], Exception]) -> expr.Expression | None:
    if not text:
        return None
    try:
        return expr.compile(text)
    except expr.ExpressionError as exc:
        if error is errors.BadFilter:
            raise
        raise error(str(exc)) from None


def _deterministic(flt: expr.Expression) -> None:
    from conveyor.expr.nodes import Call, walk

    for n in walk(flt.tree):
        if isinstance(n, Call) and n.name in NON_DETERMINISTIC:
            raise errors.BadFilter(f"{n.name}() is not deterministic: not allowed in an oof subscription's filter",
                                   position=n.pos, token=n.name)


_filter_ticks = lru_cache(maxsize=4096)(filter_cost_ticks)  # a filter's cost, once (rule 9)


def _query_rows(st: SowTopic | None, view: View | None, cache: MessageCache, sow_keys: str | None
                ) -> tuple[Snapshot[tuple[Any, Any]], Callable[[Any], Entry]]:
    """The rows of a query of SOW topic ``st`` or ``view`` (rule 10) and how to read a
    row's record: a SOW topic's (key, position), read through the message cache; a
    view's (key, record)."""
    if st is not None:
        load = _reader(cache)
        if sow_keys:
            chosen = [(k, st.records[k]) for k in dict.fromkeys(_topic_keys(st, sow_keys)) if k is not None and k in st.records]
            return Snapshot(chosen, frozen_keyed_positions), load
        return Snapshot(st.items(), frozen_keyed_positions), load
    assert view is not None  # the caller checked the name
    if sow_keys:
        wanted = []
        for t in sow_keys.split(","):
            try:
                wanted.append(int(t.strip()))
            except ValueError:
                continue  # a view's keys are numbers: a word names no record
        return Snapshot([(k, view.records[k]) for k in dict.fromkeys(wanted) if k in view.records]), _same
    return Snapshot(iter(view.records.items()), frozen_references), _same


def _topic_keys(st: SowTopic, sow_keys: str) -> list[Any]:
    """The keys a ``sow_keys`` option names on SOW topic ``st`` (None where one does not parse)."""
    return [st.parse_key(t.strip()) for t in sow_keys.split(",") if t.strip()]


def _reader(cache: MessageCache) -> Callable[[int], Entry]:
    """How a query reads a record (rule 10): through the cache without filling it
    (``peek``), remembering the last one read (its filter, then its message)."""
    peek = cache.peek
    last: list[Any] = [None, None]

    def load(position: int) -> Entry:
        if position != last[0]:
            last[0], last[1] = position, peek(position)
        entry: Entry = last[1]
        return entry

    return load


def _same(entry: Entry) -> Entry:
    """A view's row is its record already (rule 10)."""
    return entry
