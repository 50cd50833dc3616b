"""Lexer: filter text to tokens.

Rules kept here:
- Keywords and function names are case-insensitive (NAME tokens carry the upper-case
  form in ``value``); field names are case-sensitive.
- ``/`` is context-sensitive. Where an operand is expected it starts a field path
  (``/a/b[0]``); after an operand it is the division operator. A path goes on while
  ``/name`` or ``[n]`` follows *without whitespace*, so ``/a/2`` is the field ``2``
  inside ``a`` and ``/a / 2`` is a division.
- Step names follow XPath: letters, digits, ``_``, then also ``.`` and ``-``, with an
  optional leading ``@`` for XML attributes. Digits may lead (FIX tags: ``/55``).
  So ``/qty-1`` is the field ``qty-1``: write ``/qty - 1`` to subtract.
- ``[/any text]`` names one root-level field whose name is everything between ``[/``
  and ``]`` (spaces and slashes included); ``[n]`` and ``/name`` steps may follow.
- Strings take single or double quotes. Escapes: ``\\\\ \\' \\" \\n \\r \\t \\xHH``;
  any other backslash is kept with the character after it, so regex patterns such
  as ``'^90\\..*'`` and ``'(.)\\1'`` reach LIKE unchanged.
- Numbers: ``12``, ``1.5``, ``.5``, ``1e5``, ``2.5E-3``; no sign (unary minus is an
  operator), no hexadecimal. A letter glued to a number is an error.
- Every token records its 0-based start offset, for error positions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

from .errors import ExpressionError, shorten
from .limits import source_chars_max

# The ends of a 64-bit integer: a literal outside [int_min, uint_max] is read as a
# double, like any other integer too large for the type table of spec section 3.
int_min = -(2**63)
uint_max = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # NUM, STR, PATH, NAME, OP, END
    text: str  # the source text of the token
    pos: int  # 0-based offset of its first character
    value: object = None


_SPACE = re.compile(r"[ \t\r\n\f\v]+")
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STEP = re.compile(r"/(@?\w[\w.\-]*)")
_SUBSCRIPT = re.compile(r"\[([0-9]+)\]")
_BRACKETED = re.compile(r"\[/([^\]]+)\]")
_OPERATORS = ("==", "!=", "<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")
_STRING_BODY = {"'": re.compile(r"(?:[^'\\]|\\.)*'", re.S), '"': re.compile(r'(?:[^"\\]|\\.)*"', re.S)}
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|.)", re.S)
_SIMPLE_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}

# After these tokens an operand has just ended, so "/" divides instead of starting a path.
_OPERAND_END_KINDS = frozenset({"NUM", "STR", "PATH"})
_OPERAND_END_NAMES = frozenset({"TRUE", "FALSE", "NULL"})


def number_value(text: str) -> int | float:
    """The value of a number literal: an integer when it fits 64 bits, else a double."""
    if "." in text or "e" in text or "E" in text:
        return float(text)
    if len(text) > 20:  # beyond 2**64 for sure; also keeps int() away from huge inputs
        return float(text)
    value = int(text)
    return value if value <= uint_max else float(value)


def _unescape(body: str, pos: int) -> str:
    if "\\" not in body:
        return body

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if len(code) == 3:
            return chr(int(code[1:], 16))
        if code == "x":
            raise ExpressionError(
                "invalid \\x escape (two hex digits expected)", pos + m.start(), m.group(0)
            )
        return _SIMPLE_ESCAPES.get(code, m.group(0))

    return _ESCAPE.sub(one, body)


def _path(src: str, pos: int, steps: list[str | int]) -> int:
    """Read ``/name`` and ``[n]`` steps glued at ``pos``; return the end offset."""
    while True:
        m = _STEP.match(src, pos)
        if m is not None:
            steps.append(m.group(1))
            pos = m.end()
            continue
        m = _SUBSCRIPT.match(src, pos)
        if m is not None:
            digits = m.group(1)
            # An index past any real array is kept as "never present" (NULL).
            steps.append(int(digits) if len(digits) <= 18 else 2**62)
            pos = m.end()
            continue
        return pos


def tokenize(src: str) -> Iterator[Token]:
    """Yield the tokens of ``src``, ending with one END token."""
    if len(src) > source_chars_max:
        raise ExpressionError(
            f"expression longer than {source_chars_max} characters",
            source_chars_max,
            src[source_chars_max : source_chars_max + 10],
        )
    pos = 0
    end = len(src)
    previous: Token | None = None
    while True:
        m = _SPACE.match(src, pos)
        if m is not None:
            pos = m.end()
        if pos >= end:
            yield Token("END", "", end)
            return
        operand_ended = previous is not None and (
            previous.kind in _OPERAND_END_KINDS
            or (previous.kind == "OP" and previous.text == ")")
            or (previous.kind == "NAME" and previous.value in _OPERAND_END_NAMES)
        )
        token = _one(src, pos, operand_ended)
        pos += len(token.text)
        previous = token
        yield token


def _one(src: str, pos: int, operand_ended: bool) -> Token:
    c = src[pos]
    if c == "/" and not operand_ended:
        steps: list[str | int] = []
        stop = _path(src, pos, steps)
        if not steps or not isinstance(steps[0], str):
            raise ExpressionError("invalid field path", pos, src[pos : pos + 2])
        return Token("PATH", src[pos:stop], pos, tuple(steps))
    if c == "[" and not operand_ended:
        m = _BRACKETED.match(src, pos)
        if m is None:
            raise ExpressionError("invalid bracketed field name", pos, src[pos : pos + 20])
        steps = [m.group(1)]
        stop = _path(src, m.end(), steps)
        return Token("PATH", src[pos:stop], pos, tuple(steps))
    if c == "'" or c == '"':
        m = _STRING_BODY[c].match(src, pos + 1)
        if m is None:
            raise ExpressionError("unterminated string", pos, src[pos:])
        text = src[pos : m.end()]
        return Token("STR", text, pos, _unescape(text[1:-1], pos + 1))
    if "0" <= c <= "9" or (c == "." and "0" <= src[pos + 1 : pos + 2] <= "9"):
        m = _NUMBER.match(src, pos)
        assert m is not None
        stop = m.end()
        if stop < len(src) and (src[stop].isalnum() or src[stop] in "_."):
            bad = re.compile(r"[\w.]*").match(src, pos)
            raise ExpressionError("invalid number", pos, bad.group(0) if bad else src[pos:stop])
        text = m.group(0)
        return Token("NUM", text, pos, number_value(text))
    if c.isascii() and (c.isalpha() or c == "_"):
        m = _NAME.match(src, pos)
        assert m is not None
        text = m.group(0)
        return Token("NAME", text, pos, text.upper())
    for op in _OPERATORS:
        if src.startswith(op, pos):
            return Token("OP", op, pos, op)
    raise ExpressionError(f"unexpected character '{shorten(c)}'", pos, c)
