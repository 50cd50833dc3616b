"""Who is this? The server's authenticator: users file, password checks, rate limits.

Rules:

1. **Password checks run off the event loop**, on a thread of their own (argon2 is CPU
   work that releases the GIL; the journal's I/O thread is never used for it), one at a
   time: a burst of logons queues there instead of taking every core. Checks for an
   address or user name over the failed-logon limit (rule 2) wait until no other check
   is waiting, so a guesser's work never delays anyone else's logon.
2. **The failed-logon limit** (security/ratelimit.py, docs/security.md) counts wrong
   credentials only (a known user's wrong password, an unknown user), per client host
   and per user name, within ``FailedLogonWindow``. Over ``MaxFailedLogonsPerAddress``
   or ``MaxFailedLogonsPerUser`` a wrong answer is given late (a backoff); a correct
   credential is admitted whatever the counts. Missing credentials (a logon without a
   password, an admin request without ``Authorization``) are refused at once, without
   a check, and count nowhere. Replication links (``link=True``) are counted in a
   limit of their own, which client failures never touch; a link with a client
   certificate is never counted at all.
3. **One answer for every failure** to the client ("bad user name or password"): the
   log line (with the address) says which it was; the password is never logged.
4. **Reloadable**: the users file is read again when it changes (checked by the server's
   timer) or on :meth:`reload`; a file that cannot be read keeps the previous users and
   is logged. Passwords changed take effect at the next logon; the server closes the
   connections of users removed from the file.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import functools
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from conveyor import errors
from conveyor.config.model import Config
from conveyor.security.ratelimit import LogonLimit
from conveyor.security.users import UsersFile, decoy_for, verify_password

log = logging.getLogger("conveyor.security")

BAD_CREDENTIALS = "logon refused: bad user name or password"
#: The answer to a wrong credential over the failed-logon limit (rule 2), given late.
TOO_MANY = BAD_CREDENTIALS + "; too many failed logons for this user or from this address: answered after {:g} s"


@dataclass(frozen=True)
class Verdict:
    user: str | None  # the authenticated user, None if refused
    reason: str = ""  # for the client (rule 3)
    detail: str = ""  # for the log


class Authenticator:
    def __init__(self, config: Config) -> None:
        auth = config.authentication
        self.required = auth is not None
        self.by_certificate = bool(auth and auth.client_certificates)
        self.users_file = UsersFile(auth.users_file) if auth is not None and auth.users_file is not None else None
        limits = config.limits
        per = (limits.failed_logons_per_address_max, limits.failed_logons_per_user_max, limits.failed_logon_window_s)
        self.failed = LogonLimit(*per)  # clients and the admin interface (rule 2)
        self.link_failed = LogonLimit(*per)  # the incoming replication transport (rule 2)
        self._users: dict[str, str] = {}
        self._decoy: str | None = None
        self._stamp: tuple | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Checks waiting for the logon thread (rule 1): ahead, and behind (over the limit).
        self._ahead: deque[tuple[Callable[[], bool], asyncio.Future[bool]]] = deque()
        self._behind: deque[tuple[Callable[[], bool], asyncio.Future[bool]]] = deque()
        self._checking = False
        self.refused = 0  # failed logons since start
        self.delayed = 0  # wrong answers given late (over the failed-logon limit)
        self.backoff_sleep = asyncio.sleep  # how a late answer waits (tests record it instead)
        if self.users_file is not None:
            self._load(strict=True)

    # --- the users file (rule 4) --------------------------------------------------------

    def _file_stamp(self) -> tuple | None:
        try:
            st = os.stat(self.users_file.path)  # type: ignore[union-attr]
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _load(self, *, strict: bool) -> bool:
        stamp = self._file_stamp()
        try:
            users = self.users_file.read()  # type: ignore[union-attr]
        except errors.ClientError as exc:
            if strict:
                raise errors.ConfigError(str(exc), path="AMPSConfig/Authentication/UsersFile",
                                         hint="fix it with `conveyor users`") from None
            log.error("users file NOT reloaded (the previous users stay): %s", exc)
            self._stamp = stamp
            return False
        self._users, self._stamp = users, stamp
        self._decoy = None  # made again, on the logon thread, for the next unknown user
        return True

    def reload(self, *, force: bool = False) -> bool:
        """Read the users file again if it changed (or ``force``); True if read."""
        if self.users_file is None:
            return False
        if not force and self._file_stamp() == self._stamp:
            return False
        if self._load(strict=False):
            log.info("users file %s reloaded: %d user(s)", self.users_file.path, len(self._users))
            return True
        return False

    def knows(self, user: str) -> bool:
        """Whether ``user`` may still be logged on (in the users file, when there is one)."""
        return self.users_file is None or user in self._users

    # --- logon (rules 1 to 3) ------------------------------------------------------------

    async def verify(self, user: str | None, password: str | None, address: str, now: float, *,
                     link: bool = False) -> Verdict:
        """Check a user name and password from ``address`` (rule 2: ``link`` for the
        incoming replication transport). ``now``: the server's clock."""
        if self.users_file is None or not user or password is None:
            # Missing credentials: nothing to check, nothing guessed (rule 2).
            why = "no user name or password" if self.users_file is not None else "passwords are not accepted here"
            return self._refuse(why)
        limit = self.link_failed if link else self.failed
        over = limit.limited(address, user, now)
        users = self._users
        stored = users.get(user)

        def check() -> bool:  # on the logon thread (rule 1)
            if stored is None and self._decoy is None:
                self._decoy = decoy_for(users)
            return verify_password(stored, password, decoy=self._decoy)

        if await self._check(check, behind=bool(over)):
            return Verdict(user)
        delay = limit.delay_s(address, user, now)
        limit.failed(address, user, now)
        detail = "unknown user" if stored is None else "wrong password"
        if not delay:
            return self._refuse(detail)
        self.delayed += 1
        await self.backoff_sleep(delay)  # the backoff (rule 2): a guesser waits for each answer
        return self._refuse(f"{detail}; {over or limit.limited(address, user, now)}: answered after {delay:g} s",
                            TOO_MANY.format(delay))

    async def _check(self, check: Callable[[], bool], *, behind: bool) -> bool:
        """Run ``check`` on the logon thread, after every check waiting ahead of it (rule 1)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        (self._behind if behind else self._ahead).append((check, future))
        self._next_check()
        return await future

    def _next_check(self) -> None:
        if self._checking:
            return
        while self._ahead or self._behind:
            check, future = (self._ahead or self._behind).popleft()
            if future.done():  # its logon was given up (connection closed, server stopping)
                continue
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="logon")
            try:
                running = asyncio.get_running_loop().run_in_executor(self._executor, check)
            except RuntimeError as exc:  # the executor was shut down (close(): the server stops)
                future.set_exception(exc)
                continue
            self._checking = True
            running.add_done_callback(functools.partial(self._checked, future=future))
            return

    def _checked(self, done: asyncio.Future[bool], future: asyncio.Future[bool]) -> None:
        self._checking = False
        if not future.done():
            if done.cancelled():
                future.cancel()
            elif (exc := done.exception()) is not None:
                future.set_exception(exc)
            else:
                future.set_result(done.result())
        self._next_check()

    def certificate(self, cert_user: str | None, claimed: str | None, address: str, now: float) -> Verdict:
        """A connection whose verified client certificate names ``cert_user``. Refusals
        here guess nothing (the certificate was verified) and are not counted (rule 2)."""
        if not self.by_certificate or cert_user is None:
            return self._refuse("no certificate user")
        if claimed and claimed != cert_user:
            return self._refuse(f"logon as {claimed!r} with the certificate of {cert_user!r}")
        return Verdict(cert_user)

    def _refuse(self, detail: str, reason: str = BAD_CREDENTIALS) -> Verdict:
        self.refused += 1
        return Verdict(None, reason, detail)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def basic_credentials(authorization: str | None) -> tuple[str | None, str | None]:
    """(user, password) of an HTTP ``Authorization: Basic ...`` header (the admin
    interface), (None, None) when there is none or it is malformed."""
    if not authorization:
        return None, None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None, None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else (None, None)
