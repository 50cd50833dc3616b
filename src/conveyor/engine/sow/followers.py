"""Who follows each SOW topic and view, and how a change of one of its records reaches
them (:mod:`conveyor.engine.sow.state` rules 2, 9 and 10).

A SOW topic, a view or a conflated topic is followed by record subscriptions (records,
deltas, out-of-focus: :mod:`conveyor.engine.sow.focus`), by aggregations (the views and
the aggregated subscriptions over it, wired by :mod:`conveyor.engine.sow.views`) and by
listeners (the conflated topics over it, :mod:`conveyor.engine.sow.conflated`).
:class:`Followers` keeps them, per name, and every record change goes through it. Rules:

1. **A SOW topic's change** goes to the topic's record subscriptions, then is counted
   by the aggregations over the topic (:meth:`Followers.changed`). **A view's changes**
   (one flush of the view, or of a conflated topic) are counted by the aggregations over
   the view, then go to its record subscriptions (:meth:`Followers.views_changed`).
   Then the listeners get each change.
2. **While recovering** changes are only counted: the views are rebuilt, nobody is
   subscribed yet, nothing is sent, listeners get nothing (the conflated topics are
   filled at the end of recovery).
3. **Filter work per turn** (engine/filter_budget.py): a subscription's filter is
   charged to the turn's budget before a change is delivered to it; what the turn
   cannot pay waits, in order, for later turns (:meth:`Followers.continue_delivery`).
4. **Held while its query is on its way**: the updates of a ``sow_and_subscribe`` wait
   from its query's start (:meth:`Followers.hold`) to its ``group_end``
   (:meth:`Followers.release`), then go in order; past ``Limits/OutputBudget``
   (payload and framing) the connection is closed as a slow consumer. The result of a
   ``replace`` with a query holds them the same way; holds nest (a ``replace`` while the
   subscription's first result is still on its way), and the updates go after the last.
5. **Paused** (:meth:`Followers.pause`; engine/subscribing.py rule 9): a paused
   subscription gets no change, held, waiting or new; resumed, it gets the changes
   after that, and nothing is sent again for what changed meanwhile.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Callable

from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.filters import filter_cost_ticks
from conveyor.engine.outbox import Outbox
from conveyor.engine.sow.aggregation import MemberSink
from conveyor.engine.sow.focus import RecordChange, RecordSubscription, deliver
from conveyor.engine.sow.production import QUERY_MESSAGE_OVERHEAD
from conveyor.engine.sow.view import member_of_record

#: What a listener takes: one record change and the time of the step (rule 1).
Listener = Callable[[RecordChange, float], None]

#: A filter's cost, computed once (rule 3; a query's filter is paid with it too).
filter_ticks = lru_cache(maxsize=4096)(filter_cost_ticks)


class _Held:
    """Rule 4: the updates of a subscription waiting for its query's group_end."""

    __slots__ = ("changes", "bytes", "over", "depth")

    def __init__(self) -> None:
        self.depth = 1  # results on their way that hold them
        self.changes: list[tuple[RecordChange, float]] = []
        self.bytes = 0
        self.over = False  # past the bound: the connection is being closed


class Followers:
    """The record subscriptions and aggregations of every SOW topic and view (rules 1-4)."""

    def __init__(self, outbox: Outbox, budget: FilterBudget | None, held_bytes_max: int) -> None:
        self._outbox = outbox
        self._record_subs: dict[str, list[RecordSubscription]] = {}  # SOW topic or view -> subscriptions
        self._topic_aggs: dict[str, list[MemberSink]] = {}  # SOW topic -> aggregations over it
        self._view_aggs: dict[str, list[MemberSink]] = {}  # view -> aggregations over it
        self._listeners: dict[str, list[Listener]] = {}  # SOW topic, view or conflated topic -> listeners
        # Rule 4: the updates of a sow_and_subscribe whose query is on its way, held
        # until its group_end, and what they weigh (bounded by Limits/OutputBudget).
        self._held: dict[RecordSubscription, _Held] = {}
        self._held_bytes_max = held_bytes_max
        # Rule 3: the turn's filter budget, and the deliveries waiting for later turns.
        self._budget = budget
        #: Deliveries waiting for a later turn's filter budget (read by the State of the
        #: World for ``delivery_pending``, a property the engine asks every step).
        self.waiting: deque[tuple[RecordSubscription, RecordChange, float]] = deque()
        self._recovering = False
        self._paused: set[RecordSubscription] = set()  # rule 5

    # --- recovery (rule 2) -----------------------------------------------------------------------

    @property
    def recovering(self) -> bool:
        return self._recovering

    def begin_recovery(self) -> None:
        self._recovering = True

    def end_recovery(self) -> None:
        self._recovering = False

    # --- who follows what -----------------------------------------------------------------------

    def subscribe(self, name: str, sub: RecordSubscription) -> None:
        self._record_subs.setdefault(name, []).append(sub)

    def remove(self, sub: RecordSubscription) -> None:
        """Unsubscribe or the end of a session: nothing more for ``sub``."""
        self._held.pop(sub, None)  # rule 4
        self._paused.discard(sub)  # rule 5
        subs = self._record_subs.get(sub.topic)
        if subs is not None and sub in subs:
            subs.remove(sub)
        if self.waiting:  # rule 3
            self.waiting = deque(w for w in self.waiting if w[0] is not sub)

    def pause(self, sub: RecordSubscription) -> None:
        """Rule 5: nothing for ``sub`` until :meth:`resume` (what waits for it is dropped)."""
        self._paused.add(sub)
        if self.waiting:
            self.waiting = deque(w for w in self.waiting if w[0] is not sub)

    def resume(self, sub: RecordSubscription) -> None:
        self._paused.discard(sub)

    def follow_topic(self, topic: str, aggregation: MemberSink) -> None:
        self._topic_aggs.setdefault(topic, []).append(aggregation)

    def follow_view(self, view: str, aggregation: MemberSink) -> None:
        self._view_aggs.setdefault(view, []).append(aggregation)

    def listen(self, name: str, listener: Listener) -> None:
        """``listener`` gets every change of SOW topic, view or conflated topic ``name``
        after its subscriptions (rules 1 and 2)."""
        self._listeners.setdefault(name, []).append(listener)

    def unfollow(self, source: str, aggregation: MemberSink) -> None:
        for table in (self._topic_aggs, self._view_aggs):
            aggs = table.get(source)
            if aggs is not None and aggregation in aggs:
                aggs.remove(aggregation)

    def topic_followed(self, topic: str) -> bool:
        """Whether anything follows SOW topic ``topic`` (else a record is its position, nothing more)."""
        return (bool(self._record_subs.get(topic)) or bool(self._topic_aggs.get(topic))
                or (not self._recovering and bool(self._listeners.get(topic))))

    def view_followed(self, view: str) -> bool:
        """Whether a subscription, an aggregation or a listener takes the view's changes as they happen."""
        return bool(self._record_subs.get(view)) or bool(self._view_aggs.get(view)) or bool(self._listeners.get(view))

    # --- changes (rules 1 and 2) -----------------------------------------------------------------

    def changed(self, change: RecordChange, now: float) -> None:
        """Rule 1: one record of a SOW topic changed."""
        for sub in self._record_subs.get(change.topic, ()):
            self.send(sub, change, now)
        self.count(change.topic, change, now)
        for listener in self._listeners.get(change.topic, ()):
            listener(change, now)

    def count(self, topic: str, change: RecordChange, now: float) -> None:
        """The aggregations over SOW topic ``topic`` count ``change`` (only that while recovering)."""
        for agg in self._topic_aggs.get(topic, ()):
            member_of_record(agg, change, now)

    def views_changed(self, view: str, changes: list[RecordChange], now: float) -> None:
        """Rule 1: the records of ``view`` changed (one flush of the view or conflated topic)."""
        for agg in self._view_aggs.get(view, ()):
            for change in changes:
                member_of_record(agg, change, now)
        if self._recovering:
            return
        for sub in self._record_subs.get(view, ()):
            for change in changes:
                self.send(sub, change, now)
        for listener in self._listeners.get(view, ()):
            for change in changes:
                listener(change, now)

    # --- delivery within the turn's filter budget (rule 3), held updates (rule 4) ---------------

    def send(self, sub: RecordSubscription, change: RecordChange, now: float) -> None:
        """Deliver now if the turn can pay the subscription's filter and nothing waits
        before it; else after what waits, in a later turn. Held while the subscription's
        query is on its way (rule 4). Nothing while paused (rule 5)."""
        if self._paused and sub in self._paused:
            return
        if self._held:
            held = self._held.get(sub)
            if held is not None:
                self._hold(sub, held, change, now)
                return
        if self.waiting or not self._afford(sub):
            self.waiting.append((sub, change, now))
            return
        deliver(sub, change, now, self._outbox)

    def hold(self, sub: RecordSubscription) -> None:
        """Rule 4: the query of ``sub`` starts; its updates wait for :meth:`release`."""
        held = self._held.get(sub)
        if held is None:
            self._held[sub] = _Held()
        else:
            held.depth += 1

    def _hold(self, sub: RecordSubscription, held: _Held, change: RecordChange, now: float) -> None:
        """Rule 4: keep ``change`` for after the query's group_end, within the bound."""
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

    def release(self, sub: RecordSubscription) -> None:
        """Rule 4: the query's group_end is out: the held updates go, in order (after
        the last of nested holds)."""
        held = self._held.get(sub)
        if held is not None and held.depth > 1:
            held.depth -= 1
            return
        held = self._held.pop(sub, None)
        if held is not None and not held.over:
            for change, now in held.changes:
                self.send(sub, change, now)

    def _afford(self, sub: RecordSubscription) -> bool:
        if self._budget is None or sub.filter is None:
            return True
        # A delta or oof subscription may evaluate its filter on the old record too.
        return self._budget.take(filter_ticks(sub.filter) * (2 if sub.delta or sub.oof else 1))

    def continue_delivery(self) -> None:
        """A new turn: deliver what waits, in order, while the budget lasts."""
        waiting = self.waiting
        while waiting:
            sub, change, now = waiting[0]
            if not self._afford(sub):
                return
            waiting.popleft()
            deliver(sub, change, now, self._outbox)
