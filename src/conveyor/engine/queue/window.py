"""TargetQueueDepth: the active window of a queue (spec 000, "Limiting Currently
Deliverable Messages").

A part of :class:`conveyor.engine.queue.Queue`: :class:`ActiveWindow` owns the target,
the count of inactive messages, the last position offered to the active part, where
the refill reads from, and the deferred acknowledgements. The queue moves messages
through the transition table (HOLD, ACTIVATE, ACKNOWLEDGE of an INACTIVE one) and tells
the window. Rules:

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
   while ``Queue.wants()`` > 0, read the journal from ``Queue.refill_from()`` and offer
   each message of this queue (topic and queue filter, as at publish) in order to
   ``Queue.activate``. Offering a position already offered is a no-op, so the engine
   may always scan from ``refill_from`` (the last position offered, or the first
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
   ``wants()`` > 0 (after each replayed event of this queue: an event can only free
   room), from a second read of the journal behind the main scan. Replayed this way the
   window covers at least the live one at every record, so a replayed delivery, cancel
   or return always finds its message active; one that finds it inactive raises
   :class:`QueueStateError` (the engine did not refill). A replayed acknowledgement or
   expiry of an inactive message is a deferred ack again. ``recovery_point`` never
   passes ``refill_from`` while anything is inactive.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Iterable


class ActiveWindow:
    """The TargetQueueDepth window of one queue (rules 1-6); ``target`` None: no window,
    every message is active."""

    __slots__ = (
        "target", "inactive", "offered", "_last_held", "_refill_from", "_deferred_acks",
        "_deferred_ack_heap",
    )

    def __init__(self, target: int | None, start: int) -> None:
        self.target = target
        self.inactive = 0  # messages beyond the window: only counted (rule 1)
        self.offered = start - 1  # the last position that entered the active part
        self._last_held = start - 1  # the last inactive position
        self._refill_from: int | None = None
        self._deferred_acks: set[int] = set()  # deferred acknowledgements (rule 4)
        self._deferred_ack_heap: list[int] = []  # the same, to drop the ones a refill passed

    # --- reading ---------------------------------------------------------------------------

    def holds_back(self, active: int) -> bool:
        """Rule 2: a message enqueued now is inactive (``active``: available + leased)."""
        assert self.target is not None  # asked only of a queue with a window
        return bool(self.inactive) or active >= self.target

    def wants(self, active: int) -> int:
        """Rule 3: how many inactive messages the queue would activate now."""
        if not self.inactive:
            return 0
        assert self.target is not None  # asked only of a queue with a window
        room = self.target - active
        return min(room, self.inactive) if room > 0 else 0

    def refill_from(self) -> int | None:
        """Rule 3: the journal position to read inactive messages from (None: none)."""
        return self._refill_from if self.inactive else None

    def is_inactive(self, position: int) -> bool:
        """``position`` is in the inactive part (it may or may not be a message of this
        queue, or have a deferred ack)."""
        return bool(self.inactive) and self.offered < position <= self._last_held

    def acked(self, position: int) -> bool:
        """An acknowledgement of inactive ``position`` is deferred (rule 4)."""
        return position in self._deferred_acks

    @property
    def deferred_ack_count(self) -> int:
        return len(self._deferred_acks)

    # --- changing --------------------------------------------------------------------------

    def hold(self, position: int) -> None:
        """Rule 2: ``position`` is enqueued beyond the window (after HOLD)."""
        if not self.inactive:
            self._refill_from = position
        self.inactive += 1
        self._last_held = position

    def enter(self, position: int) -> None:
        """Rule 2: ``position`` is enqueued into the active part (after ENQUEUE)."""
        self.offered = position

    def offer(self, position: int) -> bool:
        """Rule 3: inactive ``position`` was read back from the log (and, unless its ack
        was deferred, has moved by ACTIVATE). False: its deferred ack consumed it, it
        never becomes active."""
        self.offered = position
        self._refill_from = position
        acks, heap = self._deferred_acks, self._deferred_ack_heap
        while heap and heap[0] < position:
            acks.discard(heappop(heap))  # passed: not a message of this queue
        acked = position in acks
        if acked:
            acks.discard(position)
            heappop(heap)
        self.inactive -= 1
        if __debug__:
            assert self.inactive >= 0, "more messages activated than held"
        if not self.inactive:  # caught up: nothing deferred can match any more (rule 4)
            acks.clear()
            heap.clear()
            self._refill_from = None
        return not acked

    def defer_ack(self, position: int) -> None:
        """Rule 4: an acknowledgement of inactive ``position`` (after INACTIVE
        --ACKNOWLEDGE-->); not already deferred."""
        if __debug__:
            assert self.is_inactive(position) and position not in self._deferred_acks
        self._deferred_acks.add(position)
        heappush(self._deferred_ack_heap, position)

    # --- snapshots ---------------------------------------------------------------------------

    def export(self) -> tuple[int, int | None, tuple[int, ...]]:
        """(inactive, refill_from, deferred acks ascending)."""
        return self.inactive, self._refill_from, tuple(sorted(self._deferred_acks))

    def restore(
        self, *, offered: int, inactive: int, refill_from: int | None, acks: Iterable[int], last: int
    ) -> None:
        """Load an exported window; ``last``: the queue's last position."""
        self.offered, self.inactive, self._refill_from = offered, inactive, refill_from
        self._last_held = last if inactive else offered
        self._deferred_acks = set(acks)
        self._deferred_ack_heap = sorted(self._deferred_acks)
