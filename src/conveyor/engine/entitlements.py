"""Entitlements: what an authenticated user may do, decided without I/O.

Rules:

1. **Deny by default once authentication is on.** A user may do what some grant of the
   configuration gives them or a group they belong to (``Entitlement/Grant``), and
   nothing else. Without ``Authentication`` every session holds :data:`UNRESTRICTED`
   and nothing is checked.
2. **Names are matched whole.** A literal grant (``orders``) allows that name only; a
   regex grant (``orders\\..*``) must match the whole name. A queue is a topic: the same
   grants name both (spec 000, "queues work with the entitlement system").
3. **One table says what each command needs** (:func:`required`): the permission and
   the name it applies to, for every command kind. Subscriptions are decided by
   :mod:`conveyor.engine.subscribing` from the same permissions, since what they need
   depends on what the topic is (a queue, a bookmark replay, a regex).
4. **Decisions are cached per user and name**, so a publish pays a dict lookup, never a
   regex: :meth:`Grants.allows` compiles nothing and each permission's answer for a name
   is computed once (the cache of one permission is dropped when it holds
   :data:`DECISIONS_CACHED_MAX` names, so a client inventing topic names cannot grow it
   without bound).
5. **Reloadable.** :class:`Entitlements` is immutable; a reload builds a new one and the
   engine re-resolves every session's :class:`Grants` (``Engine.set_entitlements``).
6. **Entitlement filters** (AMPS's, per message). A grant's ``Filter`` restricts what its
   read permissions (:data:`READS`: subscribe, sow, replay, consume) allow on the names
   they list to the messages it matches. Grants add up: on one name, a grant without a
   filter allows every message, else the filters of the grants that allow the name are
   ORed (:meth:`Grants.filter_for`, cached per permission and name like the decisions).
   The engine ANDs that filter with the subscription's or query's own when it starts
   (:func:`~conveyor.engine.filters.entitled`), so a message costs the one filter
   evaluation it always did; a user without filtered grants, and every session without
   authentication, gets None and pays nothing.
"""

from __future__ import annotations

import enum
import re
from typing import Iterable

from conveyor import errors
from conveyor.config.model import Config, Entitlement, Grant, is_regex_topic
from conveyor.engine.filters import any_of, compile_filter
from conveyor.expr import Expression
from conveyor.protocol import messages as m

DECISIONS_CACHED_MAX = 100_000  # names remembered per permission and user


class Permission(enum.Enum):
    PUBLISH = "publish"  # topics
    SUBSCRIBE = "subscribe"  # topics, live
    SOW = "sow"  # topics and queues: queries
    REPLAY = "replay"  # topics and queues: bookmark subscriptions
    CONSUME = "consume"  # queues: leasing subscriptions
    ACKNOWLEDGE = "acknowledge"  # queues: sow_delete by bookmark
    PURGE = "purge"  # queues: sow_delete by filter
    NAMED_CONSUMERS = "named_consumers"  # queues: the Spark source's commands
    TRANSACTIONS = "transactions"  # stage, commit_txn, abort_txn
    ADMIN_READ = "admin_read"  # the admin interface: read
    ADMIN_FULL = "admin_full"  # the admin interface: actions
    REPLICATE = "replicate"  # log on to the incoming replication transport
    READ_JOURNAL = "read_journal"  # journal_segments, journal_read (the Spark journal reader)


#: Permissions that name nothing: the grant is a yes or no.
FLAGS = frozenset({Permission.TRANSACTIONS, Permission.ADMIN_READ, Permission.ADMIN_FULL, Permission.REPLICATE,
                   Permission.READ_JOURNAL})
_NAMED = tuple(p for p in Permission if p not in FLAGS)
#: The permissions that read messages: what a grant's ``Filter`` restricts (rule 6).
READS = (Permission.SUBSCRIBE, Permission.SOW, Permission.REPLAY, Permission.CONSUME)


class _Matcher:
    """The names one permission allows: a set of literals and one alternation of regexes."""

    __slots__ = ("literals", "regex")

    def __init__(self, patterns: Iterable[str]) -> None:
        literals, regexes = set(), []
        for p in patterns:
            if is_regex_topic(p):
                regexes.append(p)
            else:
                literals.add(p)
        self.literals = frozenset(literals)
        self.regex = re.compile("|".join(f"(?:{r})" for r in dict.fromkeys(regexes))) if regexes else None

    def __call__(self, name: str) -> bool:
        return name in self.literals or (self.regex is not None and self.regex.fullmatch(name) is not None)


class Grants:
    """What one user may do (rules 1, 2 and 4). ``unrestricted``: everything."""

    __slots__ = ("user", "unrestricted", "_matchers", "_flags", "_cache", "published", "filtered", "_open",
                 "_by_filter", "_filters")

    def __init__(self, user: str | None, grants: Iterable[Grant] = (), *, unrestricted: bool = False) -> None:
        self.user = user
        self.unrestricted = unrestricted
        grants = tuple(grants)
        self._matchers = {
            p: _Matcher(name for g in grants for name in getattr(g, p.value)) for p in _NAMED
        }
        self._flags = {
            Permission.TRANSACTIONS: any(g.transactions for g in grants),
            Permission.ADMIN_READ: any(g.admin in ("read", "full") for g in grants),
            Permission.ADMIN_FULL: any(g.admin == "full" for g in grants),
            Permission.REPLICATE: any(g.replicate for g in grants),
            Permission.READ_JOURNAL: any(g.read_journal for g in grants),
        }
        self._cache: dict[Permission, dict[str, bool]] = {p: {} for p in _NAMED}
        #: The publish decisions (rule 4), for the engine's hot path to read directly:
        #: ``published.get(topic)`` is True/False once decided, None before.
        self.published = self._cache[Permission.PUBLISH]
        # Rule 6: the read permissions some filtered grant gives (empty: no filter anywhere).
        with_filter = [g for g in grants if g.filter]
        self.filtered = frozenset(p for p in READS for g in with_filter if getattr(g, p.value))
        self._open: dict[Permission, _Matcher] = {}  # what grants without a filter allow
        self._by_filter: list[tuple[Expression, dict[Permission, _Matcher]]] = []
        self._filters: dict[Permission, dict[str, Expression | None]] = {p: {} for p in self.filtered}
        if self.filtered:
            self._open = {p: _Matcher(n for g in grants if not g.filter for n in getattr(g, p.value))
                          for p in self.filtered}
            for g in with_filter:
                flt = compile_filter(g.filter)
                assert flt is not None  # a filter that is not empty compiles to one (or raises)
                self._by_filter.append((flt, {p: _Matcher(getattr(g, p.value)) for p in self.filtered}))

    def allows(self, permission: Permission, name: str = "") -> bool:
        if self.unrestricted:
            return True
        if permission in FLAGS:
            return self._flags[permission]
        cache = self._cache[permission]
        hit = cache.get(name)
        if hit is None:
            if len(cache) >= DECISIONS_CACHED_MAX:
                cache.clear()  # in place: ``published`` is this very dict
            hit = cache[name] = self._matchers[permission](name)
        return hit

    def may_publish(self, topic: str) -> bool:
        """:meth:`allows` for publishing: one dict lookup once decided."""
        hit = self.published.get(topic)
        if hit is None:
            return self.allows(Permission.PUBLISH, topic)
        return hit

    def filter_for(self, permission: Permission, name: str) -> Expression | None:
        """The entitlement filter on the messages of ``name`` (rule 6): None when a grant
        without one allows the name (or no grant of this permission has a filter); the
        OR of the filters of the grants that allow it otherwise. Asked of a name the
        permission allows (a name it does not allow gets :data:`NOTHING`)."""
        cache = self._filters.get(permission)
        if cache is None:
            return None  # no filtered grant gives this permission: the common case
        if name in cache:
            return cache[name]
        if len(cache) >= DECISIONS_CACHED_MAX:
            cache.clear()
        flt: Expression | None = None
        if not self._open[permission](name):
            terms = tuple(f for f, matchers in self._by_filter if matchers[permission](name))
            flt = any_of(terms) if terms else NOTHING
        cache[name] = flt
        return flt

    def filters(self, permission: Permission) -> tuple[Expression, ...]:
        """Every entitlement filter ``permission`` may carry for this user (rule 6)."""
        return tuple(f for f, matchers in self._by_filter if permission in matchers
                     and (matchers[permission].literals or matchers[permission].regex is not None))

    def check(self, permission: Permission, name: str = "") -> None:
        """Raise :class:`~conveyor.errors.NotEntitled` unless allowed."""
        if not self.allows(permission, name):
            raise not_entitled(self.user, permission, name)

    def __repr__(self) -> str:
        return f"Grants(user={self.user!r}, unrestricted={self.unrestricted})"


def not_entitled(user: str | None, permission: Permission, name: str = "") -> errors.NotEntitled:
    what = f"{permission.value} on {name!r}" if name else permission.value
    return errors.NotEntitled(f"user {user!r} is not entitled to {what}", permission=permission.value, name=name)


#: Every session's grants while authentication is off.
UNRESTRICTED = Grants(None, unrestricted=True)
#: The entitlement filter of a name no grant allows (rule 6): fail closed.
NOTHING = compile_filter("FALSE")


class Entitlements:
    """The grants of every user, from ``<Entitlement>`` (rule 5: immutable)."""

    def __init__(self, config: Entitlement | None, *, required: bool) -> None:
        self.required = required  # authentication is on: sessions need a user, deny by default
        self._config = config or Entitlement()
        self._memo: dict[str, Grants] = {}

    @classmethod
    def from_config(cls, config: Config) -> Entitlements:
        return cls(config.entitlement, required=config.authentication is not None)

    def for_user(self, user: str) -> Grants:
        """The user's grants: shared by every session of the user, so decisions are too."""
        if not self.required:
            return UNRESTRICTED
        grants = self._memo.get(user)
        if grants is None:
            groups = {g for g, members in self._config.groups.items() if user in members}
            mine = [g for g in self._config.grants if user in g.users or groups.intersection(g.groups)]
            grants = self._memo[user] = Grants(user, mine)
        return grants


OPEN = Entitlements(None, required=False)


# --- rule 3: what each command needs ----------------------------------------------------

_P = Permission
#: Commands every authenticated session may send: they touch only its own session.
FREE_COMMANDS = (m.Logon, m.Unsubscribe, m.Heartbeat, m.Flush)
#: Subscriptions: decided in subscribing.py, or for a SOW topic's or view's records in
#: ``Engine._records_subscribe`` (rule 3); listed here so the table is whole.
SUBSCRIPTION_COMMANDS = (m.Subscribe, m.SowAndSubscribe, m.DeltaSubscribe, m.SowAndDeltaSubscribe)
_NAMED_CONSUMER_COMMANDS = (m.Claim, m.Lease, m.Fetch, m.AckThrough, m.Extend, m.Reclaim, m.Head, m.ConsumerInfo)


def required(cmd: m.Command) -> list[tuple[Permission, str]]:
    """The permissions ``cmd`` needs, each with the name it applies to."""
    match cmd:
        case m.Publish() | m.DeltaPublish():
            return [(_P.PUBLISH, cmd.topic)]
        case m.Sow():
            return [(_P.SOW, cmd.topic)]
        case m.SowAndSubscribe() | m.SowAndDeltaSubscribe():
            return [(_P.SOW, cmd.topic)]  # and the subscription's own (rule 3)
        case m.Subscribe() | m.DeltaSubscribe():
            return []  # decided where the subscription is made (rule 3)
        case m.SowDelete():
            # By bookmark: acknowledging queue messages. By filter: a purge, of a queue or
            # a SOW topic. By SowKeys or data: the records one could overwrite by publishing.
            if cmd.bookmark:
                return [(_P.ACKNOWLEDGE, cmd.topic)]
            if cmd.filter:
                return [(_P.PURGE, cmd.topic)]
            return [(_P.PUBLISH, cmd.topic)]
        case m.Claim() | m.Lease() | m.Fetch() | m.AckThrough() | m.Extend() | m.Reclaim() | m.Head() | m.ConsumerInfo():
            return [(_P.NAMED_CONSUMERS, cmd.queue)]
        case m.Stage():
            return [(_P.TRANSACTIONS, ""), (_P.PUBLISH, cmd.topic)]
        case m.CommitTxn():
            # A fence acknowledges the named consumer's deliveries in the same step.
            return [(_P.TRANSACTIONS, ""), *((_P.NAMED_CONSUMERS, f.queue) for f in cmd.fences)]
        case m.AbortTxn():
            return [(_P.TRANSACTIONS, "")]
        case m.JournalSegments() | m.JournalRead():
            return [(_P.READ_JOURNAL, "")]  # every record of every topic, payloads included
        case m.Logon() | m.Unsubscribe() | m.Heartbeat() | m.Flush():  # FREE_COMMANDS
            return []
        case _:
            # Fail closed: a command kind added to the protocol without a line here is
            # refused, never allowed by omission.
            raise errors.NotEntitled(f"no entitlement rule for the command {type(cmd).__name__}",
                                     permission="unknown", name=type(cmd).__name__)


def check_command(grants: Grants, cmd: m.Command) -> None:
    """Raise NotEntitled unless ``grants`` allow everything ``cmd`` needs."""
    for permission, name in required(cmd):
        grants.check(permission, name)
