"""Named consumers: the Spark source's delivery sequence (docs/spark-server.md).

A named consumer ``(queue, name)`` is durable and independent of connections. Rules:

1. **Deliveries.** Every message leased to it gets the next delivery number ``d`` (1, 2,
   3...; ``D`` is the last). For ``A < d <= D`` (``A``: the acked pointer) it keeps the
   message's position, so ``(lo, hi]`` always names the same messages, whatever happens
   to their leases. Memory: 8 bytes per unacked delivery (``array('q')``).
2. **Lease** ``after == D``: up to ``max`` new messages (0: all available), in the
   queue's delivery order, none at a position >= ``upto``; ``after < D``: a re-offer of
   ``(after, min(D, after+max)]``: leases still held are renewed, messages available
   again are taken back, nothing new is leased; ``after > D`` or ``after < A``:
   ``bad_delivery_range``. One :class:`ConsumerLeasedRec` per call that leased anything,
   and the reply goes out once it is durable.
3. **Ack through** ``d``: cumulative and idempotent; it acknowledges the messages of
   deliveries ``A < d' <= d`` whoever holds them now (a lapsed lease still acks its
   message; a message already acked or expired is skipped). One
   :class:`ConsumerAckedRec` naming the messages it removed.
4. **Fencing.** ``claim`` bumps the epoch (one :class:`ConsumerClaimedRec`). Once a
   consumer was claimed, every mutating call (lease, ack_through, extend, reclaim) must
   carry the current epoch or fails with ``fenced``. Fetch, head and info are reads.
5. **Lease state is not journaled** beyond the lease record: extend and reclaim change
   only deadlines, and no lease survives a restart. After a restart every unacked
   delivery whose message is still in the queue is leased to its consumer again for the
   queue's LeasePeriod (so other subscribers do not take it before the driver is back);
   the next re-offer, reclaim or extend renews it.
6. **Recovery** applies the three records idempotently on top of the checkpoint's
   snapshot (``Checkpoint.consumers``): a lease record only if ``first == D+1``, an ack
   only if it moves ``A``, a claim only if it raises the epoch. Their effect on the
   queue (delivery counts, acks) replays from the queue's recovery point as any queue
   record.
7. **Replicated queues** (docs/spark.md, "Failover between instances"). The three
   records of a consumer of a replicated queue travel to the other instances as
   :class:`~conveyor.records.ConsumerReplicatedRec`, naming messages by identity. An
   instance that receives one applies it to its copy of the consumer by the rules of
   6 (the messages mapped to its own positions) and journals it with those positions;
   it changes nothing in its queue: the lease is the owner's, and the acknowledged
   messages leave by the queue's own removal record. So a query that fails over finds
   the same deliveries, acked pointer and epoch there, and every reply (lease, ack,
   claim...) waits until the sync destinations hold its record
   (``send_when_persisted``): a delivery the query was told of is never unknown on a
   sync destination. A lease there takes the messages this instance owns and, with
   proxied transfer on (engine/replication/ownership.py rule 6), those of an owner it cannot
   reach, by one proxied transfer per lease; a re-offer of a message another instance
   owns reports it held elsewhere (the query reads it, and its ack removes it
   everywhere). Such a lease never takes, by proxied transfer, a message that is an
   unacknowledged delivery of a named consumer here: the owner leased it, and a new
   delivery number would give it out twice.
8. **Claims fence branches across instances.** With an asynchronous link, an instance
   can die with deliveries or acks its peer never received, and the query claims the
   consumer on the peer, which numbers its next deliveries from what it knew. So every
   lease and ack record carries the epoch it was made under, and a claim records the
   deliveries its claimer knew (``d``) and, on a replicated queue, its unacknowledged
   deliveries (``acked`` and their messages, sent by identity). An instance that
   receives a claim of a higher epoch adopts it and takes exactly the claimer's
   deliveries (mapped to its own positions): its own deliveries beyond ``d`` go, and
   an acknowledged pointer beyond ``d`` drops to it (those acks were of a branch the
   claimer never saw). A lease or ack of an older epoch then counts only for the
   deliveries every later claim knew (``cut_for``: the least ``d`` of the claims after
   its epoch). On a replicated queue an epoch is ``round << 12 | tag``
   (:func:`next_epoch`): the round is the claimer's clock, the tag its name, so two
   instances that claim without having seen each other's claim pick different
   epochs, the later claim (the query's current one) is the higher, and every copy
   converges on it. A replicated lease naming a message that was acknowledged here
   first is kept as a delivery whose message is gone here (``GONE``): the numbering
   stays the same everywhere, re-offers report it done, and a fetch of it is refused
   with ``bad_delivery_range`` (read it on the instance that made it, or acknowledge
   past it).
   Recovery replays the same decisions from the journal; records below the
   checkpoint's position are not applied to a restored consumer again (cut-offs make
   them not idempotent).
"""

from __future__ import annotations

import logging
import math
import struct
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate
from typing import Final, Iterable

import msgspec

from conveyor import errors, records
from conveyor.config.model import Semantics
from conveyor.protocol.bookmarks import format_bookmark
from conveyor.engine.cache import Columns, Fetched, MessageCache, fetched_columns
from conveyor.engine.delivery import QueueDelivery
from conveyor.engine.outbox import Outbox
from conveyor.engine.replication.ownership import ReplicatedQueues
from conveyor.engine.ports import JournalPort
from conveyor.engine.queue.queue import AckOption, Consumer, Event, TakeBack
from conveyor.engine.queue.bindings import QueueBinding, QueueBindings
from conveyor.engine.queue.events import Acknowledged, LeaseExpired
from conveyor.engine.queue.replica import ident_of
from conveyor.protocol import messages as m
from conveyor.protocol import replies
from conveyor.engine.rows import NamedConsumerState, NamedConsumerStats

log = logging.getLogger("conveyor.engine")

_MESSAGE: Final = m.Message  # read as a C variable when compiled; ``m.Message`` is a dict lookup

#: Deliveries one fetch may return; the client pages (``read()`` fetches in pages).
FETCH_DELIVERIES_MAX = 100_000
#: A columnar fetch's pages (``_pages``): at most this many messages, and this many bytes
#: of bodies unless a single body is larger.
FETCH_PAGE_MESSAGES = 4096
FETCH_PAGE_BYTES = 4 * 1024 * 1024

#: The position of a delivery whose message this instance no longer finds (rule 8).
GONE = records.GONE

#: On a replicated queue an epoch is ``round << EPOCH_TAG_BITS | tag`` (rule 8): the round
#: from the claimer's clock in hundredths of a second, the tag from its name. Below 2**53
#: until the year 2600, so JSON readers in any language keep it exact.
EPOCH_TAG_BITS = 12


def next_epoch(epoch: int, instance: str, now: float) -> int:
    """The epoch a claim on ``instance`` at ``now`` takes after ``epoch`` (rule 8).

    A later claim wins: the round is the claimer's clock (at least one more than the
    last round), so when two instances take claims without having seen each other's
    (a query that failed over while the link was down), every instance adopts the later
    one, the query's. The instance's tag keeps two claims in one round apart and orders
    them the same way everywhere."""
    tag = zlib.crc32(instance.encode()) & ((1 << EPOCH_TAG_BITS) - 1)
    return max((epoch >> EPOCH_TAG_BITS) + 1, int(now * 100)) << EPOCH_TAG_BITS | tag


#: Claims each consumer remembers for cut_for: a lease or ack made under an epoch older
#: than all of them counts up to the oldest one's D (an approximation no failover reaches).
CUTS_KEPT = 32

CONSUMER_RECORDS = (records.ConsumerLeasedRec, records.ConsumerAckedRec, records.ConsumerClaimedRec,
                    records.ConsumerReplicatedRec)
ConsumerRecord = (records.ConsumerLeasedRec | records.ConsumerAckedRec | records.ConsumerClaimedRec
                  | records.ConsumerReplicatedRec)


class NamedConsumer:
    """The durable state of one named consumer (rule 1) and a few counters."""

    __slots__ = ("queue", "name", "d", "acked", "epoch", "cuts", "token", "positions", "consumer",
                 "leased", "reoffered", "taken_back", "expired_leases")

    def __init__(self, queue: str, name: str) -> None:
        self.queue = queue
        self.name = name
        self.d = 0  # D: the last delivery number
        self.acked = 0  # A: every delivery <= A is acknowledged
        self.epoch = 0  # 0: never claimed (no fencing)
        # (epoch, D when claimed) of the last claims, D rising, the current claim last:
        # how far a record of an older epoch still counts (cut_for; rule 8)
        self.cuts: list[tuple[int, int]] = []
        self.token = ""
        self.positions = array("q")  # positions[i]: message of delivery A + 1 + i
        self.consumer: Consumer | None = None  # the queue's Consumer, made on first live use
        self.leased = 0  # counters since start
        self.reoffered = 0
        self.taken_back = 0
        self.expired_leases = 0

    def position(self, d: int) -> int:
        return self.positions[d - self.acked - 1]

    @property
    def claim_d(self) -> int:
        """D when the current epoch was claimed (rule 8; 0: never claimed)."""
        return self.cuts[-1][1] if self.cuts else 0

    def claimed(self, epoch: int, token: str, d: int) -> None:
        """A claim of ``epoch`` by a claimer that knew deliveries up to ``d`` (rule 8)."""
        self.epoch, self.token = epoch, token
        cuts = self.cuts
        while cuts and cuts[-1][1] >= d:
            cuts.pop()  # a later claim that knew no more cuts at least as deep
        cuts.append((epoch, d))
        if len(cuts) > CUTS_KEPT:
            del cuts[0]

    def cut_for(self, epoch: int) -> int:
        """The last delivery that a lease or ack made under ``epoch``, older than the
        current one, still counts for: the least that any later claim knew (rule 8)."""
        for claimed, d in self.cuts:  # epochs and d both rise
            if claimed > epoch:
                return d
        return self.claim_d

    def export_state(self) -> NamedConsumerState:
        """What the checkpoint keeps (rule 6)."""
        return NamedConsumerState(self.d, self.acked, self.epoch, self.token, list(self.positions), self.claim_d,
                                  list(self.cuts))

    @classmethod
    def from_state(cls, queue: str, name: str, state: NamedConsumerState) -> NamedConsumer:
        c = cls(queue, name)
        c.d, c.acked, c.epoch, c.token = state.d, state.acked, state.epoch, state.token
        c.positions = array("q", state.positions)
        # older checkpoints kept only the current claim's D, or not even that (then
        # everything known was the claimer's)
        claim_d = c.d if state.claim_d < 0 else state.claim_d
        c.cuts = [(e, d) for e, d in state.cuts] or ([(c.epoch, claim_d)] if c.epoch else [])
        return c

    def statistics(self) -> NamedConsumerStats:
        return NamedConsumerStats(self.queue, self.name, self.d, self.acked, self.epoch, self.d - self.acked,
                                  self.leased, self.reoffered, self.taken_back, self.expired_leases)


_TAKE_BACK_COUNTERS = {
    TakeBack.RENEWED: "renewed",
    TakeBack.TAKEN: "taken",
    TakeBack.ELSEWHERE: "held_elsewhere",
    TakeBack.DONE: "done",
}


class NamedConsumers:
    """Every named consumer, by (queue, name), and the commands that drive them."""

    def __init__(self, bindings: QueueBindings, delivery: QueueDelivery, journal: JournalPort, cache: MessageCache,
                 outbox: Outbox, replicated_queues: ReplicatedQueues | None = None) -> None:
        """``replicated_queues``: the replicated queues, when this instance has any (rule 7)."""
        self._bindings = bindings
        self._delivery = delivery
        self._journal = journal
        self._cache = cache
        self._outbox = outbox
        self._named: dict[tuple[str, str], NamedConsumer] = {}
        self._restored_below = 0  # records below it are in the restored consumers' state (replay)
        self.replicated_queues = replicated_queues

    def __len__(self) -> int:
        return len(self._named)

    def get(self, queue: str, name: str) -> NamedConsumer | None:
        return self._named.get((queue, name))

    # --- commands ------------------------------------------------------------------------

    def handle(self, conn: int, cmd: m.Command, now: float) -> None:
        result: (replies.HeadReply | replies.ConsumerInfoReply | replies.ClaimReply | replies.LeaseReply
                 | replies.AckThroughReply | replies.ExtendReply | replies.ReclaimReply)
        match cmd:
            case m.Fetch():
                self._fetch(conn, cmd)
                return
            case m.Head():
                self._queue(cmd.queue)
                result = replies.HeadReply(upto=self._journal.end)  # every message queued now is below it
            case m.ConsumerInfo():
                self._queue(cmd.queue)
                c = self._named.get((cmd.queue, cmd.consumer)) or NamedConsumer(cmd.queue, cmd.consumer)
                result = replies.ConsumerInfoReply(d=c.d, acked=c.acked, epoch=c.epoch, unacked=c.d - c.acked)
            case m.Claim():
                result = self._claim(cmd, now)
            case m.Lease():
                result = self._lease(cmd, now)
            case m.AckThrough():
                result = self._ack_through(cmd, now)
            case m.Extend():
                c = self.fenced(cmd.queue, cmd.consumer, cmd.epoch)
                _check_ttl(cmd.ttl)
                renewed = self._bindings.by_name[c.queue].queue.named.renew(self._seat(c), None, now + cmd.ttl)
                result = replies.ExtendReply(renewed=renewed)
            case m.Reclaim():
                result = self._reclaim(cmd, now)
            case _:
                raise errors.UnknownCommand(f"not a named-consumer command: {type(cmd).__name__}")
        # Sent once every record so far is persisted: a reply never names a delivery a
        # crash, or a failover to a sync destination, could take back (rules 2 and 7).
        self._outbox.send_when_persisted(conn, m.Ack(ack_type="processed", cid=cmd.cid, result=result))

    def _claim(self, cmd: m.Claim, now: float) -> replies.ClaimReply:
        """Rule 4, and rule 8 on a replicated queue: an epoch no other instance picks, and
        the claimer's unacknowledged deliveries in the record."""
        c = self._state(cmd.queue, cmd.consumer)
        if self.replicated_queues is None or self._bindings.by_name[c.queue].ownership is None:
            c.claimed(c.epoch + 1, cmd.token, c.d)
            rec = records.ConsumerClaimedRec(c.queue, c.name, c.epoch, c.token, c.d)
        else:
            c.claimed(next_epoch(c.epoch, self.replicated_queues.instance, now), cmd.token, c.d)
            rec = records.ConsumerClaimedRec(c.queue, c.name, c.epoch, c.token, c.d, c.acked, c.positions.tolist())
        self._journal.append(records.encode(rec))
        return replies.ClaimReply(epoch=c.epoch, d=c.d, acked=c.acked)

    def _lease(self, cmd: m.Lease, now: float) -> replies.LeaseReply:
        c = self.fenced(cmd.queue, cmd.consumer, cmd.epoch)
        _check_ttl(cmd.ttl)
        if cmd.max < 0:
            raise errors.InvalidOption(f"max must be >= 0, not {cmd.max}")
        self._check_range(c, cmd.after, cmd.after)
        queue = self._bindings.by_name[c.queue].queue
        deadline = now + cmd.ttl
        if cmd.after < c.d:
            hi = c.d if cmd.max == 0 else min(c.d, cmd.after + cmd.max)
            outcomes = self._take_back_range(c, cmd.after, hi, now, deadline)
            c.reoffered += hi - cmd.after
            return replies.LeaseReply(d=hi, leased=0, reoffered=hi - cmd.after, D=c.d, **outcomes)
        positions, counts = queue.named.lease_next(self._seat(c), cmd.max or None, now, deadline, cmd.upto)
        if (self.replicated_queues is not None and self._bindings.by_name[c.queue].ownership is not None
                and (not cmd.max or len(positions) < cmd.max)):
            # rule 7: with proxied transfer on, the messages of an unreachable owner too
            more = cmd.max - len(positions) if cmd.max else None
            # not the messages of deliveries still unacknowledged (leased on the owner
            # before it went away): a new delivery number would give them out twice
            self.replicated_queues.claim_for_lease(c.queue, more, math.inf if cmd.upto is None else cmd.upto, now,
                                                   lambda: self._unacknowledged(c.queue))
            claimed, claimed_counts = queue.named.lease_next(self._seat(c), more, now, deadline, cmd.upto)
            positions += claimed
            counts += claimed_counts
        if positions:
            rec = records.ConsumerLeasedRec(c.queue, c.name, c.d + 1, positions, counts, c.epoch)
            self._journal.append(records.encode(rec))
            _extend(c.positions, positions)
            c.d += len(positions)
            c.leased += len(positions)
            self._cache.plan_leased(positions)  # its fetch comes next: read ahead meanwhile (cache.py)
        return replies.LeaseReply(d=c.d, leased=len(positions), reoffered=0, D=c.d)

    def _reclaim(self, cmd: m.Reclaim, now: float) -> replies.ReclaimReply:
        c = self.fenced(cmd.queue, cmd.consumer, cmd.epoch)
        _check_ttl(cmd.ttl)
        if cmd.lo > cmd.hi or cmd.hi > c.d or cmd.lo < 0:
            raise errors.BadDeliveryRange(
                f"reclaim ({cmd.lo}, {cmd.hi}]: consumer {c.name!r} of queue {c.queue!r} has deliveries up to {c.d}",
                lo=cmd.lo, hi=cmd.hi, d=c.d,
            )
        done = max(0, min(cmd.hi, c.acked) - cmd.lo)  # acknowledged already
        counts = self._take_back_range(c, max(cmd.lo, c.acked), cmd.hi, now, now + cmd.ttl)
        return replies.ReclaimReply(renewed=counts["renewed"] + counts["taken"],
                                    held_elsewhere=counts["held_elsewhere"], done=counts["done"] + done)

    def _take_back_range(self, c: NamedConsumer, lo: int, hi: int, now: float, deadline: float) -> dict[str, int]:
        """Re-offer deliveries ``(lo, hi]`` (lo >= A): renew, take back, or report."""
        binding = self._bindings.by_name[c.queue]
        consumer = self._seat(c)
        counts = dict.fromkeys(_TAKE_BACK_COUNTERS.values(), 0)
        for d in range(lo + 1, hi + 1):
            p = c.position(d)
            if p == GONE:
                counts["done"] += 1
                continue
            outcome = binding.queue.named.take_back(consumer, p, now, deadline, self._priority_of(binding, p))
            counts[_TAKE_BACK_COUNTERS[outcome]] += 1
        c.taken_back += counts["taken"]
        return counts

    def _ack_through(self, cmd: m.AckThrough, now: float) -> replies.AckThroughReply:
        c = self.fenced(cmd.queue, cmd.consumer, cmd.epoch)
        if cmd.d > c.d:
            raise errors.BadDeliveryRange(
                f"ack_through {cmd.d}: consumer {c.name!r} of queue {c.queue!r} has deliveries up to {c.d}",
                d=c.d, through=cmd.d,
            )
        if cmd.d <= c.acked:
            return replies.AckThroughReply(acked=c.acked)  # idempotent
        binding = self._bindings.by_name[c.queue]
        n = cmd.d - c.acked
        positions = c.positions[:n].tolist()
        if GONE in positions:
            positions = [p for p in positions if p != GONE]
        freed_elsewhere = False
        if binding.queue.named.acknowledge_held(self._seat(c), positions, now):
            removed = positions  # all still leased to it: the batch's one pass
        else:
            result = binding.queue.acknowledge(positions, by=None, option=AckOption.NONE, now=now)
            removed = [e.position for e in result.events if type(e) is Acknowledged]
            # a lapsed delivery acked in another subscriber's hands frees its backlog
            freed_elsewhere = any(not isinstance(key, tuple) or key[0] != "named" for key in result.freed)
        self._journal.append(records.encode(records.ConsumerAckedRec(c.queue, c.name, cmd.d, removed, c.epoch)))
        del c.positions[:n]
        c.acked = cmd.d
        self._delivery.mark(binding)
        if freed_elsewhere:
            self._delivery.mark_all()
        return replies.AckThroughReply(acked=c.acked)

    def _fetch(self, conn: int, cmd: m.Fetch) -> None:
        self._queue(cmd.queue)
        c = self._named.get((cmd.queue, cmd.consumer)) or NamedConsumer(cmd.queue, cmd.consumer)
        self._check_range(c, cmd.lo, cmd.hi)
        if cmd.hi - cmd.lo > FETCH_DELIVERIES_MAX:
            raise errors.BadDeliveryRange(
                f"fetch ({cmd.lo}, {cmd.hi}]: at most {FETCH_DELIVERIES_MAX} deliveries per fetch; page it",
                lo=cmd.lo, hi=cmd.hi,
            )
        positions = c.positions[cmd.lo - c.acked:cmd.hi - c.acked]  # deliveries lo+1..hi
        if GONE in positions:
            gone = cmd.lo + 1 + positions.index(GONE)
            raise errors.BadDeliveryRange(
                f"fetch ({cmd.lo}, {cmd.hi}]: the message of delivery {gone} was acknowledged on this "
                "instance before the delivery arrived from the instance that made it: read the range there, "
                "or acknowledge past it", lo=cmd.lo, hi=cmd.hi,
            )
        cid, queue, wanted = cmd.cid, c.queue, positions.tolist()
        found = self._cache.get_many(wanted)  # the journal keeps the bodies: retention_floor
        if cmd.columns:
            pages = _pages(cmd.lo, wanted, found, cid, queue, packed=cmd.packed)
            self._outbox.send_all(conn, [*pages, m.Ack(ack_type="processed", cid=cid,
                                                       result=replies.FetchDone(count=len(positions)))])
            return
        out: list[m.Message | m.Ack] = [
            _MESSAGE(topic=entry.topic, data=entry.data, bookmark=format_bookmark(entry.publisher, entry.seq, p),
                     seq=entry.seq, timestamp=entry.timestamp, correlation_id=entry.correlation_id,
                     query_id=cid, queue=queue, delivery=d, publisher=entry.publisher)
            for d, p, entry in zip(range(cmd.lo + 1, cmd.hi + 1), wanted, found)
        ]
        out.append(m.Ack(ack_type="processed", cid=cid, result=replies.FetchDone(count=len(out))))
        self._outbox.send_all(conn, out)

    # --- helpers ---------------------------------------------------------------------------

    def _queue(self, name: str) -> QueueBinding:
        binding = self._bindings.get(name)
        if binding is None:
            raise errors.UnknownTopic(f"{name!r} is not a queue")
        if binding.config.semantics is not Semantics.AT_LEAST_ONCE:
            raise errors.InvalidOption(
                f"queue {name!r} is at-most-once: named consumers (lease, fetch, ack_through) need an "
                "at-least-once queue"
            )
        return binding

    def _state(self, queue: str, name: str) -> NamedConsumer:
        self._queue(queue)
        if not name:
            raise errors.InvalidOption("a named consumer needs a name")
        c = self._named.get((queue, name))
        if c is None:
            c = self._named[(queue, name)] = NamedConsumer(queue, name)
        return c

    def fenced(self, queue: str, name: str, epoch: int) -> NamedConsumer:
        """The consumer, if ``epoch`` is its current one (rule 4); else ``fenced``."""
        c = self._state(queue, name)
        if c.epoch and epoch != c.epoch:
            raise errors.Fenced(
                f"consumer {c.name} of queue {c.queue} was claimed by a newer holder (epoch {c.epoch})",
                epoch=c.epoch,
            )
        return c

    def check_fence(self, fence: m.ConsumerFence) -> None:
        """A commit's fence (txn.py rule 5): ``fenced`` if the epoch is stale,
        ``bad_delivery_range`` if ``through`` is not one of the consumer's deliveries."""
        c = self.fenced(fence.queue, fence.consumer, fence.epoch)
        if fence.through > c.d:
            raise errors.BadDeliveryRange(
                f"commit fence: consumer {c.name!r} of queue {c.queue!r} has deliveries up to {c.d}, "
                f"not {fence.through}", d=c.d, through=fence.through,
            )

    def ack_fence(self, fence: m.ConsumerFence, now: float) -> None:
        """Acknowledge a committed fence's deliveries, as ``ack_through`` does."""
        self._ack_through(m.AckThrough(queue=fence.queue, consumer=fence.consumer, d=fence.through,
                                       epoch=fence.epoch), now)

    @staticmethod
    def _check_range(c: NamedConsumer, lo: int, hi: int) -> None:
        if lo > hi or hi > c.d:
            raise errors.BadDeliveryRange(
                f"deliveries ({lo}, {hi}]: consumer {c.name!r} of queue {c.queue!r} has deliveries up to {c.d} "
                "(a checkpoint of another server or consumer?)",
                lo=lo, hi=hi, d=c.d,
            )
        if lo < c.acked:
            raise errors.BadDeliveryRange(
                f"deliveries ({lo}, {hi}]: consumer {c.name!r} of queue {c.queue!r} acknowledged every "
                f"delivery up to {c.acked}; they are no longer kept",
                lo=lo, hi=hi, acked=c.acked,
            )

    def _seat(self, c: NamedConsumer) -> Consumer:
        if c.consumer is None:
            c.consumer = self._bindings.by_name[c.queue].queue.named.consumer(c.name)
        return c.consumer

    def _priority_of(self, binding: QueueBinding, position: int) -> int | None:
        if binding.priority is None:
            return None
        return binding.priority_of(self._cache.get(position))

    def count_expiries(self, binding: QueueBinding, events: Iterable[Event]) -> None:
        """Statistics: which lease expiries were named consumers'."""
        if not self._named:
            return
        lapsed = {e.position for e in events if type(e) is LeaseExpired}
        if not lapsed:
            return
        for c in self._named.values():
            if c.queue == binding.name and c.d > c.acked:
                c.expired_leases += sum(1 for p in c.positions if p in lapsed)

    def statistics(self) -> tuple[NamedConsumerStats, ...]:
        return tuple(c.statistics() for c in self._named.values())

    # --- checkpoint, retention, recovery ------------------------------------------------

    def export_state(self) -> dict[str, dict[str, NamedConsumerState]]:
        out: dict[str, dict[str, NamedConsumerState]] = {}
        for (queue, name), c in self._named.items():
            out.setdefault(queue, {})[name] = c.export_state()
        return out

    def _unacknowledged(self, queue: str) -> set[int]:
        """The positions of every named consumer's unacknowledged deliveries of ``queue``."""
        return {p for c in self._named.values() if c.queue == queue for p in c.positions}

    def floor(self) -> int | None:
        """The lowest position an unacked delivery needs (fetch reads it from the log)."""
        return min((p for c in self._named.values() for p in c.positions if p != GONE), default=None)

    def restore(self, state: dict[str, dict[str, NamedConsumerState]], position: int = 0) -> None:
        """The checkpoint's consumers, whose state holds every record below ``position``."""
        self._restored_below = position
        for queue, consumers in state.items():
            for name, s in consumers.items():
                self._named[(queue, name)] = NamedConsumer.from_state(queue, name, s)

    def replay(self, pos: int, rec: ConsumerRecord, now: float, point: int, since: int | None) -> None:
        """Rule 6: the consumer's own state, then the record's effect on the queue.
        ``point``: the queue's recovery point; ``since``: the events_from of a restored
        FileBackedMetadata snapshot (None: no snapshot)."""
        if pos >= self._restored_below:
            # Below it, the checkpoint's consumer state holds the record already; applying
            # it again is not idempotent once a replicated claim cut deliveries off (rule 8).
            self._replay_state(rec)
        binding = self._bindings.get(rec.queue)
        if binding is None or type(rec) is records.ConsumerReplicatedRec:
            return  # rule 7: a replicated record changes nothing in the queue here
        queue = binding.queue
        if since is not None:
            if pos < since:
                return  # its effect on the queue is in the snapshot already
            point = 0
        if type(rec) is records.ConsumerLeasedRec:
            for p, count in zip(rec.positions, rec.counts):
                if p >= point:
                    queue.replay.delivered(p, now, count=count)
        elif type(rec) is records.ConsumerAckedRec:
            for p in rec.positions:
                if p >= point:
                    queue.replay.acknowledged(p)
        if binding.config.target_queue_depth is not None:
            binding.refill(self._journal, upto=pos, now=now)

    def _replay_state(self, rec: ConsumerRecord) -> None:
        key = (rec.queue, rec.consumer)
        c = self._named.get(key)
        if c is None:
            c = self._named[key] = NamedConsumer(rec.queue, rec.consumer)
        match rec:
            case records.ConsumerReplicatedRec():
                self._apply_replicated(rec)
            case records.ConsumerLeasedRec():
                if rec.first > c.d + 1:
                    # the records before it are gone (retention with no checkpoint)
                    log.warning("consumer %s of queue %s: deliveries %d..%d unknown; skipping to %d",
                                c.name, c.queue, c.d + 1, rec.first - 1, rec.first)
                    c.d = c.acked = rec.first - 1
                    c.positions = array("q")
                if rec.first == c.d + 1:
                    c.positions.extend(rec.positions)
                    c.d += len(rec.positions)
            case records.ConsumerAckedRec():
                if rec.through > c.acked:
                    del c.positions[: max(0, min(rec.through, c.d) - c.acked)]
                    c.acked = rec.through
                    c.d = max(c.d, rec.through)
            case records.ConsumerClaimedRec():
                if rec.epoch > c.epoch:
                    c.claimed(rec.epoch, rec.token, rec.d if rec.d >= 0 else c.d)

    # --- replicated queues (rule 7) ------------------------------------------------------------

    def replicated(self, rec: records.ConsumerReplicatedRec,
                   pending: Callable[[int, int], int | None] | None = None) -> records.ConsumerReplicatedRec | None:
        """Apply a consumer's record from another instance; the record to journal here
        (with this instance's positions), or None when it changes nothing. ``pending``:
        the position of a publish journaled here but not applied yet (the same batch)."""
        binding = self._bindings.get(rec.queue)
        if binding is None or binding.ownership is None:
            return None
        c = self._named.get((rec.queue, rec.consumer))
        if rec.kind == "lease":
            if c is not None and self._fenced_out(c, rec):
                return None
            if rec.n != (c.d if c is not None else 0) + 1:
                if c is None or rec.n > c.d + 1:
                    log.error("consumer %s of queue %s: deliveries from %d arrived from %s, this instance knows "
                              "up to %d: not recorded (a failover here cannot continue them)",
                              rec.consumer, rec.queue, rec.n, rec.origin, c.d if c is not None else 0)
                return None
            rec = msgspec.structs.replace(rec, positions=self._positions_here(binding, rec, rec.n, pending))
        elif rec.kind == "claim" and rec.acked >= 0:
            if c is not None and rec.n <= c.epoch:
                return None  # _apply_replicated would refuse it: map nothing
            rec = msgspec.structs.replace(rec, positions=self._positions_here(binding, rec, rec.acked + 1, pending))
        return rec if self._apply_replicated(rec) else None

    @staticmethod
    def _positions_here(binding: QueueBinding, rec: records.ConsumerReplicatedRec, first: int,
                        pending: Callable[[int, int], int | None] | None) -> list[int]:
        """The positions here of the messages a lease or claim names by identity, its
        deliveries numbered from ``first``; GONE for a message gone here (rule 8)."""
        replica = binding.queue.replica
        positions: list[int] = []
        for publisher, seq in zip(rec.publishers, rec.seqs):
            p = GONE if publisher == GONE else replica.position_recorded(ident_of(publisher, seq))
            if p is None and pending is not None:
                p = pending(publisher, seq)
            if p is None:
                # Acknowledged here long ago (rule 8: a failover after an acknowledgement
                # that had not reached the claimer): keep the numbering, mark the hole.
                log.warning("consumer %s of queue %s: delivery %d from %s names a message acknowledged here "
                            "before: recorded as gone (it cannot be read again on this instance)",
                            rec.consumer, rec.queue, first + len(positions), rec.origin)
                p = GONE
            positions.append(p)
        return positions

    @staticmethod
    def _fenced_out(c: NamedConsumer, rec: records.ConsumerReplicatedRec) -> bool:
        """Rule 8: a lease made under an older epoch than this copy's, of deliveries the
        claimer of the current epoch did not know: a branch the claim cut off."""
        return rec.epoch < c.epoch and rec.n > c.cut_for(rec.epoch)

    def _apply_replicated(self, rec: records.ConsumerReplicatedRec) -> bool:
        """Rules 6 and 8 for a :class:`ConsumerReplicatedRec` (with this instance's
        positions): True when it changed the consumer. Deterministic on the consumer's
        state, so recovery replaying the journaled record repeats the decision."""
        key = (rec.queue, rec.consumer)
        c = self._named.get(key)
        if c is None:
            c = self._named[key] = NamedConsumer(rec.queue, rec.consumer)
        if rec.kind == "lease":
            if rec.n != c.d + 1 or self._fenced_out(c, rec):
                return False
            c.positions.extend(rec.positions)
            c.d += len(rec.positions)
        elif rec.kind == "ack":
            through = min(rec.n, c.d)
            if rec.epoch < c.epoch:
                through = min(through, c.cut_for(rec.epoch))  # the rest were deliveries of a cut-off branch
            if through <= c.acked:
                return False
            del c.positions[: through - c.acked]
            c.acked = through
        else:  # claim
            if rec.n <= c.epoch:
                return False
            known = rec.through if rec.through >= 0 else c.d
            if rec.acked >= 0:
                # The claimer's deliveries, exactly: numbered as it numbers them. An ack
                # made here under an older epoch counts up to ``known``, as it does there.
                acked = max(rec.acked, min(c.acked, known))
                c.positions = array("q", rec.positions[acked - rec.acked:])
                c.acked, c.d = acked, known
            elif c.d > known:
                # Deliveries made here (or received) that the claimer never saw: its
                # next lease numbers other messages from known + 1, so these go.
                if c.acked >= known:
                    c.acked = known
                    del c.positions[:]
                else:
                    del c.positions[known - c.acked:]
                c.d = known
            c.claimed(rec.n, rec.token, known)
        return True

    def lease_after_restart(self, now: float) -> None:
        """Rule 5: unacked deliveries stay with their consumer for one LeasePeriod."""
        for c in self._named.values():
            binding = self._bindings.get(c.queue)
            if binding is None or not c.positions or binding.config.semantics is not Semantics.AT_LEAST_ONCE:
                continue
            consumer = self._seat(c)
            deadline = now + binding.config.lease_period_s
            for p in c.positions:
                if p != GONE:
                    binding.queue.named.take_back(consumer, p, now, deadline, self._priority_of(binding, p))


def _pages(lo: int, positions: list[int], entries: list[Fetched], cid: str | None, queue: str, *, packed: bool
           ) -> list[m.FetchPage | m.FetchPacked]:
    """A columnar fetch's answer: deliveries ``lo + 1 ..`` of ``positions`` (bodies in
    ``entries``), in pages of at most FETCH_PAGE_MESSAGES messages and (but for a page of
    one) FETCH_PAGE_BYTES of bodies, so a frame stays far below the frame limit; each a
    FetchPacked when ``packed``, else a FetchPage."""
    datas, topics, publishers, seqs, stamps, cids = fetched_columns(entries)
    sizes = list(accumulate(map(len, datas)))
    make = _packed_page if packed else _page
    pages: list[m.FetchPage | m.FetchPacked] = []
    start, n = 0, len(entries)
    while start < n:
        below = sizes[start - 1] if start else 0
        end = min(n, start + FETCH_PAGE_MESSAGES, max(start + 1, bisect_right(sizes, below + FETCH_PAGE_BYTES)))
        part = (datas[start:end], topics[start:end], publishers[start:end], seqs[start:end], stamps[start:end],
                cids[start:end])
        pages.append(make(lo + start, positions[start:end], part, cid, queue))
        start = end
    return pages


def _page(lo: int, positions: list[int], part: Columns, cid: str | None, queue: str) -> m.FetchPage:
    datas, topics, publishers, seqs, stamps, cids = part
    return m.FetchPage(
        query_id=cid, queue=queue, lo=lo, data=datas, topics=topics, publishers=publishers, seqs=seqs,
        timestamps=stamps, positions=positions, correlation_ids=cids,
    )


def _packed_page(lo: int, positions: list[int], part: Columns, cid: str | None, queue: str) -> m.FetchPacked:
    """One FetchPacked (its buffers in Arrow's little-endian layout, docs/protocol.md)."""
    datas, topics, publishers, seqs, stamps, cids = part
    names = list(dict.fromkeys(topics))
    topic_of = b""
    if len(names) > 1:
        index = {t: i for i, t in enumerate(names)}
        topic_of = _little("H", [index[t] for t in topics])
    return m.FetchPacked(
        query_id=cid, queue=queue, lo=lo, n=len(datas), data=b"".join(datas),
        ends=_little("i", list(accumulate(map(len, datas), initial=0))), topics=names, topic_of=topic_of,
        publishers=_little("Q", publishers), seqs=_little("q", seqs), timestamps=_little("d", stamps),
        positions=_little("q", positions), correlation_ids=[] if cids.count(None) == len(cids) else cids,
    )


def _extend(positions: array[int], more: list[int]) -> None:
    """``positions.extend(more)`` in one struct call: an array extended from a list
    parses each item with the argument parser, several times the work (a lease of a
    batch numbers 200,000 at once)."""
    positions.frombytes(struct.pack(f"={len(more)}q", *more))


def _little(code: str, values: list[int] | list[float]) -> bytes:
    """``values`` as little-endian C values of ``code`` (struct's codes), whatever this
    machine's byte order: one struct call (an array built from a list parses each item
    with the argument parser, several times the work)."""
    return struct.pack(f"<{len(values)}{code}", *values)


def _check_ttl(ttl: float) -> None:
    if not ttl > 0:
        raise errors.InvalidOption(f"ttl must be > 0 seconds, not {ttl}")
