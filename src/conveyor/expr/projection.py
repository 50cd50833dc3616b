"""Projections: the ``Field`` list and ``Grouping`` of a view or an aggregated
subscription (reference G.2, G.4), compiled once into what an incremental view needs.

A projected field is ``<expression> [AS /out/path]``. Its expression may hold aggregate
calls (:mod:`.aggregates`), whose single argument holds none. The compiled form splits
each field into three kinds of leaves, replaced by placeholders in the tree that
computes the output value:

- ``#a<i>``: the result of aggregate ``i`` (its argument is evaluated per message);
- ``#g<k>``: the value of grouping field ``k``, for a field path outside aggregates
  that is a grouping field (the same in every message of the group);
- ``#f<j>``: any other field path outside aggregates: its value in the group's newest
  message (reference G.2: "the last message processed for that group"; here the newest
  by position, so the answer is the same after a restart and after removals).

Rules kept here:
- Without ``AS`` the expression must be a field path, and the output path is that path.
- Aggregates may not nest; a field needs no aggregate. ``UNIX_TIMESTAMP()`` is refused
  (reference G.3: non-deterministic functions are refused in views).
- Output values are scalars (an array projects as its first element, an object as
  NULL); a NULL value leaves its field out; ``AS /a/b`` builds nested objects.
- Errors are ExpressionError (a BadFilter) naming the field's text.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .aggregates import AGGREGATES
from .compiler import compile_tree
from .errors import ExpressionError
from .expression import Expression
from .lexer import tokenize
from .nodes import Call, Field, Node, walk
from .parser import parse
from .values import scalar

#: Functions whose value changes with the time of evaluation: a view must give the same
#: records live and after a restart.
NON_DETERMINISTIC = frozenset({"UNIX_TIMESTAMP"})


def _rewrite(node: Node, replace) -> Node:
    """``node`` with every subtree for which ``replace`` returns a node swapped for it."""
    swapped = replace(node)
    if swapped is not None:
        return swapped
    changes = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, tuple) and value and all(hasattr(v, "children") for v in value):
            new = tuple(_rewrite(v, replace) for v in value)
            if any(a is not b for a, b in zip(new, value)):
                changes[f.name] = new
        elif hasattr(value, "children") and f.name != "depth":
            new = _rewrite(value, replace)
            if new is not value:
                changes[f.name] = new
    return dataclasses.replace(node, **changes) if changes else node


def _placeholder(name: str, pos: int) -> Field:
    return Field((name,), pos)


def split_as(text: str) -> tuple[str, tuple[str, ...] | None]:
    """``expr AS /path`` -> (expr text, path steps); without AS, (text, None)."""
    tokens = list(tokenize(text))
    # the last three tokens: NAME AS, PATH, END
    if len(tokens) >= 3 and tokens[-3].kind == "NAME" and tokens[-3].value == "AS" and tokens[-2].kind == "PATH":
        steps = tokens[-2].value
        if not all(isinstance(s, str) for s in steps):
            raise ExpressionError("the AS path of a projected field takes no [n] subscript", tokens[-2].pos,
                                  tokens[-2].text)
        return text[: tokens[-3].pos], tuple(steps)
    for t in tokens:
        if t.kind == "NAME" and t.value == "AS":
            raise ExpressionError("AS must be followed by the output field path, at the end", t.pos, t.text)
    return text, None


def _check_deterministic(tree: Node) -> None:
    for n in walk(tree):
        if isinstance(n, Call) and n.name in NON_DETERMINISTIC:
            raise ExpressionError(f"{n.name}() is not deterministic: not allowed in a view or an aggregate",
                                  n.pos, n.name)


class ProjectedField:
    """One compiled ``Field``: its output path and the function computing its value from
    the placeholders (module header)."""

    __slots__ = ("source", "out_path", "evaluate", "python")

    def __init__(self, source: str, out_path: tuple[str, ...], tree: Node) -> None:
        compiled = compile_tree(tree)
        self.source = source
        self.out_path = out_path
        self.evaluate = compiled.evaluate
        self.python = compiled.python


class Projection:
    """A compiled projection and grouping (the module header).

    Per message, :meth:`member` gives ``(group key, aggregate arguments, reads)``; per
    group, :meth:`render` builds the output record from the aggregate results, the
    group key and the newest message's reads.
    """

    __slots__ = ("fields", "grouping", "group_paths", "aggregates", "arguments", "reads", "needs_newest",
                 "_outside")

    def __init__(self, fields: list[str] | tuple[str, ...], grouping: list[str] | tuple[str, ...]) -> None:
        if not fields:
            raise ExpressionError("a projection needs at least one field", 0, "")
        if not grouping:
            raise ExpressionError("a projection needs at least one grouping field", 0, "")
        self.grouping: tuple[Expression, ...] = tuple(_grouping(g) for g in grouping)
        # A grouping field that is a plain path can stand for the same path elsewhere.
        self.group_paths: dict[tuple, int] = {}
        for k, g in enumerate(self.grouping):
            if isinstance(g.tree, Field):
                self.group_paths.setdefault(g.tree.steps, k)
        self.aggregates: list[str] = []  # function name per aggregate placeholder
        self.arguments: list[Any] = []  # the argument's evaluate per aggregate
        self._outside: dict[tuple, int] = {}  # field steps -> read placeholder index
        self.reads: list[Any] = []  # per read placeholder: evaluate(data, meta)
        compiled = []
        seen_out: dict[tuple, str] = {}
        for text in fields:
            field = self._field(text)
            if field.out_path in seen_out:
                raise ExpressionError(f"two projected fields write {'/' + '/'.join(field.out_path)} "
                                      f"({seen_out[field.out_path]!r} and {text!r})", 0, text)
            seen_out[field.out_path] = text
            compiled.append(field)
        self.fields: tuple[ProjectedField, ...] = tuple(compiled)
        self.needs_newest = bool(self.reads)

    def _field(self, text: str) -> ProjectedField:
        expr_text, out_path = split_as(text)
        tree = parse(expr_text)
        _check_deterministic(tree)
        if out_path is None:
            if not isinstance(tree, Field) or not all(isinstance(s, str) for s in tree.steps):
                raise ExpressionError(f"projected field {text!r} needs AS /name (only a field path keeps its own)",
                                      0, text)
            out_path = tuple(tree.steps)

        def replace(node: Node):
            if isinstance(node, Call) and node.name in AGGREGATES:
                if len(node.args) != 1:
                    raise ExpressionError(f"{node.name} takes 1 argument, not {len(node.args)}", node.pos, node.name)
                (arg,) = node.args
                for inner in walk(arg):
                    if isinstance(inner, Call) and inner.name in AGGREGATES:
                        raise ExpressionError(f"aggregate {inner.name} inside aggregate {node.name}", inner.pos,
                                              inner.name)
                self.aggregates.append(node.name)
                self.arguments.append(compile_tree(arg).evaluate)
                return _placeholder(f"#a{len(self.aggregates) - 1}", node.pos)
            if isinstance(node, Field):
                k = self.group_paths.get(node.steps)
                if k is not None:
                    return _placeholder(f"#g{k}", node.pos)
                j = self._outside.get(node.steps)
                if j is None:
                    j = self._outside[node.steps] = len(self.reads)
                    self.reads.append(compile_tree(node).evaluate)
                return _placeholder(f"#f{j}", node.pos)
            return None

        return ProjectedField(text, out_path, _rewrite(tree, replace))

    def group_key(self, data: Any, meta: Any = None) -> tuple:
        return tuple(_key_value(g.evaluate(data, meta)) for g in self.grouping)

    def member(self, data: Any, meta: Any = None) -> tuple[tuple, tuple, tuple]:
        """What one message contributes: (group key, aggregate arguments, reads)."""
        key = tuple(_key_value(g.evaluate(data, meta)) for g in self.grouping)
        args = tuple(scalar(f(data, meta)) for f in self.arguments)
        reads = tuple(f(data, meta) for f in self.reads)
        return key, args, reads

    def render(self, key: tuple, results: list, reads: tuple | None) -> dict:
        """The output record of one group: its fields, NULL ones left out."""
        data: dict[str, Any] = {}
        for i, r in enumerate(results):
            data[f"#a{i}"] = r
        for k, v in enumerate(key):
            data[f"#g{k}"] = key_value(v)
        if reads is not None:
            for j, v in enumerate(reads):
                data[f"#f{j}"] = v
        out: dict[str, Any] = {}
        for field in self.fields:
            value = scalar(field.evaluate(data, None))
            if value is None:
                continue
            put_path(out, field.out_path, value)
        return out


def _grouping(text: str) -> Expression:
    tree = parse(text)
    _check_deterministic(tree)
    for n in walk(tree):
        if isinstance(n, Call) and n.name in AGGREGATES:
            raise ExpressionError(f"aggregate {n.name} in a grouping field", n.pos, n.name)
    return Expression(text, tree)


def _key_value(value: Any) -> Any:
    """A grouping value: a scalar (NULL for objects and empty text); booleans stay apart
    from the numbers 1 and 0, floats equal to integers group with them."""
    v = scalar(value)
    if type(v) is bool:
        return ("bool", v)
    return v


def key_value(value: Any) -> Any:
    """The grouping value as it appears in output (the inverse of the bool wrapping)."""
    if type(value) is tuple:
        return value[1]
    return value


def put_path(out: dict, path: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``path`` in ``out``, making the objects on the way."""
    node = out
    for step in path[:-1]:
        nxt = node.get(step)
        if not isinstance(nxt, dict):
            nxt = node[step] = {}
        node = nxt
    node[path[-1]] = value
