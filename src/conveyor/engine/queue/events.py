"""What a queue says back: events to journal, ack results, statistics (a delivery is a
compiled class of :mod:`conveyor.engine.queue.consumer`).

Every record is frozen and typed (STYLE item 6). Events are ``msgspec.Struct`` so the
engine can encode them as journal records without a copy; each event is exactly one
transition of :mod:`conveyor.engine.queue.state`, and replaying the journaled events in
order (interleaved with the enqueues) through the queue's ``replay`` verbs
(:mod:`conveyor.engine.queue.recovery`) rebuilds the queue.

Fields are only ever appended, with defaults (STYLE item 7).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Hashable, Sequence, Union

import msgspec

from conveyor.engine.queue.priority import EpochImage
from conveyor.engine.queue.store import ChunkImage
from conveyor.errors import NotLeaseHolder


class ExpiryReason(enum.StrEnum):
    """Values of ``AMPS_REASON`` (reference.md C.1); several may apply to one expiry."""

    TIME_LIMIT = "time_limit"  # in the queue longer than Expiration
    MAX_CANCELS = "max_cancels"  # cancelled MaxCancels times
    MAX_DELIVERIES = "max_deliveries"  # delivered MaxDeliveries times without an ack
    FORCED_EXPIRE = "forced_expire"  # acknowledged with the expire option


#: The order reasons are listed in, whatever order they were found in.
REASON_ORDER = (
    ExpiryReason.TIME_LIMIT,
    ExpiryReason.MAX_CANCELS,
    ExpiryReason.MAX_DELIVERIES,
    ExpiryReason.FORCED_EXPIRE,
)


class AckOption(enum.Enum):
    """The ``opts`` of a queue ``sow_delete`` (spec 000, "Acknowledging Messages")."""

    NONE = "none"  # processed: removed
    CANCEL = "cancel"  # returned to the queue, cancel count + 1
    EXPIRE = "expire"  # removed at once, reason forced_expire


# --- events (journal records) ---------------------------------------------------------


class Leased(msgspec.Struct, frozen=True, tag=True):
    """At-least-once delivery; ``count`` is the delivery count including this one."""

    position: int
    consumer_key: Any  # the engine's Hashable key, e.g. (connection_id, sub_id)
    count: int


class DeliveredAtMostOnce(msgspec.Struct, frozen=True, tag=True):
    """At-most-once delivery: the message left the queue for good."""

    position: int


class Acknowledged(msgspec.Struct, frozen=True, tag=True):
    position: int


class Cancelled(msgspec.Struct, frozen=True, tag=True):
    """The lease was cancelled and the message returned; ``cancels`` is the new count.
    ``not_before``: a delayed retry, not offered before that time (0: at once);
    ``reason``: the application's failure reason (docs/queues.md)."""

    position: int
    cancels: int
    not_before: float = 0.0
    reason: str = ""


class LeaseExpired(msgspec.Struct, frozen=True, tag=True):
    """The lease period ran out and the message returned to the queue."""

    position: int


class Returned(msgspec.Struct, frozen=True, tag=True):
    """The lease was broken (unsubscribe, disconnect, restart) and the message returned."""

    position: int


class Expired(msgspec.Struct, frozen=True, tag=True):
    """``reason``: the application's last failure reason for the message (docs/queues.md,
    "Failure reasons"); its delivery count and last consumer are ``Queue.failure_of``'s."""

    position: int
    reasons: tuple[str, ...]
    reason: str = ""


class BarrierDelivered(msgspec.Struct, frozen=True, tag=True):
    """A barrier message went to every current subscriber and left the queue, needing no
    acknowledgement (spec 000, "Synchronizing Work with Barrier Messages")."""

    position: int


Event = Union[
    Leased, DeliveredAtMostOnce, Acknowledged, Cancelled, LeaseExpired, Returned, Expired,
    BarrierDelivered,
]


# --- results --------------------------------------------------------------------------


class TakeBack(enum.Enum):
    """What ``Queue.take_back`` (a named consumer's re-offer) did with one message."""

    RENEWED = "renewed"  # the consumer held the lease: its deadline moved
    TAKEN = "taken"  # it was available: leased again (not counted as a new delivery)
    ELSEWHERE = "elsewhere"  # leased or delivered to another subscriber, inactive, or owned by another instance
    DONE = "done"  # acknowledged or expired


class AckResult(msgspec.Struct, frozen=True):
    """What one ``sow_delete`` did to one queue, message by message."""

    acknowledged: int = 0  # removed as processed
    cancelled: int = 0  # returned to the queue by a cancel (some may then expire)
    expired: int = 0  # removed as expired (forced_expire, or a cancel over a limit)
    released: int = 0  # at-most-once deliveries whose backlog slot was freed
    refused: int = 0  # leased to another owner under Leasing=strict
    ignored: int = 0  # unknown, already done, or nothing to do (cancel of an unleased one)
    events: tuple[Event, ...] = ()  # to journal, in order
    freed: tuple[Hashable, ...] = ()  # consumer keys with backlog freed: dispatch for them
    refused_positions: tuple[int, ...] = ()
    # TargetQueueDepth: acknowledgements of inactive messages, held until the message
    # would become active (it then never does). Each is journaled as Acknowledged.
    deferred: int = 0

    @property
    def deleted(self) -> int:
        """Messages this ack took off the consumer's hands: ``records_deleted``."""
        return self.acknowledged + self.expired + self.released + self.deferred

    def error(self) -> NotLeaseHolder | None:
        """The error to report for refused messages, if any."""
        if not self.refused:
            return None
        return NotLeaseHolder(
            f"{self.refused} message(s) are leased to another subscriber",
            positions=self.refused_positions,
        )


class QueueStats(msgspec.Struct, frozen=True):
    """``/amps/instance/queues`` metrics (reference.md D.1) plus a few of our own.

    Counters are cumulative since this Queue object was built (they reset at restart, as
    ``expired_leases`` does in the reference). Ages need ``now`` and are None without it.
    A msgspec struct, not a dataclass: a scrape builds one per queue, and a frozen
    dataclass of 30 fields takes five times as long to build (3.1 against 0.6 µs).
    """

    name: str
    semantics: str
    queue_depth: int  # unacknowledged messages: available + leased (+ owned elsewhere, replicated)
    available: int
    backlog: int  # leased messages awaiting an ack
    awaiting_ack: int  # at-most-once deliveries whose ack has not arrived (backlog only)
    consumers: int
    max_backlog: int | None  # the configured MaxBacklog (queue rule 6)
    target_queue_depth: int | None
    enqueued: int
    delivered: int
    acknowledged: int
    expired: int
    expired_leases: int
    returned: int  # leases broken (unsubscribe, disconnect, restart)
    cancelled: int
    filter_errors: int  # filter or load calls that raised (treated as "no match")
    age_of_oldest_lease: float | None  # seconds
    seconds_behind: float | None  # age of the oldest unacknowledged message, seconds
    # TargetQueueDepth (reference.md D.1): messages beyond the active window, and
    # acknowledgements held for them. queue_depth counts active messages only.
    inactive_message_count: int = 0
    deferred_ack_count: int = 0
    barriers_delivered: int = 0  # cumulative
    barriers_pending: int = 0  # barrier messages still in the queue
    # Replicated queues (docs/replication.md): messages this instance owns (available and
    # leased here), messages other instances own, and transfers (cumulative).
    owned: int = 0
    elsewhere: int = 0
    transferred_in: int = 0
    transferred_out: int = 0
    proxied_transfer: bool = False  # the engine sets it


@dataclass(frozen=True, slots=True)
class MessageDetail:
    position: int
    state: str  # "available" or "leased"
    published_at: float
    deliveries: int
    cancels: int
    holder: Hashable | None  # consumer key of the lease holder (None: pre-restart lease)
    lease_deadline: float | None
    priority: int | None = None  # priority queues: the value computed at enqueue (-1: NaN)
    barrier: bool = False
    not_before: float | None = None  # a delayed retry: not offered before then
    reason: str = ""  # the application's last failure reason


@dataclass(frozen=True, slots=True)
class QueueDetails:
    """The live state (``/amps/instance/queues/<id>/details``); O(queue) to build."""

    messages: tuple[MessageDetail, ...]  # position order
    awaiting_ack: tuple[tuple[int, Hashable], ...]  # at-most-once (position, consumer key)
    consumers: tuple[tuple[Hashable, int, int], ...]  # (key, outstanding, max_backlog)
    truncated: bool = False  # Queue.details(limit=) left available messages out


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue's state as a snapshot keeps it (``Queue.export_state``): what
    replaying the journal would rebuild, given that no lease survives a restart.

    ``chunks``: the available messages (:meth:`MessageStore.export_chunks`), paged-out
    chunks in page file generation ``page_file``. ``leased`` and ``leased_times``: the
    position and publish time of every leased message (two columns, position order),
    available again after a restart. The TargetQueueDepth window:
    ``offered`` (the last position that entered the active part), ``inactive``,
    ``refill_from`` and the deferred acknowledgements; ``offered`` is ``last_position``
    in a queue without one.
    """

    start: int
    last_position: int
    last_time: float
    chunks: tuple[ChunkImage, ...]
    page_file: int | None
    leased: Sequence[int]
    leased_times: Sequence[float]
    deliveries: dict[int, int]
    cancels: dict[int, int]
    barriers: tuple[int, ...]
    offered: int
    inactive: int = 0
    refill_from: int | None = None
    deferred_acks: tuple[int, ...] = ()
    epochs: tuple[EpochImage, ...] = ()  # a priority queue's order, one per barrier epoch
    leased_keys: Sequence[int] = ()  # a priority queue: the order key of each of ``leased``
    # a replicated queue: the messages another instance owns, (position, owner, publish
    # time, order key, when it arrived here), those leased here whose ownership moved
    # away included (their lease ends with the restart: queue/replica.py rule 3)
    elsewhere: tuple[tuple[int, str, float, int, float], ...] = ()
    # (position, expiry) of each message with an expiry of its own (queue/expiry.py rule 5)
    expiries: tuple[tuple[int, float], ...] = ()
    # delayed retries: (position, not before) of each message held back after a cancel
    # (it is also in ``leased``: available again after a restart, at its time)
    delays: tuple[tuple[int, float], ...] = ()
    reasons: tuple[tuple[int, str], ...] = ()  # (position, the application's failure reason)
