"""Reading the connector's options.

Spark hands a data source its options as a ``CaseInsensitiveDict`` whose keys are
**lower-cased**: always look keys up in lower case, and never rely on
``dict(options)`` keeping case-insensitivity. Values are strings. Errors name the option
and say what is allowed, because they surface in a Spark stack trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


class OptionError(ValueError):
    """An option is missing or has a bad value."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    if value is None:
        value = options.get(name)
    return None if value is None else str(value)


def required(options: Mapping[str, str], name: str, hint: str = "") -> str:
    value = _get(options, name)
    if value is None or not value.strip():
        raise OptionError(f"option {name!r} is required" + (f" ({hint})" if hint else ""))
    return value.strip()


def text(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = _get(options, name)
    return default if value is None or not value.strip() else value.strip()


def choice(options: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = (text(options, name, default) or default).lower()
    if value not in allowed:
        raise OptionError(f"option {name!r} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(options, name)
    if value is None or not value.strip():
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name!r} must be true or false, not {value!r}")


def integer(options: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    value = _get(options, name)
    if value is None or not value.strip():
        return default
    try:
        number = int(value)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {value!r}") from None
    if number < minimum:
        raise OptionError(f"option {name!r} must be at least {minimum}, not {number}")
    return number


def seconds(options: Mapping[str, str], name: str, default: float) -> float:
    value = _get(options, name)
    if value is None or not value.strip():
        return default
    try:
        number = float(value)
    except ValueError:
        raise OptionError(f"option {name!r} must be a number of seconds, not {value!r}") from None
    if number <= 0:
        raise OptionError(f"option {name!r} must be positive, not {number}")
    return number


@dataclass(frozen=True)
class ConnectOptions:
    """How the connector reaches the server: credentials and TLS files (docs/security.md).

    ``user`` and ``password`` (Spark redacts an option named ``password`` in its plans and
    UI; a password written in the ``server`` URI is not redacted, so prefer this option or
    the ``CONVEYOR_USER``/``CONVEYOR_PASSWORD`` environment of the executors), ``caFile``
    for ``tcps://`` servers, ``certFile``/``keyFile`` for a client certificate. The
    password is never in a ``repr``."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "ConnectOptions":
        return cls(user=text(options, "user"), password=_get(options, "password"), ca_file=text(options, "caFile"),
                   cert_file=text(options, "certFile"), key_file=text(options, "keyFile"))

    def client(self, server: str, **kw):
        from conveyor.client.rpc import RpcClient

        return RpcClient(server, user_id=self.user, password=self.password, ca_file=self.ca_file,
                         cert_file=self.cert_file, key_file=self.key_file, **kw)
