"""``<SOW>``: queue declarations (reference.md A.1-A.3), and the section as a whole.

Rules kept here (those that need other sections live in :mod:`conveyor.config.rules`;
SOW topics and views are read by :mod:`conveyor.config.sow`):

- ``Queue`` (synonym ``QueueDefinition``), ``LocalQueue`` and ``GroupLocalQueue`` are
  accepted, with SOW ``Topic``, ``View`` and ``ConflatedTopic`` declarations, in any
  order (a view or a conflated topic names only what is declared before it). Names are
  unique across queues, SOW topics, views and conflated topics.
- A queue has ``Name`` (or ``Topic`` instead, not both) and ``MessageType``. The name
  is a literal topic name; queue names are unique across all three tags.
- ``Semantics`` defaults to ``at-least-once``. ``FairnessModel`` defaults to
  ``proportional`` for at-least-once and ``round-robin`` for at-most-once, which
  supports nothing else. ``LeasePeriod`` defaults to ``LEASE_PERIOD_DEFAULT_S``;
  ``Leasing`` to ``sublet`` and ``DeferredAckExpiration`` to one day (the reference's
  queue table); ``FileBackedMetadata`` to disabled; the limits to none.
- ``MaxBacklog``, ``MaxPerSubscriptionBacklog`` and ``TargetQueueDepth`` are positive
  integers; ``MaxCancels`` and ``MaxDeliveries`` too, or 0 for "no maximum" (the
  reference's meaning). ``Leasing`` is ``strict`` or ``sublet`` (``sloppy``, conveyor's
  first name for it, is accepted). ``TargetQueueDepth`` cannot be combined
  with ``Priority`` or ``BarrierExpression``.
- ``UnderlyingTopic`` is a name or a regex (which must compile); a
  ``DefaultPublishTarget`` is a literal name that must match it. It defaults to a
  literal ``UnderlyingTopic`` (the reference's queue table, G.8), so a publish to the
  queue's name enters the queue; with a regex one it is required (the same table).
- ``InitialOwner`` is required on ``GroupLocalQueue``; it and
  ``GroupLocalQueueDomain`` are refused on the other tags.
- ``RecoveryPoint`` is ``epoch`` (the default: the whole log), ``now``, ``creation``
  (where the log ended when this instance first saw the queue: engine/recovery.py
  rule 1), a bookmark or a timestamp, checked here as a bookmark subscription would
  take it.
- ``Priority``, ``BarrierExpression`` and ``Filter`` stay text: the engine compiles them
  and reports errors with ``QueueConfig.path``.
- ``OrderingKey`` (per-key ordering, docs/queues.md) must compile here; ``MaxInFlightPerKey``
  (a positive integer, default 1) needs it. Refused with it: at-most-once,
  ``GroupLocalQueue``, ``TargetQueueDepth``, ``FileBackedMetadata`` (a replicated
  ``Queue`` may have one: engine/queue/keys.py rule 6).
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor import errors
from conveyor.config.model import (
    LEASE_PERIOD_DEFAULT_S,
    Fairness,
    Leasing,
    QueueConfig,
    QueueKind,
    Semantics,
    ConflatedTopicConfig,
    SowTopicConfig,
    ViewConfig,
    is_regex_topic,
    topic_matcher,
)
from conveyor.config.sow import check_sow_order, read_conflated_topic, read_topic, read_view
from conveyor.config._invalid import Invalid
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, Document, Node
from conveyor.config.units import duration_s
from conveyor.config.txlog import topic_name

_KINDS = {
    "Queue": QueueKind.QUEUE,
    "QueueDefinition": QueueKind.QUEUE,
    "LocalQueue": QueueKind.LOCAL,
    "GroupLocalQueue": QueueKind.GROUP_LOCAL,
}
_REFUSED: dict[str, str] = {}
_TOPIC_TAGS = ("Topic", "TopicDefinition")
_VIEW_TAGS = ("View", "ViewDefinition")
_CONFLATED_TAGS = ("ConflatedTopic", "ReplicaDefinition")

_QUEUE = {
    "Name": OPTIONAL,
    "Topic": OPTIONAL,
    "MessageType": REQUIRED,
    "UnderlyingTopic": OPTIONAL,
    "DefaultPublishTarget": OPTIONAL,
    "Semantics": OPTIONAL,
    "LeasePeriod": OPTIONAL,
    "Expiration": OPTIONAL,
    "MaxBacklog": OPTIONAL,
    "MaxPerSubscriptionBacklog": OPTIONAL,
    "FairnessModel": OPTIONAL,
    "MaxCancels": OPTIONAL,
    "MaxDeliveries": OPTIONAL,
    "Priority": OPTIONAL,
    "BarrierExpression": OPTIONAL,
    "TargetQueueDepth": OPTIONAL,
    "Leasing": OPTIONAL,
    "RecoveryPoint": OPTIONAL,
    "DeferredAckExpiration": OPTIONAL,
    "FileBackedMetadata": OPTIONAL,
    "Filter": OPTIONAL,
    "InitialOwner": OPTIONAL,
    "GroupLocalQueueDomain": OPTIONAL,
    "RetryBackoff": OPTIONAL,
    "OrderingKey": OPTIONAL,
    "MaxInFlightPerKey": OPTIONAL,
}
_POSITIVE_INTS = {
    "MaxBacklog": "max_backlog",
    "MaxPerSubscriptionBacklog": "max_per_subscription_backlog",
    "TargetQueueDepth": "target_queue_depth",
    "MaxInFlightPerKey": "max_in_flight_per_key",
}
#: 0 means "no maximum", as in the reference's queue table.
_LIMITS_ZERO_UNLIMITED = {
    "MaxCancels": "max_cancels",
    "MaxDeliveries": "max_deliveries",
}
_LEASING = {"strict": Leasing.STRICT, "sublet": Leasing.SUBLET, "sloppy": Leasing.SUBLET}
_TEXTS = {
    "Priority": "priority",
    "BarrierExpression": "barrier_expression",
    "Filter": "filter",
    "InitialOwner": "initial_owner",
    "GroupLocalQueueDomain": "group_local_queue_domain",
    "OrderingKey": "ordering_key",
}
_FILE_BACKED = {"enabled": True, "disabled": False, "true": True, "false": False}


@dataclass(frozen=True)
class SowSection:
    queues: tuple[QueueConfig, ...] = ()
    topics: tuple[SowTopicConfig, ...] = ()
    views: tuple[ViewConfig, ...] = ()
    conflated_topics: tuple[ConflatedTopicConfig, ...] = ()


def read_sow(doc: Document, node: Node) -> SowSection:
    """Every declaration of ``<SOW>``, in document order (a view names only what is
    declared before it)."""
    tags = {tag: MANY for tag in (*_KINDS, *_TOPIC_TAGS, *_VIEW_TAGS, *_CONFLATED_TAGS)}
    kids = doc.children(node, tags, refused=_REFUSED)
    queues: list[QueueConfig] = []
    topics: list[SowTopicConfig] = []
    views: list[ViewConfig] = []
    conflated: list[ConflatedTopicConfig] = []
    seen: dict[str, str] = {}
    kinds: dict[str, str] = {}  # name -> "queue" | "topic" | "view" | "conflated", declared so far
    for child in kids.all():
        if child.tag in _TOPIC_TAGS:
            item = read_topic(doc, child)
            topics.append(item)
            kind = "topic"
        elif child.tag in _VIEW_TAGS:
            item = read_view(doc, child)
            check_sow_order(doc, kinds, item)
            views.append(item)
            kind = "view"
        elif child.tag in _CONFLATED_TAGS:
            item = read_conflated_topic(doc, child, kinds)
            conflated.append(item)
            kind = "conflated"
        else:
            item = read_queue(doc, child, _KINDS[child.tag])
            queues.append(item)
            kind = "queue"
            later = [v for v in views if v.name == item.underlying]
            if not later and any(doc.text(k) == item.underlying for k in _later_views(kids.all(), child)):
                raise doc.error(
                    f"{child.path}/UnderlyingTopic",
                    f"queue {item.name!r} is over view {item.underlying!r}, which is declared after it",
                    "declare the view before the queue in <SOW>",
                )
        if item.name in seen:
            what = {"queue": "queue", "topic": "SOW topic", "view": "view", "conflated": "conflated topic"}[kind]
            raise doc.error(
                child.path,
                f"{what} {item.name!r} is already declared at {seen[item.name]}",
                "give every queue, SOW topic, view and conflated topic its own name",
            )
        seen[item.name] = child.path
        kinds[item.name] = kind
    return SowSection(tuple(queues), tuple(topics), tuple(views), tuple(conflated))


def _later_views(children: list[Node], after: Node) -> list[Node]:
    """The name elements of the views declared after ``after``."""
    out = []
    seen = False
    for c in children:
        if c is after:
            seen = True
        elif seen and c.tag in _VIEW_TAGS:
            out.extend(k for k in c.children if k.tag in ("Name", "Topic") and not k.children)
    return out


def read_queue(doc: Document, node: Node, kind: QueueKind) -> QueueConfig:
    kids = doc.children(node, _QUEUE)
    values: dict[str, object] = {"kind": kind, "path": node.path}
    values["name"] = _queue_name(doc, node, kids.one("Name"), kids.one("Topic"))
    message_type = kids.one("MessageType")
    assert message_type is not None  # REQUIRED
    values["message_type"] = doc.text(message_type)

    semantics_node = kids.one("Semantics")
    semantics = Semantics.AT_LEAST_ONCE
    if semantics_node is not None:
        semantics = doc.enum(semantics_node, Semantics)
    values["semantics"] = semantics
    values["fairness"] = _fairness(doc, kids.one("FairnessModel"), semantics)

    if (n := kids.one("UnderlyingTopic")) is not None:
        values["underlying_topic"] = topic_name(doc, n, regex_allowed=True)
    if (n := kids.one("DefaultPublishTarget")) is not None:
        target = topic_name(doc, n, regex_allowed=False)
        underlying = values.get("underlying_topic") or values["name"]
        if not topic_matcher(underlying)(target):  # type: ignore[arg-type]
            raise doc.error(
                n.path,
                f"DefaultPublishTarget {target!r} does not match the UnderlyingTopic "
                f"{underlying!r}, so publishes to the queue would never enter it",
                "choose a target that the UnderlyingTopic matches, e.g. "
                "<UnderlyingTopic>^ORDERS$|^ORDERS_DIRECT$</UnderlyingTopic> with "
                "<DefaultPublishTarget>ORDERS_DIRECT</DefaultPublishTarget>",
            )
        values["default_publish_target"] = target
    elif (underlying := values.get("underlying_topic")) and is_regex_topic(underlying):  # type: ignore[arg-type]
        # The reference's queue table (G.8): required with a regex UnderlyingTopic, or a
        # publish to the queue's name would not enter the queue.
        raise doc.error(
            f"{values['path']}/UnderlyingTopic",
            f"queue {values['name']!r}: an UnderlyingTopic with regex characters ({underlying!r}) needs a "
            "DefaultPublishTarget: the literal topic a publish to the queue's name goes to",
            "add <DefaultPublishTarget>NAME</DefaultPublishTarget> with a topic the UnderlyingTopic matches",
        )
    elif underlying:
        # The reference's default: a publish to the queue's name enters the queue.
        values["default_publish_target"] = underlying

    values["lease_period_s"] = LEASE_PERIOD_DEFAULT_S
    if (n := kids.one("LeasePeriod")) is not None:
        values["lease_period_s"] = doc.duration(n)
    if (n := kids.one("Expiration")) is not None:
        values["expiration_s"] = doc.duration(n)
    for tag, attr in _POSITIVE_INTS.items():
        if (n := kids.one(tag)) is not None:
            values[attr] = doc.positive_int(n)
    for tag, attr in _LIMITS_ZERO_UNLIMITED.items():
        if (n := kids.one(tag)) is not None and doc.text(n) != "0":
            values[attr] = doc.positive_int(n)
    for tag, attr in _TEXTS.items():
        if (n := kids.one(tag)) is not None:
            values[attr] = doc.text(n)
    if (n := kids.one("Leasing")) is not None:
        values["leasing"] = doc.choice(n, _LEASING)
    if (n := kids.one("RecoveryPoint")) is not None:
        values["recovery_point"] = _recovery_point(doc, n)
    if (n := kids.one("DeferredAckExpiration")) is not None:
        values["deferred_ack_expiration_s"] = doc.duration(n)
    if (n := kids.one("FileBackedMetadata")) is not None:
        values["file_backed_metadata"] = doc.choice(n, _FILE_BACKED)
    if (n := kids.one("RetryBackoff")) is not None:
        values["retry_backoff_s"] = _retry_backoff(doc, n)

    _check_target_queue_depth(doc, node, kids.one("TargetQueueDepth"), kids)
    _check_ordering_key(doc, node, kind, semantics, kids)
    _check_group_local(doc, node, kind, kids)
    return QueueConfig(**values)  # type: ignore[arg-type]


def _retry_backoff(doc: Document, node: Node) -> tuple[float, ...]:
    """``<RetryBackoff>1s,5s,30s</RetryBackoff>``: the delay before a cancelled message is
    offered again, by cancel count (the last one repeats); each a duration, 0 allowed."""
    out = []
    for i, part in enumerate(doc.text(node).split(",")):
        try:
            out.append(duration_s(part))
        except Invalid as exc:
            raise doc.error(node.path, f"<RetryBackoff> item {i + 1}: {exc.message}",
                            "give a comma list of durations, e.g. 1s,5s,30s") from None
    return tuple(out)


def _recovery_point(doc: Document, node: Node) -> str:
    """``epoch`` (the default), ``now``, ``creation``, a bookmark or a timestamp, as a
    subscription's bookmark takes them (see the module header)."""
    from conveyor.protocol.bookmarks import parse_replay_start

    text = doc.text(node)
    if text.lower() == "creation":
        return text
    try:
        parse_replay_start(text)
    except errors.BadBookmark as e:
        raise doc.error(node.path, f"RecoveryPoint {text!r}: {e}",
                        "write epoch, now, creation, a bookmark (publisher|seq|position) or a timestamp "
                        "YYYYMMDDTHHMMSS[Z]") from None
    return text


def _queue_name(doc: Document, queue: Node, name: Node | None, topic: Node | None) -> str:
    if name is not None and topic is not None:
        raise doc.error(
            topic.path,
            f"<{queue.tag}> has both <Name> and <Topic>",
            "<Topic> is accepted instead of <Name>; keep one of them",
        )
    chosen = name or topic
    if chosen is None:
        raise doc.error(
            queue.path,
            f"<{queue.tag}> is missing the required element <Name>",
            f"add <Name>...</Name> inside <{queue.tag}> (the topic consumers subscribe to)",
        )
    return topic_name(doc, chosen, regex_allowed=False)


def _fairness(doc: Document, node: Node | None, semantics: Semantics) -> Fairness:
    if node is None:
        if semantics is Semantics.AT_MOST_ONCE:
            return Fairness.ROUND_ROBIN
        return Fairness.PROPORTIONAL
    fairness = doc.enum(node, Fairness)
    if semantics is Semantics.AT_MOST_ONCE and fairness is not Fairness.ROUND_ROBIN:
        raise doc.error(
            node.path,
            f"FairnessModel {fairness.value!r} is not available for an at-most-once queue",
            "at-most-once queues support only round-robin: remove <FairnessModel> or "
            "write round-robin",
        )
    return fairness


def _check_target_queue_depth(doc: Document, queue: Node, depth: Node | None, kids) -> None:
    if depth is None:
        return
    for tag in ("Priority", "BarrierExpression"):
        if tag in kids:
            raise doc.error(
                depth.path,
                f"<TargetQueueDepth> cannot be combined with <{tag}>",
                f"remove <TargetQueueDepth> or <{tag}> from this queue",
            )


#: What a queue with an OrderingKey cannot have, and why (docs/queues.md, "Per-key ordering").
_NOT_WITH_ORDERING_KEY = {
    "TargetQueueDepth": "an inactive message has no queue state, so its key could not hold it back",
    "FileBackedMetadata": "a paged queue's snapshot does not carry the messages' keys",
}


def _check_ordering_key(doc: Document, queue: Node, kind: QueueKind, semantics: Semantics, kids) -> None:
    """``OrderingKey`` compiles as an expression, ``MaxInFlightPerKey`` needs it, and
    the combinations per-key ordering cannot honour are refused."""
    from conveyor import expr

    key = kids.one("OrderingKey")
    if key is None:
        if (n := kids.one("MaxInFlightPerKey")) is not None:
            raise doc.error(n.path, "<MaxInFlightPerKey> needs an <OrderingKey>",
                            "add <OrderingKey>/field</OrderingKey> naming the key, or remove <MaxInFlightPerKey>")
        return
    try:
        expr.compile(doc.text(key))
    except expr.ExpressionError as exc:
        raise doc.error(key.path, f"invalid <OrderingKey>: {exc}",
                        "write a field path such as /customer, or an expression over the message") from None
    if semantics is Semantics.AT_MOST_ONCE:
        raise doc.error(key.path, "<OrderingKey> needs an at-least-once queue: an at-most-once delivery is done "
                                  "when it is sent, so there is nothing in flight to order",
                        "remove <OrderingKey>, or make the queue at-least-once")
    if kind is QueueKind.GROUP_LOCAL:
        raise doc.error(key.path, f"<OrderingKey> is not available on a <{queue.tag}>: ordering is kept by the "
                                  "instance that delivers, and a replicated queue's messages move between instances",
                        "declare the queue with <Queue> or <LocalQueue>, not replicated")
    for tag, why in _NOT_WITH_ORDERING_KEY.items():
        n = kids.one(tag)
        if n is not None and (tag != "FileBackedMetadata" or doc.choice(n, _FILE_BACKED)):
            raise doc.error(n.path, f"<{tag}> cannot be combined with <OrderingKey>: {why}",
                            f"remove <{tag}> or <OrderingKey> from this queue")


def _check_group_local(doc: Document, queue: Node, kind: QueueKind, kids) -> None:
    if kind is QueueKind.GROUP_LOCAL:
        if "InitialOwner" not in kids:
            raise doc.error(
                queue.path,
                "<GroupLocalQueue> is missing the required element <InitialOwner>",
                "add <InitialOwner>instance name</InitialOwner>: the instance that owns "
                "each message when it enters the queue (the same on every host)",
            )
        return
    for tag in ("InitialOwner", "GroupLocalQueueDomain"):
        if (n := kids.one(tag)) is not None:
            raise doc.error(
                n.path,
                f"<{tag}> is only allowed on a <GroupLocalQueue>, not on <{queue.tag}>",
                f"declare the queue with <GroupLocalQueue>, or remove <{tag}>",
            )
