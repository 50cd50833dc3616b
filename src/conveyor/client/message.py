"""A delivered message, how it is settled, and how bodies are encoded.

Rules kept here:

1. **A queue message is settled once**: :meth:`Message.ack`, :meth:`Message.cancel` or
   :meth:`Message.expire`. A second call of any of them raises
   :class:`~conveyor.errors.AlreadyAcknowledged` (the first one stands and is already
   on its way), so a program that settles a message twice learns it at once instead of
   wondering which call won.
2. Messages that did not come from a queue (a topic or bookmark subscription, a
   ``sow``) have nothing to settle: the three verbs do nothing on them, so the same
   code can consume a topic or a queue.
3. Settling only hands the message's bookmark to its client's acker (:data:`Acker`),
   which batches it; nothing here waits or touches the network. The one exception is
   the opt-in ``ack(confirm=True)``, which hands it to the face's confirmer (sent at
   once, answered by the server: docs/client.md, "Stale acknowledgements").
4. **A numbered delivery is settled by number.** A queue message that carries its
   delivery count (``delivery``: ``Leasing=strict``, or a subscription made with
   ``fenced_acks``) hands ``"<bookmark>@<delivery>"`` to the acker (:func:`with_delivery`),
   so that the batch's ``sow_delete`` names the delivery it settles, or touches
   (``deliveries=[...]``), and the server refuses it once stale (docs/queues.md,
   "Stale acknowledgements"). The mark never reaches the wire in a bookmark.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Union

import msgspec

from conveyor import errors
from conveyor.protocol.options import SECONDS_MAX, TEXT_BYTES_MAX, quote_text

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode


class AckVerb(str, enum.Enum):
    """How an acknowledgement settles a queue message."""

    ACK = "ack"  # done: the message leaves the queue
    CANCEL = "cancel"  # give it back: redelivered (counts toward MaxCancels)
    EXPIRE = "expire"  # remove it as expired: the queue's expiry actions run
    TOUCH = "touch"  # still working on it: the lease is renewed (the message stays unsettled)

    @property
    def option(self) -> str | None:
        """The ``sow_delete`` option that carries this verb on the wire."""
        return None if self is AckVerb.ACK else self.value

    def __str__(self) -> str:
        return self.value


class AckWith(NamedTuple):
    """A ``cancel`` with a delayed retry and / or a failure reason, or an ``expire`` with a
    reason (docs/queues.md, "Delayed retry" and "Failure reasons"): batched like its
    verb, with the acknowledgements that carry the same options."""

    verb: AckVerb
    delay: float | None = None
    reason: str | None = None

    @property
    def option(self) -> str:
        parts = [self.verb.value]
        if self.delay is not None:
            parts.append(f"delay={self.delay:g}")
        if self.reason is not None:
            parts.append(f"reason={quote_text(self.reason)}")
        return ",".join(parts)

    def __str__(self) -> str:
        return self.option


#: How a queue message is settled: a plain verb, or a verb with options.
Settlement = Union[AckVerb, AckWith]


def ack_with(verb: AckVerb, delay: float | None, reason: str | None) -> AckVerb | AckWith:
    """``verb`` with its options, checked as the server checks them (the verb alone when
    there are none)."""
    if delay is None and reason is None:
        return verb
    if delay is not None and not (0 <= delay <= SECONDS_MAX):
        raise errors.InvalidOption(f"delay must be between 0 and {SECONDS_MAX:g} seconds, not {delay!r}",
                                   option="delay")
    if reason is not None and len(reason.encode()) > TEXT_BYTES_MAX:
        raise errors.InvalidOption(f"a failure reason is at most {TEXT_BYTES_MAX} bytes of UTF-8 "
                                   f"({len(reason.encode())} given)", option="reason")
    return AckWith(verb, None if delay is None else float(delay), reason)


# Enum members as plain names: on the per-message path, ``AckVerb.ACK`` (a class
# attribute lookup through the enum machinery) costs ten times a global.
_ACK, _CANCEL, _EXPIRE, _TOUCH = AckVerb.ACK, AckVerb.CANCEL, AckVerb.EXPIRE, AckVerb.TOUCH

#: ``acker(queue, bookmark, verb)``: how a message reaches its client's ack batch.
Acker = Callable[[str, str, Settlement], None]
#: ``confirmer(queue, bookmark, delivery, sub_id)``: an acknowledgement sent at once, whose
#: answer (True: applied, False: refused) the face hands back (an awaitable, or the bool).
Confirmer = Callable[[str, str, "int | None", "str | None"], Any]

#: Rule 4: what separates a bookmark from the delivery it settles, between a message and
#: its client's batch (a bookmark is ``publisher|seq|position``: digits and bars).
DELIVERY_MARK = "@"


def with_delivery(bookmark: str, delivery: int | None) -> str:
    """Rule 4: the bookmark as the acker takes it (marked with the delivery, if any)."""
    return bookmark if delivery is None else f"{bookmark}{DELIVERY_MARK}{delivery}"


def split_deliveries(marked: list[str]) -> tuple[str, str | None]:
    """A batch's bookmarks as a ``sow_delete`` carries them: (the comma list of
    bookmarks, the ``deliveries=[...]`` option or None when none is named)."""
    joined = ",".join(marked)
    if DELIVERY_MARK not in joined:
        return joined, None
    bookmarks, numbers = [], []
    for item in marked:
        bookmark, _, n = item.partition(DELIVERY_MARK)
        bookmarks.append(bookmark)
        numbers.append(n or "0")
    return ",".join(bookmarks), f"deliveries=[{','.join(numbers)}]"


def to_bytes(data: Any) -> bytes:
    """Message bodies: bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode()
    return _json_encode(data)


@dataclass(eq=False, slots=True)
class Message:
    """A message delivered on a subscription or returned by a ``sow``.

    ``queue`` is set on queue deliveries: it is the queue to acknowledge to.
    ``lease_deadline`` (epoch seconds) is when an at-least-once lease ends (``math.inf``
    under a queue whose LeasePeriod is infinite, the default). ``delivery``: the
    message's delivery count (1 the first time), under ``Leasing=strict`` or on a
    subscription made with ``fenced_acks`` (rule 4); None otherwise.
    """

    topic: str
    data: bytes
    bookmark: str | None = None
    sub_id: str | None = None
    seq: int | None = None
    timestamp: float | None = None
    lease_deadline: float | None = None
    correlation_id: str | None = None
    queue: str | None = None
    _acker: Acker | None = field(default=None, repr=False)
    _settled: AckVerb | None = field(default=None, repr=False)  # rule 1
    _epoch: int = field(default=0, repr=False)  # the connection it arrived on
    sow_key: str | None = None  # the record's SowKey (SOW topics, views)
    #: An out-of-focus notice (docs/sow-and-views.md): why the record ``sow_key`` no longer
    #: qualifies (``match``, ``deleted``, ``expired``); None for an ordinary message.
    oof: str | None = None
    delivery: int | None = None  # rule 4
    _confirm: Confirmer | None = field(default=None, repr=False)  # rule 3's exception

    def json(self) -> Any:
        """The body decoded as JSON."""
        return _json_decode(self.data)

    @property
    def is_queue_message(self) -> bool:
        return self.queue is not None and self.bookmark is not None

    @property
    def acked(self) -> bool:
        """True once :meth:`ack`, :meth:`cancel` or :meth:`expire` settled this queue message."""
        return self._settled is not None

    def ack(self, *, confirm: bool = False) -> Any:
        """Done: the message leaves the queue. Batched by the client (``flush()`` sends
        at once); a refusal (a stale delivery, ``Leasing=strict``) is raised by the next
        ``flush()``. Raises AlreadyAcknowledged if the message was settled before.

        ``confirm=True``: sent at once, and the server's answer comes back: True when
        the acknowledgement was applied, False when it was refused (a stale delivery, or
        a message leased to another subscriber under ``Leasing=strict``). The asyncio
        client returns an awaitable of it (``await msg.ack(confirm=True)``), the blocking
        client waits and returns it. None for a message that did not come from a queue."""
        if not confirm:
            self._settle(_ACK)
            return None
        if self._confirm is None or self.queue is None or self.bookmark is None:
            return None  # rule 2
        self._check_unsettled(_ACK)
        self._settled = _ACK
        return self._confirm(self.queue, self.bookmark, self.delivery, self.sub_id)

    def cancel(self, *, delay: float | None = None, reason: str | None = None) -> None:
        """Give the message back: the queue redelivers it (it counts toward the queue's
        ``MaxCancels``). ``delay``: seconds before it is offered again to anyone (a
        delayed retry; without it the queue's RetryBackoff, if any, decides); ``reason``:
        why it failed, at most 256 bytes of UTF-8 (kept with the message, carried to its
        dead letter). Raises AlreadyAcknowledged if the message was settled before,
        InvalidOption for a bad delay or a reason too long."""
        self._settle(_CANCEL if delay is None and reason is None else ack_with(_CANCEL, delay, reason))

    def expire(self, *, reason: str | None = None) -> None:
        """Remove the message as expired: the queue's expiry actions (a dead-letter
        queue, for instance) run, with ``reason`` (at most 256 bytes of UTF-8) in the
        dead letter. Raises AlreadyAcknowledged if it was settled before."""
        self._settle(_EXPIRE if reason is None else ack_with(_EXPIRE, None, reason))

    def touch(self) -> None:
        """Still working on it: the server renews the lease for the queue's LeasePeriod
        from when it gets the touch (sent at once, not batched), so a long job keeps its
        message by touching it well before ``lease_deadline``, as often as it needs. The
        message stays unsettled; a settled one is not touched. ``lease_deadline`` is not
        updated (the server answers with how many of the messages it still held). A
        numbered delivery (rule 4) is touched by number: once stale, the server renews
        nothing and the refusal is reported as a refused ack is (the next ``flush()``)."""
        if self._acker is None or self.queue is None or self.bookmark is None or self._settled is not None:
            return
        bookmark = self.bookmark if self.delivery is None else with_delivery(self.bookmark, self.delivery)
        self._acker(self.queue, bookmark, _TOUCH)

    def _settle(self, verb: Settlement) -> None:
        if self._acker is None or self.queue is None or self.bookmark is None:
            return  # rule 2
        self._check_unsettled(verb)
        self._settled = verb if type(verb) is AckVerb else verb.verb  # type: ignore[union-attr]
        bookmark = self.bookmark if self.delivery is None else with_delivery(self.bookmark, self.delivery)
        self._acker(self.queue, bookmark, verb)

    def _check_unsettled(self, verb: Settlement) -> None:
        """Rule 1."""
        if self._settled is not None:
            raise errors.AlreadyAcknowledged(
                f"message {self.bookmark} of queue {self.queue} was already settled "
                f"({self._settled}); cannot {verb} it again",
                bookmark=self.bookmark,
                queue=self.queue,
                settled=self._settled.value,
            )
