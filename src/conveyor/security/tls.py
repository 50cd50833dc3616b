"""TLS through the standard ``ssl`` module: contexts for listeners and outgoing links,
and certificates reloaded without a restart.

Rules:

1. **TLS 1.2 at least**, on both ends; the cipher list applies to TLS 1.2 (TLS 1.3
   suites are fixed by OpenSSL).
2. **A listener's context is reloadable** (:class:`ServerTls`): the listening socket
   keeps one front context whose SNI callback hands each new handshake the newest
   context, so a reload (SIGHUP, or a changed certificate, key or CA file found by the
   server's periodic check) applies to every connection made after it; connections
   already made keep theirs. A reload that fails (a half-written file) keeps the
   previous context and is logged.
3. Client certificates: ``required`` fails the handshake without one signed by
   ``CAFile``; ``optional`` verifies one when given. :func:`peer_user` reads the
   subject's common name of a verified certificate, the user it authenticates.
4. A problem with the files at startup is a ConfigError naming the element.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

from conveyor import errors
from conveyor.config.model import Tls

log = logging.getLogger("conveyor.security")

_VERIFY = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _files(tls: Tls) -> tuple[Path, ...]:
    return tuple(p for p in (tls.certificate, tls.private_key, tls.ca_file) if p is not None)


def _stamp(tls: Tls) -> tuple:
    out = []
    for p in _files(tls):
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def server_context(tls: Tls) -> ssl.SSLContext:
    """A listener's context (rules 1 and 3); ConfigError (rule 4) if the files are bad."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.certificate, tls.private_key)
        if tls.ca_file is not None:
            ctx.load_verify_locations(cafile=tls.ca_file)
        if tls.ciphers:
            ctx.set_ciphers(tls.ciphers)
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigError(f"cannot use the TLS files: {exc}", path=tls.path,
                                 hint="check Certificate, PrivateKey and CAFile (PEM files that belong together)") from None
    ctx.verify_mode = _VERIFY[tls.client_certificates]
    return ctx


def client_context(tls: Tls | None = None, *, ca_file: str | os.PathLike | None = None,
                   cert_file: str | os.PathLike | None = None, key_file: str | os.PathLike | None = None,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A context for dialling a TLS server: the server's certificate is verified against
    ``ca_file`` (the system's CAs when None); ``cert_file``/``key_file``: a client
    certificate for servers that ask for one."""
    if tls is not None:
        ca_file, cert_file, key_file = tls.ca_file, tls.certificate, tls.private_key
    ctx = ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file is not None else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if tls is not None and tls.ciphers:
        ctx.set_ciphers(tls.ciphers)
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


class ServerTls:
    """A listener's reloadable TLS (rule 2): pass :attr:`context` to ``create_server``."""

    def __init__(self, tls: Tls) -> None:
        self.tls = tls
        self._current = server_context(tls)
        self._stamp = _stamp(tls)
        self.reloads = 0
        front = server_context(tls)
        front.sni_callback = self._choose
        self.context = front

    def _choose(self, ssl_object, server_name, front) -> None:
        if self._current is not front:
            ssl_object.context = self._current

    def reload(self, *, force: bool = False) -> bool:
        """Build a new context if a file changed (or ``force``); True if one was built."""
        stamp = _stamp(self.tls)
        if not force and stamp == self._stamp:
            return False
        try:
            ctx = server_context(self.tls)
        except errors.ConfigError as exc:
            log.error("TLS certificates of %s NOT reloaded (the previous ones stay in use): %s", self.tls.path, exc)
            self._stamp = stamp  # logged once per change, not at every check
            return False
        self._current, self._stamp = ctx, stamp
        self.reloads += 1
        log.info("TLS certificates of %s reloaded", self.tls.path)
        return True


def peer_user(transport) -> str | None:
    """The common name of the peer's verified certificate (rule 3), else None."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
