"""One binding per queue: the queue and every per-queue fact the engine needs around it.

A :class:`QueueBinding` holds the :class:`~conveyor.engine.queue.Queue` together with its
compiled ``Filter``, ``Priority`` and ``BarrierExpression``, the barrier fence and the
FileBackedMetadata replay start; :class:`QueueBindings` routes topics to bindings.
Rules:

1. **What enters a queue is decided at publish time.** The queue ``Filter``, the
   ``Priority`` value and the ``BarrierExpression`` are evaluated once, when a durable
   publish is offered (:meth:`QueueBinding.offer`), with ``now`` = the message's publish
   time. Recovery offers the same record with the same time, so a restart rebuilds
   exactly the queue that ran, even for a filter that reads ``UNIX_TIMESTAMP()``.
2. **TargetQueueDepth refill** (:meth:`QueueBinding.refill`): inactive messages hold no
   queue state; while the queue wants more, the binding reads the journal from the
   queue's ``refill_from`` and offers each message of this queue, filtered as at publish.
3. **Consumer filters** are evaluated when a message is considered for a consumer, with
   the ``now`` of that decision (:func:`consumer_predicate`).
4. Routing caches (topic -> bindings) are built lazily; the set of queues is fixed by
   the configuration, so they never go stale.
5. **A message that fails an expression is skipped there** (engine/poison.py): a
   consumer filter that raises does not match (the queue goes on with the next
   message), a ``Filter`` keeps the message out, a ``Priority`` gives the lowest
   priority and a ``BarrierExpression`` false, an ``OrderingKey`` no key (unordered),
   the same at every recovery.
6. **OrderingKey** (engine/queue/keys.py) is evaluated at enqueue like ``Priority``, as
   a SOW ``Key`` is: the scalar result as text, NULL (no such field) for no key. A
   barrier has no key. The queue can compute a key again from the journal
   (``key_at``: after a snapshot restore, keys.py rule 5); in a replicated queue a
   message owned elsewhere has its key too (keys.py rule 6).
7. **TargetQueueDepth on a replicated queue.** A message beyond the window is inactive
   on every instance alike (messages owned elsewhere count in the window): its owner
   is decided only when it becomes active (``ownership.entering`` then, so a removal
   or a transfer that reached this instance meanwhile decides it, and a removal makes
   it consumed there, as a deferred acknowledgement). A transfer request for one of
   its messages that is inactive here is answered from the log (:meth:`find_inactive`,
   engine/replication/ownership.py rule 11).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator, cast

from conveyor import errors, records
from conveyor.config.model import Config, QueueConfig, client_topic_matcher
from conveyor.protocol.bookmarks import format_bookmark
from conveyor.engine import poison
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.filters import compile_filter, filter_cost_ticks
from conveyor.engine.replication.ownership import QueueOwnership
from conveyor.engine.ports import JournalPort
from conveyor.engine.queue.queue import Queue
from conveyor.engine.queue.replica import Ident, ident_of
from conveyor.engine.routes import RouteCache
from conveyor.expr import Expression
from conveyor.expr.values import priority_key, scalar, to_text

log = logging.getLogger("conveyor.engine")

View = tuple[Entry, int]  # what a queue's load() returns: the message and its position


_HELD_BACK = 1 << 40  # QueueBinding.ahead() of a message held back: more than any cache admits
_ANY = -_HELD_BACK  # ahead() of a priority queue's message: admitted, and so are all after it


def consumer_predicate(flt: Expression | None) -> Callable[[object, float], bool] | None:
    """A consumer's (or a ``sow_delete``'s) filter as the queue calls it (rule 3)."""
    if flt is None:
        return None

    def predicate(view: View, now: float) -> bool:
        entry, position = view
        try:
            return flt.matches(entry.decoded(), entry.meta(format_bookmark(entry.publisher, entry.seq, position), now))
        except Exception as exc:  # noqa: BLE001 - rule 5: no match for this consumer, the queue goes on
            poison.skipped("filter", entry, exc, "a queue consumer's filter")
            return False

    # what queue dispatch charges the turn (queue rule 12; queue_seats reads it with getattr)
    setattr(predicate, "cost_ticks", filter_cost_ticks(flt))
    # The queue calls its filters with what its load() returns, typed ``object`` there:
    # for a queue a QueueBinding built, a View.
    return cast("Callable[[object, float], bool]", predicate)


def _compiled(qc: QueueConfig, element: str, text: str | None) -> Expression | None:
    try:
        return compile_filter(text)
    except errors.BadFilter as exc:
        raise errors.ConfigError(f"invalid {element}: {exc}", path=f"{qc.path}/{element}") from None


class QueueBinding:
    __slots__ = ("queue", "name", "config", "filter", "priority", "barrier", "plain", "barrier_until",
                 "snapshot_events_from", "ownership", "ordering_key")

    def __init__(self, config: QueueConfig, cache: MessageCache, budget: FilterBudget | None = None, *,
                 replicated_at: str | None = None) -> None:
        """``replicated_at``: this instance's name when the queue is replicated (its
        messages then follow ownership, engine/replication/ownership.py)."""
        self.config = config
        self.name = config.name
        self.filter = _compiled(config, "Filter", config.filter)
        self.priority = _compiled(config, "Priority", config.priority)
        self.barrier = _compiled(config, "BarrierExpression", config.barrier_expression)
        self.ordering_key = _compiled(config, "OrderingKey", config.ordering_key)  # rule 6
        # No Filter, Priority, BarrierExpression or OrderingKey, not replicated: recovery
        # enqueues without decoding.
        self.plain = not (config.filter or config.priority or config.barrier_expression or config.ordering_key
                          or replicated_at)
        self.barrier_until = 0  # journal end when this queue's last barrier batch was made
        self.snapshot_events_from: int | None = None  # FileBackedMetadata: events below are in the snapshot

        def load(position: int) -> View:
            return cache.get(position), position

        key_at = None if self.ordering_key is None else (lambda position: self.key_of(cache.get(position)))
        self.queue = Queue(config, load=load, budget=budget, replicated=replicated_at is not None, key_at=key_at)
        #: A replicated queue's QueueOwnership (engine/replication/ownership.py); None: not replicated.
        self.ownership: QueueOwnership | None = None if replicated_at is None else QueueOwnership(
            replicated_at, self.queue, kind=config.kind, initial_owner=config.initial_owner,
            deferred_ack_expiration_s=config.deferred_ack_expiration_s)

    def __repr__(self) -> str:
        return f"<QueueBinding {self.name!r}>"

    def ahead(self) -> int:
        """How far from delivery a message enqueued now is, for the payload cache's
        admission (engine/cache.py, "Admission"): the queue's depth, counted twice while
        the queue has no consumer (nobody reads it soon); less than none for a priority
        queue (any message may go to its front); the whole journal's worth when it would
        be held back (TargetQueueDepth: it is read back from the journal)."""
        if self.priority is not None:
            return _ANY
        if self.queue.would_hold():
            return _HELD_BACK
        depth, read = self.queue.depth_and_readers()
        return depth if read else 2 * depth

    def takes_topic(self, topic: str) -> bool:
        return self.config.takes_from(topic)

    def takes(self, entry: Entry) -> bool:
        """Whether the message enters the queue (its ``Filter``; rule 1)."""
        flt = self.filter
        if flt is None:
            return True
        try:
            return flt.matches(entry.decoded(), entry.meta(None, entry.timestamp))
        except Exception as exc:  # noqa: BLE001 - rule 5: it stays out
            poison.skipped("filter", entry, exc, f"the Filter of queue {self.name!r}")
            return False

    def offer(self, position: int, entry: Entry, origin: str = "", now: float | None = None) -> bool:
        """Enqueue a message the queue takes, with its priority and barrier flag (rule 1);
        True if it entered (possibly inactive, beyond TargetQueueDepth, or owned by
        another instance). ``origin``: where it was first published ("" here);
        ``now``: when it arrived here."""
        if not self.takes(entry):
            return False
        priority = None
        barrier = False
        key = None if self.ordering_key is None else self.key_of(entry)  # rule 6
        if self.priority is not None or self.barrier is not None:
            data, meta = entry.decoded(), entry.meta(None, entry.timestamp)
            try:
                if self.barrier is not None:
                    barrier = self.barrier.matches(data, meta)
                if self.priority is not None and not barrier:
                    priority = self.priority.priority(data, meta)
            except Exception as exc:  # noqa: BLE001 - rule 5: an ordinary message, lowest priority
                poison.skipped("filter", entry, exc, f"the Priority or BarrierExpression of queue {self.name!r}")
                barrier = False
                priority = None if self.priority is None else priority_key(None)
        if self.ownership is None or self.queue.would_hold():  # rule 7: inactive, its owner decided later
            self.queue.enqueue(position, entry.timestamp, priority, barrier, expires_at=entry.expiration,
                               ordering_key=None if barrier else key)
            return True
        arrived = entry.timestamp if now is None else now
        ident = ident_of(entry.publisher, entry.seq)
        enters, owner = self.ownership.entering(ident, origin, barrier, arrived)
        if enters:
            self.queue.enqueue(position, entry.timestamp, priority, barrier, expires_at=entry.expiration, owner=owner,
                               arrived=arrived, ident=ident, ordering_key=None if barrier else key)
        return enters

    def key_of(self, entry: Entry) -> str | None:
        """The message's OrderingKey (rule 6): the scalar result as text; None without one,
        or for NULL (no such field), or when the expression fails (rule 5)."""
        if self.ordering_key is None:
            return None
        try:
            return to_text(scalar(self.ordering_key.evaluate(entry.decoded(), entry.meta(None, entry.timestamp))))
        except Exception as exc:  # noqa: BLE001 - rule 5: no key, unordered
            poison.skipped("filter", entry, exc, f"the OrderingKey of queue {self.name!r}")
            return None

    def priority_of(self, entry: Entry) -> int | None:
        """The message's priority, computed as at enqueue (None: not a priority queue)."""
        if self.priority is None:
            return None
        try:
            return self.priority.priority(entry.decoded(), entry.meta(None, entry.timestamp))
        except Exception:  # noqa: BLE001 - as at enqueue (rule 5), which counted it
            return priority_key(None)

    def refill(self, journal: JournalPort, upto: int | None = None, now: float = 0.0) -> None:
        """TargetQueueDepth: activate inactive messages read back from the journal until
        the active part is full again (rule 2); ``now``: when (a replicated queue's
        messages owned elsewhere arrive then: rule 7)."""
        queue, ownership = self.queue, self.ownership
        while queue.wants() > 0:
            start = queue.refill_from()
            if start is None:
                return
            activated = False
            for pos, rec in self._inactive(journal, start, upto):
                if ownership is None:
                    queue.activate(pos, rec.timestamp, rec.expiration)
                else:
                    self._activate_replicated(pos, rec, ownership, now)
                activated = True
                if queue.wants() <= 0:
                    return
            if not activated:
                log.error("queue %s: %d inactive messages not found in the journal", self.name, queue.wants())
                return

    def _inactive(self, journal: JournalPort, start: int, upto: int | None) -> Iterator[tuple[int, records.PublishRec]]:
        """The messages of this queue in the journal from ``start`` (a record boundary)."""
        for pos, payload in journal.scan(start, upto):
            rec = records.decode(payload)
            if type(rec) is not records.PublishRec or not self.config.takes_from(rec.topic):
                continue
            if self.takes(Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id)):
                yield pos, rec

    def _activate_replicated(self, pos: int, rec: records.PublishRec, ownership: QueueOwnership, now: float) -> None:
        """Rule 7: the owner is decided now; a message removed on another instance while it
        was inactive is consumed as a deferred acknowledgement would be."""
        queue = self.queue
        ident = ident_of(rec.publisher, rec.seq)
        enters, owner = ownership.entering(ident, rec.origin, False, now)
        # Owned elsewhere, it counts as waiting here since it was published (it was in the
        # log, inactive): a request for it need not wait for the owner's acks all over again.
        arrived = min(now, rec.timestamp)
        if queue.activate(pos, rec.timestamp, rec.expiration, owner=owner, arrived=arrived, removed=not enters):
            queue.replica.entered(pos, ident)

    def find_inactive(self, journal: JournalPort, wanted: set[Ident], limit: int) -> dict[Ident, tuple[int, str]]:
        """Rule 7: where in the inactive part the messages ``wanted`` (by identity) are,
        with their origin, reading at most ``limit`` journal records from its start."""
        start = self.queue.refill_from()
        found: dict[Ident, tuple[int, str]] = {}
        if start is None or not wanted:
            return found
        for read, (pos, payload) in enumerate(journal.scan(start)):
            if read >= limit:
                break
            rec = records.decode(payload)
            # the requester's queue is this one (the handshake checked): its messages pass the same Filter
            if type(rec) is records.PublishRec and (ident := ident_of(rec.publisher, rec.seq)) in wanted:
                found[ident] = (pos, rec.origin)
                if len(found) == len(wanted):
                    break
        return found


class QueueBindings:
    """Every configured queue's binding, and routing from topics to them (rule 4)."""

    def __init__(self, config: Config, cache: MessageCache, budget: FilterBudget | None = None) -> None:
        self.by_name: dict[str, QueueBinding] = {}
        self._targets: dict[str, str] = {}  # DefaultPublishTarget: queue name -> topic
        self._routes: RouteCache[tuple[QueueBinding, ...]] = RouteCache()  # bounded: routes.py
        replicated = config.replication.replicated_queues(config.queues) if config.replication else frozenset()
        for qc in config.queues:
            self.by_name[qc.name] = QueueBinding(qc, cache, budget,
                                                 replicated_at=config.name if qc.name in replicated else None)
            if qc.default_publish_target and qc.default_publish_target != qc.name:
                self._targets[qc.name] = qc.default_publish_target

    def __iter__(self) -> Iterator[QueueBinding]:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> QueueBinding | None:
        return self.by_name.get(name)

    def queues(self) -> dict[str, Queue]:
        return {name: b.queue for name, b in self.by_name.items()}

    def target(self, topic: str) -> str:
        """Where a publish to ``topic`` is recorded: a queue's DefaultPublishTarget."""
        return self._targets.get(topic, topic)

    def for_topic(self, topic: str) -> tuple[QueueBinding, ...]:
        """The queues whose underlying topics include ``topic``."""
        hit = self._routes.get(topic)
        if hit is None:
            hit = self._routes.put(topic, tuple(b for b in self.by_name.values() if b.config.takes_from(topic)))
        return hit

    def matching(self, pattern: str) -> list[str]:
        """Names of the queues a subscription to ``pattern`` (a name or regex) covers.
        ``pattern`` is a client's: a regex runs on RE2 (BadTopic when it cannot)."""
        match = client_topic_matcher(pattern)
        return [name for name in self.by_name if match(name)]


class PlainRuns:
    """Publishes to plain queues (no Filter, Priority, BarrierExpression, OrderingKey or
    replication: ``QueueBinding.plain``) gathered in position order, and each queue's run
    enqueued in one pass (``Queue.enqueue_run``). A queue's run goes in before any other
    message of that queue does (:meth:`flush`), so its positions stay in order."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[QueueBinding, tuple[list[int], list[float]]] = {}

    def add(self, binding: QueueBinding, position: int, published_at: float) -> None:
        run = self._runs.get(binding)
        if run is None:
            run = self._runs[binding] = ([], [])
        run[0].append(position)
        run[1].append(published_at)

    def flush(self, binding: QueueBinding) -> None:
        """Enqueue ``binding``'s run now (another of its messages goes in next)."""
        run = self._runs.pop(binding, None)
        if run is not None:
            binding.queue.enqueue_run(*run)

    def flush_all(self) -> list[QueueBinding]:
        """Enqueue every run; the queues that took messages."""
        done = list(self._runs)
        for binding, run in self._runs.items():
            binding.queue.enqueue_run(*run)
        self._runs.clear()
        return done
