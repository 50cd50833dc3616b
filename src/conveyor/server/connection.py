"""One client connection: bytes in through the codec, frames out, and why it closed.

The connection decides nothing: decoded commands go to :meth:`Server._handle`, and the
server writes the engine's output with :meth:`write_frames`. Rules it keeps:

- Output beyond the transport's ``output_bytes_max`` (``SlowClientDisconnectThreshold``)
  closes the connection *at once* (``abort``): buffering more for a reader that does
  not keep up would only grow memory. The server also keeps the output of all
  connections together under ``Limits/OutputBudget`` (server.py).
- When the socket is full (``pause_writing``) the server is told, so that output it
  can hold back (bookmark replays) waits until the socket drains (``resume_writing``).
- Every close names its reason in the log, once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from conveyor.config.model import Transport
from conveyor.protocol.codec import CommandDecoder

if TYPE_CHECKING:
    from conveyor.server.server import Server

log = logging.getLogger("conveyor.server")


class Connection(asyncio.Protocol):
    def __init__(self, server: Server, transport_config: Transport) -> None:
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
        self.buffered = 0  # unsent output bytes after the last write (the budget's count)
        # A client connection: the output budget, the default idle timeout and replay
        # flow control apply. The server clears it for replication links, which bound
        # their own output and are quiet when nothing is published.
        self.client = True
        self.close_reason: str | None = None
        # For the admin interface: counters only (one addition per read or write).
        self.connected_at = 0.0
        self.bytes_in = self.bytes_out = 0
        self.messages_in = self.messages_out = 0
        # Authentication (server.py, docs/security.md): who this is once proved, and the
        # commands that arrived while its logon was being verified.
        self.authenticated = False
        self.user: str | None = None
        self.held: list | None = None
        self.counted = ""  # "pending" or "user" once the server counts it against a limit

    # asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.last_heard = self.connected_at = self.server.clock()
        self.server._register(self)

    def data_received(self, data: bytes) -> None:
        self.last_heard = self.server.clock()
        self.bytes_in += len(data)
        self.decoder.receive_data(data)
        items = self.decoder.next_items()
        if items:
            self.messages_in += len(items)
            self.server._handle(self, items)
        self.server._took_input(self, len(data))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._unregister(self)

    def pause_writing(self) -> None:  # the socket is full; output accumulates in the transport
        self.server._writing(self, paused=True)

    def resume_writing(self) -> None:
        self.server._writing(self, paused=False)

    # ----------------------------------------------------------------------------------

    def write_frames(self, frames: list[bytes]) -> None:
        if self.closed or self.transport is None:
            return
        self.transport.writelines(frames)
        for frame in frames:
            self.bytes_out += len(frame)
        buffered = self.transport.get_write_buffer_size()
        self.server._output_changed(self, buffered)
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
        otherwise the output already written is sent first."""
        if self.closed:
            return
        log.warning("closing connection %s from %s: %s", self.conn_id, self.peer, reason)
        self.closed = True
        self.close_reason = reason
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()
