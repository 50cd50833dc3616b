"""The engine: every broker rule, with no I/O and no clock.

The shell (server/) feeds it commands and the passage of time; the engine answers
with messages to send and records appended to the journal. Rules it keeps:

1. **Read-committed.** A publish to a recorded topic is appended to the journal at once
   (so duplicate detection sees it) but reaches subscribers and queues only when
   :meth:`on_durable` reports it fsynced. Recovery replays the same records through the
   same :meth:`_apply_publish`, so live state and recovered state cannot drift.
2. **Send after durable where the spec says so.** Persisted acks, flush acks and
   at-most-once deliveries (whose delivery record must be on disk first) wait in
   ``_deferred`` until ``journal.durable_end`` passes their threshold.
3. **Duplicates are dropped** by publisher id and sequence number (spec 002): a
   sequence ``<=`` the highest seen for that publisher is acknowledged as a duplicate
   and never journaled.
4. **Output is batched**: messages accumulate per connection in ``_out`` and the shell
   takes them with :meth:`take_output`, one frame per connection per turn.

The journal is injected (``append``/``read``/``scan``/``durable_end``/``end``), and
reading it is the only outside access the engine makes.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from conveyor import errors
from conveyor.config.model import Config, QueueConfig, Semantics, is_regex_topic, topic_matcher
from conveyor.engine import records
from conveyor.engine.bookmarks import (
    format_bookmark,
    bookmark_positions,
    parse_replay_start,
    publisher_id,
)
from conveyor.engine.actions import ACTION_CLIENT_NAME, ExpiryActions
from conveyor.engine.cache import CACHE_BYTES_MAX_DEFAULT, Entry, MessageCache
from conveyor.engine.sessions import Session, SubKind, Subscription
from conveyor.protocol import messages as m
from conveyor.protocol.messages import ack_types
from conveyor.protocol.options import parse_options

log = logging.getLogger("conveyor.engine")


@dataclass(frozen=True)
class Checkpoint:
    """What lets recovery skip the part of the journal that no longer matters.

    ``queues`` maps each queue to ``(recovery point, configured RecoveryPoint text)``:
    every message of the queue below the point is done (spec 000, ``queues.ack``).
    ``publishers`` holds the highest sequence per publisher, so duplicate detection
    survives retention removing old segments. Valid only once the journal is durable
    up to ``position`` (the server writes it after that).
    """

    position: int
    queues: dict[str, tuple[int, str]]
    publishers: dict[int, int]

VERSION = "conveyor-0.1"
_NO_ACKS: frozenset[str] = frozenset()
_PUBLISH_ACKS = frozenset({"processed", "persisted"})
_encode_publish = records.encode_publish
REPLAY_RECORDS_PER_PUMP = 2000  # bounded work per turn, so replays never stall live traffic


def _compile_filter(text: str | None):
    if not text:
        return None
    from conveyor.expr import compile as compile_expr  # the expression language

    return compile_expr(text)


class Engine:
    def __init__(self, config: Config, journal: Any, *, cache_bytes_max: int = CACHE_BYTES_MAX_DEFAULT) -> None:
        self.config = config
        self.journal = journal
        self.instance = config.name
        self.tlog = config.transaction_log
        self.sessions: dict[int, Session] = {}
        self._names: dict[str, int] = {}
        self._highest_seq: dict[int, int] = {}
        self._pending: deque = deque()  # (pos, end, topic, publisher, seq, ts, data, corr)
        self._deferred: deque = deque()  # (threshold, conn_id, message)
        self._out: dict[int, list] = {}
        self._close: list[tuple[int, str]] = []
        self.cache = MessageCache(journal.read, bytes_max=cache_bytes_max)
        self.applied_end = getattr(journal, "first_position", 0)
        self._subs_by_topic: dict[str, tuple[Subscription, ...]] = {}
        self._topic_subs: list[Subscription] = []  # PUBSUB and REPLAY subscriptions
        self._replaying: list[Subscription] = []
        self._recorded_cache: dict[str, bool] = {}
        self._queue_route: dict[str, tuple] = {}
        self._publish_target: dict[str, str] = {}
        self._dirty_queues: set = set()
        self.queues: dict[str, Any] = {}
        self._queue_filters: dict[str, Any] = {}
        self._queue_priority: dict[str, Any] = {}  # compiled Priority per queue
        self._queue_barrier: dict[str, Any] = {}  # compiled BarrierExpression per queue
        self._barrier_until: dict[str, int] = {}  # queue -> journal end when its last barrier batch was made
        self._plain_queues: set[str] = set()  # queues with no Filter/Priority/Barrier
        self._actions = ExpiryActions(config.actions)
        self._action_publisher = publisher_id(ACTION_CLIENT_NAME, instance=self.instance)
        self._now = 0.0  # the `now` of the call in progress (for records made deep inside)
        self._build_queues()

    # --- configuration -------------------------------------------------------------

    def _build_queues(self) -> None:
        from conveyor.engine.queue import Queue

        for qc in self.config.queues:
            try:
                self._queue_filters[qc.name] = _compile_filter(qc.filter)
            except errors.BadFilter as exc:
                raise errors.ConfigError(f"invalid Filter: {exc}", path=f"{qc.path}/Filter") from None
            try:
                self._queue_priority[qc.name] = _compile_filter(qc.priority)
            except errors.BadFilter as exc:
                raise errors.ConfigError(f"invalid Priority: {exc}", path=f"{qc.path}/Priority") from None
            try:
                self._queue_barrier[qc.name] = _compile_filter(qc.barrier_expression)
            except errors.BadFilter as exc:
                raise errors.ConfigError(f"invalid BarrierExpression: {exc}", path=f"{qc.path}/BarrierExpression") from None
            self.queues[qc.name] = Queue(qc, load=self._filter_view)
            if not (qc.filter or qc.priority or qc.barrier_expression):
                self._plain_queues.add(qc.name)
            if qc.default_publish_target and qc.default_publish_target != qc.name:
                self._publish_target[qc.name] = qc.default_publish_target

    def _filter_view(self, position: int) -> tuple[Entry, int]:
        """What a queue hands to consumer filters: the message and its position."""
        return self.cache.get(position), position

    def _queue_predicate(self, flt):
        """A queue-side filter: the body plus the message functions' metadata."""
        if flt is None:
            return None
        meta = self._meta

        def predicate(view: tuple[Entry, int]) -> bool:
            entry, position = view
            return flt.matches(entry.decoded(), meta(entry, format_bookmark(entry.publisher, entry.seq, position)))

        return predicate

    def _recorded(self, topic: str) -> bool:
        hit = self._recorded_cache.get(topic)
        if hit is None:
            hit = self.tlog is not None and self.tlog.records(topic)
            self._recorded_cache[topic] = hit
        return hit

    def _queues_for(self, topic: str) -> tuple:
        hit = self._queue_route.get(topic)
        if hit is None:
            hit = tuple(q for q in self.queues.values() if q.config.takes_from(topic))
            self._queue_route[topic] = hit
        return hit

    def _queue_names_matching(self, topic: str) -> list[str]:
        match = topic_matcher(topic)
        return [name for name in self.queues if match(name)]

    # --- connections ---------------------------------------------------------------

    def connect(self, conn_id: int) -> None:
        self.sessions[conn_id] = Session(conn_id)

    def disconnect(self, conn_id: int, now: float) -> None:
        self._now = now
        session = self.sessions.pop(conn_id, None)
        if session is None:
            return
        for sub in list(session.subs.values()):
            self._remove_subscription(sub, now)
        if session.client_name and self._names.get(session.client_name) == conn_id:
            del self._names[session.client_name]
        self._out.pop(conn_id, None)
        self._dispatch(now)

    def take_output(self) -> dict[int, list]:
        out, self._out = self._out, {}
        return out

    def take_closes(self) -> list[tuple[int, str]]:
        closes, self._close = self._close, []
        return closes

    def _send(self, conn_id: int, message) -> None:
        box = self._out.get(conn_id)
        if box is None:
            self._out[conn_id] = [message]
        else:
            box.append(message)

    def _send_when_durable(self, conn_id: int, message, threshold: int | None = None) -> None:
        """Send once every record appended so far (or up to ``threshold``) is on disk."""
        if threshold is None:
            threshold = self.journal.end
        if threshold <= self.journal.durable_end:
            self._send(conn_id, message)
        else:
            self._deferred.append((threshold, conn_id, message))

    # --- commands ------------------------------------------------------------------

    def handle(self, conn_id: int, commands: Iterable, now: float) -> None:
        """Apply a batch of decoded commands (one frame) from one connection."""
        self._now = now
        session = self.sessions[conn_id]
        publish = self._publish
        for cmd in commands:
            try:
                if type(cmd) is m.Publish:  # the hot path first
                    if not session.logged_on:
                        self._implicit_logon(session)
                    publish(session, cmd, now)
                    continue
                if isinstance(cmd, errors.ConveyorError):  # a Rejected entry's error
                    raise cmd
                self._dispatch_command(session, cmd, now)
            except errors.ConveyorError as exc:
                self._fail(conn_id, getattr(cmd, "cid", None), exc)
        if session.persist_mark is not None:
            session.persist_marks.append(session.persist_mark)
            session.persist_mark = None
        self._dispatch(now)

    def reject(self, conn_id: int, error: errors.ConveyorError, cid: str | None = None) -> None:
        """Report a command the codec could not decode."""
        self._fail(conn_id, cid, error)

    def _fail(self, conn_id: int, cid: str | None, exc: errors.ConveyorError) -> None:
        details = {k: v for k, v in exc.details.items() if isinstance(v, (str, int, float, bool))} or None
        self._send(
            conn_id,
            m.Ack(ack_type="processed", cid=cid, status="failure", reason=str(exc), code=exc.code, details=details),
        )

    def _dispatch_command(self, session: Session, cmd, now: float) -> None:
        match cmd:
            case m.Logon():
                self._logon(session, cmd)
            case _ if not session.logged_on:
                self._implicit_logon(session)
                self._dispatch_command(session, cmd, now)
            case m.Subscribe():
                self._subscribe(session, cmd, now)
            case m.SowAndSubscribe():
                self._sow(session, cmd)
                self._subscribe(session, cmd, now)
            case m.Sow():
                self._sow(session, cmd)
            case m.Unsubscribe():
                self._unsubscribe(session, cmd, now)
            case m.SowDelete():
                self._sow_delete(session, cmd, now)
            case m.Flush():
                self._flush(session, cmd)
            case m.Heartbeat():
                parse_options("heartbeat", cmd.options)
                if "processed" in ack_types(cmd.ack_type):
                    self._send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid))
            case _:
                raise errors.UnknownCommand(f"unknown command {type(cmd).__name__}")

    # --- logon (spec 002: client names) ----------------------------------------------

    def _logon(self, session: Session, cmd: m.Logon) -> None:
        if session.logged_on:
            raise errors.AlreadyLoggedOn("logon must be the first command, and only one is allowed")
        name = cmd.client_name or f"anonymous-{session.conn_id}"
        holder = self._names.get(name)
        if holder is not None and holder != session.conn_id:
            other = self.sessions.get(holder)
            if other is not None and other.user_id != cmd.user_id:
                # Same name, different user: a different application. Refuse the new one.
                log.warning("client %r refused: name in use by another user", name)
                self._close.append((session.conn_id, "name in use"))
                raise errors.NameInUse(f"client name {name!r} is in use by another user")
            # Same name, same user: a reconnect. The old connection is out of date.
            log.warning("client %r reconnected: closing its previous connection (name in use)", name)
            self._close.append((holder, "name in use"))
        self._names[name] = session.conn_id
        session.client_name = name
        session.user_id = cmd.user_id
        session.logged_on = True
        session.publisher = publisher_id(name)
        session.server_publisher = publisher_id(name, instance=self.instance)
        if "processed" in ack_types(cmd.ack_type) or cmd.ack_type is None:
            self._send(
                session.conn_id,
                m.Ack(
                    ack_type="processed",
                    cid=cmd.cid,
                    client_name=name,
                    seq=self._highest_seq.get(session.publisher, 0),
                    version=VERSION,
                ),
            )

    def _implicit_logon(self, session: Session) -> None:
        self._logon(session, m.Logon(client_name="", ack_type="none"))

    # --- publish ---------------------------------------------------------------------

    def _publish(self, session: Session, cmd: m.Publish, now: float) -> None:
        # The hot path: a few dict lookups, one encode, one buffered append.
        topic = self._publish_target.get(cmd.topic, cmd.topic)
        ack_type = cmd.ack_type
        acks = ack_types(ack_type) if ack_type else _NO_ACKS
        recorded = self._recorded_cache.get(topic)
        if recorded is None:
            recorded = self._recorded(topic)
        if not recorded:
            entry = Entry(topic, cmd.data, now, session.server_publisher, 0, cmd.correlation_id)
            self._fan_out(None, entry, None)
            for kind in acks & _PUBLISH_ACKS:
                self._send(session.conn_id, m.Ack(ack_type=kind, cid=cmd.cid, seq=cmd.seq))
            return
        highest = self._highest_seq
        seq = cmd.seq
        if seq is not None:
            publisher = session.publisher
            if seq <= highest.get(publisher, 0):
                self._duplicate(session, cmd, acks)
                return
        else:
            publisher = session.server_publisher
            seq = highest.get(publisher, 0) + 1
        highest[publisher] = seq
        data = cmd.data
        corr = cmd.correlation_id
        journal = self.journal
        pos = journal.append(_encode_publish(topic, publisher, seq, now, data, corr))
        self._pending.append((pos, journal.end, topic, publisher, seq, now, data, corr))
        if acks:
            if "persisted" in acks:
                # One mark per frame (handle() files it): the ack is conflated anyway.
                session.persist_mark = (pos, seq, publisher)
                session.persist_cid = cmd.cid
            if "processed" in acks:
                self._send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, seq=seq))

    def _duplicate(self, session: Session, cmd: m.Publish, acks: frozenset[str]) -> None:
        reason = f"duplicate: sequence {cmd.seq} is not above {self._highest_seq.get(session.publisher, 0)}"
        for kind in acks & {"processed", "persisted"}:
            ack = m.Ack(ack_type=kind, cid=cmd.cid, status="duplicate", reason=reason, seq=cmd.seq)
            # A duplicate is already on disk, or will be with the batch it duplicates.
            self._send_when_durable(session.conn_id, ack)

    # --- durability ------------------------------------------------------------------

    def on_durable(self, now: float) -> None:
        """The journal is fsynced up to ``journal.durable_end``: release what waited for it."""
        self._now = now
        end = self.journal.durable_end
        pending = self._pending
        while pending and pending[0][0] < end:
            pos, rec_end, topic, publisher, seq, ts, data, corr = pending.popleft()
            self._apply_publish(pos, rec_end, topic, publisher, seq, ts, data, corr)
        deferred = self._deferred
        while deferred and deferred[0][0] <= end:
            _, conn_id, message = deferred.popleft()
            if conn_id in self.sessions:
                self._send(conn_id, message)
        for session in self.sessions.values():
            marks = session.persist_marks
            if marks and marks[0][0] < end:
                last = None
                while marks and marks[0][0] < end:
                    last = marks.popleft()
                # Conflated (reference B.3): one ack for the highest persisted sequence.
                self._send(
                    session.conn_id,
                    m.Ack(
                        ack_type="persisted",
                        cid=session.persist_cid,
                        seq=last[1],
                        bookmark=format_bookmark(last[2], last[1], last[0]),
                    ),
                )
        self._dispatch(now)

    def _apply_publish(self, pos, rec_end, topic, publisher, seq, ts, data, corr) -> None:
        self.applied_end = rec_end
        queues = self._queues_for(topic)
        subs = self._subs_by_topic.get(topic)
        if not queues and subs is not None and not subs:
            return  # nobody listens: the journal has it, replays read it from there
        entry = Entry(topic, data, ts, publisher, seq, corr)
        if queues:
            self.cache.put(pos, entry)  # queues deliver from the cache, not the journal
        self._fan_out(pos, entry, None)
        for queue in queues:
            if self._offer(queue, pos, entry):
                self._dirty_queues.add(queue)

    def _takes(self, queue, entry: Entry) -> bool:
        """Whether a message on one of the queue's underlying topics enters it (Filter)."""
        qfilter = self._queue_filters.get(queue.config.name)
        return qfilter is None or qfilter.matches(entry.decoded(), self._meta(entry, None))

    def _offer(self, queue, pos: int, entry: Entry) -> bool:
        """Enqueue a message the queue takes, with its priority and barrier flag; True
        if it entered (possibly inactive, beyond TargetQueueDepth)."""
        if not self._takes(queue, entry):
            return False
        name = queue.config.name
        priority_expr = self._queue_priority.get(name)
        barrier_expr = self._queue_barrier.get(name)
        priority = None
        barrier = False
        if priority_expr is not None or barrier_expr is not None:
            data, meta = entry.decoded(), self._meta(entry, None)
            if barrier_expr is not None:
                barrier = barrier_expr.matches(data, meta)
            if priority_expr is not None and not barrier:
                priority = priority_expr.priority(data, meta)
        queue.enqueue(pos, entry.timestamp, priority, barrier)
        return True

    def _refill(self, queue, upto: int | None = None) -> None:
        """TargetQueueDepth: activate inactive messages, read back from the journal, until
        the active part is full again (spec 000, "Limiting Currently Deliverable
        Messages": inactive messages hold no queue state)."""
        while queue.wants() > 0:
            start = queue.refill_from()
            if start is None:
                return
            activated = False
            for pos, payload in self.journal.scan(start, upto):
                rec = records.decode(payload)
                if type(rec) is not records.PublishRec or not queue.config.takes_from(rec.topic):
                    continue
                entry = Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id)
                if not self._takes(queue, entry):
                    continue
                queue.activate(pos, rec.timestamp)
                activated = True
                if queue.wants() <= 0:
                    return
            if not activated:
                log.error("queue %s: %d inactive messages not found in the journal", queue.config.name, queue.wants())
                return

    def _fan_out(self, pos: int | None, entry: Entry, bookmark: str | None) -> None:
        subs = self._subs_by_topic.get(entry.topic)
        if subs is None:
            subs = tuple(s for s in self._topic_subs if s.matches_topic(entry.topic))
            self._subs_by_topic[entry.topic] = subs
        if not subs:
            return
        if pos is not None and bookmark is None:
            bookmark = format_bookmark(entry.publisher, entry.seq, pos)
        for sub in subs:
            if not sub.live:
                continue  # a replay not yet caught up reads this record from the journal
            self._deliver_topic_message(sub, entry, bookmark)

    def _deliver_topic_message(self, sub: Subscription, entry: Entry, bookmark: str | None) -> None:
        if sub.filter is not None and not sub.filter.matches(entry.decoded(), self._meta(entry, bookmark)):
            return
        self._send(
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

    @staticmethod
    def _meta(entry: Entry, bookmark: str | None) -> dict:
        return {
            "topic": entry.topic,
            "bookmark": bookmark,
            "sequence": entry.seq,
            "timestamp": entry.timestamp,
            "correlation_id": entry.correlation_id,
            "length": len(entry.data),
        }

    # --- subscriptions -------------------------------------------------------------------

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

    # --- queues ------------------------------------------------------------------------

    def _dispatch(self, now: float) -> None:
        if not self._dirty_queues:
            return
        dirty, self._dirty_queues = self._dirty_queues, set()
        for queue in dirty:
            deadline = queue.next_deadline()
            if deadline is not None and deadline <= now:
                # dispatch assumes expiry already ran at this `now` (a lagging timer
                # must not let an expired message out).
                self._journal_queue_events(queue, queue.expire(now))
            self._refill(queue)
            deliveries = queue.dispatch(now)
            while deliveries:
                self._deliver_queue_messages(queue, deliveries, now)
                if queue.wants() <= 0:
                    break
                # delivered messages left the active window (at-most-once): refill it
                self._refill(queue)
                deliveries = queue.dispatch(now)

    def _deliver_queue_messages(self, queue, deliveries, now: float) -> None:
        name = queue.config.name
        at_most_once = queue.config.semantics is Semantics.AT_MOST_ONCE
        if any(d.barrier for d in deliveries):
            self._deliver_with_barriers(queue, deliveries)
            return
        out = [self._queue_message(name, d, d.consumer, at_most_once) for d in deliveries]
        positions = [d.position for d in deliveries]
        if at_most_once:
            # The delivery is journaled before the message is sent (spec 000, issue 4.7).
            self.journal.append(records.encode(records.DeliveredRec(name, positions)))
            threshold = self.journal.end
            for conn_id, msg in out:
                self._send_when_durable(conn_id, msg, threshold)
        else:
            self.journal.append(records.encode(records.LeasedRec(name, positions, [d.delivery_count for d in deliveries])))
            if self._barrier_until.get(name, 0) > self.journal.durable_end:
                # a barrier of this queue is still waiting for its fsync: do not overtake it
                for conn_id, msg in out:
                    self._send_when_durable(conn_id, msg)
                return
            for conn_id, msg in out:
                self._send(conn_id, msg)

    def _queue_message(self, name: str, d, consumer, at_most_once: bool) -> tuple[int, m.Message]:
        conn_id, sub_id = consumer.key
        entry = self.cache.get(d.position)
        msg = m.Message(
            topic=name,
            data=entry.data,
            sub_id=sub_id,
            bookmark=format_bookmark(entry.publisher, entry.seq, d.position),
            seq=entry.seq,
            timestamp=entry.timestamp,
            lease_deadline=None if at_most_once or d.barrier else d.lease_deadline,
            correlation_id=entry.correlation_id,
            queue=None if d.barrier else name,  # a barrier needs no acknowledgement
            barrier=d.barrier,
        )
        return conn_id, msg

    def _deliver_with_barriers(self, queue, deliveries) -> None:
        """A batch holding barrier messages: each barrier goes to all its recipients once
        its record is durable, and nothing after it may overtake it, so every message of
        the batch is journaled in order and sent once durable (spec 000, "Synchronizing
        Work with Barrier Messages")."""
        name = queue.config.name
        at_most_once = queue.config.semantics is Semantics.AT_MOST_ONCE
        for d in deliveries:
            if d.barrier:
                self.journal.append(records.encode(records.BarrierRec(name, [d.position])))
                sends = [self._queue_message(name, d, c, at_most_once) for c in d.recipients]
            elif at_most_once:
                self.journal.append(records.encode(records.DeliveredRec(name, [d.position])))
                sends = [self._queue_message(name, d, d.consumer, at_most_once)]
            else:
                self.journal.append(records.encode(records.LeasedRec(name, [d.position], [d.delivery_count])))
                sends = [self._queue_message(name, d, d.consumer, at_most_once)]
            threshold = self.journal.end
            for conn_id, msg in sends:
                self._send_when_durable(conn_id, msg, threshold)
        self._barrier_until[name] = self.journal.end

    def _journal_queue_events(self, queue, events) -> None:
        """Turn the queue's events into journal records (batched by kind)."""
        if not events:
            return
        from conveyor.engine import queue as q

        name = queue.config.name
        acked, cancelled, returned = [], [], []
        for ev in events:
            match ev:
                case q.Acknowledged():
                    acked.append(ev.position)
                case q.Cancelled():
                    cancelled.append(ev.position)
                case q.Returned() | q.LeaseExpired():
                    returned.append(ev.position)
                case q.Expired():
                    self._expire(queue, ev)
                case _:
                    pass
        if acked:
            self.journal.append(records.encode(records.AckedRec(name, acked)))
        if cancelled:
            self.journal.append(records.encode(records.CancelledRec(name, cancelled)))
        if returned:
            self.journal.append(records.encode(records.ReturnedRec(name, returned)))

    def _expire(self, queue, event) -> None:
        """Journal an expiry, with the dead letters its actions publish (spec 000,
        "Handling Unprocessed Messages"; reference.md C)."""
        name = queue.config.name
        reasons = tuple(str(r) for r in event.reasons)
        letters = []
        if self._actions.watches(name):
            entry = self.cache.get(event.position)
            letters = self._actions.dead_letters(
                name, reasons, entry.data, correlation_id=entry.correlation_id,
                bookmark=format_bookmark(entry.publisher, entry.seq, event.position),
            )
        if not letters:
            self.journal.append(records.encode(records.ExpiredRec(name, event.position, ",".join(reasons))))
            return
        publisher = self._action_publisher
        now = self._now
        for i, letter in enumerate(letters):
            seq = self._highest_seq.get(publisher, 0) + 1
            self._highest_seq[publisher] = seq
            first = i == 0  # the first dead letter carries the expiry itself
            rec = records.PublishRec(
                letter.topic, publisher, seq, now, letter.data, None,
                expired_queue=name if first else None,
                expired_position=event.position if first else -1,
                expired_reasons=",".join(reasons) if first else "",
            )
            pos = self.journal.append(records.encode(rec))
            self._pending.append((pos, self.journal.end, letter.topic, publisher, seq, now, letter.data, None))

    def _sow_delete(self, session: Session, cmd: m.SowDelete, now: float) -> None:
        from conveyor.engine.queue import AckOption

        queue = self.queues.get(cmd.topic)
        if queue is None:
            raise errors.UnknownTopic(
                f"sow_delete needs a queue topic; {cmd.topic!r} is not a queue (SOW topics are not supported)"
            )
        opts = parse_options("sow_delete", cmd.options)
        if opts.has("cancel") and opts.has("expire"):
            raise errors.InvalidOption("cancel and expire cannot be combined")
        option = AckOption.CANCEL if opts.has("cancel") else AckOption.EXPIRE if opts.has("expire") else AckOption.NONE
        if cmd.bookmark:
            result = queue.acknowledge(bookmark_positions(cmd.bookmark), by=session.conn_id, option=option, now=now)
        elif cmd.filter:
            flt = _compile_filter(cmd.filter)
            result = queue.acknowledge_matching(self._queue_predicate(flt), by=session.conn_id, option=option, now=now)
        else:
            raise errors.ClientError("sow_delete on a queue needs bookmarks or a filter")
        self._journal_queue_events(queue, result.events)
        self._dirty_queues.add(queue)
        # A bookmark ack names messages: a refusal is an error. A filter ack spares the
        # messages leased to others quietly (Leasing=strict), as a query would.
        refused = result.error() if cmd.bookmark else None
        # One backlog across queues: a freed consumer may now take from its other queues.
        for conn_id, sub_id in result.freed:
            owner = self.sessions.get(conn_id)
            sub = owner.subs.get(sub_id) if owner is not None else None
            if sub is not None:
                self._dirty_queues.update(self.queues[name] for name in sub.queues)
        if refused is not None:
            # Leasing=strict: the rest of the batch took effect; this says what did not.
            refused.details["records_deleted"] = result.deleted
            self._fail(session.conn_id, cmd.cid, refused)
            return
        acks = ack_types(cmd.ack_type)
        for kind in acks & {"processed", "stats"}:
            self._send(session.conn_id, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=result.deleted))
        if "persisted" in acks or "completed" in acks:
            for kind in acks & {"persisted", "completed"}:
                self._send_when_durable(session.conn_id, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=result.deleted))

    def _sow(self, session: Session, cmd) -> None:
        queue = self.queues.get(cmd.topic)
        if queue is None:
            raise errors.UnknownTopic(f"sow needs a queue topic; {cmd.topic!r} is not a queue (SOW topics are not supported)")
        opts = parse_options("sow", getattr(cmd, "options", None)) if isinstance(cmd, m.Sow) else None
        top_n = cmd.top_n if cmd.top_n is not None else (opts.get("top_n") if opts else None)
        skip_n = (opts.get("skip_n") if opts else None) or 0
        flt = _compile_filter(cmd.filter)
        qid = cmd.query_id or cmd.cid
        out = [m.GroupBegin(query_id=qid, cid=cmd.cid)]
        returned = 0
        skipped = 0
        for pos in queue.available():
            if top_n is not None and returned >= top_n:
                break
            entry = self.cache.get(pos)
            bookmark = format_bookmark(entry.publisher, entry.seq, pos)
            if flt is not None and not flt.matches(entry.decoded(), self._meta(entry, bookmark)):
                continue
            if skipped < skip_n:
                skipped += 1
                continue
            out.append(
                m.Message(topic=cmd.topic, data=entry.data, bookmark=bookmark, seq=entry.seq,
                          timestamp=entry.timestamp, query_id=qid, correlation_id=entry.correlation_id)
            )
            returned += 1
        out.append(m.GroupEnd(query_id=qid, cid=cmd.cid))
        for msg in out:
            self._send(session.conn_id, msg)
        acks = ack_types(cmd.ack_type)
        for kind in acks & {"completed", "stats", "processed"}:
            if isinstance(cmd, m.SowAndSubscribe) and kind == "processed":
                continue  # the subscribe part acknowledges
            self._send(session.conn_id, m.Ack(ack_type=kind, cid=cmd.cid, query_id=qid, records_returned=returned))

    def _flush(self, session: Session, cmd: m.Flush) -> None:
        acks = ack_types(cmd.ack_type) or frozenset({"completed"})
        if "processed" in acks:
            self._send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid))
        for kind in acks & {"completed", "persisted"}:
            self._send_when_durable(session.conn_id, m.Ack(ack_type=kind, cid=cmd.cid))

    # --- time ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Run lease and message expiry due at ``now``, then dispatch."""
        self._now = now
        for queue in self.queues.values():
            deadline = queue.next_deadline()
            if deadline is not None and deadline <= now:
                events = queue.expire(now)
                self._journal_queue_events(queue, events)
                self._dirty_queues.add(queue)
                if events:
                    # Ended leases free backlog that consumers share across queues.
                    self._dirty_queues.update(self.queues.values())
        self._dispatch(now)

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (q.next_deadline() for q in self.queues.values()) if d is not None]
        return min(deadlines) if deadlines else None

    # --- recovery ------------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        end = self.journal.end
        queues = {}
        for name, q in self.queues.items():
            point = q.recovery_point()
            if point > q.last_position:
                # Nothing pending: everything up to the end of the log is done. (The
                # scan must start on a record boundary, which the end of the log is.)
                point = self._pending[0][0] if self._pending else end  # not past an unapplied publish
            queues[name] = (point, q.config.recovery_point or "")
        return Checkpoint(position=end, queues=queues, publishers=dict(self._highest_seq))

    def retention_floor(self, checkpoint: Checkpoint) -> int:
        """The lowest position anything still needs: queues, replays, the checkpoint."""
        floor = min([checkpoint.position, *(p for p, _ in checkpoint.queues.values())])
        for sub in self._replaying:
            floor = min(floor, sub.cursor)
        return floor

    def _configured_start(self, queue) -> tuple[int, float | None]:
        """Where a new (or re-pointed) queue starts: its RecoveryPoint, else the beginning."""
        text = queue.config.recovery_point
        if not text:
            return 0, None
        start = parse_replay_start(text)
        if start.after_position is not None:
            return self.journal.position_after(start.after_position), None
        if start.live_only:
            return self.journal.durable_end, None
        if start.at_time is not None:
            return 0, start.at_time
        return 0, None

    def recover(
        self, now: float, progress: Callable[[int], None] | None = None, checkpoint: Checkpoint | None = None
    ) -> int:
        """Rebuild state from the journal: publisher sequences, then every queue.

        Each queue is rebuilt from its recovery point: the one in the checkpoint when
        its configured ``RecoveryPoint`` is unchanged, else the configured one (spec 000,
        "Startup and Recovery for Queues"). The scan starts at the oldest point needed.
        """
        self._now = now
        starts: dict[str, tuple[int, float | None]] = {}
        if checkpoint is not None:
            self._highest_seq.update(checkpoint.publishers)
        for name, queue in self.queues.items():
            saved = checkpoint.queues.get(name) if checkpoint is not None else None
            if saved is not None and saved[1] == (queue.config.recovery_point or ""):
                starts[name] = (saved[0], None)
            else:
                starts[name] = self._configured_start(queue)
        first = getattr(self.journal, "first_position", 0)
        scan_from = min([checkpoint.position if checkpoint is not None else 0, *(p for p, _ in starts.values())])
        scan_from = max(scan_from, first)
        points = {name: p for name, (p, _) in starts.items()}
        times = {name: t for name, (_, t) in starts.items() if t is not None}
        count = 0
        for pos, payload in self.journal.scan(scan_from):
            rec = records.decode(payload)
            count += 1
            if type(rec) is records.PublishRec:
                if rec.seq > self._highest_seq.get(rec.publisher, 0):
                    self._highest_seq[rec.publisher] = rec.seq
                self._apply_recovered_publish(pos, rec, points, times)
                if rec.expired_queue is not None:
                    expired = self.queues.get(rec.expired_queue)
                    if expired is not None and rec.expired_position >= points[rec.expired_queue]:
                        expired.replay_expired(rec.expired_position)
            else:
                queue = self.queues.get(rec.queue)
                if queue is None:
                    continue  # a queue no longer configured
                self._replay_queue_record(queue, rec, now, points[rec.queue])
                if queue.config.target_queue_depth is not None:
                    self._refill(queue, upto=pos)
            if progress is not None and count % 10000 == 0:
                progress(count)
        self.applied_end = self.journal.durable_end
        for queue in self.queues.values():
            # Messages already at MaxCancels / MaxDeliveries expire now, journaled.
            self._journal_queue_events(queue, queue.end_replay(now))
            self._refill(queue)
            self._dirty_queues.add(queue)
        return count

    def _apply_recovered_publish(self, pos: int, rec: records.PublishRec, points: dict, times: dict) -> None:
        for queue in self._queues_for(rec.topic):
            name = queue.config.name
            if pos < points[name]:
                continue
            since = times.get(name)
            if since is not None and rec.timestamp < since:
                continue
            if name in self._plain_queues:
                queue.enqueue(pos, rec.timestamp)  # no filter, priority or barrier: skip the Entry
                continue
            entry = Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id)
            self._offer(queue, pos, entry)

    def _replay_queue_record(self, queue, rec, now: float, point: int = 0) -> None:
        if point:
            rec = _above(rec, point)
            if rec is None:
                return
        match rec:
            case records.LeasedRec():
                for position, count in zip(rec.positions, rec.counts):
                    queue.replay_delivered(position, now, count=count)
            case records.DeliveredRec():
                for position in rec.positions:
                    queue.replay_delivered(position, now)
            case records.AckedRec():
                for position in rec.positions:
                    queue.replay_acknowledged(position)
            case records.CancelledRec():
                for position in rec.positions:
                    queue.replay_cancelled(position)
            case records.ExpiredRec():
                queue.replay_expired(rec.position)
            case records.ReturnedRec():
                for position in rec.positions:
                    queue.replay_returned(position)
            case records.BarrierRec():
                for position in rec.positions:
                    queue.replay_barrier_delivered(position)

    # --- statistics ----------------------------------------------------------------------

    def statistics(self) -> dict:
        return {
            "connections": len(self.sessions),
            "publishers": len(self._highest_seq),
            "journal_end": self.journal.end,
            "journal_durable_end": self.journal.durable_end,
            "pending_publishes": len(self._pending),
            "cache_misses": self.cache.misses,
            "queues": {name: q.statistics() for name, q in self.queues.items()},
        }

    def queue_recovery_points(self) -> dict[str, int]:
        return {name: q.recovery_point() for name, q in self.queues.items()}


def _above(rec, point: int):
    """The part of a queue record about positions at or above ``point`` (or None)."""
    if hasattr(rec, "positions"):
        keep = [i for i, p in enumerate(rec.positions) if p >= point]
        if not keep:
            return None
        if len(keep) == len(rec.positions):
            return rec
        if isinstance(rec, records.LeasedRec):
            return records.LeasedRec(rec.queue, [rec.positions[i] for i in keep], [rec.counts[i] for i in keep])
        return type(rec)(rec.queue, [rec.positions[i] for i in keep])
    return rec if rec.position >= point else None
