"""Queue subscriptions: the consumer record, the backlog rule and the fairness models.

Rules (spec 000):

- "Subscription Backlog": a subscription's backlog is the *minimum* of the ``max_backlog``
  it asked for (1 when it asked for nothing) and the smallest
  ``MaxPerSubscriptionBacklog`` of the queues its topic matches
  (:func:`effective_backlog`). A consumer has room while ``outstanding < max_backlog``.
- A subscription whose topic matches several queues is ONE consumer with ONE backlog:
  the same :class:`Consumer` object is added to every matching queue, and each queue
  counts its deliveries in the shared ``outstanding``.
- "Delivery Fairness", table 15.1 (:func:`choose`), among the consumers that have room
  and whose filter matches the message, in subscription order:
  ``fast``: the first one; ``round-robin``: the first one at or after the one following
  the last consumer served; ``proportional``: the lowest ``outstanding / max_backlog``,
  ties to the first one found.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

from conveyor.config.model import Fairness, QueueConfig
from conveyor.errors import InvalidOption

#: ``max_backlog`` when the subscribe command gives none (spec 000, "Subscription Backlog").
MAX_BACKLOG_DEFAULT = 1


class Consumer:
    """One queue subscription; shared by every queue its topic matches."""

    __slots__ = ("key", "owner", "filter", "max_backlog", "outstanding")

    def __init__(
        self,
        key: Hashable,
        owner: Hashable,
        *,
        filter: Callable[[object], bool] | None = None,
        max_backlog: int = MAX_BACKLOG_DEFAULT,
    ) -> None:
        if max_backlog < 0:
            raise InvalidOption(f"max_backlog must be >= 0, not {max_backlog}")
        self.key = key  # chosen by the engine, e.g. (connection_id, sub_id)
        self.owner = owner  # the connection: who may acknowledge under Leasing=strict
        self.filter = filter  # content filter over the decoded body; None: everything
        self.max_backlog = max_backlog  # effective backlog (effective_backlog)
        # Delivered and not yet acknowledged, over all its queues. Barrier messages never
        # count. The queues keep it; the engine only reads it.
        self.outstanding = 0

    @property
    def room(self) -> int:
        return max(0, self.max_backlog - self.outstanding)

    def __repr__(self) -> str:
        return (
            f"Consumer({self.key!r}, owner={self.owner!r}, "
            f"{self.outstanding}/{self.max_backlog}{', filtered' if self.filter else ''})"
        )


def effective_backlog(requested: int | None, queues: Sequence[QueueConfig]) -> int:
    """min(``requested`` (default 1), the smallest MaxPerSubscriptionBacklog of ``queues``)."""
    backlog = MAX_BACKLOG_DEFAULT if requested is None else requested
    if backlog < 0:
        raise InvalidOption(f"max_backlog must be >= 0, not {backlog}")
    for q in queues:
        if q.max_per_subscription_backlog is not None:
            backlog = min(backlog, q.max_per_subscription_backlog)
    return backlog


def choose(
    fairness: Fairness,
    eligible: Sequence[int],
    consumers: Sequence[Consumer],
    rr_next: int,
) -> int:
    """The index (into ``consumers``) that gets the message. Pure.

    ``eligible``: indices, ascending, of the consumers with room whose filter matches.
    ``rr_next``: for round-robin, the index following the last consumer served.
    """
    if len(eligible) == 1 or fairness is Fairness.FAST:
        return eligible[0]
    if fairness is Fairness.ROUND_ROBIN:
        for i in eligible:
            if i >= rr_next:
                return i
        return eligible[0]  # wrap around
    # Proportional: lowest outstanding / max_backlog, compared as integer cross products
    # so that 1/2 and 2/4 tie exactly; strict "<" keeps the first one found on a tie.
    best = eligible[0]
    b = consumers[best]
    for i in eligible[1:]:
        c = consumers[i]
        if c.outstanding * b.max_backlog < b.outstanding * c.max_backlog:
            best, b = i, c
    return best
