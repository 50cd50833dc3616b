"""The filter work one turn of the shell's loop may do, shared by every part that
evaluates subscribers' filters on the way out: topic fan-out and replays
(:mod:`conveyor.engine.topics` rule 1), queue dispatch (:mod:`conveyor.engine.queue.queue`
rule 12) and SOW record, delta and aggregated subscriptions
(:mod:`conveyor.engine.sow.state` rule 9).

Filters are charged their worst-case cost in ticks (:func:`conveyor.engine.filters.filter_cost_ticks`)
before they run. When the turn cannot afford the next one, the part stops where it is
and goes on in a later turn (the shell pumps it), in order, so a hundred slow filters
cannot stall every other client. At least one filter is evaluated per turn, whatever
its cost, so work always moves.
"""

from __future__ import annotations


class FilterBudgetSpent(Exception):
    """Raised by a part deep in its work when the turn's budget cannot pay the next
    filter; caught where the work can stop cleanly."""


class FilterBudget:
    """Ticks left in the current turn (see the module header)."""

    __slots__ = ("per_turn", "left")

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self.left = per_turn

    def new_turn(self) -> None:
        self.left = self.per_turn

    def take(self, cost: int) -> bool:
        """Charge ``cost``; False, charging nothing, when the turn has spent something
        already and cannot afford it."""
        left = self.left
        if cost > left and left < self.per_turn:
            return False
        self.left = left - cost
        return True
