"""Topic subscriptions: live pub/sub fan-out and bookmark replays from the journal.

Rules:

1. **Fan-out** (:meth:`Topics.fan_out`): a message goes to every live subscription whose
   topic matches and whose content filter matches, evaluated with the ``now`` of the
   fan-out. The matching subscriptions per topic are cached (a bounded cache,
   routes.py) and the cache is dropped whenever a subscription is added, replaced or
   removed. **Bounded work per turn:** filters are charged their worst-case cost
   (filters.py) from the turn's budget, which queue dispatch shares
   (engine/filter_budget.py); once a turn has spent ``FILTER_TICKS_PER_TURN``, the rest of the
   fan-out waits for the next turn (:meth:`continue_fanout`, which the shell calls as
   it pumps replays), and later messages queue behind it, so each subscription still
   sees messages in order and a hundred slow filters cannot stall every client.
2. **Replays** (bookmark subscriptions, reference B.4): a replay reads the journal from
   its start, a budget of records and of bytes at a time (:meth:`pump`), so replays
   never stall live traffic, and only for a connection that can take more output: the
   shell passes the connections whose socket is full (``paused``), and their replays
   wait, so a replay that is not read costs a socket buffer, not memory. It reads only up to ``applied_end`` (what live delivery has already passed)
   and is not live until it reaches it: then, in the same turn, it switches to live, so
   there is no gap and no duplicate at the seam.
3. A replay holds journal retention back to its cursor (:meth:`replay_floor`).
4. A replay that reaches a damaged record (bit rot found when it is read) cannot go on
   in order: it ends there, with a failure ack naming the segment and offset
   (``journal_corrupt``); what it delivered before stands, and nothing else stops.
5. **A message that fails is skipped for that subscription only** (engine/poison.py): a
   filter that raises counts as not matching, so a deferred fan-out always moves on and
   a poison message never holds the messages behind it.
6. **Pause and resume** (:meth:`pause`, :meth:`resume`; engine/subscribing.py rule 9).
   A paused subscription is not live: the fan-out gives it nothing. A pub/sub one is
   live-only, so what is published meanwhile is never its. A replay keeps its place:
   paused while catching up, its cursor; paused while live, the first message the
   fan-out passes it by (``CURSOR_AT_NEXT`` until then). Resumed with a place, it
   replays from there up to the live seam (rule 2), nothing skipped and nothing sent
   twice; with none, nothing was missed and it is live again at once. A paused replay
   holds journal retention back to its place (rule 3), and its ``completed`` ack is
   not sent a second time.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Container

from conveyor import errors, records
from conveyor.protocol.bookmarks import format_bookmark
from conveyor.engine import poison
from conveyor.engine.cache import Entry
from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.filters import filter_cost_ticks
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort
from conveyor.engine.routes import RouteCache
from conveyor.engine.sessions import CURSOR_AT_NEXT, SessionSubscription, SubKind
from conveyor.expr import Expression
from conveyor.expr.limits import regex_cost_ticks_max
from conveyor.protocol import messages as m

log = logging.getLogger("conveyor.engine")

#: Worst-case filter work one turn of the loop spends on fan-out: two whole regex budgets
#: (about 0.4 s at the very worst; microseconds for real subjects). At least one filter
#: is evaluated per turn, whatever its cost.
FILTER_TICKS_PER_TURN = 2 * regex_cost_ticks_max

REPLAY_RECORDS_PER_PUMP = 2000  # bounded work per turn, so replays never stall live traffic
#: Payload bytes one replay sends per turn at most: with records of up to 16 MiB, 2,000
#: records could be 32 GB; this keeps one turn's output per replay near a socket buffer.
REPLAY_BYTES_PER_PUMP = 1024 * 1024
#: What a replayed message costs on the wire beyond its topic and payload (header, bookmark,
#: sub id, framing), counted so a turn's output stays within the connection's room.
REPLAY_MESSAGE_OVERHEAD = 128


@dataclass(slots=True)
class _FanOut:
    """One message on its way to the subscriptions that were live when it was applied."""

    entry: Entry
    bookmark: str | None
    subs: tuple[SessionSubscription, ...]
    now: float  # the time of the fan-out: filters see it, however late they run
    index: int = 0  # the next subscription to try
    position: int | None = None  # the message's journal position (None: not journaled)


def _waiting(subs: tuple[SessionSubscription, ...]) -> tuple[SessionSubscription, ...]:
    """The subscriptions a deferred fan-out goes to: the live ones, and the paused
    replays whose place it may be (rule 6)."""
    return tuple(s for s in subs if s.live or s.cursor == CURSOR_AT_NEXT)


@lru_cache(maxsize=4096)
def _filter_ticks(flt: Expression | None) -> int:
    return filter_cost_ticks(flt)


class Topics:
    def __init__(self, journal: JournalPort, outbox: Outbox, budget: FilterBudget | None = None) -> None:
        self._journal = journal
        self._outbox = outbox
        self._subs: list[SessionSubscription] = []  # pub/sub and replay subscriptions
        self._by_topic: RouteCache[tuple[SessionSubscription, ...]] = RouteCache()  # bounded: routes.py
        self._replaying: list[SessionSubscription] = []
        self._active: set[SessionSubscription] = set()
        self._paused: set[SessionSubscription] = set()  # rule 6
        self._fanout: deque[_FanOut] = deque()  # fan-outs a turn's budget cut short, in order
        # The turn's filter budget, shared with queue dispatch (engine/filter_budget.py).
        self._budget = budget if budget is not None else FilterBudget(FILTER_TICKS_PER_TURN)

    def add(self, sub: SessionSubscription) -> None:
        self._subs.append(sub)
        self._active.add(sub)
        if not sub.live:
            self._replaying.append(sub)
        self._by_topic.clear()

    def remove(self, sub: SessionSubscription) -> None:
        self._active.discard(sub)
        self._paused.discard(sub)
        if sub in self._subs:
            self._subs.remove(sub)
        if sub in self._replaying:
            self._replaying.remove(sub)
        self._by_topic.clear()

    def changed(self) -> None:
        """A subscription's topic or filter was replaced: rebuild the routes."""
        self._by_topic.clear()

    def listeners(self, topic: str) -> tuple[SessionSubscription, ...]:
        subs = self._by_topic.get(topic)
        if subs is None:
            subs = self._by_topic.put(topic, tuple(s for s in self._subs if s.matches_topic(topic)))
        return subs

    # --- live (rule 1) -----------------------------------------------------------------

    def new_turn(self) -> None:
        """A turn of the shell's loop begins: the filter budget is whole again."""
        self._budget.new_turn()

    def fan_out(self, position: int | None, entry: Entry, now: float) -> None:
        subs = self.listeners(entry.topic)
        if not subs:
            return
        bookmark = None if position is None else format_bookmark(entry.publisher, entry.seq, position)
        # A replay not yet caught up reads this record from the journal: the live ones
        # only, as they are now (a replay that goes live later has read it).
        # A paused replay whose place is not known yet is kept too: this message is it (rule 6).
        if not self._fanout:
            # The common case, with no allocation: deliver while the budget lasts.
            for i, sub in enumerate(subs):
                if not sub.live:
                    if sub.paused:
                        sub.passed_by(position)  # rule 6: a paused replay's place
                    continue
                if sub.filter is not None and not self._budget.take(_filter_ticks(sub.filter)):
                    self._fanout.append(_FanOut(entry, bookmark, _waiting(subs[i:]), now, position=position))
                    return
                self.deliver(sub, entry, bookmark, now)
            return
        # Behind the fan-outs already waiting: order kept.
        self._fanout.append(_FanOut(entry, bookmark, _waiting(subs), now, position=position))

    @property
    def fanout_pending(self) -> bool:
        return bool(self._fanout)

    def continue_fanout(self) -> bool:
        """Go on with the fan-outs a budget cut short; True while some remain."""
        waiting = self._fanout
        while waiting:
            if not self._run(waiting[0]):
                return True
            waiting.popleft()
        return False

    def _run(self, work: _FanOut) -> bool:
        """Deliver ``work`` to its subscriptions while the turn's budget lasts; True when done."""
        subs = work.subs
        while work.index < len(subs):
            sub = subs[work.index]
            if sub in self._active:  # not unsubscribed meanwhile
                if not sub.live:  # paused meanwhile (rule 6)
                    sub.passed_by(work.position)
                else:
                    if sub.filter is not None and not self._budget.take(_filter_ticks(sub.filter)):
                        return False
                    self.deliver(sub, work.entry, work.bookmark, work.now)
            work.index += 1
        return True

    # --- pause and resume (rule 6) ----------------------------------------------------------

    def pause(self, sub: SessionSubscription) -> None:
        """Deliver nothing more to ``sub`` until :meth:`resume`; a replay keeps its place."""
        if sub in self._paused:
            return
        self._paused.add(sub)
        if sub in self._replaying:
            self._replaying.remove(sub)  # its cursor is its place
        sub.pause()

    def resume(self, sub: SessionSubscription) -> None:
        """Deliver to ``sub`` again: a replay from its place (rule 6)."""
        if sub not in self._paused:
            return
        self._paused.discard(sub)
        if not sub.resume():
            return  # live again: pub/sub is live-only, and a replay no message passed by missed nothing
        # Fan-outs still waiting hold messages at or after its place: the replay reads them.
        for work in self._fanout:
            rest = work.subs[work.index:]
            if sub in rest:
                work.subs = work.subs[:work.index] + tuple(s for s in rest if s is not sub)
        self._replaying.append(sub)

    def deliver(self, sub: SessionSubscription, entry: Entry, bookmark: str | None, now: float) -> None:
        if sub.filter is not None:
            try:
                if not sub.filter.matches(entry.decoded(), entry.meta(bookmark, now)):
                    return
            except Exception as exc:  # noqa: BLE001 - rule 5: this message, this subscription only
                poison.skipped("filter", entry, exc, f"subscription {sub.sub_id!r} of connection {sub.conn_id}")
                return
        self._outbox.send(
            sub.conn_id,
            m.Message(
                topic=entry.topic,
                data=entry.data,
                sub_id=sub.sub_id,
                bookmark=bookmark,
                seq=entry.seq if bookmark else None,
                timestamp=entry.timestamp,
                correlation_id=entry.correlation_id,
            ),
        )

    # --- replays (rules 2 and 3) -------------------------------------------------------------

    @property
    def replays_pending(self) -> bool:
        return bool(self._replaying)

    def pump(
        self, now: float, applied_end: int, budget: int = REPLAY_RECORDS_PER_PUMP, paused: Container[int] = (),
        room: Callable[[int], int] | None = None,
    ) -> bool:
        """Advance every replay whose connection is not in ``paused`` by up to ``budget``
        records and about REPLAY_BYTES_PER_PUMP bytes, or the bytes ``room(conn_id)`` says
        the connection can still take (at least one message); True while one of those
        has work."""
        journal = self._journal
        more = False
        for sub in list(self._replaying):
            if sub.conn_id in paused:
                continue
            count = 0
            sent = 0
            last = None
            limit = budget
            cap = REPLAY_BYTES_PER_PUMP if room is None else min(REPLAY_BYTES_PER_PUMP, room(sub.conn_id))
            cost = _filter_ticks(sub.filter) if sub.filter is not None else 0
            if cost:  # a filtered replay shares the turn's filter budget (rule 1)
                limit = max(1, min(budget, self._budget.left // cost))
                self._budget.left -= limit * cost
            try:
                for pos, payload in journal.scan(sub.cursor, applied_end):
                    last = pos
                    count += 1
                    rec = records.decode(payload)
                    if type(rec) is records.PublishRec and sub.matches_topic(rec.topic):
                        if sub.start_time is None or rec.timestamp >= sub.start_time:
                            entry = Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id)
                            self.deliver(sub, entry, format_bookmark(rec.publisher, rec.seq, pos), now)
                            sent += len(rec.data) + len(rec.topic) + REPLAY_MESSAGE_OVERHEAD
                    if count >= limit or sent >= cap:
                        break
            except errors.JournalCorrupt as exc:
                self._end_damaged(sub, exc)  # rule 4
                continue
            if last is not None:
                sub.cursor = journal.position_after(last)
            if last is None or sub.cursor >= applied_end:
                # Caught up: from here on, fan_out delivers live, in the same turn.
                sub.cursor = applied_end
                sub.live = True
                self._replaying.remove(sub)
                if "completed" in sub.ack_types:
                    self._outbox.send(sub.conn_id, m.Ack(ack_type="completed", cid=sub.cid, sub_id=sub.sub_id))
            else:
                more = True
        return more

    def _end_damaged(self, sub: SessionSubscription, exc: errors.JournalCorrupt) -> None:
        log.error("replay %r of client %s ended: %s", sub.sub_id, sub.conn_id, exc)
        self.remove(sub)
        self._outbox.send(
            sub.conn_id,
            m.Ack(ack_type="completed", cid=sub.cid, sub_id=sub.sub_id, status="failure", code=exc.code,
                  reason=f"the replay cannot go on: {exc}"),
        )

    def replay_connections(self) -> set[int]:
        """The connections with a replay running (the shell shares its output budget)."""
        return {s.conn_id for s in self._replaying}

    def replay_floor(self) -> int | None:
        """The lowest journal position a running or paused replay still has to read."""
        paused = (s.cursor for s in self._paused if s.kind is SubKind.REPLAY and s.cursor != CURSOR_AT_NEXT)
        return min((*(s.cursor for s in self._replaying), *paused), default=None)

    def statistics(self) -> tuple[int, int]:
        """(topic subscriptions, replays running)."""
        return len(self._subs), len(self._replaying)
