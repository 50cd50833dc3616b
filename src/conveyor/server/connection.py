"""One client connection: bytes in through the codec, frames out, and why it closed.

The connection decides nothing: decoded commands go to its host's ``handle`` (the
server), and the server writes the engine's output with :meth:`write_frames`. It knows
the server only as a :class:`ConnectionHost`: the few calls it makes, nothing else.
Rules it keeps:

- Output beyond the transport's ``output_bytes_max`` (``SlowClientDisconnectThreshold``)
  closes the connection *at once* (``abort``): buffering more for a reader that does
  not keep up would only grow memory. The server also keeps the output of all
  connections together under ``Limits/OutputBudget`` (server/output.py).
- When the socket is full (``pause_writing``) the server is told, so that output it
  can hold back (bookmark replays, query results) waits until the socket drains
  (``resume_writing``).
- Every close names its reason in the log, once.
- **A close the client is told about** (:meth:`Connection.close_telling`: an
  administrator's disconnect) writes one ``ack`` without a command id carrying the
  error's code and reason (docs/protocol.md, "Connection notices"), then closes
  *lingering*: the sending side is shut, so the client reads the notice and then the
  end of the stream, what it still sends is read and dropped, and the socket closes
  when the client closes its end (at most ``LINGER_S`` later). Closing a socket with
  input unread makes the system send a reset, which can make the client's system drop
  the notice before the client reads it.
- **HTTP on a client port**: the first bytes of a connection are checked before they
  reach the decoder (:func:`~conveyor.protocol.codec.http_request_start`). An HTTP
  request (a browser, curl, ``conveyor stats --admin`` given this port) is answered
  ``400 Bad Request`` with a plain-text body naming this port and the admin
  interface's address, and closed lingering, at once: left to the decoder, its first
  four bytes would announce a frame of a gigabyte and the client would wait for an
  answer until its own timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from conveyor import errors
from conveyor.config.model import Transport
from conveyor.protocol import messages as m
from conveyor.protocol.codec import CommandDecoder, encode_frames, http_request_start

log = logging.getLogger("conveyor.server")

LINGER_S = 2.0  # a lingering close waits this long for the client to close its end
HTTP_REQUEST_LINE_LOGGED_MAX = 120  # characters of an HTTP request line quoted in the log


class ConnectionHost(Protocol):
    """What a connection calls on the server that accepted it (server/server.py), all of it."""

    clock: Callable[[], float]

    def register(self, conn: Connection) -> None:
        """The connection is made: number it, count it, tell the engine (or close it)."""

    def handle(self, conn: Connection, items: list) -> None:
        """Decoded commands (and ``Rejected`` frames), in order."""

    def took_input(self, conn: Connection, size: int) -> None:
        """``size`` bytes were read (server/pacing.py: a turn's input)."""

    def unregister(self, conn: Connection) -> None:
        """The connection is lost."""

    def writing(self, conn: Connection, *, paused: bool) -> None:
        """The socket filled up or drained (server/output.py: flow control)."""

    def output_changed(self, conn: Connection, buffered: int) -> None:
        """After a write, ``buffered`` bytes are unsent (server/output.py: the budget)."""

    def admin_url(self) -> str | None:
        """The admin interface's address as it listens, or None without one."""


class Connection(asyncio.Protocol):
    def __init__(self, server: ConnectionHost, transport_config: Transport) -> None:
        self.server = server
        self.config = transport_config
        self.decoder = CommandDecoder(transport_config.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.conn_id = 0
        self.peer = None
        self.last_heard = 0.0
        self.heartbeat_s: float | None = None
        self.last_beat_sent = 0.0
        self.closed = False
        # A client connection: the output budget, the default idle timeout and replay
        # flow control apply. Not for replication links (numbered with ``link``), which
        # bound their own output and are quiet when nothing is published.
        self.client = True
        self.close_reason: str | None = None
        # For the admin interface: counters only (one addition per read or write).
        self.connected_at = 0.0
        self.bytes_in = self.bytes_out = 0
        self.messages_in = self.messages_out = 0
        # Authentication (server/gate.py, docs/security.md): who this is once proved, and
        # the commands that arrived while its logon was being verified.
        self.authenticated = False
        self.user: str | None = None
        self.held: list | None = None
        self._head: bytes | None = b""  # the first bytes, until told apart from HTTP (then None)
        self._linger: asyncio.TimerHandle | None = None  # a lingering close's time limit

    # asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.last_heard = self.connected_at = self.server.clock()
        self.server.register(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # a lingering close reads what the client still sends, and drops it
        self.last_heard = self.server.clock()
        self.bytes_in += len(data)
        if self._head is not None:
            data = self._first_bytes(data)
            if not data:
                return
        self.decoder.receive_data(data)
        items = self.decoder.next_items()
        if items:
            self.messages_in += len(items)
            self.server.handle(self, items)
        self.server.took_input(self, len(data))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.server.unregister(self)

    def pause_writing(self) -> None:  # the socket is full; output accumulates in the transport
        self.server.writing(self, paused=True)

    def resume_writing(self) -> None:
        self.server.writing(self, paused=False)

    # --- what the server tells it ------------------------------------------------------

    def numbered(self, conn_id: int, *, link: bool = False) -> None:
        """The server's number for this connection; a replication ``link`` is not a client."""
        self.conn_id = conn_id
        if link:
            self.client = False

    def authenticated_as(self, user: str) -> None:
        self.user, self.authenticated = user, True

    def hold(self, items: list) -> None:
        """Keep ``items`` (commands behind a logon being verified) until :meth:`release_held`."""
        self.held = list(items)

    def release_held(self) -> list:
        """The commands held (see :meth:`hold`), in order; nothing is held any more."""
        held, self.held = self.held or [], None
        return held

    def set_heartbeat(self, interval_s: float | None) -> None:
        """The client asked for server heartbeats every ``interval_s`` (None: no more)."""
        self.heartbeat_s = interval_s

    def beat_due(self, now: float) -> bool:
        """A server heartbeat is due (then it counts as sent ``now``)."""
        if self.heartbeat_s is None or now - self.last_beat_sent < self.heartbeat_s:
            return False
        self.last_beat_sent = now
        return True

    # ----------------------------------------------------------------------------------

    def write_frames(self, frames: list[bytes], *, messages: int = 0) -> None:
        """Write ``frames`` (holding ``messages`` of the engine's output: counted for the
        admin interface whether or not they are still sent)."""
        self.messages_out += messages
        if self.closed or self.transport is None:
            return
        self.transport.writelines(frames)
        for frame in frames:
            self.bytes_out += len(frame)
        buffered = self.transport.get_write_buffer_size()
        self.server.output_changed(self, buffered)
        if buffered > self.config.output_bytes_max:
            self.close(
                f"slow consumer: {buffered} bytes unsent, over the limit of {self.config.output_bytes_max}",
                abort=True,
            )

    @property
    def host(self) -> str:
        """The peer's host alone: what failed logons are counted by (with the user name)."""
        peer = self.peer
        return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)

    @property
    def address(self) -> str:
        """The peer's address, for logs (host:port)."""
        peer = self.peer
        if isinstance(peer, tuple) and len(peer) >= 2:
            return f"{peer[0]}:{peer[1]}"
        return str(peer)

    def close(self, reason: str, *, abort: bool = False) -> None:
        """Close with a logged ``reason``. ``abort`` drops unsent output and closes now;
        otherwise the output already written is sent first. Closing a connection in a
        lingering close (a shutdown) ends the lingering at once."""
        if self.closed:
            if self._linger is not None and self.transport is not None:
                self._linger.cancel()
                self._linger = None
                self.transport.abort()
            return
        log.warning("closing connection %s from %s: %s", self.conn_id, self.peer, reason)
        self.closed = True
        self.close_reason = reason
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def close_telling(self, error: errors.ConveyorError) -> None:
        """Tell the client why, then close (module rules): one ``ack`` without a command
        id, ``status`` failure, ``code`` and ``reason`` from ``error``; a client that
        knows the code does not reconnect (``disconnected_by_admin``)."""
        if self.closed or self.transport is None:
            return
        notice = m.Ack(ack_type="processed", status="failure", code=error.code, reason=str(error))
        self.write_frames(encode_frames([notice]))
        self._close_lingering(str(error))

    def _close_lingering(self, reason: str) -> None:
        """Close once what was written is sent, without a reset (module rules)."""
        transport = self.transport
        if self.closed or transport is None:
            return
        if not transport.can_write_eof():  # TLS: close_notify, then the close
            self.close(reason)
            return
        log.warning("closing connection %s from %s: %s", self.conn_id, self.peer, reason)
        self.closed = True
        self.close_reason = reason
        transport.write_eof()
        transport.resume_reading()  # paused, it would never see the client's end
        self._linger = asyncio.get_running_loop().call_later(LINGER_S, self._linger_over)

    def _linger_over(self) -> None:
        self._linger = None
        if self.transport is not None:
            self.transport.abort()  # the client did not close its end in time

    # --- the first bytes: HTTP on a client port (module rules) -------------------------------

    def _first_bytes(self, data: bytes) -> bytes:
        """``data`` with the bytes held back before it, once they are told apart from an
        HTTP request; empty while they cannot be yet, or when they were one (answered)."""
        head = self._head + data if self._head else data
        verdict = http_request_start(head)
        if verdict is None:
            self._head = head  # a few bytes of a method so far: at most 7 are held
            return b""
        self._head = None
        if verdict:
            self._answer_http(head)
            return b""
        return head

    def _answer_http(self, head: bytes) -> None:
        line = head.split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
        if len(line) > HTTP_REQUEST_LINE_LOGGED_MAX:
            line = line[:HTTP_REQUEST_LINE_LOGGED_MAX] + "..."
        port = self._local_port()
        admin = self._admin_url()
        where = f"the admin interface is at {admin}" if admin else "this server has no admin interface"
        body = (f"this is conveyor's client port{f' ({port})' if port else ''}, which speaks conveyor's binary "
                f"protocol, not HTTP: {where}\n"
                "(conveyor clients connect here with tcp://HOST:PORT; docs/client.md, docs/operations.md)\n").encode()
        response = (f"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        if not head.startswith(b"HEAD "):
            response += body
        if self.transport is not None:
            self.transport.write(response)
            self.bytes_out += len(response)
        self._close_lingering(f"an HTTP request on the client port ({line!r}): answered 400 Bad Request"
                              + (f"; {where}" if admin else ""))

    def _local_port(self) -> int | None:
        sockname = self.transport.get_extra_info("sockname") if self.transport is not None else None
        return sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None

    def _admin_url(self) -> str | None:
        """The admin interface's address as this client can reach it: its own host when it
        listens on every address (0.0.0.0, ::). None without an admin interface."""
        url = self.server.admin_url()
        if url is None:
            return None
        scheme, _, rest = url.partition("://")
        host = rest.rsplit(":", 1)[0].strip("[]")
        if host in ("0.0.0.0", "::", ""):
            sockname = self.transport.get_extra_info("sockname") if self.transport is not None else None
            if isinstance(sockname, tuple) and sockname:
                local = str(sockname[0])
                local = f"[{local}]" if ":" in local else local
                url = f"{scheme}://{local}:{rest.rsplit(':', 1)[1]}"
        return url
