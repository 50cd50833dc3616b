"""Settings the loader reads but this version does not carry out: refused at startup.

The loader keeps parsing them (so the typed configuration, and a later version that
implements them, see what was written), but a server must never run on a configuration
that means less than it says. :func:`refuse_unsupported` raises a ConfigError naming
the first such element's path; ``conveyor serve`` and ``conveyor config check`` call it.

Each entry says what is missing and what to do instead. When a feature lands, its
entry goes.
"""

from __future__ import annotations

from conveyor.config.model import Config
from conveyor.errors import ConfigError


def unsupported(config: Config) -> list[tuple[str, str, str]]:
    """``(path, message, hint)`` for every setting this version would ignore."""
    found = []
    if config.admin is not None and config.admin.file_name is not None:
        found.append((
            "AMPSConfig/Admin/FileName",
            "<FileName> (a statistics database) is not supported",
            "remove it: the admin interface serves live statistics, /metrics for Prometheus, and keeps the "
            "last minutes of history in memory",
        ))
    tlog = config.transaction_log
    if tlog is not None and tlog.archive_directory is not None:
        found.append((
            "AMPSConfig/TransactionLog/JournalArchiveDirectory",
            "<JournalArchiveDirectory> is not supported yet: journal segments are never moved to an archive",
            "remove it; bound the journal with <Retention> (MaxAge, MaxSize) and back up sealed segments "
            "(docs/operations.md, Backups)",
        ))
    return found


def refuse_unsupported(config: Config) -> None:
    """Raise a ConfigError for the first setting this version would ignore."""
    for path, message, hint in unsupported(config):
        raise ConfigError(message, path=path, hint=hint)
