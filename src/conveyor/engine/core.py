"""The engine: every broker rule, with no I/O and no clock.

The shell (server/) feeds it commands and the passage of time; the engine answers with
messages to send and records appended to the journal. :class:`Engine` is the seam and
the orchestrator; the rules live in the parts it owns:

============================  =========================================================
part                          owns
============================  =========================================================
:class:`Outbox`               output per connection, sends held until durable,
                              conflated persisted acks, closes
:class:`PublishLog`           sequence numbers, publishes not yet durable, fingerprints
:class:`QueueBindings`        each queue with its filter, priority, barrier and refill
:class:`Topics`               pub/sub and bookmark-replay subscriptions, fan-out
:class:`QueueDelivery`        dispatch, deliveries, acks (sow_delete), the queue view
:class:`Subscriptions`        the subscribe / replace / unsubscribe commands
:class:`NamedConsumers`       the Spark source's named consumers
:class:`Transactions`         staged transactions (the Spark sink)
:class:`Recovery`             replaying the journal, checkpoints
:class:`StateOfTheWorld`      SOW topics, views, their queries and subscriptions,
                              aggregated subscriptions, views over queues
:class:`Queries`              query results on their way, paced to their
                              connections like replays (sow/production.py)
============================  =========================================================

Rules the engine itself keeps:

1. **Read-committed.** A publish to a recorded topic is appended to the journal at once
   (so duplicate detection sees it) but reaches subscribers and queues only when
   :meth:`on_durable` reports it fsynced. Recovery applies the same records through the
   same parts, so live state and recovered state cannot drift.
2. **Duplicates are dropped** by publisher id and sequence number (spec 002): a sequence
   ``<=`` the highest seen for that publisher is acknowledged as a duplicate and never
   journaled.
3. **Client names** (spec 002): a logon with a name in use by the same user replaces the
   old connection (told why, then closed); by another user, it is refused. With
   ``Authentication`` the user is the one the shell authenticated (:meth:`authenticate`),
   never what the logon claims, and the publisher ids behind sequence numbers belong to
   that user (:func:`~conveyor.protocol.bookmarks.publisher_id`), so no other user can
   publish or burn sequence numbers under them.
4. **Time is an argument.** Every seam method takes ``now`` and passes it down; nothing
   stores it.
5. **Entitlements** (:mod:`conveyor.engine.entitlements`): with ``Authentication`` a
   session does nothing before it is authenticated and logged on, and each command is
   checked against its user's grants before it runs; decisions are cached per user and
   name, so a publish pays one dict lookup.
6. **A publish that reaches no one is reported.** A publish to a topic that is not
   recorded (a queue's name is first redirected to its ``DefaultPublishTarget``) and
   has no subscriber is counted in ``publishes_unrouted``, and its publish acks carry a
   warning in ``reason`` (status stays ``success``: pub/sub needs no declaration).

The journal is injected (``append``/``read``/``scan``/``durable_end``/``end``), and
reading it is the only outside access the engine makes.
"""

from __future__ import annotations

import difflib
import logging
import math
from functools import partial
from typing import Callable, Container, Final, Iterable, Mapping, cast

import msgspec

from conveyor import errors
from conveyor.config.model import Config, is_regex_topic, topic_matcher
from conveyor.engine.actions import ACTION_CLIENT_NAME, ExpiryActions, PublishActions
from conveyor.protocol.bookmarks import publisher_id
from conveyor.engine.entitlements import Entitlements, Permission, check_command, not_entitled
from conveyor.engine.cache import CACHE_BYTES_MAX_DEFAULT, Entry, MessageCache
from conveyor.engine.consumers import NamedConsumers
from conveyor.engine.delivery import QueueDelivery
from conveyor.engine.explain import Explanation, explain_message
from conveyor.engine.outbox import Outbox
from conveyor.engine.publish_log import PendingPublish, PublishLog
from conveyor.engine.queue.expiry import earliest
from conveyor.engine.queue.queue import Queue, QueueStats
from conveyor.engine.queue.bindings import PlainRuns, QueueBinding, QueueBindings
from conveyor.engine.recovery import Checkpoint, PageFiles, Recovery
from conveyor.engine.replication.ownership import ReplicatedQueues
from conveyor.engine.replication.catch_up import CatchUp
from conveyor.engine.replication.held_delivery import HeldDelivery
from conveyor.engine.replication.links import PeerLinks
from conveyor.engine.replication.replication import Replication
from conveyor.engine.sessions import Session
from conveyor.engine.sow.production import Queries
from conveyor.engine.sow.state import StateOfTheWorld
from conveyor.engine.sow.subscriptions import RecordsSubscribe
from conveyor.engine.sow.topic import key_text
from conveyor.engine.subscribing import Subscriptions
from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.ports import JournalPort
from conveyor.engine.topics import FILTER_TICKS_PER_TURN, REPLAY_RECORDS_PER_PUMP, Topics
from conveyor.engine.txn import Transactions
from conveyor.protocol import messages as m
from conveyor.protocol import replication as p_repl
from conveyor.protocol.ack_kinds import ack_types
from conveyor.protocol.codec import Rejected
from conveyor.protocol.options import parse_options
from conveyor.protocol.payload import BodyRefused, check_json
from conveyor.engine.rows import EngineStats

__all__ = ["Checkpoint", "Engine", "EngineStats", "REPLAY_RECORDS_PER_PUMP", "VERSION"]


log = logging.getLogger("conveyor.engine")

VERSION = "conveyor-0.1"
CLIENT_NAME_CHARS_MAX = 256  # a client name is journaled in no record, but logged and kept per session
# Final: compiled code reads a Final module name as a C variable, any other one (and a
# module's attribute, ``m.Publish``) through a dict lookup at every use.
_PUBLISH_ACKS: Final = frozenset({"processed", "persisted"})
_PUBLISH: Final = m.Publish
_SOW_DELETE: Final = m.SowDelete
_ASTUPLE: Final = msgspec.structs.astuple

#: A publish's fields as ``_publish_fields`` gives them, in m.Publish's order.
_PublishFields = tuple[str, bytes, int | None, str | None, str | None, str | None, float | None, int | None,
                       str | None]
_PUBLISH_FIELDS = ("topic", "data", "seq", "cid", "ack_type", "correlation_id", "expiration", "fingerprint", "sow_key")
if m.Publish.__struct_fields__ != _PUBLISH_FIELDS:  # the unpacking in _publish follows this order
    raise ImportError(f"m.Publish's fields are {m.Publish.__struct_fields__}, not {_PUBLISH_FIELDS}: update _publish")


def _publish_fields(cmd: m.Publish) -> _PublishFields:
    return cast(_PublishFields, _ASTUPLE(cmd))


def _check_topic(topic: str, limit: int) -> None:
    """Limits/MaxTopicLength: a command naming a longer topic is refused."""
    if len(topic) > limit:
        raise errors.LimitExceeded(f"topic name of {len(topic)} characters is over the limit of {limit} "
                                   "(Limits/MaxTopicLength)", limit="MaxTopicLength", max=limit)


class Engine:
    """The broker: the seam the server drives, over the parts listed in the module header."""

    def __init__(
        self, config: Config, journal: JournalPort, *, journal_id: str = "", cache_bytes_max: int = CACHE_BYTES_MAX_DEFAULT,
        describe_connection: Callable[[int], str] = lambda conn_id: f"connection {conn_id}",
    ) -> None:
        """``journal_id``: the identity of this journal (it changes when the journal is
        replaced), so replication destinations know what their positions refer to.
        ``describe_connection(conn_id)``: how log lines name a connection."""
        self.config = config
        self.journal = journal
        self.instance = config.name
        self.sessions: dict[int, Session] = {}
        self._names: dict[str, int] = {}  # client name -> connection (rule 3)
        self.cache = MessageCache(journal.read, bytes_max=cache_bytes_max, scan=journal.scan)
        self.outbox = Outbox(journal)
        repl = config.replication
        # Rule 4 of replication: a sync destination holds back persisted acknowledgements.
        self.publishes = PublishLog(journal, config.transaction_log,
                                    track_persisted=any(d.sync_type == "sync" for d in (repl.destinations if repl else ())))
        self.publishes_unrouted = 0  # rule 6
        #: How log lines name a connection (the server adds the peer address).
        self.describe_connection = describe_connection
        self.limits = config.limits
        self.entitlements = Entitlements.from_config(config)
        # One filter budget per turn of the shell's loop, for topic fan-out, queue dispatch and
        # SOW subscriptions alike (engine/filter_budget.py); topics.new_turn() renews it.
        budget = FilterBudget(FILTER_TICKS_PER_TURN)
        # Every part is built once, here, in dependency order, and given what it uses;
        # nothing is assigned into a part afterwards (docs/architecture.md, "Assembly").
        self.bindings = QueueBindings(config, self.cache, budget)
        self.topics = Topics(journal, self.outbox, budget)
        # Query results on their way to their connections, paced like replays (sow/production.py).
        self.queries = Queries(self.outbox, budget)
        # Held for the replicated queues until the sync peers caught this instance up after its start;
        # with nothing to wait for, the plain delivery (no wrapper call a step: held_delivery.py rule 2).
        self.catch_up = CatchUp(config)
        delivery = QueueDelivery if self.catch_up.done else partial(HeldDelivery, self.catch_up)
        self.delivery = delivery(
            self.bindings, journal, self.cache, self.outbox, self.publishes, ExpiryActions(config.actions),
            publisher_id(ACTION_CLIENT_NAME, instance=self.instance), entitled=self._may_consume,
            queries=self.queries, client_of=lambda conn_id: getattr(self.sessions.get(conn_id), "client_name", None),
        )
        self.sow = StateOfTheWorld(config, journal, self.cache, self.outbox, self.publishes, self.bindings, budget,
                                   queries=self.queries)
        self._sow_topics = self.sow.topics
        # SOW topics, views and conflated topics: the publish hot path checks this one set first
        self._sow_names = self.sow.names()
        self.subscriptions = Subscriptions(self.bindings, self.topics, self.delivery, self.outbox, journal,
                                           records=self.sow, recorded=self.publishes.recorded,
                                           subscriptions_max=config.limits.subscriptions_per_connection_max,
                                           describe=self._who)
        self.peers = PeerLinks(config, self.catch_up)
        self.replicated_queues = ReplicatedQueues(self.instance, self.bindings, journal, self.cache, self.delivery,
                                                  self.peers.reachable)
        replicated = self.replicated_queues if self.replicated_queues else None
        self.named = NamedConsumers(self.bindings, self.delivery, journal, self.cache, self.outbox,
                                    replicated_queues=replicated)
        self.transactions = Transactions(self.publishes, self.bindings, self.outbox, named=self.named)
        self.journal_id = journal_id
        self.replication = Replication(config, journal, self.publishes, self.outbox, self.peers, journal_id=journal_id,
                                       queues=replicated, sow=self.sow, consumers=self.named)
        self._publish_actions = PublishActions(config.actions)
        self.recovery = Recovery(journal, self.bindings, self.publishes, self.delivery, self.named, self.topics,
                                 self.replication, sow=self.sow, queues=replicated)

    @property
    def queues(self) -> Mapping[str, Queue]:
        """Every configured queue by name (read-only view)."""
        return self.bindings.queues()

    # --- recovery and checkpoints ----------------------------------------------------------

    def recover(self, now: float, progress: Callable[[int], None] | None = None, checkpoint: Checkpoint | None = None,
                pages: PageFiles | None = None) -> int:
        """Rebuild state from the journal (:mod:`conveyor.engine.recovery`)."""
        return self.recovery.recover(now, progress=progress, checkpoint=checkpoint, pages=pages)

    def checkpoint(self, *, snapshots: bool = True) -> Checkpoint:
        """What recovery may start from; ``snapshots``: with the queues' snapshots."""
        return self.recovery.checkpoint(snapshots=snapshots)

    def retention_floor(self, checkpoint: Checkpoint) -> int:
        """The lowest position anything needs (recovery.py), query results on their way
        included (sow/production.py rule 8)."""
        floor = self.recovery.retention_floor(checkpoint)
        queries = self.queries.floor()
        return floor if queries is None else min(floor, queries)

    # --- connections ---------------------------------------------------------------------------

    def connect(self, conn_id: int) -> None:
        session = self.sessions[conn_id] = Session(conn_id)
        if self.entitlements.required:
            session.restricted = True
            session.grants = self.entitlements.for_user("")  # nobody: denied everything
        self.outbox.open(conn_id)

    def authenticate(self, conn_id: int, user: str) -> None:
        """The shell verified that connection ``conn_id`` is ``user`` (a password or a
        client certificate): its logon and commands now act as that user (rule 3)."""
        session = self.sessions[conn_id]
        session.user_id = user
        session.authenticated = True
        session.grants = self.entitlements.for_user(user)

    def set_entitlements(self, entitlements: Entitlements, now: float) -> None:
        """Apply reloaded entitlements (rule 5) to every session. Topic subscriptions are
        filtered by the new grants from the next message on, and every subscription's
        entitlement filter is resolved again (subscribing.py rule 7); a subscription no
        longer allowed (a literal topic, a queue of a queue subscription, a SOW topic's or
        view's records) ends, and its connection is closed with the reason (leases return
        to the queue at once)."""
        self.entitlements = entitlements
        for session in list(self.sessions.values()):
            if not session.restricted or not session.authenticated:
                continue
            session.grants = entitlements.for_user(session.user_id or "")
            for sub in list(session.subs.values()):
                ended = self.subscriptions.entitle_again(session, sub, now)
                if ended is None:
                    continue
                permission, lost = ended
                self.subscriptions.remove(session, sub, now)
                log.warning("client %r (user %r): subscription %s ended: no longer entitled to %s %s",
                            session.client_name, session.user_id, sub.sub_id, permission.value, ", ".join(lost))
                self.outbox.close(session.conn_id, f"entitlements changed: no longer entitled to {permission.value} "
                                                   f"{', '.join(lost)}")
        self.topics.changed()
        self.delivery.dispatch(now)

    def _may_consume(self, conn_id: int, queue: str) -> bool:
        session = self.sessions.get(conn_id)
        return session is not None and (not session.restricted or session.grants.allows(Permission.CONSUME, queue))

    def disconnect(self, conn_id: int, now: float) -> None:
        session = self.sessions.pop(conn_id, None)
        if session is None:
            return
        self.queries.forget(conn_id)
        self.subscriptions.end_session(session, now)
        if session.client_name and self._names.get(session.client_name) == conn_id:
            del self._names[session.client_name]
        self.outbox.forget(conn_id)
        self.delivery.dispatch(now)
        self.sow.flush(now)

    def take_output(self) -> dict[int, list[msgspec.Struct]]:
        return self.outbox.take_output()

    def take_closes(self) -> list[tuple[int, str]]:
        return self.outbox.take_closes()

    def take_shell_commands(self) -> list[tuple[int, msgspec.Struct]]:
        return self.outbox.take_shell_commands()

    # --- commands ------------------------------------------------------------------------------

    def handle(self, conn_id: int, commands: Iterable[m.Command | errors.ConveyorError], now: float) -> None:
        """Apply a batch of decoded commands (one frame) from one connection."""
        self.topics.new_turn()  # each call from the shell is a turn of its loop (topics.py rule 1)
        session = self.sessions[conn_id]
        delivery = self.delivery
        topic_chars_max = self.limits.topic_chars_max
        for cmd in commands:
            try:
                # Consecutive sow_deletes are journaled together (QueueDelivery rule 6):
                # anything else first closes the batch, so records keep command order.
                if type(cmd) is _PUBLISH:  # the hot path first
                    if delivery.acks_open:
                        delivery.flush_acks(now)
                    if not session.logged_on:
                        self._implicit_logon(session)
                    topic = cmd.topic  # read once: a Struct's field costs compiled code a lookup
                    _check_topic(topic, topic_chars_max)
                    if session.restricted and not (session.grants.published.get(topic)
                                                   or session.grants.may_publish(topic)):
                        raise not_entitled(session.user_id, Permission.PUBLISH, topic)
                    self._publish(session, cmd, topic, now)  # not bound to a local: a native call compiled
                    continue
                if type(cmd) is _SOW_DELETE and session.logged_on and not session.restricted:
                    topic = cmd.topic  # the commonest after publishes: no class patterns (_command)
                    _check_topic(topic, topic_chars_max)
                    self._sow_delete(conn_id, cmd, topic, now)
                    continue
                if type(cmd) is not _SOW_DELETE and delivery.acks_open:
                    delivery.flush_acks(now)
                if isinstance(cmd, errors.ConveyorError):  # a Rejected entry's error
                    raise cmd
                self._command(session, cmd, now)
            except errors.ConveyorError as exc:
                self._close_acks(conn_id, now)  # the replies before it come first
                # A refused publish names its sequence, so the publisher can drop it from
                # its store and say which message was refused (publishes carry no cid).
                seq = cmd.seq if type(cmd) is m.Publish or type(cmd) is m.DeltaPublish else None
                self._fail(conn_id, getattr(cmd, "cid", None), exc, seq)
        self._close_acks(conn_id, now)
        self.outbox.end_frame(conn_id)
        self._dispatch(now)

    def _sow_delete(self, conn: int, cmd: m.SowDelete, topic: str, now: float) -> None:
        """A logged-on session's ``sow_delete`` of ``topic`` (length checked): a SOW delete, a view's refusal or an ack."""
        if topic in self._sow_topics:
            self.delivery.flush_acks(now)  # a batch is of queue acks only (rule 6 there)
            self.sow.sow_delete(conn, cmd, now)
        elif self.sow.is_view(topic):
            raise self.sow.read_only(topic, "deleted")
        else:
            self.delivery.sow_delete(conn, cmd, now)

    def _close_acks(self, conn_id: int, now: float) -> None:
        """Journal the frame's open batch of acknowledgements (QueueDelivery rule 6)."""
        if self.delivery.acks_open:
            try:
                self.delivery.flush_acks(now)
            except errors.ConveyorError as exc:  # as if the batch's last command had failed
                self._fail(conn_id, None, exc)

    def reject(self, conn_id: int, error: errors.ConveyorError, cid: str | None = None) -> None:
        """Report a command the codec could not decode."""
        self._fail(conn_id, cid, error)

    def _fail(self, conn_id: int, cid: str | None, exc: errors.ConveyorError, seq: int | None = None) -> None:
        details = {k: v for k, v in exc.details.items() if isinstance(v, (str, int, float, bool))} or None
        self.outbox.send(
            conn_id,
            m.Ack(ack_type="processed", cid=cid, status="failure", reason=str(exc), code=exc.code, details=details,
                  seq=seq),
        )

    def _command(self, session: Session, cmd: m.Command, now: float) -> None:
        conn = session.conn_id
        if session.logged_on:
            topic = getattr(cmd, "topic", None)
            if topic is not None:
                _check_topic(topic, self.limits.topic_chars_max)
            if session.restricted:
                check_command(session.grants, cmd)  # rule 5: before anything happens
        match cmd:
            case m.Logon():
                self._logon(session, cmd)
            case _ if not session.logged_on:
                self._implicit_logon(session)
                self._command(session, cmd, now)
            case m.SowDelete():  # acks, the commonest after publishes, early: each pattern is an isinstance
                self._sow_delete(conn, cmd, cmd.topic, now)
            case m.Subscribe() | m.DeltaSubscribe() | m.SowAndSubscribe() | m.SowAndDeltaSubscribe() if (
                    self.subscriptions.controls(session, cmd)):
                self.subscriptions.pause_or_resume(session, cmd, now)  # whatever the topic (subscribing.py rule 9)
            case m.Subscribe():
                if self.sow.is_view(cmd.topic):  # a view's records are not journaled
                    self._records_subscribe(session, cmd, now, query=False, is_delta=False)
                else:
                    self.subscriptions.subscribe(session, cmd, now)
            case m.SowAndSubscribe() | m.SowAndDeltaSubscribe():
                self._sow_and_subscribe(session, cmd, now)
            case m.DeltaSubscribe():
                self._delta_subscribe(session, cmd, now)
            case m.Sow():
                self._sow(conn, cmd, now)
            case m.Unsubscribe():
                self.subscriptions.unsubscribe(session, cmd, now)
            case m.DeltaPublish():
                self._publish(session, cmd, cmd.topic, now)
            case m.Flush():
                self._flush(conn, cmd)
            case m.Claim() | m.Lease() | m.Fetch() | m.AckThrough() | m.Extend() | m.Reclaim() | m.Head() | m.ConsumerInfo():
                self.named.handle(conn, cmd, now)
            case m.Stage() | m.CommitTxn() | m.AbortTxn():
                # Staged handles and transaction publishers belong to the user (rule 3).
                self.transactions.handle(conn, cmd, now, owner=session.user_id if session.authenticated else None)
            case m.JournalSegments() | m.JournalRead():
                self.outbox.to_shell(conn, cmd)  # file work: server/journal_reads.py
            case m.Heartbeat():
                parse_options("heartbeat", cmd.options)
                if "processed" in ack_types(cmd.ack_type):
                    self.outbox.send(conn, m.Ack(ack_type="processed", cid=cmd.cid))
            case _:
                raise errors.UnknownCommand(f"unknown command {type(cmd).__name__}")

    def _dispatch(self, now: float) -> None:
        self.delivery.dispatch(now)
        if self.replicated_queues:
            self.replicated_queues.tick(now)  # subscribers with room may want messages owned elsewhere
        self.sow.flush(now)  # views see this step's queue moves (engine/sow/view.py rule 3)

    # --- State of the World commands (engine/sow/state.py) --------------------------------------

    def _sow(self, conn: int, cmd: m.Sow, now: float) -> None:
        opts = parse_options("sow", cmd.options)
        entitlement = self.sessions[conn].grants.filter_for(Permission.SOW, cmd.topic)  # None: unfiltered
        if opts.list("projection") is not None or opts.list("grouping") is not None:
            self.sow.aggregated_query(conn, cmd, opts, now, entitlement)
        elif self.sow.owns(cmd.topic):
            self.sow.query(conn, cmd, now, opts=opts, entitlement=entitlement)
        elif self.bindings.get(cmd.topic) is not None:
            self.delivery.sow(conn, cmd, now, entitlement=entitlement)
        else:
            raise errors.UnknownTopic(f"sow needs a SOW topic, a view or a queue; {cmd.topic!r} is none of them")

    def _sow_and_subscribe(self, session: Session, cmd: m.SowAndSubscribe | m.SowAndDeltaSubscribe, now: float) -> None:
        is_delta = isinstance(cmd, m.SowAndDeltaSubscribe)
        command = "sow_and_delta_subscribe" if is_delta else "sow_and_subscribe"
        opts = parse_options(command, cmd.options)
        aggregated = opts.list("projection") is not None or opts.list("grouping") is not None
        if aggregated or self.sow.owns(cmd.topic):
            self._records_subscribe(session, cmd, now, query=True, is_delta=is_delta)
            return
        if opts.flags & {"oof", "no_empties", "no_sowkey", "send_keys"} or opts.get("skip_n") is not None:
            raise errors.InvalidOption(f"{cmd.topic!r} is not a SOW topic or a view: oof, no_empties, no_sowkey, "
                                       "send_keys and skip_n do not apply", option="oof")
        plain = m.SowAndSubscribe(
            topic=cmd.topic, sub_id=cmd.sub_id, query_id=cmd.query_id, cid=cmd.cid, ack_type=cmd.ack_type,
            filter=cmd.filter, options=cmd.options,
            batch_size=cmd.batch_size, top_n=cmd.top_n,
        )
        if self.bindings.matching(cmd.topic):
            self.delivery.sow(session.conn_id, plain, now,  # a delta subscription to a queue: full messages
                              entitlement=session.grants.filter_for(Permission.SOW, cmd.topic))
        else:
            # reference G.1.2: a topic without SOW answers an empty query, then subscribes
            qid = cmd.query_id or cmd.cid
            self.outbox.send(session.conn_id, m.GroupBegin(query_id=qid, cid=cmd.cid))
            self.outbox.send(session.conn_id, m.GroupEnd(query_id=qid, cid=cmd.cid))
            for kind in ack_types(cmd.ack_type) & {"completed", "stats"}:
                self.outbox.send(session.conn_id, m.Ack(ack_type=kind, cid=cmd.cid, query_id=qid, records_returned=0))
        self.subscriptions.subscribe(session, plain, now)

    def _records_subscribe(self, session: Session, cmd: RecordsSubscribe, now: float, *, query: bool,
                           is_delta: bool) -> None:
        """A subscription to a SOW topic's or view's records, or an aggregated one: it
        needs ``Subscribe`` on the name it gives (rule 5; a view is entitled by its own
        name, not its underlying topics'); the other subscriptions are decided in
        subscribing.py, and the query part by :func:`~conveyor.engine.entitlements.required`."""
        if session.restricted:
            session.grants.check(Permission.SUBSCRIBE, cmd.topic)
        self.sow.subscribe(session, cmd, now, query=query, is_delta=is_delta)

    def _delta_subscribe(self, session: Session, cmd: m.DeltaSubscribe, now: float) -> None:
        if self.sow.owns(cmd.topic):
            self._records_subscribe(session, cmd, now, query=False, is_delta=True)
            return
        if cmd.bookmark:
            raise errors.InvalidOption("a delta subscription cannot replay from a bookmark", option="bookmark")
        # reference G.5.2: to a queue or a topic without SOW, full messages (a subscribe)
        opts = parse_options("delta_subscribe", cmd.options)
        if opts.flags & {"oof", "no_empties", "no_sowkey", "send_keys"}:
            raise errors.InvalidOption(f"{cmd.topic!r} is not a SOW topic or a view: oof, no_empties, no_sowkey and "
                                       "send_keys do not apply", option="oof")
        self.subscriptions.subscribe(session, m.Subscribe(
            topic=cmd.topic, sub_id=cmd.sub_id, cid=cmd.cid, ack_type=cmd.ack_type, filter=cmd.filter,
            options=cmd.options,
        ), now)

    def _flush(self, conn: int, cmd: m.Flush) -> None:
        acks = ack_types(cmd.ack_type) or frozenset({"completed"})
        if "processed" in acks:
            self.outbox.send(conn, m.Ack(ack_type="processed", cid=cmd.cid))
        for kind in acks & {"completed", "persisted"}:
            self.outbox.send_when_persisted(conn, m.Ack(ack_type=kind, cid=cmd.cid))

    # --- logon (rule 3) -----------------------------------------------------------------------

    def _logon(self, session: Session, cmd: m.Logon) -> None:
        if session.logged_on:
            raise errors.AlreadyLoggedOn("logon must be the first command, and only one is allowed")
        if session.restricted and not session.authenticated:
            self.outbox.close(session.conn_id, "not authenticated")
            raise errors.NotAuthenticated("this server requires a logon with credentials before any command")
        if session.authenticated and cmd.user_id and cmd.user_id != session.user_id:
            # e.g. a client certificate of one user and a logon naming another
            self.outbox.close(session.conn_id, "logon as another user than authenticated")
            raise errors.NotAuthenticated(f"this connection is authenticated as {session.user_id!r}, "
                                          f"not {cmd.user_id!r}")
        name = cmd.client_name or f"anonymous-{session.conn_id}"
        if len(name) > CLIENT_NAME_CHARS_MAX or not name.isprintable():
            raise errors.InvalidOption(f"a client name is 1 to {CLIENT_NAME_CHARS_MAX} printable characters")
        # Rule 3: with Authentication, the user is the authenticated one, not a claim.
        user = session.user_id if session.authenticated else cmd.user_id
        holder = self._names.get(name)
        if holder is not None and holder != session.conn_id:
            other = self.sessions.get(holder)
            if other is not None and other.user_id != user:
                # Same name, different user: a different application. Refuse the new one.
                log.warning("client %r refused: name in use by another user", name)
                self.outbox.close(session.conn_id, "name in use")
                raise errors.NameInUse(f"client name {name!r} is in use by another user")
            # Same name, same user: a reconnect. The old connection is out of date: tell
            # it why before closing it, so it does not reconnect and take the name back.
            log.warning("client %r logged on again on %s: closing its previous %s (name in use)", name,
                        self.describe_connection(session.conn_id), self.describe_connection(holder))
            self.outbox.send(holder, m.Ack(
                ack_type="processed", status="failure", code=errors.ClientReplaced.code,
                reason=f"client name {name!r} was taken over by a newer connection of the same user",
            ))
            self.outbox.close(holder, f"name in use: client {name!r} logged on again on another connection")
        self._names[name] = session.conn_id
        session.client_name = name
        session.user_id = user
        session.logged_on = True
        owner = user if session.authenticated else None
        session.publisher = publisher_id(name, user=owner)
        session.server_publisher = publisher_id(name, instance=self.instance, user=owner)
        if cmd.client_name:  # implicit logons (a bare publish) are not worth a line each
            log.info("logon: client %r, user %r, %s", name, cmd.user_id, self.describe_connection(session.conn_id))
        if "processed" in ack_types(cmd.ack_type) or cmd.ack_type is None:
            self.outbox.send(
                session.conn_id,
                m.Ack(ack_type="processed", cid=cmd.cid, client_name=name,
                      seq=self.publishes.highest_seq(session.publisher),
                      persisted=self.publishes.persisted_seq(session.publisher), version=VERSION,
                      journal=self.journal_id or None),
            )

    def _who(self, session: Session) -> str:
        return f"client {session.client_name!r} ({self.describe_connection(session.conn_id)})"

    def _implicit_logon(self, session: Session) -> None:
        self._logon(session, m.Logon(client_name="", ack_type="none"))

    # --- publish (rules 1 and 2) ------------------------------------------------------------------

    def _publish(self, session: Session, cmd: m.Publish | m.DeltaPublish, topic: str, now: float) -> None:
        """Publish ``cmd`` to ``topic`` (its ``cmd.topic``, read by the caller)."""
        # The hot path: a few dict lookups, one encode, one buffered append.
        topic = self.bindings.target(topic)
        if topic in self._sow_names or type(cmd) is not _PUBLISH:
            self._publish_sow(session, cmd, topic, now)
            return
        # Every field in one call: compiled code reads a Struct's field through Python's
        # attribute lookup, eight of them costing more than the rest of this function.
        _, data, seq, cid, ack_type, correlation_id, expiration, fingerprint, _ = _publish_fields(cmd)
        acks = ack_types(ack_type)
        publishes = self.publishes
        outbox = self.outbox
        expires_at = 0.0 if expiration is None else self._expires_at(topic, expiration, now)
        if not publishes.recorded(topic):
            server_publisher = session.server_publisher
            assert server_publisher is not None  # set by the logon, which comes before any publish
            entry = Entry(topic, data, now, server_publisher, 0, correlation_id)
            warning = None if self.topics.listeners(topic) else self._unrouted(topic)
            self.topics.fan_out(None, entry, now)
            for kind in acks & _PUBLISH_ACKS:
                outbox.send(session.conn_id, m.Ack(ack_type=kind, cid=cid, seq=seq, reason=warning))
            return
        if publishes.takes_json(topic):
            try:
                check_json(data)  # (called here: one frame less on the publish path)
            except BodyRefused as exc:
                raise _not_json(topic, exc) from None
        ident = self._identity(session, cmd, seq, acks)
        if ident is None:
            return
        publisher, seq = ident
        pos = publishes.append(topic, publisher, seq, now, data, correlation_id, fingerprint, expires_at)
        if acks:
            if "persisted" in acks:
                # One mark per frame (handle() files it): the ack is conflated anyway.
                outbox.mark_persisted(session.conn_id, pos, seq, publisher, cid)
            if "processed" in acks:
                outbox.send(session.conn_id, m.Ack(ack_type="processed", cid=cid, seq=seq))

    def _unrouted(self, topic: str) -> str:
        """Rule 6: a publish that reaches no one is counted, and its acks say why."""
        self.publishes_unrouted += 1
        tlog = self.config.transaction_log
        names = [*self.bindings.by_name, *(t.name for t in (tlog.topics if tlog else ()) if not is_regex_topic(t.name))]
        near = difflib.get_close_matches(topic, names, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return (f"warning: topic {topic!r} is not recorded in the transaction log, is no queue and has no "
                f"subscriber: the message reached no one and was not kept{hint}")

    def _identity(self, session: Session, cmd: m.Publish | m.DeltaPublish, seq: int | None, acks: frozenset[str]
                  ) -> tuple[int, int] | None:
        """(publisher, seq) of a publish: the client's sequence ``seq`` (``cmd.seq``) under
        its publisher id, or the next server-made one; None for a duplicate (answered here)."""
        publishes = self.publishes
        if seq is None:
            publisher = session.server_publisher
            assert publisher is not None  # set by the logon, which comes before any publish
            return publisher, publishes.next_seq(publisher)
        publisher = session.publisher
        assert publisher is not None  # likewise
        if publishes.is_duplicate(publisher, seq):
            self._duplicate(session.conn_id, cmd, publisher, seq, acks)
            return None
        return publisher, seq

    def _expires_at(self, topic: str, expiration: float, now: float) -> float:
        """The absolute expiry of a message published at ``now`` with ``e`` (0: never).
        It is journaled with the message; queues expire it then (queue_expiry), whatever
        their own Expiration (rule 4: it overrides it). Refused where nothing keeps the message:
        reading it and doing nothing would mean less than the publisher said."""
        if not math.isfinite(expiration) or expiration < 0:
            raise errors.BadExpiration(f"expiration {expiration!r}: give a number of seconds >= 0 (0: never)")
        if not expiration:
            return 0.0
        if not self.publishes.recorded(topic):
            raise errors.BadExpiration(
                f"expiration on topic {topic!r}: the topic is not recorded in the transaction log, so no queue "
                "keeps the message and it cannot expire; publish without an expiration", topic=topic)
        return now + expiration

    def _publish_sow(self, session: Session, cmd: m.Publish | m.DeltaPublish, topic: str, now: float) -> None:
        """A publish or delta publish to a SOW topic (engine/sow/state.py rule 1): the
        final message, its SowKey and expiry are decided before it is journaled. A delta
        publish to a topic without SOW is a plain publish of its payload."""
        if self.sow.is_view(topic):  # a view or a conflated topic
            raise self.sow.read_only(topic, "published")
        st = self._sow_topics.get(topic)
        if st is None:
            plain = m.Publish(topic=cmd.topic, data=cmd.data, seq=cmd.seq, cid=cmd.cid, ack_type=cmd.ack_type,
                              correlation_id=cmd.correlation_id, expiration=cmd.expiration)
            self._publish(session, plain, plain.topic, now)
            return
        acks = ack_types(cmd.ack_type)
        publishes = self.publishes
        if not publishes.recorded(topic):  # the configuration requires it; be safe
            raise errors.NotATransactionLogTopic(f"SOW topic {topic!r} is not recorded in the transaction log")
        ident = self._identity(session, cmd, cmd.seq, acks)
        if ident is None:
            return
        publisher, seq = ident
        data, key, expires_at, correlation_id = self.sow.prepare(st, cmd, now, is_delta=type(cmd) is m.DeltaPublish)
        pos = publishes.append_sow(topic, publisher, seq, now, data, correlation_id, expires_at, key_text(key))
        self.sow.appended(st, key, pos, data)
        if "persisted" in acks:
            self.outbox.mark_persisted(session.conn_id, pos, seq, publisher, cmd.cid)
        if "processed" in acks:
            self.outbox.send(session.conn_id, m.Ack(ack_type="processed", cid=cmd.cid, seq=seq))

    def _duplicate(self, conn_id: int, cmd: m.Publish | m.DeltaPublish, publisher: int, seq: int,
                   acks: frozenset[str]) -> None:
        """Answer publish ``cmd``, sequence ``seq`` of ``publisher``: a duplicate (rule 2)."""
        outbox = self.outbox
        # (a delta publish carries no fingerprint)
        fingerprint = cmd.fingerprint if type(cmd) is m.Publish else None
        if fingerprint is not None:
            recorded = self.publishes.fingerprints.get(publisher, seq)
            if recorded is not None and recorded != fingerprint:
                # Same (publisher, seq), another message: fail loudly, never drop it silently.
                reason = f"duplicate_conflict: sequence {seq} was published with another fingerprint"
                for kind in acks & _PUBLISH_ACKS:
                    ack = m.Ack(ack_type=kind, cid=cmd.cid, status="failure", reason=reason,
                                code=errors.DuplicateConflict.code, seq=seq)
                    outbox.send_when_persisted(conn_id, ack)
                return
        reason = f"duplicate: sequence {seq} is not above {self.publishes.highest_seq(publisher)}"
        for kind in acks & _PUBLISH_ACKS:
            ack = m.Ack(ack_type=kind, cid=cmd.cid, status="duplicate", reason=reason, seq=seq)
            # A duplicate is already persisted, or will be with the batch it duplicates.
            outbox.send_when_persisted(conn_id, ack)

    # --- durability -------------------------------------------------------------------------------

    def on_durable(self, now: float) -> None:
        """The journal is fsynced up to ``journal.durable_end``: apply the publishes now
        durable, release what waited for it, dispatch."""
        self.topics.new_turn()  # each call from the shell is a turn of its loop (topics.py rule 1)
        topics, delivery, cache, sow = self.topics, self.delivery, self.cache, self.sow
        actions = bool(self._publish_actions)  # once per call, not once per publish
        sow_topics = self._sow_topics
        runs = PlainRuns()  # plain queues: each one's messages enqueued in one pass
        topic: str | None = None  # who takes its messages is looked up once per run (nothing here subscribes)
        for p in self.publishes.take_durable():
            entry = None
            sow_key = p.sow_key
            if p.origin and p.topic in sow_topics:
                # replicated: the key as this instance's Key defines it (sow/state.py rule 7)
                sow_key = sow.local_key(p.position, p.topic, p.data, sow_key) or ""
            if sow_key:  # a SOW record changes (engine/sow/state.py rule 1)
                def entry_of(p: PendingPublish = p) -> Entry:
                    nonlocal entry
                    entry = Entry(p.topic, p.data, p.timestamp, p.publisher, p.seq, p.correlation_id, p.expiration)
                    return entry
                sow.applied(p.position, p.topic, sow_key, p.expiration, now, entry_of)
            if p.topic != topic:
                topic = p.topic
                bindings, listeners = self.bindings.for_topic(topic), topics.listeners(topic)
                ahead = min([b.ahead() for b in bindings], default=0)  # the cache's admission (cache.py)
            if actions:
                self._run_publish_actions(Entry(p.topic, p.data, p.timestamp, p.publisher, p.seq, p.correlation_id),
                                          bool(p.origin))
            if not bindings and not listeners:
                continue  # nobody listens: the journal has it, replays read it from there
            if entry is None:
                entry = Entry(p.topic, p.data, p.timestamp, p.publisher, p.seq, p.correlation_id, p.expiration)
            if bindings:
                ahead = cache.admit(p.position, entry, ahead)  # queues deliver from the cache: their heads
            topics.fan_out(p.position, entry, now)
            for binding in bindings:
                if binding.plain and not p.expiration:
                    runs.add(binding, p.position, p.timestamp)
                    continue
                if binding.plain:
                    runs.flush(binding)  # its own expiry: the run before it goes in first
                if binding.offer(p.position, entry, p.origin, now):
                    delivery.mark(binding)
        for binding in runs.flush_all():
            delivery.mark(binding)
        sow.durable(now)
        replication = self.replication
        replication.durable(now)
        if replication.enabled:
            replication.source.pump(now)
        self._release()
        self._dispatch(now)

    def _release(self) -> None:
        """Send what waited for durability, and what waited for persistence: durable
        here and on every sync replication destination."""
        floor = self.replication.source.persisted_floor()
        self.outbox.release(floor)
        if floor is not None:
            self.publishes.persisted(floor)

    # --- time ---------------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Run lease and message expiry due at ``now``, then dispatch."""
        self.topics.new_turn()  # each call from the shell is a turn of its loop (topics.py rule 1)
        for binding, events in self.delivery.expire_due(now):
            self.named.count_expiries(binding, events)
        self.transactions.staging.expire(now)
        self.sow.tick(now)
        if self.replication.enabled:
            self.replication.source.tick(now)
            self._release()  # a downgraded destination no longer holds persisted acks
        if self.replicated_queues:
            self.replicated_queues.tick(now)
        self.delivery.dispatch(now)
        self.sow.flush(now)

    def next_deadline(self) -> float | None:
        deadline = earliest(self.delivery.next_deadline(), self.sow.next_deadline())
        return earliest(deadline, self.replicated_queues.next_deadline()) if self.replicated_queues else deadline

    # --- bookmark replays ------------------------------------------------------------------------------

    @property
    def replays_pending(self) -> bool:
        """Whether bookmark replays still have journal records to send, or query results
        rows (:meth:`pump_replays` has work)."""
        return self.topics.replays_pending or self.queries.pending

    def paced_connections(self) -> int:
        """How many connections have a replay or a query result on its way: the shell
        shares the output budget among them."""
        return len(self.topics.replay_connections() | set(self.queries.connections()))

    def querying(self, conn_id: int) -> bool:
        """Whether a query result of ``conn_id`` is on its way (sow/production.py rule 4)."""
        return self.queries.querying(conn_id)

    @property
    def fanout_pending(self) -> bool:
        """Background work of :meth:`pump_replays` that needs no socket to drain: a fan-out the filter
        budget cut short (topics.py rule 1), a queue dispatch (queue rule 12), a read-ahead (cache.py)."""
        return (self.topics.fanout_pending or self.delivery.dispatch_pending or self.sow.delivery_pending
                or self.cache.reading_ahead)

    def pump_replays(
        self, now: float, budget: int = REPLAY_RECORDS_PER_PUMP, *, paused: Container[int] = (),
        room: Callable[[int], int] | None = None,
    ) -> bool:
        """One turn of background delivery: the fan-outs a filter budget cut short, then
        bookmark replays by up to ``budget`` records and query results by up to ``budget``
        rows, except those of the connections in ``paused`` (their output is full: flow
        control, topics.py rule 2, sow/production.py rule 4) and within the bytes ``room``
        gives a connection. True while any has work for the next turn."""
        topics = self.topics
        topics.new_turn()
        more = topics.continue_fanout()
        if self.delivery.dispatch_pending:
            self.delivery.continue_dispatch(now)
            more = more or self.delivery.dispatch_pending
        if self.sow.delivery_pending:
            self.sow.continue_delivery()
            more = more or self.sow.delivery_pending
        more = topics.pump(now, self.publishes.applied_end, budget, paused, room) or more
        if self.queries.pending:
            more = self.queries.pump(budget, paused, room) or more
        more = self.cache.read_leased_ahead() or more  # a named consumer's leased batch (cache.py)
        return more

    def subscribed(self, conn_id: int) -> bool:
        """Whether the connection holds a subscription (the shell's default idle
        timeout spares those: a quiet subscriber is not an idle one)."""
        session = self.sessions.get(conn_id)
        return session is not None and bool(session.subs)

    # --- replication links (the shell moves their frames; docs/replication.md) -----------------------

    def link_hello(self, destination: str) -> p_repl.Hello:
        """What to send first on a new outgoing link to ``destination``."""
        return self.replication.source.hello(destination)

    def link_up(self, destination: str, conn_id: int, welcome: p_repl.Welcome, now: float) -> None:
        """The destination answered; raises ReplicationRefused when a rule is broken."""
        self.outbox.open(conn_id)
        try:
            self.replication.source.link_up(destination, conn_id, welcome, now)
        except errors.ReplicationRefused:
            self.outbox.forget(conn_id)
            raise
        self.replication.source.pump(now)

    def link_down(self, destination: str, conn_id: int | None, reason: str | None, now: float) -> None:
        self.replication.source.link_down(destination, reason, now)
        if conn_id is not None:
            self.outbox.forget(conn_id)

    def link_acked(self, conn_id: int, acked: p_repl.Acked, now: float) -> None:
        """An outgoing link's destination holds everything below ``acked.through``."""
        self.replication.source.acked(conn_id, acked.through, now, acked.reach)
        self._release()
        self.replication.source.pump(now)

    def replica_connected(self, conn_id: int) -> None:
        """A source connected to the incoming replication transport."""
        self.outbox.open(conn_id)

    def replica_frames(self, conn_id: int, items: Iterable[p_repl.LinkMessage | Rejected], now: float) -> None:
        """Entries from a source on the incoming replication transport."""
        for item in items:
            match item:
                case p_repl.Hello():
                    try:
                        self.outbox.send(conn_id, self.replication.sink.accept(conn_id, item, now))
                    except errors.ReplicationRefused as exc:
                        log.error("replication from %s refused: %s", item.profile.instance, exc)
                        self.outbox.send(conn_id, p_repl.Refused(reason=str(exc)))
                        self.outbox.close(conn_id, f"replication refused: {exc}")
                        return
                case p_repl.Batch():
                    self.replication.sink.receive(conn_id, item, now)
                case _:
                    reason = getattr(item, "error", None) or f"unexpected {type(item).__name__} from a source"
                    self.outbox.close(conn_id, f"replication protocol error: {reason}")
                    return
        self._dispatch(now)  # replicated removals and transfers may free or bring work

    def replica_disconnected(self, conn_id: int) -> None:
        self.replication.sink.closed(conn_id)
        self.outbox.forget(conn_id)

    def _run_publish_actions(self, entry: Entry, replicated: bool) -> None:
        for step in self._publish_actions.triggered(entry, replicated):
            match = topic_matcher(step.queue)
            for name in self.replicated_queues.by_queue:
                if match(name):
                    self.replicated_queues.set_proxied(name, step.enable)

    # --- operations (the admin interface, engine/explain.py) ----------------------------------------------

    def explain(self, queue: str, bookmark: str, now: float) -> Explanation:
        """Why the message ``bookmark`` of ``queue`` is or is not being delivered."""
        return explain_message(self, queue, bookmark, now)

    def set_proxied_transfer(self, queue: str, enabled: bool) -> None:
        """The admin action ``enable_proxied_transfer`` / ``disable_proxied_transfer``
        (docs/replication.md): UnknownTopic when ``queue`` is not a queue, NotAvailable
        when it is not a replicated queue here (there is no ownership to proxy)."""
        if self.bindings.get(queue) is None:
            raise errors.UnknownTopic(f"{queue!r} is not a queue")
        if not self.replicated_queues.set_proxied(queue, enabled):
            raise errors.NotAvailable(
                f"queue {queue!r} is not replicated from this instance: proxied transfer applies to a Queue or "
                "GroupLocalQueue whose own topic is replicated"
            )

    # --- statistics -------------------------------------------------------------------------------------

    @staticmethod
    def _queue_stats(binding: QueueBinding, now: float | None) -> QueueStats:
        stats = binding.queue.statistics(now)
        if binding.ownership is not None and binding.ownership.proxied:
            stats = msgspec.structs.replace(stats, proxied_transfer=True)
        return stats

    def statistics(self, now: float | None = None) -> EngineStats:
        topic_subs, replays = self.topics.statistics()
        return EngineStats(
            connections=len(self.sessions),
            publishers=self.publishes.publishers,
            journal_end=self.journal.end,
            journal_durable_end=self.journal.durable_end,
            pending_publishes=len(self.publishes.pending),
            held_sends=self.outbox.held,
            cache_misses=self.cache.misses,
            topic_subscriptions=topic_subs,
            replays=replays,
            queue_consumers=self.delivery.consumers(),
            queues={b.name: self._queue_stats(b, now) for b in self.bindings},
            sow=self.sow.statistics(),
            named_consumers=self.named.statistics(),
            staging=self.transactions.staging.statistics(),
            replicated_queues=self.replicated_queues.statistics(),
        )


def _not_json(topic: str, exc: BodyRefused) -> errors.BadMessage:
    """Why a json topic refuses a body (``check_json``: not JSON, not UTF-8, or over a
    limit of protocol/payload.py, checked without building it, about a third of a full
    decode). Filters, views and consumers would each fail on it later, far from the
    publisher (docs/queues.md); the reason and details name the limit."""
    return errors.BadMessage(f"topic {topic!r} takes JSON messages (MessageType json): {exc}",
                             topic=topic, **exc.details)
