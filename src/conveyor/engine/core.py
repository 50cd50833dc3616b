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
from typing import Any, Iterable

from conveyor import errors
from conveyor.config.model import Config, topic_matcher
from conveyor import records
from conveyor.engine.bookmarks import (
    format_bookmark,
    publisher_id,
)
from conveyor.engine.actions import ACTION_CLIENT_NAME, ExpiryActions
from conveyor.engine.cache import CACHE_BYTES_MAX_DEFAULT, Entry, MessageCache
from conveyor.engine.sessions import Session, Subscription
from conveyor.protocol import messages as m
from conveyor.protocol.messages import ack_types
from conveyor.protocol.options import parse_options
from conveyor.engine.filters import compile_filter as _compile_filter
from conveyor.engine.queueing import Queueing
from conveyor.engine.recovery import Checkpoint, Recovery
from conveyor.engine.subscribing import REPLAY_RECORDS_PER_PUMP, Subscribing
from conveyor.engine.consumers import NamedConsuming
from conveyor.engine.fingerprints import FingerprintWindow
from conveyor.engine.txn import Staging, Transactions

__all__ = ["Checkpoint", "Engine", "REPLAY_RECORDS_PER_PUMP", "VERSION"]

log = logging.getLogger("conveyor.engine")


VERSION = "conveyor-0.1"
_NO_ACKS: frozenset[str] = frozenset()
_PUBLISH_ACKS = frozenset({"processed", "persisted"})
_encode_publish = records.encode_publish
class Engine(Subscribing, Queueing, Recovery, NamedConsuming, Transactions):
    """The broker. Its parts live in mixins: subscribing.py, queueing.py, recovery.py,
    consumers.py (named consumers) and txn.py (staged transactions)."""

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
        self._named: dict = {}  # (queue, name) -> consumers.NamedConsumer
        self._staging = Staging()
        self._fingerprints = FingerprintWindow()
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

    @property
    def replays_pending(self) -> bool:
        """Whether bookmark replays still have journal records to send
        (:meth:`pump_replays` has work)."""
        return bool(self._replaying)

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
            case m.Claim() | m.Lease() | m.Fetch() | m.AckThrough() | m.Extend() | m.Reclaim() | m.Head() | m.ConsumerInfo():
                self._named_command(session, cmd, now)
            case m.Stage() | m.CommitTxn() | m.AbortTxn():
                self._txn_command(session, cmd, now)
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
        fingerprint = cmd.fingerprint
        if fingerprint is None:
            pos = journal.append(_encode_publish(topic, publisher, seq, now, data, corr))
        else:
            pos = journal.append(self._fingerprinted(topic, publisher, seq, now, data, corr, fingerprint))
        self._pending.append((pos, journal.end, topic, publisher, seq, now, data, corr))
        if acks:
            if "persisted" in acks:
                # One mark per frame (handle() files it): the ack is conflated anyway.
                session.persist_mark = (pos, seq, publisher)
                session.persist_cid = cmd.cid
            if "processed" in acks:
                self._send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, seq=seq))

    def _fingerprinted(self, topic, publisher, seq, now, data, corr, fingerprint: int) -> bytes:
        self._fingerprints.note(publisher, seq, fingerprint)
        return records.encode(records.PublishRec(topic, publisher, seq, now, data, corr, fingerprint=fingerprint))

    def _duplicate(self, session: Session, cmd: m.Publish, acks: frozenset[str]) -> None:
        if cmd.fingerprint is not None:
            recorded = self._fingerprints.get(session.publisher, cmd.seq)
            if recorded is not None and recorded != cmd.fingerprint:
                # Same (publisher, seq), another message: fail loudly, never drop it silently.
                reason = f"duplicate_conflict: sequence {cmd.seq} was published with another fingerprint"
                for kind in acks & {"processed", "persisted"}:
                    ack = m.Ack(ack_type=kind, cid=cmd.cid, status="failure", reason=reason,
                                code=errors.DuplicateConflict.code, seq=cmd.seq)
                    self._send_when_durable(session.conn_id, ack)
                return
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

    # --- time ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Run lease and message expiry due at ``now``, then dispatch."""
        self._now = now
        for queue in self.queues.values():
            deadline = queue.next_deadline()
            if deadline is not None and deadline <= now:
                events = queue.expire(now)
                if self._named:
                    self._count_named_expiries(queue, events)
                self._journal_queue_events(queue, events)
                self._dirty_queues.add(queue)
                if events:
                    # Ended leases free backlog that consumers share across queues.
                    self._dirty_queues.update(self.queues.values())
        self._staging.expire(now)
        self._dispatch(now)

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (q.next_deadline() for q in self.queues.values()) if d is not None]
        return min(deadlines) if deadlines else None
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
            "named_consumers": {f"{c.queue}/{c.name}": c.statistics() for c in self._named.values()},
            "staging": self._staging.statistics(),
        }

    def queue_recovery_points(self) -> dict[str, int]:
        return {name: q.recovery_point() for name, q in self.queues.items()}

