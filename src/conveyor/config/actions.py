"""``<Actions>``: dead-letter handling (reference.md C.1, C.2).

Rules kept here (the topic rules that need the queues live in
:mod:`conveyor.config.rules`):

- An ``Action`` has exactly one ``On`` and one or more ``Do``; each has a ``Module`` and
  ``Options``. Supported modules: ``amps-action-on-sow-expire-message`` (On) and
  ``amps-action-do-publish-message`` (Do); any other module is refused with that list.
- On options: ``Topic`` (one literal topic, no regex), ``MessageType``, and optionally
  ``Reason``, a comma list drawn from :data:`~conveyor.config.model.EXPIRE_REASONS`.
- Do options: ``Topic`` (literal), ``MessageType``, ``Data`` (a template kept as
  written: ``{{AMPS_DATA}}`` and friends are filled in when the action runs), and the
  booleans ``Delta`` and ``UpdateOnly`` (``true``/``false``, default false);
  ``UpdateOnly`` needs ``Delta``.
"""

from __future__ import annotations

from conveyor.config.model import EXPIRE_REASONS, Action, DoPublish, OnSowExpire
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, REQUIRED_MANY, Document, Node
from conveyor.config.txlog import topic_name

ON_SOW_EXPIRE = "amps-action-on-sow-expire-message"
DO_PUBLISH = "amps-action-do-publish-message"

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
    return Action(
        on=_read_on(doc, on),
        do=tuple(_read_do(doc, d) for d in kids.many("Do")),
        path=node.path,
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
        raise doc.error(
            module_node.path,
            f"unknown <{step.tag}> module {name!r}",
            f"the supported <{step.tag}> module is {module} (supported modules: "
            f"{ON_SOW_EXPIRE} for <On>, {DO_PUBLISH} for <Do>)",
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
