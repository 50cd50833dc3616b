"""``<Replication>``: outgoing replication destinations (docs/replication.md).

Rules:

- A ``Destination`` has a unique ``Name``, an optional ``Group``, a ``SyncType`` of
  ``sync`` or ``async``, one or more ``Transport`` (each with an optional ``Type``,
  ``amps-replication`` or ``amps-replication-secure``, and one or more
  ``InetAddr`` of the form ``HOST:PORT``), one or more ``Topic`` (``Name`` literal or
  regex, ``MessageType``), and an optional ``PassThrough`` regex of group names.
- Addresses are kept in priority order, transports first, then addresses within one.
- ``DowngradeAge`` (a duration) lets a ``sync`` destination that falls that far behind be
  treated as async until it is back under ``UpgradeAge`` (default: half the downgrade
  age); both are refused on an ``async`` destination, and ``UpgradeAge`` must be below
  ``DowngradeAge``.
- A ``Transport`` of ``Type`` ``amps-replication-secure`` dials over TLS: ``CAFile``
  (the CAs that sign the destination's certificate; the system's when absent), and
  ``Certificate`` with ``PrivateKey`` when the destination asks for a client certificate.
  ``User`` and ``Password`` are the credentials this instance logs on with when the
  destination has ``Authentication`` (write ``${VAR}`` to keep the password out of the
  file). They apply to every ``InetAddr`` of that ``Transport``: servers that need
  different credentials get a ``Transport`` each.
- ``RecoveryCatchUpTimeout`` (a duration, default 30 s, ``0``: do not wait): how long a
  starting instance holds the deliveries of its replicated queues until its ``sync``
  peers have caught it up (docs/replication.md, "After a restart: catching up").
"""

from __future__ import annotations

import re

from conveyor.config._invalid import Invalid
from conveyor.config.model import (RECOVERY_CATCH_UP_TIMEOUT_S_DEFAULT, LinkEndpoint, Replication,
                                   ReplicationDestination)
from conveyor.config.security import TLS_ELEMENTS, read_tls
from conveyor.config.transports import inet_addr
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, REQUIRED_MANY, Document, Node
from conveyor.config.txlog import read_recorded_topic

_DESTINATION = {
    "Name": REQUIRED,
    "Group": OPTIONAL,
    "SyncType": REQUIRED,
    "Transport": REQUIRED_MANY,
    "Topic": REQUIRED_MANY,
    "PassThrough": OPTIONAL,
    "DowngradeAge": OPTIONAL,
    "UpgradeAge": OPTIONAL,
}
_TRANSPORT = {"Name": OPTIONAL, "Type": OPTIONAL, "InetAddr": REQUIRED_MANY, "User": OPTIONAL, "Password": OPTIONAL,
              **TLS_ELEMENTS}
_SYNC_TYPES = {"sync": "sync", "async": "async"}
_TRANSPORT_TYPES = {"amps-replication": False, "amps-replication-secure": True}


def read_replication(doc: Document, node: Node) -> Replication:
    kids = doc.children(node, {"Destination": MANY, "RecoveryCatchUpTimeout": OPTIONAL})
    destinations: list[ReplicationDestination] = []
    seen: dict[str, str] = {}
    for child in kids.many("Destination"):
        dest = _read_destination(doc, child)
        if dest.name in seen:
            raise doc.error(
                child.path,
                f"destination name {dest.name!r} is already used by {seen[dest.name]}",
                "give every <Destination> its own <Name>",
            )
        seen[dest.name] = child.path
        destinations.append(dest)
    timeout = kids.one("RecoveryCatchUpTimeout")
    return Replication(
        destinations=tuple(destinations),
        recovery_catch_up_timeout_s=(doc.duration(timeout, positive=False) if timeout is not None
                                     else RECOVERY_CATCH_UP_TIMEOUT_S_DEFAULT),
    )


def _read_destination(doc: Document, node: Node) -> ReplicationDestination:
    kids = doc.children(node, _DESTINATION)
    name = kids.one("Name")
    sync_type = kids.one("SyncType")
    assert name is not None and sync_type is not None  # REQUIRED
    group = kids.one("Group")
    pass_through = kids.one("PassThrough")
    endpoints: list[LinkEndpoint] = []
    for transport in kids.many("Transport"):
        endpoints.extend(_read_transport(doc, transport))
    kind = doc.choice(sync_type, _SYNC_TYPES)
    downgrade = kids.one("DowngradeAge")
    upgrade = kids.one("UpgradeAge")
    downgrade_s = doc.duration(downgrade) if downgrade is not None else None
    if downgrade is not None and kind != "sync":
        raise doc.error(downgrade.path, "DowngradeAge only applies to a sync destination",
                        "remove it, or make the destination <SyncType>sync</SyncType>")
    if upgrade is not None and downgrade_s is None:
        raise doc.error(upgrade.path, "UpgradeAge needs a DowngradeAge", "add <DowngradeAge>")
    upgrade_s = doc.duration(upgrade) if upgrade is not None else (downgrade_s or 0.0) / 2
    if downgrade_s is not None and not 0 <= upgrade_s < downgrade_s:
        raise doc.error((upgrade or downgrade).path, f"UpgradeAge ({upgrade_s} s) must be below DowngradeAge "
                        f"({downgrade_s} s)", "so a destination near the limit does not flap between sync and async")
    return ReplicationDestination(
        name=doc.text(name),
        group=doc.text(group) if group is not None else None,
        sync_type=kind,  # type: ignore[arg-type]
        addresses=tuple(e.address for e in endpoints),
        endpoints=tuple(endpoints),
        topics=tuple(read_recorded_topic(doc, t, filter_allowed=True) for t in kids.many("Topic")),
        pass_through=_regex(doc, pass_through) if pass_through is not None else None,
        downgrade_age_s=downgrade_s,
        upgrade_age_s=upgrade_s,
    )


def _read_transport(doc: Document, node: Node) -> list[LinkEndpoint]:
    kids = doc.children(node, _TRANSPORT)
    secure = False
    if (n := kids.one("Type")) is not None:
        secure = bool(doc.choice(n, _TRANSPORT_TYPES))
    tls = read_tls(doc, kids, node, listener=False, secure=secure)
    user = doc.text(n) if (n := kids.one("User")) is not None else None
    password = doc.text(n) if (n := kids.one("Password")) is not None else None
    if (user is None) != (password is None):
        raise doc.error(node.path, "<User> and <Password> go together",
                        "give both (the destination's Authentication checks them), or neither")
    addresses = []
    for addr in kids.many("InetAddr"):
        text = doc.text(addr)
        try:
            host, _ = inet_addr(text)
        except Invalid as e:
            raise doc.error(addr.path, e.message, e.hint) from None
        if host is None:
            raise doc.error(
                addr.path,
                f"replication address {text!r} has no host",
                "conveyor connects to a destination: write HOST:PORT or [IPV6]:PORT, "
                "e.g. replica.example.com:10005",
            )
        addresses.append(LinkEndpoint(address=text, tls=tls, user=user, password=password))
    return addresses


def _regex(doc: Document, node: Node) -> str:
    text = doc.text(node)
    try:
        re.compile(text)
    except (re.error, OverflowError, RecursionError) as e:  # RecursionError: "((((..." thousands deep
        raise doc.error(
            node.path,
            f"{text!r} is not a valid regular expression: {e}",
            "PassThrough is a regex of group names, e.g. .* for every group",
        ) from None
    return text
