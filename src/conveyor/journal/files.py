"""Small files written whole: checkpoints, sidecars, summaries.

One routine, :func:`write_atomic`, writes every such file, so the durability each
caller chose is visible at the call site instead of hidden in five hand-written copies:

- ``durable=True``: temporary file, write, fsync, rename, fsync of the directory. After
  it returns, a crash (even a power cut) leaves the new content under ``path``. For
  files that recovery relies on to skip work it would otherwise do (``queues.ack``,
  ``publishers.seq``, ``consumers.state``, queue snapshots).
- ``durable=False``: temporary file, write, rename; no fsync. After a crash the file
  may be the old one, missing, empty or torn, so its reader must check it and fall
  back to the full work (verified sidecars, segment summaries). Costs no disk flush.

Either way a reader never sees a half-written file under ``path`` while the process
runs (the rename is atomic), and a failed write leaves no temporary file behind. A
crash in the middle of a write can leave one (``<name>.<pid>.<thread>.tmp``), which
nothing reads: :func:`remove_temporaries` clears them when the server starts, so a
crash loop does not fill the disk with them.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

_TEMPORARY = re.compile(r"\.\d+\.\d+\.tmp$")  # the name write_atomic gives its temporary file


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the names in ``directory`` durable (a created, renamed or removed file)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, durable: bool, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically; fsync file and directory if ``durable``.
    ``mode``: the new file's permissions (0o600 for a secret, e.g. the users file).

    Raises OSError on failure, after removing the temporary file. The temporary name is
    unique per process and thread, so two writers of the same file never share one.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_directory(path.parent)


def remove_temporaries(directory: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary files of writes that a crash cut short from ``directory``
    (not its subdirectories); return their names. Call it before any writer starts:
    a temporary is never read, its target file is either the old or the new content."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if _TEMPORARY.search(entry.name) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed.append(entry.name)
    return sorted(removed)
