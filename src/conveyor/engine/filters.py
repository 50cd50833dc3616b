"""Compiling filter text once, for every engine part that takes a filter, and what
filters may cost together.

The expression language bounds the work of ONE evaluation of ONE filter (a filter with
LIKE patterns that need the regex engine: about 0.2 s at worst, ``regex_cost_ticks_max``
ticks; any other: microseconds). Nothing bounded their sum: a hundred subscriptions with
the accepted filter ``/a LIKE '(a|b)*c'`` cost 20 s per message. So the filters of one
connection together may cost at most :data:`FILTER_COST_TICKS_PER_CONNECTION_MAX` ticks
per message: a subscription (or a replace) that would pass it is refused with
``BadFilter``, saying so.
"""

from __future__ import annotations

from conveyor import errors
from conveyor.expr import Expression
from conveyor.expr import compile as compile_expr
from conveyor.expr.limits import regex_cost_ticks_max
from conveyor.expr.nodes import Like, walk
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
