"""Topic subscriptions: live pub/sub fan-out and bookmark replays from the journal.

Rules:

1. **Fan-out** (:meth:`Topics.fan_out`): a message goes to every live subscription whose
   topic matches and whose content filter matches, evaluated with the ``now`` of the
   fan-out. The matching subscriptions per topic are cached and the cache is dropped
   whenever a subscription is added, replaced or removed.
2. **Replays** (bookmark subscriptions, reference B.4): a replay reads the journal from
   its start, a budget of records at a time (:meth:`pump`), so replays never stall live
   traffic. It reads only up to ``applied_end`` (what live delivery has already passed)
   and is not live until it reaches it: then, in the same turn, it switches to live, so
   there is no gap and no duplicate at the seam.
3. A replay holds journal retention back to its cursor (:meth:`replay_floor`).
4. A replay that reaches a damaged record (bit rot found when it is read) cannot go on
   in order: it ends there, with a failure ack naming the segment and offset
   (``journal_corrupt``); what it delivered before stands, and nothing else stops.
"""

from __future__ import annotations

import logging
from typing import Any

from conveyor import errors, records
from conveyor.engine.bookmarks import format_bookmark
from conveyor.engine.cache import Entry
from conveyor.engine.outbox import Outbox
from conveyor.engine.sessions import SessionSubscription
from conveyor.protocol import messages as m

log = logging.getLogger("conveyor.engine")

REPLAY_RECORDS_PER_PUMP = 2000  # bounded work per turn, so replays never stall live traffic


class Topics:
    def __init__(self, journal: Any, outbox: Outbox) -> None:
        self._journal = journal
        self._outbox = outbox
        self._subs: list[SessionSubscription] = []  # pub/sub and replay subscriptions
        self._by_topic: dict[str, tuple[SessionSubscription, ...]] = {}
        self._replaying: list[SessionSubscription] = []

    def add(self, sub: SessionSubscription) -> None:
        self._subs.append(sub)
        if not sub.live:
            self._replaying.append(sub)
        self._by_topic.clear()

    def remove(self, sub: SessionSubscription) -> None:
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
            subs = tuple(s for s in self._subs if s.matches_topic(topic))
            self._by_topic[topic] = subs
        return subs

    # --- live (rule 1) -----------------------------------------------------------------

    def fan_out(self, position: int | None, entry: Entry, now: float) -> None:
        subs = self.listeners(entry.topic)
        if not subs:
            return
        bookmark = None if position is None else format_bookmark(entry.publisher, entry.seq, position)
        for sub in subs:
            if sub.live:  # a replay not yet caught up reads this record from the journal
                self.deliver(sub, entry, bookmark, now)

    def deliver(self, sub: SessionSubscription, entry: Entry, bookmark: str | None, now: float) -> None:
        if sub.filter is not None and not sub.filter.matches(entry.decoded(), entry.meta(bookmark, now)):
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

    def pump(self, now: float, applied_end: int, budget: int = REPLAY_RECORDS_PER_PUMP) -> bool:
        """Advance every replay by up to ``budget`` records; True while work remains."""
        journal = self._journal
        for sub in list(self._replaying):
            count = 0
            last = None
            try:
                for pos, payload in journal.scan(sub.cursor, applied_end):
                    last = pos
                    count += 1
                    rec = records.decode(payload)
                    if type(rec) is records.PublishRec and sub.matches_topic(rec.topic):
                        if sub.start_time is None or rec.timestamp >= sub.start_time:
                            entry = Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id)
                            self.deliver(sub, entry, format_bookmark(rec.publisher, rec.seq, pos), now)
                    if count >= budget:
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
        return bool(self._replaying)

    def _end_damaged(self, sub: SessionSubscription, exc: errors.JournalCorrupt) -> None:
        log.error("replay %r of client %s ended: %s", sub.sub_id, sub.conn_id, exc)
        self.remove(sub)
        self._outbox.send(
            sub.conn_id,
            m.Ack(ack_type="completed", cid=sub.cid, sub_id=sub.sub_id, status="failure", code=exc.code,
                  reason=f"the replay cannot go on: {exc}"),
        )

    def replay_floor(self) -> int | None:
        """The lowest journal position a running replay still has to read."""
        return min((s.cursor for s in self._replaying), default=None)

    def statistics(self) -> tuple[int, int]:
        """(topic subscriptions, replays running)."""
        return len(self._subs), len(self._replaying)
