"""A delivered message, and how bodies are encoded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode

#: ``acker(queue, bookmark, options)``: how a message reaches its client's ack batch.
Acker = Callable[[str, str, "str | None"], None]


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
    ``lease_deadline`` (epoch seconds) is when an at-least-once lease ends.
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
    _acked: bool = field(default=False, repr=False)
    _epoch: int = field(default=0, repr=False)  # the connection it arrived on

    def json(self) -> Any:
        """The body decoded as JSON."""
        return _json_decode(self.data)

    @property
    def is_queue_message(self) -> bool:
        return self.queue is not None and self.bookmark is not None

    @property
    def acked(self) -> bool:
        """True once :meth:`ack` has been called on a queue message."""
        return self._acked

    def ack(self, options: str | None = None) -> None:
        """Acknowledge a queue message (``options``: None, ``"cancel"`` or ``"expire"``).

        ``cancel`` returns the message to the queue for redelivery; ``expire`` removes
        it as expired (expiry actions, such as a dead-letter queue, apply). A no-op for
        messages that did not come from a queue, and for a second call. The client
        batches acknowledgements; ``flush()`` sends them at once.
        """
        if self._acked or self._acker is None or self.queue is None or self.bookmark is None:
            return
        self._acked = True
        self._acker(self.queue, self.bookmark, options)
