"""The users file: user names and argon2 password hashes, one user per line.

Format (``conveyor users add|remove|list`` writes it)::

    # comment
    alice:$argon2id$v=19$m=65536,t=3,p=4$<salt>$<hash>

Rules:

1. **Only slow hashes are stored** (argon2id through argon2-cffi): a stolen file does not
   give the passwords away. The parameters are in each hash, so verifying follows the
   parameters a hash was made with (tests make cheap ones; ``conveyor users add`` uses
   argon2-cffi's defaults, RFC 9106's low-memory profile).
2. **Verification takes the same time for an unknown user** as for a wrong password (a
   hash of the same cost is verified against nothing), so a logon does not tell which
   user names exist.
3. **Written atomically**, mode 0600: a temporary file in the same directory, fsynced,
   renamed over the old one, so a running server never reads half a file.
4. A malformed line is refused with its line number; a user name is
   :data:`~conveyor.config.security.NAME_PATTERN`. Passwords are never logged, never
   part of an exception message and never echoed.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor import errors
from conveyor.config.security import NAME_HINT, NAME_PATTERN
from conveyor.journal.files import write_atomic

if TYPE_CHECKING:
    import argon2

PASSWORD_CHARS_MAX = 1024  # longer passwords are refused before hashing (bounded CPU per logon)
_HEADER = "# conveyor users file: NAME:ARGON2-HASH per line; manage it with `conveyor users`\n"


@functools.cache
def _hasher() -> argon2.PasswordHasher:
    """argon2-cffi's defaults: m=64 MiB, t=3, p=4. Made (and argon2 imported) when first
    used: a server without Authentication never hashes, and starts without it (issue 38)."""
    import argon2

    return argon2.PasswordHasher()


def hash_password(password: str, *, hasher: argon2.PasswordHasher | None = None) -> str:
    if not password:
        raise errors.ClientError("a password cannot be empty")
    if len(password) > PASSWORD_CHARS_MAX:
        raise errors.ClientError(f"a password is at most {PASSWORD_CHARS_MAX} characters")
    return (hasher or _hasher()).hash(password)


def verify_password(stored: str | None, password: str | None, *, decoy: str | None = None) -> bool:
    """Whether ``password`` matches the ``stored`` hash. ``stored`` None (an unknown user)
    is checked against ``decoy`` (:func:`decoy_for`) and answers False (rule 2).
    CPU-bound: call it off the event loop."""
    if password is None or len(password) > PASSWORD_CHARS_MAX:
        password = ""
    target = stored if stored is not None else decoy
    if target is None:
        return False
    import argon2

    try:
        return _hasher().verify(target, password) and stored is not None
    except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
        return False


def decoy_for(users: dict[str, str]) -> str | None:
    """A hash with the parameters of the file's hashes, for unknown users (rule 2)."""
    import argon2

    for stored in users.values():
        try:
            params = argon2.extract_parameters(stored)
        except argon2.exceptions.InvalidHashError:
            continue
        return argon2.PasswordHasher.from_parameters(params).hash("conveyor: an unknown user's decoy")
    return None


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise errors.ClientError(f"{name!r} is not a valid user name: {NAME_HINT}")
    return name


class UsersFile:
    """One users file: read it, change it, write it back (rule 3)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self) -> dict[str, str]:
        """user -> hash. ClientError (with the line) if the file is malformed."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise errors.ClientError(f"cannot read the users file {str(self.path)!r}: {exc.strerror}") from None
        users: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, hashed = line.partition(":")
            if not sep or not NAME_PATTERN.fullmatch(name) or not hashed.startswith("$argon2"):
                raise errors.ClientError(
                    f"{self.path}, line {number}: not NAME:ARGON2-HASH (edit it with `conveyor users`)")
            if name in users:
                raise errors.ClientError(f"{self.path}, line {number}: user {name!r} appears twice")
            users[name] = hashed
        return users

    def add(self, name: str, password: str, *, replace: bool = False,
            hasher: argon2.PasswordHasher | None = None) -> bool:
        """Add ``name`` (or, with ``replace``, set its password); True if it was new."""
        users = self.read()
        check_name(name)
        if name in users and not replace:
            raise errors.ClientError(f"user {name!r} already exists (use --replace to set a new password)")
        new = name not in users
        users[name] = hash_password(password, hasher=hasher)
        self.write(users)
        return new

    def remove(self, name: str) -> None:
        users = self.read()
        if name not in users:
            raise errors.ClientError(f"there is no user {name!r} in {self.path}")
        del users[name]
        self.write(users)

    def write(self, users: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = _HEADER + "".join(f"{name}:{users[name]}\n" for name in sorted(users))
        write_atomic(self.path, text.encode("utf-8"), durable=True, mode=0o600)
