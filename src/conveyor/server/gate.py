"""The logon gate: who a connection is, before the engine hears from it (docs/security.md).

With ``Authentication``, a connection's first command must be a logon whose credentials
the authenticator verifies off the loop (or a verified client certificate stands in for
them); its later commands are held, reading paused, and reach the engine only after the
engine was told who the user is. A refused logon is answered, logged with the address
and closed; wrong credentials are counted per address and per user, and answered late
over the limit (security/ratelimit.py). A replication source authenticates the same way
with its handshake, and needs the ``replicate`` entitlement.

The gate counts what the limits bound: connections waiting to log on
(``Limits/MaxPendingLogons``) and each user's connections
(``Limits/MaxConnectionsPerUser``). The admin interface's requests are verified here too
(:meth:`LogonGate.admin_user`). With ``conveyor serve --no-clients-until-replicated`` it
refuses clients, retryably, while the instance catches up after its start
(:meth:`LogonGate.refuse_until_replicated`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from conveyor import errors
from conveyor.engine.entitlements import Permission
from conveyor.protocol import messages as m
from conveyor.protocol import replication as p_repl
from conveyor.protocol.codec import Rejected, encode_frames
from conveyor.security.authenticator import basic_credentials
from conveyor.security.tls import peer_user

if TYPE_CHECKING:
    from conveyor.config.model import Limits
    from conveyor.engine.core import Engine
    from conveyor.security.authenticator import Authenticator
    from conveyor.server.connection import Connection
    from conveyor.server.pacing import InputPacing
    from conveyor.server.supervisor import Supervisor

log = logging.getLogger("conveyor.server")


class LogonGate:
    def __init__(self, auth: Authenticator, engine: Engine, limits: Limits, clock: Callable[[], float],
                 supervisor: Supervisor, pacing: InputPacing, *, handle: Callable[[Connection, list], None],
                 replica_frames: Callable[[Connection, list], None]) -> None:
        self._auth = auth
        self._engine = engine
        self._limits = limits
        self._clock = clock
        self._supervisor = supervisor
        self._pacing = pacing  # a verified logon resumes reading unless the journal's backlog holds it
        self._handle = handle  # the server's: a verified logon and the commands held behind it
        self._replica_frames = replica_frames  # the same for a replication source's handshake
        self._pending_logons = 0
        self._user_connections: dict[str, int] = {}
        self._counted: dict[int, str] = {}  # conn_id -> "pending" or "user": what it is counted against
        self.verifying: set[asyncio.Task] = set()  # logons being verified (stop() cancels them)

    # --- the limits ----------------------------------------------------------------------

    def count_pending(self, conn: Connection) -> bool:
        """A new connection waits for its logon (with Authentication): count it against
        MaxPendingLogons, or close it over the limit (False)."""
        if not self._auth.required:
            return True
        limit = self._limits.pending_logons_max
        if self._pending_logons >= limit:
            conn.close(f"too many connections waiting to log on (Limits/MaxPendingLogons {limit})", abort=True)
            return False
        self._pending_logons += 1
        self._counted[conn.conn_id] = "pending"
        return True

    def waiting_for_logon(self, conn: Connection) -> bool:
        """``conn`` is counted as waiting to log on (Limits/LogonTimeout applies)."""
        return self._counted.get(conn.conn_id) == "pending"

    def forget(self, conn: Connection) -> None:
        """``conn`` no longer counts against a limit (it closed, or it is now a user's)."""
        counted = self._counted.pop(conn.conn_id, "")
        if counted == "pending":
            self._pending_logons -= 1
        elif counted == "user" and conn.user is not None:
            left = self._user_connections.get(conn.user, 0) - 1
            if left > 0:
                self._user_connections[conn.user] = left
            else:
                self._user_connections.pop(conn.user, None)

    # --- client logons -------------------------------------------------------------------

    def admit_by_certificate(self, conn: Connection) -> None:
        """A verified client certificate authenticates a new connection (docs/security.md)."""
        if self._auth.by_certificate and conn.config.tls is not None:
            user = peer_user(conn.transport)
            if user is not None:
                self._admit(conn, user, None)

    def commands(self, conn: Connection, items: list) -> None:
        """Commands of a connection not yet authenticated: the first must be a logon;
        while it is verified, the rest wait and reading pauses."""
        if conn.held is not None:
            conn.held.extend(items)
            return
        first = items[0]
        if type(first) is not m.Logon:
            log.warning("connection %s from %s refused: %s before logon", conn.conn_id, conn.address,
                        type(first).__name__)
            self._refuse(conn, getattr(first, "cid", None),
                         errors.NotAuthenticated("this server requires a logon with credentials before any command"))
            return
        self._verify(conn, items[1:], self._verify_logon(conn, first))

    def _verify(self, conn: Connection, rest: list, verification: Coroutine[Any, Any, None]) -> None:
        """Hold ``rest`` (and pause reading) while ``verification`` runs off the loop."""
        conn.hold(rest)
        if conn.transport is not None:
            conn.transport.pause_reading()
        task = asyncio.get_running_loop().create_task(verification)
        self.verifying.add(task)
        task.add_done_callback(self.verifying.discard)

    def _resume(self, conn: Connection) -> None:
        if not conn.closed and not self._pacing.paused and conn.transport is not None:
            conn.transport.resume_reading()

    async def _verify_logon(self, conn: Connection, logon: m.Logon) -> None:
        now = self._clock()
        auth = self._auth
        if auth.by_certificate and conn.config.tls is not None and peer_user(conn.transport) is not None:
            verdict = auth.certificate(peer_user(conn.transport), logon.user_id, conn.host, now)
        else:
            verdict = await auth.verify(logon.user_id, logon.password, conn.host, now)
        if conn.closed or self._supervisor.failure is not None:
            return
        if verdict.user is None:
            log.warning("logon refused from %s (client %r, user %r): %s", conn.address, logon.client_name,
                        logon.user_id, verdict.detail)
            self._refuse(conn, logon.cid, errors.NotAuthenticated(verdict.reason))
            return
        if not self._admit(conn, verdict.user, logon.cid):
            return
        self._handle(conn, [logon, *conn.release_held()])
        self._resume(conn)

    def _admit(self, conn: Connection, user: str, cid: str | None) -> bool:
        """``conn`` is ``user``: count it against MaxConnectionsPerUser, tell the engine."""
        limit = self._limits.connections_per_user_max
        if self._user_connections.get(user, 0) >= limit:
            log.warning("logon of user %r from %s refused: %d connections (MaxConnectionsPerUser)", user,
                        conn.address, limit)
            self._refuse(conn, cid, errors.LimitExceeded(
                f"user {user!r} holds {limit} connections, the limit (Limits/MaxConnectionsPerUser)",
                limit="MaxConnectionsPerUser", max=limit))
            return False
        self.forget(conn)
        conn.authenticated_as(user)
        self._counted[conn.conn_id] = "user"
        self._user_connections[user] = self._user_connections.get(user, 0) + 1
        self._engine.authenticate(conn.conn_id, user)
        log.info("connection %s from %s authenticated as %r", conn.conn_id, conn.address, user)
        return True

    def _refuse(self, conn: Connection, cid: str | None, error: errors.ConveyorError) -> None:
        """Answer ``error`` to the command ``cid`` and close the connection."""
        details = {k: v for k, v in error.details.items() if isinstance(v, (str, int, float, bool))} or None
        conn.write_frames(encode_frames([m.Ack(ack_type="processed", cid=cid, status="failure", reason=str(error),
                                               code=error.code, details=details)]))
        conn.close(str(error))

    # --- conveyor serve --no-clients-until-replicated ----------------------------------------

    def refuse_until_replicated(self, conn: Connection, items: list) -> None:
        """A client's commands while this instance still waits for its sync peers to
        catch it up after its start (docs/replication.md, "After a restart: catching
        up"): the first is answered with a retryable ``not_available`` and the
        connection closed. A client that reconnects by itself tries again (or another
        server of its list)."""
        first = next((item for item in items if type(item) is not Rejected), items[0])
        catch_up = self._engine.catch_up
        log.info("connection %s from %s refused: this instance is catching up with %s after its start "
                 "(--no-clients-until-replicated)", conn.conn_id, conn.address, ", ".join(catch_up.peers))
        self._refuse(conn, getattr(first, "cid", None), errors.NotAvailable(
            f"instance {self._engine.instance!r} is catching up with its replication peers "
            f"({', '.join(catch_up.peers)}) after a restart and accepts no client until it has "
            "(--no-clients-until-replicated): retry shortly, or use another instance"))

    # --- replication sources ---------------------------------------------------------------

    def replica_handshake(self, conn: Connection, items: list) -> None:
        """Frames of a replication source not yet authenticated: its handshake first."""
        if conn.held is not None:
            conn.held.extend(items)
            return
        hello = items[0]
        if not isinstance(hello, p_repl.Hello):
            self._refuse_replica(conn, "the link must start with its handshake")
            return
        self._verify(conn, items[1:], self._verify_replica(conn, hello))

    async def _verify_replica(self, conn: Connection, hello: p_repl.Hello) -> None:
        now = self._clock()
        auth = self._auth
        cert_user = peer_user(conn.transport) if conn.config.tls is not None else None
        if auth.by_certificate and cert_user is not None:
            verdict = auth.certificate(cert_user, hello.user, conn.host, now)
        else:
            # counted apart from clients' failed logons (security/authenticator.py, rule 2)
            verdict = await auth.verify(hello.user, hello.password, conn.host, now, link=True)
        if conn.closed or self._supervisor.failure is not None:
            return
        source = hello.profile.instance
        if verdict.user is None:
            log.warning("replication from %s (%s, user %r) refused: %s", source, conn.address, hello.user,
                        verdict.detail)
            self._refuse_replica(conn, verdict.reason)
            return
        if not self._engine.entitlements.for_user(verdict.user).allows(Permission.REPLICATE):
            log.warning("replication from %s (%s) refused: user %r is not entitled to replicate", source,
                        conn.address, verdict.user)
            self._refuse_replica(conn, f"user {verdict.user!r} is not entitled to replicate to this instance")
            return
        conn.authenticated_as(verdict.user)
        log.info("replication from %s (%s) authenticated as %r", source, conn.address, verdict.user)
        self._replica_frames(conn, [hello, *conn.release_held()])
        self._resume(conn)

    def _refuse_replica(self, conn: Connection, reason: str) -> None:
        conn.write_frames(encode_frames([p_repl.Refused(reason=reason, code=errors.NotAuthenticated.code)]))
        conn.close(f"replication refused: {reason}")

    # --- the admin interface (docs/security.md, "The admin interface") ---------------------

    async def admin_user(self, authorization: str | None, transport, *, full: bool) -> str | None:
        """Who an admin request is, if it may read (``full``: act): HTTP Basic credentials
        from ``authorization``, or the transport's verified client certificate. None when
        authentication is off (the admin port is then protected only by where it
        listens). Raises NotAuthenticated (answer 401) or NotEntitled (answer 403)."""
        auth = self._auth
        if not auth.required:
            return None
        peer = transport.get_extra_info("peername") if transport is not None else None
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        cert_user = peer_user(transport) if auth.by_certificate else None
        user, password = basic_credentials(authorization)
        if cert_user is not None and password is None:
            verdict = auth.certificate(cert_user, user, host, self._clock())
        else:
            verdict = await auth.verify(user, password, host, self._clock())
        if verdict.user is None:
            log.warning("admin request refused from %s (user %r): %s", host, user, verdict.detail)
            raise errors.NotAuthenticated(verdict.reason)
        permission = Permission.ADMIN_FULL if full else Permission.ADMIN_READ
        self._engine.entitlements.for_user(verdict.user).check(permission)
        return verdict.user
