"""Who is this? The server's authenticator: users file, password checks, rate limits.

Rules:

1. **Password checks run off the event loop**, on a thread of their own (argon2 is CPU
   work that releases the GIL; the journal's I/O thread is never used for it), one at a
   time: a burst of logons queues there instead of taking every core.
2. **Refused before any work** when the address has failed too often recently
   (``Limits/MaxFailedLogonsPerAddress`` within ``FailedLogonWindow``): no hash is
   computed for it. Only failures count.
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
import logging
import os
from dataclasses import dataclass

from conveyor import errors
from conveyor.config.model import Config
from conveyor.security.ratelimit import FailedLogons
from conveyor.security.users import UsersFile, decoy_for, verify_password

log = logging.getLogger("conveyor.security")

BAD_CREDENTIALS = "logon refused: bad user name or password"


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
        self.failed = FailedLogons(limits.failed_logons_per_address_max, limits.failed_logon_window_s)
        self._users: dict[str, str] = {}
        self._decoy: str | None = None
        self._stamp: tuple | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.refused = 0  # failed logons since start
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

    async def verify(self, user: str | None, password: str | None, address: str, now: float) -> Verdict:
        wait = self.failed.blocked_for(address, now)
        if wait > 0:
            self.refused += 1
            return Verdict(None, f"logon refused: too many failed logons from this address; try again in "
                                 f"{wait:.0f} s", f"{address} is over MaxFailedLogonsPerAddress")
        if self.users_file is None or not user or password is None:
            why = "no user name or password" if self.users_file is not None else "passwords are not accepted here"
            return self._refuse(address, now, why)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="logon")
        users = self._users
        stored = users.get(user)

        def check() -> bool:  # on the logon thread (rule 1)
            if stored is None and self._decoy is None:
                self._decoy = decoy_for(users)
            return verify_password(stored, password, decoy=self._decoy)

        ok = await asyncio.get_running_loop().run_in_executor(self._executor, check)
        if not ok:
            return self._refuse(address, now, "unknown user" if stored is None else "wrong password")
        return Verdict(user)

    def certificate(self, cert_user: str | None, claimed: str | None, address: str, now: float) -> Verdict:
        """A connection whose verified client certificate names ``cert_user``."""
        if not self.by_certificate or cert_user is None:
            return self._refuse(address, now, "no certificate user")
        if claimed and claimed != cert_user:
            return self._refuse(address, now, f"logon as {claimed!r} with the certificate of {cert_user!r}")
        return Verdict(cert_user)

    def _refuse(self, address: str, now: float, detail: str) -> Verdict:
        self.failed.failed(address, now)
        self.refused += 1
        return Verdict(None, BAD_CREDENTIALS, detail)

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
