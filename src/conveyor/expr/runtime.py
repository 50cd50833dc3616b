"""Helpers the generated code calls: field access and the slow paths of predicates.

Rules kept here:
- The compiler inlines the common case (a dict field, a str or number operand) and
  calls these for everything else; each helper gives exactly the answer values.py
  defines, so the fast path and the slow path can never disagree in kind, only in
  speed.
- ``*_true`` helpers answer "is it TRUE", ``*_false`` "is it FALSE", ``*3`` give the
  three-valued result. A filter matches only on TRUE, so FALSE and UNKNOWN collapse
  whenever only ``*_true`` is asked; NOT asks ``*_false`` of its operand.
- Nothing here raises on any JSON value.
"""

from __future__ import annotations

from collections.abc import Mapping

from .regex import Pattern
from .values import any3, cmp3, elements, parse_number, scalar, to_text

_EMPTY: dict = {}


def as_mapping(data: object) -> Mapping:
    """The message body as something with ``.get``: non-objects have no fields."""
    return data if isinstance(data, Mapping) else _EMPTY


def step(value: object, name: str) -> object:
    """``value/name``. On an array of objects, the values of ``name`` in each (XPath-like)."""
    if isinstance(value, Mapping):
        return value.get(name)
    if type(value) is list:
        found: list = []
        for element in value:
            if isinstance(element, Mapping) and name in element:
                inner = element[name]
                if type(inner) is list:
                    found.extend(inner)
                else:
                    found.append(inner)
        return found
    return None


def index(value: object, n: int) -> object:
    """``value[n]``, 0-based. A single value is a one-element array for subscripts."""
    if type(value) is list:
        return value[n] if n < len(value) else None
    if value is None:
        return None
    return value if n == 0 else None


def walk(data: Mapping, steps: tuple) -> object:
    """A whole path at once (used for long paths, to keep generated code shallow)."""
    value: object = data
    for s in steps:
        value = index(value, s) if type(s) is int else step(value, s)
    return value


def result(value: object) -> object:
    """What ``evaluate`` hands back: '' is NULL."""
    return None if value == "" else value


def cmp_true(op: str, a: object, b: object) -> bool:
    return cmp3(op, a, b) is True


def cmp_false(op: str, a: object, b: object) -> bool:
    return cmp3(op, a, b) is False


def like3(pattern: Pattern, value: object) -> bool | None:
    """LIKE on any value; on an array, any element (spec 8).

    For a pattern that needs the regex engine, an array is searched while the total
    length searched stays within the pattern's subject limit, so one evaluation
    never costs more than one search of the longest allowed subject (the cost
    model is convex); elements past that are UNKNOWN.
    """
    if type(value) is not list:
        text = to_text(scalar(value))
        return None if text is None else pattern.test(text)
    left = pattern.subject_chars_max  # -1: plain text, no limit
    seen_false = seen_unknown = False
    for element in value:
        text = to_text(scalar(element))
        if text is not None and left >= 0:
            left -= len(text)
            if left < 0:
                text = None
        result = None if text is None else pattern.test(text)
        if result is True:
            return True
        if result is None:
            seen_unknown = True
        else:
            seen_false = True
    return None if seen_unknown or not seen_false else False


def affix3(kind: str, value: object, items: list) -> bool | None:
    """``value BEGINS WITH (items)`` / ``ENDS WITH``: any element, any item."""
    texts = [to_text(scalar(i)) for i in items]

    def one(e: object) -> bool | None:
        text = to_text(e)
        if text is None:
            return None
        if kind == "BEGINS":
            return any3(None if t is None else text.startswith(t) for t in texts)
        return any3(None if t is None else text.endswith(t) for t in texts)

    return any3(one(e) for e in elements(value))


class LiteralSet:
    """``x IN (literal, ...)`` with hashed lookups; same answers as values.in3."""

    __slots__ = ("texts", "numbers", "text_numbers", "has_null")

    def __init__(self, items: list) -> None:
        texts, numbers, text_numbers = set(), set(), set()
        self.has_null = False
        for item in items:
            item = scalar(item)
            if item is None:
                self.has_null = True
            elif type(item) is str:
                texts.add(item)
                number = parse_number(item)
                if number is not None and number == number:
                    text_numbers.add(number)
            elif item == item:  # NaN never equals anything
                numbers.add(item)
        self.texts = frozenset(texts)
        self.numbers = frozenset(numbers)
        self.text_numbers = frozenset(text_numbers)

    def _one(self, e: object) -> bool | None:
        if e is None:
            return None
        if type(e) is str:
            if e in self.texts:
                return True
            number = parse_number(e)
            if number is not None and number == number and number in self.numbers:
                return True
        elif e == e and (e in self.numbers or e in self.text_numbers):
            return True
        return None if self.has_null else False

    def value(self, x: object) -> bool | None:
        if type(x) is list:
            return any3(self._one(e) for e in elements(x))
        return self._one(scalar(x))

    def true(self, x: object) -> bool:
        return self.value(x) is True

    def false(self, x: object) -> bool:
        return self.value(x) is False


def coalesce(*args: object) -> object:
    """The first argument that is not NULL (arguments arrive as scalars)."""
    for a in args:
        if a is not None:
            return a
    return None
