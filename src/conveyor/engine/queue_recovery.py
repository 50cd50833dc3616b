"""Recovery of a queue: replaying its journaled events (spec 000, "Startup and Recovery").

A mixin of :class:`conveyor.engine.queue.Queue`, kept apart because it is a concept of
its own: the live calls decide, replay only re-applies what was decided. Rules:

1. The engine replays, from the queue's recovery point, the publishes (``enqueue``, queue
   filter applied) and the events (:meth:`replay` or the ``replay_*`` methods), in
   journal order, before any consumer is added; then it calls :meth:`end_replay` and
   journals the events that returns.
2. No lease survives a restart. A replayed ``Leased`` is a lease that has already ended:
   LEASE then RETURN through the transition table, and the message is available again
   with its delivery count. A replayed ``Cancelled`` sets the cancel count; ``Returned``
   and ``LeaseExpired`` change nothing (they may be skipped). ``Acknowledged``,
   ``Expired`` and ``DeliveredAtMostOnce`` remove the message for good.
3. Replay is idempotent per message: an event for a message before the recovery point
   (ABSENT) is ignored, and a terminal event may come before the ``Cancelled`` /
   ``Returned`` of the same call (an engine that batches records by kind).
4. :meth:`end_replay` applies the lease-end limits to the leases the restart broke
   (rule 2 of the queue): a message at MaxCancels / MaxDeliveries expires. If the engine
   does not call it, the first live call does, and :meth:`expire` hands out the events.
5. Priority and barriers: the engine enqueues again with the same ``priority`` and
   ``barrier`` (it evaluates the expressions again; they are pure). A replayed
   ``BarrierDelivered`` removes the barrier for good (it is never sent again); a barrier
   without one is held again and goes out when its rule holds after the restart (a
   barrier delivered but not journaled before a crash is delivered again).
6. TargetQueueDepth (:mod:`conveyor.engine.queue_window`, rule 6): the engine refills
   during the replay as live; a replayed acknowledgement or expiry of an inactive
   position is a deferred ack again; any other event for an inactive position raises
   :class:`QueueStateError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.engine.queue_events import (
    Acknowledged,
    BarrierDelivered,
    Cancelled,
    DeliveredAtMostOnce,
    Event,
    Expired,
    ExpiryReason,
    Leased,
    LeaseExpired,
    Returned,
)
from conveyor.engine.queue_state import MessageState, QueueStateError, Verb, advance

if TYPE_CHECKING:
    from conveyor.engine.queue import Queue

_AVAILABLE = MessageState.AVAILABLE
_TIME_LIMIT = ExpiryReason.TIME_LIMIT


class QueueRecovery:
    """Replay methods of :class:`Queue` (which provides the state they change)."""

    def replay(self: Queue, event: Event, now: float) -> None:
        """Apply one journaled event (after its message was enqueued again)."""
        match event:
            case Leased(position=p, count=count):
                self.replay_delivered(p, now, count=count)
            case DeliveredAtMostOnce(position=p):
                self.replay_delivered(p, now)
            case Acknowledged(position=p):
                self.replay_acknowledged(p)
            case Cancelled(position=p, cancels=cancels):
                self.replay_cancelled(p, cancels=cancels)
            case LeaseExpired(position=p) | Returned(position=p):
                self.replay_returned(p)
            case Expired(position=p):
                self.replay_expired(p)
            case BarrierDelivered(position=p):
                self.replay_barrier_delivered(p)
            case _:
                raise TypeError(f"not a queue event: {event!r}")

    def replay_delivered(self: Queue, position: int, now: float, *, count: int | None = None) -> None:
        """Leased / DeliveredAtMostOnce. No lease survives a restart, so a replayed lease
        has already ended: LEASE then RETURN, the message stays available with its
        delivery count (``count`` from the event, else one more)."""
        state = self._replay_state(position)
        if state is MessageState.ABSENT:
            return  # done before the recovery point
        if self._at_least_once:
            leased = advance(self._table, self._semantics, position, state, Verb.LEASE)
            advance(self._table, self._semantics, position, leased, Verb.RETURN)
            self._deliveries[position] = (
                count if count is not None else self._deliveries.get(position, 0) + 1
            )
        else:
            advance(self._table, self._semantics, position, state, Verb.DELIVER)
            self._unstore(position)
            self._forget(position)

    def replay_acknowledged(self: Queue, position: int) -> None:
        self._replay_removal(position, Verb.ACKNOWLEDGE)

    def replay_expired(self: Queue, position: int) -> None:
        self._replay_removal(position, Verb.EXPIRE)

    def replay_barrier_delivered(self: Queue, position: int) -> None:
        """BarrierDelivered: the barrier left the queue for good (rule 5)."""
        self._replay_removal(position, Verb.DELIVER_BARRIER)

    def replay_cancelled(self: Queue, position: int, *, cancels: int | None = None) -> None:
        """The lease it cancelled has already ended (see replay_delivered): only the cancel
        count changes (``cancels`` from the event, else one more)."""
        if self._replay_state(position) is MessageState.AVAILABLE:
            self._cancels[position] = (
                cancels if cancels is not None else self._cancels.get(position, 0) + 1
            )

    def replay_returned(self: Queue, position: int) -> None:
        """LeaseExpired / Returned: nothing to do, the replayed lease has already ended.
        The engine may skip these records."""
        self._replay_state(position)

    def _replay_state(self: Queue, position: int, *, removal: bool = False) -> MessageState:
        if self._seat_of:
            raise QueueStateError(f"queue {self.name!r}: replay into a queue with consumers")
        self._replayed = True
        state = self.state_of(position)  # ABSENT, AVAILABLE or INACTIVE in replay
        if state is MessageState.INACTIVE and not removal:
            raise QueueStateError(
                f"queue {self.name!r}: a replayed delivery, cancel or return of {position}, "
                "which is inactive: refill the window during the replay (wants())",
                position=position,
            )
        return state

    def _replay_removal(self: Queue, position: int, verb: Verb) -> None:
        state = self._replay_state(position, removal=True)
        if state is MessageState.ABSENT:
            return
        if state is MessageState.INACTIVE:
            self._defer_ack(position)  # TargetQueueDepth: a deferred ack again (rule 6)
            return
        advance(self._table, self._semantics, position, state, verb)
        self._unstore(position)
        self._forget(position)

    def end_replay(self: Queue, now: float) -> list[Event]:
        """Events to journal after a replay: the leases broken by the restart are over, and
        a message whose lease ended at MaxCancels / MaxDeliveries expires (rule 2). This
        also catches a torn journal tail and limits lowered since.

        If the engine does not call it, the first live call does the same and
        :meth:`expire` returns the events (:meth:`next_deadline` is then ``-inf``).
        """
        self._settle(now)
        events, self._pending = self._pending, []
        return events

    def _settle(self: Queue, now: float) -> None:
        if not self._replayed:
            return
        self._replayed = False
        for p in sorted(self._deliveries.keys() | self._cancels.keys()):
            t = self._store.time_of(p)
            if t is None:
                continue
            reasons = self._limit_reasons(p, t, now)
            if reasons and reasons != (_TIME_LIMIT,):
                advance(self._table, self._semantics, p, _AVAILABLE, Verb.EXPIRE)
                self._unstore(p)
                self._expire_gone(p, reasons, self._pending)
