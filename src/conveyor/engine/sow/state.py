"""The State of the World part of the engine: SOW topics, views, their queries and
subscriptions, aggregated subscriptions, and views over queues (reference G;
docs/sow-and-views.md).

:class:`StateOfTheWorld` is owned by the :class:`~conveyor.engine.core.Engine`, which
routes to it the publishes of SOW topics, the durable records, the passage of time and
the commands on SOW topics and views; the commands still enter through the engine's
command dispatch (so its checks apply to them too). It is an orchestrator of parts that
own their state, each given its collaborators in its constructor:

- :class:`~conveyor.engine.sow.followers.Followers` (``followers.py``): who follows
  each SOW topic and view (record subscriptions, aggregations) and how a change
  reaches them (rules 2, 9, 10);
- :class:`~conveyor.engine.sow.topics.SowTopics` (``topics.py``): the SOW topics'
  records, publishes, ``sow_delete``, expiry, recovery, replication (rules 1, 3, 6, 7);
- :class:`~conveyor.engine.sow.views.ViewGraph` (``views.py``): the views, what feeds
  them, their rendering, the records of views that feed queues (rules 2, 4, 5, 8);
- :class:`~conveyor.engine.sow.conflated.ConflatedTopics` (``conflated.py``): the
  conflated topics, flushed once per interval by the engine's timer (rule 11);
- :class:`~conveyor.engine.sow.queries.SowQueries` (``queries.py``): queries and
  aggregated queries (rules 3, 10);
- :class:`~conveyor.engine.sow.subscriptions.SowSubscriptions` (``subscriptions.py``):
  the subscribe commands, ``replace``, aggregated subscriptions.

Rules:

1. **Publish** (:meth:`prepare`): the final message (a delta publish merged into the
   latest state of its record), its SowKey and its expiry stamp are decided before the
   message is journaled; the record changes when the publish is durable
   (:meth:`applied`), in journal order, like every other effect of a publish.
2. **Every change is one** :class:`~conveyor.engine.sow.focus.RecordChange`: record
   subscriptions get it at once (:mod:`conveyor.engine.sow.focus`); views and aggregated
   subscriptions count it and are rendered at the end of the engine's step
   (:meth:`flush`): queue watches first, then views in configuration order, then
   aggregated subscriptions.
3. **Queries are read-committed**: a ``sow`` sees durable records only. A
   ``sow_delete`` selects from the latest state (what is appended included), journals a
   :class:`~conveyor.records.SowDeletedRec`, and takes effect when that is durable.
4. **Queues are never changed here.** A view or an aggregated subscription over a queue
   reads its available messages through a :class:`~conveyor.engine.sow.view.QueueWatch`.
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
7. **Replication** (engine/replication/__init__.py rule 8): a replicated publish changes the
   record of the key *this* instance's ``Key`` computes from the message (live and
   after a restart alike), and keeps the expiry stamped where it was first published.
   A ``sow_delete`` travels by identity: here it removes a key only if its current
   record is the very publish the delete removed there (:meth:`replicated_delete`),
   applied when durable, in journal order like a local delete, so it commutes with a
   later publish of the key on either side.
8. **A view nobody follows is rendered when read.** With no record subscription, no
   view or aggregated subscription over it and no queue fed by it, a view's changed
   groups stay pending (one entry per group) and are rendered when a query or a new
   subscription reads it (``ViewGraph.render``): the incremental counting goes on,
   only the output records wait, so a view over a busy queue costs its drain little
   more than the counting.
9. **Filter work per turn** (engine/filter_budget.py): a record or delta subscription's
   filter is charged to the turn's budget before a change is delivered to it; what the
   turn cannot pay waits, in order, for later turns (the shell pumps it), so a hundred
   slow filters on one SOW topic cannot stall every other client.
10. **A query's result is produced as its connection drains it** (engine/sow/production.py
    rules 4 to 8): the records of the step of the command (a SOW topic's keys and
    positions, references to a view's records) are sent a turn at a time between one
    ``group_begin`` and ``group_end``. The subscription of a ``sow_and_subscribe`` is
    made in the step of the command, and the updates it gets until its query's
    ``group_end`` is sent are held (engine/sow/followers.py rule 4), then delivered in
    order: the client sees the records of that step, then every change after it, as
    when a query ran in one step. Held updates past ``Limits/OutputBudget`` (payload and
    framing) close the connection as a slow consumer.
11. **Conflated topics** (engine/sow/conflated.py) follow a SOW topic, a view or another
    conflated topic through the followers; their changes wait for the end of their
    interval, which :meth:`next_deadline` reports and :meth:`tick` carries out (the
    engine never reads a clock). They are read-only like views (:meth:`read_only`),
    answer queries and record subscriptions like them, and are filled from their
    underlying topics at the end of recovery.
"""

from __future__ import annotations

from typing import Any, Callable

from conveyor import errors, records
from conveyor.config.model import Config
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.queue.bindings import QueueBindings
from conveyor.engine.queue.expiry import earliest
from conveyor.engine.sessions import Session, SessionSubscription
from conveyor.engine.sow.conflated import ConflatedTopic, ConflatedTopics
from conveyor.engine.sow.followers import Followers
from conveyor.engine.sow.production import Queries
from conveyor.engine.sow.queries import SowQueries, SowQuery
from conveyor.engine.sow.subscriptions import RecordsSubscribe, SowSubscriptions, not_aggregated
from conveyor.engine.sow.topic import SowTopic
from conveyor.engine.sow.topics import SowTopics
from conveyor.engine.sow.view import View
from conveyor.engine.sow.views import ViewGraph
from conveyor.expr import Expression
from conveyor.protocol import messages as m
from conveyor.protocol.options import Options


class StateOfTheWorld:
    """The engine's State of the World (see the module header): SOW topics, views,
    their queries and subscriptions, routed to the part that owns each."""

    def __init__(self, config: Config, journal: JournalPort, cache: MessageCache, outbox: Outbox, publishes: PublishLog,
                 bindings: QueueBindings, budget: FilterBudget | None = None, *, queries: Queries) -> None:
        self._followers = Followers(outbox, budget, config.limits.output_budget_bytes)
        self._sow_topics = SowTopics(config.sow_topics, journal, cache, outbox, self._followers)
        self.topics: dict[str, SowTopic] = self._sow_topics.topics
        self._graph = ViewGraph(config, self.topics, cache, publishes, bindings, self._followers)
        self.views: dict[str, View] = self._graph.views
        self._conflated = ConflatedTopics(config.conflated_topics, self.topics, self.views, cache, self._followers)
        self.conflated: dict[str, ConflatedTopic] = self._conflated.topics
        self._queries = SowQueries(self.topics, self._graph, cache, outbox, queries, self._followers, self.conflated)
        self._subscriptions = SowSubscriptions(self.topics, self._graph, self._queries, cache, outbox, self._followers,
                                               self.conflated)

    # --- what is what ---------------------------------------------------------------------------

    def topic(self, name: str) -> SowTopic | None:
        return self.topics.get(name)

    def owns(self, name: str) -> bool:
        """Whether ``name`` is a SOW topic, a view or a conflated topic (queries and record
        subscriptions)."""
        return name in self.topics or name in self.views or name in self.conflated

    def is_view(self, name: str) -> bool:
        """Whether ``name`` is a view or a conflated topic: records computed here, never
        journaled, read-only (:meth:`read_only`)."""
        return name in self.views or name in self.conflated

    def names(self) -> frozenset[str]:
        """Every SOW topic, view and conflated topic (the engine's publish hot path)."""
        return frozenset(self.topics) | frozenset(self.views) | frozenset(self.conflated)

    def read_only(self, name: str, done: str) -> errors.ReadOnlyTopic:
        """The refusal of a publish or ``sow_delete`` (``done``: "published", "deleted") on
        view or conflated topic ``name``."""
        what = "a conflated topic" if name in self.conflated else "a view"
        return errors.ReadOnlyTopic(f"{name!r} is {what}: its records are computed, not {done}")

    # --- publishing (rule 1) ------------------------------------------------------------------------

    def prepare(self, st: SowTopic, cmd: m.Publish | m.DeltaPublish, now: float, *, is_delta: bool
                ) -> tuple[bytes, Any, float, str | None]:
        """(message to journal, key, expiry stamp, correlation id) of a publish to ``st``."""
        return self._sow_topics.prepare(st, cmd, now, is_delta=is_delta)

    def appended(self, st: SowTopic, key: Any, position: int, data: bytes) -> None:
        self._sow_topics.appended(st, key, position, data)

    def applied(self, position: int, topic: str, sow_key: str, expiration: float, now: float,
                entry_of: Callable[[], Entry]) -> None:
        """A durable publish carrying a SowKey: the record changes (rule 1), or a view
        feeding a queue notes what it journaled (rule 5). ``entry_of()`` builds the
        message, only if someone needs it (subscriptions, views)."""
        if not self._graph.output_applied(topic, position, sow_key):
            self._sow_topics.applied(position, topic, sow_key, expiration, now, entry_of)

    # --- durability, time (rules 2, 3 and 6) -----------------------------------------------------

    def durable(self, now: float) -> None:
        """Apply the deletes now durable (after the publishes before them); a record that
        expired before its publish became durable goes at once."""
        self._sow_topics.durable(now)

    def tick(self, now: float) -> None:
        """Expire the records due at ``now``; flush the conflated topics due (rule 11)."""
        self._sow_topics.tick(now)
        self._conflated.tick(now)

    def next_deadline(self) -> float | None:
        return earliest(self._sow_topics.next_deadline(), self._conflated.next_deadline())

    def flush(self, now: float) -> None:
        """Rule 2: render what changed in this step: queue watches first, then views in
        configuration order, then aggregated subscriptions."""
        if self._graph.renders:
            self._graph.flush(now)
        if self._subscriptions.aggregated:
            self._subscriptions.flush(now)

    @property
    def delivery_pending(self) -> bool:
        """Deliveries wait for a later turn's filter budget (:meth:`continue_delivery`)."""
        return bool(self._followers.waiting)

    def continue_delivery(self) -> None:
        """A new turn: deliver what waits, in order, while the budget lasts (rule 9)."""
        self._followers.continue_delivery()

    def view_records(self, name: str, now: float) -> dict[int, Entry]:
        """The current records of view ``name`` (view key -> record), rendered now."""
        return self._graph.records(name, now)

    # --- recovery (rule 6) ------------------------------------------------------------------------

    def begin_recovery(self) -> None:
        self._followers.begin_recovery()

    def recovered(self, position: int, rec: records.PublishRec | records.PlainPublish | records.SowDeletedRec,
                  now: float) -> None:
        """A record replayed by recovery: a publish with a SowKey, or a delete."""
        if (not isinstance(rec, records.SowDeletedRec) and rec.sow_key
                and self._graph.output_applied(rec.topic, position, rec.sow_key)):
            return
        self._sow_topics.recovered(position, rec, now)

    def local_key(self, position: int, topic: str, data: bytes, supplied: str) -> str | None:
        """The SowKey of a journaled message of SOW topic ``topic`` as this instance's
        configuration defines it now; None: it has no usable key (rule 7)."""
        return self._sow_topics.local_key(position, topic, data, supplied)

    def end_recovery(self, now: float) -> None:
        """Rule 6, after the replay."""
        self._sow_topics.tick(now)  # records already past their expiry go (reference G.1.4)
        self._graph.end_recovery(now)
        self._conflated.end_recovery(now)  # rule 11: filled from their underlying topics
        self._followers.end_recovery()
        self._graph.catch_up(now)  # rule 5

    def floors(self, first_unapplied: int) -> dict[str, int]:
        """Per SOW topic (and view output), where recovery must start to rebuild it."""
        out = {}
        for name, st in (*self.topics.items(), *self._graph.outputs()):
            floor = st.floor()
            out[name] = first_unapplied if floor is None else min(floor, first_unapplied)
        return out

    def configured_floors(self) -> list[str]:
        return [*self.topics, *(name for name, _ in self._graph.outputs())]

    # --- replication (rule 7) -----------------------------------------------------------------------

    def identify(self, position: int) -> tuple[int, int] | None:
        """(publisher, seq) of the record at ``position`` (None: its journal record is
        damaged; it cannot be named to another instance)."""
        return self._sow_topics.identify(position)

    def replicated_delete(self, rec: records.SowDeletedRec, now: float) -> bool:
        """A ``sow_delete`` that arrived by replication, journaled here and applied when
        durable. False: its topic is not kept in the SOW here."""
        return self._sow_topics.replicated_delete(rec, now)

    # --- commands (rules 3 and 10) ----------------------------------------------------------------

    def query(self, conn_id: int, cmd: SowQuery, now: float, *, opts: Options | None = None,
              entitlement: Expression | None = None) -> None:
        """A ``sow`` on a SOW topic or view: the records of this step, produced as the
        connection drains them (rule 10); ``entitlement``: the user's entitlement filter
        on the name (engine/entitlements.py rule 6)."""
        self._queries.query(conn_id, cmd, now, opts=opts, entitlement=entitlement)

    def aggregated_query(self, conn_id: int, cmd: m.Sow, opts: Options, now: float,
                         entitlement: Expression | None = None) -> None:
        """An aggregated ``sow`` (reference G.4), on a SOW topic, a view or a queue."""
        if cmd.topic in self.conflated:
            raise not_aggregated(cmd.topic)
        self._queries.aggregated_query(conn_id, cmd, opts, now, entitlement)

    def sow_delete(self, conn_id: int, cmd: m.SowDelete, now: float) -> None:
        self._sow_topics.sow_delete(conn_id, cmd, now)

    def subscribe(self, session: Session, cmd: RecordsSubscribe, now: float, *, query: bool, is_delta: bool) -> None:
        """A record, delta or aggregated subscription, with or without its query."""
        self._subscriptions.subscribe(session, cmd, now, query=query, is_delta=is_delta)

    def entitle_again(self, sub: SessionSubscription, entitlement: Expression | None) -> bool:
        """A reload: ``sub`` filtered by its user's new ``entitlement`` filter; False: it
        cannot be, and ends (sow/subscriptions.py)."""
        return self._subscriptions.entitle_again(sub, entitlement)

    def remove(self, sub: SessionSubscription) -> None:
        """Unsubscribe or the end of a session."""
        self._subscriptions.remove(sub)

    def pause(self, sub: SessionSubscription) -> None:
        """The pause option (engine/subscribing.py rule 9): no change reaches ``sub``."""
        self._followers.pause(sub.consumer)

    def resume(self, sub: SessionSubscription) -> None:
        self._followers.resume(sub.consumer)

    # --- statistics -------------------------------------------------------------------------------

    def statistics(self) -> dict[str, dict[str, int]]:
        out = {name: {"records": len(st), "expiring": len(st.expiry)} for name, st in self.topics.items()}
        for name, view in self.views.items():
            out[name] = {"records": len(view.aggregation), "members": len(view.aggregation.members)}
        out.update(self._conflated.statistics())
        return out
