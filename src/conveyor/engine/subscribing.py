"""Engine part: subscriptions: pub/sub, queue consumers, bookmark replays, replace,
unsubscribe (spec 000 "Replacing Queue Subscriptions", "Bookmark Subscriptions to
Queues"; reference B.4, B.6). A mixin of :class:`conveyor.engine.core.Engine`: it shares
the engine's state and keeps its rules; it exists so each module stays readable.
"""

from __future__ import annotations

import logging

from conveyor import errors
from conveyor.config.model import topic_matcher
from conveyor import records
from conveyor.engine.bookmarks import format_bookmark, parse_replay_start
from conveyor.engine.cache import Entry
from conveyor.engine.filters import compile_filter as _compile_filter
from conveyor.engine.sessions import Session, SubKind, Subscription
from conveyor.protocol import messages as m
from conveyor.protocol.messages import ack_types
from conveyor.protocol.options import parse_options

log = logging.getLogger("conveyor.engine")

REPLAY_RECORDS_PER_PUMP = 2000  # bounded work per turn, so replays never stall live traffic


class Subscribing:
    def _subscribe(self, session: Session, cmd, now: float) -> None:
        opts = parse_options("sow_and_subscribe" if isinstance(cmd, m.SowAndSubscribe) else "subscribe", cmd.options)
        acks = ack_types(cmd.ack_type)
        sub_id = cmd.sub_id or cmd.cid or session.new_sub_id()
        if opts.has("replace"):
            self._replace(session, sub_id, cmd, opts, now)
        else:
            if sub_id in session.subs:
                raise errors.DuplicateSubscription(f"subscription {sub_id!r} already exists (use the replace option)")
            flt = _compile_filter(cmd.filter)
            bookmark = getattr(cmd, "bookmark", None)
            queue_names = self._queue_names_matching(cmd.topic)
            if bookmark:
                self._subscribe_replay(session, sub_id, cmd, flt, bookmark, queue_names)
            elif queue_names:
                self._subscribe_queue(session, sub_id, cmd, flt, opts.get("max_backlog"), queue_names, now)
            else:
                sub = Subscription(sub_id, session.conn_id, cmd.topic, topic_matcher(cmd.topic), SubKind.PUBSUB, flt, cmd.cid)
                self._add_topic_sub(session, sub)
        if "processed" in acks or not acks:
            self._send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, sub_id=sub_id))

    def _add_topic_sub(self, session: Session, sub: Subscription) -> None:
        session.subs[sub.sub_id] = sub
        self._topic_subs.append(sub)
        self._subs_by_topic.clear()

    def _subscribe_queue(self, session, sub_id, cmd, flt, requested, queue_names, now) -> None:
        from conveyor.engine.queue import Consumer, effective_backlog

        configs = [self.queues[n].config for n in queue_names]
        consumer = Consumer(
            key=(session.conn_id, sub_id),
            owner=session.conn_id,
            filter=self._queue_predicate(flt),
            max_backlog=effective_backlog(requested, configs),
        )
        sub = Subscription(
            sub_id, session.conn_id, cmd.topic, topic_matcher(cmd.topic), SubKind.QUEUE, flt, cmd.cid,
            consumer=consumer, queues=tuple(queue_names),
        )
        session.subs[sub_id] = sub
        for name in queue_names:
            queue = self.queues[name]
            queue.add_consumer(consumer, now)
            self._dirty_queues.add(queue)

    def _subscribe_replay(self, session, sub_id, cmd, flt, bookmark, queue_names) -> None:
        start = parse_replay_start(bookmark)
        # A bookmark subscription to a queue replays its underlying topic with no queue
        # semantics (spec 000, "Bookmark Subscriptions to Queues").
        if queue_names:
            patterns = [self.queues[n].config.underlying for n in queue_names]
            matchers = [topic_matcher(p) for p in patterns]
            matches = lambda t, _ms=matchers: any(mt(t) for mt in _ms)  # noqa: E731
        else:
            matches = topic_matcher(cmd.topic)
        sub = Subscription(sub_id, session.conn_id, cmd.topic, matches, SubKind.REPLAY, flt, cmd.cid)
        if start.live_only:
            sub.live = True
        else:
            sub.live = False
            first = getattr(self.journal, "first_position", 0)
            if start.after_position is not None:
                try:
                    sub.cursor = max(first, self.journal.position_after(start.after_position))
                except errors.ConveyorError:
                    raise errors.BadBookmark(f"bookmark {bookmark!r} names no message in the transaction log") from None
            else:
                sub.cursor = first
                sub.start_time = start.at_time
            self._replaying.append(sub)
        sub.ack_types = ack_types(cmd.ack_type)
        self._add_topic_sub(session, sub)

    def pump_replays(self, now: float, budget: int = REPLAY_RECORDS_PER_PUMP) -> bool:
        """Advance bookmark replays by up to ``budget`` records; True while work remains."""
        if not self._replaying:
            return False
        for sub in list(self._replaying):
            if sub.conn_id not in self.sessions:
                self._replaying.remove(sub)
                continue
            limit = self.applied_end
            count = 0
            last = None
            for pos, payload in self.journal.scan(sub.cursor, limit):
                last = pos
                count += 1
                rec = records.decode(payload)
                if type(rec) is records.PublishRec and sub.matches_topic(rec.topic):
                    if sub.start_time is None or rec.timestamp >= sub.start_time:
                        entry = Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id)
                        self._deliver_topic_message(sub, entry, format_bookmark(rec.publisher, rec.seq, pos))
                if count >= budget:
                    break
            if last is not None:
                sub.cursor = self.journal.position_after(last)
            if last is None or sub.cursor >= self.applied_end:
                # Caught up: from here on, on_durable delivers live, in the same turn.
                sub.cursor = self.applied_end
                sub.live = True
                self._replaying.remove(sub)
                if "completed" in sub.ack_types:
                    self._send(sub.conn_id, m.Ack(ack_type="completed", cid=sub.cid, sub_id=sub.sub_id))
        return bool(self._replaying)

    def _replace(self, session: Session, sub_id: str, cmd, opts, now: float) -> None:
        sub = session.subs.get(sub_id)
        if sub is None:
            raise errors.UnknownSubscription(f"no subscription {sub_id!r} to replace")
        flt = _compile_filter(cmd.filter)
        if sub.kind is SubKind.QUEUE:
            from conveyor.engine.queue import effective_backlog

            queue_names = self._queue_names_matching(cmd.topic)
            if not queue_names:
                raise errors.InvalidOption(f"replace: {cmd.topic!r} matches no queue; unsubscribe instead")
            configs = [self.queues[n].config for n in queue_names]
            backlog = effective_backlog(opts.get("max_backlog"), configs)
            qfilter = self._queue_predicate(flt)
            consumer = sub.consumer
            consumer.filter = qfilter
            consumer.max_backlog = backlog
            known = set(sub.queues) | set(sub.detached)
            # Atomic (spec 000, "Replacing Queue Subscriptions"): leases and the
            # outstanding count stay; queues left behind deliver nothing more but still
            # take the acknowledgements of what they leased.
            for name in sub.queues:
                if name not in queue_names:
                    self.queues[name].detach_consumer(consumer, now)
            for name in queue_names:
                queue = self.queues[name]
                if name in known:
                    queue.replace_consumer(consumer, filter=qfilter, max_backlog=backlog, now=now)
                else:
                    queue.add_consumer(consumer, now)
                self._dirty_queues.add(queue)
            sub.detached = tuple(n for n in known if n not in queue_names)
            sub.queues = tuple(queue_names)
            sub.filter = flt
            sub.topic = cmd.topic
        else:
            sub.filter = flt
            sub.topic = cmd.topic
            if sub.kind is SubKind.PUBSUB:
                sub.matches_topic = topic_matcher(cmd.topic)
            self._subs_by_topic.clear()

    def _unsubscribe(self, session: Session, cmd: m.Unsubscribe, now: float) -> None:
        ids = list(session.subs) if cmd.sub_id == "all" else [s.strip() for s in cmd.sub_id.split(",") if s.strip()]
        for sub_id in ids:
            sub = session.subs.get(sub_id)
            if sub is None:
                raise errors.UnknownSubscription(f"no subscription {sub_id!r}")
            self._remove_subscription(sub, now)
        if "processed" in ack_types(cmd.ack_type):
            self._send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid))

    def _remove_subscription(self, sub: Subscription, now: float) -> None:
        session = self.sessions.get(sub.conn_id)
        if session is not None:
            session.subs.pop(sub.sub_id, None)
        if sub.kind is SubKind.QUEUE:
            for name in (*sub.queues, *sub.detached):
                queue = self.queues[name]
                self._journal_queue_events(queue, queue.remove_consumer(sub.consumer, now))
                self._dirty_queues.add(queue)
        else:
            if sub in self._topic_subs:
                self._topic_subs.remove(sub)
            if sub in self._replaying:
                self._replaying.remove(sub)
            self._subs_by_topic.clear()

