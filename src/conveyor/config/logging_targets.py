"""``<Logging>``: where the server's log lines go, at which level, and how files rotate.

Rules:

- ``<Logging>`` holds one or more ``<Target>``. Each target has a ``Protocol``:
  ``file`` (plain text), ``gzip`` (plain text while written; every rotated file is
  compressed), ``stdout`` or ``stderr``. ``syslog`` is refused: run the server under a
  service manager and let it collect stdout.
- ``Level`` is the least severe line the target keeps, in the reference's vocabulary:
  ``trace``, ``developer`` and ``debug`` keep everything conveyor logs (it has no finer
  level than debug), ``stats`` and ``info`` keep info and above, then ``warning``,
  ``error``, ``critical`` and ``emergency`` (both critical), ``none`` keeps nothing.
  The default is ``info``.
- A file target needs ``FileName``. Its directory is created at startup. It is rotated
  when it would grow past ``RotationThreshold`` (a size, default 100M): the file
  becomes ``FILE.1`` (``FILE.1.gz`` for gzip), the older ones shift up, and only the
  newest ``RotationCount`` rotated files are kept (conveyor's own element, default 10),
  so logs never fill the disk. ``%`` date or counter tokens in ``FileName`` are refused
  (conveyor names rotated files itself), as are ``IncludeErrors``/``ExcludeErrors``
  (conveyor's log lines carry no error numbers) and ``Levels``.
- Without ``<Logging>`` the server logs to stderr at info (debug with ``-v``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from conveyor.config.model import LogTarget
from conveyor.config.tree import OPTIONAL, REQUIRED_MANY, Document, Node

#: The reference's levels mapped to Python's (conveyor has nothing finer than debug).
LEVELS: dict[str, int] = {
    "trace": logging.DEBUG,
    "developer": logging.DEBUG,
    "debug": logging.DEBUG,
    "stats": logging.INFO,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "emergency": logging.CRITICAL,
    "none": logging.CRITICAL + 10,  # above every level: the target keeps nothing
}
PROTOCOLS = ("file", "gzip", "stdout", "stderr")
_FILE_PROTOCOLS = ("file", "gzip")

_TARGET = {
    "Protocol": OPTIONAL,  # checked by hand below: a missing one gets a precise message
    "Level": OPTIONAL,
    "FileName": OPTIONAL,
    "RotationThreshold": OPTIONAL,
    "RotationCount": OPTIONAL,
}
_REFUSED = {
    "IncludeErrors": "conveyor's log lines carry no error numbers to select by; use <Level>",
    "ExcludeErrors": "conveyor's log lines carry no error numbers to select by; use <Level>",
    "Levels": "give one <Level> (the least severe line the target keeps)",
    "Ident": "syslog targets are not supported; use Protocol stdout under a service manager",
    "Facility": "syslog targets are not supported; use Protocol stdout under a service manager",
    "Options": "syslog targets are not supported; use Protocol stdout under a service manager",
}


def read_logging(doc: Document, node: Node) -> tuple[LogTarget, ...]:
    kids = doc.children(node, {"Target": REQUIRED_MANY})
    return tuple(_read_target(doc, t) for t in kids.many("Target"))


def _read_target(doc: Document, node: Node) -> LogTarget:
    kids = doc.children(node, _TARGET, refused=_REFUSED)
    p = kids.one("Protocol")
    if p is None:
        raise doc.error(node.path, "<Target> is missing <Protocol>", "add <Protocol>file</Protocol> (or gzip, "
                        "stdout, stderr)")
    if doc.text(p).lower() == "syslog":
        raise doc.error(p.path, "syslog targets are not supported",
                        "use <Protocol>stdout</Protocol> and let the service manager (systemd-journald, "
                        "Docker) collect the lines, or a file target")
    protocol = doc.choice(p, {name: name for name in PROTOCOLS})
    values: dict[str, object] = {"protocol": protocol, "path": node.path}
    if (n := kids.one("Level")) is not None:
        values["level"] = doc.choice(n, LEVELS)
    file_only = [kids.one(tag) for tag in ("FileName", "RotationThreshold", "RotationCount")]
    if protocol not in _FILE_PROTOCOLS:
        for n in file_only:
            if n is not None:
                raise doc.error(n.path, f"<{n.tag}> applies to file and gzip targets, not {protocol}",
                                f"remove <{n.tag}>, or use <Protocol>file</Protocol>")
        return LogTarget(**values)  # type: ignore[arg-type]
    name_node, threshold, count = file_only
    if name_node is None:
        raise doc.error(node.path, f"a {protocol} <Target> needs <FileName>",
                        "add <FileName>/var/log/conveyor/conveyor.log</FileName>")
    name = doc.text(name_node)
    if "%" in name:
        raise doc.error(name_node.path, f"<FileName> {name!r} holds % tokens, which conveyor does not expand",
                        "give a plain file name: rotated files are named FILE.1, FILE.2, ... by conveyor")
    values["file_name"] = Path(name)
    if threshold is not None:
        values["rotation_bytes"] = doc.size(threshold)
    if count is not None:
        values["rotation_count"] = doc.positive_int(count)
    return LogTarget(**values)  # type: ignore[arg-type]
