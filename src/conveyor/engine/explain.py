"""Why one queue message is, or is not, being delivered: the "explain" of the admin
interface, the dashboard and ``conveyor explain``.

Pure and I/O-free like the rest of the engine: :meth:`Queue.explain` gathers the facts
about one message from the queue's parts (:class:`MessageFacts`, :class:`SeatFacts`),
:func:`explain` turns them into a verdict and sentences, and :func:`explain_message`
adds what only the engine knows (client names, the subscribers' filter texts, whether
this instance owns the queue's messages). Rules, in the order they are checked:

0. **unknown**: no publish of the journal is at the bookmark's position (or the one
   there has another publisher and sequence): a made-up or mistyped bookmark. Every
   other verdict starts with where the message comes from (topic, publisher, sequence).
1. **done**: not in the queue (acknowledged, expired, delivered at-most-once, never
   entered it: the queue filter, another topic, before the recovery point).
2. **leased**: held by a subscriber until its lease deadline (at-least-once), or
   delivered at-most-once and awaiting the acknowledgement that frees the backlog slot.
3. **inactive**: beyond ``TargetQueueDepth``; it becomes active as earlier messages
   are acknowledged.
4. **not owned here**: a replicated queue's message that another instance owns
   (``ELSEWHERE``): that instance delivers it, or grants it here on a transfer request.
   **delayed retry**: cancelled with a delay (or the queue's ``RetryBackoff``), it is
   offered to nobody until its time (docs/queues.md, "Delayed retry").
   **ordering key**: held behind the earlier messages of its ``OrderingKey`` (the first
   ``MaxInFlightPerKey`` of its key are delivered first; docs/queues.md, "Per-key ordering").
5. **catching up**: a replicated queue of an instance that restarted delivers nothing
   until its ``sync`` peers have caught it up (engine/replication/catch_up.py), or the
   wait's limit passes.
6. **behind a barrier**: a barrier message before it is still pending; or it is itself
   a barrier waiting for the messages before it to be acknowledged.
7. **max backlog reached**: the queue's ``MaxBacklog`` outstanding messages are out.
8. Then, per subscriber: filtered out (by which filter), not entitled (its user's
   entitlement filter on the queue rejects it, engine/entitlements.py rule 6), backlog
   full, detached (a replace moved it off this queue), a named consumer (takes only what
   it asks for). With no subscriber: **no consumer**. With a subscriber that matches and
   has room: **deliverable**, waiting behind ``ahead`` older available messages (a
   dispatch is due). When none takes it: **not entitled** if no subscriber may have it,
   else **filtered out** or **backlog full**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Hashable, Mapping

from conveyor.engine.entitlements import Permission
from conveyor.engine.queue.state import MessageState
from conveyor.protocol.bookmarks import format_bookmark

if TYPE_CHECKING:
    from conveyor.engine.core import Engine
    from conveyor.engine.sessions import Session, SessionSubscription

#: :meth:`Queue.explain` counts the available messages ahead of one up to this many.
AHEAD_COUNT_MAX = 100_000


@dataclass(frozen=True, slots=True)
class SeatFacts:
    key: Hashable
    active: bool  # takes deliveries (not detached, not a named consumer)
    named: bool  # a named consumer (the Spark source)
    outstanding: int
    max_backlog: int
    filtered: bool
    matches: bool | None  # its filter on this message (None: no filter or not evaluated)


@dataclass(frozen=True, slots=True)
class MessageFacts:
    """What the queue knows of one position (built by :meth:`Queue.explain`)."""

    queue: str
    position: int
    state: MessageState
    semantics: str
    published_at: float | None
    deliveries: int
    cancels: int
    holder: Hashable | None  # LEASED / CONSUMED: the consumer key
    lease_deadline: float | None
    priority: int | None
    barrier: bool  # it is a pending barrier message
    barriers_before: int  # pending barriers before it
    unacked_before_barrier: int  # a barrier: messages before it still out
    ahead: int | None  # available messages before it in delivery order (capped)
    inactive_count: int
    target_queue_depth: int | None
    outstanding: int  # leased + delivered at-most-once awaiting their ack
    max_backlog: int | None  # the queue's MaxBacklog
    expires_at: float | None  # publish time + Expiration
    seats: tuple[SeatFacts, ...]
    owner: str | None = None  # ELSEWHERE: the instance that owns it
    not_before: float | None = None  # held for a delayed retry until then (queue/returns.py)
    reason: str = ""  # the application's last failure reason (a cancel's or an expire's)
    ordering: tuple[str, int, int] | None = None  # OrderingKey: (key, unfinished before it, leased of those)
    ordering_held: bool = False  # held behind the earlier messages of its key (queue/keys.py)


@dataclass(frozen=True, slots=True)
class SubscriberView:
    key: str  # "connection/sub_id" or "named/<name>"
    client: str | None
    filter: str | None
    outstanding: int
    max_backlog: int
    verdict: str  # would_take, filtered_out, backlog_full, detached, named_consumer
    why: str


@dataclass(frozen=True, slots=True)
class Explanation:
    queue: str
    position: int
    bookmark: str | None
    state: str  # available, leased, consumed, inactive, absent
    verdict: str  # the first rule of the module header that holds
    summary: str  # one sentence
    reasons: tuple[str, ...]
    published_at: float | None
    deliveries: int
    cancels: int
    holder: str | None
    holder_client: str | None
    lease_deadline: float | None
    priority: int | None
    ahead: int | None
    expires_at: float | None
    subscribers: tuple[SubscriberView, ...]


_UNKNOWN = ("no published message has this bookmark: its position names no publish of the journal, or another "
            "message (a made-up or mistyped bookmark)")


def consumer_label(key: Hashable) -> str:
    """A consumer key as text: ``conn/sub_id`` for subscriptions, ``named/NAME``."""
    if isinstance(key, tuple) and len(key) == 2:
        return f"{key[0]}/{key[1]}"
    return str(key)


def explain(
    facts: MessageFacts,
    now: float,
    *,
    bookmark: str | None = None,
    unknown: bool = False,
    origin: str | None = None,
    client_of: Callable[[Hashable], str | None] = lambda key: None,
    filter_of: Callable[[Hashable], str | None] = lambda key: None,
    entitled_of: Callable[[Hashable], bool] = lambda key: True,
) -> Explanation:
    """The verdict on one message (rules 1-8 of the module header; rule 5: :func:`explain_message`)."""
    reasons: list[str] = []
    subscribers = tuple(_subscriber(s, client_of, filter_of, entitled_of) for s in facts.seats)
    state = facts.state
    holder = consumer_label(facts.holder) if facts.holder is not None else None
    holder_client = client_of(facts.holder) if facts.holder is not None else None
    who = f"{holder_client} ({holder})" if holder_client else holder

    def done(verdict: str, summary: str) -> Explanation:
        return Explanation(
            queue=facts.queue, position=facts.position, bookmark=bookmark, state=state.name.lower(),
            verdict=verdict, summary=summary, reasons=tuple(reasons), published_at=facts.published_at,
            deliveries=facts.deliveries, cancels=facts.cancels, holder=holder, holder_client=holder_client,
            lease_deadline=facts.lease_deadline, priority=facts.priority, ahead=facts.ahead,
            expires_at=facts.expires_at, subscribers=subscribers,
        )

    if facts.deliveries:
        reasons.append(f"delivered {facts.deliveries} time(s), cancelled {facts.cancels} time(s)" + _failure(facts))
    if facts.expires_at is not None and state in (MessageState.AVAILABLE, MessageState.LEASED):
        reasons.append(f"expires (Expiration) in {max(0.0, facts.expires_at - now):.1f} s if not acknowledged")
    if unknown:
        return done("unknown", _UNKNOWN)
    reasons += [f"published to {origin}"] if origin is not None else []
    if state in (MessageState.ABSENT, MessageState.CONSUMED) and facts.holder is None:
        return done("done", f"not in queue {facts.queue!r}: acknowledged, expired, delivered at-most-once, "
                            "or it never entered the queue (another topic, the queue filter, before the recovery point)")
    if state is MessageState.LEASED:
        if facts.lease_deadline is None or math.isinf(facts.lease_deadline):
            reasons.append("the lease has no deadline (LeasePeriod is unlimited)")
            return done("leased", f"leased to {who}, with no lease deadline")
        left = facts.lease_deadline - now
        reasons.append(f"the lease ends in {left:.1f} s; then it returns to the queue unless acknowledged")
        return done("leased", f"leased to {who} until {_iso(facts.lease_deadline)} ({left:.1f} s left)")
    if state is MessageState.CONSUMED:
        return done("leased", f"delivered at-most-once to {who}; its acknowledgement frees the backlog slot")
    if state is MessageState.INACTIVE:
        reasons.append(f"{facts.inactive_count} message(s) are beyond TargetQueueDepth {facts.target_queue_depth}")
        return done("beyond_target_depth", f"inactive: beyond TargetQueueDepth {facts.target_queue_depth}; "
                                           "it becomes deliverable as earlier messages are acknowledged")
    if state is MessageState.ELSEWHERE:
        reasons.append(f"instance {facts.owner} owns it; it comes here only if that instance grants a transfer")
        return done("not_owned", f"owned by instance {facts.owner}, which delivers it; not deliverable here")
    # AVAILABLE from here on
    if facts.ordering_held and facts.ordering is not None:
        return done("ordering_key", "waits for the {1} earlier message(s) of its key {0!r} ({2} in flight): at most "
                                    "MaxInFlightPerKey of one key are delivered at a time".format(*facts.ordering))
    if facts.barrier and facts.unacked_before_barrier:
        return done("barrier_waiting", f"a barrier message: it waits for the {facts.unacked_before_barrier} "
                                       "message(s) before it to be acknowledged")
    if facts.barriers_before:
        return done("behind_barrier", f"behind {facts.barriers_before} pending barrier message(s): "
                                      "nothing after a barrier is delivered until it is")
    if facts.max_backlog is not None and facts.outstanding >= facts.max_backlog:
        return done("max_backlog_reached", f"the queue has MaxBacklog {facts.max_backlog} messages outstanding "
                                           f"({facts.outstanding}): no delivery until one is acknowledged")
    if facts.barrier:
        return done("deliverable", "a barrier message ready to go to every matching subscriber")
    active = [s for s in subscribers if s.verdict != "named_consumer" and s.verdict != "detached"]
    if not facts.seats:
        return done("no_consumer", "no subscriber: it waits for one")
    for s in subscribers:
        reasons.append(f"{s.client or s.key}: {s.why}")
    takers = [s for s in subscribers if s.verdict == "would_take"]
    if takers:
        ahead = f"; {facts.ahead} older message(s) go first" if facts.ahead else ""
        return done("deliverable", f"deliverable to {len(takers)} subscriber(s){ahead}")
    return done(*_untaken(active))


def _untaken(active: list[SubscriberView]) -> tuple[str, str]:
    """The verdict on a message no subscriber takes (rule 8): why not."""
    if not active:
        return "no_consumer", "no subscriber takes deliveries from this queue"
    if all(s.verdict == "not_entitled" for s in active):
        return "not_entitled", "no subscriber is entitled to it: each one's user has an entitlement filter it does not match"
    if all(s.verdict in ("filtered_out", "not_entitled") for s in active):
        return "filtered_out", "every subscriber's filter rejects it (or its user is not entitled to it)" if any(
            s.verdict == "not_entitled" for s in active) else "every subscriber's filter rejects it"
    return "backlog_full", "every subscriber whose filter matches has a full backlog"


def _subscriber(s: SeatFacts, client_of: Callable[[Hashable], str | None],
                filter_of: Callable[[Hashable], str | None], entitled_of: Callable[[Hashable], bool]) -> SubscriberView:
    text = filter_of(s.key)
    label = consumer_label(s.key)
    if s.named:
        verdict, why = "named_consumer", "a named consumer: it takes messages only when it asks"
    elif not s.active:
        verdict, why = "detached", "a replace moved its subscription off this queue"
    elif s.matches is False and not entitled_of(s.key):
        verdict, why = "not_entitled", "not entitled: its user's entitlement filter on this queue does not match"
    elif s.matches is False:
        verdict, why = "filtered_out", f"its filter {text or ''} does not match".replace("  ", " ")
    elif s.outstanding >= s.max_backlog:
        verdict, why = "backlog_full", f"its backlog is full ({s.outstanding}/{s.max_backlog})"
    else:
        verdict, why = "would_take", f"matches and has room ({s.outstanding}/{s.max_backlog})"
    return SubscriberView(label, client_of(s.key), text, s.outstanding, s.max_backlog, verdict, why)


def _iso(t: float) -> str:
    import datetime  # formatting only: the engine never reads the clock

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")


def explain_message(engine: Engine, queue: str, bookmark: str, now: float) -> Explanation:
    """The engine's view: resolve ``bookmark`` (a bookmark or a bare position), ask the
    queue, name the subscribers. Raises UnknownTopic / BadBookmark."""
    from conveyor import errors
    from conveyor.protocol.bookmarks import bookmark_positions

    binding = engine.bindings.get(queue)
    if binding is None:
        raise errors.UnknownTopic(f"{queue!r} is not a queue")
    text = bookmark.strip()
    if text.isdigit():
        position = int(text)
    else:
        positions = list(bookmark_positions(text))
        if len(positions) != 1:
            raise errors.BadBookmark(f"{bookmark!r} is not one message's bookmark")
        position = positions[0]
    published = _published(engine, position, text)
    facts = binding.queue.explain(position, now)
    if published is None and facts.state in (MessageState.ABSENT, MessageState.CONSUMED) and facts.holder is None:
        return explain(facts, now, bookmark=bookmark, unknown=True)
    sessions: Mapping[int, Session] = engine.sessions

    def session_sub(key: Hashable) -> tuple[Session | None, SessionSubscription | None]:
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], int):
            session = sessions.get(key[0])
            if session is not None:
                return session, session.subs.get(key[1])
        return None, None

    def client_of(key: Hashable) -> str | None:
        if isinstance(key, tuple) and key and key[0] == "named":
            return f"named consumer {key[1]}"
        session, _ = session_sub(key)
        return session.client_name if session is not None else None

    def filter_of(key: Hashable) -> str | None:
        _, sub = session_sub(key)
        flt = getattr(sub, "filter", None) if sub is not None else None
        source: str | None = getattr(flt, "source", None) if flt is not None else None
        return source

    def entitled_of(key: Hashable) -> bool:
        """Whether the subscriber's user may have this message: its entitlement filter
        on the queue (engine/entitlements.py rule 6) matches, or it has none."""
        session, _ = session_sub(key)
        flt = session.grants.filter_for(Permission.CONSUME, queue) if session is not None else None
        if flt is None:
            return True
        try:
            entry = engine.cache.get(position)
            return bool(flt.matches(entry.decoded(), entry.meta(format_bookmark(entry.publisher, entry.seq, position),
                                                                now)))
        except Exception:  # noqa: BLE001 - as in delivery: a filter that fails does not match
            return False

    catch_up = engine.catch_up
    held = None
    if binding.ownership is not None and not catch_up.done:
        until = catch_up.deadline
        held = ("held: this instance restarted and delivers none of its replicated queues' messages until its "
                f"sync peers ({', '.join(catch_up.peers)}) have caught it up"
                + (f", or for {max(0.0, until - now):.1f} s more at most" if until is not None else ""))
    verdict = explain(facts, now, bookmark=bookmark, client_of=client_of, filter_of=filter_of, origin=published,
                      entitled_of=entitled_of)
    if held is not None and facts.state is MessageState.AVAILABLE:  # rule 5, before what the queue says
        verdict = replace(verdict, verdict="catching_up", summary=held)
    return _delayed(verdict, facts, now)


def _failure(facts: MessageFacts) -> str:
    """The application's last failure reason, as the end of the deliveries' sentence."""
    return f"; last failure reason: {facts.reason!r}" if facts.reason else ""


def _delayed(verdict: Explanation, facts: MessageFacts, now: float) -> Explanation:
    """Rule 4's delayed retry: an available message held until ``not_before``."""
    if facts.not_before is None or facts.state is not MessageState.AVAILABLE:
        return verdict
    return replace(verdict, verdict="delayed_retry", summary=(
        f"cancelled with a delayed retry: offered again from {_iso(facts.not_before)} "
        f"({max(0.0, facts.not_before - now):.1f} s left)"))


def _published(engine: Engine, position: int, text: str) -> str | None:
    """Where the message at ``position`` comes from ("topic 'Work', publisher P, sequence
    S"), or None when no publish of the journal is there, or the one there is not the
    bookmark's (its publisher and sequence differ): a made-up or mistyped bookmark."""
    try:
        entry = engine.cache.get(position)
    except Exception:  # noqa: BLE001 - not a record boundary, past the end, not a publish: no message
        return None
    if not text.isdigit() and text != format_bookmark(entry.publisher, entry.seq, position):
        return None
    return f"topic {entry.topic!r}, publisher {entry.publisher}, sequence {entry.seq}"
