"""Queries of a SOW topic's or a view's records, and aggregated queries
(:mod:`conveyor.engine.sow.state` rules 3 and 10): a ``sow``, or the query part of a
``sow_and_subscribe`` / ``sow_and_delta_subscribe``, reads the durable records of the
step of the command; the result is selected and produced as its connection drains it
by :mod:`conveyor.engine.sow.production` (the same machinery answers a queue's ``sow``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import msgspec

from conveyor import errors, expr
from conveyor.engine import poison
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.filters import compile_filter, entitled
from conveyor.engine.outbox import Outbox
from conveyor.engine.sow.conflated import ConflatedTopic
from conveyor.engine.sow.focus import RecordSubscription, record_message
from conveyor.engine.sow.followers import Followers, filter_ticks
from conveyor.engine.sow.production import (OrderBy, Production, Queries, Snapshot, Tally, check_batch_size,
                                            frozen_keyed_positions, frozen_references, query_failed, record_messages,
                                            selection)
from conveyor.engine.sow.topic import SowTopic, key_text
from conveyor.engine.sow.view import View, view_key
from conveyor.engine.sow.views import ViewGraph
from conveyor.protocol import messages as m
from conveyor.protocol.ack_kinds import ack_types
from conveyor.protocol.options import Options, parse_options

#: A SOW query: ``sow``, or the query part of a ``sow_and_subscribe`` / ``sow_and_delta_subscribe``.
SowQuery = m.Sow | m.SowAndSubscribe | m.SowAndDeltaSubscribe

_encode = msgspec.json.Encoder().encode


class SowQueries:
    """Starts the query results of SOW topics, views and aggregations; the engine's
    :class:`~conveyor.engine.sow.production.Queries` produces them."""

    def __init__(self, topics: Mapping[str, SowTopic], graph: ViewGraph, cache: MessageCache, outbox: Outbox,
                 queries: Queries, followers: Followers, conflated: Mapping[str, ConflatedTopic]) -> None:
        self._topics = topics
        self._graph = graph
        self._conflated = conflated
        self._cache = cache
        self._outbox = outbox
        self._queries = queries  # rule 10: results on their way, pumped by the engine
        self._followers = followers

    def query(self, conn_id: int, cmd: SowQuery, now: float, *, sub: RecordSubscription | None = None,
              opts: Options | None = None, entitlement: expr.Expression | None = None) -> None:
        """A ``sow`` (or the query part of a ``sow_and_subscribe``) on a SOW topic or view:
        the records of this step, produced as the connection drains them (rule 10).
        ``entitlement``: the user's entitlement filter on the name (engine/entitlements.py
        rule 6), ANDed with the query's."""
        if opts is None:
            opts = parse_options("sow", cmd.options)
        check_batch_size(cmd.batch_size)
        top_n = cmd.top_n if cmd.top_n is not None else opts.get("top_n")
        skip_n = opts.get("skip_n") or 0
        if skip_n and top_n is None:
            raise errors.InvalidOption("skip_n needs top_n", option="skip_n")
        flt = entitled(compile_filter(cmd.filter), entitlement)
        orderby = OrderBy(cmd.orderby) if cmd.orderby else None
        topic = cmd.topic
        self._graph.render(topic, now)
        source, load = _query_rows(self._topics.get(topic), self._derived(topic), self._cache, cmd.sow_keys)
        matches: Callable[[Any], bool] | None = None
        if flt is not None:
            where = f"a sow query of connection {conn_id}"

            def matches(ref: Any) -> bool:
                return poison.matches(flt, load(ref), None, now, where)

        tally = Tally()
        source, rows = selection(source, matches, orderby=orderby, top_n=top_n, skip_n=skip_n,
                                 data_of=lambda ref: load(ref).decoded(), key_text=key_text,
                                 copy=frozen_keyed_positions if topic in self._topics else frozen_references,
                                 tally=tally)
        cost = filter_ticks(flt) if flt is not None and orderby is None and not skip_n else 0  # paid as it goes
        qid = cmd.query_id or cmd.cid
        messages = record_messages(rows, load, topic=topic, query_id=qid,
                                   key_text=None if sub is not None and sub.no_sowkey else key_text,
                                   seen=sub.seen if sub is not None and sub.oof else None)
        self._produce(conn_id, cmd, qid, source, messages, cost, tally, sub)

    def aggregated_query(self, conn_id: int, cmd: m.Sow, opts: Options, now: float,
                         entitlement: expr.Expression | None = None) -> None:
        """An aggregated ``sow`` (reference G.4): the groups of the source's current
        contents (a queue's available messages), computed once. The aggregation, which
        nothing feeds once detached, is the snapshot: each group's record is rendered
        as it is sent (rule 10)."""
        check_batch_size(cmd.batch_size)
        graph = self._graph
        aggregation = graph.aggregation(cmd.topic, opts.list("projection"), opts.list("grouping"),
                                        entitled(compile_filter(cmd.filter), entitlement))
        graph.attach(cmd.topic, aggregation, now)
        graph.detach(cmd.topic, aggregation)
        domain = f"{cmd.topic}/query"
        rows = ((view_key(domain, g), Entry(cmd.topic, _encode(r), now, 0, 0, None)) for g, r in aggregation.records())
        self.send_rows(conn_id, cmd, Snapshot(rows), opts, None)

    def send_rows(self, conn_id: int, cmd: SowQuery, source: Snapshot[tuple[int, Entry]], opts: Options,
                  sub: RecordSubscription | None) -> None:
        """The result of an aggregated query or subscription: ``source``, the records of
        its groups (rule 10)."""
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

    def _produce(self, conn_id: int, cmd: SowQuery, qid: str | None, source: Snapshot[Any],
                 messages: Iterator[m.Message | None], cost: int, tally: Tally, sub: RecordSubscription | None) -> None:
        """Rule 10: group_begin, the result as the connection drains it, group_end and the
        acks; a subscription's updates are held until then."""
        outbox = self._outbox
        followers = self._followers
        if sub is not None:
            followers.hold(sub)

        def finish(error: errors.JournalError | None) -> None:
            outbox.send(conn_id, m.GroupEnd(query_id=qid, cid=cmd.cid))
            if error is None:
                self._query_acks(conn_id, cmd, qid, tally.returned, tally.matches, tally.examined)
            else:
                outbox.send(conn_id, query_failed(cmd.cid, qid, error))
            if sub is not None:
                followers.release(sub)

        self._queries.start(Production(conn_id, m.GroupBegin(query_id=qid, cid=cmd.cid), messages, finish, source, cost))

    def rescope(self, sub: RecordSubscription, old_filter: expr.Expression | None, now: float) -> None:
        """A ``replace`` with a query (reference G.1.2) gave ``sub`` a new filter: the
        records of this step newly in its scope are sent and, with oof, those that left
        it get an ``oof``. Produced as the connection drains them and frozen like a
        query's rows (rule 10), with the subscription's updates held until the last is
        out; no ``group_begin`` / ``group_end``: the messages are the subscription's."""
        topic, conn_id = sub.topic, sub.conn_id
        self._graph.render(topic, now)
        source, load = _query_rows(self._topics.get(topic), self._derived(topic), self._cache, None)
        where = f"a replace of subscription {sub.sub_id!r} of connection {conn_id}"

        def messages() -> Iterator[m.Message | m.OutOfFocus | None]:
            for key, ref in source:
                entry = load(ref)
                now_in = sub.matches(entry, None, now)
                was_in = key in sub.seen if sub.oof else (
                    old_filter is None or poison.matches(old_filter, entry, None, now, where))
                if now_in and not was_in:
                    if sub.oof:
                        sub.seen.add(key)
                    yield record_message(sub, topic, entry, key_text(key), None)
                elif was_in and not now_in and sub.oof:
                    sub.seen.discard(key)
                    yield m.OutOfFocus(topic=topic, sow_key=key_text(key), reason="match", data=entry.data,
                                       sub_id=sub.sub_id)
                else:
                    yield None  # examined, not sent

        followers = self._followers
        followers.hold(sub)

        def finish(error: errors.JournalError | None) -> None:
            followers.release(sub)  # a damaged record ends it (rule 7): what was sent stands

        cost = filter_ticks(sub.filter) if sub.filter is not None else 0
        if old_filter is not None and not sub.oof:
            cost += filter_ticks(old_filter)
        self._queries.start(Production(conn_id, None, messages(), finish, source, cost))

    def _derived(self, topic: str) -> View | ConflatedTopic | None:
        """The view or conflated topic ``topic`` (None: a SOW topic)."""
        view = self._graph.views.get(topic)
        return view if view is not None else self._conflated.get(topic)

    def _query_acks(self, conn_id: int, cmd: SowQuery, qid: str | None, returned: int, hits: int, examined: int) -> None:
        subscribing = not isinstance(cmd, m.Sow)
        for kind in ack_types(cmd.ack_type) & {"completed", "stats", "processed"}:
            if subscribing and kind == "processed":
                continue  # the subscribe part acknowledges
            self._outbox.send(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, query_id=qid, records_returned=returned,
                                             matches=hits, topic_matches=examined))


def _query_rows(st: SowTopic | None, view: View | ConflatedTopic | None, cache: MessageCache, sow_keys: str | None
                ) -> tuple[Snapshot[tuple[Any, Any]], Callable[[Any], Entry]]:
    """The rows of a query of SOW topic ``st`` or ``view`` (a view or a conflated
    topic; rule 10) and how to read a row's record: a SOW topic's (key, position), read
    through the message cache; a view's (key, record)."""
    if st is not None:
        load = _reader(cache)
        if sow_keys:
            chosen = [(k, st.records[k]) for k in dict.fromkeys(st.parse_keys(sow_keys)) if k is not None and k in st.records]
            return Snapshot(chosen, frozen_keyed_positions), load
        return Snapshot(st.items(), frozen_keyed_positions), load
    assert view is not None  # the caller checked the name
    if sow_keys:
        wanted = view.parse_keys(sow_keys)
        return Snapshot([(k, view.records[k]) for k in dict.fromkeys(wanted) if k in view.records]), _same
    return Snapshot(iter(view.records.items()), frozen_references), _same


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
