"""The view graph: the configured views, what feeds each one (SOW topics, other views, a
queue through a :class:`~conveyor.engine.sow.view.QueueWatch`, the joined topics of a
:class:`~conveyor.engine.sow.joins.Join`), their rendering at the end of a step or, for
a view nobody follows, when it is read, and the records a view that feeds a queue
publishes (:mod:`conveyor.engine.sow.state` rules 2, 4, 5, 6 and 8). One view:
:mod:`conveyor.engine.sow.view`.

An aggregation over a SOW topic or a view is fed through the topic's or view's
:class:`~conveyor.engine.sow.followers.Followers`; one over a queue, through the
queue's watch. The private aggregations of aggregated queries and subscriptions are
attached and detached here too (:meth:`ViewGraph.aggregation`).
"""

from __future__ import annotations

from typing import Iterator, Mapping

from conveyor import errors, expr, records
from conveyor.config.model import Config, SowTopicConfig, ViewConfig, topic_matcher
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.filters import compile_filter
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.queue.bindings import QueueBindings
from conveyor.engine.sow.aggregation import Aggregation, MemberSink
from conveyor.engine.sow.focus import RecordChange
from conveyor.engine.sow.followers import Followers
from conveyor.config.validation import check_view, rewrite_identifiers
from conveyor.engine.sow.joins import Join
from conveyor.engine.sow.topic import SowTopic
from conveyor.engine.sow.view import QueueWatch, View
from conveyor.expr.projection import Projection
from conveyor.protocol.bookmarks import format_bookmark, publisher_id

VIEWS_CLIENT_NAME = "views"  # the publisher of view records that feed queues (rule 5)


class ViewGraph:
    """Every configured view, the queue watches, and the journaled outputs of the views
    that feed queues (rule 5)."""

    def __init__(self, config: Config, topics: Mapping[str, SowTopic], cache: MessageCache, publishes: PublishLog,
                 bindings: QueueBindings, followers: Followers) -> None:
        self._topics = topics
        self._cache = cache
        self._publishes = publishes
        self._bindings = bindings
        self._followers = followers
        self._publisher = publisher_id(VIEWS_CLIENT_NAME, instance=config.name)
        self.views: dict[str, View] = {}
        self._outputs: dict[str, SowTopic] = {}  # rule 5: what each view feeding a queue has journaled
        self._watches: dict[str, QueueWatch] = {}
        #: Whether a step may have something to render: a view or a queue watch exists
        #: (read by the State of the World to skip an idle flush: one call less a step).
        self.renders = False
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
            try:
                flt = compile_filter(vc.filter)
            except expr.ExpressionError as exc:
                raise errors.ConfigError(f"view {vc.name!r}: invalid Filter: {exc}", path=f"{vc.path}/Filter") from None
        aggregation = Aggregation(projection, flt)
        (source,) = vc.underlying
        self.attach(source, aggregation)
        self._add_view(vc, aggregation)

    def _build_join_view(self, vc: ViewConfig) -> None:
        """A view over left outer joins (engine/sow/joins.py)."""
        check_view(vc)  # every field names a joined topic (config/validation.py)
        join_topics = vc.underlying  # in join order, the driving topic first
        fields = tuple(rewrite_identifiers(f) for f in vc.projection)
        grouping = tuple(rewrite_identifiers(g) for g in vc.grouping)
        projection = _view_projection(vc, fields, grouping)
        aggregation = Aggregation(projection)
        join = Join(vc.joins, aggregation, null_equivalency=vc.join_null_equivalency)
        for topic in join_topics:
            self.attach(topic, join.side(topic))
        self._add_view(vc, aggregation)

    def _add_view(self, vc: ViewConfig, aggregation: Aggregation) -> None:
        feeds_queue = any(topic_matcher(b.config.underlying)(vc.name) for b in self._bindings)
        view = View(vc, aggregation, feeds_queue=feeds_queue)
        view.listeners.append(self._view_changed)
        self.views[vc.name] = view
        self.renders = True
        if feeds_queue:
            self._outputs[vc.name] = SowTopic(SowTopicConfig(name=vc.name, message_type="json"))

    # --- what feeds an aggregation ----------------------------------------------------------------

    def aggregation(self, topic: str, projection: tuple[str, ...] | None, grouping: tuple[str, ...] | None,
                    flt: expr.Expression | None) -> Aggregation:
        """The private aggregation of an aggregated query or subscription over ``topic``
        (reference G.4), not attached yet."""
        if projection is None or grouping is None:
            raise errors.InvalidOption("an aggregated query needs both projection and grouping", option="projection")
        if topic not in self._topics and topic not in self.views and self._bindings.get(topic) is None:
            raise errors.UnknownTopic(f"{topic!r} is not a SOW topic, view or queue: nothing to aggregate")
        try:
            return Aggregation(Projection(projection, grouping), flt)
        except expr.ExpressionError as exc:
            raise errors.InvalidOption(f"invalid projection or grouping: {exc}", option="projection") from None

    def attach(self, source: str, aggregation: MemberSink, now: float | None = None) -> None:
        """Feed ``aggregation`` from ``source`` (a SOW topic, a view or a queue), counting
        what the source holds now (``now``: when a client asks; None: at startup, when
        no view has anything to render yet)."""
        if source in self._topics:
            self._followers.follow_topic(source, aggregation)
            load = self._cache.get
            for key, position in self._topics[source].items():
                entry = load(position)
                aggregation.add(key, position, entry.decoded(),
                                entry.meta(format_bookmark(entry.publisher, entry.seq, position), entry.timestamp))
        elif source in self.views:
            if now is not None:
                self.render(source, now)
            self._followers.follow_view(source, aggregation)
            for key, entry in self.views[source].records.items():
                aggregation.add(key, entry.seq, entry.decoded(), entry.meta(None, entry.timestamp))
        else:
            binding = self._bindings.get(source)
            assert binding is not None, source  # the configuration checked it
            assert isinstance(aggregation, Aggregation), source  # no join over a queue (config/sow.py)
            watch = self._watches.get(source)
            if watch is None:
                watch = self._watches[source] = QueueWatch(binding.queue, self._cache)
                self.renders = True
            watch.attach(aggregation)

    def detach(self, source: str, aggregation: Aggregation) -> None:
        self._followers.unfollow(source, aggregation)
        watch = self._watches.get(source)
        if watch is not None:
            watch.detach(aggregation)

    # --- rendering (rules 2 and 8) ------------------------------------------------------------------

    def flush(self, now: float) -> None:
        """Rule 2: the queue watches count this step's moves, then the views followed
        render what changed, in configuration order."""
        for watch in self._watches.values():
            watch.reconcile()
        for view in self.views.values():
            if self._followed(view):
                view.flush(now)

    def _followed(self, view: View) -> bool:
        """Rule 8: whether anything takes the view's changes as they happen."""
        return view.feeds_queue or self._followers.view_followed(view.name)

    def records(self, name: str, now: float) -> dict[int, Entry]:
        """The current records of view ``name`` (view key -> record), rendered now."""
        self.render(name, now)
        return self.views[name].records

    def render(self, name: str, now: float) -> None:
        """Rule 8: bring a view nobody follows up to date before its records are read
        (``name``: a view or not)."""
        view = self.views.get(name)
        if view is not None:
            view.flush(now)

    def _view_changed(self, changes: list[RecordChange], now: float) -> None:
        """A view's records changed (view.py rule 3): its followers, and the queue it
        feeds (rule 5)."""
        name = changes[0].topic
        self._followers.views_changed(name, changes, now)
        if self._followers.recovering:
            return
        if self.views[name].feeds_queue:
            for change in changes:
                if change.new is not None:
                    self._publish_view_record(name, change.key_text, change.new.data, now)

    def _publish_view_record(self, view: str, sow_key: str, data: bytes, now: float) -> None:
        publishes = self._publishes
        seq = publishes.next_seq(self._publisher)
        publishes.append_record(records.PublishRec(view, self._publisher, seq, now, data, None, sow_key=sow_key))

    # --- the outputs of the views that feed queues (rules 5 and 6) ----------------------------------

    def output_applied(self, topic: str, position: int, sow_key: str) -> bool:
        """A durable (or replayed) record of view ``topic`` feeding a queue: noted as
        journaled. False: ``topic`` is no such view."""
        out = self._outputs.get(topic)
        if out is None:
            return False
        out.apply(position, sow_key, 0.0)
        return True

    def outputs(self) -> Iterator[tuple[str, SowTopic]]:
        """(name in the checkpoint's floors, what it journaled) of each view feeding a queue."""
        return ((f"view:{n}", o) for n, o in self._outputs.items())

    def end_recovery(self, now: float) -> None:
        """Rule 6, after the replay: the views over queues are filled, every view rendered."""
        for watch in self._watches.values():
            watch.touched.clear()
            for agg in watch.aggregations:
                watch.fill(agg)
        for view in self.views.values():
            view.flush(now)

    def catch_up(self, now: float) -> None:
        """Rule 5 after a restart: a record whose last state never made it to the journal
        is published again."""
        for name, out in self._outputs.items():
            load = self._load_data
            for key, entry in self.views[name].records.items():
                text = str(key)
                journaled = out.records.get(text)
                if journaled is None or load(journaled) != entry.data:
                    self._publish_view_record(name, text, entry.data, now)

    def _load_data(self, position: int) -> bytes:
        return self._cache.get(position).data


def _view_projection(vc: ViewConfig, fields: tuple[str, ...], grouping: tuple[str, ...]) -> Projection:
    try:
        return Projection(fields, grouping)
    except expr.ExpressionError as exc:
        raise errors.ConfigError(f"view {vc.name!r}: invalid projection or grouping: {exc}",
                                 path=f"{vc.path}/Projection") from None
