"""Parser: tokens to a syntax tree (nodes.py), by recursive descent.

Precedence, lowest first (spec section 5; the order of the comparison group and of
arithmetic is inferred from SQL and documented in docs/expressions.md):

    OR
    AND
    NOT                                    (prefix, may repeat)
    comparison: = == != <> < <= > >=, IS [NOT] NULL, [NOT] LIKE '...',
                [NOT] BETWEEN a AND b, [NOT] IN (...), [NOT] BEGINS WITH (...),
                [NOT] ENDS WITH (...)      (non-associative: a = b = c is an error)
    + -                                    (left-associative)
    * / %                                  (left-associative)
    unary - +
    literal, field, function call, ( expression )

Rules kept here:
- Keywords are case-insensitive; TRUE, FALSE and NULL are literals; '' is the NULL
  literal (the empty string is NULL everywhere).
- The LIKE pattern must be a quoted string literal (spec 5.5).
- Errors raise ExpressionError at the offending token: "unexpected token 'X'", or
  "unexpected end of expression" at the end of the text.
- The tree is bounded: at most limits.nesting_depth_max deep (checked before each
  recursive step, so the parser's own stack is bounded too) and at most
  limits.node_count_max nodes (literal list items excepted, see limits.py).
"""

from __future__ import annotations

from .errors import ExpressionError, shorten
from .lexer import Token, tokenize
from .limits import list_items_max, nesting_depth_max, node_count_max
from .nodes import (
    Affix,
    And,
    Arith,
    Between,
    Call,
    Compare,
    Field,
    In,
    IsNull,
    Like,
    Literal,
    Node,
    Not,
    Or,
    Unary,
)
from .values import big_int

_COMPARISONS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "BETWEEN", "BEGINS", "ENDS", "WITH", "TRUE", "FALSE"}
)
_LITERAL_WORDS = {"TRUE": True, "FALSE": False, "NULL": None}


def parse(source: str) -> Node:
    """Parse a whole filter; raise ExpressionError on anything that is not one."""
    return _Parser(source).parse()


def _unexpected(token: Token) -> ExpressionError:
    if token.kind == "END":
        return ExpressionError("unexpected end of expression", token.pos, "")
    return ExpressionError(f"unexpected token '{shorten(token.text)}'", token.pos, token.text)


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = list(tokenize(source))
        self.i = 0
        self.nesting = 0
        self.nodes = 0

    # --- token helpers ---------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        token = self.tokens[self.i]
        if token.kind != "END":
            self.i += 1
        return token

    def at_word(self, *words: str) -> bool:
        t = self.tokens[self.i]
        return t.kind == "NAME" and t.value in words

    def at_op(self, *ops: str) -> bool:
        t = self.tokens[self.i]
        return t.kind == "OP" and t.value in ops

    def expect_op(self, op: str) -> Token:
        if not self.at_op(op):
            raise _unexpected(self.tok)
        return self.advance()

    def expect_word(self, word: str) -> Token:
        if not self.at_word(word):
            raise _unexpected(self.tok)
        return self.advance()

    # --- bounds ----------------------------------------------------------------------

    def enter(self, token: Token) -> None:
        """Count one level of recursion; refuse to go deeper than the limit."""
        self.nesting += 1
        if self.nesting > nesting_depth_max:
            raise ExpressionError(
                f"expression nested deeper than {nesting_depth_max} levels", token.pos, token.text
            )

    def leave(self) -> None:
        self.nesting -= 1

    def make(self, cls, *args, counted: bool = True):
        """Build a node, filling in its depth and checking the size limits."""
        node = cls(*args)
        kids = node.children()
        if kids:
            depth = 1 + max(k.depth for k in kids)
            object.__setattr__(node, "depth", depth)
            if depth > nesting_depth_max:
                raise ExpressionError(
                    f"expression nested deeper than {nesting_depth_max} levels",
                    node.pos,
                    self._text_at(node.pos),
                )
        if counted:
            self.nodes += 1
            if self.nodes > node_count_max:
                raise ExpressionError(
                    f"expression has more than {node_count_max} terms", node.pos, self._text_at(node.pos)
                )
        return node

    def _text_at(self, pos: int) -> str:
        for t in self.tokens:
            if t.pos == pos:
                return t.text
        return ""

    # --- grammar ---------------------------------------------------------------------

    def parse(self) -> Node:
        node = self.parse_or()
        if self.tok.kind != "END":
            raise _unexpected(self.tok)
        return node

    def parse_or(self) -> Node:
        first = self.tok
        terms = [self.parse_and()]
        while self.at_word("OR"):
            self.advance()
            terms.append(self.parse_and())
        return terms[0] if len(terms) == 1 else self.make(Or, tuple(terms), first.pos)

    def parse_and(self) -> Node:
        first = self.tok
        terms = [self.parse_not()]
        while self.at_word("AND"):
            self.advance()
            terms.append(self.parse_not())
        return terms[0] if len(terms) == 1 else self.make(And, tuple(terms), first.pos)

    def parse_not(self) -> Node:
        if self.at_word("NOT"):
            token = self.advance()
            self.enter(token)
            operand = self.parse_not()
            self.leave()
            return self.make(Not, operand, token.pos)
        return self.parse_comparison()

    def parse_comparison(self) -> Node:
        left = self.parse_additive()
        t = self.tok
        if t.kind == "OP" and t.value in _COMPARISONS:
            self.advance()
            right = self.parse_additive()
            return self.make(Compare, _COMPARISONS[t.value], left, right, t.pos)
        if self.at_word("IS"):
            self.advance()
            negated = False
            if self.at_word("NOT"):
                self.advance()
                negated = True
            self.expect_word("NULL")
            return self.make(IsNull, left, negated, t.pos)
        negated = False
        if self.at_word("NOT"):
            self.advance()
            negated = True
            if not self.at_word("LIKE", "BETWEEN", "IN", "BEGINS", "ENDS"):
                raise _unexpected(self.tok)
        op = self.tok
        if self.at_word("LIKE"):
            self.advance()
            pattern = self.tok
            if pattern.kind != "STR":
                raise ExpressionError(
                    "LIKE pattern must be a quoted string", pattern.pos, pattern.text
                )
            self.advance()
            return self.make(Like, left, pattern.value, negated, op.pos, pattern.pos)
        if self.at_word("BETWEEN"):
            self.advance()
            low = self.parse_additive()
            self.expect_word("AND")
            high = self.parse_additive()
            return self.make(Between, left, low, high, negated, op.pos)
        if self.at_word("IN"):
            self.advance()
            items = self.parse_list()
            return self.make(In, left, items, negated, op.pos)
        if self.at_word("BEGINS", "ENDS"):
            self.advance()
            self.expect_word("WITH")
            items = self.parse_list()
            return self.make(Affix, op.value, left, items, negated, op.pos)
        return left

    def parse_list(self) -> tuple[Node, ...]:
        """``( expr, expr, ... )``: one or more items."""
        opening = self.expect_op("(")
        self.enter(opening)
        items = [self.parse_item()]
        while self.at_op(","):
            self.advance()
            items.append(self.parse_item())
            if len(items) > list_items_max:
                raise ExpressionError(
                    f"list has more than {list_items_max} items", self.tok.pos, self.tok.text
                )
        self.expect_op(")")
        self.leave()
        return tuple(items)

    def parse_item(self) -> Node:
        """A list item; a plain literal is not counted against node_count_max."""
        t = self.tok
        nxt = self.tokens[self.i + 1] if t.kind != "END" else t
        if t.kind in ("NUM", "STR") and nxt.kind == "OP" and nxt.value in (",", ")"):
            self.advance()
            return self.make(Literal, t.value if t.value != "" else None, t.pos, counted=False)
        return self.parse_or()

    def parse_additive(self) -> Node:
        left = self.parse_multiplicative()
        while self.at_op("+", "-"):
            t = self.advance()
            right = self.parse_multiplicative()
            left = self.make(Arith, t.value, left, right, t.pos)
        return left

    def parse_multiplicative(self) -> Node:
        left = self.parse_unary()
        while self.at_op("*", "/", "%"):
            t = self.advance()
            right = self.parse_unary()
            left = self.make(Arith, t.value, left, right, t.pos)
        return left

    def parse_unary(self) -> Node:
        if self.at_op("-", "+"):
            t = self.advance()
            self.enter(t)
            operand = self.parse_unary()
            self.leave()
            if isinstance(operand, Literal) and type(operand.value) in (int, float):
                # Fold -5 into a literal so that comparisons with it get the fast path.
                value = -operand.value if t.value == "-" else operand.value
                value = big_int(value) if type(value) is int else value  # below -2**63: a double
                return self.make(Literal, value, t.pos)
            return self.make(Unary, t.value, operand, t.pos)
        return self.parse_primary()

    def parse_primary(self) -> Node:
        t = self.tok
        if t.kind == "NUM":
            self.advance()
            return self.make(Literal, t.value, t.pos)
        if t.kind == "STR":
            self.advance()
            return self.make(Literal, t.value if t.value != "" else None, t.pos)
        if t.kind == "PATH":
            self.advance()
            return self.make(Field, t.value, t.pos)
        if t.kind == "OP" and t.value == "(":
            self.advance()
            self.enter(t)
            node = self.parse_or()
            self.expect_op(")")
            self.leave()
            return node
        if t.kind == "NAME":
            if t.value in _LITERAL_WORDS:
                self.advance()
                return self.make(Literal, _LITERAL_WORDS[t.value], t.pos)
            if t.value not in _KEYWORDS and self.tokens[self.i + 1].kind == "OP" and self.tokens[self.i + 1].value == "(":
                return self.parse_call()
        raise _unexpected(t)

    def parse_call(self) -> Node:
        name = self.advance()
        opening = self.advance()
        self.enter(opening)
        args: list[Node] = []
        if not self.at_op(")"):
            args.append(self.parse_or())
            while self.at_op(","):
                self.advance()
                args.append(self.parse_or())
        self.expect_op(")")
        self.leave()
        return self.make(Call, name.value, tuple(args), name.pos)
