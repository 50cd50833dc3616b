"""The journal directory's lock: one process at a time, and which one.

1. **The lock** is an exclusive ``flock`` on the directory itself, held for as long as a
   journal (or ``repair``) has the directory open. The kernel drops it when the
   process ends, however it ends, so a lock is never stale: the successor of a
   SIGKILLed server takes the directory at once.
2. **Who holds it.** Once it has the lock, the holder writes :data:`HOLDER_FILE` in the
   directory (JSON: pid, host, command line, since when; best effort, not fsynced) and
   removes it when it lets go. The file decides nothing: it is read only by a process
   that could not take the lock, to name the holder in its refusal ("in use by another
   process (pid 1234, `conveyor serve --port 9007`, since 2025-01-02 10:00:00)"). A file
   left by a process that died is overwritten by the next holder; one naming a process
   of this host that no longer runs is not quoted.
3. :func:`check_unlocked` asks without taking anything or creating anything: the server
   calls it before it binds its ports and creates the journal, so a second server on
   the same directory is told who has it, whatever else would fail too.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from conveyor.errors import JournalError

from .files import write_atomic

HOLDER_FILE = "holder.lock"
_COMMAND_CHARS_MAX = 200


def acquire(dir_fd: int, directory: Path) -> None:
    """Lock the directory open as ``dir_fd`` (rule 1) and record this process as its
    holder (rule 2); JournalError, naming the holder, if another process has it."""
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise JournalError(in_use(directory)) from exc
        raise JournalError(f"cannot lock journal directory {directory}: {exc.strerror}") from exc
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command(), "since": time.time()}
    try:
        write_atomic(directory / HOLDER_FILE, json.dumps(holder).encode(), durable=False)
    except OSError:
        pass  # only a refusal's wording depends on it (rule 2)


def release(directory: Path) -> None:
    """Before the lock is let go (the directory's descriptor closed): forget the holder."""
    try:
        os.unlink(directory / HOLDER_FILE)
    except OSError:
        pass


def check_unlocked(directory: str | os.PathLike[str]) -> None:
    """JournalError (naming the holder) if another process holds ``directory``'s lock;
    nothing if it is free or does not exist (rule 3). Takes nothing, creates nothing."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # missing or unreadable: opening the journal says what is wrong
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise JournalError(in_use(Path(directory))) from exc
    finally:
        os.close(fd)  # and with it the lock, if it was taken


def in_use(directory: Path) -> str:
    """The refusal: the directory, and its holder when the holder recorded itself."""
    holder = describe_holder(directory)
    return f"journal directory {directory} is in use by another process" + (f" ({holder})" if holder else "")


def describe_holder(directory: Path) -> str | None:
    """``pid 1234, `conveyor serve ...`, since ...`` from the holder file; None when there
    is none, it cannot be read, or it names a process of this host that is gone."""
    try:
        holder = json.loads((Path(directory) / HOLDER_FILE).read_bytes())
        pid = int(holder["pid"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    host = str(holder.get("host") or "")
    here = not host or host == socket.gethostname()
    if here and not _running(pid):
        return None  # left by a process that died; the holder did not record itself
    parts = [f"pid {pid}" + ("" if here else f" on host {host}")]
    command = holder.get("command")
    if command:
        parts.append(f"`{command}`")
    since = holder.get("since")
    if isinstance(since, (int, float)) and since > 0:
        parts.append("since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)))
    return ", ".join(parts)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OSError:
        return False
    return True


def _command() -> str:
    """This process's command line as its user typed it (``conveyor serve --port 9007``):
    the program's name without its directory; ``python -m conveyor`` is ``conveyor``."""
    argv = list(sys.argv) or [""]
    program = argv[0]
    name = os.path.basename(program)
    if name == "__main__.py":
        name = os.path.basename(os.path.dirname(program)) or name
    text = shlex.join([name or "python", *argv[1:]])
    return text if len(text) <= _COMMAND_CHARS_MAX else text[: _COMMAND_CHARS_MAX - 3] + "..."
