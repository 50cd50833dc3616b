"""``<Transports>`` and ``<Admin>``: where the server listens (``<Limits>`` is read by
:mod:`conveyor.config.security`).

Rules:

- ``InetAddr`` is ``PORT``, ``HOST:PORT`` or ``[IPV6]:PORT``; the port is 0..65535
  (0 asks the operating system for a free port, handy in tests). A bare port listens
  on loopback only (``127.0.0.1``), for client transports and the admin interface
  alike: listening on other interfaces is written explicitly (``0.0.0.0:9007``).
- A client transport's ``Type`` is ``tcp`` (``amps`` is accepted: older AMPS
  configurations use it) or ``tcps`` (TLS); its ``Protocol`` is ``conveyor`` or its
  synonym ``amps``, both stored as ``conveyor``. ``amps-replication`` (or
  ``amps-replication-secure``, over TLS) is the incoming replication transport: at most
  one per instance, and it serves no application clients. The TLS elements
  (``Certificate``, ``PrivateKey``, ``CAFile``, ``ClientCertificates``, ``Ciphers``) are
  read by :func:`conveyor.config.security.read_tls`; the admin interface takes them too.
- Transport names are unique (a missing ``Name`` becomes ``transport-N``), and no two
  listeners (transports and admin) may share a port on overlapping addresses.
"""

from __future__ import annotations

import re

from conveyor.config._invalid import Invalid
from conveyor.config.model import Admin, Transport
from conveyor.config.security import TLS_ELEMENTS, read_tls
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, Document, Node

INET_ADDR_HINT = "write PORT, HOST:PORT or [IPV6]:PORT, e.g. 9007, 0.0.0.0:9007, [::1]:9007"
_INET_ADDR = re.compile(r"\[([0-9A-Fa-f:.]+)\]:([0-9]+)|([^:\[\]\s]+):([0-9]+)|([0-9]+)")
_WILDCARDS = {"0.0.0.0", "::", "*"}
_TYPES = {"tcp": "tcp", "amps": "tcp", "tcps": "tcp", "amps-replication": "replication",
          "amps-replication-secure": "replication"}
_SECURE_TYPES = {"tcps", "amps-replication-secure"}
_PROTOCOLS = {"conveyor": "conveyor", "amps": "conveyor"}
LOOPBACK = "127.0.0.1"

_TRANSPORT = {
    "Name": OPTIONAL,
    "Type": OPTIONAL,
    "InetAddr": REQUIRED,
    "Protocol": OPTIONAL,
    "MessageType": OPTIONAL,
    "MaxFrameSize": OPTIONAL,
    "SlowClientDisconnectThreshold": OPTIONAL,
    "IdleTimeout": OPTIONAL,
    **TLS_ELEMENTS,
}
_ADMIN = {"InetAddr": REQUIRED, "FileName": OPTIONAL, **TLS_ELEMENTS}


def inet_addr(text: str) -> tuple[str | None, int]:
    """``(host or None, port)`` from an ``InetAddr`` value; :class:`Invalid` if malformed."""
    m = _INET_ADDR.fullmatch(text)
    if m is None:
        why = "an IPv6 address needs brackets" if text.count(":") > 1 else "malformed"
        raise Invalid(f"{text!r} is not an address ({why})", INET_ADDR_HINT)
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4) or m.group(5))
    if port > 65535:
        raise Invalid(f"port {port} in {text!r} is out of range 0..65535", INET_ADDR_HINT)
    return host, port


def read_transports(doc: Document, node: Node) -> tuple[Transport, ...]:
    kids = doc.children(node, {"Transport": MANY})
    transports = [
        _read_transport(doc, t, i) for i, t in enumerate(kids.many("Transport"), start=1)
    ]
    by_name: dict[str, str] = {}
    for t, n in zip(transports, kids.many("Transport")):
        if t.name in by_name:
            raise doc.error(
                n.path,
                f"transport name {t.name!r} is already used by {by_name[t.name]}",
                "give every <Transport> its own <Name>",
            )
        by_name[t.name] = n.path
    incoming = [n.path for t, n in zip(transports, kids.many("Transport")) if t.type == "replication"]
    if len(incoming) > 1:
        raise doc.error(incoming[1], f"a second incoming replication transport (the first is {incoming[0]})",
                        "an instance has at most one Transport of Type amps-replication")
    return tuple(transports)


def _read_transport(doc: Document, node: Node, index: int) -> Transport:
    kids = doc.children(node, _TRANSPORT)
    values: dict[str, object] = {}
    secure = False
    if (n := kids.one("Type")) is not None:
        values["type"] = doc.choice(n, _TYPES)
        secure = doc.text(n).lower() in _SECURE_TYPES
    values["tls"] = read_tls(doc, kids, node, listener=True, secure=secure)
    if (n := kids.one("Protocol")) is not None:
        values["protocol"] = doc.choice(n, _PROTOCOLS)
    host, port = _address(doc, kids.one("InetAddr"))
    values["host"] = host if host is not None else LOOPBACK
    values["port"] = port
    if (n := kids.one("MessageType")) is not None:
        values["message_type"] = doc.text(n)
    if (n := kids.one("MaxFrameSize")) is not None:
        values["frame_bytes_max"] = doc.size(n)
    if (n := kids.one("SlowClientDisconnectThreshold")) is not None:
        values["output_bytes_max"] = doc.size(n)
    if (n := kids.one("IdleTimeout")) is not None:
        values["idle_timeout_s"] = doc.duration(n)
    name_node = kids.one("Name")
    name = doc.text(name_node) if name_node is not None else f"transport-{index}"
    return Transport(name=name, path=node.path, **values)  # type: ignore[arg-type]


def read_admin(doc: Document, node: Node) -> Admin:
    kids = doc.children(node, _ADMIN)
    host, port = _address(doc, kids.one("InetAddr"))
    file_node = kids.one("FileName")
    tls = read_tls(doc, kids, node, listener=True, secure=any(tag in kids for tag in TLS_ELEMENTS))
    return Admin(
        host=host if host is not None else LOOPBACK,
        port=port,
        file_name=doc.text(file_node) if file_node is not None else None,
        tls=tls,
    )


def check_listeners(doc: Document, listeners: list[tuple[str, str, int]]) -> None:
    """Refuse two listeners ``(path, host, port)`` on the same port and address."""
    for i, (path, host, port) in enumerate(listeners):
        for other_path, other_host, other_port in listeners[:i]:
            overlap = host == other_host or host in _WILDCARDS or other_host in _WILDCARDS
            if port != 0 and port == other_port and overlap:
                raise doc.error(
                    path,
                    f"address {host}:{port} is already used by {other_path}",
                    "give every transport and the admin interface its own port",
                )


def _address(doc: Document, node: Node | None) -> tuple[str | None, int]:
    assert node is not None  # InetAddr is REQUIRED in both specs
    try:
        return inet_addr(doc.text(node))
    except Invalid as e:
        raise doc.error(node.path, e.message, e.hint) from None

