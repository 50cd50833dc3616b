"""The public face of the package: ``compile(source) -> Expression``.

Rules kept here:
- ``compile`` parses once and compiles once; results are cached by source text
  (LRU, limits.compile_cache_entries_max entries). Errors are not cached.
- An Expression is immutable and safe to share between subscriptions and threads.
- ``matches`` and ``evaluate`` are the generated functions themselves, stored on the
  instance, so a call costs one Python call and nothing more.
- ``matches`` is True only when the result is TRUE: FALSE, UNKNOWN (NULL) and any
  non-boolean result that is not a non-zero number give False.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Mapping

from .compiler import compile_tree
from .errors import ExpressionError
from .limits import compile_cache_entries_max
from .nodes import Field, Node, walk
from .parser import parse
from .values import priority_key


class Expression:
    """A compiled filter or priority expression.

    Attributes:
        source: the text it was compiled from.
        fields: the field paths it reads, as ``/a/b`` strings (subscripts left out).
        paths: the same as tuples of step names, exact even when names hold ``/``.
        tree: the syntax tree (nodes.py).
        python: the generated Python source, for debugging.
        matches(data, meta=None) -> bool: True only when the expression is TRUE.
        evaluate(data, meta=None) -> value: None (NULL/UNKNOWN), bool, int, float, str,
            or the raw list/dict of a field.
    """

    __slots__ = ("source", "fields", "paths", "tree", "python", "matches", "evaluate")

    source: str
    fields: frozenset[str]
    paths: frozenset[tuple[str, ...]]
    tree: Node
    python: str
    matches: Callable[..., bool]
    evaluate: Callable[..., Any]

    def __init__(self, source: str, tree: Node) -> None:
        compiled = compile_tree(tree)
        field_nodes = [n for n in walk(tree) if isinstance(n, Field)]
        self.source = source
        self.tree = tree
        self.fields = frozenset(n.path for n in field_nodes)
        self.paths = frozenset(tuple(s for s in n.steps if isinstance(s, str)) for n in field_nodes)
        self.python = compiled.python
        self.matches = compiled.matches
        self.evaluate = compiled.evaluate

    def priority(self, data: Any, meta: Mapping[str, Any] | None = None) -> int:
        """The result as a queue priority (see priority_key): higher is delivered first."""
        return priority_key(self.evaluate(data, meta))

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


@lru_cache(maxsize=compile_cache_entries_max)
def _compile_cached(source: str) -> Expression:
    return Expression(source, parse(source))


def compile(source: str) -> Expression:  # noqa: A001 - the name the API promises
    """Parse and compile a filter; raise ExpressionError (a BadFilter) if it is not one."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExpressionError("expression is not valid UTF-8", exc.start, "") from None
    if not isinstance(source, str):
        raise ExpressionError(f"expression must be text, not {type(source).__name__}", 0, "")
    return _compile_cached(source)
