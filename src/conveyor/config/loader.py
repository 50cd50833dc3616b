"""Load an ``AMPSConfig`` XML document into a validated, frozen :class:`Config`.

Rules:

- The root element is ``AMPSConfig``. Its sections are read by one module each
  (transports, txlog, queues, actions, replication), then :mod:`.rules` checks what
  ties them together. The first problem found is raised as a :class:`ConfigError`
  with the element path, the source and line, and a hint; no half-valid Config is
  ever returned.
- ``${VAR}`` is expanded from the environment at load time (``env`` replaces
  ``os.environ``, for tests). The file is read once; edits need a restart.
- AMPS elements conveyor does not implement are refused by name rather than ignored,
  so that a configuration never silently means less than it says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from conveyor.config.actions import read_actions
from conveyor.config.logging_targets import read_logging
from conveyor.config.model import Config
from conveyor.config.queues import read_sow
from conveyor.config.replication import read_replication
from conveyor.config.rules import check
from conveyor.config.security import read_authentication, read_entitlement, read_limits
from conveyor.config.transports import check_listeners, read_admin, read_transports
from conveyor.config.tree import OPTIONAL, Document, parse
from conveyor.config.txlog import read_transaction_log
from conveyor.errors import ConfigError

ROOT = "AMPSConfig"
DEFAULT_SOURCE = "<embedded default>"

_ROOT = {
    "Name": OPTIONAL,
    "Group": OPTIONAL,
    "Transports": OPTIONAL,
    "Admin": OPTIONAL,
    "TransactionLog": OPTIONAL,
    "SOW": OPTIONAL,
    "Actions": OPTIONAL,
    "Replication": OPTIONAL,
    "Authentication": OPTIONAL,
    "Entitlement": OPTIONAL,
    "Limits": OPTIONAL,
    "Logging": OPTIONAL,
}
_UNSUPPORTED_AMPS = (
    "MessageTypes",
    "Modules",
    "Protocols",
    "Tuning",
    "ConfigIncludeDirectories",
    "MiniDumpDirectory",
    "ProcessName",
)
_REFUSED = {
    tag: f"<{tag}> is an AMPS setting that conveyor does not implement; remove it"
    for tag in _UNSUPPORTED_AMPS
}


def load_file(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Load the configuration file at ``path``."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(
            f"cannot read configuration file {os.fspath(path)!r}: {e.strerror}",
            hint="check the path and its permissions",
        ) from None
    return _load(data, os.fspath(path), env)


def load_text(xml: str, source: str = "<text>", *, env: Mapping[str, str] | None = None) -> Config:
    """Load a configuration from a string; ``source`` names it in error messages."""
    return _load(xml, source, env)


def default_config() -> Config:
    """The embedded default configuration (``conveyor/config/default.xml``)."""
    data = resources.files("conveyor.config").joinpath("default.xml").read_bytes()
    return _load(data, DEFAULT_SOURCE, None)


def _load(data: str | bytes, source: str, env: Mapping[str, str] | None) -> Config:
    doc = parse(data, source, os.environ if env is None else env)
    return _read_root(doc)


def _read_root(doc: Document) -> Config:
    root = doc.root
    if root.tag != ROOT:
        raise doc.error(
            root.path,
            f"the root element is <{root.tag}>, expected <{ROOT}>",
            f"wrap the configuration in <{ROOT}>...</{ROOT}>",
        )
    kids = doc.children(root, _ROOT, refused=_REFUSED)
    values: dict[str, object] = {"source": doc.source}
    if (n := kids.one("Name")) is not None:
        values["name"] = doc.text(n)
    if (n := kids.one("Group")) is not None:
        values["group"] = doc.text(n)
    transports = ()
    if (n := kids.one("Transports")) is not None:
        transports = values["transports"] = read_transports(doc, n)
    admin = None
    if (n := kids.one("Admin")) is not None:
        admin = values["admin"] = read_admin(doc, n)
    if (n := kids.one("Logging")) is not None:
        values["logging"] = read_logging(doc, n)
    txlog = None
    if (n := kids.one("TransactionLog")) is not None:
        txlog = values["transaction_log"] = read_transaction_log(doc, n)
    queues = ()
    sow = None
    if (n := kids.one("SOW")) is not None:
        sow = read_sow(doc, n)
        queues = values["queues"] = sow.queues
        values["sow_topics"] = sow.topics
        values["views"] = sow.views
        values["conflated_topics"] = sow.conflated_topics
    actions = ()
    if (n := kids.one("Actions")) is not None:
        actions = values["actions"] = read_actions(doc, n)
    replication = None
    if (n := kids.one("Replication")) is not None:
        replication = values["replication"] = read_replication(doc, n)
    authentication = None
    if (n := kids.one("Authentication")) is not None:
        authentication = values["authentication"] = read_authentication(doc, n)
    if (n := kids.one("Entitlement")) is not None:
        if authentication is None:
            raise doc.error(n.path, "<Entitlement> without <Authentication>: nobody would be known to be entitled",
                            "add <Authentication> with a <UsersFile> (docs/security.md)")
        values["entitlement"] = read_entitlement(doc, n)
    if (n := kids.one("Limits")) is not None:
        values["limits"] = read_limits(doc, n)
    if authentication is not None and authentication.client_certificates:
        verifying = [t for t in transports if t.tls is not None and t.tls.client_certificates != "none"]
        if not verifying:
            raise doc.error(f"{authentication.path}/ClientCertificates",
                            "client certificates authenticate, but no transport verifies them",
                            "give a tcps Transport <CAFile> and <ClientCertificates>optional</ClientCertificates> "
                            "(or required)")

    listeners = [
        (f"AMPSConfig/Transports/Transport[{i}]/InetAddr", t.host, t.port)
        for i, t in enumerate(transports, start=1)
    ]
    if admin is not None:
        listeners.append(("AMPSConfig/Admin/InetAddr", admin.host, admin.port))
    check_listeners(doc, listeners)
    check(doc, txlog, queues, actions, replication, sow)
    return Config(**values)  # type: ignore[arg-type]
