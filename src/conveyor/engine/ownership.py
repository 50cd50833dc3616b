"""Message ownership for replicated queues (docs/replication.md, "Replicated queues").

A ``Queue`` or ``GroupLocalQueue`` whose own topic is replicated is the same queue on
every instance that has it: each message is processed once, by one worker, wherever the
workers are. :class:`QueueOwnership` (one per such queue) keeps the rules; the queue
holds messages owned elsewhere in its ELSEWHERE state. Rules:

1. **Initial owner.** A ``Queue`` message belongs to the instance where it was
   published (its origin); a ``GroupLocalQueue`` message to the queue's
   ``InitialOwner``, wherever it was published. A barrier belongs to every instance
   (each delivers it once every earlier message there is acknowledged).
2. **Only the owner delivers.** Every other instance records the message (ELSEWHERE),
   shows it in the view, and keeps it until the owner reports it done.
3. **Done anywhere, done everywhere.** An acknowledgement on any instance, the owner's
   expiry (only the owner expires a message and runs the expiry actions: one dead
   letter per expiry in the whole topology) and an at-most-once delivery are replicated
   as :class:`~conveyor.records.QueueRemovedRec`, naming messages by ``(publisher,
   seq)``. A removal that arrives before its message leaves a tombstone, so the message
   never enters the queue.
4. **Transfer requests.** An instance that has a subscriber with room asks the owner for
   a message owned elsewhere once it has waited here longer than acknowledgements
   usually take to arrive after their message (measured per queue: the 90th percentile
   of the last :data:`LATENCY_SAMPLES` arrival-to-ack times, :data:`WAIT_DEFAULT_S`
   before there is any): a keeping-up owner is not asked. A request is a journal
   record (:class:`~conveyor.records.TransferRequestRec`), so it reaches the owner
   through any topology; an unanswered request is repeated after the same wait.
5. **Grants.** The owner grants a request only when no subscriber of its own can take
   the message now (it always prefers a local subscriber), and only once: the grant
   raises the message's transfer ``epoch``, and any later request finds it owned
   elsewhere. The grant (:class:`~conveyor.records.TransferRec`, with the message's
   delivery and cancel counts) is journaled and replicated to every instance; each
   applies the highest epoch it has seen (ties: the smaller granter name), so all
   converge on one owner.
6. **Proxied transfer** (disaster recovery), per queue and per instance, off by default
   and not kept across a restart: while on, this instance may take a message whose
   owner it cannot reach (no link to or from it) when one of its subscribers could
   receive it now, and may grant requests for such messages, journaling the transfer
   with ``proxied`` set. It takes nothing by itself when switched on. If the owner is in
   fact alive and delivering, a message may be processed twice: switch it on only on
   one instance, for an owner that is down.
7. **Two copies of one message.** When a publisher fails over and publishes on B a
   message A had recorded but not yet replicated, A and B each record it as theirs.
   When each sees the other's copy arrive (a duplicate, dropped), both settle on the
   instance with the smaller name as its owner, with a journaled transfer; until then
   both may deliver it (at-least-once across a publisher failover).
8. Limits travel with the message: delivery and cancel counts move with a transfer
   (``MaxDeliveries`` and ``MaxCancels`` count across instances); ``Expiration`` is
   measured from the original publish time, which is the same everywhere.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from typing import Any, Callable

import msgspec

from conveyor import records
from conveyor.config.model import QueueKind
from conveyor.engine.queue import Event, Queue
from conveyor.engine.queue_events import Acknowledged, BarrierDelivered, DeliveredAtMostOnce, Expired

_GONE = (Acknowledged, Expired, DeliveredAtMostOnce, BarrierDelivered)

log = logging.getLogger("conveyor.replication")

LATENCY_SAMPLES = 256  # arrival-to-ack samples kept per queue (rule 4)
WAIT_DEFAULT_S = 2.0  # before any sample: how long a message waits before it is requested
WAIT_MIN_S = 0.05  # never ask sooner than this, however fast the owner acknowledges
REQUEST_SCAN_S = 0.05  # how often the messages owned elsewhere are looked over for requests
REQUESTS_PER_ROOM = 4  # requests in flight per free backlog slot: a grant takes a round trip
REQUESTS_IN_FLIGHT_MIN = 64  # ... and at least this many, while any slot is free
TOMBSTONES_MAX = 100_000  # removals seen before their message (rule 3), per queue

Ident = tuple[int, int]  # (publisher, seq)


class OwnershipStats(msgspec.Struct, frozen=True):
    queue: str
    proxied_transfer: bool
    requests_sent: int
    grants: int  # requests this instance granted
    proxied_claims: int
    conflicts: int  # rule 7
    typical_ack_s: float | None  # what a message waits here before it is requested


class QueueOwnership:
    """Rules 1-8 for one replicated queue on this instance."""

    def __init__(self, instance: str, queue: Queue, *, kind: QueueKind, initial_owner: str | None) -> None:
        self.instance = instance
        self.queue = queue
        self.name = queue.name
        self._group_local = kind is QueueKind.GROUP_LOCAL
        self._initial_owner = initial_owner
        self.proxied = False
        self._positions: dict[Ident, int] = {}  # messages in the queue here, by identity
        self._idents: dict[int, Ident] = {}
        self._epochs: dict[Ident, tuple[int, str, str]] = {}  # (epoch, owner, granter) after a transfer
        self._tombstones: OrderedDict[Ident, str] = OrderedDict()
        self._requested: dict[Ident, tuple[float, int]] = {}  # (when, attempt) of our last request
        self._latency: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._scanned = -1e18  # when requests() last looked
        self._wait: float | None = None  # cached 90th percentile of _latency
        self.requests_sent = self.grants = self.proxied_claims = self.conflicts = 0

    # --- rule 1 -------------------------------------------------------------------------

    def owner_for(self, origin: str, barrier: bool) -> str | None:
        """The owner of a message entering the queue (None: this instance)."""
        if barrier:
            return None
        owner = (self._initial_owner or self.instance) if self._group_local else (origin or self.instance)
        return None if owner == self.instance else owner

    def entering(self, ident: Ident, position: int, origin: str, barrier: bool) -> tuple[bool, str | None]:
        """Whether a message enters (False: removed elsewhere already, rule 3) and its
        owner (None: this instance)."""
        if self._tombstones.pop(ident, None) is not None:
            return False, None
        owner = self.owner_for(origin, barrier)
        transferred = self._epochs.get(ident)
        if transferred is not None and not barrier:
            owner = None if transferred[1] == self.instance else transferred[1]
        self._positions[ident] = position
        self._idents[position] = ident
        return True, owner

    def position(self, ident: Ident) -> int | None:
        return self._positions.get(ident)

    def ident(self, position: int) -> Ident | None:
        return self._idents.get(position)

    def gone(self, events: list[Event]) -> None:
        """The queue's events: forget the identity of every message that left."""
        for ev in events:
            if isinstance(ev, _GONE):
                ident = self._idents.pop(ev.position, None)
                if ident is not None:
                    self._positions.pop(ident, None)
                    self._requested.pop(ident, None)
                    self._epochs.pop(ident, None)

    # --- rule 3 ----------------------------------------------------------------------------------

    def removed(self, ident: Ident, kind: str, now: float) -> list[Event] | None:
        """A replicated removal: the queue's events (None: unknown here, tombstoned; []:
        nothing to do)."""
        position = self._positions.get(ident)
        if position is None:
            self._tombstones[ident] = kind
            if len(self._tombstones) > TOMBSTONES_MAX:
                self._tombstones.popitem(last=False)
            return None
        arrived = self.queue.arrival_of(position)
        events = self.queue.remove_replicated(position, kind, now)
        if arrived is not None and events and kind == "ack":
            self._latency.append(max(0.0, now - arrived))
            self._wait = None
        self.gone(events)
        return events

    # --- rules 4-6 -----------------------------------------------------------------------------------

    def typical_wait(self) -> float:
        """Rule 4: how long a message owned elsewhere waits here before it is requested."""
        if self._wait is None:
            if not self._latency:
                self._wait = WAIT_DEFAULT_S
            else:
                ordered = sorted(self._latency)
                self._wait = max(WAIT_MIN_S, ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))])
        return self._wait

    def requests(self, now: float, reachable: Callable[[str], bool]) -> tuple[list[records.TransferRequestRec],
                                                                           list[records.TransferRec]]:
        """Rules 4 and 6: the requests to journal now, and the proxied claims. Up to
        :data:`REQUESTS_PER_ROOM` requests per free backlog slot are in flight, so the
        round trip of a grant does not leave subscribers idle."""
        queue = self.queue
        if now - self._scanned < REQUEST_SCAN_S:
            return [], []
        self._scanned = now
        free = queue.room()
        room = max(free * REQUESTS_PER_ROOM, REQUESTS_IN_FLIGHT_MIN if free else 0) - len(self._requested)
        if room <= 0 or not queue.elsewhere_count():
            return [], []
        wait = self.typical_wait()
        asks: list[records.TransferRequestRec] = []
        claims: list[records.TransferRec] = []
        for position, owner, arrived in queue.elsewhere():
            if len(asks) + len(claims) >= room:
                break
            if now - arrived < wait:
                continue
            ident = self._idents.get(position)
            if ident is None or not queue.can_deliver_locally(position, now):
                continue
            if not reachable(owner):
                if self.proxied:
                    claims.append(self._transfer(ident, position, self.instance, proxied=True))
                continue
            last = self._requested.get(ident)
            if last is not None and now - last[0] < max(wait, 2 * WAIT_DEFAULT_S):
                continue  # asked already: ask again only if nothing came of it
            attempt = 1 if last is None else last[1] + 1
            self._requested[ident] = (now, attempt)
            asks.append(records.TransferRequestRec(self.name, ident[0], ident[1], self.instance, attempt))
        self.requests_sent += len(asks)
        self.proxied_claims += len(claims)
        return asks, claims

    def request(self, rec: records.TransferRequestRec, now: float, reachable: Callable[[str], bool]
                ) -> records.TransferRec | None:
        """Rule 5 (and 6 for an unreachable owner): the grant to journal, if any."""
        if rec.requester == self.instance:
            return None
        ident = (rec.publisher, rec.seq)
        position = self._positions.get(ident)
        if position is None:
            return None
        queue = self.queue
        owner = queue.owner_of(position)
        if owner is None:
            if queue.state_of(position).value != "available" or queue.can_deliver_locally(position, now):
                return None  # leased here, or a subscriber here takes it: no grant
        elif not (self.proxied and not reachable(owner)):
            return None  # not ours to give
        self.grants += 1
        return self._transfer(ident, position, rec.requester, proxied=owner is not None)

    def _transfer(self, ident: Ident, position: int, to: str, *, proxied: bool) -> records.TransferRec:
        epoch = self._epochs.get(ident, (0, "", ""))[0] + 1
        deliveries, cancels = self.queue.counts_of(position)
        return records.TransferRec(self.name, ident[0], ident[1], to, self.instance, epoch, deliveries, cancels,
                                   proxied)

    def transfer(self, rec: records.TransferRec, now: float) -> bool:
        """Rule 5: apply a transfer (ours, received, or replayed); False when an earlier
        or equal one already won."""
        ident = (rec.publisher, rec.seq)
        current = self._epochs.get(ident)
        if current is not None and not (
            rec.epoch > current[0] or (rec.epoch == current[0] and rec.granter < current[2])
        ):
            return False
        self._epochs[ident] = (rec.epoch, rec.owner, rec.granter)
        position = self._positions.get(ident)
        if position is None:
            return True  # the message has not arrived here yet: it enters owned by rec.owner
        self._requested.pop(ident, None)
        if rec.owner == self.instance:
            self.queue.transfer_in(position, now, deliveries=rec.deliveries, cancels=rec.cancels)
        else:
            self.queue.transfer_out(position, rec.owner, now)
        return True

    def conflict(self, ident: Ident, other_origin: str, now: float) -> records.TransferRec | None:
        """Rule 7: a copy of a message this instance recorded arrived from another origin."""
        position = self._positions.get(ident)
        if position is None or self._group_local or ident in self._epochs:
            return None
        mine = self.queue.owner_of(position) or self.instance
        winner = min(mine, other_origin)
        if winner == mine:
            return None
        self.conflicts += 1
        log.warning("queue %s: message %s was recorded as its own by %s and by %s: %s owns it",
                    self.name, ident, mine, other_origin, winner)
        deliveries, cancels = self.queue.counts_of(position)
        return records.TransferRec(self.name, ident[0], ident[1], winner, self.instance, 1, deliveries, cancels)

    def settle_after_recovery(self) -> None:
        """Recovery replayed removals without events: forget identities that left."""
        gone = [p for p in self._idents if self.queue.state_of(p).value == "absent"]
        for p in gone:
            self._positions.pop(self._idents.pop(p), None)

    # --- checkpoints and statistics -------------------------------------------------------------

    def export_state(self) -> dict:
        return {
            "tombstones": [[p, s, k] for (p, s), k in self._tombstones.items()],
            "epochs": [[p, s, e, o, g] for (p, s), (e, o, g) in self._epochs.items()],
        }

    def restore(self, state: dict) -> None:
        for p, s, k in state.get("tombstones", ()):
            self._tombstones[(p, s)] = k
        for p, s, e, o, g in state.get("epochs", ()):
            self._epochs[(p, s)] = (e, o, g)

    def statistics(self) -> OwnershipStats:
        return OwnershipStats(self.name, self.proxied, self.requests_sent, self.grants, self.proxied_claims,
                              self.conflicts, self.typical_wait())


class ReplicatedQueues:
    """The engine part over every replicated queue of this instance: it applies what
    replication brings (removals, requests, transfers), journals what this instance
    decides (requests, grants, proxied claims, settled conflicts), and names the
    messages of local queue records for the destinations (``identify``)."""

    def __init__(self, instance: str, bindings: Any, journal: Any, cache: Any, delivery: Any,
                 reachable: Callable[[str], bool]) -> None:
        self.instance = instance
        self._bindings = bindings
        self._journal = journal
        self._cache = cache
        self._delivery = delivery
        self._reachable = reachable
        self.by_queue: dict[str, QueueOwnership] = {}
        self._seen_requests: OrderedDict[tuple, None] = OrderedDict()

    def add(self, binding: Any, config: Any) -> QueueOwnership:
        own = QueueOwnership(self.instance, binding.queue, kind=config.kind, initial_owner=config.initial_owner)
        self.by_queue[binding.name] = own
        return own

    def __bool__(self) -> bool:
        return bool(self.by_queue)

    # --- for the source side of replication ------------------------------------------------

    def identify(self, position: int) -> Ident:
        entry = self._cache.get(position)
        return entry.publisher, entry.seq

    # --- what replication brings ---------------------------------------------------------------

    def received(self, rec, now: float) -> bool:
        """Apply a queue record from another instance; True when it must be journaled
        here (it changed something, or it must travel on)."""
        own = self.by_queue.get(rec.queue)
        if own is None:
            return False
        if type(rec) is records.QueueRemovedRec:
            changed = self._remove(own, rec, now)
            return changed
        if type(rec) is records.TransferRec:
            if own.transfer(rec, now):
                self._delivery.mark(self._bindings.by_name[rec.queue])
                return True
            return False
        # a TransferRequestRec
        key = (rec.queue, rec.publisher, rec.seq, rec.requester, rec.attempt)
        if key in self._seen_requests:
            return False
        self._seen_requests[key] = None
        if len(self._seen_requests) > TOMBSTONES_MAX:
            self._seen_requests.popitem(last=False)
        grant = own.request(rec, now, self._reachable)
        if grant is not None:
            self._journal_transfer(own, grant, now)
            return False  # answered here: the grant travels instead
        position = own.position((rec.publisher, rec.seq))
        return position is None or own.queue.owner_of(position) is not None  # not ours: pass it on

    def _remove(self, own: QueueOwnership, rec: records.QueueRemovedRec, now: float) -> bool:
        changed = False
        binding = self._bindings.by_name[rec.queue]
        for ident in zip(rec.publishers, rec.seqs):
            events = own.removed(ident, rec.kind, now)
            if events is None:
                changed = True  # a tombstone: journaled so a restart keeps it
            elif events:
                changed = True
                self._delivery.removed_elsewhere(binding, events)
        return changed

    def duplicate(self, rec: records.PublishRec, origin: str, now: float) -> None:
        """A copy of a message recorded here arrived from ``origin`` (rule 7)."""
        for binding in self._bindings.for_topic(rec.topic):
            own = self.by_queue.get(binding.name)
            if own is None:
                continue
            settle = own.conflict((rec.publisher, rec.seq), origin, now)
            if settle is not None:
                self._journal_transfer(own, settle, now)

    # --- this instance's decisions -------------------------------------------------------------

    def _journal_transfer(self, own: QueueOwnership, rec: records.TransferRec, now: float) -> None:
        self._journal.append(records.encode(rec))
        own.transfer(rec, now)
        self._delivery.mark(self._bindings.by_name[rec.queue])

    def tick(self, now: float) -> None:
        """Rules 4 and 6: ask for (or, proxied, claim) messages local subscribers wait for."""
        for own in self.by_queue.values():
            asks, claims = own.requests(now, self._reachable)
            for ask in asks:
                self._journal.append(records.encode(ask))
            for claim in claims:
                log.warning("queue %s: proxied transfer: taking message %s from %s, which is unreachable",
                            own.name, (claim.publisher, claim.seq), "its owner")
                self._journal_transfer(own, claim, now)

    def set_proxied(self, queue: str, on: bool) -> bool:
        """Rule 6 (the admin action); False when ``queue`` is not a replicated queue here."""
        own = self.by_queue.get(queue)
        if own is None:
            return False
        if own.proxied != on:
            own.proxied = on
            log.warning("queue %s: proxied transfer %s", queue, "ENABLED" if on else "disabled")
        return True

    # --- recovery ------------------------------------------------------------------------------------

    def replay(self, rec, now: float) -> None:
        own = self.by_queue.get(rec.queue)
        if own is None:
            return
        if type(rec) is records.QueueRemovedRec:
            for ident in zip(rec.publishers, rec.seqs):
                own.removed(ident, rec.kind, now)
        elif type(rec) is records.TransferRec:
            own.transfer(rec, now)

    def export_state(self) -> dict:
        return {name: own.export_state() for name, own in self.by_queue.items()}

    def restore(self, state: dict) -> None:
        for name, s in state.items():
            own = self.by_queue.get(name)
            if own is not None:
                own.restore(s)

    def statistics(self) -> tuple[OwnershipStats, ...]:
        return tuple(own.statistics() for own in self.by_queue.values())
