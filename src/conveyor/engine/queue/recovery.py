"""Recovery of a queue: replaying its journaled events (spec 000, "Startup and Recovery").

:class:`QueueReplayer` is a part of :class:`conveyor.engine.queue.Queue`, kept apart
because it is a concept of its own: the live calls decide, replay only re-applies what
was decided. It owns only the replay's own state (whether the end-of-replay limit check
is due, and the events it produced); it changes messages through the queue's checked
transitions and the other parts' methods. The engine reaches these verbs as
``queue.replay`` and maps each journal record to one of them (queue/journal.py). Rules:

1. The engine replays, from the queue's recovery point, the publishes (``enqueue``, queue
   filter applied) and the events (the ``replay`` verbs), in journal order, before any
   consumer is added; then it calls ``end_replay`` and journals the events that
   returns.
2. No lease survives a restart. A replayed ``Leased`` is a lease that has already ended:
   LEASE then RETURN through the transition table, and the message is available again
   with its delivery count. A replayed ``Cancelled`` sets the cancel count; ``Returned``
   and ``LeaseExpired`` change nothing (they may be skipped). ``Acknowledged``,
   ``Expired`` and ``DeliveredAtMostOnce`` remove the message for good.
3. Replay is idempotent per message: an event for a message before the recovery point
   (ABSENT) is ignored, and a terminal event may come before the ``Cancelled`` /
   ``Returned`` of the same call (an engine that batches records by kind).
4. ``end_replay`` applies the lease-end limits to the leases the restart broke (rule 2
   of the queue): a message at MaxCancels / MaxDeliveries expires. If the engine does
   not call it, the first live call does (:meth:`settle`), and ``expire`` hands out the
   events. A restored snapshot is a replay too (queue/snapshot.py rule 2).
5. Priority and barriers: the engine enqueues again with the same ``priority`` and
   ``barrier`` (it evaluates the expressions again; they are pure). A replayed
   ``BarrierDelivered`` removes the barrier for good (it is never sent again); a barrier
   without one is held again and goes out when its rule holds after the restart (a
   barrier delivered but not journaled before a crash is delivered again).
6. TargetQueueDepth (:mod:`conveyor.engine.queue.window`, rule 6): the engine refills
   during the replay as live; a replayed acknowledgement or expiry of an inactive
   position is a deferred ack again; any other event for an inactive position raises
   :class:`QueueStateError`.
7. Delayed retries (queue/returns.py rule 2): a replayed ``Cancelled`` with a
   ``not_before`` later than the replay's ``now`` holds its message again until then
   (it wakes with the first live ``expire`` at or after that time; one whose time has
   passed is available at once, as it was before the restart or soon would have been); a later replayed delivery of it means its delay
   had ended: it is back in the order first. Its failure reason is noted again.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from conveyor.engine.queue.events import Event, ExpiryReason
from conveyor.engine.queue.state import MessageState, QueueStateError, Transitions, Verb

if TYPE_CHECKING:
    from conveyor.engine.queue.leases import LeaseTable
    from conveyor.engine.queue.order import DeliveryOrder
    from conveyor.engine.queue.returns import Returns
    from conveyor.engine.queue.seats import Seats
    from conveyor.engine.queue.transfers import Transfers
    from conveyor.engine.queue.window import ActiveWindow

_ABSENT, _AVAILABLE, _INACTIVE = MessageState.ABSENT, MessageState.AVAILABLE, MessageState.INACTIVE
_ELSEWHERE = MessageState.ELSEWHERE
_TIME_LIMIT = (ExpiryReason.TIME_LIMIT,)


class QueueReplayer:
    """Rules 1-6. ``state_of``: the queue's; ``expired(position, reasons, events)``:
    the queue's bookkeeping for a message that has just expired."""

    __slots__ = (
        "due", "_limit_events", "_name", "_at_least_once", "_state_of", "_transitions", "_order",
        "_leases", "_window", "_seats", "_expired", "_transfers", "_returns",
    )

    def __init__(
        self,
        name: str,
        *,
        at_least_once: bool,
        state_of: Callable[[int], MessageState],
        transitions: Transitions,
        order: DeliveryOrder,
        leases: LeaseTable,
        window: ActiveWindow,
        seats: Seats,
        expired: Callable[[int, tuple[str, ...], list[Event]], None],
        transfers: Transfers,
        returns: Returns,
    ) -> None:
        self.due = False  # a replay happened: the limit check of rule 4 is due
        self._limit_events: list[Event] = []  # events of that check not yet handed out
        self._name = name
        self._at_least_once = at_least_once
        self._state_of = state_of
        self._transitions = transitions
        self._order = order
        self._leases = leases
        self._window = window
        self._seats = seats
        self._expired = expired
        self._transfers = transfers
        self._returns = returns

    @property
    def has_events(self) -> bool:
        """Whether the limit check is due or has events not yet handed out."""
        return self.due or bool(self._limit_events)

    # --- the replay verbs --------------------------------------------------------------------

    def delivered(self, position: int, now: float, *, count: int | None = None) -> None:
        """Leased / DeliveredAtMostOnce. No lease survives a restart, so a replayed lease
        has already ended: LEASE then RETURN, the message stays available with its
        delivery count (``count`` from the event, else one more)."""
        state = self._state(position)
        if state is _ABSENT:
            return  # done before the recovery point
        if state is _ELSEWHERE:
            # Leased here, owned by another instance later (a proxied transfer while this
            # one was down): the checkpoint's ownership placed it there on entry, and the
            # lease ended with the restart anyway; its counts travelled with the transfer.
            return
        step = self._transitions.step
        if position in self._returns:
            self._returns.put_back(position)  # its delay had ended (rule 7)
        if self._at_least_once:
            step(position, Verb.RETURN, step(position, Verb.LEASE, state))
            self._leases.set_deliveries(position, count)
        else:
            step(position, Verb.DELIVER, state)
            self._order.remove(position)
            self._leases.forget(position)

    def acknowledged(self, position: int) -> None:
        if self._transfers.acknowledged_here(position):
            return  # acknowledged here while another instance owned it (queue rule 11)
        self._removal(position, Verb.ACKNOWLEDGE)

    def expired(self, position: int) -> None:
        self._removal(position, Verb.EXPIRE)

    def barrier_delivered(self, position: int) -> None:
        """BarrierDelivered: the barrier left the queue for good (rule 5)."""
        self._removal(position, Verb.DELIVER_BARRIER)

    def cancelled(self, position: int, *, cancels: int | None = None, not_before: float = 0.0,
                  reason: str = "", now: float = -math.inf) -> None:
        """The lease it cancelled has already ended (see :meth:`delivered`): the cancel
        count changes (``cancels`` from the event, else one more), the failure reason is
        noted, and a delayed retry holds the message until ``not_before`` (rule 7)."""
        if self._state(position) is _AVAILABLE:
            self._leases.set_cancels(position, cancels)
            if reason:
                self._leases.note(position, None, reason)
            if not_before > now and position not in self._returns:
                self._returns.hold_back(position, not_before)

    def returned(self, position: int) -> None:
        """LeaseExpired / Returned: nothing to do, the replayed lease has already ended.
        The engine may skip these records."""
        self._state(position)

    def _state(self, position: int, *, removal: bool = False) -> MessageState:
        if self._seats.any():
            raise QueueStateError(f"queue {self._name!r}: replay into a queue with consumers")
        self.due = True
        state = self._state_of(position)  # ABSENT, AVAILABLE or INACTIVE in replay
        if state is _INACTIVE and not removal:
            raise QueueStateError(
                f"queue {self._name!r}: a replayed delivery, cancel or return of {position}, "
                "which is inactive: refill the window during the replay (wants())",
                position=position,
            )
        return state

    def _removal(self, position: int, verb: Verb) -> None:
        state = self._state(position, removal=True)
        if state is _ABSENT:
            return
        if state is _INACTIVE:
            # TargetQueueDepth: a deferred ack again (rule 6)
            self._transitions.step(position, Verb.ACKNOWLEDGE, state)
            self._window.defer_ack(position)
            return
        self._transitions.step(position, verb, state)
        if position in self._returns:
            self._returns.take(position)
        else:
            self._order.remove(position)
        self._leases.forget(position)

    # --- the end of a replay -------------------------------------------------------------------

    def restored(self) -> None:
        """A snapshot was loaded: its leases were broken as a replay's are (rule 4)."""
        self.due = True

    def settle(self, now: float) -> None:
        """Rule 4: the leases the restart broke are over; a message at MaxCancels /
        MaxDeliveries expires (its events wait for :meth:`take_events`)."""
        self.due = False
        leases, store, move = self._leases, self._order.store, self._transitions.move
        for p in leases.counted():
            t = store.time_of(p)
            if t is None:
                continue
            reasons = leases.limit_reasons(p, t, now)
            if reasons and reasons != _TIME_LIMIT:
                move(p, Verb.EXPIRE, _AVAILABLE)
                self._order.remove(p)
                self._expired(p, reasons, self._limit_events)

    def take_events(self, now: float) -> list[Event]:
        """The events of the limit check (settled first if it is due)."""
        if self.due:
            self.settle(now)
        events, self._limit_events = self._limit_events, []
        return events
