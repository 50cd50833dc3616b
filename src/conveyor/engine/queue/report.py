"""What a queue reports about itself, read from its parts and never changing them: the
admin interface's statistics, activity and details, the facts ``explain`` decides on,
and the invariants the simulations check after every step. A part of
:class:`conveyor.engine.queue.queue.Queue`, built once with the parts it reads; the
queue's cumulative counters are read through ``counts()``."""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left
from typing import Any, Callable, Iterable

from conveyor.config.model import QueueConfig
from conveyor.engine.explain import AHEAD_COUNT_MAX, MessageFacts, SeatFacts
from conveyor.engine.queue.events import MessageDetail, QueueDetails, QueueStats
from conveyor.engine.queue.expiry import MessageExpiry
from conveyor.engine.queue.leases import LeaseTable
from conveyor.engine.queue.order import DeliveryOrder
from conveyor.engine.queue.priority import priority_of_key
from conveyor.engine.queue.replica import Replica
from conveyor.engine.queue.returns import Returns
from conveyor.engine.queue.seats import Seat, Seats
from conveyor.engine.queue.state import MessageState
from conveyor.engine.queue.store import MessageStore
from conveyor.engine.queue.window import ActiveWindow

_AVAILABLE = MessageState.AVAILABLE
_LEASED = MessageState.LEASED


class QueueReport:
    def __init__(self, config: QueueConfig, *, order: DeliveryOrder, leases: LeaseTable, seats: Seats,
                 window: ActiveWindow, replica: Replica, stamped: MessageExpiry[int],
                 counts: Callable[[], dict[str, Any]], state_of: Callable[[int], MessageState], load: Callable[[int], object],
                 expiration: Callable[[], float | None], active: Callable[[], int], returns: Returns) -> None:
        """``expiration``: the queue's Expiration now (None once it is kept per message,
        queue/expiry.py rule 4); ``active``: messages in its active part."""
        self._config = config
        self._priority = config.priority is not None
        self._order = order
        self._leases = leases
        self._seats = seats
        self._window = window
        self._replica = replica
        self._stamped = stamped
        self._counts = counts  # the queue's cumulative counters, by name
        self._state_of = state_of
        self._load = load
        self._expiration = expiration
        self._active = active
        self._returns = returns  # held for a delayed retry (queue/returns.py)

    def activity(self) -> tuple[int, int, int, int, int]:
        """(queue depth, in flight, enqueued, delivered, acknowledged): the figures the
        admin interface samples every few seconds for its charts, without building a
        whole :class:`QueueStats` per queue (the depth as ``statistics`` counts it)."""
        leases, counts = self._leases, self._counts()
        in_flight = len(leases.leased) + len(leases.consumed)
        return self.depth(), in_flight, counts["enqueued"], counts["delivered"], counts["acknowledged"]

    def depth(self) -> int:
        """The queue depth as ``statistics`` counts it: available, held for a retry,
        leased, owned elsewhere."""
        return len(self._order.store) + len(self._returns) + len(self._leases.leased) + len(self._replica)

    def statistics(self, now: float | None = None) -> QueueStats:
        leased, store = self._leases.leased, self._order.store
        lease_start = None
        if leased and not math.isinf(self._config.lease_period_s):  # an endless lease's start is not kept
            lease_start = min(lease.deadline for lease in leased.values()) - self._config.lease_period_s
        oldest = [lease.published_at for lease in leased.values()]
        if store:
            head_time = store.head_time()
            assert head_time is not None  # the store is not empty
            oldest.append(head_time)
        cfg = self._config
        available = len(store) + len(self._returns)  # held for a delayed retry too
        owned, elsewhere = available + len(leased), len(self._replica)
        return QueueStats(
            name=cfg.name,
            semantics=cfg.semantics.value,
            # Messages another instance owns are in the queue here too, never delivered
            # here: counted in its depth (docs/replication.md, "What every instance sees").
            queue_depth=owned + elsewhere,
            available=available,
            backlog=len(leased),
            awaiting_ack=len(self._leases.consumed),
            consumers=len(self._seats),
            max_backlog=cfg.max_backlog,
            target_queue_depth=cfg.target_queue_depth,
            age_of_oldest_lease=(
                None if now is None or lease_start is None else max(0.0, now - lease_start)
            ),
            seconds_behind=None if now is None or not oldest else max(0.0, now - min(oldest)),
            inactive_message_count=self._window.inactive,
            deferred_ack_count=self._window.deferred_ack_count,
            barriers_pending=len(self._order.barriers),
            owned=owned,
            elsewhere=elsewhere,
            **self._counts(),
        )

    def details(self, limit: int | None = None) -> QueueDetails:
        """Every tracked message and consumer, for the admin ``details``: O(queue), or
        the first ``limit`` available messages (by position) and every leased one."""
        leases, order = self._leases, self._order
        priorities = order.priorities() if self._priority else {}
        barriers = set(order.barriers)
        rows: list[MessageDetail] = []
        truncated = False
        for p, t in order.store.items():
            if limit is not None and len(rows) >= limit:
                truncated = True
                break
            rows.append(MessageDetail(
                p, "available", t, leases.deliveries_of(p), leases.cancels_of(p), None, None,
                priorities.get(p), p in barriers,
            ))
        for p, lease in leases.leased.items():
            rows.append(
                MessageDetail(
                    p, "leased", lease.published_at, leases.deliveries_of(p), leases.cancels_of(p),
                    lease.seat.consumer.key, lease.deadline,
                    priority_of_key(lease.key) if self._priority else None,
                )
            )
        for p, away in self._replica.items():
            rows.append(
                MessageDetail(
                    p, "elsewhere", away.published_at, leases.deliveries_of(p), leases.cancels_of(p),
                    away.owner, None, priority_of_key(away.key) if self._priority else None,
                    not_before=self._replica.held_until(p) or None,  # its owner's (queue/transfers.py rule 5)
                )
            )
        for p, t, key in self._returns.export()[1]:
            rows.append(MessageDetail(p, "available", t, leases.deliveries_of(p), leases.cancels_of(p), None, None,
                                      priority_of_key(key) if self._priority else None,
                                      not_before=_finite(self._returns.not_before(p))))
        if leases.reasons():
            rows = [_with_reason(r, leases.note_of(r.position)) for r in rows]
        rows.sort(key=lambda r: r.position)
        return QueueDetails(
            messages=tuple(rows),
            awaiting_ack=tuple(sorted((p, s.consumer.key) for p, s in leases.consumed.items())),
            consumers=tuple(
                (s.consumer.key, s.consumer.outstanding, s.consumer.max_backlog)
                for s in self._seats.every()
            ),
            truncated=truncated,
        )

    def explain(self, position: int, now: float) -> MessageFacts:
        """What the queue knows of message ``position``, for :mod:`conveyor.engine.explain`
        (which decides the verdict). Read-only: filters are evaluated without counting
        their errors; O(consumers) filter calls plus, for an available message, the
        messages ahead of it (up to ``AHEAD_COUNT_MAX``)."""
        leases, order, window = self._leases, self._order, self._window
        state = self._state_of(position)
        lease = leases.leased.get(position)
        consumed = leases.consumed.get(position)
        published_at = lease.published_at if lease is not None else order.store.time_of(position)
        not_before = self._returns.not_before(position)
        if not_before is not None:
            published_at = self._returns.time_of(position)
        note = leases.note_of(position)
        barriers = order.barriers
        before = bisect_left(barriers, position)
        is_barrier = before < len(barriers) and barriers[before] == position
        available = state is _AVAILABLE
        seats = _seat_facts(self._seats.every(), lambda: self._load(position), now, available)
        ahead = _count_ahead(order, position) if available else None
        out_before = _out_before(leases, order.store, position) if is_barrier else 0
        priority = None
        if self._priority and available:
            priority = order.priorities().get(position)
        expiration, own_expiry = self._expiration(), self._stamped.expiry_of(position)
        return MessageFacts(
            queue=self._config.name, position=position, state=state, semantics=self._config.semantics.value,
            published_at=published_at, deliveries=leases.deliveries_of(position),
            cancels=leases.cancels_of(position),
            holder=lease.seat.consumer.key if lease is not None else consumed.consumer.key if consumed else None,
            lease_deadline=lease.deadline if lease is not None else None, priority=priority,
            barrier=is_barrier, barriers_before=before if available else 0,
            unacked_before_barrier=out_before, ahead=ahead, inactive_count=window.inactive,
            target_queue_depth=self._config.target_queue_depth, outstanding=len(leases.leased) + len(leases.consumed),
            max_backlog=self._config.max_backlog,
            expires_at=own_expiry if own_expiry is not None else
            None if expiration is None or published_at is None else published_at + expiration,
            seats=tuple(seats), owner=self._replica.owner_of(position),
            not_before=not_before, reason=note[0] if note is not None else "",
        )

    def check_invariants(self) -> None:
        """Every rule too costly to check on each call (AssertionError, with or without
        ``-O``): the parts hold disjoint sets of messages, ``state_of`` names the part
        that holds each one, every lease has its deadline, counts are kept only for
        messages in the queue, each seat holds exactly what is leased or delivered to
        it. O(queue); the simulations call it after every step."""
        leases, store = self._leases, self._order.store
        both = [p for p in leases.leased if p in store]
        _require(not both, f"leased and available at once: {both}")
        for positions, state in (
            (leases.leased, _LEASED), (leases.consumed, MessageState.CONSUMED),
            ((p for p, _ in store.items()), _AVAILABLE),
        ):
            wrong = [p for p in positions if self._state_of(p) is not state]
            _require(not wrong, f"state_of does not say {state.value} for {wrong[:5]}")
        held = self._returns
        _require(not [p for p, _ in held.items() if p in store or p in leases.leased], "held and available at once")
        wrong = [p for p, _ in held.items() if self._state_of(p) is not _AVAILABLE]
        _require(not wrong, f"state_of does not say available for held {wrong[:5]}")
        leases.check(lambda p: p in store or p in leases.leased or p in held)
        for seat in self._seats.every():
            for p in seat.held:
                lease = leases.leased.get(p)
                _require(
                    (lease is not None and lease.seat is seat) or leases.consumed.get(p) is seat,
                    f"{seat.consumer.key!r} holds {p}, which is not leased or delivered to it",
                )
        _require(all(p in store for p in self._order.barriers), "a pending barrier is not available")
        if self._config.target_queue_depth is not None:
            _require(self._active() <= self._config.target_queue_depth, "over the target depth")
        _require(
            all(value >= 0 for value in self._counts().values()),
            "a counter below 0",
        )


def _finite(not_before: float | None) -> float | None:
    """A delayed retry's time; None for a message held behind its OrderingKey (queue/keys.py)."""
    return None if not_before == math.inf else not_before


def _with_reason(row: MessageDetail, note: tuple[str, object] | None) -> MessageDetail:
    """``row`` with the application's failure reason, if one was given."""
    return row if note is None or not note[0] else dataclasses.replace(row, reason=note[0])


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def _seat_facts(seats: Iterable[Seat], body: Callable[[], Any], now: float, available: bool) -> list[SeatFacts]:
    """Each seat's facts; whether its filter matches the message only if it is available
    (a filter that raises is "no match", as in delivery)."""
    out = []
    for seat in seats:
        c = seat.consumer
        matches = None
        if available and c.filter is not None:
            try:
                matches = bool(c.filter(body(), now))
            except Exception:
                matches = False
        named = isinstance(c.key, tuple) and bool(c.key) and c.key[0] == "named"
        out.append(SeatFacts(c.key, seat.active, named, c.outstanding, c.max_backlog, c.filter is not None, matches))
    return out


def _count_ahead(order: Iterable[int], position: int) -> int:
    """Available messages ahead of ``position`` in delivery order, up to AHEAD_COUNT_MAX."""
    ahead = 0
    for p in order:
        if p == position or ahead >= AHEAD_COUNT_MAX:
            break
        ahead += 1
    return ahead


def _out_before(leases: LeaseTable, store: MessageStore, position: int) -> int:
    """Messages before barrier ``position`` not yet acknowledged (leased, delivered, available)."""
    return (sum(1 for p in leases.leased if p < position) + sum(1 for p in leases.consumed if p < position)
            + sum(1 for p, _ in store.items() if p < position))

