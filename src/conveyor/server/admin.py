"""The admin interface: statistics, Prometheus metrics, actions, health and the
dashboard, over HTTP on the configuration's ``Admin/InetAddr``.

It is a shell beside the client listeners: it reads the engine's frozen statistics
records on the event loop (the engine is single-threaded) and changes nothing but what
an administrative action asks for. Routes (docs/operations.md has the full list):

=====================================================  =====================================
``/amps/instance[/...]``                               the statistics tree (admin_tree.py),
                                                       any sub-path of it (``/queues/Q/backlog``)
``/amps/instance/queues/Q/details``                    cursors and messages of queue Q
``/amps/instance/queues/Q/explain?bookmark=B``         why message B is or is not delivered
``/amps/administrator/clients/ID/disconnect``          close a client (ID: number or name)
``/amps/administrator/diagnostics/dump``               log a queue-state dump at info level
``/amps/administrator/queues/Q/enable_proxied_transfer``  (and ``disable_``): the engine says
                                                       whether it can
``/amps/administrator/replication/catch_up[/end]``     the wait for the sync peers after a
                                                       start: report it (``/end``: end it)
``/amps/administrator/dead_letters/T``                 list dead letters of topic T (a read);
``.../T/redrive?job=N``, ``.../jobs[/N[/cancel]]``     re-drive jobs (server/redrive.py)
``/api/...``                                           short aliases (``/api/queues``,
                                                       ``/api/queues/Q/details``, ``/api/history``)
``/metrics``                                           Prometheus text format
``/healthz``, ``/readyz``                              liveness and readiness probes
``/``, ``/static/...``                                 the dashboard (no build step, no CDN)
=====================================================  =====================================

Rules:

1. Actions take ``GET`` as the reference says (a link click works) and ``POST``; a
   request a browser marks ``Sec-Fetch-Site: cross-site`` is refused (403), so a web
   page elsewhere cannot make an operator's browser disconnect clients on a loopback
   admin port.
2. **Who may ask.** With ``Authentication`` configured, every request but the probes
   (``/healthz``, ``/readyz``: an orchestrator must reach them) needs a user: HTTP Basic
   credentials checked against the users file like a client's logon (same hashes,
   same per-address rate limit), or a verified client certificate on an HTTPS admin
   port. No or wrong credentials: 401 with ``WWW-Authenticate``. Then the user's
   ``Admin`` grant: ``read`` for statistics, metrics and the dashboard, ``full`` for
   the actions; without it, 403. Without ``Authentication`` the interface should stay
   on loopback, which a bare ``InetAddr`` port gives; a non-loopback address without
   authentication is logged as a warning at startup. ``ssl`` (TLS) and an extra
   ``authenticate`` hook are set by whoever starts the server.
3. The history behind the dashboard's charts is sampled every ``HISTORY_INTERVAL_S``
   (``HISTORY_SAMPLES_MAX`` samples: the last few minutes), five numbers per queue in
   one flat array per sample, so 1,000 queues cost a few MB.
4. Errors are JSON ``{"error": code, "message": text}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
from array import array
from collections import deque
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable

import msgspec

from conveyor import errors
from conveyor.config.model import Admin
from conveyor.server import admin_metrics, admin_tree, redrive
from conveyor.server.admin_http import HttpServer, Request, Response
from conveyor.server.net import bind_problem

if TYPE_CHECKING:
    from conveyor.server.server import Server

log = logging.getLogger("conveyor.admin")

HISTORY_INTERVAL_S = 2.0
HISTORY_SAMPLES_MAX = 180  # 6 minutes at 2 s
HISTORY_QUEUES_DEFAULT = 8  # queues in /api/history when none are named: the deepest
HISTORY_FIELDS = ("queue_depth", "in_flight", "enqueued", "delivered", "acknowledged")
_OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def _is_action(path: str) -> bool:
    """An administrative action (the Admin grant ``full``), not a read."""
    if not (path.startswith("/amps/administrator/") or path.startswith("/api/admin/")):
        return False
    dead = _dead_letter_parts(path)
    return dead is None or dead[-1] in ("redrive", "cancel")


def _dead_letter_parts(path: str) -> list[str] | None:
    """The parts after ``dead_letters/`` of a dead-letter route (server/redrive.py), else None."""
    parts = [p for p in path.split("/") if p]
    if len(parts) > 3 and parts[2] == "dead_letters" and parts[:2] in (["amps", "administrator"], ["api", "admin"]):
        return parts[3:]
    return None
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_ALIASES = {
    "/api/stats": "/amps/instance",
    "/api/instance": "/amps/instance",
}
_json = msgspec.json.Encoder()


class AdminError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class History:
    """Rule 3: samples of the instance and of every queue, oldest first."""

    def __init__(self, queue_names: list[str]) -> None:
        self.names = queue_names
        self.index = {n: i for i, n in enumerate(queue_names)}
        self.samples: deque[tuple[float, tuple, array]] = deque(maxlen=HISTORY_SAMPLES_MAX)

    def sample(self, server: Server, now: float) -> None:
        values = array("q")
        queues = server.engine.queues
        for name in self.names:
            values.extend(queues[name].activity())  # HISTORY_FIELDS, in order
        j = server.journal
        instance = (len(server.connections), j.durable_end, server.commit_stats.records_sum)
        self.samples.append((now, instance, values))

    def view(self, names: list[str]) -> dict:
        width = len(HISTORY_FIELDS)
        out: dict[str, Any] = {
            "interval": HISTORY_INTERVAL_S,
            "t": [t for t, _, _ in self.samples],
            "instance": {
                "connections": [i[0] for _, i, _ in self.samples],
                "journal_bytes": [i[1] for _, i, _ in self.samples],
                "journal_records": [i[2] for _, i, _ in self.samples],
            },
            "queues": {},
        }
        for name in names:
            i = self.index.get(name)
            if i is None:
                continue
            base = i * width
            out["queues"][name] = {
                field: [v[base + k] for _, _, v in self.samples] for k, field in enumerate(HISTORY_FIELDS)
            }
        return out


class AdminInterface:
    """The admin HTTP interface of one server (see the module header)."""

    def __init__(self, server: Server, config: Admin, *, authenticate: Callable | None = None, ssl=None) -> None:
        self.server = server
        self.config = config
        self.http = HttpServer(self.handle, ssl=ssl, authenticate=authenticate, open_paths=_OPEN_PATHS)
        self.history = History(list(server.engine.queues))
        self.port = 0
        self._authenticated = authenticate is not None or server.auth.required
        self._tls = ssl is not None
        self._registry = admin_metrics.registry(server)
        self.redrive = redrive.Redrive(server)

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self._tls else 'http'}://{host}:{self.port}"

    async def bind(self) -> None:
        """Listen on ``Admin/InetAddr``; a ConfigError naming it if that is impossible."""
        try:
            self.port = await self.http.bind(self.config.host, self.config.port)
        except OSError as exc:
            raise errors.ConfigError(
                f"cannot listen on {self.config.host}:{self.config.port} for the admin interface: "
                f"{bind_problem(exc)}",
                path="AMPSConfig/Admin/InetAddr",
                hint="choose a free port (conveyor serve --admin-port N), or remove <Admin>",
            ) from None
        log.info("admin interface on %s (dashboard at /, metrics at /metrics)", self.url)
        if not self._authenticated and not _loopback(self.config.host):
            log.warning("the admin interface listens on %s without authentication: anyone who reaches "
                        "that address can read statistics and disconnect clients", self.config.host)

    def close(self) -> None:
        if self.http._server is not None:
            self.http._server.close()

    async def run(self) -> None:
        """Serve and sample the history until cancelled (a supervised server task)."""
        sampler = asyncio.ensure_future(self._sample())
        try:
            await self.http.serve()
        finally:
            sampler.cancel()
            self.redrive.cancel_all()  # a job resumes when it is run again (server/redrive.py rule 2)

    async def _sample(self) -> None:
        while True:
            try:
                self.history.sample(self.server, self.server.clock())
            except Exception:  # noqa: BLE001 (a sampling bug must not stop the server)
                log.exception("admin: history sample failed")
            await asyncio.sleep(HISTORY_INTERVAL_S)

    # --- routing ------------------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path not in _OPEN_PATHS and self.server.auth.required:
            target = _ALIASES.get(path, path)
            request, refused = await self._check_user(request, full=_is_action(target))
            if refused is not None:
                return refused
        try:
            if path in _STATIC:
                return _static(*_STATIC[path])
            if path == "/metrics":
                return Response(200, admin_metrics.render(self.server, self._registry), admin_metrics.CONTENT_TYPE_LATEST)
            if path == "/healthz":
                failed = self.server.failure is not None
                return _json_response(
                    {"status": "failed" if failed else "ok", "failure": str(self.server.failure) if failed else None},
                    503 if failed else 200,
                )
            if path == "/readyz":
                ready = self.server.ready
                return _json_response({"ready": ready}, 200 if ready else 503)
            path = _ALIASES.get(path, path)
            dead = _dead_letter_parts(path)
            if dead is not None:
                return await self._dead_letters(request, dead)
            if _is_action(path):
                return self._action(request, path)
            if request.method == "POST":
                raise AdminError(405, "method_not_allowed", "POST is for administrative actions")
            if path.startswith("/api/"):
                path = "/amps/instance/" + path[len("/api/"):]
            if path == "/amps/instance" or path.startswith("/amps/instance/"):
                parts = [p for p in path[len("/amps/instance"):].split("/") if p]
                return _json_response(self._read(parts, request))
            raise AdminError(404, "not_found", f"no resource at {request.path}")
        except AdminError as exc:
            return _json_response({"error": exc.code, "message": str(exc)}, exc.status)
        except errors.NotAvailable as exc:
            return _json_response({"error": exc.code, "message": str(exc)}, 501)
        except errors.ClientError as exc:
            return _json_response({"error": exc.code, "message": str(exc)}, 400)

    async def _check_user(self, request: Request, *, full: bool) -> tuple[Request, Response | None]:
        """Rule 2: the request with its user as ``identity`` and None when it may go on,
        else the 401 or 403 to answer."""
        try:
            user = await self.server.admin_user(request.headers.get("authorization"), request.transport, full=full)
        except errors.NotAuthenticated as exc:
            response = _json_response({"error": exc.code, "message": str(exc)}, 401)
            response.headers["WWW-Authenticate"] = 'Basic realm="conveyor admin", charset="UTF-8"'
            return request, response
        except errors.NotEntitled as exc:
            need = "full" if full else "read"
            return request, _json_response(
                {"error": exc.code, "message": f"{exc}: this needs the Admin grant {need!r}"}, 403)
        return dataclasses.replace(request, identity=user), None

    def _read(self, parts: list[str], request: Request) -> Any:
        server = self.server
        now = server.clock()
        if not parts:
            tree = admin_tree.instance(server, now)
            tree["journal"] = admin_tree.journal(server)
            tree["engine"] = admin_tree.engine_summary(server, now)
            tree["queues"] = admin_tree.queues(server, now)
            tree["clients"] = admin_tree.clients(server, now)
            tree["subscriptions"] = admin_tree.subscriptions(server)
            tree["replication"] = admin_tree.replication(server, now)
            return tree
        head, rest = parts[0], parts[1:]
        if head == "queues" and rest:
            name = rest[0]
            if name not in server.engine.queues:
                raise AdminError(404, "unknown_queue", f"no queue {name!r}")
            if rest[1:2] == ["details"]:
                return admin_tree.details(server, name, now, _limit(request), content_filter=request.arg("filter"))
            if rest[1:2] == ["explain"]:
                bookmark = "/".join(rest[2:]) or request.arg("bookmark")
                if not bookmark:
                    raise AdminError(400, "bad_request", "explain needs ?bookmark=BOOKMARK (or a position)")
                return admin_tree.plain(server.engine.explain(name, bookmark, now))
            return _walk(admin_tree.queue(server, name, now), rest[1:], request.path)
        if head == "clients" and rest:
            conn_id = self._client_id(rest[0])
            found = admin_tree.client(server, conn_id, now) if conn_id is not None else None
            if found is None:
                raise AdminError(404, "unknown_client", f"no client {rest[0]!r}")
            return _walk(found, rest[1:], request.path)
        if head == "history":
            names = [n for n in (request.arg("queues") or "").split(",") if n]
            if not names:
                stats = [(q.statistics(None).queue_depth, n) for n, q in server.engine.queues.items()]
                names = [n for _, n in sorted(stats, key=lambda x: -x[0])[:HISTORY_QUEUES_DEFAULT]]
            return self.history.view(names)
        builders = {
            "queues": lambda: admin_tree.queues(server, now),
            "clients": lambda: admin_tree.clients(server, now),
            "subscriptions": lambda: admin_tree.subscriptions(server),
            "journal": lambda: admin_tree.journal(server),
            "engine": lambda: admin_tree.engine_summary(server, now),
            "replication": lambda: admin_tree.replication(server, now),
            "summary": lambda: admin_tree.instance(server, now),
        }
        if head in builders:
            return _walk(builders[head](), rest, request.path)
        return _walk(admin_tree.instance(server, now), parts, request.path)

    def _client_id(self, text: str) -> int | None:
        """A client by connection number or by client name."""
        if text.isdigit():
            return int(text)
        for conn_id, session in self.server.engine.sessions.items():
            if session.client_name == text:
                return conn_id
        return None

    # --- actions (reference D.2) -------------------------------------------------------------------

    def _action(self, request: Request, path: str) -> Response:
        if request.headers.get("sec-fetch-site") == "cross-site":
            raise AdminError(403, "forbidden", "administrative actions are refused from another site")
        parts = [p for p in path.split("/") if p][2:]  # after amps/administrator (or api/admin)
        server = self.server
        match parts:
            case ["clients", ident, "disconnect"]:
                conn_id = self._client_id(ident)
                conn = server.connections.get(conn_id) if conn_id is not None else None
                if conn is None or conn_id not in server.engine.sessions:
                    raise AdminError(404, "unknown_client", f"no client {ident!r}")
                name = server.engine.sessions[conn_id].client_name
                log.info("admin: disconnecting client %s (%s) at the request of %s", conn_id, name,
                         request.identity or _peer(request))
                conn.close_telling(errors.DisconnectedByAdmin("disconnected by an administrator"))  # no reconnect
                return _json_response({"disconnected": conn_id, "client": name})
            case ["diagnostics", ("dump" | "queues")]:
                return _json_response(self._dump(request))
            case ["queues", name, ("enable_proxied_transfer" | "disable_proxied_transfer") as action]:
                server.engine.set_proxied_transfer(name, action.startswith("enable"))
                return _json_response({"queue": name, "action": action, "done": True})
            case ["replication", "catch_up"]:
                return _json_response(admin_tree.catch_up(server, server.clock()))
            case ["replication", "catch_up", "end"]:
                who = request.identity or _peer(request)
                ended = server.end_catch_up(f"an administrator ({who})")
                return _json_response({**admin_tree.catch_up(server, server.clock()), "ended": ended})
        raise AdminError(404, "unknown_action", f"no administrative action at {request.path}")

    async def _dead_letters(self, request: Request, parts: list[str]) -> Response:
        """Dead letters: the listing (a read) and the re-drive jobs (server/redrive.py)."""
        jobs = self.redrive
        if parts[-1] in ("redrive", "cancel") and request.headers.get("sec-fetch-site") == "cross-site":
            raise AdminError(403, "forbidden", "administrative actions are refused from another site")
        try:
            match parts:
                case ["jobs"]:
                    return _json_response(jobs.view())
                case ["jobs", name]:
                    job = jobs.jobs.get(name)
                    if job is None:
                        raise AdminError(404, "unknown_job", f"no re-drive job {name!r}")
                    return _json_response(job.view())
                case ["jobs", name, "cancel"]:
                    log.info("admin: re-drive job %r cancelled by %s", name, request.identity or _peer(request))
                    return _json_response(jobs.cancel(name).view())
                case [*topic, "redrive"] if topic:
                    user = request.identity if isinstance(request.identity, str) else None
                    job = jobs.start("/".join(topic), request.arg("job"), request.arg,
                                     str(request.identity or _peer(request)), user)
                    return _json_response(job.view(), 202)
            sel = redrive.selection("/".join(parts), request.arg, self.server.clock())
            listing = await redrive.list_dead_letters(self.server, sel, redrive.limit_of(request.arg("limit")))
            return _json_response(redrive.listing_json(listing))
        except redrive.RedriveError as exc:
            return _json_response({"error": exc.code, "message": str(exc)}, exc.status)
        except errors.ServerError as exc:
            return _json_response({"error": exc.code, "message": str(exc)}, 500)

    def _dump(self, request: Request) -> dict:
        """The queue-state dump, logged at info level and returned."""
        server = self.server
        now = server.clock()
        out = {}
        for name in server.engine.queues:
            stats = admin_tree.queue(server, name, now)
            d = admin_tree.details(server, name, now, limit=admin_tree.DETAILS_MESSAGES_DEFAULT)
            out[name] = {"statistics": stats, "cursors": d["cursors"], "leased": [
                m for m in d["messages"] if m["state"] == "leased"
            ]}
            log.info("diagnostics: queue %s: depth %d, available %d, leased %d, consumers %d, "
                     "inactive %d, seconds behind %s", name, stats["queue_depth"], stats["available"],
                     stats["backlog"], stats["consumers"], stats["inactive_message_count"], stats["seconds_behind"])
            for m in out[name]["leased"]:
                log.info("diagnostics: queue %s: %s leased to %s (%s) until %s, delivery %d", name,
                         m["bookmark"], m["holder"], m["holder_client"], m["lease_deadline"], m["deliveries"])
        log.info("diagnostics dump requested by %s: %d queue(s)", request.identity or _peer(request), len(out))
        return {"queues": out}


def _walk(tree: Any, parts: list[str], path: str) -> Any:
    node = tree
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise AdminError(404, "not_found", f"no resource at {path}")
    return node


def _limit(request: Request) -> int:
    text = request.arg("limit")
    if text is None:
        return admin_tree.DETAILS_MESSAGES_DEFAULT
    if not text.isdigit():
        raise AdminError(400, "bad_request", "limit must be a non-negative integer")
    return min(int(text), admin_tree.DETAILS_MESSAGES_MAX)


def _json_response(value: Any, status: int = 200) -> Response:
    return Response(status, _json.encode(value) + b"\n", "application/json")


def _static(name: str, content_type: str) -> Response:
    data = resources.files("conveyor.server").joinpath("admin_static", name).read_bytes()
    return Response(200, data, content_type)


def _peer(request: Request) -> str:
    peer = request.peer
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "an unknown peer"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
