"""Typed, frozen configuration. Built by :mod:`conveyor.config.loader` from XML.

Everything here is plain data: expressions stay as text (the engine compiles them at
startup and reports errors with the element path kept in ``*_path`` fields), durations
are float seconds and sizes are int bytes. ``None`` means "not set / unlimited".
"""

from __future__ import annotations

import enum
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from re import _constants as _sre  # the stdlib parser's opcodes (3.11+): what RE2 lacks
from re import _parser as _sre_parse

import re2

from conveyor import errors
from typing import Callable, Iterable

# Characters that make a topic name a regular expression (AMPS treats such topics as
# patterns). A plain name like "orders.eu" stays literal: '.' alone is not enough.
_REGEX_CHARS = re.compile(r"[\^$*+?()\[\]{}|\\]")


def is_regex_topic(topic: str) -> bool:
    return bool(_REGEX_CHARS.search(topic))


#: Longest pattern quoted in an error: a refusal never echoes a kilobyte of it back.
PATTERN_QUOTED_CHARS_MAX = 80


def regex_error(pattern: str) -> tuple[str, int | None] | None:
    """Why ``pattern`` is not a regular expression and the position where it stops
    being one (None when it is not known), or None when it is one. Every way the
    compiler refuses is an answer here, never an exception: re.error (with its
    position), a repeat count too large, parentheses nested too deeply."""
    try:
        _compile(pattern)
    except re.error as exc:
        return exc.msg, exc.pos
    except RecursionError:
        return "parentheses nested too deeply", None
    except (OverflowError, ValueError) as exc:
        return str(exc), None
    return None


def _compile(pattern: str) -> re.Pattern[str]:
    with warnings.catch_warnings():  # e.g. FutureWarning "possible nested set": not the client's business
        warnings.simplefilter("ignore")
        return re.compile(pattern)


def quoted(pattern: str) -> str:
    """``pattern`` as an error quotes it: on one line (repr), cut when long."""
    if len(pattern) > PATTERN_QUOTED_CHARS_MAX:
        return repr(pattern[:PATTERN_QUOTED_CHARS_MAX]) + "..."
    return repr(pattern)


def topic_matcher(pattern: str):
    """A predicate over topic names: exact match, or a regex search for patterns, on
    Python's re: for the configuration's patterns, which are trusted (a client's go
    through :func:`client_topic_matcher`, RE2). A pattern that is not a valid regex
    raises BadTopic, one line naming the pattern and the position (configured patterns
    are checked when the configuration loads, so only a client's can fail here)."""
    if is_regex_topic(pattern):
        try:
            rx = _compile(pattern)
        except Exception:  # noqa: BLE001 - regex_error says which and where
            why = regex_error(pattern) or ("not a valid regular expression", None)
            reason, position = why
            where = "" if position is None else f" at position {position}"
            raise errors.BadTopic(f"topic {quoted(pattern)} is not a valid regular expression: {reason}{where}",
                                  topic=pattern[:PATTERN_QUOTED_CHARS_MAX], position=position) from None
        return lambda name: rx.search(name) is not None
    return lambda name: name == pattern


class _ClientRE2Options(re2.Options):
    """How clients' patterns run on RE2: errors are returned (not logged on stderr), and
    no capture groups: whether a topic matches is all that is asked, which RE2's DFA
    answers."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self.log_errors = False
        self.never_capture = True


_RE2_OPTIONS = _ClientRE2Options()

# Features of Python's re that RE2 does not have (they need backtracking), as named to
# the client whose pattern uses them.
_RE2_LACKS = (
    (_sre.GROUPREF, "backreferences"),
    (_sre.GROUPREF_EXISTS, "conditional groups"),
    (_sre.ASSERT, "lookaround"),
    (_sre.ASSERT_NOT, "lookaround"),
    (_sre.POSSESSIVE_REPEAT, "possessive quantifiers"),
    (_sre.ATOMIC_GROUP, "atomic groups"),
)


def _features_re2_lacks(pattern: str) -> list[str]:
    """The features of ``pattern`` (one that re compiles) that RE2 does not have, in
    the order they first appear; empty when none is known (RE2 then says why)."""
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - re compiled it; a private parser that moved names nothing
        return []
    found: dict[str, None] = {}
    stack: list[object] = [parsed]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, tuple, _sre_parse.SubPattern)):
            items = list(node)
            if len(items) == 2:  # (opcode, argument); opcodes by identity: they are ints, like a range's (1, 5)
                found.update((name, None) for op, name in _RE2_LACKS if items[0] is op)
            stack.extend(reversed(items))
    return list(found)


def client_topic_matcher(pattern: str) -> Callable[[str], bool]:
    """:func:`topic_matcher` for a pattern a client sent (subscribe, sow, queue
    subscriptions...): the regex runs on RE2, in time linear in the topic's length, so no
    pattern can stall the event loop by backtracking (``(a+)+$``). Configuration
    patterns are trusted and keep :func:`topic_matcher` (Python's re).

    The pattern must be valid for re (else today's BadTopic: the reason and position)
    and for RE2: one that only re runs (backreferences, lookaround, possessive
    quantifiers, atomic groups, conditional groups, or what RE2 refuses by its own
    message, e.g. a repeat count over 1000) raises BadTopic naming why. Matching is an
    unanchored search, as for configuration patterns."""
    if not is_regex_topic(pattern):
        return lambda name: name == pattern
    topic_matcher(pattern)  # invalid for re: today's message, with the position
    try:
        rx = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        features = _features_re2_lacks(pattern)
        why = ", ".join(features) if features else "RE2: " + _re2_message(exc)
        raise errors.BadTopic(f"topic {quoted(pattern)} uses a regular expression feature conveyor does not run "
                              f"for clients ({why}): client patterns run in linear time (RE2)",
                              topic=pattern[:PATTERN_QUOTED_CHARS_MAX], position=None) from None

    def matches(name: str, _search: Callable[[str], object] = rx.search) -> bool:
        try:
            return _search(name) is not None
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 topic, so no match (never raised to the loop)
            return False
    return matches


def _re2_message(exc: Exception) -> str:
    """RE2's reason, as text on one line and not too long (it quotes the pattern)."""
    raw = exc.args[0] if exc.args else exc
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    text = " ".join(text.split())
    return text if len(text) <= PATTERN_QUOTED_CHARS_MAX else text[:PATTERN_QUOTED_CHARS_MAX] + "..."


class QueueKind(enum.Enum):
    QUEUE = "Queue"
    LOCAL = "LocalQueue"
    GROUP_LOCAL = "GroupLocalQueue"


class Semantics(enum.Enum):
    AT_LEAST_ONCE = "at-least-once"
    AT_MOST_ONCE = "at-most-once"


class Fairness(enum.Enum):
    FAST = "fast"
    ROUND_ROBIN = "round-robin"
    PROPORTIONAL = "proportional"


class Leasing(enum.Enum):
    # strict: a message leased to one subscription cannot be acknowledged by another
    # client (the ack is refused for that message). sublet (the reference's name; conveyor
    # first called it sloppy, still accepted): any client may ack it.
    STRICT = "strict"
    SUBLET = "sublet"
    SLOPPY = "sublet"  # an alias of SUBLET (the name conveyor used first)


#: The reference's queue defaults (its queue table): a lease never ends on its own (a
#: message comes back on cancel, disconnect or restart) and a subscription holds one
#: unacknowledged message unless the queue allows more. The embedded getting-started
#: configuration sets 60 s and 100 explicitly (docs/configuration.md says why).
LEASE_PERIOD_DEFAULT_S = math.inf
MAX_PER_SUBSCRIPTION_BACKLOG_DEFAULT = 1
#: DeferredAckExpiration default of the reference's queue table: one day.
DEFERRED_ACK_EXPIRATION_S_DEFAULT = 86400.0
FRAME_BYTES_MAX_DEFAULT = 16 * 1024 * 1024  # one frame, incl. a batch of publishes
OUTPUT_BYTES_MAX_DEFAULT = 64 * 1024 * 1024  # unsent output before a slow consumer is cut
JOURNAL_SEGMENT_BYTES_DEFAULT = 1024 * 1024 * 1024  # JournalSize default of the reference
JOURNAL_SEGMENT_BYTES_MIN = 1024 * 1024  # below this, segments churn for no gain
#: <CheckpointSize> default: a checkpoint once the journal grew this much since the last
#: one, so what a restart after a crash replays is bounded (issue 38).
CHECKPOINT_BYTES_DEFAULT = 16 * 1024 * 1024
#: The journal's SEGMENT_BYTES_MAX (journal/format.py), checked when the configuration
#: loads so that a larger JournalSize is a configuration error naming its element.
JOURNAL_SEGMENT_BYTES_MAX = 64 * 1024 * 1024 * 1024


@dataclass(frozen=True)
class Tls:
    """TLS settings of a listener (``tcps``, ``amps-replication-secure``, the admin port)
    or of an outgoing replication link (docs/security.md). Paths are read when the server
    starts and again when certificates are reloaded."""

    certificate: Path | None = None  # PEM chain; required on a listener
    private_key: Path | None = None  # PEM; required on a listener
    ca_file: Path | None = None  # listener: CAs for client certificates; link: CAs for the destination
    # Listener only: "none" (no client certificate asked), "optional" (verified when
    # given), "required" (the handshake fails without one signed by CAFile).
    client_certificates: str = "none"
    ciphers: str | None = None  # OpenSSL cipher list for TLS 1.2 (TLS 1.3 suites are fixed)
    path: str = field(default="", compare=False)


@dataclass(frozen=True)
class Transport:
    name: str
    type: str = "tcp"  # "tcp" (client connections) or "replication" (incoming replication)
    # A bare port in InetAddr means loopback: exposing a port is written explicitly.
    host: str = "127.0.0.1"
    port: int = 9007
    protocol: str = "conveyor"  # "amps" is accepted as a synonym
    message_type: str | None = None
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT  # <MaxFrameSize>
    output_bytes_max: int = OUTPUT_BYTES_MAX_DEFAULT  # <SlowClientDisconnectThreshold>
    idle_timeout_s: float | None = None  # <IdleTimeout>: close connections silent this long
    tls: Tls | None = None  # Type tcps / amps-replication-secure
    # Element path in the XML, for errors found when the server binds it (not part of
    # what the transport is: two equal transports may sit at different paths).
    path: str = field(default="", compare=False)


@dataclass(frozen=True)
class Admin:
    host: str = "127.0.0.1"
    port: int = 8085
    file_name: str | None = None
    tls: Tls | None = None  # <Certificate>/<PrivateKey>...: serve the admin interface over HTTPS


#: Default size at which a log file is rotated: small enough to open in an editor.
LOG_ROTATION_BYTES_DEFAULT = 100 * 1024 * 1024
#: Rotated files kept per target by default: about 1 GB of history at the default size.
LOG_ROTATION_COUNT_DEFAULT = 10


@dataclass(frozen=True)
class LogTarget:
    protocol: str  # one of PROTOCOLS
    level: int = 20  # a Python logging level (logging.INFO)
    file_name: Path | None = None  # file and gzip targets
    rotation_bytes: int = LOG_ROTATION_BYTES_DEFAULT  # <RotationThreshold>
    rotation_count: int = LOG_ROTATION_COUNT_DEFAULT  # <RotationCount>
    path: str = ""  # the <Target> element's path, for errors at startup


@dataclass(frozen=True)
class RecordedTopic:
    """A ``TransactionLog/Topic``: messages on matching topics are journaled."""

    name: str  # literal or regex (see is_regex_topic)
    message_type: str = "json"
    # A Replication/Destination's Topic only: the content filter a message of the topic
    # must match to be replicated to that destination (reference E.1); None: every one.
    filter: str | None = None

    def matches(self, topic: str) -> bool:
        return topic_matcher(self.name)(topic)


@dataclass(frozen=True)
class Retention:
    """Which sealed segments may be removed once no queue or consumer needs them."""

    max_age_s: float | None = None
    max_bytes: int | None = None


#: Background scrub (TransactionLog/Scrub): bytes of journal re-read per second, low
#: enough to stay in the noise of a disk's bandwidth, high enough to read 700 GB a day.
SCRUB_BYTES_PER_S_DEFAULT = 8 * 1024 * 1024
#: A new scrub pass starts this long after the previous one started (or at once, when
#: the previous pass took longer).
SCRUB_INTERVAL_S_DEFAULT = 24 * 3600.0


@dataclass(frozen=True)
class Scrub:
    """``TransactionLog/Scrub``: re-read the journal in the background and check every
    record's CRC, so bit rot is found before a reader needs the record (docs/journal.md)."""

    bytes_per_s: int = SCRUB_BYTES_PER_S_DEFAULT  # <Rate>; 0: no background scrub
    interval_s: float = SCRUB_INTERVAL_S_DEFAULT  # <Interval>


@dataclass(frozen=True)
class TransactionLog:
    journal_directory: Path
    topics: tuple[RecordedTopic, ...] = ()
    # FlushInterval: how long the writer may wait to gather a group before fsync.
    # 0 means "commit as soon as the previous commit finishes" (natural batching).
    flush_interval_s: float = 0.0
    segment_bytes: int = JOURNAL_SEGMENT_BYTES_DEFAULT  # <JournalSize> / <MinJournalSize>
    preallocated_journal_files: int = 2  # accepted for compatibility
    archive_directory: Path | None = None
    retention: Retention = field(default_factory=Retention)
    # <FreeSpaceWarning>: warn while the journal's file system has less free than this;
    # None: two segments' worth (room for the next segment and its successor); 0: never.
    free_space_warning_bytes: int | None = None
    scrub: Scrub = field(default_factory=Scrub)
    # <CheckpointSize>: checkpoint also once the journal grew by this much since the last
    # checkpoint, not only every CHECKPOINT_INTERVAL_S; 0: only the periodic one.
    checkpoint_bytes: int = CHECKPOINT_BYTES_DEFAULT

    @property
    def free_space_warning(self) -> int:
        """The effective FreeSpaceWarning, in bytes (0: never warn)."""
        if self.free_space_warning_bytes is None:
            return 2 * self.segment_bytes
        return self.free_space_warning_bytes

    def records(self, topic: str) -> bool:
        return any(t.matches(topic) for t in self.topics)


@dataclass(frozen=True)
class QueueConfig:
    name: str
    message_type: str
    kind: QueueKind = QueueKind.QUEUE
    underlying_topic: str | None = None  # None: the queue's own name
    default_publish_target: str | None = None
    semantics: Semantics = Semantics.AT_LEAST_ONCE
    lease_period_s: float = LEASE_PERIOD_DEFAULT_S
    expiration_s: float | None = None
    max_backlog: int | None = None
    max_per_subscription_backlog: int | None = MAX_PER_SUBSCRIPTION_BACKLOG_DEFAULT
    fairness: Fairness = Fairness.PROPORTIONAL
    max_cancels: int | None = None
    max_deliveries: int | None = None
    priority: str | None = None  # expression text
    barrier_expression: str | None = None  # filter text
    target_queue_depth: int | None = None
    leasing: Leasing = Leasing.SUBLET  # the reference's default (G.8 of its queue table)
    recovery_point: str | None = None
    # <DeferredAckExpiration>: how long an acknowledgement of a message not (yet) here is
    # kept, so the message is dropped when it arrives (replicated queues, ownership.py).
    deferred_ack_expiration_s: float = DEFERRED_ACK_EXPIRATION_S_DEFAULT
    file_backed_metadata: bool = False
    filter: str | None = None  # queue-level filter: which messages enter the queue
    initial_owner: str | None = None  # GroupLocalQueue
    group_local_queue_domain: str | None = None
    path: str = ""  # element path in the XML, for error messages
    # <RetryBackoff>: how long a cancelled message waits before it is offered again, by
    # its cancel count (the last value repeats; docs/queues.md, "Delayed retry"); (): at once
    retry_backoff_s: tuple[float, ...] = ()
    # <OrderingKey>: an expression over the message (as a SOW Key) naming its key; at most
    # <MaxInFlightPerKey> messages of one key delivered at a time, in publish order
    # (docs/queues.md, "Per-key ordering"); None: no per-key ordering
    ordering_key: str | None = None
    max_in_flight_per_key: int = 1

    @property
    def underlying(self) -> str:
        return self.underlying_topic or self.name

    def takes_from(self, topic: str) -> bool:
        """Whether a message recorded on ``topic`` enters this queue."""
        return topic_matcher(self.underlying)(topic)


#: Expiry reasons (``AMPS_REASON`` values) an ``amps-action-on-sow-expire-message`` may
#: filter on with ``Reason``. The reference lists the first three (C.1, the list is cut
#: off there); ``max_deliveries`` is ours, for the ``MaxDeliveries`` limit.
EXPIRE_REASONS = frozenset({"time_limit", "forced_expire", "max_cancels", "max_deliveries"})


@dataclass(frozen=True)
class OnSowExpire:
    """``amps-action-on-sow-expire-message``."""

    topic: str
    message_type: str
    reasons: frozenset[str] | None = None  # None: every reason


@dataclass(frozen=True)
class DoPublish:
    """``amps-action-do-publish-message``."""

    topic: str
    message_type: str
    data: str  # template with {{AMPS_DATA}}, {{AMPS_REASON}}, ...
    delta: bool = False
    update_only: bool = False


@dataclass(frozen=True)
class OnPublish:
    """``amps-action-on-publish-message``: a message published on ``topic`` (a name or
    regex) of ``message_type``, matching ``filter``, from ``source`` (``all``, ``local``:
    published here, ``replicated``: received by replication)."""

    topic: str
    message_type: str
    filter: str | None = None
    source: str = "all"


@dataclass(frozen=True)
class DoProxiedTransfer:
    """``amps-action-do-enable-proxied-transfer`` / ``...-disable-...`` for the queues
    whose name matches ``queue`` (a name or regex)."""

    queue: str
    message_type: str
    enable: bool


@dataclass(frozen=True)
class Action:
    on: OnSowExpire | OnPublish
    do: tuple[DoPublish | DoProxiedTransfer, ...]
    path: str = ""


@dataclass(frozen=True)
class LinkEndpoint:
    """One address of a destination's failover list, with how to reach it: TLS
    (``amps-replication-secure``) and the credentials this instance logs on with."""

    address: str
    tls: Tls | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr or a log


@dataclass(frozen=True)
class ReplicationDestination:
    name: str  # the Name of the instance it replicates to (checked at the handshake)
    group: str | None
    sync_type: str  # "sync" | "async"
    addresses: tuple[str, ...] = ()  # failover list, in priority order
    topics: tuple[RecordedTopic, ...] = ()
    pass_through: str | None = None
    # <DowngradeAge>: a sync destination whose oldest unacknowledged record is older than
    # this is treated as async until it is back under <UpgradeAge> (default: half).
    downgrade_age_s: float | None = None
    upgrade_age_s: float = 0.0
    # The addresses again, each with its transport's TLS and credentials (same order).
    endpoints: tuple[LinkEndpoint, ...] = field(default=(), compare=False)


#: <Replication><RecoveryCatchUpTimeout>: how long a starting instance holds the deliveries
#: of its replicated queues for its sync peers to catch it up (docs/replication.md).
RECOVERY_CATCH_UP_TIMEOUT_S_DEFAULT = 30.0


@dataclass(frozen=True)
class Replication:
    destinations: tuple[ReplicationDestination, ...] = ()
    # <RecoveryCatchUpTimeout>: 0 = do not wait.
    recovery_catch_up_timeout_s: float = RECOVERY_CATCH_UP_TIMEOUT_S_DEFAULT

    def replicated_queues(self, queues: Iterable[QueueConfig]) -> frozenset[str]:
        """The queues whose replicated messages follow ownership (a ``Queue`` or
        ``GroupLocalQueue`` whose name a destination's ``Topic`` matches)."""
        matchers = [topic_matcher(t.name) for d in self.destinations for t in d.topics]
        return frozenset(q.name for q in queues
                         if q.kind is not QueueKind.LOCAL and any(m(q.name) for m in matchers))


#: Limits (a conveyor extension): unsent output across every connection. One slow
#: consumer alone may use its whole SlowClientDisconnectThreshold (64 MiB by default);
#: several share twice that, so a handful of readers that stopped reading cannot take
#: the server's memory with them.
OUTPUT_BUDGET_BYTES_DEFAULT = 2 * OUTPUT_BYTES_MAX_DEFAULT
#: A connection that has sent nothing for this long and holds no subscription is closed
#: unless its transport sets IdleTimeout (which then applies to every connection).
IDLE_TIMEOUT_S_DEFAULT = 3600.0
#: Limits (a conveyor extension): the resident state of every FileBackedMetadata queue
#: together (16 bytes per message in the store, 16 more in a priority index), before
#: the least recently used chunks are paged out. 1 GiB holds 64 million messages'
#: entries: a deep backlog stays in memory on a server host, while a runaway one cannot
#: take the host's memory. A fixed default, not a share of the host's memory, so a
#: configuration means the same on every machine (docs/configuration.md, Limits).
QUEUE_METADATA_MEMORY_BYTES_DEFAULT = 1024 * 1024 * 1024


#: Defaults of ``<Limits>`` (docs/configuration.md): generous for one application,
#: small enough that one client cannot take the server's memory or file descriptors.
CONNECTIONS_MAX_DEFAULT = 10_000
CONNECTIONS_PER_USER_MAX_DEFAULT = 1_000
SUBSCRIPTIONS_PER_CONNECTION_MAX_DEFAULT = 10_000
TOPIC_CHARS_MAX_DEFAULT = 1024
PENDING_LOGONS_MAX_DEFAULT = 256
LOGON_TIMEOUT_S_DEFAULT = 10.0
FAILED_LOGONS_PER_ADDRESS_MAX_DEFAULT = 10
FAILED_LOGONS_PER_USER_MAX_DEFAULT = 10
FAILED_LOGON_WINDOW_S_DEFAULT = 60.0


@dataclass(frozen=True)
class Limits:
    """``<Limits>``: bounds on what the server as a whole holds for its clients, and
    on what one client may take of it."""

    output_budget_bytes: int = OUTPUT_BUDGET_BYTES_DEFAULT  # <OutputBudget>
    idle_timeout_s: float = IDLE_TIMEOUT_S_DEFAULT  # <IdleTimeout>: connections with no subscription
    connections_max: int = CONNECTIONS_MAX_DEFAULT  # <MaxConnections>
    connections_per_user_max: int = CONNECTIONS_PER_USER_MAX_DEFAULT  # <MaxConnectionsPerUser>
    subscriptions_per_connection_max: int = SUBSCRIPTIONS_PER_CONNECTION_MAX_DEFAULT  # <MaxSubscriptionsPerConnection>
    topic_chars_max: int = TOPIC_CHARS_MAX_DEFAULT  # <MaxTopicLength>, characters
    # <MaxPendingLogons>: connections not yet authenticated (with Authentication).
    pending_logons_max: int = PENDING_LOGONS_MAX_DEFAULT
    logon_timeout_s: float = LOGON_TIMEOUT_S_DEFAULT  # <LogonTimeout>
    # The failed-logon limit (security/ratelimit.py): wrong credentials (never missing
    # ones) within <FailedLogonWindow>, per client host and per user name tried; over
    # either, wrong answers are delayed. A correct credential is never refused by it.
    failed_logons_per_address_max: int = FAILED_LOGONS_PER_ADDRESS_MAX_DEFAULT  # <MaxFailedLogonsPerAddress>
    failed_logons_per_user_max: int = FAILED_LOGONS_PER_USER_MAX_DEFAULT  # <MaxFailedLogonsPerUser>
    failed_logon_window_s: float = FAILED_LOGON_WINDOW_S_DEFAULT  # <FailedLogonWindow>
    # <QueueMetadataMemory>: FileBackedMetadata queues page out past it (engine/queue/budget.py)
    queue_metadata_memory_bytes: int = QUEUE_METADATA_MEMORY_BYTES_DEFAULT


@dataclass(frozen=True)
class SowTopicConfig:
    """A ``SOW/Topic``: the latest message per key of a recorded topic (docs/sow-and-views.md).

    The records are a fold over the topic's publishes in the transaction log: nothing
    is stored twice. ``keys`` are the ``Key`` field paths (none: publishers send the key
    in ``sow_key``). ``expiration_s``: the default lifetime of a record; with
    ``expiration`` on and no default, only publishes that carry an expiration expire."""

    name: str
    message_type: str
    keys: tuple[str, ...] = ()
    key_domain: str | None = None
    expiration: bool = False  # <Expiration> present (an interval, or "enabled")
    expiration_s: float | None = None  # the default lifetime (None: only per-publish)
    file_name: str | None = None  # accepted for compatibility: the store is the log
    path: str = ""

    @property
    def domain(self) -> str:
        return self.key_domain or self.name


@dataclass(frozen=True)
class JoinConfig:
    """``[left].[/f]=[right].[/g]`` of a view's ``UnderlyingTopic/Join``."""

    left_topic: str
    left_field: str
    right_topic: str
    right_field: str
    path: str = ""


@dataclass(frozen=True)
class ViewConfig:
    """A ``SOW/View``: projection and grouping over one underlying topic (a SOW topic,
    a view or a queue) or a left outer join of several (docs/sow-and-views.md)."""

    name: str
    message_type: str
    underlying: tuple[str, ...]  # one topic, or the topics of the joins, left first
    projection: tuple[str, ...]
    grouping: tuple[str, ...]
    joins: tuple[JoinConfig, ...] = ()
    filter: str | None = None
    conflation: str = "none"  # "none" | "inline"
    key_domain: str | None = None
    join_null_equivalency: bool = False
    path: str = ""

    @property
    def domain(self) -> str:
        return self.key_domain or self.name


#: ``ConflatedTopic/Interval``: its default and the shortest accepted (reference G.1.6).
CONFLATED_INTERVAL_S_DEFAULT = 5.0
CONFLATED_INTERVAL_S_MIN = 0.1


@dataclass(frozen=True)
class ConflatedTopicConfig:
    """A ``SOW/ConflatedTopic``: a read-only copy of a SOW topic, a view or another
    conflated topic, keyed like it, whose records change at most once per key per
    ``interval_s`` (docs/sow-and-views.md). ``filter``: only matching records are in it."""

    name: str
    message_type: str
    underlying: str  # a SOW topic, view or conflated topic declared before it
    interval_s: float = CONFLATED_INTERVAL_S_DEFAULT
    filter: str | None = None
    path: str = ""


@dataclass(frozen=True)
class Authentication:
    """``<Authentication>``: logons must prove who they are (docs/security.md)."""

    users_file: Path | None = None  # <UsersFile>: user names and argon2 password hashes
    # <ClientCertificates>: a client certificate verified by a transport's CAFile
    # authenticates its subject's common name, without a password.
    client_certificates: bool = False
    path: str = field(default="", compare=False)


@dataclass(frozen=True)
class Grant:
    """``Entitlement/Grant``: what some users and groups may do. Every name list holds
    literal names or regexes matched against the whole name; ``filter`` restricts what
    the read permissions of this grant allow to the messages it matches."""

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()  # topics (a queue is a topic)
    subscribe: tuple[str, ...] = ()  # topics, live
    sow: tuple[str, ...] = ()  # topics and queues: queries
    replay: tuple[str, ...] = ()  # topics and queues: bookmark subscriptions
    consume: tuple[str, ...] = ()  # queues: subscriptions that lease messages
    acknowledge: tuple[str, ...] = ()  # queues: sow_delete by bookmark
    purge: tuple[str, ...] = ()  # queues: sow_delete by filter
    named_consumers: tuple[str, ...] = ()  # queues: the Spark source's commands
    transactions: bool = False  # stage, commit_txn, abort_txn (rows still need publish)
    admin: str | None = None  # "read" or "full"
    replicate: bool = False  # may log on to the incoming replication transport
    read_journal: bool = False  # journal_segments, journal_read: every record, over the client port
    #: An entitlement filter: the read permissions above (subscribe, sow, replay, consume)
    #: allow only the messages it matches on the names they list (None: all of them).
    filter: str | None = None
    path: str = field(default="", compare=False)


@dataclass(frozen=True)
class Entitlement:
    """``<Entitlement>``: groups of users and what they are granted. Deny by default."""

    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> members
    grants: tuple[Grant, ...] = ()


@dataclass(frozen=True)
class Config:
    name: str = "conveyor"
    group: str | None = None
    transports: tuple[Transport, ...] = ()
    admin: Admin | None = None
    logging: tuple[LogTarget, ...] = ()  # <Logging>: empty means stderr at info
    transaction_log: TransactionLog | None = None
    queues: tuple[QueueConfig, ...] = ()
    sow_topics: tuple[SowTopicConfig, ...] = ()
    views: tuple[ViewConfig, ...] = ()
    conflated_topics: tuple[ConflatedTopicConfig, ...] = ()
    actions: tuple[Action, ...] = ()
    replication: Replication | None = None
    authentication: Authentication | None = None
    entitlement: Entitlement | None = None
    limits: Limits = field(default_factory=Limits)
    source: str = "<config>"  # file name or "<embedded default>"

    def queue(self, name: str) -> QueueConfig | None:
        for q in self.queues:
            if q.name == name:
                return q
        return None
