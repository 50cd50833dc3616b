"""What the socket shells share: how a failure to listen is told to the user."""

from __future__ import annotations

import errno
import socket


def bind_problem(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the address is already in use"
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc.strerror})"
    return exc.strerror or str(exc)
