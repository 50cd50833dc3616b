"""Queue delivery: which queues need a dispatch, deliveries and their records, consumers,
acknowledgement (``sow_delete``), the queue view (``sow``) and expiry actions.

Rules:

1. **Dispatch when something changed.** A queue is marked dirty when a message enters,
   a consumer joins, a backlog slot frees or time passes; :meth:`dispatch` runs expiry due
   at ``now`` first (a lagging timer must not let an expired message out), refills the
   TargetQueueDepth window, then delivers all it can.
2. **Journal before or with the send.** Leases are journaled in one ``LeasedRec`` per
   dispatch and sent at once; an at-most-once delivery is journaled (``DeliveredRec``) and
   sent only once that record is durable; a barrier goes to every recipient once its
   ``BarrierRec`` is durable, and nothing after it overtakes it.
3. **One backlog across queues.** A queue subscription may take from several queues;
   its backlog is shared, so a slot freed in one queue marks all of the consumer's queues
   dirty. The delivery owns which queues each consumer is attached to (and which a
   ``replace`` detached, still holding its leases).
4. **Events become records through one table** (:mod:`conveyor.engine.queue.journal`);
   an expiry is journaled with the dead letters its actions publish, in one record.
5. **A damaged record fails its own delivery only.** A message whose journal record no
   longer checks out (bit rot found when its body is read back) is journaled like the
   rest of its batch (the queue already decided the delivery) but not sent, and logged
   with the segment and offset. At-least-once: its lease runs out and it is offered
   again (``MaxDeliveries``, if set, expires it in the end); at-most-once: it counts as
   delivered, as a message lost in flight would. A TargetQueueDepth refill that meets
   one stops for that queue until a restart. The other deliveries, consumers and
   queues go on.
6. **Acknowledgements of one frame, one record per queue.** Consecutive ``sow_delete``
   commands of one frame on the same queue with the same option are applied to the
   queue one by one (each gets its own count, its own refusal) but journaled together
   (:meth:`flush_acks`: one record per event kind, the same records one command with
   all their bookmarks would write), and their persisted acks are filed only then, so
   each still waits for the record that holds it to be fsynced. The engine flushes
   before any other command of the frame, before reporting a failure, and at the end
   of the frame, so records keep the order of the commands and nothing is dispatched
   from a state whose records are not appended. One queue and one option per batch: a
   message is then named by at most one event of the batch (an acknowledged or
   cancelled message is not leased any more when a later command of the batch names it).
   An acknowledgement that names a superseded delivery of its message (``deliveries``)
   is refused before the queue sees it (rule 8), and so is a touch.
7. **The queue view is a snapshot produced as it is read** (engine/sow_query.py rules 4
   to 8): a ``sow`` lists the positions available in the step of its command, in
   delivery order; their messages (a position's message never changes) are read and
   sent a turn at a time as the connection drains them, so leases, acknowledgements
   and publishes meanwhile change nothing in the result.
8. **Stale acknowledgements are refused and reported** (docs/queues.md, "Stale
   acknowledgements"). A queue delivery carries its delivery count (``dn``) under
   ``Leasing=strict`` and to a subscription made with ``fenced_acks``; an ack may name
   it per bookmark (``deliveries=[n,...]``, 0: none). One that names a delivery of
   which a later one was made, or of a replicated queue's message that another
   instance owns now (queue/leases.py rule 7), is refused for that message, as a
   ``Leasing=strict`` refusal is: the rest of the command takes effect and the
   failure (``not_lease_holder``) lists the refused bookmarks (``refused``) and the
   stale ones among them (``stale``). A touch is fenced the same way: a stale
   delivery's lease is not renewed, the others are, and the stale ones are reported.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Final, Hashable, Iterator

from conveyor import errors, records
from conveyor.config.model import Leasing, Semantics
from conveyor.engine import poison
from conveyor.engine.queue import journal as queue_journal
from conveyor.engine.actions import ExpiryActions, Failure
from conveyor.engine.explain import consumer_label
from conveyor.protocol.bookmarks import bookmark_position, bookmark_positions, format_bookmark
from conveyor.engine.cache import MessageCache
from conveyor.engine.filters import compile_filter, entitled, filter_cost_ticks
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.queue.expiry import earliest
from conveyor.engine.queue.queue import AckOption, Consumer, Delivery, Event
from conveyor.engine.queue.bindings import QueueBinding, QueueBindings, consumer_predicate
from conveyor.engine.queue.events import Acknowledged, AckResult, Expired
from conveyor.engine.sow.production import Production, Queries, Snapshot, frozen_positions, query_failed
from conveyor.expr import Expression
from conveyor.protocol import messages as m
from conveyor.protocol.ack_kinds import ack_types
from conveyor.protocol.options import PARSED_MAX, PARSED_TEXT_MAX, Options, parse_options

log = logging.getLogger("conveyor.engine")

_MESSAGE: Final = m.Message  # read as a C variable when compiled; ``m.Message`` is a dict lookup
# Read once: an Enum member read from its class costs compiled code a descriptor call.
_AT_MOST_ONCE: Final = Semantics.AT_MOST_ONCE
_STRICT: Final = Leasing.STRICT


class _Attachment:
    """Rule 3: the queues one consumer takes from, and those a replace left."""

    __slots__ = ("consumer", "queues", "detached")

    def __init__(self, consumer: Consumer, queues: tuple[str, ...]) -> None:
        self.consumer = consumer
        self.queues = queues
        self.detached: tuple[str, ...] = ()


class QueueDelivery:
    def __init__(
        self, bindings: QueueBindings, journal: JournalPort, cache: MessageCache, outbox: Outbox,
        publishes: PublishLog, actions: ExpiryActions, action_publisher: int,
        entitled: Callable[[int, str], bool] | None = None, *, queries: Queries,
        client_of: Callable[[int], str | None] | None = None,
    ) -> None:
        self._bindings = bindings
        self._queries = queries  # rule 7: results on their way, pumped by the engine
        self._journal = journal
        self._cache = cache
        self._outbox = outbox
        self._publishes = publishes
        self._actions = actions
        self._action_publisher = action_publisher
        self._dirty: set[QueueBinding] = set()
        self._attached: dict[Hashable, _Attachment] = {}
        self._fenced: set[Hashable] = set()  # rule 8: consumers made with ``fenced_acks``
        self.unreadable = 0  # deliveries and dead letters a damaged record stopped (rule 5)
        self._refill_damaged: set[str] = set()  # queues whose refill met a damaged record
        # Rule 6: the acknowledgements applied and not yet journaled, and their replies.
        self._acks_of: tuple[QueueBinding, AckOption] | None = None  # None: no batch open
        self._cut_short: set[QueueBinding] = set()  # dispatches the filter budget stopped
        #: Acknowledgements are applied but not yet journaled (rule 6); an attribute, not
        #: a property: the engine reads it before every publish.
        self.acks_open = False
        self._ack_events: list[Event] = []
        self._ack_replies: list[tuple[int, bool, m.Ack]] = []  # (conn_id, wait for durability, ack)
        self._ack_options: dict[str, _AckOptions] = {}  # sow_delete's headers read already (_read_ack_options)
        #: Called with (binding, deliveries, now) for every dispatch, before anything is
        #: sent: the simulations learn each delivery when it is decided (None: off).
        self.on_dispatch: Callable[[QueueBinding, list[Delivery], float], None] | None = None
        #: ``entitled(conn_id, queue)``: whether that connection's user may consume the
        #: queue (engine/entitlements.py). A barrier goes only to entitled recipients;
        #: the others still wait for it, as for a content filter that does not match.
        #: An entitlement filter is part of each consumer's filter (subscribing.py rule
        #: 7), so a barrier it does not match is not the consumer's either (queue rule 8).
        self.entitled = entitled
        #: ``client_of(conn_id)``: the connection's client name, for a dead letter's last
        #: consumer (engine/actions.py; None: the connection id).
        self._client_of = client_of

    # --- dirtiness (rule 1) -------------------------------------------------------------

    def mark(self, binding: QueueBinding) -> None:
        self._dirty.add(binding)

    def mark_all(self) -> None:
        self._dirty.update(self._bindings)

    def mark_consumer(self, key: Hashable) -> None:
        """A backlog slot of consumer ``key`` freed: its queues may deliver again."""
        att = self._attached.get(key)
        if att is not None:
            for name in att.queues:
                self._dirty.add(self._bindings.by_name[name])

    # --- consumers (rule 3) ----------------------------------------------------------------

    def attach(self, consumer: Consumer, names: list[str], now: float) -> None:
        for name in names:
            binding = self._bindings.by_name[name]
            binding.queue.add_consumer(consumer, now)
            self._dirty.add(binding)
        self._attached[consumer.key] = _Attachment(consumer, tuple(names))

    def replace(self, consumer: Consumer, names: list[str], flt: Expression | None, max_backlog: int,
                now: float) -> None:
        """``subscribe`` with replace (spec 000, "Replacing Queue Subscriptions"): atomic;
        leases and the outstanding count stay; queues left behind deliver nothing more but
        still take the acknowledgements of what they leased. A paused consumer (attached
        to no queue, engine/subscribing.py rule 9) takes the filter and backlog for its resume."""
        att = self._attached.get(consumer.key)
        predicate = consumer_predicate(flt)
        consumer.filter = predicate
        consumer.max_backlog = max_backlog
        if att is None:
            return
        known = set(att.queues) | set(att.detached)
        for name in att.queues:
            if name not in names:
                self._bindings.by_name[name].queue.detach_consumer(consumer, now)
        for name in names:
            binding = self._bindings.by_name[name]
            if name in known:
                binding.queue.replace_consumer(consumer, filter=predicate, max_backlog=max_backlog, now=now)
            else:
                binding.queue.add_consumer(consumer, now)
            self._dirty.add(binding)
        att.detached = tuple(n for n in known if n not in names)
        att.queues = tuple(names)

    def fence_acks(self, key: Hashable, fenced: bool) -> None:
        """Rule 8: whether the deliveries to consumer ``key`` carry their delivery count
        (the subscribe option ``fenced_acks``; kept across a pause, dropped with the
        subscription)."""
        if fenced:
            self._fenced.add(key)
        else:
            self._fenced.discard(key)

    def detach(self, consumer: Consumer, now: float) -> None:
        """Unsubscribe or disconnect: break the consumer's leases everywhere."""
        att = self._attached.pop(consumer.key, None)
        if att is None:
            return
        for name in (*att.queues, *att.detached):
            binding = self._bindings.by_name[name]
            self.journal_events(binding, binding.queue.remove_consumer(consumer, now), now)
            self._dirty.add(binding)

    def consumers(self) -> int:
        return len(self._attached)

    def queues_of(self, consumer: Consumer) -> tuple[str, ...]:
        """The queues ``consumer`` takes from (not those a replace left)."""
        att = self._attached.get(consumer.key)
        return att.queues if att is not None else ()

    # --- dispatch (rules 1 and 2) -----------------------------------------------------------

    def dispatch(self, now: float) -> None:
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        for binding in dirty:
            queue = binding.queue
            deadline = queue.next_deadline()
            if deadline is not None and deadline <= now:
                self.journal_events(binding, queue.expire(now), now)
            self._refill(binding, now)
            deliveries = queue.dispatch(now)
            while deliveries:
                self._deliver(binding, deliveries, now)
                if queue.cut_short or queue.wants() <= 0:
                    break
                # delivered messages left the active window (at-most-once): refill it
                self._refill(binding, now)
                deliveries = queue.dispatch(now)
            if queue.cut_short:
                self._cut_short.add(binding)  # the turn's filter budget ran out (queue rule 12)

    @property
    def dispatch_pending(self) -> bool:
        """Queues whose dispatch the filter budget cut short: the shell calls
        :meth:`continue_dispatch` in a later turn (queue rule 12)."""
        return bool(self._cut_short)

    def continue_dispatch(self, now: float) -> None:
        """A new turn: go on with the dispatches the filter budget cut short."""
        self._dirty |= self._cut_short
        self._cut_short = set()
        self.dispatch(now)

    def _refill(self, binding: QueueBinding, now: float) -> None:
        """TargetQueueDepth refill; a damaged record on the way stops this queue's refill
        until a restart (rule 5), never the dispatch of others."""
        if binding.name in self._refill_damaged:
            return
        try:
            binding.refill(self._journal, now=now)
        except errors.JournalCorrupt as exc:
            self._refill_damaged.add(binding.name)
            self.unreadable += 1
            log.error("queue %s: inactive messages are no longer read back from the journal, a record is "
                      "damaged (%s); the active ones are still delivered", binding.name, exc)

    def _deliver(self, binding: QueueBinding, deliveries: list[Delivery], now: float) -> None:
        if self.on_dispatch is not None:
            self.on_dispatch(binding, deliveries, now)
        if any(d.barrier for d in deliveries):
            self._deliver_with_barriers(binding, deliveries)
            return
        name = binding.name
        at_most_once = binding.config.semantics is _AT_MOST_ONCE
        out = self._messages(name, [(d, d.consumer) for d in deliveries], at_most_once)
        journal, outbox = self._journal, self._outbox
        if at_most_once:
            # Journaled before the message is sent (rule 2).
            journal.append(records.encode(records.DeliveredRec(name, [d.position for d in deliveries])))
            threshold = journal.end
            for conn_id, msg in out:
                outbox.send_when_durable(conn_id, msg, threshold)
            return
        rec = records.LeasedRec(name, [d.position for d in deliveries], [d.delivery_count for d in deliveries])
        journal.append(records.encode(rec))
        if binding.barrier_until > journal.durable_end:
            # a barrier of this queue is still waiting for its fsync: do not overtake it
            for conn_id, msg in out:
                outbox.send_when_durable(conn_id, msg)
            return
        for conn_id, msg in out:
            outbox.send(conn_id, msg)

    def _messages(
        self, name: str, sends: list[tuple[Delivery, Consumer]], at_most_once: bool
    ) -> list[tuple[int, m.Message]]:
        """The messages of ``sends``, leaving out those whose record is damaged (rule 5)."""
        out = []
        fenced = self._fenced
        strict = not at_most_once and self._bindings.by_name[name].config.leasing is _STRICT
        for d, consumer in sends:
            try:
                numbered = strict or (bool(fenced) and consumer is not None and consumer.key in fenced)
                out.append(self._message(name, d, consumer, at_most_once, numbered))
            except errors.JournalCorrupt as exc:
                self.unreadable += 1
                log.error(
                    "queue %s: message at position %d not delivered, its journal record is damaged (%s); %s",
                    name, d.position, exc,
                    "it counts as delivered (at-most-once)" if at_most_once else "it is offered again when its lease runs out",
                )
            except Exception as exc:  # noqa: BLE001 - poison.py rule 1: this delivery only, as a damaged one
                poison.skipped("encode", f"message at position {d.position} of queue {name!r}", exc,
                               "its delivery (offered again when its lease runs out, unless at-most-once)")
        return out

    def _message(self, name: str, d: Delivery, consumer: Consumer, at_most_once: bool,
                 numbered: bool = False) -> tuple[int, m.Message]:
        key: Any = consumer.key  # a subscription's (conn_id, sub_id) (subscribing.py); no cast call per message
        conn_id, sub_id = key
        entry = self._cache.get(d.position)
        msg = _MESSAGE(
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
            # rule 8: the delivery an ack names (a lease only: not a barrier, not at-most-once)
            delivery=d.delivery_count if numbered and d.lease_deadline is not None else None,
        )
        return conn_id, msg

    def _deliver_with_barriers(self, binding: QueueBinding, deliveries: list[Delivery]) -> None:
        """A batch holding barrier messages: each barrier goes to all its recipients once
        its record is durable, and nothing after it may overtake it, so every message of
        the batch is journaled in order and sent once durable (rule 2)."""
        name = binding.name
        at_most_once = binding.config.semantics is _AT_MOST_ONCE
        journal, outbox = self._journal, self._outbox
        for d in deliveries:
            if d.barrier:
                journal.append(records.encode(records.BarrierRec(name, [d.position])))
                entitled = self.entitled
                sends = self._messages(name, [(d, c) for c in d.recipients
                                              if entitled is None or entitled(c.owner, name)], at_most_once)
            elif at_most_once:
                journal.append(records.encode(records.DeliveredRec(name, [d.position])))
                sends = self._messages(name, [(d, d.consumer)], at_most_once)
            else:
                journal.append(records.encode(records.LeasedRec(name, [d.position], [d.delivery_count])))
                sends = self._messages(name, [(d, d.consumer)], at_most_once)
            threshold = journal.end
            for conn_id, msg in sends:
                outbox.send_when_durable(conn_id, msg, threshold)
        binding.barrier_until = journal.end

    # --- records (rule 4) --------------------------------------------------------------------

    def journal_events(self, binding: QueueBinding, events: list[Event], now: float) -> None:
        """Journal the queue's events: one record per kind, each expiry with its dead letters."""
        if not events:
            return
        journal = self._journal
        if all(type(ev) is Acknowledged for ev in events):  # an acknowledgement's: one AckedRec
            journal.append(records.encode(records.AckedRec(binding.name, [ev.position for ev in events])))
            return
        groups, expired = queue_journal.batch(events)
        for ev in expired:
            self._journal_expiry(binding, ev, now)
        for rec_type, group in groups:
            journal.append(records.encode(queue_journal.record(binding.name, rec_type, group)))

    def _journal_expiry(self, binding: QueueBinding, event: Expired, now: float) -> None:
        """An expiry, with the dead letters its actions publish (spec 000, "Handling
        Unprocessed Messages"): the first dead letter carries the expiry itself, so one
        record makes both durable, or neither."""
        name = binding.name
        reasons = tuple(str(r) for r in event.reasons)
        letters = []
        if self._actions.watches(name):
            try:
                entry = self._cache.get(event.position)
            except errors.JournalCorrupt as exc:
                # No body for the dead letter: the expiry itself is still journaled.
                self.unreadable += 1
                log.error("queue %s: no dead letter for the expired message at position %d, its journal "
                          "record is damaged (%s)", name, event.position, exc)
            else:
                letters = self._actions.dead_letters(
                    name, reasons, entry.data, correlation_id=entry.correlation_id,
                    bookmark=format_bookmark(entry.publisher, entry.seq, event.position),
                    failure=self._failure(binding, event, now),
                )
        if not letters:
            self._journal.append(records.encode(records.ExpiredRec(name, event.position, ",".join(reasons), event.reason)))
            return
        publisher = self._action_publisher
        publishes = self._publishes
        for i, letter in enumerate(letters):
            first = i == 0
            publishes.append_record(records.PublishRec(
                letter.topic, publisher, publishes.next_seq(publisher), now, letter.data, None,
                expired_queue=name if first else None,
                expired_position=event.position if first else -1,
                expired_reasons=",".join(reasons) if first else "",
            ))

    def _failure(self, binding: QueueBinding, event: Expired, now: float) -> Failure:
        deliveries, consumer = binding.queue.failure_of(event.position)
        return Failure(event.reason, deliveries, self._consumer_label(consumer), now)

    def _consumer_label(self, key: Hashable) -> str:
        """A consumer key as a dead letter names it: ``client name/sub id``."""
        if key is None:
            return ""
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], int):
            name = self._client_of(key[0]) if self._client_of is not None else None
            return f"{name if name is not None else key[0]}/{key[1]}"
        return consumer_label(key)

    def removed_elsewhere(self, binding: QueueBinding, events: list[Event]) -> None:
        """Messages left the queue on another instance (replicated queues): nothing to
        journal here (the record that said so is), but backlog may be free."""
        self.mark_all()

    # --- time ------------------------------------------------------------------------------------

    def expire_due(self, now: float) -> list[tuple[QueueBinding, list[Event]]]:
        """Lease and message expiry due at ``now``, journaled; the events per queue."""
        out: list[tuple[QueueBinding, list[Event]]] = []
        for binding in self._bindings:
            queue = binding.queue
            deadline = queue.next_deadline()
            if deadline is not None and deadline <= now:
                events = queue.expire(now)
                self.journal_events(binding, events, now)
                self._dirty.add(binding)
                if events:
                    # Ended leases free backlog that consumers share across queues.
                    self.mark_all()
                out.append((binding, events))
        return out

    def next_deadline(self) -> float | None:
        deadline: float | None = None
        for b in self._bindings:
            deadline = earliest(deadline, b.queue.next_deadline())
        return deadline

    # --- commands ----------------------------------------------------------------------------------

    def _binding(self, topic: str, verb: str) -> QueueBinding:
        binding = self._bindings.get(topic)
        if binding is None:
            raise errors.UnknownTopic(
                f"{verb} needs a queue topic; {topic!r} is not a queue (SOW topics are not supported)"
            )
        return binding

    def sow_delete(self, conn_id: int, cmd: m.SowDelete, now: float) -> None:
        """Acknowledge by bookmark or by filter (spec 000, "Acknowledging Messages")."""
        binding = self._binding(cmd.topic, "sow_delete")
        text = cmd.options
        if not text:  # a plain acknowledgement, the common case: what the options below say when empty
            option, delay, reason, named = _NO_ACK_OPTIONS
        else:
            kept = self._ack_options.get(text)
            if kept is None:
                opts = parse_options("sow_delete", text)
                if opts.has("touch") or opts.get("touch") is not None:
                    self._touch(conn_id, binding, cmd, opts, now)
                    return
                kept = self._read_ack_options(text, opts)
            option, delay, reason, named = kept
        queue = binding.queue
        stale: list[int] = []
        bookmark = cmd.bookmark  # read once: a Struct's field costs compiled code a lookup
        if bookmark:
            positions = bookmark_positions(bookmark)
            if named is not None:  # rule 8
                positions, stale = queue.stale_acks(positions, _deliveries(named, len(positions)))
            self._open_acks(binding, option, now)
            result = queue.acknowledge(positions, by=conn_id, option=option, now=now, delay=delay, reason=reason)
        elif named is not None:
            raise errors.InvalidOption("deliveries goes with bookmarks, one per bookmark", option="deliveries")
        elif cmd.filter:
            predicate = consumer_predicate(compile_filter(cmd.filter))
            assert predicate is not None  # a filter that is not empty compiles to one (or raises)
            self._open_acks(binding, option, now)
            result = queue.acknowledge_matching(predicate, by=conn_id, option=option, now=now, delay=delay,
                                                reason=reason)
        else:
            raise errors.ClientError("sow_delete on a queue needs bookmarks or a filter")
        self._ack_events += result.events
        self._dirty.add(binding)
        for key in result.freed:
            self.mark_consumer(key)
        # A bookmark ack names messages: a refusal is an error. A filter ack spares the
        # messages leased to others quietly (Leasing=strict), as a query would.
        refused = _refusal(result, stale, bookmark) if bookmark else None
        if refused is not None:
            # Leasing=strict, stale acks: the rest of the batch took effect; this says what did not.
            refused.details["records_deleted"] = result.deleted
            raise refused
        acks = ack_types(cmd.ack_type)
        if not acks:  # no reply asked for: the usual acknowledgement
            return
        replies = self._ack_replies
        for kind in acks & _REPLIES_NOW:
            replies.append((conn_id, False, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=result.deleted)))
        for kind in acks & _REPLIES_DURABLE:
            replies.append((conn_id, True, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=result.deleted)))

    def _read_ack_options(self, text: str, opts: Options) -> _AckOptions:
        """What a ``sow_delete`` header without ``touch`` asks for, checked; kept by
        header (a subscriber that names its deliveries sends ``deliveries=[1]`` with
        almost every acknowledgement), up to ``ACK_OPTIONS_KEPT`` headers of at most
        ``ACK_OPTIONS_TEXT_MAX`` characters, then forgotten all at once. A refused header
        raises and is not kept."""
        if opts.has("cancel") and opts.has("expire"):
            raise errors.InvalidOption("cancel and expire cannot be combined")
        option = (AckOption.CANCEL if opts.has("cancel") else AckOption.EXPIRE if opts.has("expire")
                  else AckOption.NONE)
        delay, reason = _retry_options(opts, option)
        read = (option, delay, reason, opts.list("deliveries"))
        if len(text) <= ACK_OPTIONS_TEXT_MAX:
            kept = self._ack_options
            if len(kept) >= ACK_OPTIONS_KEPT:
                kept.clear()
            kept[text] = read
        return read

    def _touch(self, conn_id: int, binding: QueueBinding, cmd: m.SowDelete, opts: Options, now: float) -> None:
        """``sow_delete`` with ``touch`` (docs/queues.md, "Touch"): the subscriber keeps
        working on the messages it names; each of them it holds stays leased for the
        queue's LeasePeriod from now, or ``touch=N`` seconds (at most LeasePeriod: a long
        job touches again). Nothing is journaled (no lease survives a restart); the reply
        counts the messages the connection held (``matches``). With ``deliveries``, a
        stale delivery's lease is not renewed and is reported as a stale ack is (rule 8)."""
        if opts.has("cancel") or opts.has("expire") or opts.texts or opts.seconds:
            raise errors.InvalidOption("touch cannot be combined with cancel, expire, delay or reason", option="touch")
        if not cmd.bookmark:
            raise errors.InvalidOption("touch names its messages by bookmark", option="touch")
        positions = bookmark_positions(cmd.bookmark)
        named = opts.list("deliveries")
        stale: list[int] = []
        if named is not None:  # rule 8
            positions, stale = binding.queue.stale_acks(positions, _deliveries(named, len(positions)))
        period = binding.config.lease_period_s
        asked = opts.get("touch")
        held = binding.queue.touch(positions, by=conn_id,
                                   deadline=now + (period if asked is None else min(float(asked), period)))
        refused = _refusal(AckResult(), stale, cmd.bookmark, "touch")
        if refused is not None:  # the others were renewed; this says which were not
            refused.details["matches"] = held
            raise refused
        for kind in ack_types(cmd.ack_type) & {"processed", "stats", "persisted", "completed"}:
            self._outbox.send(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=0, matches=held))

    def _open_acks(self, binding: QueueBinding, option: AckOption, now: float) -> None:
        """Rule 6: the batch the next acknowledgement joins (one queue, one option)."""
        open_ = self._acks_of
        if open_ is not None and open_[0] is binding and open_[1] is option:
            return
        self.flush_acks(now)
        self._acks_of = (binding, option)
        self.acks_open = True

    def flush_acks(self, now: float) -> None:
        """Rule 6: journal the batch of acknowledgements, then file their replies (in the
        order of the commands; a persisted ack waits for the records just appended)."""
        if self._acks_of is None:
            return
        binding = self._acks_of[0]
        events, replies = self._ack_events, self._ack_replies
        self._acks_of, self._ack_events, self._ack_replies = None, [], []
        self.acks_open = False
        self.journal_events(binding, events, now)
        outbox = self._outbox
        for conn_id, durable, ack in replies:
            if durable:
                outbox.send_when_durable(conn_id, ack)
            else:
                outbox.send(conn_id, ack)

    def sow(self, conn_id: int, cmd: m.Sow | m.SowAndSubscribe, now: float, *,
            entitlement: Expression | None = None) -> None:
        """The queue as a view (spec 000, "Querying Queues as a View"): its available
        messages in delivery order, filtered, with ``top_n`` / ``skip_n``. Rule 7: the
        messages available in this step, produced as the connection drains them.
        ``entitlement``: the user's entitlement filter on the queue (engine/entitlements.py
        rule 6), ANDed with the query's."""
        binding = self._binding(cmd.topic, "sow")
        opts = parse_options("sow", cmd.options) if isinstance(cmd, m.Sow) else None
        top_n = cmd.top_n if cmd.top_n is not None else (opts.get("top_n") if opts else None)
        skip_n = (opts.get("skip_n") if opts else None) or 0
        flt = entitled(compile_filter(cmd.filter), entitlement)
        qid = cmd.query_id or cmd.cid
        topic = cmd.topic
        cache = self._cache
        source = Snapshot(binding.queue.available(), frozen_positions)
        where = f"a sow query of connection {conn_id}"
        returned = 0

        def messages() -> Iterator[m.Message | None]:
            nonlocal returned
            skipped = 0
            for pos in source:
                if top_n is not None and returned >= top_n:
                    return
                entry = cache.peek(pos)  # read, not kept: the deliveries' recent messages stay
                bookmark = format_bookmark(entry.publisher, entry.seq, pos)
                if flt is not None and not poison.matches(flt, entry, bookmark, now, where):
                    yield None
                    continue
                if skipped < skip_n:
                    skipped += 1
                    yield None
                    continue
                returned += 1
                yield m.Message(topic=topic, data=entry.data, bookmark=bookmark, seq=entry.seq,
                                timestamp=entry.timestamp, query_id=qid, correlation_id=entry.correlation_id)

        outbox = self._outbox

        def finish(error: errors.JournalError | None) -> None:
            outbox.send(conn_id, m.GroupEnd(query_id=qid, cid=cmd.cid))
            if error is not None:
                outbox.send(conn_id, query_failed(cmd.cid, qid, error))
                return
            for kind in ack_types(cmd.ack_type) & {"completed", "stats", "processed"}:
                if isinstance(cmd, m.SowAndSubscribe) and kind == "processed":
                    continue  # the subscribe part acknowledges
                outbox.send(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, query_id=qid, records_returned=returned))

        self._queries.start(Production(conn_id, m.GroupBegin(query_id=qid, cid=cmd.cid), messages(), finish, source,
                                       filter_cost_ticks(flt)))


#: A ``sow_delete`` header's reading: (option, delay, reason, the deliveries it names).
_AckOptions = tuple[AckOption, "float | None", str, "tuple[str, ...] | None"]
_NO_ACK_OPTIONS: Final[_AckOptions] = (AckOption.NONE, None, "", None)
#: Readings kept: as many, of headers as short, as the option parses kept (options.py).
ACK_OPTIONS_KEPT: Final = PARSED_MAX
ACK_OPTIONS_TEXT_MAX: Final = PARSED_TEXT_MAX
#: A ``sow_delete``'s replies: those sent at once, those sent once its records are durable
#: (made once: a set literal is built anew at each acknowledgement).
_REPLIES_NOW: Final = frozenset({"processed", "stats"})
_REPLIES_DURABLE: Final = frozenset({"persisted", "completed"})


def _retry_options(opts: Options, option: AckOption) -> tuple[float | None, str]:
    """``delay=N`` (a cancel's delayed retry) and ``reason="..."`` (a cancel's or an
    expire's failure reason): docs/queues.md, "Delayed retry" and "Failure reasons"."""
    delay, reason = opts.number("delay"), opts.text("reason")
    if delay is not None and option is not AckOption.CANCEL:
        raise errors.InvalidOption("delay goes with cancel only", option="delay")
    if reason is not None and option is AckOption.NONE:
        raise errors.InvalidOption("reason goes with cancel or expire only", option="reason")
    return delay, reason or ""


def _deliveries(items: tuple[str, ...], count: int) -> list[int]:
    """Rule 8: the ``deliveries=[...]`` option, one whole number per bookmark (0: none)."""
    if len(items) != count:
        raise errors.InvalidOption(f"deliveries names {len(items)} deliveries for {count} bookmark(s): "
                                   "give one per bookmark (0: none)", option="deliveries")
    try:
        numbers = [int(item) for item in items]
    except ValueError:
        raise errors.InvalidOption("deliveries holds whole numbers, e.g. deliveries=[2,1]", option="deliveries") from None
    if any(n < 0 for n in numbers):
        raise errors.InvalidOption("deliveries must not be negative", option="deliveries")
    return numbers


def _refusal(result: AckResult, stale: list[int], bookmarks: str,
             verb: str = "acknowledgement") -> errors.NotLeaseHolder | None:
    """Rule 8: what a bookmark ack (or touch: ``verb``) reports of the messages it did not
    settle: those ``Leasing=strict`` refused (``result.error()``, as before) and the ``stale``
    ones, with their bookmarks in ``refused`` (and the stale ones again in ``stale``), comma lists."""
    strict = result.error()
    if strict is None and not stale:
        return None
    named = {bookmark_position(b): b.strip() for b in bookmarks.split(",") if b.strip()}
    others = result.refused_positions
    if strict is not None and not stale:
        error = strict
    else:
        what = f"{len(stale)} stale (delivered again, or moved to another instance, since that delivery)"
        if others:
            what += f", {len(others)} leased to another subscriber"
        error = errors.NotLeaseHolder(f"{verb} refused for {len(stale) + len(others)} message(s): {what}",
                                      positions=tuple(stale) + tuple(others),
                                      stale=",".join(named[p] for p in stale))
    error.details["refused"] = ",".join(named[p] for p in sorted(set(stale) | set(others)))
    return error
