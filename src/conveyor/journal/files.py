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
runs (the rename is atomic), and a failed write leaves no temporary file behind.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


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
