"""Server URIs: where to connect, whether over TLS, and with which credentials.

``tcp://host:port`` (``conveyor://`` and ``amps://`` are synonyms) or
``tcps://host:port`` (TLS), optionally with credentials (``tcps://user:password@host:port``)
and TLS files in the query (``?ca_file=ca.pem&cert_file=me.pem&key_file=me.key``). Rules:

1. **Credentials** come from the client's arguments first, then the URI, then the
   environment (:data:`USER_ENV`, :data:`PASSWORD_ENV`).
2. **A password is never shown**: :attr:`Endpoint.display` (used in every log line,
   exception message and statistic) drops it, and :class:`Endpoint`'s ``repr`` too.
3. ``tcps`` verifies the server's certificate against the CA file (the system's CAs
   when none is given) and its host name, over TLS 1.2 at least.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlparse

from conveyor import errors

PLAIN_SCHEMES = ("tcp", "conveyor", "amps")
TLS_SCHEMES = ("tcps",)
URI_SCHEMES = PLAIN_SCHEMES + TLS_SCHEMES
USER_ENV = "CONVEYOR_USER"
PASSWORD_ENV = "CONVEYOR_PASSWORD"
_QUERY_KEYS = ("ca_file", "cert_file", "key_file")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool = False
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    display: str = ""  # the URI without its password (rule 2)

    def credentials(self, user: str | None, password: str | None,
                    env: dict[str, str] | os._Environ | None = None) -> tuple[str | None, str | None]:
        """Rule 1: (user, password) from the arguments, else this URI, else the environment."""
        env = os.environ if env is None else env
        if user is not None or password is not None:
            return user, password
        if self.user is not None:
            return self.user, self.password
        return env.get(USER_ENV), env.get(PASSWORD_ENV)


def parse_endpoint(uri: str) -> Endpoint:
    """ClientError if malformed; the message never holds the password."""
    parsed = urlparse(uri if "://" in uri else f"tcp://{uri}")
    shown = _without_password(parsed) if "@" in parsed.netloc else uri
    if parsed.scheme not in URI_SCHEMES:
        raise errors.ClientError(f"unsupported URI scheme {parsed.scheme!r} (use tcp://host:port or tcps://host:port)")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if not parsed.hostname or not port:
        raise errors.ClientError(f"URI {shown!r} needs a host and a port, e.g. tcp://127.0.0.1:9007")
    query = parse_qs(parsed.query, strict_parsing=False) if parsed.query else {}
    unknown = sorted(set(query) - set(_QUERY_KEYS))
    if unknown:
        raise errors.ClientError(f"URI {shown!r}: unknown parameter {unknown[0]!r} (known: {', '.join(_QUERY_KEYS)})")
    tls = parsed.scheme in TLS_SCHEMES
    if query and not tls:
        raise errors.ClientError(f"URI {shown!r}: TLS files need a tcps:// URI")
    return Endpoint(
        host=parsed.hostname,
        port=port,
        tls=tls,
        user=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password is not None else None,
        **{k: query[k][-1] for k in _QUERY_KEYS if k in query},
        display=shown,
    )


def _without_password(parsed) -> str:
    netloc = parsed.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}@{hostport}" if user else hostport
    return parsed._replace(netloc=netloc).geturl()


def redact(uri: str) -> str:
    """``uri`` without its password (rule 2), for messages about URIs not yet parsed."""
    try:
        return _without_password(urlparse(uri if "://" in uri else f"tcp://{uri}"))
    except ValueError:
        return "<unreadable URI>"
