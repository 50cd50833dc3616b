"""Sans-I/O framing shared by the server and the client (in the manner of h11).

A frame is a 4-byte big-endian length N followed by N bytes of MessagePack: an array
of messages (see :mod:`conveyor.protocol.messages`). A batch of publishes or acks is one
frame. Rules:

- A frame whose declared length is over ``frame_bytes_max`` is refused *before* its
  body is buffered: the decoder skips its bytes as they arrive and reports
  :class:`~conveyor.errors.FrameTooLarge` once, so the connection stays usable.
- A frame that is not valid MessagePack, or an entry that is not a known message,
  yields a :class:`Rejected` entry naming the error; the other entries of the batch
  are still decoded, so one bad command does not cost the good ones. That includes
  values nested deeper than the decoder's recursion allows (about a thousand levels,
  far beyond any command): msgspec raises ``RecursionError`` there, which is reported
  as a malformed frame, never raised to the caller.
- ``receive_data`` only buffers; ``next_items`` decodes. Nothing here touches a socket.
- **HTTP on the wrong port** is told apart by a connection's first bytes, on both sides
  (:func:`http_request_start`, :func:`http_response_start`): a frame starts with its
  length, whose first byte is 0 for any frame under 16 MiB, while HTTP starts with an
  upper-case method or ``HTTP/``. The server answers an HTTP request on its client port
  with a 400 at once, and the client fails at once on an HTTP answer to its logon,
  instead of each waiting for a frame of a gigabyte that never comes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import GenericAlias
from typing import Generic, Iterable, TypeVar, cast

import msgspec

from conveyor.errors import ClientError, FrameTooLarge, ProtocolError, UnknownCommand
from conveyor.protocol.messages import COMMAND_NAMES, Command, ServerMessage

FRAME_HEADER = struct.Struct(">I")
FRAME_HEADER_LEN = FRAME_HEADER.size
FRAME_BYTES_MAX_DEFAULT = 16 * 1024 * 1024  # large enough for a batch of 1,000 x 16 KiB

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()

#: What msgspec raises for bad input: malformed bytes, a wrong type, or nesting deeper
#: than the interpreter's recursion limit (``RecursionError``, e.g. 1,000 nested arrays).
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


@dataclass(frozen=True, slots=True)
class Rejected:
    """An entry of a frame that could not be decoded; ``error`` says why."""

    error: ClientError
    cid: str | None = None


#: The request methods an HTTP client starts a connection with (RFC 9110 and PATCH).
HTTP_METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ")
HTTP_RESPONSE_START = b"HTTP/"


def _starts_with_one_of(head: bytes, starts: tuple[bytes, ...]) -> bool | None:
    if any(head.startswith(start) for start in starts):
        return True
    if any(start.startswith(head) for start in starts):
        return None  # too few bytes yet to tell
    return False


def http_request_start(head: bytes) -> bool | None:
    """Do the first bytes of a connection to the server begin an HTTP request (a method
    and a space)? None while they are a proper beginning of one (wait for more)."""
    return _starts_with_one_of(head, HTTP_METHODS)


def http_response_start(head: bytes) -> bool | None:
    """Do the first bytes the client received begin an HTTP response (``HTTP/``)? None
    while they are a proper beginning of it (wait for more)."""
    return _starts_with_one_of(head, (HTTP_RESPONSE_START,))


def encode_frame(messages: Iterable[msgspec.Struct]) -> bytes:
    """One frame holding ``messages`` (a list is encoded as one MessagePack array)."""
    body = _encoder.encode(list(messages))
    return FRAME_HEADER.pack(len(body)) + body


def encode_frames(messages: list[msgspec.Struct], frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> list[bytes]:
    """Split ``messages`` into frames of at most ``frame_bytes_max`` bytes each."""
    body = _encoder.encode(messages)
    if len(body) <= frame_bytes_max or len(messages) <= 1:
        return [FRAME_HEADER.pack(len(body)) + body]
    half = len(messages) // 2
    return encode_frames(messages[:half], frame_bytes_max) + encode_frames(messages[half:], frame_bytes_max)


class _Decoder(Generic[T]):
    def __init__(self, item_type: object, frame_bytes_max: int) -> None:
        # ``item_type`` is a union of structs (T), a typing form rather than a class, so
        # msgspec's stubs cannot infer the decoders' type; the annotations state it.
        self.frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized frame still to discard
        self._batch: msgspec.msgpack.Decoder[list[T]] = msgspec.msgpack.Decoder(GenericAlias(list, item_type))
        self._one: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(item_type)
        self._raw = msgspec.msgpack.Decoder(list[msgspec.Raw])
        self._errors: list[Rejected] = []

    def receive_data(self, data: bytes) -> None:
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
            if not data:
                return
        self._buf += data

    def next_items(self) -> list[T | Rejected]:
        """Every complete entry buffered so far, in order (possibly from several frames)."""
        out: list[T | Rejected] = []
        buf = self._buf
        offset = 0
        while True:
            if self._skip:
                break
            if len(buf) - offset < FRAME_HEADER_LEN:
                break
            (length,) = FRAME_HEADER.unpack_from(buf, offset)
            if length > self.frame_bytes_max:
                available = len(buf) - offset - FRAME_HEADER_LEN
                dropped = min(length, available)
                self._skip = length - dropped
                offset += FRAME_HEADER_LEN + dropped
                out.append(
                    Rejected(
                        FrameTooLarge(
                            f"frame of {length} bytes is over the limit of {self.frame_bytes_max} bytes",
                            length=length,
                            limit=self.frame_bytes_max,
                        )
                    )
                )
                continue
            end = offset + FRAME_HEADER_LEN + length
            if len(buf) < end:
                break
            body = memoryview(buf)[offset + FRAME_HEADER_LEN : end]
            try:
                out.extend(self._batch.decode(body))
            except _DECODE_ERRORS:
                out.extend(self._decode_slowly(body))
            body.release()
            offset = end
        if offset:
            del buf[:offset]
        return out

    def _decode_slowly(self, body: memoryview) -> list[T | Rejected]:
        """Decode entry by entry so a bad entry is reported alone."""
        try:
            raws = self._raw.decode(body)
        except _DECODE_ERRORS as exc:
            return [Rejected(ProtocolError(f"malformed frame: {_why(exc)}"))]
        out: list[T | Rejected] = []
        for raw in raws:
            try:
                out.append(self._one.decode(raw))
            except _DECODE_ERRORS as exc:
                out.append(self._explain(raw, exc))
        return out

    def _explain(self, raw: msgspec.Raw, exc: Exception) -> Rejected:
        try:
            entry = msgspec.msgpack.decode(raw)
        except _DECODE_ERRORS:
            entry = None
        cid = None
        if isinstance(entry, dict):
            cid = entry.get("cid") if isinstance(entry.get("cid"), str) else None
            name = entry.get("c")
            # the decoder's ``type`` is the union it was built from (the stubs say a class)
            if isinstance(name, str) and name not in COMMAND_NAMES and cast(object, self._one.type) is Command:
                return Rejected(UnknownCommand(f"unknown command {name!r}", command=name), cid)
        return Rejected(ProtocolError(f"invalid command: {_why(exc)}"), cid)


def _why(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "values nested too deeply"
    return str(exc)


class CommandDecoder(_Decoder[Command]):
    """Server side: decodes client commands."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        super().__init__(Command, frame_bytes_max)


class MessageDecoder(_Decoder[ServerMessage]):
    """Client side: decodes what the server sends."""

    def __init__(self, frame_bytes_max: int = 1 << 31) -> None:
        super().__init__(ServerMessage, frame_bytes_max)
