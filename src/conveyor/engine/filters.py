"""Compiling filter text once, for every engine module that takes a filter."""

from __future__ import annotations


def compile_filter(text: str | None):
    """The compiled expression, or None for no filter (raises BadFilter)."""
    if not text:
        return None
    from conveyor.expr import compile as compile_expr  # the expression language

    return compile_expr(text)
