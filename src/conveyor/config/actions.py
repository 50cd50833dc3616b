"""``<Actions>``: dead-letter handling, and the proxied-transfer switch for disaster
recovery (docs/actions.md, docs/replication.md).

Rules kept here (the topic rules that need the queues live in
:mod:`conveyor.config.rules`):

- An ``Action`` has exactly one ``On`` and one or more ``Do``; each has a ``Module`` and
  ``Options``. Supported pairs: ``amps-action-on-sow-expire-message`` (On) with
  ``amps-action-do-publish-message`` (Do): dead letters; and
  ``amps-action-on-publish-message`` (On) with ``amps-action-do-enable-proxied-transfer``
  or ``amps-action-do-disable-proxied-transfer`` (Do): switching proxied transfer by
  publishing to a control topic, when the admin interface cannot be used. Any other
  module or pair is refused with that list.
- On publish options: ``Topic`` (a name or regex), ``MessageType``, optionally ``Filter``
  (an expression) and ``Source`` (``all``, the default, ``local`` or ``replicated``).
- Proxied-transfer Do options: ``Topic`` (the queue, a name or regex) and ``MessageType``.
- On options: ``Topic`` (one literal topic, no regex), ``MessageType``, and optionally
  ``Reason``, a comma list drawn from :data:`~conveyor.config.model.EXPIRE_REASONS`.
- Do options: ``Topic`` (literal), ``MessageType``, ``Data`` (a template kept as
  written: ``{{AMPS_DATA}}`` and friends are filled in when the action runs), and the
  booleans ``Delta`` and ``UpdateOnly`` (``true``/``false``, default false);
  ``UpdateOnly`` needs ``Delta``.
"""

from __future__ import annotations

from conveyor.config.model import EXPIRE_REASONS, Action, DoProxiedTransfer, DoPublish, OnPublish, OnSowExpire
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, REQUIRED_MANY, Document, Node
from conveyor.config.txlog import topic_name

ON_SOW_EXPIRE = "amps-action-on-sow-expire-message"
ON_PUBLISH = "amps-action-on-publish-message"
DO_PUBLISH = "amps-action-do-publish-message"
DO_ENABLE_PROXIED = "amps-action-do-enable-proxied-transfer"
DO_DISABLE_PROXIED = "amps-action-do-disable-proxied-transfer"
#: On module -> the Do modules it can run.
_PAIRS = {ON_SOW_EXPIRE: (DO_PUBLISH,), ON_PUBLISH: (DO_ENABLE_PROXIED, DO_DISABLE_PROXIED)}
_ON_PUBLISH_OPTIONS = {"Topic": REQUIRED, "MessageType": REQUIRED, "Filter": OPTIONAL, "Source": OPTIONAL}
_PROXIED_OPTIONS = {"Topic": REQUIRED, "MessageType": REQUIRED}
_SOURCES = {"all": "all", "local": "local", "replicated": "replicated"}

_ACTION = {"On": REQUIRED, "Do": REQUIRED_MANY}
_STEP = {"Module": REQUIRED, "Options": REQUIRED}
_ON_OPTIONS = {"Topic": REQUIRED, "MessageType": REQUIRED, "Reason": OPTIONAL}
_DO_OPTIONS = {
    "Topic": REQUIRED,
    "MessageType": REQUIRED,
    "Data": REQUIRED,
    "Delta": OPTIONAL,
    "UpdateOnly": OPTIONAL,
}


def read_actions(doc: Document, node: Node) -> tuple[Action, ...]:
    kids = doc.children(node, {"Action": MANY})
    return tuple(_read_action(doc, a) for a in kids.many("Action"))


def _read_action(doc: Document, node: Node) -> Action:
    kids = doc.children(node, _ACTION)
    on = kids.one("On")
    assert on is not None  # REQUIRED
    on_module = _module(doc, on, tuple(_PAIRS))
    if on_module == ON_PUBLISH:
        return Action(on=_read_on_publish(doc, on),
                      do=tuple(_read_proxied(doc, d) for d in kids.many("Do")), path=node.path)
    return Action(
        on=_read_on(doc, on),
        do=tuple(_read_do(doc, d) for d in kids.many("Do")),
        path=node.path,
    )


def _module(doc: Document, step: Node, allowed: tuple[str, ...]) -> str:
    kids = doc.children(step, _STEP)
    module_node = _req(kids.one("Module"))
    name = doc.text(module_node)
    if name not in allowed:
        pairs = "; ".join(f"{on} with {' or '.join(dos)}" for on, dos in _PAIRS.items())
        raise doc.error(module_node.path, f"unknown <{step.tag}> module {name!r}",
                        f"the supported <On> / <Do> pairs are: {pairs}")
    return name


def _read_on_publish(doc: Document, node: Node) -> OnPublish:
    options = _options(doc, node, ON_PUBLISH, _ON_PUBLISH_OPTIONS)
    flt = options.one("Filter")
    source = options.one("Source")
    text = doc.text(flt) if flt is not None else None
    if text is not None:
        from conveyor import expr

        try:
            expr.compile(text)
        except expr.ExpressionError as exc:
            raise doc.error(flt.path, f"invalid Filter: {exc}", "<Filter> takes a filter expression") from None
    return OnPublish(
        topic=topic_name(doc, _req(options.one("Topic")), regex_allowed=True),
        message_type=doc.text(_req(options.one("MessageType"))),
        filter=text,
        source=doc.choice(source, _SOURCES) if source is not None else "all",
    )


def _read_proxied(doc: Document, node: Node) -> DoProxiedTransfer:
    module = _module(doc, node, (DO_ENABLE_PROXIED, DO_DISABLE_PROXIED))
    options = _options(doc, node, module, _PROXIED_OPTIONS)
    return DoProxiedTransfer(
        queue=topic_name(doc, _req(options.one("Topic")), regex_allowed=True),
        message_type=doc.text(_req(options.one("MessageType"))),
        enable=module == DO_ENABLE_PROXIED,
    )


def _read_on(doc: Document, node: Node) -> OnSowExpire:
    options = _options(doc, node, ON_SOW_EXPIRE, _ON_OPTIONS)
    reasons = None
    if (n := options.one("Reason")) is not None:
        reasons = _reasons(doc, n)
    return OnSowExpire(
        topic=topic_name(doc, _req(options.one("Topic")), regex_allowed=False),
        message_type=doc.text(_req(options.one("MessageType"))),
        reasons=reasons,
    )


def _read_do(doc: Document, node: Node) -> DoPublish:
    options = _options(doc, node, DO_PUBLISH, _DO_OPTIONS)
    delta = options.one("Delta")
    update_only = options.one("UpdateOnly")
    is_delta = doc.boolean(delta) if delta is not None else False
    is_update_only = doc.boolean(update_only) if update_only is not None else False
    if is_update_only and not is_delta:
        assert update_only is not None
        raise doc.error(
            update_only.path,
            "<UpdateOnly> applies only to a delta publish",
            "add <Delta>true</Delta>, or remove <UpdateOnly>",
        )
    return DoPublish(
        topic=topic_name(doc, _req(options.one("Topic")), regex_allowed=False),
        message_type=doc.text(_req(options.one("MessageType"))),
        data=doc.text(_req(options.one("Data"))),
        delta=is_delta,
        update_only=is_update_only,
    )


def _options(doc: Document, step: Node, module: str, spec: dict[str, str]):
    """Check ``step`` runs ``module`` and return its checked ``Options`` children."""
    kids = doc.children(step, _STEP)
    module_node = _req(kids.one("Module"))
    name = doc.text(module_node)
    if name != module:
        pairs = "; ".join(f"{on} with {' or '.join(dos)}" for on, dos in _PAIRS.items())
        raise doc.error(
            module_node.path,
            f"unknown <{step.tag}> module {name!r}",
            f"the supported <{step.tag}> module here is {module} (the supported <On> / <Do> pairs are: {pairs})",
        )
    return doc.children(_req(kids.one("Options")), spec)


def _reasons(doc: Document, node: Node) -> frozenset[str]:
    reasons = [r.strip() for r in doc.text(node).split(",") if r.strip()]
    known = ", ".join(sorted(EXPIRE_REASONS))
    if not reasons:
        raise doc.error(node.path, "<Reason> lists no reason", f"list one or more of: {known}")
    for reason in reasons:
        if reason not in EXPIRE_REASONS:
            raise doc.error(
                node.path, f"unknown expiry reason {reason!r}", f"reasons are: {known}"
            )
    return frozenset(reasons)


def _req(node: Node | None) -> Node:
    assert node is not None  # the spec marked the element REQUIRED and it was checked
    return node
