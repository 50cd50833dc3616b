"""Where a queue's messages come in: a part of :class:`~conveyor.engine.queue.Queue`
that owns the last position entered and the publish-time clamp. Rules:

1. Positions only grow: a message enters above every position seen, or
   :class:`PositionOutOfOrder`; a publish time must be a number (not NaN).
2. Publish times never decrease along positions: each is clamped to the latest one, so
   the oldest message is always the first (a clock that steps back cannot reorder
   expiry).
3. A run of messages obeys rules 1 and 2 as a whole: :meth:`Intake.check_run` checks it
   before anything changes, and :meth:`Intake.enter_run` clamps its times in one pass.
"""

from __future__ import annotations

import math
from itertools import accumulate

from conveyor.engine.queue.state import PositionOutOfOrder, QueueStateError


class Intake:
    __slots__ = ("_name", "last_position", "last_time")

    def __init__(self, name: str, start: int) -> None:
        self._name = name
        self.last_position = start - 1  # before the first message: below the recovery point
        self.last_time = -math.inf

    def check(self, position: int, published_at: float) -> None:
        """Rule 1 for one message (nothing changes)."""
        if position <= self.last_position:
            raise PositionOutOfOrder(
                f"queue {self._name!r}: position {position} is not above {self.last_position}", position=position)
        if published_at != published_at:
            raise QueueStateError(f"queue {self._name!r}: publish time of {position} is NaN")

    def check_run(self, positions: list[int], times: list[float]) -> None:
        """Rule 3: rule 1 for a run (ascending ``positions``; nothing changes)."""
        self.check(positions[0], math.fsum(times))  # fsum: NaN if any time is

    def enter(self, position: int, published_at: float) -> float:
        """``position`` entered (checked already); its publish time, clamped (rule 2)."""
        self.last_position = position
        return self.clamp(published_at)

    def clamp(self, published_at: float) -> float:
        """Rule 2 for a message that enters the queue's messages now, whatever its position."""
        t = self.last_time = max(published_at, self.last_time)
        return t

    def skip(self, position: int) -> None:
        """``position`` was taken but holds no place yet (TargetQueueDepth: inactive)."""
        self.last_position = position

    def enter_run(self, positions: list[int], times: list[float]) -> list[float]:
        """Rule 3: ``positions`` (checked by :meth:`check_run`) entered; their publish
        times, clamped."""
        clamped = list(accumulate(times, max, initial=self.last_time))
        del clamped[0]
        self.last_position, self.last_time = positions[-1], clamped[-1]
        return clamped

    def restore(self, last_position: int, last_time: float) -> None:
        """A snapshot's intake state."""
        self.last_position, self.last_time = last_position, last_time
