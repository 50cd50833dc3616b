"""Install the configuration's ``<Logging>`` targets as Python logging handlers.

Rules:

- Called once by ``conveyor serve`` before the server starts; a library user who embeds
  :class:`~conveyor.server.server.Server` keeps their own logging (nothing here runs).
- The targets replace the root logger's handlers; the root level is the lowest target
  level, so a debug target sees debug lines while an info target filters them out.
  ``-v`` (``verbose``) adds a stderr handler at debug on top of the targets.
- File targets rotate by size with :class:`logging.handlers.RotatingFileHandler`:
  ``FILE`` -> ``FILE.1`` -> ... -> ``FILE.<RotationCount>``, the oldest dropped. A gzip
  target compresses each file as it is rotated out (``FILE.1.gz``); the file being
  written stays plain text so ``tail -f`` works.
- A file that cannot be opened (directory not creatable, permission) is a ConfigError
  naming the target's element path: the server does not start half-logging.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys

from conveyor.config.model import LogTarget
from conveyor.errors import ConfigError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def install(targets: tuple[LogTarget, ...], *, verbose: bool = False) -> None:
    """Route the root logger to ``targets`` (no-op when there are none)."""
    if not targets:
        return
    handlers = [_handler(t) for t in targets]  # every file opened before anything changes
    if verbose:
        debug = logging.StreamHandler(sys.stderr)
        debug.setLevel(logging.DEBUG)
        handlers.append(debug)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    formatter = logging.Formatter(LOG_FORMAT)
    for h in handlers:
        h.setFormatter(formatter)
        root.addHandler(h)
    root.setLevel(min(h.level for h in handlers))


def _handler(target: LogTarget) -> logging.Handler:
    if target.protocol in ("stdout", "stderr"):
        handler: logging.Handler = logging.StreamHandler(sys.stdout if target.protocol == "stdout" else sys.stderr)
    else:
        assert target.file_name is not None  # the loader requires FileName for file targets
        import logging.handlers  # here: a start without a file target does without it (issue 38)

        try:
            target.file_name.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                target.file_name, maxBytes=target.rotation_bytes, backupCount=target.rotation_count,
                encoding="utf-8",
            )
        except OSError as e:
            raise ConfigError(
                f"cannot open log file {os.fspath(target.file_name)!r}: {e.strerror}",
                path=f"{target.path}/FileName",
                hint="check that the directory exists or can be created, and its permissions",
            ) from None
        if target.protocol == "gzip":
            handler.namer = _gz_name
            handler.rotator = _gzip_rotate
    handler.setLevel(target.level)
    return handler


def _gz_name(name: str) -> str:
    return name + ".gz"


def _gzip_rotate(source: str, dest: str) -> None:
    """Compress the file being rotated out into ``dest`` (already named ``.gz``)."""
    import gzip

    with open(source, "rb") as src, gzip.open(dest, "wb") as out:
        shutil.copyfileobj(src, out)
    os.remove(source)
