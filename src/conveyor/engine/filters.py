"""Compiling filter text once, for every engine part that takes a filter, and what
filters may cost together.

The expression language bounds the work of ONE evaluation of ONE filter (a filter with
LIKE patterns that need the regex engine: about 0.2 s at worst, ``regex_cost_ticks_max``
ticks; any other: microseconds). Nothing bounded their sum: a hundred subscriptions with
the accepted filter ``/a LIKE '(a|b)*c'`` cost 20 s per message. So the filters of one
connection together may cost at most :data:`FILTER_COST_TICKS_PER_CONNECTION_MAX` ticks
per message: a subscription (or a replace) that would pass it is refused with
``BadFilter``, saying so. (It counts the filters clients give: an entitlement filter is
the operator's, and trusted.)

**Entitlement filters** (engine/entitlements.py rule 6): :func:`entitled` ANDs a user's
entitlement filter into the filter of a subscription or query when it starts, as one
compiled expression (:class:`EntitledFilter`, which keeps the client's own part for a
replace or a reload); :func:`per_name` does it per topic for a regex subscription;
:func:`any_of` ORs the filters of several grants. Both kinds are cached, so equal
inputs give the same object.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Mapping

from conveyor import errors
from conveyor.expr import Expression, ExpressionError
from conveyor.expr import compile as compile_expr
from conveyor.expr.limits import regex_cost_ticks_max
from conveyor.expr.nodes import And, Field, Like, Node, Or, walk
from conveyor.expr.regex import is_plain_text

#: What one syntax-tree node costs in the ticks of the regex cost model (about 1.2e9
#: per second): a Python call or two, about 0.2 µs.
FILTER_NODE_TICKS = 250
#: Worst-case work of one message through every filter of one connection: four filters
#: that use the regex engine (about 0.8 s together) and 10,000 nodes of other filters.
FILTER_COST_TICKS_PER_CONNECTION_MAX = 4 * regex_cost_ticks_max + 10_000 * FILTER_NODE_TICKS


def compile_filter(text: str | None) -> Expression | None:
    """The compiled expression, or None for no filter (raises BadFilter)."""
    if not text:
        return None
    return compile_expr(text)


def filter_cost_ticks(expr: Expression | None) -> int:
    """The worst-case work of one evaluation of ``expr``: the expression's regex budget
    when one of its LIKE patterns needs the regex engine (the budget covers the whole
    evaluation, expr/regex.py), else its nodes."""
    if expr is None:
        return 0
    nodes = list(walk(expr.tree))
    if any(isinstance(n, Like) and not is_plain_text(n.pattern) for n in nodes):
        return regex_cost_ticks_max
    return FILTER_NODE_TICKS * len(nodes)


def check_connection_filters(others: list[Expression | None], new: Expression | None) -> None:
    """Refuse ``new`` when it and the connection's ``others`` would together cost more
    than FILTER_COST_TICKS_PER_CONNECTION_MAX per message."""
    cost = filter_cost_ticks(new)
    if cost == 0:
        return
    total = cost + sum(filter_cost_ticks(f) for f in others)
    if total > FILTER_COST_TICKS_PER_CONNECTION_MAX:
        raise errors.BadFilter(
            f"the filters of this connection would cost up to {total / 1.2e9:.2f} s per message together "
            f"(worst case), over the limit of {FILTER_COST_TICKS_PER_CONNECTION_MAX / 1.2e9:.2f} s: "
            "LIKE patterns that need the regex engine count most; use fewer, or plain text patterns"
        )


# --- entitlement filters (engine/entitlements.py rule 6) ------------------------------------


class _Built(Expression):
    """An expression put together from others (not parsed from text): its parts' text,
    tree and compiled functions."""

    __slots__ = ()

    def __init__(self, source: str, tree: Node, matches: Callable[..., bool],
                 evaluate: Callable[..., Any] | None = None, python: str = "") -> None:
        fields = [n for n in walk(tree) if isinstance(n, Field)]
        self.source, self.tree, self.python = source, tree, python
        self.fields = frozenset(n.path for n in fields)
        self.paths = frozenset(tuple(s for s in n.steps if isinstance(s, str)) for n in fields)
        self.matches = matches
        self.evaluate = evaluate if evaluate is not None else matches


class EntitledFilter(_Built):
    """What a subscription or query of a user with an entitlement filter gets: its own
    filter (``own``, None: none) AND the entitlement filter on the name (``entitlement``).
    Compiled as one expression (one call per message, as any filter), so the cost is the
    existing per-subscription evaluation; ``own`` is kept for a reload and a replace."""

    __slots__ = ("own", "entitlement")

    def __init__(self, own: Expression | None, entitlement: Expression, source: str, tree: Node,
                 matches: Callable[..., bool], evaluate: Callable[..., Any] | None = None, python: str = "") -> None:
        super().__init__(source, tree, matches, evaluate, python)
        self.own = own
        self.entitlement = entitlement


def own_filter(flt: Expression | None) -> Expression | None:
    """The filter the client gave, without its entitlement part."""
    return flt.own if isinstance(flt, EntitledFilter) else flt


def entitled(own: Expression | None, entitlement: Expression | None) -> Expression | None:
    """``own`` AND ``entitlement`` (None: no entitlement filter, ``own`` as it is)."""
    if entitlement is None:
        return own
    return _conjoin(own_filter(own), entitlement)


@lru_cache(maxsize=4096)
def _conjoin(own: Expression | None, entitlement: Expression) -> EntitledFilter:
    if own is None:
        e = entitlement
        return EntitledFilter(None, e, e.source, e.tree, e.matches, e.evaluate, e.python)
    source = f"({own.source}) AND ({entitlement.source})"
    tree = And((own.tree, entitlement.tree), 0)
    try:
        c = Expression(source, tree)
    except ExpressionError:  # too big for one function (LIKE count, nesting): two calls
        return EntitledFilter(own, entitlement, source, tree, _all_of(own.matches, entitlement.matches))
    return EntitledFilter(own, entitlement, source, tree, c.matches, c.evaluate, c.python)


def any_of(filters: tuple[Expression, ...]) -> Expression:
    """One filter that matches when any of ``filters`` does (grants add up: OR)."""
    if len(filters) == 1:
        return filters[0]
    return _disjoin(tuple(sorted(set(filters), key=lambda f: f.source)))


@lru_cache(maxsize=4096)
def _disjoin(filters: tuple[Expression, ...]) -> Expression:
    if len(filters) == 1:
        return filters[0]
    source = " OR ".join(f"({f.source})" for f in filters)
    tree = Or(tuple(f.tree for f in filters), 0)
    try:
        return Expression(source, tree)
    except ExpressionError:  # too big for one function: one call each
        parts = tuple(f.matches for f in filters)

        def matches(data: Any, meta: Mapping[str, Any] | None = None) -> bool:
            return any(p(data, meta) for p in parts)
        return _Built(source, tree, matches)


def per_name(own: Expression | None, resolve: Callable[[str], Expression | None],
             possible: tuple[Expression, ...]) -> EntitledFilter:
    """A filter whose entitlement part depends on the message's topic (a regex
    subscription, a replay of queues): ``resolve(topic)`` (None: not filtered; cached by
    the caller) AND ``own``. ``possible``: every entitlement filter it may resolve to,
    for the worst-case cost (:func:`filter_cost_ticks`) and the text shown."""
    parts = any_of(possible) if possible else _EVERYTHING
    shown = f"(the entitlement filter of each topic: {parts.source})"
    tree = parts.tree if own is None else And((own.tree, parts.tree), 0)
    own_matches = own.matches if own is not None else None

    def matches(data: Any, meta: Mapping[str, Any] | None = None) -> bool:
        if meta is None:
            return False  # no topic, no decision: fail closed
        ent = resolve(meta["topic"])
        if ent is not None and not ent.matches(data, meta):
            return False
        return own_matches is None or own_matches(data, meta)

    return EntitledFilter(own, parts, shown if own is None else f"({own.source}) AND {shown}", tree, matches)


def _all_of(*parts: Callable[..., bool]) -> Callable[..., bool]:
    def matches(data: Any, meta: Mapping[str, Any] | None = None) -> bool:
        return all(p(data, meta) for p in parts)
    return matches


#: The entitlement part of a per-name filter whose names carry none.
_EVERYTHING = compile_expr("TRUE")
