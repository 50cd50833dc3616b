"""Compiling filter text once, for every engine part that takes a filter."""

from __future__ import annotations

from conveyor.expr import Expression
from conveyor.expr import compile as compile_expr


def compile_filter(text: str | None) -> Expression | None:
    """The compiled expression, or None for no filter (raises BadFilter)."""
    if not text:
        return None
    return compile_expr(text)
