"""Replication link sockets: the incoming transport's connections and outgoing links.

Rules:

1. **Incoming** (:class:`IncomingReplica`): a connection to the ``amps-replication``
   transport speaks only the link protocol (``Hello``, then ``Batch``es); it serves no
   application client. Its entries go to ``Engine.replica_frames``.
2. **Outgoing** (:class:`OutgoingLink`): one supervised task per ``Destination``. It
   dials the destination's addresses in priority order, cycling through the failover
   list, with a backoff that doubles from :data:`BACKOFF_MIN_S` to
   :data:`BACKOFF_MAX_S` and starts again after a link that streamed, or when the
   destination dials this instance and says it waits for this instance to catch it up
   (``Hello.catching_up``): the pause ends at once, so a restarted peer, which holds
   its replicated queues until this instance's stream has caught it up
   (docs/replication.md), does not wait for a backoff of up to :data:`BACKOFF_MAX_S`.
   It runs the
   handshake (:data:`HANDSHAKE_TIMEOUT_S`), then hands the link to the engine, which
   decides what to send; acknowledgements go back to the engine.
3. **Refusals are loud and patient**: a destination that refuses the handshake (a
   configuration rule the two instances break together) is logged as an error naming
   both and the rule, and dialled again only after :data:`REFUSED_RETRY_S`, so fixing
   the configuration and restarting the other side heals the link without a restart
   here.
4. Every state change is one log line; the engine's statistics say the rest.
5. **Secure links** (docs/security.md): an address of an ``amps-replication-secure``
   transport is dialled over TLS (the destination's certificate verified against the
   transport's ``CAFile``, a client certificate presented when configured), and the
   transport's ``User``/``Password`` go in the ``Hello`` for a destination with
   ``Authentication``. A destination that refuses them answers ``Refused`` (rule 3).
   The incoming side authenticates in the server shell before the engine sees the
   handshake (``Server.replica_frames``, server/gate.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import TYPE_CHECKING

import msgspec

from conveyor import errors
from conveyor.config.model import LinkEndpoint, Transport
from conveyor.protocol import replication as p
from conveyor.protocol.codec import Rejected, encode_frame
from conveyor.server.connection import Connection

if TYPE_CHECKING:
    from conveyor.server.server import Server

log = logging.getLogger("conveyor.replication")

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
HANDSHAKE_TIMEOUT_S = 10.0
REFUSED_RETRY_S = 30.0
CONNECT_TIMEOUT_S = 10.0
#: Unsent output a link may buffer: the engine's window plus a batch, with room to spare.
LINK_OUTPUT_BYTES_MAX = 64 * 1024 * 1024


class IncomingReplica(Connection):
    """A source connected to this instance's incoming replication transport (rule 1)."""

    def __init__(self, server: Server, transport_config: Transport) -> None:
        super().__init__(server, transport_config)
        self._server = server  # the whole server: the replication calls are beyond a ConnectionHost
        self.decoder = p.LinkDecoder(transport_config.frame_bytes_max)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.last_heard = self.server.clock()
        self._server.register_replica(self)

    def data_received(self, data: bytes) -> None:
        self.last_heard = self.server.clock()
        self.decoder.receive_data(data)
        items = self.decoder.next_items()
        if items:
            self._server.replica_frames(self, items)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.unregister_replica(self)


class _LinkProtocol(Connection):
    """The socket of an outgoing link: entries go to its :class:`OutgoingLink`."""

    def __init__(self, server: Server, link: OutgoingLink, transport_config: Transport) -> None:
        super().__init__(server, transport_config)
        self.link = link
        self.decoder = p.LinkDecoder(transport_config.frame_bytes_max)
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.last_heard = self.server.clock()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    def data_received(self, data: bytes) -> None:
        self.last_heard = self.server.clock()
        self.decoder.receive_data(data)
        items = self.decoder.next_items()
        if items:
            self.link.received(items)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.link.closed_early(exc)
        if not self.lost.done():
            self.lost.set_result(exc)


class OutgoingLink:
    """One ``Destination`` (rule 2)."""

    def __init__(self, server: Server, destination: str, addresses: tuple[str, ...],
                 endpoints: tuple[LinkEndpoint, ...] = ()) -> None:
        self.server = server
        self.destination = destination
        self.addresses = addresses
        # How to reach each address (rule 5), by address; plain and anonymous when absent.
        self.endpoints = {e.address: e for e in endpoints}
        self._transport = Transport(name=f"replication to {destination}", type="replication",
                                    output_bytes_max=LINK_OUTPUT_BYTES_MAX)
        self._protocol: _LinkProtocol | None = None
        self._handshake: asyncio.Future | None = None
        self._streaming = False
        self._last_problem: str | None = None
        self._wake = asyncio.Event()  # set: end the pause before the next dial (rule 2)

    def _problem(self, reason: str) -> None:
        """Log a failure to reach the destination once, not at every retry (rule 4)."""
        if reason != self._last_problem:
            log.warning("replication to %s: %s (retrying)", self.destination, reason)
            self._last_problem = reason
        self.server.link_unreachable(self.destination, reason)

    async def run(self) -> None:
        """Dial, stream, redial: forever (the server cancels it at shutdown)."""
        backoff = BACKOFF_MIN_S
        i = 0
        while True:
            address = self.addresses[i % len(self.addresses)]
            i += 1
            self._wake.clear()
            outcome = await self._session(address)
            if outcome == "refused":
                await self._pause(REFUSED_RETRY_S)
                continue
            if outcome == "streamed":
                backoff = BACKOFF_MIN_S
                i -= 1  # the address that worked is tried first again
            if await self._pause(backoff):
                backoff = BACKOFF_MIN_S  # the destination is up again
                continue
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` before the next dial, or less once :meth:`wake` is called
        (then True)."""
        try:
            async with asyncio.timeout(seconds):  # not wait_for: see _session
                await self._wake.wait()
        except TimeoutError:
            return False
        return True

    def wake(self) -> None:
        """The destination dialled this instance and waits for it to catch it up: a link
        waiting out its backoff dials now (rule 2)."""
        if not self._streaming and not self._wake.is_set():
            self._wake.set()
            log.info("replication to %s: it connected to this instance and waits for it to catch it up: dialling "
                     "it now", self.destination)

    async def _session(self, address: str) -> str:
        """One connection: "unreachable", "refused", "streamed" (then lost)."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        loop = asyncio.get_running_loop()
        endpoint = self.endpoints.get(address) or LinkEndpoint(address)
        try:
            tls = self._context(endpoint)
        except (OSError, ssl.SSLError) as exc:
            self._problem(f"cannot use the TLS files for {address}: {exc}")
            return "unreachable"
        try:
            # asyncio.timeout, not wait_for: in Python 3.11 wait_for returns a result
            # that lands together with a cancellation and drops the cancellation, and a
            # link that ignores the server's shutdown keeps the server from stopping.
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, protocol = await loop.create_connection(
                    lambda: _LinkProtocol(self.server, self, self._transport), host, int(port),
                    ssl=tls, server_hostname=host if tls else None)
        except ssl.SSLCertVerificationError as exc:
            self._problem(f"cannot connect to {address}: the destination's certificate was refused: "
                          f"{exc.verify_message or exc}")
            return "unreachable"
        except (OSError, asyncio.TimeoutError) as exc:
            self._problem(f"cannot connect to {address}: {exc or 'timed out'}")
            return "unreachable"
        self._protocol = protocol
        self._handshake = loop.create_future()
        try:
            hello = self.server.engine.link_hello(self.destination)
            if endpoint.user is not None:
                hello = msgspec.structs.replace(hello, user=endpoint.user, password=endpoint.password)
            protocol.transport.write(encode_frame([hello]))
            try:
                async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):  # not wait_for: see above
                    answer = await self._handshake
            except TimeoutError:
                answer = None
            if isinstance(answer, p.Refused):
                log.error("replication to %s (%s): REFUSED by the destination: %s", self.destination, address,
                          answer.reason)
                self.server.link_unreachable(self.destination, f"refused by the destination: {answer.reason}")
                return "refused"
            if not isinstance(answer, p.Welcome):
                why = "no answer to the handshake" if answer is None else f"the connection closed ({answer})"
                self._problem(f"{address}: {why}")
                return "unreachable"
            try:
                self.server.link_up(self.destination, protocol, answer)
            except errors.ReplicationRefused as exc:
                log.error("replication to %s (%s): REFUSED here: %s", self.destination, address, exc)
                return "refused"
            self._streaming = True
            self._last_problem = None
            exc = await protocol.lost
            self.server.link_lost(self.destination, protocol, f"connection to {address} lost: {exc or 'closed'}")
            return "streamed"
        finally:
            self._streaming = False
            self._protocol = None
            if not protocol.closed:
                protocol.close("replication link ended", abort=True)

    @staticmethod
    def _context(endpoint: LinkEndpoint) -> ssl.SSLContext | None:
        """The TLS context of a secure address (rule 5), built at every dial: a dial is
        rare (once per connection, after a backoff), and so a renewed certificate, key or
        CA file is used by the next connection without a reload or a restart."""
        if endpoint.tls is None:
            return None
        from conveyor.security.tls import client_context

        return client_context(endpoint.tls)

    def closed_early(self, exc: Exception | None) -> None:
        """The connection closed; during the handshake that is its answer."""
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_result(exc or "closed")

    def received(self, items: list) -> None:
        """Entries from the destination: the handshake answer, then acknowledgements."""
        for item in items:
            if self._handshake is not None and not self._handshake.done():
                self._handshake.set_result(item)
                continue
            if isinstance(item, p.Acked) and self._streaming:
                self.server.link_acked(self._protocol, item)
            elif isinstance(item, p.Refused):
                log.error("replication to %s: the destination refused the link: %s", self.destination, item.reason)
                self._protocol.close(f"refused: {item.reason}", abort=True)
            else:
                reason = item.error if isinstance(item, Rejected) else f"unexpected {type(item).__name__}"
                self._protocol.close(f"replication protocol error from the destination: {reason}", abort=True)
