"""The client's sans-I/O core, shared by :class:`AsyncClient` and :class:`Client`.

It turns calls into commands and server messages into events, and keeps everything a
reliable client needs across connections. It owns no socket, no thread and no clock:
the faces feed it bytes, tell it when a connection opens or is lost, and send what
:meth:`ClientCore.take_frames` returns. Rules it keeps:

1. **Publishes are stored before they are sent.** Every publish gets the next
   sequence number and goes into the publish store; :meth:`take_frames` syncs the store
   before it returns frames, so a message is in a file store before the server can see
   it. Persisted acks are conflated (one covers every sequence up to ``seq``) and
   remove messages from the store; ``duplicate`` acks remove one.
2. **Logon resumes.** The logon ack carries the highest sequence the server has for
   this client name: the store drops what is at or below it, numbering continues above
   it (and above the store's own highest), and then, in this order, the core sends
   the acknowledgements the server has not confirmed, republishes the store, and
   resubscribes every subscription (:mod:`.subscription`). Acks go first so that a
   resubscription is never redelivered what the application already acknowledged.
3. **Acknowledgements are batched and kept until persisted.** ``ack`` adds a bookmark
   to a batch per (queue, verb); a batch becomes one ``sow_delete`` that asks for a
   ``persisted`` ack, and stays in ``acks_unconfirmed`` until that ack arrives. A lost
   connection loses no acknowledgement: unconfirmed batches are sent again after
   logon (acks are idempotent on the server). A batch the server refuses, in whole or
   in part (a stale delivery, ``Leasing=strict``: docs/queues.md, "Stale
   acknowledgements"), is not sent again: the refusal (``NotLeaseHolder``, naming the
   refused bookmarks in ``details["refused"]``) goes to ``ack_refused_listeners`` and waits in
   ``ack_errors`` for the face's next ``flush()`` to raise it; the subscriptions forget
   those bookmarks as acknowledged (subscription.py rule 3). The batch of a subscription
   that holds nothing unacknowledged goes at once, except while a read is decoded: then
   after it (:meth:`ClientCore.acks_due`), so that handlers called per message still
   batch.
4. **A lost connection** fails the commands awaiting their ack (except a pause or a
   resume: the resubscription carries it, subscription.py rule 8), drops unsent
   frames (publishes and acks are kept elsewhere and resent), resets the frame decoder
   and starts a new *epoch*: messages that arrived on the old connection can be told
   apart from new ones.
5. **Offline, publishes and acks accumulate**; nothing else is queued for sending
   until logon, which the faces only ask for on a fresh connection.
6. **A close the server explains is final.** An ``ack`` without a command id whose code
   is in ``FINAL_CODES`` (``client_replaced``, ``disconnected_by_admin``: docs/protocol.md,
   "Connection notices") says why the server is about to close this connection;
   ``final`` keeps that error, the faces fail with it and do not reconnect.
7. **An HTTP answer fails the connection at once.** The first bytes of a connection
   are checked before they reach the decoder: a server that answers in HTTP (the admin
   port given as the server) raises :class:`~conveyor.errors.ConnectionLost` saying so,
   instead of waiting for the gigabyte its first four bytes would announce as a frame.
"""

from __future__ import annotations

import enum
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Callable

from conveyor import errors
from conveyor.client.endpoints import URI_SCHEMES, Endpoint, parse_endpoint
from conveyor.client.message import AckVerb, Message, Settlement, split_deliveries, to_bytes
from conveyor.client.state import ConnectionMachine, ConnectionState, ReconnectPolicy
from conveyor.client.store import FilePublishStore, PublishStore
from conveyor.client.subscription import SubState
from conveyor.protocol import messages as m
from conveyor.protocol.codec import MessageDecoder, encode_frames, http_response_start

_TOUCH = AckVerb.TOUCH  # a global: the enum's attribute lookup costs ten times more per ack

__all__ = [
    "ACK_BATCH_SECONDS_DEFAULT", "ACK_BATCH_SIZE_DEFAULT", "AckVerb", "ClientCore", "ClientStatistics", "CommandKind",
    "FilePublishStore", "Message", "PendingCommand", "PublishStore", "SubState", "parse_uri", "to_bytes",
]

log = logging.getLogger("conveyor.client")

ACK_BATCH_SIZE_DEFAULT = 100  # acknowledgements per sow_delete frame
ACK_BATCH_SECONDS_DEFAULT = 0.05  # longest an acknowledgement waits to be sent
ACK_ERRORS_KEPT_MAX = 100  # refused acknowledgements kept for flush() (rule 3)
PUBLISH_WARNINGS_LOGGED_MAX = 100  # distinct publish warnings logged per client (each counted)
#: Codes of the connection notices after which the client does not reconnect (rule 6).
FINAL_CODES = frozenset({errors.ClientReplaced.code, errors.DisconnectedByAdmin.code})
__all__ += ["URI_SCHEMES"]


def raise_first(failures: list[errors.ConveyorError]) -> None:
    """Raise the first of ``failures`` the server reported since the last time, once:
    the list is emptied (the others were for the same flush)."""
    if failures:
        first = failures[0]
        failures.clear()
        raise first


def parse_uri(uri: str) -> tuple[str, int]:
    """``tcp://host:port`` (or ``host:port``, ``tcps://...``) -> (host, port); ClientError
    if malformed (:func:`conveyor.client.endpoints.parse_endpoint` gives the rest)."""
    endpoint = parse_endpoint(uri)
    return endpoint.host, endpoint.port


def _publish_command(topic: str, data: bytes, seq: int, correlation_id: str | None, extra: dict | None):
    """The command for a stored publish: a delta publish, a sow_key, an expiration."""
    if not extra:
        return m.Publish(topic=topic, data=data, seq=seq, ack_type="persisted", correlation_id=correlation_id)
    cls = m.DeltaPublish if extra.get("d") else m.Publish
    return cls(topic=topic, data=data, seq=seq, ack_type="persisted", correlation_id=correlation_id,
               sow_key=extra.get("k"), expiration=extra.get("e"))


class CommandKind(enum.Enum):
    """What a command awaiting its ack is, and the ack type that completes it."""

    LOGON = ("logon", "processed")
    SUBSCRIBE = ("subscribe", "processed")
    RESUBSCRIBE = ("resubscribe", "processed")  # sent by the core on logon (rule 2)
    UNSUBSCRIBE = ("unsubscribe", "processed")
    SOW = ("sow", "completed")  # the messages come first, then the completed ack
    SOW_DELETE = ("sow_delete", "processed")
    FLUSH_PERSISTED = ("flush-persisted", "persisted")  # everything before it is persisted
    PAUSE = ("pause", "processed")  # pause or resume: a loss is no failure (rule 4)

    def __init__(self, label: str, completed_by: str) -> None:
        self.label = label
        self.completed_by = completed_by


class PendingCommand:
    """A command awaiting its ack; the face attaches a future or an event."""

    __slots__ = ("kind", "result", "error", "done", "waiter", "messages", "sub_id", "undo")

    def __init__(self, kind: CommandKind, sub_id: str | None = None) -> None:
        self.kind = kind
        self.result: m.Ack | None = None
        self.error: errors.ConveyorError | None = None
        self.done = False
        self.waiter: Any = None
        self.messages: list[Message] = []  # sow results
        self.sub_id = sub_id  # resubscriptions
        self.undo: Callable[[], None] | None = None  # what a refusal puts back (pause, resume)


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    state: ConnectionState
    server: str | None
    frames_sent: int
    commands_sent: int
    ack_batches: int  # sow_delete commands built from acknowledgements
    unpersisted: int  # publishes in the store
    acks_batched: int  # waiting for their batch to be sent
    ack_batches_unconfirmed: int  # sent (or to resend), not yet persisted by the server
    acks_refused: int  # batches the server refused (Leasing=strict)
    publishes_refused: int  # publishes the server refused (never persisted; logged)
    reconnects: int
    subscriptions: int
    publish_warnings: int = 0  # accepted with a warning: reached no one (logged once per topic)


class ClientCore:
    # Slots: with 30 attributes or more a CPython 3.11 instance has a dict of its own (no
    # shared keys) and every attribute load is a dict lookup; a slot is a fixed offset.
    __slots__ = (
        "_cids", "_head", "_receiving", "_subs_with_acks", "ack_batch_size", "ack_batches", "ack_errors",
        "ack_refused_listeners", "acks", "acks_count", "acks_refused", "acks_unconfirmed", "awaiting_ack",
        "client_name", "commands_sent", "decoder", "endpoints", "epoch", "final", "frames_sent", "machine",
        "next_seq", "on_heartbeat", "on_persisted", "online", "outgoing", "persisted_seq", "publish_errors",
        "publish_warnings", "publish_warnings_seen", "publishes_refused", "reconnect", "reconnects",
        "server_index", "server_journal", "servers", "store", "subscriptions",
    )

    def __init__(
        self,
        *,
        client_name: str,
        ack_batch_size: int = ACK_BATCH_SIZE_DEFAULT,
        store: PublishStore | None = None,
        reconnect: ReconnectPolicy | None = None,
    ) -> None:
        if ack_batch_size < 1:
            raise ValueError("ack_batch_size must be at least 1")
        self.client_name = client_name
        self.decoder = MessageDecoder()
        self.store = store if store is not None else PublishStore()
        self.ack_batch_size = ack_batch_size
        self.reconnect = reconnect if reconnect is not None else ReconnectPolicy()
        self.machine = ConnectionMachine()
        self._cids = itertools.count(1)
        self.awaiting_ack: dict[str, PendingCommand] = {}  # cid -> command
        self.subscriptions: dict[str, SubState] = {}
        self.next_seq = self.store.last_seq + 1
        self.persisted_seq = 0
        self.outgoing: list = []  # commands waiting to be framed
        self.acks: dict[tuple[str, Settlement], list[str]] = {}  # (queue, verb and its options) -> bookmarks
        self.acks_count = 0
        self._subs_with_acks: set[SubState] = set()
        self._receiving = False  # in receive_data: handlers called inline ack as messages are decoded
        self.acks_unconfirmed: dict[str, m.SowDelete] = {}  # cid -> batch, until persisted
        self.acks_refused = 0
        #: Rule 3: refused acknowledgements, until the face's flush() raises the first
        #: (at most ACK_ERRORS_KEPT_MAX kept), and who hears of each at once.
        self.ack_errors: list[errors.ConveyorError] = []
        self.ack_refused_listeners: list[Callable[[str, list[str], errors.ConveyorError], None]] = []
        self.publishes_refused = 0
        self.publish_warnings = 0  # publishes accepted with a warning (reached no one)
        self.publish_warnings_seen: set[str] = set()
        self.online = False  # logged on over a live connection
        self.publish_errors: list[errors.ConveyorError] = []  # refused publishes, until flush() reports them
        self.final: errors.ConveyorError | None = None  # why the server closes this connection (rule 6)
        self._head: bytes | None = b""  # the connection's first bytes, until told apart from HTTP (rule 7)
        self.epoch = 0  # connections lost so far
        self.servers: list[str] = []  # as shown: the URIs without their passwords
        self.endpoints: list[Endpoint] = []
        self.server_index = 0
        self.reconnects = 0
        self.on_persisted: Callable[[int], None] | None = None
        self.server_journal: str | None = None  # the journal of the instance logged on to last
        self.on_heartbeat: Callable[[], None] | None = None
        self.frames_sent = 0
        self.commands_sent = 0
        self.ack_batches = 0

    # --- connection ----------------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        return self.machine.state

    def set_servers(self, uris: str | list[str] | tuple[str, ...]) -> None:
        """The servers to connect to, in order of preference (each URI is checked)."""
        servers = [uris] if isinstance(uris, str) else list(uris)
        if not servers:
            raise errors.ClientError("connect() needs at least one server URI")
        self.endpoints = [parse_endpoint(uri) for uri in servers]
        self.servers = [e.display for e in self.endpoints]
        self.server_index = 0

    def server_for(self, attempt: int, *, failover: bool) -> tuple[int, str]:
        """The server for ``attempt`` (0-based): in list order for a first connect; after a
        loss, starting with the one after the server that was lost (failover)."""
        n = len(self.servers)
        index = (self.server_index + attempt + (1 if failover and n > 1 else 0)) % n
        return index, self.servers[index]

    def connection_opened(self, index: int) -> None:
        """A fresh transport to ``servers[index]``: a new decoder, nothing stale to send."""
        self.server_index = index
        self.final = None
        self._head = b""
        self.decoder = MessageDecoder()
        self.outgoing = []

    def connection_lost(self, error: errors.ConveyorError) -> list[PendingCommand]:
        """Rule 4. Returns the commands that failed with ``error``."""
        self.online = False
        self.epoch += 1
        self.outgoing = []
        self.decoder = MessageDecoder()
        for sub in self.subscriptions.values():
            sub.outstanding = 0  # the server broke every lease this connection held
        return self.fail_all(error)

    # --- building commands ---------------------------------------------------------------

    def new_cid(self) -> str:
        return str(next(self._cids))

    def expect(self, cid: str, kind: CommandKind, sub_id: str | None = None) -> PendingCommand:
        pending = PendingCommand(kind, sub_id)
        self.awaiting_ack[cid] = pending
        return pending

    def logon(self, *, user_id: str | None = None, password: str | None = None) -> PendingCommand:
        cid = self.new_cid()
        self.outgoing.append(
            m.Logon(client_name=self.client_name, cid=cid, ack_type="processed", user_id=user_id, password=password)
        )
        return self.expect(cid, CommandKind.LOGON)

    def logged_on(self, ack: m.Ack) -> None:
        """Rule 2: after the logon ack, resume (acks, then publishes, then subscriptions)."""
        highest = ack.seq or 0
        # Forget only what is persisted (a server that sends no ``persisted`` means all).
        persisted = highest if ack.persisted is None else ack.persisted
        if persisted:
            self.store.discard_up_to(persisted)
        self.persisted_seq = max(self.persisted_seq, persisted)
        self.next_seq = max(self.next_seq, highest + 1, self.store.last_seq + 1)
        if ack.journal is not None:
            if self.server_journal is not None and ack.journal != self.server_journal:
                for sub in self.subscriptions.values():
                    sub.crossed_journals()  # another instance: its bookmarks name other positions
            self.server_journal = ack.journal
        self.flush_acks()  # offline still: the batches join the unconfirmed ones
        self.outgoing.extend(self.acks_unconfirmed.values())
        self.online = True
        for seq, topic, data, corr in self.store.unpersisted():
            self.outgoing.append(_publish_command(topic, data, seq, corr, self.store.extra(seq)))
        for sub in self.subscriptions.values():
            cid = self.new_cid()
            self.outgoing.append(sub.command(cid))
            self.expect(cid, CommandKind.RESUBSCRIBE, sub.sub_id)
        if self.on_persisted is not None:
            self.on_persisted(self.persisted_seq)

    def publish(self, topic: str, data: Any, sequence: int | None = None, correlation_id: str | None = None,
                delta: bool = False, sow_key: str | None = None, expiration: float | None = None) -> int:
        """Store a publish (rule 1) and, when online, queue it; returns its sequence.
        ``delta``: a delta publish (merged into the SOW record); ``sow_key``: the record's
        key on a SOW topic without Key fields; ``expiration``: its lifetime in seconds.

        The client's hot path: the clients pass arguments by position (matching five
        keywords by name costs about 40 ns a call), bytes need no conversion, and the
        usual publish builds its command in place instead of through a function."""
        body = data if type(data) is bytes else to_bytes(data)
        if sequence is None:
            sequence = self.next_seq
        if sequence >= self.next_seq:
            self.next_seq = sequence + 1
        extra = None
        if delta or sow_key is not None or expiration is not None:
            extra = {k: v for k, v in (("d", 1 if delta else None), ("k", sow_key), ("e", expiration)) if v is not None}
        self.store.add(sequence, topic, body, correlation_id, extra)
        if self.online:
            self.outgoing.append(
                m.Publish(topic=topic, data=body, seq=sequence, ack_type="persisted", correlation_id=correlation_id)
                if extra is None else _publish_command(topic, body, sequence, correlation_id, extra))
        return sequence

    def command(self, cmd: Any, kind: CommandKind) -> PendingCommand:
        self.outgoing.append(cmd)
        return self.expect(cmd.cid, kind)

    def add_subscription(self, sub: SubState) -> PendingCommand:
        """Register ``sub`` (so it is resubscribed after a reconnect) and subscribe."""
        if sub.sub_id in self.subscriptions:
            raise errors.DuplicateSubscription(f"subscription {sub.sub_id!r} already exists in this client")
        self.subscriptions[sub.sub_id] = sub
        cid = self.new_cid()
        return self.command(sub.command(cid), CommandKind.SUBSCRIBE)

    def replace_subscription(self, sub: SubState) -> PendingCommand:
        """Send ``sub``'s new topic, filter and options with the ``replace`` option."""
        cid = self.new_cid()
        return self.command(sub.command(cid, replace=True), CommandKind.SUBSCRIBE)

    def pause_subscriptions(self, ids: list[str], paused: bool) -> PendingCommand | None:
        """Mark the subscriptions ``ids`` paused (or running), all or none, and when
        online send ``pause`` (``resume``) naming them, with no topic. Returns that
        command, or None offline: the resubscription after logon carries the marks
        (subscription.py rule 8), as it does after a loss (rule 4). A refusal by the
        server puts the marks back."""
        verb = "pause" if paused else "resume"
        if not ids:
            raise errors.InvalidOption(f"{verb}: no subscription id given")
        unknown = [i for i in ids if i not in self.subscriptions]
        if unknown:
            raise errors.UnknownSubscription(f"no subscription {', '.join(map(repr, unknown))} to {verb} in this client")
        subs = [self.subscriptions[i] for i in ids]
        previous = [sub.mark_paused(paused) for sub in subs]
        if not self.online:
            return None
        cmd = m.Subscribe(topic="", sub_id=",".join(ids), cid=self.new_cid(), ack_type="processed", options=verb)
        pending = self.command(cmd, CommandKind.PAUSE)

        def undo() -> None:
            for sub, was in zip(subs, previous):
                sub.mark_paused(was)

        pending.undo = undo
        return pending

    def remove_subscription(self, sub_id: str) -> SubState | None:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is not None:
            self._subs_with_acks.discard(sub)
        return sub

    # --- acknowledgements (rule 3) -------------------------------------------------------

    def ack(self, queue: str, bookmark: str, verb: Settlement = AckVerb.ACK, sub_id: str | None = None) -> bool:
        """Batch an acknowledgement; True when the batch should be sent now (a touch:
        always, and it frees no backlog slot of its subscription)."""
        if verb is _TOUCH:
            self.acks.setdefault((queue, verb), []).append(bookmark)
            return True
        key = (queue, verb)
        batch = self.acks.get(key)
        if batch is None:
            self.acks[key] = [bookmark]
        else:
            batch.append(bookmark)
        return self._batched(1, sub_id)

    def ack_many(self, queue: str, bookmarks: list[str], verb: Settlement, sub_id: str | None) -> bool:
        """:meth:`ack` for several bookmarks at once (a hand-over's run of them)."""
        if verb is _TOUCH:
            self.acks.setdefault((queue, verb), []).extend(bookmarks)
            return True
        key = (queue, verb)
        batch = self.acks.get(key)
        if batch is None:
            self.acks[key] = list(bookmarks)
        else:
            batch.extend(bookmarks)
        return self._batched(len(bookmarks), sub_id)

    def _batched(self, n: int, sub_id: str | None) -> bool:
        """``n`` acknowledgements joined the batch: whether to send it now."""
        self.acks_count += n
        sub = self.subscriptions.get(sub_id) if sub_id is not None else None
        if sub is not None:
            sub.acks_pending += n
            self._subs_with_acks.add(sub)
            if sub.acks_pending >= sub.ack_threshold(self.ack_batch_size):
                return True
            # The server sends nothing more once every message it leased us is acked. A
            # handler called inline while a read is decoded would find that true after
            # each message (the rest of the read is not counted yet) and send one ack a
            # command: the face asks :meth:`acks_due` once the read is handled instead.
            if sub.all_acked() and not self._receiving:
                return True
        return self.acks_count >= self.ack_batch_size

    @property
    def receiving(self) -> bool:
        """Whether a read is being handled (handlers called inline, rule 3)."""
        return self._receiving

    def acks_due(self) -> bool:
        """After a read: whether a subscription holds nothing unacknowledged with its acks
        still batched (the server waits for them: send now)."""
        return any(sub.all_acked() for sub in self._subs_with_acks)

    def flush_acks(self) -> None:
        """Turn every batch into one ``sow_delete`` per (queue, verb)."""
        if self.acks:
            for (queue, verb), bookmarks in self.acks.items():
                cid = self.new_cid()
                joined, deliveries = split_deliveries(bookmarks)  # message.py rule 4
                options = verb.option
                if deliveries is not None:
                    options = f"{options},{deliveries}" if options else deliveries
                cmd = m.SowDelete(topic=queue, bookmark=joined, options=options, cid=cid, ack_type="persisted")
                self.acks_unconfirmed[cid] = cmd
                self.ack_batches += 1
                if self.online:
                    self.outgoing.append(cmd)
            self.acks.clear()
            self.acks_count = 0
        for sub in self._subs_with_acks:
            sub.outstanding = max(0, sub.outstanding - sub.acks_pending)
            sub.acks_pending = 0
        self._subs_with_acks.clear()

    # --- sending -------------------------------------------------------------------------

    def take_frames(self) -> list[bytes]:
        """Frames to send now. The store is synced first (rule 1)."""
        if not self.outgoing:
            return []
        self.store.sync()
        out, self.outgoing = self.outgoing, []
        frames = encode_frames(out)
        self.frames_sent += len(frames)
        self.commands_sent += len(out)
        return frames

    # --- receiving -------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[PendingCommand]:
        """Feed bytes; returns the pending commands this completed. Raises ConnectionLost
        when the server answers in HTTP (rule 7)."""
        if self._head is not None:
            head = self._head + data if self._head else data
            verdict = http_response_start(head)
            if verdict is None:
                self._head = head
                return []
            self._head = None
            if verdict:
                raise errors.ConnectionLost(self._answered_in_http())
            data = head
        self.decoder.receive_data(data)
        done: list[PendingCommand] = []
        self._receiving = True
        try:
            self._receive_items(done)
        finally:
            self._receiving = False
        return done

    def _receive_items(self, done: list[PendingCommand]) -> None:
        for item in self.decoder.next_items():
            match item:
                case m.Message():
                    self._deliver(item)
                case m.Ack():
                    self._on_ack(item, done)
                case m.OutOfFocus():
                    sub = self.subscriptions.get(item.sub_id)
                    if sub is not None:
                        sub.sink(Message(item.topic, item.data, None, item.sub_id, correlation_id=item.correlation_id,
                                         _epoch=self.epoch, sow_key=item.sow_key, oof=item.reason))
                case m.GroupBegin() | m.GroupEnd():
                    pass
                case m.ServerHeartbeat():
                    if self.on_heartbeat is not None:
                        self.on_heartbeat()
                case _:
                    pass

    def _answered_in_http(self) -> str:
        server = self.servers[self.server_index] if self.servers else "the server"
        return (f"{server} answered in HTTP: that is an HTTP port (the admin interface?), not conveyor's "
                "client port")

    def _deliver(self, item: m.Message) -> None:
        sub_id = item.sub_id
        if item.query_id is not None and sub_id is None:
            pending = self.awaiting_ack.get(item.query_id)
            if pending is not None:
                pending.messages.append(self._message(item, None))
                return
            sub_id = item.query_id  # the query part of a sow_and_subscribe (query_id = sub_id)
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            return  # unsubscribed while it was on the way
        if item.queue is not None:
            sub.outstanding += 1
        sub.sink(self._message(item, sub.acker, sub.confirm))

    def _message(self, item: m.Message, acker: Any, confirm: Any = None) -> Message:
        return Message(
            item.topic, item.data, item.bookmark, item.sub_id, item.seq, item.timestamp,
            item.lease_deadline, item.correlation_id, item.queue, acker, None, self.epoch, item.sow_key,
            None, item.delivery, confirm,
        )

    def _on_ack(self, ack: m.Ack, done: list[PendingCommand]) -> None:
        cid = ack.cid
        if cid is None and ack.code in FINAL_CODES:
            # Rule 6: the server says why it closes this connection (its client name went
            # to a newer connection of the same user, spec 002; an administrator's
            # disconnect): the loss that follows is final, never a reason to reconnect.
            self.final = errors.error_for_code(ack.code, ack.reason or ack.code)
            return
        if cid is None and ack.status == "failure" and ack.seq is not None:
            # A publish the server refused (not entitled, a limit, not JSON on a json
            # topic, a bad expiration...): it will never be persisted. The store lets it
            # go, the refusal is counted and logged, and the next wait_persisted() raises why.
            error = errors.error_for_code(ack.code or "server_error", ack.reason or "", seq=ack.seq)
            log.warning("client %s: publish %d refused by the server: %s", self.client_name, ack.seq, error)
            self.store.discard(ack.seq)
            self.publishes_refused += 1
            self.publish_errors.append(error)
            if self.on_persisted is not None:
                self.on_persisted(self.persisted_seq)
            return
        if cid is None:
            # Publishes carry no command id: their persisted acks are conflated (one ack
            # covers every sequence up to ``seq``), duplicates are reported one by one.
            if ack.ack_type == "persisted" and ack.seq is not None:
                if ack.status == "success":
                    if ack.reason:
                        self._publish_warning(ack.reason)
                    self.store.discard_up_to(ack.seq)
                    self.persisted_seq = max(self.persisted_seq, ack.seq)
                elif ack.status == "duplicate":
                    self.store.discard(ack.seq)
                if self.on_persisted is not None:
                    self.on_persisted(self.persisted_seq)
            return
        batch = self.acks_unconfirmed.pop(cid, None)
        if batch is not None:
            if ack.status == "failure":
                self._ack_refused(batch, ack)
            return
        pending = self.awaiting_ack.get(cid)
        if pending is None:
            return
        if ack.status == "failure":
            pending.error = errors.error_for_code(ack.code or "server_error", ack.reason or "", **(ack.details or {}))
            if pending.undo is not None:
                pending.undo()
        elif ack.ack_type != pending.kind.completed_by:
            return
        elif ack.reason and pending.kind is CommandKind.SUBSCRIBE:
            log.warning("%s", ack.reason)  # the server's warning about a subscription (say, a typo)
        pending.result = ack
        pending.done = True
        del self.awaiting_ack[cid]
        done.append(pending)

    def _ack_refused(self, batch: m.SowDelete, ack: m.Ack) -> None:
        """Rule 3: a batch of acknowledgements refused, in whole or for the bookmarks the
        failure names (``details["refused"]``)."""
        self.acks_refused += 1
        log.warning("acknowledgement of %s refused: %s", batch.topic, ack.reason)
        details = dict(ack.details or {})
        named = details.get("refused")
        refused = str(named).split(",") if named else (batch.bookmark or "").split(",")
        details.setdefault("refused", ",".join(refused))
        details.setdefault("queue", batch.topic)
        error = errors.error_for_code(ack.code or "server_error", ack.reason or "", **details)
        for sub in self.subscriptions.values():
            sub.forget_acks(refused)
        if len(self.ack_errors) < ACK_ERRORS_KEPT_MAX:
            self.ack_errors.append(error)
        for listener in list(self.ack_refused_listeners):
            try:
                listener(batch.topic, refused, error)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the reading of replies
                log.exception("an ack-refused listener raised")

    def confirmed_ack(self, sub_id: str | None, bookmark: str) -> None:
        """An ``ack(confirm=True)`` goes out at once (message.py rule 3): one message of
        ``sub_id`` fewer held, remembered as acknowledged (subscription.py rule 3)."""
        sub = self.subscriptions.get(sub_id) if sub_id is not None else None
        if sub is not None:
            sub.confirmed(bookmark)

    def refused_confirmed(self, sub_id: str | None, bookmark: str) -> None:
        """An ``ack(confirm=True)`` the server refused: not acknowledged (subscription.py rule 3)."""
        sub = self.subscriptions.get(sub_id) if sub_id is not None else None
        if sub is not None:
            sub.forget_acks([bookmark])

    def _publish_warning(self, reason: str) -> None:
        """A publish the server accepted with a warning (say, to a topic that is not
        recorded and has no subscriber: it reached no one). Counted; each distinct
        warning is logged once (a loop of publishes to a mistyped topic logs one line)."""
        self.publish_warnings += 1
        if reason not in self.publish_warnings_seen and len(self.publish_warnings_seen) < PUBLISH_WARNINGS_LOGGED_MAX:
            self.publish_warnings_seen.add(reason)
            log.warning("%s", reason)

    def fail_all(self, error: errors.ConveyorError) -> list[PendingCommand]:
        done = []
        for pending in self.awaiting_ack.values():
            if pending.kind is not CommandKind.PAUSE:  # rule 4: the resubscription carries it
                pending.error = error
            pending.done = True
            done.append(pending)
        self.awaiting_ack.clear()
        return done

    # --- views -----------------------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            state=self.state,
            server=self.servers[self.server_index] if self.servers else None,
            frames_sent=self.frames_sent,
            commands_sent=self.commands_sent,
            ack_batches=self.ack_batches,
            unpersisted=len(self.store),
            acks_batched=self.acks_count,
            ack_batches_unconfirmed=len(self.acks_unconfirmed),
            acks_refused=self.acks_refused,
            publishes_refused=self.publishes_refused,
            publish_warnings=self.publish_warnings,
            reconnects=self.reconnects,
            subscriptions=len(self.subscriptions),
        )
