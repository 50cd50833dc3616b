"""Queue subscriptions: the consumer record and the backlog rule.

Rules (spec 000):

- "Subscription Backlog": a subscription's backlog is the *minimum* of the ``max_backlog``
  it asked for (1 when it asked for nothing) and the smallest
  ``MaxPerSubscriptionBacklog`` of the queues its topic matches
  (:func:`effective_backlog`). A consumer has room while ``outstanding < max_backlog``.
- A subscription whose topic matches several queues is ONE consumer with ONE backlog:
  the same :class:`Consumer` object is added to every matching queue, and each queue
  counts its deliveries in the shared ``outstanding``.

The fairness models (which consumer gets a message) are the queue's seats'
(:mod:`conveyor.engine.queue.seats`), which keep the round-robin cursor.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

from conveyor.config.model import QueueConfig
from conveyor.engine.queue.events import BarrierDelivered, DeliveredAtMostOnce, Leased
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
        filter: Callable[[object, float], bool] | None = None,
        max_backlog: int = MAX_BACKLOG_DEFAULT,
    ) -> None:
        if max_backlog < 0:
            raise InvalidOption(f"max_backlog must be >= 0, not {max_backlog}")
        self.key = key  # chosen by the engine, e.g. (connection_id, sub_id)
        self.owner = owner  # the connection: who may acknowledge under Leasing=strict
        self.filter = filter  # filter(decoded body, now); None: everything
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


class Delivery:
    """Send message ``position`` to ``consumer`` (a :class:`Consumer`); never changed once
    made.

    ``lease_deadline`` is None for at-most-once. The engine journals :attr:`event`.

    A barrier message (``barrier=True``) is ONE Delivery for all its recipients:
    ``consumer`` is None, ``recipients`` lists every current consumer whose filter
    matches it (in subscription order; possibly none), ``lease_deadline`` is None and
    ``delivery_count`` 0. Its event is :class:`BarrierDelivered`; it needs no ack and
    counts in no backlog.

    A class of the compiled group, not a msgspec Struct: the delivery path reads about a
    dozen of its fields per message, which compiled code reads directly from a native
    class and through Python's attribute lookup from a Struct.
    """

    __slots__ = ("consumer", "position", "lease_deadline", "delivery_count", "barrier", "recipients")

    def __init__(self, consumer: Any, position: int, lease_deadline: float | None, delivery_count: int,
                 barrier: bool = False, recipients: tuple[Any, ...] = ()) -> None:
        self.consumer = consumer
        self.position = position
        self.lease_deadline = lease_deadline
        self.delivery_count = delivery_count
        self.barrier = barrier
        self.recipients = recipients

    def __repr__(self) -> str:
        return (f"Delivery({self.consumer!r}, {self.position}, {self.lease_deadline}, {self.delivery_count}, "
                f"barrier={self.barrier}, recipients={self.recipients!r})")

    @property
    def event(self) -> Leased | DeliveredAtMostOnce | BarrierDelivered:
        if self.barrier:
            return BarrierDelivered(self.position)
        if self.lease_deadline is None:
            return DeliveredAtMostOnce(self.position)
        return Leased(self.position, self.consumer.key, self.delivery_count)
