"""TargetQueueDepth: the active window of a queue (spec 000, "Limiting Currently
Deliverable Messages").

A mixin of :class:`conveyor.engine.queue.Queue`. Rules:

1. Only the first ``TargetQueueDepth`` unacknowledged messages (in position order) are
   **active**: deliverable, in the view (``available``), reachable by a filtered
   ``acknowledge_matching``, counted in ``queue_depth``. The others are **inactive**:
   "AMPS will not read those messages from the transaction log and will not maintain
   queue state for those messages". The queue keeps for them only a count
   (``inactive_message_count``) and the position the engine must read the log from.
2. ``enqueue`` decides: a message is active when nothing is inactive and the window has
   room (active = available + leased < target), else inactive (HOLD), and ``enqueue``
   returns False. Once one message is inactive every later one is too, until the window
   has caught up: activation is strictly in position order.
3. "As messages are acknowledged from the queue, AMPS will add messages to the active
   part of the queue until the active part of the queue once again reaches the
   TargetQueueDepth." The queue cannot read the log, so the engine refills it:
   while :meth:`wants` > 0, read the journal from :meth:`refill_from` and offer each
   message of this queue (topic and queue filter, as at publish) in order to
   :meth:`activate`. Offering a position already offered is a no-op, so the engine may
   always scan from :meth:`refill_from` (the last position offered, or the first
   inactive one: a record boundary).
4. Deferred acknowledgements: an acknowledgement (``AckOption.NONE``) of a position in
   the inactive part is kept (``deferred_ack_count``) and journaled at once as
   ``Acknowledged``; "When a message that would be added to the active part of the queue
   has already been acknowledged, AMPS does not add that message to the queue": the
   offer consumes the deferred ack and the message never becomes active (nor takes
   room). The queue cannot tell whether a position in the inactive part is one of its
   messages: a deferred ack that no offer consumes is dropped once the refill passes its
   position, or when nothing is inactive any more. ``cancel`` (nothing is leased) and,
   in an at-least-once queue, ``expire`` (our choice: an expiry needs the message, to
   report it) of an inactive message are ignored.
5. Inactive messages do not expire (the queue does not know their age); a message that
   is too old when activated expires at the next ``expire(now)``.
6. Recovery: the engine replays as it runs, refilling during the replay whenever
   :meth:`wants` > 0 (after each replayed event of this queue: an event can only free
   room), from a second read of the journal behind the main scan. Replayed this way the
   window covers at least the live one at every record, so a replayed delivery, cancel
   or return always finds its message active; one that finds it inactive raises
   :class:`QueueStateError` (the engine did not refill). A replayed acknowledgement or
   expiry of an inactive message is a deferred ack again. ``recovery_point`` never
   passes :meth:`refill_from` while anything is inactive.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING

from conveyor.engine.queue_state import MessageState, QueueStateError, Verb, advance

if TYPE_CHECKING:
    from conveyor.engine.queue import Queue

_INACTIVE = MessageState.INACTIVE


class QueueWindow:
    """TargetQueueDepth methods of :class:`Queue` (which provides the state they change)."""

    def wants(self: Queue) -> int:
        """How many inactive messages the queue would activate now (0 without
        TargetQueueDepth): the engine refills while this is above 0 (rule 3)."""
        if not self._inactive:
            return 0
        room = self._target - len(self._store) - len(self._leases)
        return min(room, self._inactive) if room > 0 else 0

    def refill_from(self) -> int | None:
        """The journal position (a record boundary) to read inactive messages from, or
        None when nothing is inactive."""
        return self._refill_from if self._inactive else None

    def activate(self: Queue, position: int, published_at: float) -> bool:
        """Offer the message at ``position``, read back from the log (rule 3). True if it
        became active; False if it was offered before (ignored) or an acknowledgement
        was waiting for it (consumed: it never becomes active)."""
        if self._target is None:
            raise QueueStateError(f"queue {self.name!r} has no TargetQueueDepth")
        if position <= self._offered:
            return False
        if not self._inactive or position > self._last_position:
            raise QueueStateError(
                f"queue {self.name!r}: position {position} is not an inactive message",
                position=position,
            )
        if published_at != published_at:
            raise QueueStateError(f"queue {self.name!r}: publish time of {position} is NaN")
        deferred, heap = self._deferred, self._deferred_heap
        acked = position in deferred
        if not acked:
            if len(self._store) + len(self._leases) >= self._target:
                raise QueueStateError(
                    f"queue {self.name!r}: no room to activate {position} (check wants())",
                    position=position,
                )
            advance(self._table, self._semantics, position, _INACTIVE, Verb.ACTIVATE)
        self._offered = position
        self._refill_from = position
        while heap and heap[0] < position:
            deferred.discard(heappop(heap))  # passed: not a message of this queue
        if acked:
            deferred.discard(position)
            heappop(heap)
            self._inactive -= 1
            self._caught_up()
            return False
        if published_at < self._last_time:
            published_at = self._last_time
        self._last_time = published_at
        self._store.append(position, published_at)
        self._inactive -= 1
        self._caught_up()
        return True

    def _hold(self: Queue, position: int) -> None:
        """``enqueue`` of a message beyond the window (rule 2)."""
        advance(self._table, self._semantics, position, MessageState.ABSENT, Verb.HOLD)
        if not self._inactive:
            self._refill_from = position
        self._inactive += 1
        self._last_position = position

    def _is_inactive(self: Queue, position: int) -> bool:
        return bool(self._inactive) and self._offered < position <= self._last_position

    def _defer_ack(self: Queue, position: int) -> bool:
        """An acknowledgement of an inactive position (rule 4); False if already held."""
        if position in self._deferred:
            return False
        advance(self._table, self._semantics, position, _INACTIVE, Verb.ACKNOWLEDGE)
        self._deferred.add(position)
        heappush(self._deferred_heap, position)
        return True

    def _caught_up(self: Queue) -> None:
        if not self._inactive:
            self._deferred.clear()
            self._deferred_heap.clear()
            self._refill_from = None
