"""A small, bounded HTTP/1.1 server for the admin interface (asyncio streams).

Why not a library: the standard library has no asyncio HTTP server, and aiohttp (or
an ASGI server) would bring a second event-loop framework, its own dependencies and
far more surface than a read-mostly admin port needs. This module does only what the
admin interface uses, and bounds all of it (docs/architecture.md, "Admin interface"):

1. **Requests** are ``GET`` and ``HEAD`` (``POST`` is accepted for actions, with an
   empty body): a request line of at most ``REQUEST_LINE_BYTES_MAX``, at most
   ``HEADERS_MAX`` header lines and ``HEADER_BYTES_MAX`` bytes of headers, a body of at
   most ``BODY_BYTES_MAX`` (read and discarded). Anything else is answered with the
   matching 4xx status and the connection is closed.
2. **Time**: a request must arrive whole within ``REQUEST_TIMEOUT_S`` of its first
   byte; an idle keep-alive connection is closed after ``KEEPALIVE_IDLE_S``; a
   response must be taken by the client within ``WRITE_TIMEOUT_S``.
3. **Connections**: at most ``CONNECTIONS_MAX`` at once; the next one is answered 503
   and closed. HTTP/1.1 keeps the connection open unless ``Connection: close``;
   HTTP/1.0 closes it unless ``Connection: keep-alive``. No pipelining beyond what
   the stream naturally queues (requests are answered in order).
4. **Failures stay local**: a handler that raises answers 500 and is logged with its
   traceback; a client that misbehaves loses only its own connection. Nothing here
   raises out of :meth:`HttpServer.serve`, so the supervised admin task fails the
   server only if the listener itself breaks.
5. **Security hooks**: ``ssl`` (an :class:`ssl.SSLContext`) wraps the listener in TLS;
   ``authenticate(request)`` returns an identity (any truthy value) or ``None``, which
   is answered 401 with ``WWW-Authenticate`` (``auth_realm``). Both are supplied by
   whoever starts the admin interface (conveyor's security layer), not decided here.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger("conveyor.admin")

REQUEST_LINE_BYTES_MAX = 8 * 1024
HEADER_BYTES_MAX = 32 * 1024
HEADERS_MAX = 64
BODY_BYTES_MAX = 64 * 1024
REQUEST_TIMEOUT_S = 10.0
KEEPALIVE_IDLE_S = 15.0
WRITE_TIMEOUT_S = 30.0
CONNECTIONS_MAX = 256
_METHODS = frozenset({"GET", "HEAD", "POST"})
_NOT_HTTP = ("not an HTTP request: this is conveyor's admin interface (HTTP); conveyor clients connect to a "
             "client port (tcp://HOST:PORT)")


@dataclass(frozen=True)
class Request:
    method: str
    target: str  # as sent (path and query)
    path: str  # percent-decoded, without the query
    query: dict[str, list[str]]
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    peer: tuple | None
    identity: object = None  # what the authenticator returned
    transport: object = None  # the connection's transport (its TLS peer certificate)

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]
Authenticator = Callable[[Request], object]


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, why: str) -> None:
        super().__init__(why)
        self.status = status


def _text(status: HTTPStatus, why: str = "") -> Response:
    return Response(int(status), ((why or status.phrase) + "\n").encode(), "text/plain; charset=utf-8")


class HttpServer:
    """Serve ``handler`` on ``host:port`` (rules in the module header)."""

    def __init__(
        self,
        handler: Handler,
        *,
        ssl: ssl_module.SSLContext | None = None,
        authenticate: Authenticator | None = None,
        auth_realm: str = "conveyor admin",
        open_paths: frozenset[str] = frozenset(),
    ) -> None:
        """``open_paths``: paths served without authentication (health probes)."""
        self._handler = handler
        self._ssl = ssl
        self._authenticate = authenticate
        self._realm = auth_realm
        self._open_paths = open_paths
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.port = 0
        self.requests = 0  # answered, any status

    async def bind(self, host: str, port: int) -> int:
        """Listen (not yet serving); the port bound."""
        self._server = await asyncio.start_server(
            self._connection, host, port, ssl=self._ssl, limit=HEADER_BYTES_MAX,
            start_serving=False,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def start_serving(self) -> None:
        """Accept connections from now on (before :meth:`serve` runs as a task)."""
        assert self._server is not None, "bind() first"
        await self._server.start_serving()

    async def serve(self) -> None:
        """Serve until cancelled, then close every connection."""
        assert self._server is not None, "bind() first"
        try:
            await self._server.serve_forever()
        finally:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)

    # --- one connection ----------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        if len(self._connections) >= CONNECTIONS_MAX:
            await self._send(writer, _text(HTTPStatus.SERVICE_UNAVAILABLE, "too many admin connections"),
                             head=False, keep_alive=False)
            writer.close()
            return
        self._connections.add(task)
        try:
            await self._serve_connection(reader, writer, peer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl_module.SSLError):
            pass  # the client went away or stalled: only its connection is lost
        except asyncio.CancelledError:
            # The interface is closing (serve() cancels its connections). This task is
            # the connection's own, started by asyncio's stream server, whose callback
            # would log a cancelled task as an error with a traceback: end quietly.
            return
        except Exception:  # noqa: BLE001 (rule 4: never out of serve())
            log.exception("admin connection from %s failed", peer)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve_connection(self, reader, writer, peer) -> None:
        first = True
        while True:
            # Idle wait for the first byte of the next request (rule 2).
            try:
                async with asyncio.timeout(KEEPALIVE_IDLE_S if not first else REQUEST_TIMEOUT_S):  # not wait_for:
                    start = await reader.read(1)  # it can drop a cancellation (Python 3.11)
            except TimeoutError:
                return
            if not start:
                return
            if not start.isalpha():  # no request line starts so (conveyor's protocol does): say so now
                await self._send(writer, _text(HTTPStatus.BAD_REQUEST, _NOT_HTTP), head=False, keep_alive=False)
                return
            first = False
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    request = await self._read_request(start, reader, peer, writer.transport)
            except _BadRequest as bad:
                await self._send(writer, _text(bad.status, str(bad)), head=False, keep_alive=False)
                return
            except TimeoutError:
                await self._send(writer, _text(HTTPStatus.REQUEST_TIMEOUT), head=False, keep_alive=False)
                return
            keep_alive = _keep_alive(request)
            response = await self._answer(request)
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await self._send(writer, response, head=request.method == "HEAD", keep_alive=keep_alive)
            self.requests += 1
            if not keep_alive:
                return

    async def _read_request(self, start: bytes, reader: asyncio.StreamReader, peer, transport=None) -> Request:
        line = start + await _read_line(reader, REQUEST_LINE_BYTES_MAX, HTTPStatus.REQUEST_URI_TOO_LONG)
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        total = 0
        while True:
            raw = await _read_line(reader, HEADER_BYTES_MAX, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            total += len(raw)
            if raw in (b"\r\n", b"\n"):
                break
            if total > HEADER_BYTES_MAX or len(headers) >= HEADERS_MAX:
                raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many or too large headers")
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed header line")
            headers[name.lower()] = value.strip()
        if method not in _METHODS:
            raise _BadRequest(HTTPStatus.METHOD_NOT_ALLOWED, f"method {method} is not allowed")
        if "transfer-encoding" in headers:
            raise _BadRequest(HTTPStatus.NOT_IMPLEMENTED, "request bodies with Transfer-Encoding are not accepted")
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed Content-Length")
        if int(length) > BODY_BYTES_MAX:
            raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
        if int(length):
            await reader.readexactly(int(length))  # the admin interface takes no body
        split = urlsplit(target)
        return Request(
            method=method, target=target, path=unquote(split.path) or "/",
            query=parse_qs(split.query, keep_blank_values=True), version=version,
            headers=headers, peer=peer, transport=transport,
        )

    async def _answer(self, request: Request) -> Response:
        if self._authenticate is not None and request.path not in self._open_paths:
            try:
                identity = self._authenticate(request)
                if isinstance(identity, Awaitable):
                    identity = await identity
            except Exception:  # noqa: BLE001
                log.exception("admin authenticator failed")
                return _text(HTTPStatus.INTERNAL_SERVER_ERROR, "authentication failed on the server")
            if not identity:
                response = _text(HTTPStatus.UNAUTHORIZED, "credentials required")
                response.headers["WWW-Authenticate"] = f'Basic realm="{self._realm}"'
                return response
            request = Request(**{**request.__dict__, "identity": identity})
        try:
            return await self._handler(request)
        except Exception:  # noqa: BLE001 (rule 4)
            log.exception("admin request %s %s failed", request.method, request.target)
            return _text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error (see the server log)")

    async def _send(self, writer: asyncio.StreamWriter, response: Response, *, head: bool, keep_alive: bool) -> None:
        status = HTTPStatus(response.status)
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "Cache-Control: no-store",
            "X-Content-Type-Options: nosniff",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        lines += [f"{k}: {v}" for k, v in response.headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head:
            writer.write(response.body)
        await writer.drain()


async def _read_line(reader: asyncio.StreamReader, limit: int, status: HTTPStatus) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise _BadRequest(status, "line too long") from None
    if len(line) > limit:
        raise _BadRequest(status, "line too long")
    return line


def _keep_alive(request: Request) -> bool:
    token = request.headers.get("connection", "").lower()
    if request.version == "HTTP/1.0":
        return token == "keep-alive"
    return token != "close"
