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
   never enters the queue. A tombstone is kept for the queue's ``DeferredAckExpiration``
   (one day by default) from when this instance learned of the removal (for removals
   replayed from the journal at a restart: from the restart), and at most
   :data:`TOMBSTONES_MAX` of them, the oldest dropped first; a message that arrives
   after its tombstone is gone enters the queue as any other.
4. **Transfer requests.** An instance that has a subscriber with room asks for a
   message owned elsewhere once it has waited here longer than acknowledgements
   usually take to arrive after their message (measured per queue: the 90th percentile
   of the last :data:`LATENCY_SAMPLES` arrival-to-ack times, :data:`WAIT_DEFAULT_S`
   before there is any): a keeping-up owner is not asked. It asks whoever the owner is
   and whether or not it can reach it (an instance with proxied transfer on may answer
   for an owner that is down, rule 6), within its request budget
   (:data:`REQUESTS_PER_ROOM` per backlog slot, at least
   :data:`REQUESTS_IN_FLIGHT_MIN`, or what its subscribers take in
   :data:`ROUND_TRIPS_AHEAD` grant round trips when that is more, never above
   :data:`REQUESTS_PER_ROOM_MAX` per slot; counting the requests in flight, the proxied
   claims and the granted messages waiting here). A request is a journal record
   (:class:`~conveyor.records.TransferRequestRec`), so it reaches the owner through any
   topology (through a ``PassThrough`` instance too); an unanswered request is repeated
   after the same wait.
5. **Grants.** The owner grants a request only when no subscriber of its own can take
   the message now (it always prefers a local subscriber), and only once: the grant
   raises the message's transfer ``epoch``, and any later request finds it owned
   elsewhere. The grant (:class:`~conveyor.records.TransferRec`, with the message's
   delivery and cancel counts) is journaled and replicated to every instance; each
   applies the highest epoch it has seen (ties: the smaller granter name), so all
   converge on one owner.
6. **Proxied transfer** (disaster recovery), per queue and per instance, off by default
   and not kept across a restart: while on, this instance takes a message whose owner
   it cannot reach when one of its subscribers could receive it now, no more than the
   subscribers' free backlog (less the messages already waiting here for it) and
   within the request budget of rule 4, instead of asking for it; and it grants other
   instances' requests for such messages. Both journal the transfer with ``proxied``
   set. It takes nothing by itself when switched on. An owner is reachable while a link
   to or from it is up or, when this instance has no ``Destination`` of its own for it,
   while a linked peer's profile has a ``Destination`` for it whose ``PassThrough``
   matches this instance's group (this instance's requests get there through that
   peer; whether the peer's own link is up is not known here)
   (:meth:`~conveyor.engine.replication.links.PeerLinks.reachable`). If the owner is in
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
9. **After a start**, this instance delivers nothing of its replicated queues until its
   ``sync`` peers have caught it up (their removals and transfers made while it was
   down are applied first), or ``RecoveryCatchUpTimeout`` passes: ``catch_up.py`` and
   ``held_delivery.py``. Requests, grants and removals go on meanwhile.
10. **Delayed retries and failure reasons travel.** A cancel on the owner with a delay
   or a reason is replicated by identity (:class:`~conveyor.records.QueueCancelledRec`,
   to peers of protocol revision 1 and later), with the message's delivery and cancel
   counts. Every other instance keeps the time, the reason and the counts with its copy
   (owned elsewhere); a transfer it grants carries the time (``TransferRec.not_before``)
   and the counts (rule 8), and when the message becomes its own it holds it until then,
   counts on from there and keeps the reason for its dead letter. So a proxied transfer after the owner
   went down does not offer a message earlier than its owner would have.
11. **TargetQueueDepth.** Messages beyond the window are inactive on every instance (those
   owned elsewhere count in it); an inactive message's owner is decided when it becomes
   active (engine/queue/bindings.py rule 7). A request for a message that is inactive
   here is answered from the journal (at most :data:`READ_AHEAD_RECORDS_MAX` records read
   from the inactive part's start): if this instance owns it (or proxies for its
   unreachable owner), the grant is journaled while it stays inactive, so it becomes
   active here owned by the requester, and nothing else is activated ahead of the
   window. (The reference reads ahead into the queue up to the message and transfers
   it; granting it without activating the messages before it gives the requester the
   same message and keeps this instance's active part within TargetQueueDepth.)
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Callable, Collection

import msgspec

from conveyor import records
from conveyor.config.model import DEFERRED_ACK_EXPIRATION_S_DEFAULT, QueueKind
from conveyor.engine.queue import snapshot as queue_snapshot
from conveyor.engine.queue.expiry import earliest
from conveyor.engine.queue.queue import Event, Queue
from conveyor.engine.queue.replica import Ident, Replica, columns_of, ident_of, idents_of, publisher_of, seq_of
from conveyor.engine.queue.rows import OwnershipState, Tombstone, TransferEpoch
from conveyor.engine.queue.state import MessageState
from conveyor.engine.rows import OwnershipStats
from conveyor.engine.ports import JournalPort, QueueRecord

if TYPE_CHECKING:
    from conveyor.engine.cache import MessageCache
    from conveyor.engine.delivery import QueueDelivery
    from conveyor.engine.queue.bindings import QueueBindings

log = logging.getLogger("conveyor.replication")

LATENCY_SAMPLES = 256  # arrival-to-ack samples kept per queue (rule 4)
WAIT_DEFAULT_S = 2.0  # before any sample: how long a message waits before it is requested
WAIT_MIN_S = 0.05  # never ask sooner than this, however fast the owner acknowledges
REQUEST_SCAN_S = 0.005  # how often the messages owned elsewhere are looked over for requests
REQUESTS_PER_ROOM = 16  # messages asked for or granted and waiting here, per backlog slot
REQUESTS_IN_FLIGHT_MIN = 256  # ... and at least this many: a grant takes a round trip
ROUND_TRIPS_AHEAD = 2  # ... or what the subscribers here take in this many grant round trips
REQUESTS_PER_ROOM_MAX = 128  # ... but never more than this per backlog slot (or the minimum)
RATE_WINDOW_S = 1.0  # the subscribers' pace: backlog slots freed over about this long
RTT_WEIGHT = 0.25  # how much each new round trip moves the estimate (an average that forgets)
TOMBSTONES_MAX = 100_000  # removals seen before their message (rule 3), per queue
READ_AHEAD_RECORDS_MAX = 65_536  # journal records read to find requested inactive messages (rule 11)
# Compared by identity: an Enum's ``.value`` is a Python property, a call of the
# interpreter from compiled code.
_ABSENT, _AVAILABLE, _INACTIVE = MessageState.ABSENT, MessageState.AVAILABLE, MessageState.INACTIVE


class QueueOwnership:
    """Rules 1-8 for one replicated queue on this instance: the policy. The state of
    each message in the queue here (identity, owner, epoch, this instance's request) is
    the queue's replica part (``engine/queue/replica.py``), which the queue's own
    transitions keep; this part holds only what is not about a message here: tombstones,
    the arrival-to-ack samples, the counters."""

    def __init__(self, instance: str, queue: Queue, *, kind: QueueKind, initial_owner: str | None,
                 deferred_ack_expiration_s: float = DEFERRED_ACK_EXPIRATION_S_DEFAULT) -> None:
        self.instance = instance
        self._tombstone_s = deferred_ack_expiration_s
        self.queue = queue
        self._replica = queue.replica
        self.name = queue.name
        self._group_local = kind is QueueKind.GROUP_LOCAL
        self._initial_owner = initial_owner
        self.proxied = False
        self._tombstones: OrderedDict[Ident, tuple[str, float]] = OrderedDict()  # (kind, when), oldest first
        self._latency: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._scanned = -1e18  # when requests() last looked
        self._freed_seen = 0  # queue.transfers.slots_freed when requests() last looked
        self._freed_marks: deque[tuple[float, int]] = deque()  # (when, slots_freed) at each look, the last second
        self._round_trip: float | None = None  # request to grant, a moving average (rule 4)
        self.next_scan: float | None = None  # when requests() may have something to send (a timer wakes it)
        self._wait: float | None = None  # cached 90th percentile of _latency
        self.requests_sent = self.grants = self.proxied_claims = self.conflicts = 0

    # --- rule 1 -------------------------------------------------------------------------

    def owner_for(self, origin: str, barrier: bool) -> str | None:
        """The owner of a message entering the queue (None: this instance)."""
        if barrier:
            return None
        owner = (self._initial_owner or self.instance) if self._group_local else (origin or self.instance)
        return None if owner == self.instance else owner

    def entering(self, ident: Ident, origin: str, barrier: bool, now: float) -> tuple[bool, str | None]:
        """Whether a message enters (False: removed elsewhere already, rule 3) and its
        owner (None: this instance). ``now``: when it arrived here."""
        self._trim_tombstones(now)
        if self._tombstones.pop(ident, None) is not None:
            return False, None
        return True, self._owner_now(ident, origin, barrier)

    def _owner_now(self, ident: Ident, origin: str, barrier: bool) -> str | None:
        """Who owns a message not in the queue here yet: the winner of the transfers seen
        for it (rule 5), else its initial owner (rule 1); None: this instance."""
        transferred = self._replica.epoch(ident)
        if transferred is None or barrier:
            return self.owner_for(origin, barrier)
        return None if transferred[1] == self.instance else transferred[1]

    def _trim_tombstones(self, now: float) -> None:
        """Drop the tombstones older than DeferredAckExpiration (rule 3): oldest first."""
        tombstones = self._tombstones
        oldest = now - self._tombstone_s
        while tombstones:
            ident, (_, when) = next(iter(tombstones.items()))
            if when > oldest:
                return
            del tombstones[ident]

    @property
    def tombstone_count(self) -> int:
        return len(self._tombstones)

    def owned_here(self) -> list[Ident]:
        """The messages in the queue here that this instance owns (not ELSEWHERE): for
        checks that at most one instance owns a message."""
        queue, replica = self.queue, self._replica
        return [ident for ident, position in replica.identities()
                if replica.owner_of(position) is None and queue.state_of(position) is not _ABSENT]

    # --- rule 3 ----------------------------------------------------------------------------------

    def removed(self, idents: list[Ident], kind: str, now: float) -> tuple[list[Event], bool]:
        """A replicated removal (one record): the queue's events, and whether anything
        changed here. A message unknown here leaves a tombstone (a change: journaled so
        a restart keeps it); those in the queue here leave in one pass."""
        replica = self._replica
        positions: list[int] = []
        tombstoned = False
        for ident in idents:
            position = replica.position(ident)
            if position is None:
                self._tombstone(ident, kind, now)
                tombstoned = True
                continue
            positions.append(position)
            if kind == "ack":
                arrived = replica.arrival_of(position)  # owned elsewhere: it leaves, a sample of rule 4
                if arrived is not None:
                    self._latency.append(max(0.0, now - arrived))
                    self._wait = None
        events = self.queue.transfers.remove_replicated_all(positions, kind, now) if positions else []
        return events, tombstoned or bool(events)

    def _tombstone(self, ident: Ident, kind: str, now: float) -> None:
        """Rule 3: a removal that arrived before its message."""
        self._trim_tombstones(now)
        self._tombstones[ident] = (kind, now)
        self._tombstones.move_to_end(ident)  # a repeated removal starts its time again
        if len(self._tombstones) > TOMBSTONES_MAX:
            self._tombstones.popitem(last=False)

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

    def requests(self, now: float, reachable: Callable[[str], bool]
                 ) -> tuple[records.TransferRequestRec | None, records.TransferRec | None]:
        """Rules 4 and 6: the request to journal now (one record for every message asked
        for, whoever its owner), and the proxied claim (messages of an unreachable owner,
        no more than the subscribers' free slots, when proxied transfer is on).

        Asked only when a subscriber has had room since the last look (a slot free now,
        or freed and filled at once from what this instance owns), and then up to
        :data:`REQUESTS_PER_ROOM` per backlog slot (at least
        :data:`REQUESTS_IN_FLIGHT_MIN`) counting the requests in flight and the granted
        messages still waiting here: the next grants are under way before those run
        out, so the round trip of a grant does not leave subscribers idle."""
        queue, replica = self.queue, self._replica
        if not replica:
            self.next_scan = None
            return None, None
        if now - self._scanned < REQUEST_SCAN_S:
            self.next_scan = self._scanned + REQUEST_SCAN_S
            return None, None
        self._scanned = now
        self.next_scan = None  # nothing to do until a subscriber has room (a dispatch calls again)
        free = queue.transfers.room()
        freed = queue.transfers.slots_freed
        had_room = free or freed != self._freed_seen
        self._freed_seen = freed
        if not had_room:
            return None, None
        wait = self.typical_wait()
        retry = max(wait, 2 * WAIT_DEFAULT_S)  # an unanswered request is repeated after this
        target = self._request_target(now, freed)
        waiting = queue.transfers.available_here()
        room = target - replica.requests_in_flight() - waiting
        # Rule 6: a claim goes to a subscriber at once: no more than their free slots less
        # what already waits here for them.
        claims_max = max(0, free - waiting) if self.proxied else 0
        if room <= 0 and not claims_max:
            oldest = replica.oldest_request()
            if free and oldest is not None:  # all asked: look again when the oldest unanswered is due again
                self.next_scan = oldest + retry
            return None, None
        look = _Look(queue, replica, now, free=bool(free), room=max(0, room), reachable=reachable,
                     proxied=self.proxied, claims_max=claims_max)
        if claims_max:
            # Rule 6: the messages asked for, of an owner now unreachable, without waiting
            # for their request to be due again (a claim in place of a request in flight
            # takes nothing more from the budget).
            look.claim_asked(replica.requests_due(now, 0.0)[0])
        if room <= 0:  # all asked: look again when the oldest unanswered is due again
            oldest = replica.oldest_request()
            due = oldest + retry if free and oldest is not None else None
        else:
            # Requests in flight, oldest first: those unanswered for ``retry`` are asked
            # again; then the messages never asked for. ``due``: the earliest moment a
            # message skipped now becomes askable.
            again, due = replica.requests_due(now, retry)
            due = look.ask_again(again, due)
            if not look.full():
                due = look.ask_first(wait, due)
        asks, attempts, claims = look.asks, look.attempts, look.claims
        self.requests_sent += len(asks)
        self.proxied_claims += len(claims)
        self.next_scan = due
        ask = None
        if asks:
            ask = records.TransferRequestRec(self.name, *columns_of(asks), self.instance, attempts)
        return ask, (self._transfer(claims, self.instance, proxied=True) if claims else None)

    def _request_target(self, now: float, freed: int) -> int:
        """Rule 4's budget: what is asked for, claimed or granted and waiting here at most.
        :data:`REQUESTS_PER_ROOM` per backlog slot (at least :data:`REQUESTS_IN_FLIGHT_MIN`),
        or, when more, what the subscribers here take (slots freed per second, over the
        last :data:`RATE_WINDOW_S`) in :data:`ROUND_TRIPS_AHEAD` grant round trips: a
        grant that takes longer than the subscribers take to finish the messages granted
        before it would leave them idle. Never above :data:`REQUESTS_PER_ROOM_MAX` per
        slot."""
        capacity = self.queue.transfers.backlog_capacity()
        target = max(capacity * REQUESTS_PER_ROOM, REQUESTS_IN_FLIGHT_MIN)
        marks = self._freed_marks
        marks.append((now, freed))
        while len(marks) > 2 and now - marks[1][0] >= RATE_WINDOW_S:
            marks.popleft()
        since, freed_then = marks[0]
        if self._round_trip is None or now - since < REQUEST_SCAN_S:
            return target
        pace = (freed - freed_then) / (now - since)
        ahead = int(ROUND_TRIPS_AHEAD * self._round_trip * pace)
        return min(max(target, ahead), max(capacity * REQUESTS_PER_ROOM_MAX, REQUESTS_IN_FLIGHT_MIN))

    def claim_unreachable(self, n: int | None, upto: float, reachable: Callable[[str], bool],
                          held: Callable[[], Collection[int]] = frozenset) -> records.TransferRec | None:
        """Rule 6 for a named consumer's lease (engine/consumers.py rule 7): up to ``n``
        (None: every) messages below ``upto`` whose owner is unreachable, oldest first,
        taken by one proxied transfer; None when proxied transfer is off or there are
        none. ``held()``: positions to leave alone (deliveries of a named consumer not yet
        acknowledged: the owner leased them, and their query reads them again), asked
        only when there may be something to claim."""
        replica = self._replica
        if not self.proxied or not replica:
            return None
        held_positions = held()
        claims: list[tuple[Ident, int]] = []
        for position, away in replica.in_arrival_order():
            if n is not None and len(claims) >= n:
                break
            if position >= upto or position in held_positions or reachable(away.owner):
                continue
            ident = replica.ident(position)
            if ident is not None:
                claims.append((ident, position))
        return self._transfer(claims, self.instance, proxied=True) if claims else None

    def request(self, rec: records.TransferRequestRec, now: float, reachable: Callable[[str], bool]
                ) -> tuple[list[records.TransferRec], list[int]]:
        """Rule 5 (and 6 for an unreachable owner): the grants to journal (at most two:
        this instance's messages, and those it gives for an unreachable owner), and the
        indexes of the requested messages this instance neither has nor owns (the
        request travels on for them)."""
        if rec.requester == self.instance:
            return [], []
        queue, replica = self.queue, self._replica
        ours: list[tuple[Ident, int]] = []
        proxied: list[tuple[Ident, int]] = []
        onward: list[int] = []
        for i, ident in enumerate(idents_of(rec.publishers, rec.seqs)):
            position = replica.position(ident)
            if position is None:
                onward.append(i)  # not here (yet, or any more): another instance may own it
                continue
            owner = replica.owner_of(position)
            if owner is None:
                if queue.state_of(position) is not _AVAILABLE or queue.transfers.can_deliver_locally(position, now):
                    continue  # leased here, or a subscriber here takes it: no grant
                ours.append((ident, position))
            elif self.proxied and not reachable(owner):
                proxied.append((ident, position))
            else:
                onward.append(i)  # not ours to give
        self.grants += len(ours) + len(proxied)
        grants = [self._transfer(g, rec.requester, proxied=p) for g, p in ((ours, False), (proxied, True)) if g]
        return grants, onward

    def _transfer(self, messages: list[tuple[Ident, int]], to: str, *, proxied: bool) -> records.TransferRec:
        epochs, deliveries, cancels, not_before = [], [], [], []
        for ident, position in messages:
            epochs.append((self._replica.epoch(ident) or (0, "", ""))[0] + 1)
            d, c = self.queue.transfers.counts_of(position)
            deliveries.append(d)
            cancels.append(c)
            not_before.append(self.queue.transfers.not_before_of(position))
        return records.TransferRec(self.name, *columns_of([i for i, _ in messages]), to, self.instance, epochs,
                                   deliveries, cancels, proxied, not_before=not_before if any(not_before) else [])

    def grant_inactive(self, rec: records.TransferRequestRec, found: dict[Ident, tuple[int, str]],
                       reachable: Callable[[str], bool]) -> tuple[list[records.TransferRec], set[Ident]]:
        """Rule 11: the grants for the requested messages ``found`` inactive here (identity ->
        (position, origin)), and the messages they grant."""
        ours: list[tuple[Ident, int]] = []
        proxied: list[tuple[Ident, int]] = []
        for ident, (position, origin) in found.items():
            if ident in self._tombstones or self.queue.state_of(position) is not _INACTIVE:
                continue  # removed elsewhere (it will never enter), or acknowledged here while inactive
            owner = self._owner_now(ident, origin, False)
            if owner is None:
                ours.append((ident, position))
            elif self.proxied and not reachable(owner):
                proxied.append((ident, position))
        self.grants += len(ours) + len(proxied)
        grants = [self._transfer(g, rec.requester, proxied=p) for g, p in ((ours, False), (proxied, True)) if g]
        return grants, {ident for ident, _ in ours + proxied}

    def transfer(self, rec: records.TransferRec, now: float) -> bool:
        """Rule 5: apply a transfer (ours, received, or replayed) to each of its messages;
        False when an earlier or equal one already won for every one of them."""
        applied = False
        owner, granter, mine = rec.owner, rec.granter, rec.owner == self.instance
        queue, replica = self.queue, self._replica
        held = rec.not_before or itertools.repeat(0.0)
        asked_at: float | None = None  # when the first message of it that this instance asked for was asked for
        # granted here: the columns of Transfers.transfer_in_all
        coming: list[int] = []
        coming_deliveries: list[int] = []
        coming_cancels: list[int] = []
        coming_not_before: list[float] = []
        going: list[int] = []  # positions granted to another instance
        for ident, epoch, deliveries, cancels, not_before in zip(idents_of(rec.publishers, rec.seqs), rec.epochs,
                                                                 rec.deliveries, rec.cancels, held):
            current = replica.epoch(ident)
            if current is not None and not (epoch > current[0] or (epoch == current[0] and granter < current[2])):
                continue
            applied = True
            replica.set_epoch(ident, (epoch, owner, granter))
            position = replica.position(ident)
            if position is None:
                continue  # the message has not arrived here yet: it enters owned by ``owner``
            asked = replica.answered(ident)
            if mine:
                if asked_at is None:
                    asked_at = asked
                coming.append(position)
                coming_deliveries.append(deliveries)
                coming_cancels.append(cancels)
                coming_not_before.append(not_before)
            else:
                going.append(position)
        if coming:
            queue.transfers.transfer_in_all(coming, coming_deliveries, coming_cancels, coming_not_before, now)
        if going:
            queue.transfers.transfer_out_all(going, owner, now)
        if asked_at is not None and now >= asked_at:  # a grant of a request of ours: its round trip
            rtt = now - asked_at
            last = self._round_trip
            self._round_trip = rtt if last is None else last + RTT_WEIGHT * (rtt - last)
        return applied

    def cancelled_elsewhere(self, rec: records.QueueCancelledRec) -> bool:
        """Rule 10: the owner cancelled these messages with a delayed retry or a reason;
        each one here and owned elsewhere keeps both (False: none is)."""
        replica, transfers = self._replica, self.queue.transfers
        kept = False
        counts = zip(rec.deliveries, rec.cancels) if rec.deliveries else itertools.repeat((0, 0))
        idents = idents_of(rec.publishers, rec.seqs)
        for ident, not_before, reason, (deliveries, cancels) in zip(idents, rec.not_before, rec.reasons, counts):
            position = replica.position(ident)
            if position is not None and transfers.cancelled_elsewhere(position, not_before, reason, deliveries,
                                                                      cancels):
                kept = True
        return kept

    def conflict(self, ident: Ident, other_origin: str, now: float) -> records.TransferRec | None:
        """Rule 7: a copy of a message this instance recorded arrived from another origin."""
        position = self._replica.position(ident)
        if position is None or self._group_local or self._replica.epoch(ident) is not None:
            return None
        mine = self._replica.owner_of(position) or self.instance
        winner = min(mine, other_origin)
        if winner == mine:
            return None
        self.conflicts += 1
        log.warning("queue %s: message %s was recorded as its own by %s and by %s: %s owns it",
                    self.name, (publisher_of(ident), seq_of(ident)), mine, other_origin, winner)
        deliveries, cancels = self.queue.transfers.counts_of(position)
        return records.TransferRec(self.name, [publisher_of(ident)], [seq_of(ident)], winner, self.instance, [1],
                                   [deliveries], [cancels])

    # --- checkpoints and statistics -------------------------------------------------------------

    def export_state(self) -> OwnershipState:
        return OwnershipState(
            tombstones=[Tombstone(publisher_of(i), seq_of(i), k, t) for i, (k, t) in self._tombstones.items()],
            epochs=[TransferEpoch(publisher_of(i), seq_of(i), e, o, g) for i, (e, o, g) in self._replica.epochs()],
        )

    def snapshot_fields(self) -> dict[str, object]:
        """What the queue's snapshot adds for this part (queue/snapshot.py rule 6): the
        identity of every message in the queue, the transfers that decided their owners,
        the recent leavers."""
        return {
            "replicated": True,
            "idents": queue_snapshot.columns(*self._replica.idents_by_position()),
            "left": queue_snapshot.columns(*self._replica.leavers()),
            # the checkpoint file has these too, but may be older than the snapshot file
            "ownership": self.export_state(),
        }

    def restore_snapshot(self, snap: queue_snapshot.QueueSnapshot, now: float) -> None:
        """Take the state :meth:`snapshot_fields` gave, after the queue restored its own
        and the checkpoint's ownership state was restored (:meth:`restore`)."""
        positions, idents = queue_snapshot.triples(snap.idents)
        left_positions, left_idents = queue_snapshot.triples(snap.left)
        self._replica.restore_identities(positions, idents, left_positions, left_idents)
        self.restore(snap.ownership, now)
        # A message held here for a delayed retry and granted away before the snapshot
        # (queue/transfers.py rule 2) leaves for its new owner when its delay ends, as
        # replaying the grant would have noted; the snapshot keeps it only as held, and
        # the transfer that won names its owner.
        replica = self._replica
        for position in self.queue.transfers.held():
            ident = replica.ident(position)
            won = replica.epoch(ident) if ident is not None else None
            if won is not None and won[1] != self.instance:
                replica.owned_away_while_leased(position, won[1])

    def restore(self, state: OwnershipState, now: float) -> None:
        """Tombstones and transfers from a checkpoint or a snapshot (both may hold the
        same: the later removal and the higher epoch win)."""
        tombstones = self._tombstones
        for stone in state.tombstones:
            # A checkpoint of an older version has no time: it counts from the restart.
            t = now if stone.when is None else stone.when
            ident = ident_of(stone.publisher, stone.seq)
            kept = tombstones.get(ident)
            if kept is None or kept[1] < t:
                tombstones[ident] = (stone.kind, t)
        if tombstones:  # oldest first again (rule 3's trim reads them in that order)
            self._tombstones = OrderedDict(sorted(tombstones.items(), key=lambda item: item[1][1]))
        replica = self._replica
        for row in state.epochs:
            ident = ident_of(row.publisher, row.seq)
            current = replica.epoch(ident)
            if current is None or row.epoch > current[0] or (row.epoch == current[0] and row.granter < current[2]):
                replica.set_epoch(ident, (row.epoch, row.owner, row.granter))

    def statistics(self) -> OwnershipStats:
        return OwnershipStats(self.name, self.proxied, self.requests_sent, self.grants, self.proxied_claims,
                              self.conflicts, self.typical_wait())


class _Look:
    """One look of :meth:`QueueOwnership.requests` (rules 4 and 6): what it asks for, what
    it claims, and the reachability of each owner, asked once a look."""

    def __init__(self, queue: Queue, replica: Replica, now: float, *, free: bool, room: int,
                 reachable: Callable[[str], bool], proxied: bool, claims_max: int = 0) -> None:
        self._queue, self._replica, self._now = queue, replica, now
        self._free, self._room, self._reachable, self._proxied = free, room, reachable, proxied
        self._claims_max = claims_max
        self._claimed: set[int] = set()  # positions of self.claims
        self._reach: dict[str, bool] = {}
        self.asks: list[Ident] = []
        self.attempts: list[int] = []
        self.claims: list[tuple[Ident, int]] = []

    def full(self) -> bool:
        return len(self.asks) + len(self.claims) >= self._room

    def askable(self, position: int, owner: str) -> bool:
        """Whether to ask for it, whether or not its owner is reachable (rule 4). False: a
        subscriber here would not take it; or proxied transfer is on here and its owner
        is unreachable, when it is claimed instead while the subscribers' free slots last
        (rule 6)."""
        if not self._queue.transfers.can_deliver_locally(position, self._now, room=self._free):
            return False
        if not self._proxied:
            return True
        up = self._reach.get(owner)
        if up is None:
            up = self._reach[owner] = self._reachable(owner)
        if up:
            return True
        if len(self.claims) < self._claims_max and position not in self._claimed:
            ident = self._replica.ident(position)
            assert ident is not None  # in the queue here
            self.claims.append((ident, position))
            self._claimed.add(position)
        return False

    def claim_asked(self, asked: list[tuple[Ident, int]]) -> None:
        """Rule 6: the messages asked for (oldest first) whose owner is unreachable,
        claimed while the free slots last."""
        replica = self._replica
        for ident, _ in asked:
            if len(self.claims) >= self._claims_max:
                return
            position = replica.position(ident)
            owner = replica.owner_of(position) if position is not None else None
            if owner is not None:
                assert position is not None  # it has an owner
                self.askable(position, owner)

    def ask_again(self, again: list[tuple[Ident, int]], due: float | None) -> float | None:
        """The requests due again, oldest first; when to look next."""
        replica, now = self._replica, self._now
        for ident, attempt in again:
            if self.full():
                return now + REQUEST_SCAN_S
            position = replica.position(ident)
            owner = replica.owner_of(position) if position is not None else None
            if owner is None:  # it came here: nothing more to ask
                replica.answered(ident)
                continue
            assert position is not None  # it has an owner
            if self.askable(position, owner):
                replica.requested(ident, now, attempt + 1)  # the order of when each was asked
                self.asks.append(ident)
                self.attempts.append(attempt + 1)
        return due

    def ask_first(self, wait: float, due: float | None) -> float | None:
        """The messages never asked for, in the order they came: the first too recent to
        ask for ends the look (those after it came later). When to look next."""
        replica, now = self._replica, self._now
        asked: list[int] = []  # positions asked for the first time
        for position, away in replica.unasked():
            if self.full():
                due = now + REQUEST_SCAN_S
                break
            arrived = away.arrived
            if now - arrived < wait:
                due = arrived + wait if due is None else min(due, arrived + wait)
                break
            ident = replica.ident(position)
            if ident is None or not self.askable(position, away.owner):
                continue
            replica.requested(ident, now, 1)
            self.asks.append(ident)
            self.attempts.append(1)
            asked.append(position)
        replica.asked(asked)
        return due


class ReplicatedQueues:
    """The engine part over every replicated queue of this instance: it applies what
    replication brings (removals, requests, transfers), journals what this instance
    decides (requests, grants, proxied claims, settled conflicts), and names the
    messages of local queue records for the destinations (``identify``)."""

    def __init__(self, instance: str, bindings: QueueBindings, journal: JournalPort, cache: MessageCache,
                 delivery: QueueDelivery, reachable: Callable[[str], bool]) -> None:
        self.instance = instance
        self._bindings = bindings
        self._journal = journal
        self._cache = cache
        self._delivery = delivery
        self._reachable = reachable
        self.by_queue: dict[str, QueueOwnership] = {b.name: b.ownership for b in bindings if b.ownership is not None}
        # (queue, requester, publisher, seq, attempt) of the requests answered
        self._seen_requests: OrderedDict[tuple[str, str, int, int, int], None] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self.by_queue)

    # --- for the source side of replication ------------------------------------------------

    def identify(self, position: int) -> tuple[int, ...]:
        entry = self._cache.get(position)
        return entry.publisher, entry.seq

    def counts_of(self, queue: str, position: int) -> tuple[int, int]:
        own = self.by_queue.get(queue)
        return own.queue.transfers.counts_of(position) if own is not None else (0, 0)

    # --- what replication brings ---------------------------------------------------------------

    def received(self, rec: QueueRecord, now: float) -> QueueRecord | None:
        """Apply a queue record from another instance; the record to journal here (it
        changed something, or it must travel on: a request narrowed to the messages not
        answered here), or None."""
        own = self.by_queue.get(rec.queue)
        if own is None:
            return None
        if type(rec) is records.QueueRemovedRec:
            return rec if self._remove(own, rec, now) else None
        if type(rec) is records.TransferRec:
            if own.transfer(rec, now):
                self._delivery.mark(self._bindings.by_name[rec.queue])
                return rec
            return None
        if type(rec) is records.QueueCancelledRec:
            return rec if own.cancelled_elsewhere(rec) else None
        # a TransferRequestRec: each message's attempt is answered once, whatever the path
        assert type(rec) is records.TransferRequestRec  # the other two returned above
        seen = self._seen_requests
        fresh = []
        key: tuple[int, int, int] | tuple[str, str, int, int, int]
        for i, key in enumerate(zip(rec.publishers, rec.seqs, rec.attempts)):
            key = (rec.queue, rec.requester, *key)
            if key not in seen:
                seen[key] = None
                fresh.append(i)
        while len(seen) > TOMBSTONES_MAX:
            seen.popitem(last=False)
        if not fresh:
            return None
        rec = _narrowed(rec, fresh)
        grants, onward = own.request(rec, now, self._reachable)
        binding = self._bindings.by_name[rec.queue]
        if onward and binding.queue.refill_from() is not None:  # rule 11: some may be inactive here
            asked = _narrowed(rec, onward)
            found = binding.find_inactive(self._journal, set(idents_of(asked.publishers, asked.seqs)),
                                          READ_AHEAD_RECORDS_MAX)
            if found:
                more, granted = own.grant_inactive(asked, found, self._reachable)
                grants += more
                onward = [i for i in onward if ident_of(rec.publishers[i], rec.seqs[i]) not in granted]
        for grant in grants:
            self._journal_transfer(own, grant, now)  # answered here: the grant travels instead
        return _narrowed(rec, onward) if onward else None

    def _remove(self, own: QueueOwnership, rec: records.QueueRemovedRec, now: float) -> bool:
        # a tombstone changes something too: journaled so a restart keeps it
        left, changed = own.removed(idents_of(rec.publishers, rec.seqs), rec.kind, now)
        if left:
            self._delivery.removed_elsewhere(self._bindings.by_name[rec.queue], left)
        return changed

    def duplicate(self, rec: records.PublishRec | records.PlainPublish, origin: str, now: float) -> None:
        """A copy of a message recorded here arrived from ``origin`` (rule 7)."""
        for binding in self._bindings.for_topic(rec.topic):
            own = self.by_queue.get(binding.name)
            if own is None:
                continue
            settle = own.conflict(ident_of(rec.publisher, rec.seq), origin, now)
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
            ask, claim = own.requests(now, self._reachable)
            if ask is not None:
                self._journal.append(records.encode(ask))
            if claim is not None:
                log.warning("queue %s: proxied transfer: taking %d message(s) whose owner is unreachable",
                            own.name, len(claim.seqs))
                self._journal_transfer(own, claim, now)

    def claim_for_lease(self, queue: str, n: int | None, upto: float, now: float,
                        held: Callable[[], Collection[int]] = frozenset) -> None:
        """Rule 6 for a named consumer's lease: take the messages of an unreachable owner
        it could lease now (proxied transfer on only), except those ``held``."""
        own = self.by_queue.get(queue)
        claim = own.claim_unreachable(n, upto, self._reachable, held) if own is not None else None
        if claim is not None:
            assert own is not None  # it made the claim
            log.warning("queue %s: proxied transfer: taking %d message(s) whose owner is unreachable for a named "
                        "consumer's lease", queue, len(claim.seqs))
            self._journal_transfer(own, claim, now)

    def next_deadline(self) -> float | None:
        """When :meth:`tick` has requests to make that no command will prompt: a message
        becomes old enough to ask for, an unanswered request is due again, or a scan was
        cut short by :data:`REQUEST_SCAN_S` while subscribers have room."""
        due: float | None = None
        for own in self.by_queue.values():
            due = earliest(due, own.next_scan)
        return due

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

    def replay(self, rec: QueueRecord, now: float) -> None:
        own = self.by_queue.get(rec.queue)
        if own is None:
            return
        if type(rec) is records.QueueRemovedRec:
            own.removed(idents_of(rec.publishers, rec.seqs), rec.kind, now)  # as live (_remove)
        elif type(rec) is records.TransferRec:
            own.transfer(rec, now)
        elif type(rec) is records.QueueCancelledRec:
            own.cancelled_elsewhere(rec)

    def export_state(self) -> dict[str, OwnershipState]:
        return {name: own.export_state() for name, own in self.by_queue.items()}

    def restore(self, state: dict[str, OwnershipState], now: float) -> None:
        for name, s in state.items():
            own = self.by_queue.get(name)
            if own is not None:
                own.restore(s, now)

    def statistics(self) -> tuple[OwnershipStats, ...]:
        return tuple(own.statistics() for own in self.by_queue.values())


def _narrowed(rec: records.TransferRequestRec, keep: list[int]) -> records.TransferRequestRec:
    """``rec`` with only the messages at indexes ``keep``."""
    if len(keep) == len(rec.seqs):
        return rec
    return msgspec.structs.replace(rec, publishers=[rec.publishers[i] for i in keep],
                                   seqs=[rec.seqs[i] for i in keep], attempts=[rec.attempts[i] for i in keep])
