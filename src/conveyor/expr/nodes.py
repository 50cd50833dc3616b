"""The syntax tree: frozen dataclasses, one per construct of the language.

Rules kept here:
- Nodes are immutable and hold no behaviour beyond listing their children; the
  compiler (compiler.py) and the tests' reference evaluator walk them.
- Every node keeps ``pos``, the 0-based source offset of the token that names it
  (the operator, the function name, the first character of a literal or field), so a
  later stage can report an error at the right place.
- ``depth`` is the height of the subtree, filled in by the parser, which refuses trees
  deeper than limits.nesting_depth_max. It takes no part in equality.
- Literal values are already in runtime form: None for NULL (and for ''), bool,
  int, float, or a non-empty str.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

Step = Union[str, int]  # a field name or a 0-based array subscript


@dataclass(frozen=True, slots=True)
class Literal:
    value: object
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Field:
    steps: tuple[Step, ...]
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    @property
    def path(self) -> str:
        """The path without subscripts, e.g. ``/a/b``: the form used in Expression.fields."""
        return "".join("/" + s for s in self.steps if isinstance(s, str))

    def children(self) -> tuple[Node, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-" or "+"
    operand: Node
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


@dataclass(frozen=True, slots=True)
class Arith:
    op: str  # "+", "-", "*", "/", "%"
    left: Node
    right: Node
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # normalised: "=", "!=", "<", "<=", ">", ">="
    left: Node
    right: Node
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, slots=True)
class And:
    terms: tuple[Node, ...]  # two or more, flattened: a AND b AND c is one node
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return self.terms


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Node, ...]
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return self.terms


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.operand, self.low, self.high)


@dataclass(frozen=True, slots=True)
class In:
    operand: Node
    items: tuple[Node, ...]
    negated: bool
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.operand, *self.items)


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: str
    negated: bool
    pos: int
    pattern_pos: int  # where the pattern literal starts, for regex errors
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


@dataclass(frozen=True, slots=True)
class Affix:
    """``x BEGINS WITH (...)`` (kind "BEGINS") or ``x ENDS WITH (...)`` (kind "ENDS")."""

    kind: str
    operand: Node
    items: tuple[Node, ...]
    negated: bool
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.operand, *self.items)


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


@dataclass(frozen=True, slots=True)
class Call:
    name: str  # upper case; IF and COALESCE are calls too
    args: tuple[Node, ...]
    pos: int
    depth: int = field(default=1, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return self.args


Node = Union[Literal, Field, Unary, Arith, Compare, And, Or, Not, Between, In, Like, Affix, IsNull, Call]

#: Nodes whose result is a three-valued truth (TRUE / FALSE / UNKNOWN).
PREDICATES = (Compare, And, Or, Not, Between, In, Like, Affix, IsNull)


def walk(node: Node):
    """Every node of the tree, parents before children (iterative: no recursion)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children()))
