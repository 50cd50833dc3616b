"""Engine part: queues: dispatch and delivery (leases, at-most-once records, barriers),
acknowledgement (sow_delete), the sow view, TargetQueueDepth refill, expiry actions
(spec 000; reference B.5, B.7, C). A mixin of :class:`conveyor.engine.core.Engine`.
"""

from __future__ import annotations

import logging

from conveyor import errors
from conveyor.config.model import Semantics
from conveyor import records
from conveyor.engine.bookmarks import bookmark_positions, format_bookmark
from conveyor.engine.filters import compile_filter as _compile_filter
from conveyor.engine.sessions import Session
from conveyor.protocol import messages as m
from conveyor.protocol.messages import ack_types
from conveyor.protocol.options import parse_options

log = logging.getLogger("conveyor.engine")


class Queueing:
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

