"""``<SOW>``: State of the World topics and views (reference G.1, G.2).

Rules kept here (those that need the transaction log live in :mod:`conveyor.config.rules`):

- ``Topic`` (synonym ``TopicDefinition``) declares a SOW topic: ``Name`` (or ``Topic``
  instead, not both), ``MessageType`` (``json``: conveyor's records are JSON), zero or
  more ``Key`` field paths (none: publishers give the key in ``sow_key``), ``KeyDomain``,
  ``Expiration`` (an interval, or ``enabled``: only publishes carrying an expiration
  expire), ``Durability`` (``persistent`` only: the store is the transaction log) and
  ``FileName`` (accepted for compatibility; nothing is written there).
  ``KeyGenerator``, ``Index``, ``HashIndex``, ``History``, ``Preprocessing``,
  ``Enrichment``, ``Pattern``, ``RecoveryPoint`` and ``SlabSize`` are refused by name.
- ``View`` (synonym ``ViewDefinition``): ``Name``, ``MessageType`` (``json``),
  ``UnderlyingTopic`` (one name, or ``Join`` children ``[A].[/f]=[B].[/g]``), one or more
  ``Projection/Field`` and ``Grouping/Field``, ``Filter`` (single underlying topic only),
  ``Conflation`` (``none`` or ``inline``), ``KeyDomain``, ``JoinNullEquivalency``. The
  expressions stay text: the engine compiles them and reports errors with the path.
- A view's underlying topics are checked against what is declared *before* it in
  ``<SOW>`` by :func:`check_sow_order` (names, not regexes); a view over a conflated
  topic is refused.
- ``ConflatedTopic`` (synonym ``ReplicaDefinition``): ``Name``, ``UnderlyingTopic`` (the
  exact name of a SOW topic, view or conflated topic declared before it),
  ``MessageType`` (the underlying's: ``json``), ``Interval`` (default 5s, at least
  100ms), ``Filter`` (text, compiled by :func:`check_conflated_topics`). ``HashIndex``
  and ``TopicFormat`` are refused by name.
"""

from __future__ import annotations

import re

from conveyor import expr
from conveyor.config.model import (CONFLATED_INTERVAL_S_MIN, ConflatedTopicConfig, JoinConfig, SowTopicConfig,
                                   ViewConfig, is_regex_topic)
from conveyor.config.tree import MANY, OPTIONAL, REQUIRED, REQUIRED_MANY, Document, Node
from conveyor.errors import ConfigError

_TOPIC = {
    "Name": OPTIONAL,
    "Topic": OPTIONAL,
    "MessageType": REQUIRED,
    "Key": MANY,
    "KeyDomain": OPTIONAL,
    "FileName": OPTIONAL,
    "Durability": OPTIONAL,
    "Expiration": OPTIONAL,
}
_TOPIC_REFUSED = {
    "KeyGenerator": "custom key modules are not supported: give the key fields with <Key>, or let "
                    "publishers send sow_key",
    "Index": "query indexes are not supported: queries scan the topic's records",
    "HashIndex": "query indexes are not supported: queries scan the topic's records",
    "History": "historical (point-in-time) queries are not supported: remove <History>",
    "Preprocessing": "preprocessing is not supported: publish the final message",
    "Enrichment": "enrichment is not supported: publish the final message",
    "Pattern": "pattern (regex) SOW topics are not supported: declare one <Topic> per name",
    "RecoveryPoint": "SOW topics are always rebuilt from the transaction log: remove <RecoveryPoint>",
    "SlabSize": "conveyor keeps SOW records in memory as positions in the log: remove <SlabSize>",
}
_VIEW = {
    "Name": OPTIONAL,
    "Topic": OPTIONAL,
    "MessageType": REQUIRED,
    "UnderlyingTopic": REQUIRED,
    "Projection": REQUIRED,
    "Grouping": REQUIRED,
    "Filter": OPTIONAL,
    "Conflation": OPTIONAL,
    "KeyDomain": OPTIONAL,
    "JoinNullEquivalency": OPTIONAL,
}
_VIEW_REFUSED = {
    "HashIndex": "query indexes are not supported: queries scan the view's records",
}
_CONFLATED = {
    "Name": OPTIONAL,
    "Topic": OPTIONAL,
    "UnderlyingTopic": REQUIRED,
    "MessageType": REQUIRED,
    "Interval": OPTIONAL,
    "Filter": OPTIONAL,
}
_CONFLATED_REFUSED = {
    "HashIndex": "query indexes are not supported: queries scan the conflated topic's records",
    "TopicFormat": "pattern conflated topics are not supported: declare one <ConflatedTopic> per underlying topic",
}
#: The kinds of declaration a conflated topic may be over (read_sow's names), and their
#: message type: conveyor's SOW topics and views hold json.
_CONFLATABLE = {"topic": "SOW topic", "view": "view", "conflated": "conflated topic"}
_SOW_MESSAGE_TYPE = "json"
_FIELDS = {"Field": REQUIRED_MANY}
_JOINS = {"Join": REQUIRED_MANY}
_DURABILITY = {"persistent": "persistent", "transient": "transient"}
_CONFLATION = {"none": "none", "inline": "inline"}
_ON_OFF = {"enabled": True, "disabled": False, "true": True, "false": False}
_KEY_PATH = re.compile(r"(/[^/\s\[\]]+)+")
_BRACKETED_TOPIC = re.compile(r"\[(?P<type>[^\[\]]+)\]\.\[(?P<name>[^\[\]]+)\]")
_JOIN_SIDE = r"(?:\[(?P<{p}type>[^\[\]]+)\]\.)?\[(?P<{p}topic>[^\[\]]+)\]\.\[(?P<{p}field>/[^\[\]]+)\]"
_JOIN = re.compile(r"\s*" + _JOIN_SIDE.format(p="l") + r"\s*=\s*" + _JOIN_SIDE.format(p="r") + r"\s*")


def read_topic(doc: Document, node: Node) -> SowTopicConfig:
    kids = doc.children(node, _TOPIC, refused=_TOPIC_REFUSED)
    values: dict[str, object] = {"path": node.path}
    values["name"] = _name(doc, node, kids.one("Name"), kids.one("Topic"))
    values["message_type"] = _json_type(doc, kids.one("MessageType"))
    keys = []
    for key in kids.many("Key"):
        text = doc.text(key)
        if not _KEY_PATH.fullmatch(text):
            raise doc.error(key.path, f"<Key> must be a field path such as /orderId, not {text!r}",
                            "write the path of a field of the message: /id, /client/id")
        keys.append(text)
    values["keys"] = tuple(keys)
    if (n := kids.one("KeyDomain")) is not None:
        values["key_domain"] = doc.text(n)
    if (n := kids.one("FileName")) is not None:
        values["file_name"] = doc.text(n)
    if (n := kids.one("Durability")) is not None and doc.choice(n, _DURABILITY) == "transient":
        raise doc.error(n.path, "transient SOW topics are not supported",
                        "conveyor builds every SOW topic from the transaction log: remove <Durability> "
                        "(the default is persistent)")
    if (n := kids.one("Expiration")) is not None:
        values["expiration"] = True
        if doc.text(n).lower() != "enabled":
            values["expiration_s"] = doc.duration(n)
    return SowTopicConfig(**values)  # type: ignore[arg-type]


def read_view(doc: Document, node: Node) -> ViewConfig:
    kids = doc.children(node, _VIEW, refused=_VIEW_REFUSED)
    values: dict[str, object] = {"path": node.path}
    values["name"] = _name(doc, node, kids.one("Name"), kids.one("Topic"))
    values["message_type"] = _json_type(doc, kids.one("MessageType"))
    under = kids.one("UnderlyingTopic")
    assert under is not None  # REQUIRED
    if under.children:
        joins = tuple(_join(doc, j) for j in doc.children(under, _JOINS).many("Join"))
        values["joins"] = joins
        values["underlying"] = _join_tree(doc, joins)
    else:
        values["underlying"] = (_underlying_name(doc, under),)
    for section, attr in (("Projection", "projection"), ("Grouping", "grouping")):
        part = kids.one(section)
        assert part is not None  # REQUIRED
        values[attr] = tuple(doc.text(f) for f in doc.children(part, _FIELDS).many("Field"))
    if (n := kids.one("Filter")) is not None:
        if "joins" in values:
            raise doc.error(n.path, "a view <Filter> applies to a single underlying topic, not to a join",
                            "remove <Filter>, or filter inside the projection with IF(...)")
        values["filter"] = doc.text(n)
    if (n := kids.one("Conflation")) is not None:
        values["conflation"] = doc.choice(n, _CONFLATION)
    if (n := kids.one("KeyDomain")) is not None:
        values["key_domain"] = doc.text(n)
    if (n := kids.one("JoinNullEquivalency")) is not None:
        values["join_null_equivalency"] = doc.choice(n, _ON_OFF)
    return ViewConfig(**values)  # type: ignore[arg-type]


def read_conflated_topic(doc: Document, node: Node, declared: dict[str, str]) -> ConflatedTopicConfig:
    """A ``ConflatedTopic`` over what is declared before it (``declared``: name -> kind,
    as :func:`check_sow_order` takes it)."""
    kids = doc.children(node, _CONFLATED, refused=_CONFLATED_REFUSED)
    values: dict[str, object] = {"path": node.path}
    name = values["name"] = _name(doc, node, kids.one("Name"), kids.one("Topic"))
    under = kids.one("UnderlyingTopic")
    assert under is not None  # REQUIRED
    underlying = values["underlying"] = doc.text(under)
    kind = declared.get(underlying)
    if kind not in _CONFLATABLE:
        known = ", ".join(n for n, k in declared.items() if k in _CONFLATABLE) or "none declared before it"
        what = "a queue" if kind == "queue" else "not declared before it"
        raise doc.error(under.path, f"conflated topic {name!r}: its underlying topic {underlying!r} is {what}: a "
                        "conflated topic is over a SOW topic, a view or a conflated topic declared before it",
                        f"write the exact name of one declared earlier in <SOW> (declared before it: {known})")
    message_type = kids.one("MessageType")
    assert message_type is not None  # REQUIRED
    values["message_type"] = doc.text(message_type)
    if values["message_type"] != _SOW_MESSAGE_TYPE:
        raise doc.error(message_type.path, f"conflated topic {name!r}: MessageType {values['message_type']!r} differs "
                        f"from that of its underlying {_CONFLATABLE[kind]} {underlying!r} ({_SOW_MESSAGE_TYPE})",
                        f"write <MessageType>{_SOW_MESSAGE_TYPE}</MessageType>: a conflated topic keeps the "
                        "messages of its underlying topic")
    if (n := kids.one("Interval")) is not None:
        interval = values["interval_s"] = doc.duration(n)
        if interval < CONFLATED_INTERVAL_S_MIN - 1e-9:
            raise doc.error(n.path, f"conflated topic {name!r}: Interval {doc.text(n)} is shorter than the minimum, "
                            "100ms", "give an interval of at least 100ms (the default is 5s)")
    if (n := kids.one("Filter")) is not None:
        values["filter"] = doc.text(n)
    return ConflatedTopicConfig(**values)  # type: ignore[arg-type]


def check_conflated_topics(configs: tuple[ConflatedTopicConfig, ...]) -> None:
    """Each conflated topic's ``Filter`` compiles (config/validation.py; the engine
    builds them with this too)."""
    for ct in configs:
        if ct.filter:
            try:
                expr.compile(ct.filter)
            except expr.ExpressionError as exc:
                raise ConfigError(f"conflated topic {ct.name!r}: invalid Filter: {exc}",
                                  path=f"{ct.path}/Filter") from None


def check_sow_order(doc: Document, declared: dict[str, str], view: ViewConfig) -> None:
    """A view's underlying topics must be declared earlier in ``<SOW>`` (``declared``:
    name -> kind), not be conflated topics, and a queue may feed a view only alone (no
    join over a queue)."""
    for i, topic in enumerate(view.underlying):
        kind = declared.get(topic)
        where = f"{view.path}/UnderlyingTopic" if not view.joins else f"{view.path}/UnderlyingTopic/Join[{_join_of(view, topic)}]"
        if kind == "conflated":
            raise doc.error(where, f"view {view.name!r} is over conflated topic {topic!r}: a view over a conflated "
                            "topic is not supported", "make the view over the conflated topic's underlying topic")
        if kind is None:
            known = ", ".join(sorted(declared)) or "none declared before it"
            raise doc.error(
                where, f"view {view.name!r}: its underlying topic {topic!r} is not a SOW topic, view or queue "
                f"declared before it", f"declare {topic!r} earlier in <SOW> (declared before it: {known})",
            )
        if kind == "queue" and view.joins:
            raise doc.error(where, f"view {view.name!r} joins queue {topic!r}: a join is over SOW topics and views",
                            "make the view over the queue alone, or join the queue's underlying SOW topic")


def _join_of(view: ViewConfig, topic: str) -> int:
    for i, j in enumerate(view.joins, start=1):
        if topic in (j.left_topic, j.right_topic):
            return i
    return 1


def _join_tree(doc: Document, joins: tuple[JoinConfig, ...]) -> tuple[str, ...]:
    """The joined topics, the driving one (the first ``Join``'s left) first: each
    ``Join`` after the first joins a topic joined before it, on its left, to a new one,
    so that the joins form a tree under the driving topic (engine/sow/joins.py)."""
    topics = [joins[0].left_topic]
    for jc in joins:
        if jc.left_topic not in topics:
            hint = (f"write the topic joined before on the left: [{jc.right_topic}].[{jc.right_field}]="
                    f"[{jc.left_topic}].[{jc.left_field}]" if jc.right_topic in topics else
                    f"join {jc.left_topic!r} to one of {', '.join(topics)} in an earlier <Join>")
            raise doc.error(jc.path, f"<Join> joins {jc.left_topic!r} on its left, which no earlier <Join> "
                            f"joined: each <Join> after the first extends the join of {topics[0]!r} with "
                            "one new topic", hint)
        if jc.right_topic in topics:
            raise doc.error(jc.path, f"<Join> joins {jc.right_topic!r} a second time: a view joins each topic once",
                            "make a view over the join and join that view again, or drop this <Join>")
        topics.append(jc.right_topic)
    return tuple(topics)


def _join(doc: Document, node: Node) -> JoinConfig:
    text = doc.text(node)
    m = _JOIN.fullmatch(text)
    if m is None:
        raise doc.error(node.path, f"<Join> must read [topic].[/field]=[topic].[/field], not {text!r}",
                        "for example [orders].[/cust]=[customers].[/cust]")
    for side in ("l", "r"):
        kind = m.group(f"{side}type")
        if kind is not None and kind != "json":
            raise doc.error(node.path, f"<Join> names message type {kind!r}: conveyor's SOW topics are json",
                            "write [json].[topic].[/field], or leave the type out")
    if m.group("ltopic") == m.group("rtopic"):
        raise doc.error(node.path, "a <Join> joins two different topics", "name two topics")
    return JoinConfig(m.group("ltopic"), m.group("lfield"), m.group("rtopic"), m.group("rfield"), node.path)


def _underlying_name(doc: Document, node: Node) -> str:
    text = doc.text(node)
    m = _BRACKETED_TOPIC.fullmatch(text)
    if m is not None:
        if m.group("type") != "json":
            raise doc.error(node.path, f"{text!r} names message type {m.group('type')!r}: conveyor's SOW "
                            "topics are json", "write the topic name alone")
        text = m.group("name")
    if is_regex_topic(text):
        raise doc.error(node.path, f"a view's <UnderlyingTopic> must be a topic name, not a regular expression: "
                        f"{text!r}", "name one SOW topic, view or queue declared before the view")
    return text


def _name(doc: Document, node: Node, name: Node | None, topic: Node | None) -> str:
    if name is not None and topic is not None:
        raise doc.error(topic.path, f"<{node.tag}> has both <Name> and <Topic>",
                        "<Topic> is accepted instead of <Name>; keep one of them")
    chosen = name or topic
    if chosen is None:
        raise doc.error(node.path, f"<{node.tag}> is missing the required element <Name>",
                        f"add <Name>...</Name> inside <{node.tag}>")
    text = doc.text(chosen)
    if is_regex_topic(text):
        raise doc.error(chosen.path, f"<{chosen.tag}> must be a topic name, not a regular expression: {text!r}",
                        "use a literal name (pattern SOW topics are not supported)")
    return text


def _json_type(doc: Document, node: Node | None) -> str:
    assert node is not None  # REQUIRED
    text = doc.text(node)
    if text != "json":
        raise doc.error(node.path, f"MessageType {text!r} is not supported for SOW topics and views",
                        "conveyor's SOW topics and views hold json messages: write <MessageType>json</MessageType>")
    return text
