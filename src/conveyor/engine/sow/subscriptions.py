"""Record, delta and aggregated subscriptions to SOW topics and views: the subscribe
commands, ``replace``, and the end of a subscription (reference G.1.5, G.4, G.5.2;
:mod:`conveyor.engine.sow.state` rules 2, 8 and 10). What a subscription gets for one
change is :mod:`conveyor.engine.sow.focus`; how the change reaches it, within the
turn's filter budget and held while its query is on its way,
:mod:`conveyor.engine.sow.followers`.

An aggregated subscription (``projection`` + ``grouping``) is a private view over one
source (a SOW topic, a view or a queue) whose group records go to one subscription: its
filter applies to the source's messages, and it is rendered at the end of the engine's
step, after the views (:meth:`SowSubscriptions.flush`).

Entitlement filters (engine/entitlements.py rule 6): a subscription's filter is its own
AND its user's ``Subscribe`` filter on the name; the query part of a ``sow_and_*`` is
filtered by the ``Sow`` one (an aggregated subscription, query included, by the
``Subscribe`` one). A reload resolves it again (:meth:`SowSubscriptions.entitle_again`):
from the next change on, with no ``oof`` for what the change takes out of scope; an
aggregated subscription whose filter changes ends (its aggregation was built with it).
"""

from __future__ import annotations

from typing import Callable, Mapping

import msgspec

from conveyor import errors, expr
from conveyor.config.model import client_topic_matcher
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.entitlements import Permission
from conveyor.engine.filters import check_connection_filters, compile_filter, entitled, own_filter
from conveyor.engine.outbox import Outbox
from conveyor.engine.sessions import Session, SessionSubscription, SubKind
from conveyor.engine.sow.aggregation import Aggregation
from conveyor.engine.sow.conflated import ConflatedTopic
from conveyor.engine.sow.focus import RecordChange, RecordSubscription
from conveyor.engine.sow.followers import Followers
from conveyor.engine.sow.production import Snapshot
from conveyor.engine.sow.queries import SowQueries
from conveyor.engine.sow.topic import SowTopic
from conveyor.engine.sow.view import view_key
from conveyor.engine.sow.views import ViewGraph
from conveyor.expr.projection import NON_DETERMINISTIC
from conveyor.protocol import messages as m
from conveyor.protocol.ack_kinds import ack_types
from conveyor.protocol.options import Options, parse_options

#: A subscription to a SOW topic's or view's records (with a query, or aggregated).
RecordsSubscribe = m.Subscribe | m.DeltaSubscribe | m.SowAndSubscribe | m.SowAndDeltaSubscribe

_encode = msgspec.json.Encoder().encode


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


class SowSubscriptions:
    """The subscribe commands on SOW topics and views, and the aggregated subscriptions."""

    def __init__(self, topics: Mapping[str, SowTopic], graph: ViewGraph, queries: SowQueries, cache: MessageCache,
                 outbox: Outbox, followers: Followers, conflated: Mapping[str, ConflatedTopic]) -> None:
        self._topics = topics
        self._graph = graph
        self._conflated = conflated
        self._queries = queries
        self._cache = cache
        self._outbox = outbox
        self._followers = followers
        #: Read by the State of the World to skip an idle flush (one call less a step).
        self.aggregated: list[AggregatedSubscription] = []

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
        own = compile_filter(cmd.filter)
        check_connection_filters([own_filter(s.filter) for s in session.subs.values()], own)  # filters.py
        if opts.has("oof") and own is not None:
            _deterministic(own)
        flt = entitled(own, session.grants.filter_for(Permission.SUBSCRIBE, cmd.topic))
        query_entitlement = session.grants.filter_for(Permission.SOW, cmd.topic) if query else None
        projection = opts.list("projection")
        grouping = opts.list("grouping")
        aggregated = projection is not None or grouping is not None
        if (not aggregated and cmd.topic not in self._topics and cmd.topic not in self._graph.views
                and cmd.topic not in self._conflated):
            raise errors.UnknownTopic(f"{cmd.topic!r} is not a SOW topic, a view or a conflated topic")
        # An aggregated subscription's filter applies to the source messages (reference
        # G.4), and its records carry no key fields.
        sub = RecordSubscription(
            sub_id, session.conn_id, cmd.topic, filter=None if aggregated else flt, oof=opts.has("oof"),
            delta=is_delta, no_empties=opts.has("no_empties"), no_sowkey=opts.has("no_sowkey"),
            key_paths=() if aggregated else self._key_paths(cmd.topic),
        )
        if aggregated:
            self._subscribe_aggregated(session, cmd, sub, flt, projection, grouping, now, query=query, opts=opts)
        else:
            self._graph.render(cmd.topic, now)  # what changed before it subscribed is not news to it
            if query:
                assert not isinstance(cmd, (m.Subscribe, m.DeltaSubscribe))  # a query is a sow_and_* command
                self._queries.query(session.conn_id, cmd, now, sub=sub, opts=opts, entitlement=query_entitlement)
            self._followers.subscribe(cmd.topic, sub)
        session.subs[sub_id] = SessionSubscription(
            sub_id, session.conn_id, cmd.topic, client_topic_matcher(cmd.topic), SubKind.RECORDS, flt, cmd.cid,
            consumer=sub, paused=opts.has("pause"),
        )
        if opts.has("pause"):  # made paused: the query is answered, no update (subscribing.py rule 9)
            self._followers.pause(sub)
        self._ack_subscribe(session, cmd, sub_id)

    def _ack_subscribe(self, session: Session, cmd: RecordsSubscribe, sub_id: str) -> None:
        acks = ack_types(cmd.ack_type)
        if "processed" in acks or not acks:
            self._outbox.send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, sub_id=sub_id))

    def _key_paths(self, topic: str) -> tuple[tuple[str, ...], ...]:
        if topic in self._topics:
            return self._topics[topic].key_paths
        if topic in self._conflated:
            return self._conflated[topic].key_paths
        return self._graph.views[topic].key_paths

    def _replace(self, session: Session, sub_id: str, cmd: RecordsSubscribe, opts: Options, now: float, *, query: bool) -> None:
        """reference G.1.2: the query runs again; records newly in scope are sent; with
        oof, records that no longer match get an oof."""
        held = session.subs.get(sub_id)
        if held is None or held.kind is not SubKind.RECORDS:
            raise errors.UnknownSubscription(f"no SOW subscription {sub_id!r} to replace")
        sub: RecordSubscription = held.consumer
        if any(a.sub is sub for a in self.aggregated):
            raise errors.InvalidOption("an aggregated subscription cannot be replaced", option="replace")
        if cmd.topic != sub.topic:
            raise errors.InvalidOption("replace cannot change the topic of a SOW subscription", option="replace")
        own = compile_filter(cmd.filter)
        check_connection_filters([own_filter(s.filter) for s in session.subs.values() if s is not held], own)
        if sub.oof and own is not None:
            _deterministic(own)
        old_flt = _refilter(held, entitled(own, session.grants.filter_for(Permission.SUBSCRIBE, cmd.topic)))
        if query:
            self._queries.rescope(sub, old_flt, now)

    def _subscribe_aggregated(self, session: Session, cmd: RecordsSubscribe, sub: RecordSubscription,
                              flt: expr.Expression | None, projection: tuple[str, ...] | None,
                              grouping: tuple[str, ...] | None, now: float, *, query: bool, opts: Options) -> None:
        if not query:
            raise errors.InvalidOption("projection and grouping need sow, sow_and_subscribe or "
                                       "sow_and_delta_subscribe", option="projection")
        assert not isinstance(cmd, (m.Subscribe, m.DeltaSubscribe))  # a query is a sow_and_* command
        if cmd.topic in self._conflated:
            raise not_aggregated(cmd.topic)
        graph = self._graph
        aggregation = graph.aggregation(cmd.topic, projection, grouping, flt)
        agg_sub = AggregatedSubscription(sub, cmd.topic, aggregation)
        graph.attach(cmd.topic, aggregation, now)
        aggregation.take_changes()  # what it holds now is the query's answer
        rows = [(view_key(agg_sub.domain, g), Entry(cmd.topic, _encode(r), now, 0, 0, None))
                for g, r in aggregation.records()]
        agg_sub.sent = dict(rows)
        # The list is the query's snapshot (rule 10): references to the records the
        # subscription remembers in ``sent`` anyway.
        self._queries.send_rows(session.conn_id, cmd, Snapshot(rows), opts, sub)
        self.aggregated.append(agg_sub)

    def entitle_again(self, held: SessionSubscription, entitlement: expr.Expression | None) -> bool:
        """A reload: ``held`` filtered by its user's ``entitlement`` filter from the next
        change on. False: it cannot be (an aggregated subscription): the engine ends it."""
        flt = entitled(own_filter(held.filter), entitlement)
        if flt is held.filter or (flt is not None and held.filter is not None and flt.source == held.filter.source):
            return True  # unchanged (the same text compiles to the same filter)
        if any(a.sub is held.consumer for a in self.aggregated):
            return False
        _refilter(held, flt)
        return True

    def remove(self, sub: SessionSubscription) -> None:
        """Unsubscribe or the end of a session."""
        rs: RecordSubscription = sub.consumer
        self._followers.remove(rs)
        for agg_sub in self.aggregated:
            if agg_sub.sub is rs:
                self.aggregated.remove(agg_sub)
                self._graph.detach(agg_sub.source, agg_sub.aggregation)
                break

    def flush(self, now: float) -> None:
        """Rule 2: the aggregated subscriptions render what changed in this step."""
        send = self._followers.send
        for agg_sub in self.aggregated:
            agg_sub.flush(now, send)


def _refilter(held: SessionSubscription, flt: expr.Expression | None) -> expr.Expression | None:
    """``held`` (and its record subscription) filtered by ``flt`` from the next change on;
    the filter it had."""
    sub: RecordSubscription = held.consumer
    old, sub.filter = sub.filter, flt
    held.filter = flt
    return old


def not_aggregated(topic: str) -> errors.InvalidOption:
    """An aggregated query or subscription over conflated topic ``topic`` (engine/sow/conflated.py rule 4)."""
    return errors.InvalidOption(f"{topic!r} is a conflated topic: aggregated queries and subscriptions over it are "
                                "not supported (aggregate its underlying topic)", option="projection")


def _deterministic(flt: expr.Expression) -> None:
    from conveyor.expr.nodes import Call, walk

    for n in walk(flt.tree):
        if isinstance(n, Call) and n.name in NON_DETERMINISTIC:
            raise errors.BadFilter(f"{n.name}() is not deterministic: not allowed in an oof subscription's filter",
                                   position=n.pos, token=n.name)
