"""The client's sans-I/O core, shared by :class:`AsyncClient` and :class:`Client`.

It turns calls into commands and server messages into events, and keeps the state a
reliable client needs: command ids and the acks they wait for, the publish store
(each message kept until the server reports it persisted, republished after a
reconnect), subscription routing, and batched acknowledgements. It owns no socket
and no clock: the faces feed it bytes and ``now``, and send what it returns.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from conveyor import errors
from conveyor.protocol import messages as m
from conveyor.protocol.codec import MessageDecoder, encode_frames

ACK_BATCH_SIZE_DEFAULT = 100  # acknowledgements per sow_delete frame
ACK_BATCH_SECONDS_DEFAULT = 0.05  # longest an acknowledgement waits to be sent

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode


def to_bytes(data: Any) -> bytes:
    """Message bodies: bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode()
    return _json_encode(data)


@dataclass(eq=False)
class Message:
    """A message delivered on a subscription or returned by a ``sow``."""

    topic: str
    data: bytes
    bookmark: str | None = None
    sub_id: str | None = None
    seq: int | None = None
    timestamp: float | None = None
    lease_deadline: float | None = None
    correlation_id: str | None = None
    queue: str | None = None
    _acker: Callable[[str, str, str | None], None] | None = field(default=None, repr=False)
    _acked: bool = field(default=False, repr=False)

    def json(self) -> Any:
        """The body decoded as JSON."""
        return _json_decode(self.data)

    @property
    def is_queue_message(self) -> bool:
        return self.queue is not None and self.bookmark is not None

    def ack(self, options: str | None = None) -> None:
        """Acknowledge a queue message (``options``: None, ``"cancel"`` or ``"expire"``).

        A no-op for messages that did not come from a queue, and for a second call.
        Acknowledgements are batched by the client; ``flush()`` sends them at once.
        """
        if self._acked or not self.is_queue_message or self._acker is None:
            return
        self._acked = True
        self._acker(self.queue, self.bookmark, options)


class PendingAck:
    """A command waiting for its ack; the face attaches a future or an event."""

    __slots__ = ("kind", "result", "error", "done", "waiter", "messages")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.result: m.Ack | None = None
        self.error: errors.ConveyorError | None = None
        self.done = False
        self.waiter: Any = None
        self.messages: list[Message] = []  # sow results


class PublishStore:
    """In-memory publish store: messages kept until persisted, in sequence order."""

    def __init__(self) -> None:
        self._entries: OrderedDict[int, tuple[str, bytes, str | None]] = OrderedDict()

    def add(self, seq: int, topic: str, data: bytes, correlation_id: str | None) -> None:
        self._entries[seq] = (topic, data, correlation_id)

    def discard_up_to(self, seq: int) -> None:
        entries = self._entries
        while entries:
            first = next(iter(entries))
            if first > seq:
                break
            del entries[first]

    def discard(self, seq: int) -> None:
        self._entries.pop(seq, None)

    def unpersisted(self) -> list[tuple[int, str, bytes, str | None]]:
        return [(seq, *rest) for seq, rest in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)


class ClientCore:
    def __init__(
        self,
        *,
        client_name: str,
        ack_batch_size: int = ACK_BATCH_SIZE_DEFAULT,
        store: PublishStore | None = None,
    ) -> None:
        self.client_name = client_name
        self.decoder = MessageDecoder()
        self.store = store if store is not None else PublishStore()
        self.ack_batch_size = ack_batch_size
        self._cids = itertools.count(1)
        self.pending: dict[str, PendingAck] = {}
        self.subscriptions: dict[str, Callable[[Message], None]] = {}
        self.next_seq = 1
        self.persisted_seq = 0
        self.outgoing: list = []  # commands waiting to be framed
        self.acks: dict[tuple[str, str | None], list[str]] = {}  # (queue, options) -> bookmarks
        self.acks_count = 0
        self.on_persisted: Callable[[int], None] | None = None
        self.on_heartbeat: Callable[[], None] | None = None
        self.frames_sent = 0

    # --- building commands ---------------------------------------------------------------

    def new_cid(self) -> str:
        return str(next(self._cids))

    def expect(self, cid: str, kind: str) -> PendingAck:
        pending = PendingAck(kind)
        self.pending[cid] = pending
        return pending

    def logon(self) -> PendingAck:
        cid = self.new_cid()
        self.outgoing.append(m.Logon(client_name=self.client_name, cid=cid, ack_type="processed"))
        return self.expect(cid, "logon")

    def logged_on(self, ack: m.Ack) -> None:
        """After the logon ack: continue numbering from the server's highest sequence and
        republish whatever it does not have (duplicate detection makes this safe)."""
        highest = ack.seq or 0
        self.store.discard_up_to(highest)
        self.persisted_seq = max(self.persisted_seq, highest)
        self.next_seq = max(self.next_seq, highest + 1)
        for seq, topic, data, corr in self.store.unpersisted():
            self.outgoing.append(m.Publish(topic=topic, data=data, seq=seq, ack_type="persisted", correlation_id=corr))

    def publish(self, topic: str, data: Any, *, sequence: int | None = None, correlation_id: str | None = None) -> int:
        body = to_bytes(data)
        if sequence is None:
            sequence = self.next_seq
        if sequence >= self.next_seq:
            self.next_seq = sequence + 1
        self.store.add(sequence, topic, body, correlation_id)
        self.outgoing.append(m.Publish(topic=topic, data=body, seq=sequence, ack_type="persisted", correlation_id=correlation_id))
        return sequence

    def command(self, cmd: Any, kind: str) -> PendingAck:
        self.outgoing.append(cmd)
        return self.expect(cmd.cid, kind)

    def ack(self, queue: str, bookmark: str, options: str | None) -> bool:
        """Queue an acknowledgement; True when the batch is full and should be sent."""
        key = (queue, options)
        batch = self.acks.get(key)
        if batch is None:
            self.acks[key] = [bookmark]
        else:
            batch.append(bookmark)
        self.acks_count += 1
        return self.acks_count >= self.ack_batch_size

    def flush_acks(self) -> None:
        """Move every batched acknowledgement into outgoing: one sow_delete per queue/option."""
        for (queue, options), bookmarks in self.acks.items():
            self.outgoing.append(m.SowDelete(topic=queue, bookmark=",".join(bookmarks), options=options))
        self.acks.clear()
        self.acks_count = 0

    def take_frames(self) -> list[bytes]:
        if not self.outgoing:
            return []
        out, self.outgoing = self.outgoing, []
        frames = encode_frames(out)
        self.frames_sent += len(frames)
        return frames

    # --- receiving -------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[PendingAck]:
        """Feed bytes; returns the pending commands this completed."""
        self.decoder.receive_data(data)
        done: list[PendingAck] = []
        for item in self.decoder.next_items():
            match item:
                case m.Message():
                    self._deliver(item)
                case m.Ack():
                    self._on_ack(item, done)
                case m.GroupBegin() | m.GroupEnd():
                    pass
                case m.ServerHeartbeat():
                    if self.on_heartbeat is not None:
                        self.on_heartbeat()
                case _:
                    pass
        return done

    def _deliver(self, item: m.Message) -> None:
        msg = Message(
            topic=item.topic, data=item.data, bookmark=item.bookmark, sub_id=item.sub_id, seq=item.seq,
            timestamp=item.timestamp, lease_deadline=item.lease_deadline, correlation_id=item.correlation_id,
            queue=item.queue,
        )
        if item.query_id is not None and item.sub_id is None:
            pending = self.pending.get(item.query_id)
            if pending is not None:
                pending.messages.append(msg)
            return
        handler = self.subscriptions.get(item.sub_id)
        if handler is not None:
            handler(msg)

    def _on_ack(self, ack: m.Ack, done: list[PendingAck]) -> None:
        if ack.cid is None:
            # Publishes carry no command id: their persisted acks are conflated (one ack
            # covers every sequence up to ``seq``), duplicates are reported one by one.
            if ack.ack_type == "persisted" and ack.seq is not None:
                if ack.status == "success":
                    self.store.discard_up_to(ack.seq)
                    self.persisted_seq = max(self.persisted_seq, ack.seq)
                elif ack.status == "duplicate":
                    self.store.discard(ack.seq)
                if self.on_persisted is not None:
                    self.on_persisted(self.persisted_seq)
            return
        pending = self.pending.get(ack.cid) if ack.cid is not None else None
        if pending is None:
            return
        if ack.status == "failure":
            pending.error = errors.error_for_code(ack.code or "server_error", ack.reason or "", **(ack.details or {}))
        elif not self._completes(pending.kind, ack.ack_type):
            return
        pending.result = ack
        pending.done = True
        del self.pending[ack.cid]
        done.append(pending)

    @staticmethod
    def _completes(kind: str, ack_type: str) -> bool:
        wanted = {"sow": "completed", "flush": "completed", "flush-persisted": "persisted"}.get(kind, "processed")
        return ack_type == wanted

    def fail_all(self, error: errors.ConveyorError) -> list[PendingAck]:
        done = []
        for pending in self.pending.values():
            pending.error = error
            pending.done = True
            done.append(pending)
        self.pending.clear()
        return done
