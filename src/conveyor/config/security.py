"""``<Authentication>``, ``<Entitlement>``, ``<Limits>`` and the TLS elements of
transports, the admin interface and replication links (docs/security.md).

Rules:

1. ``Authentication`` holds ``UsersFile`` (user names and argon2 hashes, managed by
   ``conveyor users``) and/or ``ClientCertificates`` (``true``: a client certificate
   verified by a transport's ``CAFile`` authenticates its subject's common name). At
   least one way to authenticate must be given. AMPS's ``Module`` element is accepted
   only naming conveyor's own module (``conveyor-users``); another module is refused by
   name rather than silently replaced.
2. ``Entitlement`` holds ``Group`` (``Name``, ``Member``...) and ``Grant`` elements. A
   grant names ``User``\\s and ``Group``\\s and lists what they may do: ``Publish``,
   ``Subscribe``, ``Sow``, ``Replay`` (topics), ``Consume``, ``Acknowledge``, ``Purge``,
   ``NamedConsumers`` (queues), each a literal name or a regex matched against the
   whole name, and ``Transactions``, ``Admin`` (``read`` or ``full``), ``Replicate``, ``ReadJournal``.
   Every regex is compiled here, so a bad one is refused with its path. A grant to an
   unknown group is refused. A grant's ``Filter`` (an entitlement filter) restricts its
   ``Subscribe``, ``Sow``, ``Replay`` and ``Consume`` to the messages it matches; it
   must compile (refused with its path), must have one of those to restrict, and is
   refused beside ``NamedConsumers`` (which read whole queues). Its other permissions
   are granted as without it. ``Entitlement`` without ``Authentication`` is refused:
   nobody would be known to be entitled.
3. ``Limits`` (a conveyor extension): named limits with defaults
   (:class:`~conveyor.config.model.Limits`). ``OutputBudget`` (a positive size) bounds
   the unsent output of all clients together, ``IdleTimeout`` (a positive duration)
   closes connections that hold no subscription; the others bound what one client may
   take (connections, subscriptions, topic length, pending logons). The failed-logon
   limits (``MaxFailedLogonsPerAddress``, ``MaxFailedLogonsPerUser``, within
   ``FailedLogonWindow``) count wrong credentials only and delay the wrong answers
   over them; a correct credential is never refused (security/ratelimit.py).
   ``QueueMetadataMemory`` (a positive size) is the memory budget of the
   FileBackedMetadata queues' state together (engine/queue/budget.py).
4. TLS (:func:`read_tls`): ``Certificate`` and ``PrivateKey`` are required on a
   listener, ``ClientCertificates`` (``none``/``optional``/``required``) needs
   ``CAFile``; every file must exist when the configuration is read. The files are
   read again when the server reloads its certificates.
"""

from __future__ import annotations

import re
from pathlib import Path

from conveyor.config.model import Authentication, Entitlement, Grant, Limits, Tls, is_regex_topic
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, Children, Document, Node

#: The module name conveyor's built-in authentication answers to in ``<Module>``.
USERS_MODULE = "conveyor-users"
#: What a user or group name may be: printable, no separators the journal or logs use.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.@+-]{1,128}")
NAME_HINT = "1 to 128 letters, digits or the characters _ . @ + -"

TLS_ELEMENTS = {"Certificate": OPTIONAL, "PrivateKey": OPTIONAL, "CAFile": OPTIONAL,
                "ClientCertificates": OPTIONAL, "Ciphers": OPTIONAL}
_CLIENT_CERTIFICATES = {"none": "none", "optional": "optional", "required": "required"}

_AUTHENTICATION = {"Module": OPTIONAL, "UsersFile": OPTIONAL, "ClientCertificates": OPTIONAL}
_ENTITLEMENT = {"Group": MANY, "Grant": MANY}
_GROUP = {"Name": REQUIRED, "Member": MANY}
_NAME_LISTS = {
    "Publish": "publish", "Subscribe": "subscribe", "Sow": "sow", "Replay": "replay",
    "Consume": "consume", "Acknowledge": "acknowledge", "Purge": "purge", "NamedConsumers": "named_consumers",
}
_GRANT = {"User": MANY, "Group": MANY, **{tag: MANY for tag in _NAME_LISTS},
          "Transactions": OPTIONAL, "Admin": OPTIONAL, "Replicate": OPTIONAL, "ReadJournal": OPTIONAL,
          "Filter": OPTIONAL}
#: What a grant's ``Filter`` restricts: the permissions that read messages.
_FILTERED_LISTS = ("Subscribe", "Sow", "Replay", "Consume")
_ADMIN_LEVELS = {"read": "read", "full": "full", "true": "full", "false": None}
_LIMITS = {
    "OutputBudget": ("output_budget_bytes", "size"),
    "IdleTimeout": ("idle_timeout_s", "duration"),
    "MaxConnections": ("connections_max", "count"),
    "MaxConnectionsPerUser": ("connections_per_user_max", "count"),
    "MaxSubscriptionsPerConnection": ("subscriptions_per_connection_max", "count"),
    "MaxTopicLength": ("topic_chars_max", "count"),
    "MaxPendingLogons": ("pending_logons_max", "count"),
    "LogonTimeout": ("logon_timeout_s", "duration"),
    "MaxFailedLogonsPerAddress": ("failed_logons_per_address_max", "count"),
    "MaxFailedLogonsPerUser": ("failed_logons_per_user_max", "count"),
    "FailedLogonWindow": ("failed_logon_window_s", "duration"),
    "QueueMetadataMemory": ("queue_metadata_memory_bytes", "size"),
}


def read_authentication(doc: Document, node: Node) -> Authentication:
    kids = doc.children(node, _AUTHENTICATION)
    if (n := kids.one("Module")) is not None and doc.text(n) != USERS_MODULE:
        raise doc.error(n.path, f"authentication module {doc.text(n)!r} is not available",
                        f"conveyor authenticates with its own module: write <Module>{USERS_MODULE}</Module> "
                        "or leave <Module> out")
    users_file = None
    if (n := kids.one("UsersFile")) is not None:
        users_file = Path(doc.text(n))
        if not users_file.is_file():
            raise doc.error(n.path, f"users file {str(users_file)!r} does not exist",
                            f"create it with: conveyor users add NAME --file {users_file}")
    certificates = kids.one("ClientCertificates")
    by_certificate = doc.boolean(certificates) if certificates is not None else False
    if users_file is None and not by_certificate:
        raise doc.error(node.path, "<Authentication> names no way to authenticate",
                        "add <UsersFile> (passwords) and/or <ClientCertificates>true</ClientCertificates>")
    return Authentication(users_file=users_file, client_certificates=by_certificate, path=node.path)


def read_entitlement(doc: Document, node: Node) -> Entitlement:
    kids = doc.children(node, _ENTITLEMENT)
    groups: dict[str, tuple[str, ...]] = {}
    for g in kids.many("Group"):
        gk = doc.children(g, _GROUP)
        name_node = gk.one("Name")
        assert name_node is not None  # REQUIRED
        name = _name(doc, name_node)
        if name in groups:
            raise doc.error(name_node.path, f"group {name!r} is defined twice", "merge the two <Group> elements")
        groups[name] = tuple(_name(doc, m) for m in gk.many("Member"))
    grants = tuple(_read_grant(doc, g, groups) for g in kids.many("Grant"))
    return Entitlement(groups=groups, grants=grants)


def _read_grant(doc: Document, node: Node, groups: dict[str, tuple[str, ...]]) -> Grant:
    kids = doc.children(node, _GRANT)
    users = tuple(_name(doc, n) for n in kids.many("User"))
    granted_groups = []
    for n in kids.many("Group"):
        name = _name(doc, n)
        if name not in groups:
            raise doc.error(n.path, f"group {name!r} is not defined",
                            "define it with <Group><Name>...</Name><Member>...</Member></Group> in <Entitlement>")
        granted_groups.append(name)
    if not users and not granted_groups:
        raise doc.error(node.path, "<Grant> names nobody", "add <User>NAME</User> or <Group>NAME</Group>")
    values: dict[str, object] = {"users": users, "groups": tuple(granted_groups), "path": node.path}
    for tag, attr in _NAME_LISTS.items():
        values[attr] = tuple(_pattern(doc, n) for n in kids.many(tag))
    if (n := kids.one("Transactions")) is not None:
        values["transactions"] = doc.boolean(n)
    if (n := kids.one("Admin")) is not None:
        values["admin"] = doc.choice(n, _ADMIN_LEVELS)
    if (n := kids.one("Replicate")) is not None:
        values["replicate"] = doc.boolean(n)
    if (n := kids.one("ReadJournal")) is not None:
        values["read_journal"] = doc.boolean(n)
    if (n := kids.one("Filter")) is not None:
        values["filter"] = _grant_filter(doc, n, kids)
    return Grant(**values)  # type: ignore[arg-type]


def _grant_filter(doc: Document, node: Node, kids: Children) -> str:
    """Rule 2: an entitlement filter compiles, restricts some read permission, and sits
    in no grant of ``NamedConsumers`` (which read whole queues: it would not apply)."""
    from conveyor import expr

    text = doc.text(node)
    try:
        expr.compile(text)
    except expr.ExpressionError as exc:
        raise doc.error(node.path, f"invalid Filter: {exc}", "<Filter> takes a filter expression, "
                        "e.g. <Filter>/region = 'EU'</Filter>") from None
    if not any(kids.many(tag) for tag in _FILTERED_LISTS):
        raise doc.error(node.path, "this <Filter> restricts nothing: its grant lists no Subscribe, Sow, Replay "
                        "or Consume", "add the names it restricts to this grant")
    if kids.many("NamedConsumers"):
        raise doc.error(node.path, "a <Filter> does not apply to NamedConsumers (named consumers read whole queues)",
                        "grant NamedConsumers in a grant without <Filter>")
    return text


def _name(doc: Document, node: Node) -> str:
    text = doc.text(node)
    if not NAME_PATTERN.fullmatch(text):
        raise doc.error(node.path, f"{text!r} is not a valid user or group name", NAME_HINT)
    return text


def _pattern(doc: Document, node: Node) -> str:
    text = doc.text(node)
    if is_regex_topic(text):
        try:
            re.compile(text)
        except (re.error, OverflowError, RecursionError) as e:  # RecursionError: "((((..." thousands deep
            raise doc.error(node.path, f"{text!r} is not a valid regular expression: {e}",
                            "a name is matched whole: write orders or orders\\..* (escape a literal dot)") from None
    return text


def read_limits(doc: Document, node: Node) -> Limits:
    kids = doc.children(node, {tag: OPTIONAL for tag in _LIMITS})
    values: dict[str, object] = {}
    for tag, (attr, kind) in _LIMITS.items():
        if (n := kids.one(tag)) is not None:
            if kind == "count":
                values[attr] = doc.positive_int(n)
            elif kind == "size":
                values[attr] = doc.size(n)
            else:
                values[attr] = doc.duration(n)
    return Limits(**values)  # type: ignore[arg-type]


def read_tls(doc: Document, kids, owner: Node, *, listener: bool, secure: bool) -> Tls | None:
    """The TLS elements among ``kids`` (children of ``owner``, already checked against a
    spec that includes :data:`TLS_ELEMENTS`). ``secure``: the owner's type asks for TLS."""
    given = [kids.one(tag) for tag in TLS_ELEMENTS if kids.one(tag) is not None]
    if not secure:
        if given:
            raise doc.error(given[0].path, f"<{given[0].tag}> needs TLS",
                            "use Type tcps (clients) or amps-replication-secure (replication), "
                            "or remove the TLS elements")
        return None
    files: dict[str, Path | None] = {}
    for tag in ("Certificate", "PrivateKey", "CAFile"):
        n = kids.one(tag)
        files[tag] = None
        if n is not None:
            path = Path(doc.text(n))
            if not path.is_file():
                raise doc.error(n.path, f"file {str(path)!r} does not exist", "give the path of a PEM file")
            files[tag] = path
    if listener and (files["Certificate"] is None or files["PrivateKey"] is None):
        raise doc.error(owner.path, "a TLS listener needs <Certificate> and <PrivateKey>",
                        "give the PEM files of the server's certificate chain and its private key")
    if (files["Certificate"] is None) != (files["PrivateKey"] is None):
        raise doc.error(owner.path, "<Certificate> and <PrivateKey> go together", "give both, or neither")
    client_certificates = "none"
    if (n := kids.one("ClientCertificates")) is not None:
        if not listener:
            raise doc.error(n.path, "<ClientCertificates> applies to a listener",
                            "an outgoing link presents <Certificate> and <PrivateKey> instead")
        client_certificates = doc.choice(n, _CLIENT_CERTIFICATES)  # type: ignore[assignment]
        if client_certificates != "none" and files["CAFile"] is None:
            raise doc.error(n.path, "verifying client certificates needs <CAFile>",
                            "give the PEM file of the CA that signs the clients' certificates")
    ciphers = doc.text(n) if (n := kids.one("Ciphers")) is not None else None
    return Tls(certificate=files["Certificate"], private_key=files["PrivateKey"], ca_file=files["CAFile"],
               client_certificates=client_certificates, ciphers=ciphers, path=owner.path)


__all__ = ["NAME_PATTERN", "TLS_ELEMENTS", "USERS_MODULE", "read_authentication",
           "read_entitlement", "read_limits", "read_tls"]
