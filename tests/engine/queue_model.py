"""A small, obviously-correct reference model of one queue, for the simulation test.

Naive on purpose: every message is an object in a dict (kept in position order), every
decision walks all of them, and a restart is modelled as what it means ("every lease is
broken"), not as a journal replay. The real :class:`conveyor.engine.queue.Queue` must
agree with it call by call. Each rule cites spec 000 (the queue chapter).

Priority, barrier messages and TargetQueueDepth are modelled the same way: a sort of
every available message per delivery, a barrier check over every message before it,
and inactive messages kept in the dict with ``active=False`` (the real queue keeps
nothing for them) and activated by :meth:`ModelQueue.refill`, the engine's refill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Hashable

from conveyor.config.model import Fairness, Leasing, QueueConfig, Semantics
from conveyor.engine.queue.events import (
    Acknowledged,
    AckOption,
    BarrierDelivered,
    Cancelled,
    DeliveredAtMostOnce,
    Expired,
    Leased,
    LeaseExpired,
    Returned,
)


@dataclass(eq=False)
class MConsumer:
    key: Hashable
    owner: Hashable
    filter: Callable[[object], bool] | None
    max_backlog: int
    outstanding: int = 0  # shared by every model queue the consumer is in


@dataclass
class MMsg:
    position: int
    published_at: float
    holder: MConsumer | None = None  # the lease holder (at-least-once)
    deadline: float | None = None
    deliveries: int = 0
    cancels: int = 0
    priority: int | None = None  # priority queues: 0 .. 2**64 - 1, or -1 (NaN, lowest)
    barrier: bool = False
    active: bool = True  # False: beyond TargetQueueDepth
    not_before: float = 0.0  # held for a delayed retry until then (0: not held)
    key: str | None = None  # OrderingKey (docs/queues.md, "Per-key ordering")
    key_held: bool = False  # beyond the first MaxInFlightPerKey unfinished messages of its key
    reason: str = ""  # the application's last failure reason


@dataclass
class MDelivery:
    consumer_key: Hashable
    position: int
    lease_deadline: float | None
    delivery_count: int
    barrier: bool = False
    recipients: tuple = ()  # consumer keys (barrier)


def _rank(m: MMsg) -> tuple:
    """Priority Queues: "a descending sort of the value"; NaN lowest; then the oldest."""
    p = -1 if m.priority is None else m.priority
    return (p < 0, -p, m.position)


@dataclass
class ModelQueue:
    config: QueueConfig
    load: Callable[[int], object]
    msgs: dict[int, MMsg] = field(default_factory=dict)  # available + leased, by position
    consumed: dict[int, MConsumer] = field(default_factory=dict)  # at-most-once, unacked
    consumers: list[MConsumer] = field(default_factory=list)  # subscribed, in order
    attached: dict[Hashable, MConsumer] = field(default_factory=dict)  # incl. detached
    rr_next: int = 0
    last_position: int = -1
    last_time: float = -math.inf
    deferred: set[int] = field(default_factory=set)  # acks of inactive messages

    @property
    def alo(self) -> bool:
        return self.config.semantics is Semantics.AT_LEAST_ONCE

    def matches(self, flt, p: int) -> bool:
        return flt is None or bool(flt(self.load(p), 0.0))  # the simulated filters do not read the time

    # --- publish: "The message becomes available in the queue" ---------------------------

    def active_msgs(self) -> dict[int, MMsg]:
        return {p: m for p, m in self.msgs.items() if m.active}

    def inactive(self) -> list[int]:
        return [p for p, m in self.msgs.items() if not m.active]

    def enqueue(self, p: int, t: float, priority: int | None = None, barrier: bool = False,
                key: str | None = None) -> bool:
        assert p > self.last_position
        self.last_position = p
        target = self.config.target_queue_depth
        if target is not None and (self.inactive() or len(self.active_msgs()) >= target):
            # Limiting Currently Deliverable Messages: beyond the depth, inactive.
            self.msgs[p] = MMsg(p, t, active=False)
            return False
        t = max(t, self.last_time)
        self.last_time = t
        self.msgs[p] = m = MMsg(p, t, priority=None if barrier else priority, barrier=barrier,
                                key=None if barrier else key)
        # Per-key ordering: "at most N messages of one key ... in publish order"
        m.key_held = m.key is not None and self._ahead(m) >= self.config.max_in_flight_per_key
        return True

    def _ahead(self, m: MMsg) -> int:
        """Unfinished messages of m's key before it."""
        return sum(1 for x in self.msgs.values() if x.key == m.key and x.position < m.position)

    def releasable(self) -> list[int]:
        """Held messages now among the first N unfinished of their key."""
        n = self.config.max_in_flight_per_key
        return [p for p, m in self.msgs.items() if m.key_held and self._ahead(m) < n]

    def release(self) -> None:
        for p in self.releasable():
            self.msgs[p].key_held = False

    def check_keys(self, leased: set[int]) -> None:
        """No key has more than N leased, and the leased ones are its oldest unfinished."""
        n = self.config.max_in_flight_per_key
        for m in self.msgs.values():
            if m.key is not None and m.position in leased:
                assert self._ahead(m) < n, f"{m.position} of key {m.key!r} leased with {self._ahead(m)} before it"

    def wants(self) -> int:
        target = self.config.target_queue_depth
        if target is None:
            return 0
        return max(0, min(len(self.inactive()), target - len(self.active_msgs())))

    def refill(self) -> int:
        """"As messages are acknowledged from the queue, AMPS will add messages to the
        active part of the queue until the active part of the queue once again reaches
        the TargetQueueDepth"; one acknowledged while inactive is never added."""
        target = self.config.target_queue_depth
        n = 0
        for p in self.inactive():
            if len(self.active_msgs()) >= target:
                break  # it would not be added now
            if p in self.deferred:
                self.deferred.discard(p)
                del self.msgs[p]
                continue
            m = self.msgs[p]
            m.active = True
            m.published_at = max(m.published_at, self.last_time)
            self.last_time = m.published_at
            n += 1
        if not self.inactive():
            self.deferred.clear()
        return n

    def first_barrier(self) -> int | None:
        return next((p for p, m in self.msgs.items() if m.barrier), None)

    def available(self) -> list[int]:
        """Querying Queues as a View, in delivery order: each barrier after the messages
        before it, priority order between two barriers."""
        barriers = [p for p, m in self.msgs.items() if m.barrier]

        def order(m: MMsg) -> tuple:
            epoch = sum(1 for b in barriers if b < m.position)
            return (epoch, m.barrier, _rank(m))

        return [
            m.position
            for m in sorted(
                (m for m in self.msgs.values() if m.holder is None and m.active and not m.not_before
                 and not m.key_held), key=order
            )
        ]

    # --- consumers --------------------------------------------------------------------------

    def add(self, c: MConsumer) -> None:
        self.release()
        self.attached[c.key] = c
        self.consumers.append(c)

    def detach(self, c: MConsumer) -> None:
        if c in self.consumers:
            self._unlist(c)

    def reattach(self, c: MConsumer) -> None:
        if c not in self.consumers:
            self.consumers.append(c)

    def _unlist(self, c: MConsumer) -> None:
        i = self.consumers.index(c)
        del self.consumers[i]
        if i < self.rr_next:
            self.rr_next -= 1

    def remove(self, c: MConsumer, now: float) -> list:
        """Unsubscribe/disconnect: "Leases are broken and messages are returned"."""
        self.detach(c)
        del self.attached[c.key]
        events: list = []
        for p in sorted(self.msgs):
            m = self.msgs.get(p)
            if m is not None and m.holder is c:
                self._lease_ends(m, Returned(p), now, events)
        for p in [p for p, h in self.consumed.items() if h is c]:
            del self.consumed[p]
            c.outstanding -= 1
        return events

    # --- delivery: Message Flow for Queues, step 3 ------------------------------------------

    def _pick(self, eligible: list[int]) -> int:
        fairness = self.config.fairness
        if fairness is Fairness.FAST:
            return eligible[0]  # "the first subscription found"
        if fairness is Fairness.ROUND_ROBIN:
            n = len(self.consumers)
            order = list(range(self.rr_next, n)) + list(range(0, min(self.rr_next, n)))
            return next(i for i in order if i in eligible)  # "the next available"
        # proportional: "the highest proportion of backlog capacity unused", first on a tie
        return min(
            eligible,
            key=lambda i: (
                Fraction(self.consumers[i].outstanding, self.consumers[i].max_backlog),
                i,
            ),
        )

    def _barrier_ready(self, b: int) -> bool:
        """Synchronizing Work with Barrier Messages: "When all previous messages in the
        queue are acknowledged, AMPS delivers the barrier message to all current
        subscribers" (at-most-once: acknowledged by the subscriber, not just sent)."""
        return (
            bool(self.consumers)
            and not any(p < b for p in self.msgs)
            and not any(p < b for p in self.consumed)
        )

    def dispatch(self, now: float, limit: int | None) -> list[MDelivery]:
        self.release()
        out: list[MDelivery] = []
        while limit is None or len(out) < limit:
            b = self.first_barrier()
            if b is not None and self._barrier_ready(b):
                keys = tuple(c.key for c in self.consumers if self.matches(c.filter, b))
                del self.msgs[b]  # "immediately removes the message from the queue"
                out.append(MDelivery(None, b, None, 0, True, keys))
                continue
            chosen = None
            # "the highest priority value ... and the oldest message at that priority",
            # nothing after a barrier that has not been delivered.
            for m in sorted(self.msgs.values(), key=_rank):
                p = m.position
                if m.holder is not None or not m.active or m.barrier or m.not_before or m.key_held:
                    continue
                if b is not None and p > b:
                    continue
                eligible = [
                    i
                    for i, c in enumerate(self.consumers)
                    if c.outstanding < c.max_backlog and self.matches(c.filter, p)
                ]
                if eligible:
                    chosen = (m, eligible)
                    break
            if chosen is None:
                return out
            m, eligible = chosen
            i = self._pick(eligible)
            self.rr_next = i + 1
            c = self.consumers[i]
            c.outstanding += 1
            if self.alo:
                m.deliveries += 1
                m.holder, m.deadline = c, now + self.config.lease_period_s
                out.append(MDelivery(c.key, m.position, m.deadline, m.deliveries))
            else:
                del self.msgs[m.position]  # "removes the message ... when published"
                self.consumed[m.position] = c
                out.append(MDelivery(c.key, m.position, None, 1))
        return out

    @staticmethod
    def delivery_event(d: MDelivery):
        if d.barrier:
            return BarrierDelivered(d.position)
        if d.lease_deadline is None:
            return DeliveredAtMostOnce(d.position)
        return Leased(d.position, d.consumer_key, d.delivery_count)

    # --- limits -------------------------------------------------------------------------

    def _reasons(self, m: MMsg, now: float) -> tuple[str, ...]:
        cfg, r = self.config, []
        if cfg.expiration_s is not None and now >= m.published_at + cfg.expiration_s:
            r.append("time_limit")
        if cfg.max_cancels is not None and m.cancels >= cfg.max_cancels:
            r.append("max_cancels")  # the 3rd cancel with MaxCancels=3 expires
        if cfg.max_deliveries is not None and m.deliveries >= cfg.max_deliveries:
            r.append("max_deliveries")
        return tuple(r)

    def _lease_ends(self, m: MMsg, event, now: float, events: list) -> bool:
        """Back to the queue "just as though the lease had expired", or expired."""
        m.holder.outstanding -= 1
        m.holder = m.deadline = None
        events.append(event)
        reasons = self._reasons(m, now)
        if reasons:
            del self.msgs[m.position]
            events.append(Expired(m.position, reasons, m.reason))
            return True
        return False

    def _delay(self, cancels: int, delay: float | None) -> float:
        """A delayed retry: the asked delay, else the RetryBackoff by cancel count."""
        if delay is not None:
            return delay
        backoff = self.config.retry_backoff_s
        return backoff[min(cancels, len(backoff)) - 1] if backoff else 0.0

    # --- acknowledgement --------------------------------------------------------------------

    def acknowledge(self, positions, by, option: AckOption, now: float, delay: float | None = None,
                    reason: str = "") -> dict:
        self.release()
        strict = self.config.leasing is Leasing.STRICT
        r = dict(
            acknowledged=0, cancelled=0, expired=0, released=0, refused=0, ignored=0,
            deferred=0, events=[], freed=[],
        )
        ev = r["events"]
        for p in positions:
            m = self.msgs.get(p)
            if m is not None and not m.active:
                # "AMPS keeps a list of acknowledgments that have been received for
                # messages that are not in the queue" (cancel / expire: ignored).
                if (option is AckOption.NONE or not self.alo) and p not in self.deferred:
                    self.deferred.add(p)
                    ev.append(Acknowledged(p))
                    r["deferred"] += 1
                else:
                    r["ignored"] += 1
                continue
            if m is not None and m.holder is not None:
                c = m.holder
                if strict and by is not None and by != c.owner:
                    r["refused"] += 1
                    continue
                if c.key not in r["freed"]:
                    r["freed"].append(c.key)
                if option is AckOption.NONE:
                    c.outstanding -= 1
                    del self.msgs[p]
                    ev.append(Acknowledged(p))
                    r["acknowledged"] += 1
                elif option is AckOption.CANCEL:
                    m.cancels += 1
                    r["cancelled"] += 1
                    m.reason = reason or m.reason
                    wait = self._delay(m.cancels, delay)
                    not_before = now + wait if wait > 0 else 0.0
                    if self._lease_ends(m, Cancelled(p, m.cancels, not_before, reason), now, ev):
                        r["expired"] += 1
                    else:
                        m.not_before = not_before
                else:
                    c.outstanding -= 1
                    del self.msgs[p]
                    ev.append(Expired(p, ("forced_expire",), reason or m.reason))
                    r["expired"] += 1
            elif p in self.consumed:
                c = self.consumed[p]
                if strict and by is not None and by != c.owner:
                    r["refused"] += 1
                    continue
                del self.consumed[p]
                c.outstanding -= 1
                r["released"] += 1
                if c.key not in r["freed"]:
                    r["freed"].append(c.key)
            elif m is not None:
                if option is AckOption.NONE or not self.alo:
                    del self.msgs[p]
                    ev.append(Acknowledged(p))
                    r["acknowledged"] += 1
                elif option is AckOption.CANCEL:
                    r["ignored"] += 1
                else:
                    del self.msgs[p]
                    ev.append(Expired(p, ("forced_expire",), reason or m.reason))
                    r["expired"] += 1
            else:
                r["ignored"] += 1
        return r

    def acknowledge_matching(self, predicate, by, option: AckOption, now: float, delay: float | None = None,
                             reason: str = "") -> dict:
        # "A sow_delete that uses a filter will only apply to the messages in the queue
        # that are currently deliverable."
        self.release()
        hits = [p for p, m in self.msgs.items() if m.active and predicate(self.load(p), now)]
        return self.acknowledge(sorted(hits), by, option, now, delay, reason)

    # --- time -----------------------------------------------------------------------------

    def expire(self, now: float) -> list:
        self.release()
        events: list = []
        due = sorted(
            (m.deadline, p) for p, m in self.msgs.items() if m.holder is not None and m.deadline <= now
        )
        for _, p in due:
            self._lease_ends(self.msgs[p], LeaseExpired(p), now, events)
        for _, p in sorted((m.not_before, p) for p, m in self.msgs.items() if 0 < m.not_before <= now):
            m = self.msgs[p]  # a delayed retry's time has come: back, or expired
            m.not_before = 0.0
            reasons = self._reasons(m, now)
            if reasons:
                del self.msgs[p]
                events.append(Expired(p, reasons, m.reason))
        exp = self.config.expiration_s
        if exp is not None:
            for p, m in list(self.msgs.items()):
                if m.holder is None and m.active and not m.not_before and not m.key_held \
                        and now >= m.published_at + exp:
                    del self.msgs[p]
                    events.append(Expired(p, ("time_limit",), m.reason))
        return events

    def next_deadline(self) -> float | None:
        if self.releasable():
            return -math.inf  # a release is due: expire first
        d = [m.deadline for m in self.msgs.values() if m.holder is not None]
        d += [m.not_before for m in self.msgs.values() if m.not_before]
        exp = self.config.expiration_s
        if exp is not None:
            d += [
                m.published_at + exp for m in self.msgs.values()
                if m.holder is None and m.active and not m.not_before and not m.key_held
            ]
        return min(d) if d else None

    def recovery_point(self) -> int:
        """The oldest message not done (a deferred-acked inactive one is done)."""
        undone = [p for p in self.msgs if p not in self.deferred]
        return min(undone) if undone else self.last_position + 1

    # --- restart: "all leases are gone" ---------------------------------------------------

    def crash(self, now: float) -> list:
        """Every lease ends with the restart and its message is back in the queue; one
        whose lease ended at MaxCancels / MaxDeliveries expires (time alone is left to
        the next expire sweep, as for any available message)."""
        events: list = []
        for m in self.msgs.values():
            m.holder = m.deadline = None
            if m.not_before <= now:
                m.not_before = 0.0  # its time passed: replay does not hold it again
        for p, m in list(self.msgs.items()):
            if not m.active:
                continue
            reasons = self._reasons(m, now)
            if reasons and reasons != ("time_limit",):
                del self.msgs[p]
                events.append(Expired(p, reasons, m.reason))
        self.consumed.clear()
        self.consumers.clear()
        self.attached.clear()
        self.rr_next = 0
        self.release()
        return events

    def rows(self) -> list[tuple]:
        """(position, state, published_at, deliveries, cancels, holder key, deadline,
        priority, barrier) of the active messages."""
        return [
            (
                p,
                "available" if m.holder is None else "leased",
                m.published_at,
                m.deliveries,
                m.cancels,
                None if m.holder is None else m.holder.key,
                m.deadline,
                m.priority,
                m.barrier,
            )
            for p, m in self.msgs.items()
            if m.active
        ]


# --- replaying into the real queue ------------------------------------------------------------


def replay(queue, event, now: float) -> None:
    """Apply one journaled event to a real :class:`Queue` through the replay verb the
    engine's recovery maps its journal record to (queue/recovery.py rule 1)."""
    match event:
        case Leased(position=p, count=count):
            queue.replay.delivered(p, now, count=count)
        case DeliveredAtMostOnce(position=p):
            queue.replay.delivered(p, now)
        case Acknowledged(position=p):
            queue.replay.acknowledged(p)
        case Cancelled(position=p, cancels=cancels, not_before=not_before, reason=reason):
            queue.replay.cancelled(p, cancels=cancels, not_before=not_before, reason=reason, now=now)
        case LeaseExpired(position=p) | Returned(position=p):
            queue.replay.returned(p)
        case Expired(position=p):
            queue.replay.expired(p)
        case BarrierDelivered(position=p):
            queue.replay.barrier_delivered(p)
        case _:
            raise TypeError(f"not a queue event: {event!r}")
