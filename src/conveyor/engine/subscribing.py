"""The subscription commands: subscribe, replace, unsubscribe, and the end of a session.

A subscription's kind is fixed when it is made (:mod:`conveyor.engine.sessions`): a
subscription whose topic names one or more queues is a queue consumer
(:class:`~conveyor.engine.delivery.QueueDelivery`), one with a bookmark replays the
journal (:class:`~conveyor.engine.topics.Topics`), any other is live pub/sub. Rules:

1. ``max_backlog`` is the smallest of the request and every queue's ``MaxPerSubscriptionBacklog``
   (:func:`~conveyor.engine.queue.effective_backlog`).
2. A bookmark subscription to a queue replays the queue's underlying topics, with no
   queue semantics (spec 000, "Bookmark Subscriptions to Queues").
3. ``replace`` is atomic (spec 000, "Replacing Queue Subscriptions"): a queue consumer
   keeps its leases and outstanding count; a topic subscription changes topic and filter
   for every later message; a bookmark (replay) subscription too, keeping its place in
   the log (a bookmark on the replace is refused: it could only be ignored).
4. The filters of one connection together have a worst-case cost per message
   (:mod:`conveyor.engine.filters`): a subscription or replace past it is refused.
5. A bookmark subscription to a literal topic the transaction log does not record is
   refused (``not_recorded``): it would replay nothing and say nothing.
6. A live subscription to a literal name that is no queue and no recorded topic works
   (pub/sub needs no declaration) but its success ack carries a warning in ``reason``,
   with the nearest queue name: it is most often a typo.
7. **Entitlements** (:mod:`conveyor.engine.entitlements`), for a restricted session: a
   queue subscription needs ``consume`` (a bookmark subscription ``replay``) on the
   queues it names, and takes only from those its user may (none: refused); a topic
   subscription needs ``subscribe`` (``replay``) on a literal topic, while a regex
   topic subscription receives only the topics its user may see, checked per topic
   through its topic matcher, so the fan-out cache carries the decision and no message
   pays for it.
   **Entitlement filters** (entitlements.py rule 6): what a subscription gets is its own
   filter AND its user's entitlement filter on the name, resolved when it is made (and
   again on a replace, a resume and a reload: :meth:`Subscriptions.entitle_again`),
   so a message pays the one filter evaluation it always did. A regex topic
   subscription, or a replay of queues, resolves it per topic (cached per user). A
   queue subscription's filter is one for all its queues: one whose queues carry
   different entitlement filters for its user is refused (subscribe to them one by
   one); the messages it is not entitled to stay in the queue for other subscribers.
8. A connection holds at most ``Limits/MaxSubscriptionsPerConnection`` subscriptions.
9. **Pause and resume** (reference B.4). ``resume``, or ``pause`` naming subscriptions
   that exist (or with no topic, or a comma list), acts on every ``sub_id`` of the
   command, all or none (an unknown one: ``unknown_subscription``, nothing changes);
   the engine routes such a command here whatever its topic (:meth:`Subscriptions.controls`).
   ``pause`` on a new ``sub_id`` makes the subscription paused. A paused subscription
   keeps its id, topic, filter and options and gets nothing:

   - pub/sub: live-only, what is published while it is paused is never its;
   - bookmark (replay): keeps its place, and resumed, replays from there to the live
     seam, nothing skipped, nothing twice (engine/topics.py rule 6);
   - queue: its leases are broken at the pause, as when it unsubscribes (the messages
     return to the queue for other consumers; an ack of one is taken as for any
     returned message), and it takes no lease until resumed, from the queues its
     topic names then (entitlements checked again);
   - SOW topic or view records: no update while paused; nothing is sent again on
     resume (engine/sow/followers.py rule 5).

   Pausing a paused subscription, or resuming a running one, changes nothing. A
   ``replace`` keeps the subscription paused or running.
10. ``fenced_acks`` (a queue subscription; docs/queues.md, "Stale acknowledgements"):
    its deliveries carry their delivery count, so its acks can name it and a stale one
    is refused (engine/delivery.py rule 8). Kept across a pause; a ``replace`` sets it
    as its own options say; ignored on other subscriptions.
"""

from __future__ import annotations

import difflib
import logging
from functools import partial
from typing import TYPE_CHECKING, Callable

from conveyor import errors
from conveyor.config.model import client_topic_matcher, is_regex_topic, topic_matcher
from conveyor.protocol.bookmarks import parse_replay_start
from conveyor.engine.delivery import QueueDelivery
from conveyor.engine.entitlements import DECISIONS_CACHED_MAX, NOTHING, Permission, not_entitled
from conveyor.engine.filters import (any_of, check_connection_filters, compile_filter, entitled, own_filter,
                                     per_name)
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort
from conveyor.engine.queue.queue import Consumer, effective_backlog
from conveyor.engine.queue.bindings import QueueBindings, consumer_predicate
from conveyor.engine.sessions import Session, SessionSubscription, SubKind
from conveyor.engine.topics import Topics
from conveyor.protocol import messages as m
from conveyor.protocol.ack_kinds import ack_types
from conveyor.expr import Expression
from conveyor.protocol.options import Options, parse_options

if TYPE_CHECKING:
    from conveyor.engine.sow.state import StateOfTheWorld

log = logging.getLogger("conveyor.engine")

#: The commands that make a subscription, and the name their options are parsed under.
SubscribeCommand = m.Subscribe | m.DeltaSubscribe | m.SowAndSubscribe | m.SowAndDeltaSubscribe
_OPTIONS_OF = {m.Subscribe: "subscribe", m.DeltaSubscribe: "delta_subscribe", m.SowAndSubscribe: "sow_and_subscribe",
               m.SowAndDeltaSubscribe: "sow_and_delta_subscribe"}


class Subscriptions:
    def __init__(self, bindings: QueueBindings, topics: Topics, delivery: QueueDelivery, outbox: Outbox,
                 journal: JournalPort, records: StateOfTheWorld | None = None, recorded: Callable[[str], bool] = lambda topic: True, *,
                 subscriptions_max: int | None = None,
                 describe: Callable[[Session], str] = lambda session: f"connection {session.conn_id}") -> None:
        """``describe(session)``: how log lines name the client (the engine adds its name)."""
        self._records = records  # the StateOfTheWorld: RECORDS subscriptions
        self._recorded = recorded  # whether the transaction log records a topic (rule 5)
        self.subscriptions_max = subscriptions_max  # rule 8, per connection (None: no limit)
        self._bindings = bindings
        self._topics = topics
        self._delivery = delivery
        self._outbox = outbox
        self._journal = journal
        self.describe = describe

    def subscribe(self, session: Session, cmd: m.Subscribe | m.SowAndSubscribe, now: float) -> None:
        opts = parse_options("sow_and_subscribe" if isinstance(cmd, m.SowAndSubscribe) else "subscribe", cmd.options)
        acks = ack_types(cmd.ack_type)
        sub_id = cmd.sub_id or cmd.cid or session.new_sub_id()
        warning = None  # rule 6: told to the client in the success ack's reason
        sub: SessionSubscription | None
        if opts.has("replace"):
            self._replace(session, sub_id, cmd, opts, now)
        else:
            if sub_id in session.subs:
                raise errors.DuplicateSubscription(f"subscription {sub_id!r} already exists (use the replace option)")
            if self.subscriptions_max is not None and len(session.subs) >= self.subscriptions_max:
                raise errors.LimitExceeded(
                    f"this connection holds {len(session.subs)} subscriptions, the limit "
                    "(Limits/MaxSubscriptionsPerConnection)", limit="MaxSubscriptionsPerConnection",
                    max=self.subscriptions_max)
            flt = compile_filter(cmd.filter)
            check_connection_filters([own_filter(s.filter) for s in session.subs.values()], flt)
            bookmark = getattr(cmd, "bookmark", None)
            permission = Permission.REPLAY if bookmark else Permission.CONSUME
            names = self._entitled_queues(session, cmd.topic, permission)
            if bookmark:
                self._subscribe_replay(session, sub_id, cmd, flt, bookmark, names)
            elif names:
                self._subscribe_queue(session, sub_id, cmd, flt, opts.get("max_backlog"), names, now)
                if opts.has("fenced_acks"):  # docs/queues.md, "Stale acknowledgements"
                    self._delivery.fence_acks(session.subs[sub_id].consumer.key, True)
            else:
                sub = SessionSubscription(sub_id, session.conn_id, cmd.topic,
                                          self._topic_matcher(session, cmd.topic, Permission.SUBSCRIBE),
                                          SubKind.PUBSUB, self._topic_filter(session, cmd.topic, Permission.SUBSCRIBE,
                                                                             flt), cmd.cid)
                session.subs[sub_id] = sub
                self._topics.add(sub)
                warning = self._unknown_name_warning(cmd.topic)
            if opts.has("pause"):  # rule 9: made paused
                self._pause(session.subs[sub_id], now)
        sub = session.subs.get(sub_id)
        if warning:
            log.info("%s %s: %s", self.describe(session), sub_id, warning)
        if sub is not None:
            log.info("%s %s: %s to %r (%s%s)", "replaced" if opts.has("replace") else "subscribed", sub_id,
                     self.describe(session), cmd.topic, sub.kind.value, ", paused" if sub.paused else "")
        if "processed" in acks or not acks:
            self._outbox.send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, sub_id=sub_id, reason=warning))

    def _unknown_name_warning(self, topic: str) -> str | None:
        """Rule 6: a live subscription to a literal name that is no queue and no recorded
        topic gets only what is published from now on, and is often a typo."""
        if is_regex_topic(topic) or self._recorded(topic):
            return None
        near = difflib.get_close_matches(topic, list(self._bindings.by_name), n=1)
        hint = f" (did you mean the queue {near[0]!r}?)" if near else ""
        return (f"warning: {topic!r} is not a queue and not a recorded topic: this subscription receives only what "
                f"is published to it from now on, and nothing is kept{hint}")

    def _entitled_queues(self, session: Session, topic: str, permission: Permission) -> list[str]:
        """The queues ``topic`` names that the session may use (rule 7); refused when it
        names queues but none of them is allowed."""
        names = self._bindings.matching(topic)
        if names and session.restricted:
            allowed = [n for n in names if session.grants.allows(permission, n)]
            if not allowed:
                raise not_entitled(session.user_id, permission, topic if len(names) > 1 else names[0])
            names = allowed
        return names

    @staticmethod
    def _topic_matcher(session: Session, topic: str, permission: Permission) -> Callable[[str], bool]:
        """Rule 7 for topics: a literal topic is checked now; a regex one per topic, by
        the session's grants of the moment (a reload takes effect at once)."""
        base: Callable[[str], bool] = client_topic_matcher(topic)  # a client's pattern: RE2
        if not session.restricted:
            return base
        if not is_regex_topic(topic):
            session.grants.check(permission, topic)
            return base

        def matches(name: str, _base: Callable[[str], bool] = base, _s: Session = session,
                    _p: Permission = permission) -> bool:
            return _base(name) and _s.grants.allows(_p, name)
        return matches

    @staticmethod
    def _topic_filter(session: Session, topic: str, permission: Permission,
                      own: Expression | None) -> Expression | None:
        """Rule 7, entitlement filters: ``own`` AND the user's filter on a literal topic;
        on a regex one, the filter of each message's topic."""
        grants = session.grants
        if permission not in grants.filtered:
            return own  # no filtered grant gives it: the common case, nothing to pay
        if not is_regex_topic(topic):
            return entitled(own, grants.filter_for(permission, topic))
        return per_name(own, partial(grants.filter_for, permission), grants.filters(permission))

    def _queue_filter(self, session: Session, names: list[str], own: Expression | None) -> Expression | None:
        """Rule 7, entitlement filters: ``own`` AND the user's filter on its queues, one
        for all of them (a consumer's filter does not know which queue asks)."""
        grants = session.grants
        if Permission.CONSUME not in grants.filtered:
            return own
        found = {n: grants.filter_for(Permission.CONSUME, n) for n in names}
        if len({None if f is None else f.source for f in found.values()}) > 1:
            raise errors.NotEntitled(
                f"user {session.user_id!r} may consume these queues with different entitlement filters ("
                + "; ".join(f"{n}: {f.source if f is not None else 'all messages'}" for n, f in found.items())
                + "): subscribe to them one by one", permission=Permission.CONSUME.value, name=",".join(names))
        return entitled(own, next(iter(found.values()), None))

    def _replay_filter(self, session: Session, topic: str, names: list[str],
                       own: Expression | None) -> Expression | None:
        """Rule 7, entitlement filters, for a replay: of a topic, as a live subscription;
        of queues (rule 2), per topic: the filters of the queues that take it, ORed."""
        grants = session.grants
        if Permission.REPLAY not in grants.filtered:
            return own
        if not names:
            return self._topic_filter(session, topic, Permission.REPLAY, own)
        per = [(topic_matcher(self._bindings.by_name[n].config.underlying), grants.filter_for(Permission.REPLAY, n))
               for n in names]
        possible = tuple(f for _, f in per if f is not None)
        if not possible:
            return own
        cache: dict[str, Expression | None] = {}

        def resolve(t: str) -> Expression | None:
            if t in cache:
                return cache[t]
            if len(cache) >= DECISIONS_CACHED_MAX:
                cache.clear()
            found = [f for matches, f in per if matches(t)]
            filters = tuple(f for f in found if f is not None)
            # a grant without a filter on one of its queues allows the topic whole
            hit = cache[t] = NOTHING if not found else None if len(filters) < len(found) else any_of(filters)
            return hit
        return per_name(own, resolve, possible)

    def _subscribe_queue(self, session: Session, sub_id: str, cmd: m.Subscribe | m.SowAndSubscribe,
                         flt: Expression | None, requested: int | None, names: list[str], now: float) -> None:
        configs = [self._bindings.by_name[n].config for n in names]
        flt = self._queue_filter(session, names, flt)
        consumer = Consumer(
            key=(session.conn_id, sub_id),
            owner=session.conn_id,
            filter=consumer_predicate(flt),
            max_backlog=effective_backlog(requested, configs),
        )
        session.subs[sub_id] = SessionSubscription(
            sub_id, session.conn_id, cmd.topic, client_topic_matcher(cmd.topic), SubKind.QUEUE, flt, cmd.cid,
            consumer=consumer,
        )
        self._delivery.attach(consumer, names, now)

    def _replay_matcher(self, session: Session, topic: str, names: list[str]) -> Callable[[str], bool]:
        """Which recorded topics a replay of ``topic`` reads: a queue's underlying
        topics when ``topic`` names queues (rule 2; ``names`` are those the session
        may replay), else ``topic`` itself as far as the session may replay it (rule 7)."""
        if not names:
            return self._topic_matcher(session, topic, Permission.REPLAY)
        matchers: list[Callable[[str], bool]] = [topic_matcher(self._bindings.by_name[n].config.underlying)
                                                 for n in names]

        def matches(t: str, _ms: list[Callable[[str], bool]] = matchers) -> bool:
            return any(mt(t) for mt in _ms)
        return matches

    def _subscribe_replay(self, session: Session, sub_id: str, cmd: m.Subscribe | m.SowAndSubscribe,
                          flt: Expression | None, bookmark: str, names: list[str]) -> None:
        start = parse_replay_start(bookmark)
        matches = self._replay_matcher(session, cmd.topic, names)  # entitled first (rule 7)
        flt = self._replay_filter(session, cmd.topic, names, flt)
        if not names and not is_regex_topic(cmd.topic) and not self._recorded(cmd.topic):  # rule 5
            raise errors.NotATransactionLogTopic(
                f"cannot replay {cmd.topic!r}: the transaction log does not record it, so there is nothing to "
                "replay; subscribe without a bookmark for live messages, or record the topic (TransactionLog/Topic)",
                topic=cmd.topic)
        sub = SessionSubscription(sub_id, session.conn_id, cmd.topic, matches, SubKind.REPLAY, flt, cmd.cid)
        journal = self._journal
        if start.live_only:
            sub.live = True
        else:
            sub.live = False
            first = journal.first_position
            if start.after_position is not None:
                try:
                    sub.cursor = max(first, journal.position_after(start.after_position))
                except errors.ConveyorError:
                    raise errors.BadBookmark(f"bookmark {bookmark!r} names no message in the transaction log") from None
            else:
                sub.cursor = first
                sub.start_time = start.at_time
        sub.ack_types = ack_types(cmd.ack_type)
        session.subs[sub_id] = sub
        self._topics.add(sub)

    def _replace(self, session: Session, sub_id: str, cmd: m.Subscribe | m.SowAndSubscribe, opts: Options,
                 now: float) -> None:
        sub = session.subs.get(sub_id)
        if sub is None:
            raise errors.UnknownSubscription(f"no subscription {sub_id!r} to replace")
        if sub.kind is SubKind.RECORDS:
            raise errors.InvalidOption(f"subscription {sub_id!r} is to a SOW topic or view: replace it with the "
                                       "command that made it")
        own = compile_filter(cmd.filter)
        check_connection_filters([own_filter(s.filter) for s in session.subs.values() if s is not sub], own)
        if sub.kind is SubKind.REPLAY and getattr(cmd, "bookmark", None):
            raise errors.InvalidOption(
                f"replace of bookmark subscription {sub_id!r} with a bookmark: a replace keeps the replay's "
                "place in the log; send it without a bookmark, or unsubscribe and subscribe again to restart")
        self._retarget(session, sub, cmd.topic, own, opts.get("max_backlog"), now)
        if sub.kind is SubKind.QUEUE:  # the replace's options say whether its acks are fenced
            self._delivery.fence_acks(sub.consumer.key, opts.has("fenced_acks"))

    def _retarget(self, session: Session, sub: SessionSubscription, topic: str, own: Expression | None,
                  requested: int | None, now: float) -> None:
        """Rules 3 and 7: ``sub`` takes from ``topic`` what its user may have now, with its
        own filter ``own`` AND the entitlement filter (a replace, a resume, a reload).
        Everything that can refuse comes before anything changes."""
        matches = sub.matches_topic
        if sub.kind is SubKind.QUEUE:
            names = self._entitled_queues(session, topic, Permission.CONSUME)
            if not names:
                raise errors.InvalidOption(f"replace: {topic!r} matches no queue; unsubscribe instead")
            backlog = effective_backlog(requested, [self._bindings.by_name[n].config for n in names])
            flt = self._queue_filter(session, names, own)
            self._delivery.replace(sub.consumer, names, flt, backlog, now)  # paused: for the resume (rule 9)
        elif sub.kind is SubKind.PUBSUB:
            matches = self._topic_matcher(session, topic, Permission.SUBSCRIBE)
            flt = self._topic_filter(session, topic, Permission.SUBSCRIBE, own)
        else:  # REPLAY: the place in the log is kept; topic and filter change from the next message
            names = self._entitled_queues(session, topic, Permission.REPLAY)
            matches = self._replay_matcher(session, topic, names)
            flt = self._replay_filter(session, topic, names, own)
        sub.matches_topic = matches
        sub.filter = flt
        sub.topic = topic
        self._topics.changed()

    # --- a reload of the entitlements (rule 7) --------------------------------------------------

    def entitle_again(self, session: Session, sub: SessionSubscription,
                      now: float) -> tuple[Permission, list[str]] | None:
        """The session's grants were reloaded (``Engine.set_entitlements``): resolve what
        ``sub`` may receive again, its entitlement filter included. None: it goes on; else
        the permission and names it lost (the engine ends it)."""
        grants = session.grants
        if sub.kind is SubKind.RECORDS:  # a SOW topic's or view's records: one literal name
            assert self._records is not None  # only the StateOfTheWorld makes RECORDS subscriptions
            if not grants.allows(Permission.SUBSCRIBE, sub.topic) or not self._records.entitle_again(
                    sub, grants.filter_for(Permission.SUBSCRIBE, sub.topic)):
                return Permission.SUBSCRIBE, [sub.topic]
            return None
        queue = sub.kind is SubKind.QUEUE
        permission = Permission.CONSUME if queue else Permission.SUBSCRIBE if sub.kind is SubKind.PUBSUB \
            else Permission.REPLAY
        if queue:  # none while paused: decided again at its resume
            queues = list(self._delivery.queues_of(sub.consumer))
            lost = [q for q in queues if not grants.allows(permission, q)]
            if lost:
                return permission, lost
        try:
            if queue and (permission not in grants.filtered and own_filter(sub.filter) is sub.filter
                          and queues == self._entitled_queues(session, sub.topic, permission)):
                return None  # no filter before or after, the same queues: nothing to change
            self._retarget(session, sub, sub.topic, own_filter(sub.filter), sub.consumer.max_backlog if queue else None,
                           now)
        except errors.NotEntitled:
            return permission, [sub.topic]
        return None

    # --- pause and resume (rule 9) -------------------------------------------------------------

    @staticmethod
    def controls(session: Session, cmd: SubscribeCommand) -> bool:
        """Whether ``cmd`` pauses or resumes subscriptions of ``session`` rather than
        making one (rule 9): the engine hands it to :meth:`pause_or_resume`."""
        text = cmd.options
        if not text or ("pause" not in text and "resume" not in text):
            return False  # the usual subscribe: no parsing twice
        opts = parse_options(_OPTIONS_OF[type(cmd)], text)
        if opts.has("resume"):
            return True
        if not opts.has("pause"):
            return False
        ids = _sub_ids(cmd.sub_id)
        return not cmd.topic or len(ids) > 1 or any(i in session.subs for i in ids)

    def pause_or_resume(self, session: Session, cmd: SubscribeCommand, now: float) -> None:
        """``pause`` or ``resume`` of the subscriptions ``cmd.sub_id`` names: all or none (rule 9)."""
        opts = parse_options(_OPTIONS_OF[type(cmd)], cmd.options)
        resume = opts.has("resume")
        verb = "resume" if resume else "pause"
        if resume and opts.has("pause"):
            raise errors.InvalidOption("pause and resume cannot be combined", option="resume")
        if opts.has("replace"):
            raise errors.InvalidOption(f"{verb} cannot be combined with replace: send them as two commands "
                                       "(a replace keeps the subscription paused or running)", option="replace")
        if getattr(cmd, "bookmark", None):
            raise errors.InvalidOption(f"{verb} with a bookmark: a paused bookmark subscription keeps its place "
                                       "and resumes from there; unsubscribe and subscribe again to restart it",
                                       option="bookmark")
        ids = _sub_ids(cmd.sub_id)
        if not ids:
            raise errors.InvalidOption(f"{verb} needs sub_id: the subscription(s) to {verb}, a comma list",
                                       option=verb)
        missing = [i for i in ids if i not in session.subs]
        if missing:
            raise errors.UnknownSubscription(
                f"cannot {verb} {', '.join(repr(i) for i in missing)}: no such subscription on this connection "
                f"(nothing was {verb}d)")
        subs = [session.subs[i] for i in ids]
        if resume:
            # Everything that can refuse first (a queue's entitlements), so that it is all or none.
            queues = [self._entitled_queues(session, s.topic, Permission.CONSUME) if s.kind is SubKind.QUEUE
                      else [] for s in subs]
            for s, names in zip(subs, queues):
                if s.kind is SubKind.QUEUE:
                    self._queue_filter(session, names, own_filter(s.filter))  # refuses if it must
            for sub, names in zip(subs, queues):
                if sub.kind is SubKind.QUEUE and sub.paused:  # the queues its topic names now, their filter
                    self._retarget(session, sub, sub.topic, own_filter(sub.filter), sub.consumer.max_backlog, now)
                self._resume(sub, names, now)
        else:
            for sub in subs:
                self._pause(sub, now)
        log.info("%sd %s: %s", verb, ", ".join(ids), self.describe(session))
        acks = ack_types(cmd.ack_type)
        if "processed" in acks or not acks:
            self._outbox.send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, sub_id=cmd.sub_id))

    def _pause(self, sub: SessionSubscription, now: float) -> None:
        if sub.paused:
            return
        if sub.kind is SubKind.QUEUE:
            sub.pause()
            self._delivery.detach(sub.consumer, now)  # its leases are broken, as by an unsubscribe
        elif sub.kind is SubKind.RECORDS:
            assert self._records is not None  # only the StateOfTheWorld makes RECORDS subscriptions
            sub.pause()
            self._records.pause(sub)
        else:
            self._topics.pause(sub)  # pub/sub, replay: their place is the topics' business

    def _resume(self, sub: SessionSubscription, queues: list[str], now: float) -> None:
        if not sub.paused:
            return
        if sub.kind is SubKind.QUEUE:
            sub.resume()
            self._delivery.attach(sub.consumer, queues, now)
        elif sub.kind is SubKind.RECORDS:
            assert self._records is not None
            sub.resume()
            self._records.resume(sub)
        else:
            self._topics.resume(sub)

    def unsubscribe(self, session: Session, cmd: m.Unsubscribe, now: float) -> None:
        ids = list(session.subs) if cmd.sub_id == "all" else [s.strip() for s in cmd.sub_id.split(",") if s.strip()]
        for sub_id in ids:
            sub = session.subs.get(sub_id)
            if sub is None:
                raise errors.UnknownSubscription(f"no subscription {sub_id!r}")
            self.remove(session, sub, now)
            log.info("unsubscribed %s: %s from %r", sub_id, self.describe(session), sub.topic)
        if "processed" in ack_types(cmd.ack_type):
            self._outbox.send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid))

    def remove(self, session: Session, sub: SessionSubscription, now: float) -> None:
        session.subs.pop(sub.sub_id, None)
        if sub.kind is SubKind.QUEUE:
            self._delivery.detach(sub.consumer, now)
            self._delivery.fence_acks(sub.consumer.key, False)
        elif sub.kind is SubKind.RECORDS:
            assert self._records is not None  # only the StateOfTheWorld makes RECORDS subscriptions
            self._records.remove(sub)
        else:
            self._topics.remove(sub)

    def end_session(self, session: Session, now: float) -> None:
        for sub in list(session.subs.values()):
            self.remove(session, sub, now)


def _sub_ids(text: str | None) -> list[str]:
    """The ids of a comma list, in order, without repeats."""
    return list(dict.fromkeys(part.strip() for part in (text or "").split(",") if part.strip()))
