"""The compiled build: which modules mypyc compiles, and whether this process runs them.

conveyor runs compiled when it can and as pure Python otherwise, from the same source.
mypyc compiles ``GROUP`` as one group (calls inside it are native calls) into extension
modules beside their sources, and Python imports an extension module ahead of the
``.py`` of the same name. The build (``setup.py``, ``make build``) also writes
``native.txt``: a digest of each compiled source. At import of ``conveyor``,
:func:`choose` decides, once, for the whole group:

- ``CONVEYOR_PURE=1`` in the environment: pure Python, the extension modules ignored;
- no manifest (never built, or built without a C compiler): pure Python;
- a source whose digest differs from the manifest's (edited or checked out since the
  build): pure Python, with one line on stderr naming it, so that nobody runs code that
  is not the source in front of them;
- otherwise the compiled group.

Pure Python means a finder ahead of Python's own that gives every ``conveyor`` module
its ``.py``. docs/architecture.md, "The compiled build", says what is compiled and why.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

#: The group, as paths below the package: the engine's command path and the modules a
#: message passes through (delivery, named consumers, transactions, the queue and its
#: parts, the payload cache, the publish log, the outbox, topic routing, the JSON check,
#: bookmarks (formatted for every delivery, parsed from every acknowledgement), a
#: command's ack types, the plain publish record (one per message), and the replication
#: sink and message ownership that each replicated queue record meets).
#: Not compiled, and why (docs/architecture.md): msgspec records (mypyc drops a Struct's
#: class options), the frame codec (the replication link's decoder, a Python class,
#: subclasses it), queue/report.py (``__slots__``), engine/ports.py (runtime-checkable
#: protocols), and everything not on a message's path.
GROUP: tuple[str, ...] = (
    "protocol/payload.py", "protocol/bookmarks.py", "protocol/ack_kinds.py", "records/plain.py",
    *(f"engine/{name}.py" for name in (
        "core", "consumers", "delivery", "subscribing", "routes", "fingerprints", "sessions", "txn", "actions",
        "cache", "outbox", "publish_log", "topics", "replication/held_delivery", "replication/ownership",
        "replication/sink",
    )),
    *(f"engine/queue/{name}.py" for name in (
        "budget", "store", "priority", "paging", "state", "recovery", "seats", "window", "keys", "order",
        "consumer", "expiry", "intake", "leases", "named", "transfers", "returns", "replica", "queue", "bindings",
    )),
)

# os.path, not pathlib: this module runs at the start of every process that imports
# conveyor, and pathlib's imports alone cost 9 ms.
PACKAGE = os.path.dirname(os.path.abspath(__file__))
MANIFEST_NAME = "native.txt"
_CHANGED = "changed since it was compiled"  # the reason that is also said on stderr


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def digests(package: str = PACKAGE) -> dict[str, str]:
    """Each source's CRC-32 and length: it tells an edit from the build's source, and
    it is read at every start of a process (json and hashlib would cost 15 ms there)."""
    def digest(data: bytes) -> str:
        return f"{zlib.crc32(data):08x}:{len(data)}"
    return {name: digest(_read(os.path.join(package, name))) for name in GROUP}


def write_manifest(package: str = PACKAGE) -> None:
    with open(os.path.join(package, MANIFEST_NAME), "w") as f:
        f.writelines(f"{digest} {name}\n" for name, digest in sorted(digests(package).items()))


def decide(package: str = PACKAGE, pure: str = "") -> tuple[bool, str]:
    """(compiled, why): the build a process runs, given the package directory and the
    value of CONVEYOR_PURE."""
    if pure not in ("", "0"):
        return False, "pure Python (CONVEYOR_PURE is set)"
    manifest = os.path.join(package, MANIFEST_NAME)
    try:
        built = {name: digest for digest, name in (line.split(" ", 1) for line in _read(manifest).decode().splitlines())}
    except FileNotFoundError:
        return False, "pure Python (not compiled)"
    except (OSError, ValueError) as exc:
        return False, f"pure Python (unreadable {manifest}: {exc})"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    missing = [name for name in GROUP if not os.path.exists(os.path.join(package, name[:-3] + suffix))]
    if missing:
        return False, f"pure Python ({missing[0]}'s extension module is missing)"
    try:
        now = digests(package)
    except OSError as exc:
        return False, f"pure Python (a compiled module's source is unreadable: {exc})"
    changed = sorted(name for name in GROUP if built.get(name) != now[name])
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        return False, f"pure Python ({changed[0]}{more} {_CHANGED}; `make build` compiles again)"
    return True, f"compiled ({len(GROUP)} modules, mypyc)"


class _SourceFinder:
    """Finds ``conveyor``'s modules as ``.py`` files only (their bytecode caches still
    apply), so that the extension modules beside them are not imported."""

    _loaders = [(importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)]

    @classmethod
    def find_spec(cls, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if not name.startswith("conveyor.") or path is None:
            return None
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, *cls._loaders).find_spec(name, target)
            if spec is not None:
                return spec
        return None


#: This process's build, set once by :func:`choose`.
COMPILED, DESCRIPTION = False, "pure Python (not chosen yet)"


def choose() -> None:
    """Decides this process's build and, for pure Python, puts the finder first.
    ``conveyor/__init__.py`` calls it before any module of the group is imported; the
    build (setup.py) loads this module for ``GROUP`` and never calls it."""
    global COMPILED, DESCRIPTION
    COMPILED, DESCRIPTION = decide(pure=os.environ.get("CONVEYOR_PURE", ""))
    if _CHANGED in DESCRIPTION:
        print(f"conveyor: running {DESCRIPTION}", file=sys.stderr)
    if not COMPILED and _SourceFinder not in sys.meta_path:
        sys.meta_path.insert(0, _SourceFinder)


def describe() -> str:
    """One line for the start-up log and ``conveyor --version``."""
    return DESCRIPTION
