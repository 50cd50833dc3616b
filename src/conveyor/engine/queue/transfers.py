"""The verbs of a replicated queue (rule 11 of :mod:`conveyor.engine.queue.queue`;
docs/replication.md, "Replicated queues"): a part of
:class:`~conveyor.engine.queue.Queue`, reached as ``queue.transfers`` by the engine's
ownership rules (engine/replication/ownership.py), which decide; this part carries out.

It owns no state: it moves messages through the queue's transition table and tells the
queue's parts what happened (the replica part, the order, the leases, the seats). Rules:

1. **In.** A message whose ownership comes here goes ELSEWHERE -> AVAILABLE with the
   delivery and cancel counts it had on its previous owner (never lower than its counts
   here), and is offered to the filtered consumers it is behind; its own expiry is
   looked at again (it may have passed while it was away). Beyond the first N of its
   key's line (OrderingKey) it is held behind its key, as a new message would be
   (queue/keys.py rule 6); else, held for a delayed retry until the later of the
   granter's time and its owner's last delayed cancel (rule 5), it waits for it here.
2. **Out.** An available message whose ownership goes away leaves the order exactly (a
   priority index must not keep its key); one leased here keeps its lease and goes when
   the lease ends (queue/replica.py rule 3), one held for a delayed retry goes when its
   delay ends (a snapshot keeps it as held: the restore marks it again from the
   transfer that won, engine/replication/ownership.py); one held behind its key was
   offered to nobody, so it goes at once; a barrier never moves.
3. **Removed.** A message that left the queue on another instance leaves here too,
   whatever its state, as an acknowledgement or an expiry; the engine does not journal
   these events (the record it received is the journal's).
4. **Room.** The ownership rules ask how much the consumers here could take (free
   backlog, capacity, slots freed so far) and whether one could take a given message:
   an owner grants a transfer only when none of its own can.
5. **Cancelled on its owner.** A delayed retry's time, the failure reason and the
   delivery and cancel counts of a message cancelled on the instance that owns it
   (ownership.py rule 10) are kept with it here while it is ELSEWHERE (the time by the
   replica part, the reason and the counts by the leases), so a transfer this instance
   grants, or takes, carries them.
"""

from __future__ import annotations

from typing import Callable

from conveyor.engine.queue.events import Acknowledged, Event, Expired
from conveyor.engine.queue.expiry import MessageExpiry
from conveyor.engine.queue.keys import HELD, KeyedOrder
from conveyor.engine.queue.leases import LeaseTable
from conveyor.engine.queue.order import DeliveryOrder
from conveyor.engine.queue.replica import Replica
from conveyor.engine.queue.returns import Returns
from conveyor.engine.queue.seats import Seats
from conveyor.engine.queue.state import MessageState, Transitions, Verb

_AVAILABLE = MessageState.AVAILABLE
_LEASED = MessageState.LEASED
_ELSEWHERE = MessageState.ELSEWHERE
_REPLICATED_REMOVAL = ("replicated",)  # the reason of an expiry reported by the owner


class Transfers:
    """Rule 11's verbs over the parts of one queue (see the module header)."""

    def __init__(
        self, *, priority: bool, transitions: Transitions, replica: Replica, order: DeliveryOrder,
        leases: LeaseTable, seats: Seats, stamped: MessageExpiry[int], count: Callable[..., None],
        state_of: Callable[[int], MessageState], matches: Callable[[Callable[[object, float], bool], int, float], bool],
        returns: Returns, keys: KeyedOrder | None = None,
    ) -> None:
        self._priority = priority
        self._transitions = transitions
        self._replica = replica
        self._order = order
        self._leases = leases
        self._seats = seats
        self._stamped = stamped
        self._count = count  # adds to a counter of the queue's statistics: (name, n=1)
        self._state_of = state_of
        self._matches = matches
        self._returns = returns  # held for a delayed retry: moves when its delay ends, as a lease
        self._keys = keys  # OrderingKey (queue/keys.py rule 6); None without one

    def transfer_in(self, position: int, now: float, *, deliveries: int = 0, cancels: int = 0,
                    not_before: float = 0.0) -> bool:
        """Rule 1: ELSEWHERE --TRANSFER_IN--> AVAILABLE. False when it is not ELSEWHERE
        (already here, or done). ``not_before``: the granter held it for a delayed
        retry until then; so does this instance (queue/returns.py rule 2)."""
        if position not in self._replica:
            return False
        self._transitions.move(position, Verb.TRANSFER_IN, _ELSEWHERE)
        not_before = max(not_before, self._replica.held_until(position))  # rule 5
        away = self._replica.take(position)
        leases = self._leases
        if deliveries > leases.deliveries_of(position):
            leases.set_deliveries(position, deliveries)
        if cancels > leases.cancels_of(position):
            leases.set_cancels(position, cancels)
        if self._keys is not None and self._keys.behind(position):
            self._returns.hold(position, HELD, away.published_at, away.key)  # its key's turn first (rule 1)
        elif now < not_before < HELD:
            self._returns.hold(position, not_before, away.published_at, away.key)
        elif self._order.insert(position, away.published_at, away.key) or not self._priority:
            self._seats.came_back(away.key, self._order.store.__contains__, now)
        if self._stamped:
            self._stamped.again(position)  # its own expiry may have passed while it was away
        self._count("transferred_in")
        return True

    def transfer_in_all(self, positions: list[int], deliveries: list[int], cancels: list[int],
                        not_before: list[float], now: float) -> None:
        """:meth:`transfer_in` of each message of one grant (its position, delivery and
        cancel counts, and not-before time at the same index: columns, which compiled
        code reads without a tuple per message). A FIFO queue without OrderingKey takes
        the messages that nothing holds (no delay here or at the granter) in one pass:
        the transition table read once, the filtered consumers looked for once, the
        counter added to once; any other goes through :meth:`transfer_in`."""
        replica = self._replica
        one_by_one = self._priority or self._keys is not None or replica.holding()
        run: list[int] = []  # indexes
        for i in range(len(positions)):
            if one_by_one or not_before[i]:  # held (rule 5), or ordered by key or priority
                self.transfer_in(positions[i], now, deliveries=deliveries[i], cancels=cancels[i],
                                 not_before=not_before[i])
            elif positions[i] in replica:
                run.append(i)
        if not run:
            return
        self._transitions.move_all([positions[i] for i in run], Verb.TRANSFER_IN, _ELSEWHERE)
        leases, order = self._leases, self._order  # methods called on them, not bound: native calls compiled
        filtered = any(seat.consumer.filter is not None for seat in self._seats.active)
        stamped = self._stamped
        for i in run:
            position = positions[i]
            away = replica.take(position)
            if deliveries[i] > leases.deliveries_of(position):
                leases.set_deliveries(position, deliveries[i])
            if cancels[i] > leases.cancels_of(position):
                leases.set_cancels(position, cancels[i])
            order.insert(position, away.published_at, away.key)
            if filtered:  # came_back offers it to filtered consumers only
                self._seats.came_back(away.key, order.store.__contains__, now)
            if stamped:
                stamped.again(position)
        self._count("transferred_in", len(run))

    def transfer_out(self, position: int, owner: str, now: float) -> bool:
        """Rule 2: ownership goes to instance ``owner``. AVAILABLE: it goes ELSEWHERE;
        ELSEWHERE: only its owner changes; LEASED here: it goes when the lease ends.
        False when it is not in the queue (or is a barrier)."""
        state = self._state_of(position)
        if state is _ELSEWHERE:
            self._replica.set_owner(position, owner)
            return True
        held_by_key = self._returns.not_before(position) == HELD
        if state is _LEASED or (position in self._returns and not held_by_key):
            self._replica.owned_away_while_leased(position, owner)
            return True
        if state is not _AVAILABLE or self._order.is_barrier(position):
            return False
        self._transitions.move(position, Verb.TRANSFER_OUT, _AVAILABLE)
        if held_by_key:
            t, key = self._returns.take_key(position)
        else:
            key = self._order.key_of(position)
            # Exact removal, as a delivery's: a lazy one would leave its key in a priority
            # index, and a transfer back here would add it a second time.
            t = self._order.take(key)
        self._replica.add(position, owner, t, key, now)
        self._count("transferred_out")
        return True

    def transfer_out_all(self, positions: list[int], owner: str, now: float) -> None:
        """:meth:`transfer_out` of each of ``positions`` to ``owner`` (one grant): in a
        FIFO queue without OrderingKey, the available ones (not held for a delayed
        retry, not a barrier) go ELSEWHERE in one pass; any other one by one."""
        if self._priority or self._keys is not None:
            for p in positions:
                self.transfer_out(p, owner, now)
            return
        order = self._order
        store = order.store
        run: list[int] = []
        for p in dict.fromkeys(positions):  # a message named twice moves once
            # In the store: AVAILABLE and not held for a delayed retry (a message is in
            # one place only), without asking the queue where it is.
            if p in store and not order.is_barrier(p):
                run.append(p)
            else:
                self.transfer_out(p, owner, now)
        if not run:
            return
        self._transitions.move_all(run, Verb.TRANSFER_OUT, _AVAILABLE, checked=False)
        replica = self._replica
        for p in run:
            replica.add(p, owner, order.take(p), p, now)  # a FIFO queue's order key is the position
        self._count("transferred_out", len(run))

    def acknowledged_here(self, position: int) -> bool:
        """Rule 3's other half: a message another instance owns, acknowledged here (live
        or replayed) leaves, everywhere. False when it is not ELSEWHERE."""
        if position not in self._replica:
            return False
        self._transitions.move(position, Verb.ACKNOWLEDGE, _ELSEWHERE)
        self._replica.take(position)
        self._leases.forget(position)
        return True

    def held(self) -> list[int]:
        """The messages held here for a delayed retry (queue/returns.py rule 2)."""
        return [p for p, _ in self._returns.items()]

    def not_before_of(self, position: int) -> float:
        """When a message held for a delayed retry (here, or by its owner: rule 5) may be
        offered again (0: not held). One held behind its key has no time: where it goes,
        its place in its key's line decides (queue/keys.py rule 6)."""
        held = self._returns.not_before(position)
        return self._replica.held_until(position) if held is None or held == HELD else held

    def cancelled_elsewhere(self, position: int, not_before: float, reason: str, deliveries: int = 0,
                            cancels: int = 0) -> bool:
        """Rule 5: the owner of ``position`` cancelled it with a delayed retry until
        ``not_before`` (0: none) or a ``reason`` ("": none); its counts there were
        ``deliveries`` and ``cancels``. False when it is not ELSEWHERE here (then its owner
        is this instance, or it is gone)."""
        if position not in self._replica:
            return False
        self._replica.hold(position, not_before)
        leases = self._leases
        if reason:
            leases.note(position, None, reason)
        if deliveries > leases.deliveries_of(position):
            leases.set_deliveries(position, deliveries)
        if cancels > leases.cancels_of(position):
            leases.set_cancels(position, cancels)
        return True

    def remove_replicated_all(self, positions: list[int], kind: str, now: float) -> list[Event]:
        """:meth:`remove_replicated` of each of ``positions`` (in the queue here): those
        owned elsewhere, the usual case on an instance that granted them away, in one
        pass; the others one by one."""
        replica = self._replica
        away = list(dict.fromkeys(p for p in positions if p in replica))  # a message named twice goes once
        events: list[Event] = []
        if len(away) < len(positions):
            for p in positions:
                if p not in replica:
                    events += self.remove_replicated(p, kind, now)
        if not away:
            return events
        expire = kind == "expire"
        self._transitions.move_all(away, Verb.EXPIRE if expire else Verb.ACKNOWLEDGE, _ELSEWHERE, checked=False)
        leases = self._leases
        for p in away:
            replica.take(p)
            leases.forget(p)
        replica.forget_all(away)
        if expire:
            events += [Expired(p, _REPLICATED_REMOVAL) for p in away]
            self._count("expired", len(away))
        else:
            events += [Acknowledged(p) for p in away]
            self._count("acknowledged", len(away))
        return events

    def counts_of(self, position: int) -> tuple[int, int]:
        """(deliveries, cancels) of a message, as they travel with a transfer."""
        return self._leases.deliveries_of(position), self._leases.cancels_of(position)

    def remove_replicated(self, position: int, kind: str, now: float) -> list[Event]:
        """Rule 3 (``kind``: ``ack``, ``deliver`` or ``expire``): the events, for the
        backlog they free and for listeners; [] when it is not here."""
        state = self._state_of(position)
        events: list[Event] = []
        if state is not _ELSEWHERE and state is not _AVAILABLE and state is not _LEASED:
            return events
        expire = kind == "expire"
        self._transitions.step(position, Verb.EXPIRE if expire else Verb.ACKNOWLEDGE, state)
        if state is _ELSEWHERE:
            self._replica.take(position)
        elif position in self._returns:
            self._returns.take(position)
        elif state is _AVAILABLE:
            self._order.remove(position)
        else:
            # Two instances delivered it (a proxied transfer while its owner was alive):
            # its lease here ends with it.
            self._leases.end(position)
        self._leases.forget(position)
        self._replica.forget(position)
        if expire:
            events.append(Expired(position, _REPLICATED_REMOVAL))
            self._count("expired")
        else:
            events.append(Acknowledged(position))
            self._count("acknowledged")
        return events

    def can_deliver_locally(self, position: int, now: float, *, room: bool = True) -> bool:
        """Rule 4: whether a consumer here with room takes the message now (its filter
        matches); with ``room=False``, whether one would once it has room."""
        for seat in self._seats.active:
            c = seat.consumer
            if room and c.outstanding >= c.max_backlog:
                continue
            if c.filter is None or self._matches(c.filter, position, now):
                return True
        return False

    def room(self) -> int:
        """Free backlog slots of the active consumers (how many messages they could take)."""
        return sum(max(0, c.max_backlog - c.outstanding) for c in self._seats.consumers)

    def backlog_capacity(self) -> int:
        """The backlog slots of the active consumers, free or not."""
        return sum(c.max_backlog for c in self._seats.consumers)

    @property
    def slots_freed(self) -> int:
        """Backlog slots given back so far (acks, cancels, broken leases): a count that
        moves whenever a consumer had room, even if a message filled it at once."""
        return self._leases.slots_freed

    def available_here(self) -> int:
        """Available messages this instance owns (the ones waiting for a consumer here)."""
        return len(self._order.store) + len(self._returns)
