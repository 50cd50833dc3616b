"""The start-up validation: what ``conveyor serve`` refuses about a loaded configuration
before it touches the disk or the network, and what ``conveyor config check`` runs too.

:func:`validate` is the one function both call (``Server.__init__`` and
``cli/config_cmd.py``), so ``config check`` accepts exactly what ``serve`` starts with
and refuses the rest with the same message. It raises the first problem as a
:class:`~conveyor.errors.ConfigError` naming the element path. In order:

1. Settings this version reads but does not carry out (config/unsupported.py).
2. Each queue, in order, as the engine builds it: ``Filter``, ``Priority`` and
   ``BarrierExpression`` must compile; then the queue's own rules (at-most-once only
   with round-robin, ``TargetQueueDepth`` not with ``Priority`` or
   ``BarrierExpression``, numeric limits).
3. Each SOW topic's ``Key`` paths must compile.
4. Each view, in order: its projection and grouping must compile, and in a view over
   joins every field must name a joined topic (``[T].[/path]``); its ``Filter``
   must compile.
5. Each conflated topic's ``Filter`` must compile (config/sow.py).

The rules that tie sections together (config/rules.py) ran when the file was loaded,
for both commands alike. What needs the machine (a listening address in use, TLS and
users files, the journal directory's lock) is checked by ``serve`` only, after this;
what needs a replication peer's configuration is checked at each handshake
(engine/replication/checks.py).

The engine builds its parts with these same functions (``Queue`` calls
:func:`check_queue`, the view graph :func:`check_view`), so an engine built without
``validate`` (the tests', the simulations') refuses the same configurations.
"""

from __future__ import annotations

import math
import re
from typing import cast

from conveyor import expr
from conveyor.config.model import Config, Fairness, QueueConfig, Semantics, SowTopicConfig, ViewConfig
from conveyor.config.sow import check_conflated_topics
from conveyor.config.unsupported import refuse_unsupported
from conveyor.errors import BadFilter, ConfigError
from conveyor.expr.nodes import Field, walk
from conveyor.expr.parser import parse
from conveyor.expr.projection import Projection, split_as

__all__ = ["check_queue", "check_sow_topic", "check_view", "rewrite_identifiers", "unknown_roots", "validate"]


def validate(config: Config) -> None:
    """Refuse ``config`` as ``conveyor serve`` would before starting the engine (the
    module header lists the rules); ConfigError with the element path."""
    refuse_unsupported(config)  # nothing configured is silently ignored
    for queue in config.queues:
        check_queue(queue)
    for topic in config.sow_topics:
        check_sow_topic(topic)
    for view in config.views:
        check_view(view)
    check_conflated_topics(config.conflated_topics)  # 5. each conflated topic's Filter compiles


def check_queue(config: QueueConfig) -> None:
    """Rule 2: the queue's expressions compile and its own rules hold."""
    for element, text in (("Filter", config.filter), ("Priority", config.priority),
                          ("BarrierExpression", config.barrier_expression)):
        if not text:
            continue
        try:
            expr.compile(text)
        except BadFilter as exc:
            raise ConfigError(f"invalid {element}: {exc}", path=f"{config.path}/{element}") from None

    def bad(message: str, hint: str = "") -> ConfigError:
        return ConfigError(f"queue {config.name!r}: {message}", path=config.path, hint=hint)

    if config.semantics is Semantics.AT_MOST_ONCE and config.fairness is not Fairness.ROUND_ROBIN:
        raise bad(
            f"FairnessModel {config.fairness.value} is not allowed for at-most-once",
            "at-most-once queues support only round-robin (spec 000, Delivery Fairness)",
        )
    for name, text in (("Priority", config.priority), ("BarrierExpression", config.barrier_expression)):
        if text is not None and config.target_queue_depth is not None:
            raise bad(
                f"TargetQueueDepth cannot be combined with {name}",
                f"remove <TargetQueueDepth> or <{name}> (spec 000, Limiting Currently "
                "Deliverable Messages)",
            )
    if config.target_queue_depth is not None and config.target_queue_depth < 1:
        raise bad(f"TargetQueueDepth must be >= 1, not {config.target_queue_depth}")
    if config.lease_period_s < 0 or math.isnan(config.lease_period_s):
        raise bad(f"LeasePeriod must be >= 0, not {config.lease_period_s}")
    if config.expiration_s is not None and not config.expiration_s >= 0:
        raise bad(f"Expiration must be >= 0, not {config.expiration_s}")
    for name, value in (("MaxCancels", config.max_cancels), ("MaxDeliveries", config.max_deliveries)):
        if value is not None and value < 1:
            raise bad(f"{name} must be >= 1, not {value}")


def check_sow_topic(topic: SowTopicConfig) -> None:
    """Rule 3: each ``Key`` compiles (the loader checked that it is a field path)."""
    for key in topic.keys:
        try:
            expr.compile(key)
        except expr.ExpressionError as exc:
            raise ConfigError(f"SOW topic {topic.name!r}: invalid Key {key!r}: {exc}",
                              path=f"{topic.path}/Key", hint="a Key is a field path, as in /order/id") from None


def check_view(vc: ViewConfig) -> None:
    """Rule 4, in the order the engine builds the view (engine/sow/views.py)."""
    fields, grouping = vc.projection, vc.grouping
    if vc.joins:
        fields = tuple(rewrite_identifiers(f) for f in vc.projection)
        grouping = tuple(rewrite_identifiers(g) for g in vc.grouping)
        for section, texts, originals in (("Projection", fields, vc.projection), ("Grouping", grouping, vc.grouping)):
            for text, original in zip(texts, originals):
                try:
                    stray = unknown_roots(text, vc.underlying)
                except expr.ExpressionError as exc:
                    raise _bad_projection(vc, exc) from None
                if stray:
                    raise ConfigError(
                        f"view {vc.name!r}: field {original!r} of a join names no joined topic ({', '.join(stray)})",
                        path=f"{vc.path}/{section}",
                        hint=" or ".join(f"[{t}].[/path]" for t in vc.underlying).join(("write ", "")),
                    )
    try:
        Projection(fields, grouping)
    except expr.ExpressionError as exc:
        raise _bad_projection(vc, exc) from None
    if vc.filter and not vc.joins:
        try:
            expr.compile(vc.filter)
        except expr.ExpressionError as exc:
            raise ConfigError(f"view {vc.name!r}: invalid Filter: {exc}", path=f"{vc.path}/Filter") from None


def _bad_projection(vc: ViewConfig, exc: expr.ExpressionError) -> ConfigError:
    return ConfigError(f"view {vc.name!r}: invalid projection or grouping: {exc}", path=f"{vc.path}/Projection")


# A view over joins names a joined topic's field ``[type].[topic].[/path]`` or
# ``[topic].[/path]``, which is the path ``/topic/path`` of a joined row (engine/sow/joins.py,
# rule 3, which uses this rewriting), outside string literals.
_IDENTIFIER = re.compile(
    r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
    r"|(?:\[[^\[\]/]+\]\.)?\[(?P<topic>[^\[\]/]+)\]\.\[(?P<path>/[^\[\]]+)\]"
)


def rewrite_identifiers(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return cast(str, m.group(1))  # a string literal stays as it is
        return f"[/{m.group('topic')}]{m.group('path')}"

    return _IDENTIFIER.sub(one, text)


def unknown_roots(field: str, topics: tuple[str, ...]) -> list[str]:
    """The field paths of a (rewritten) field, its ``AS`` path aside, that do not start
    with one of the joined ``topics``."""
    text, _ = split_as(field)
    return ["/" + "/".join(map(str, n.steps)) for n in walk(parse(text))
            if isinstance(n, Field) and n.steps and n.steps[0] not in topics]
