"""Runtime values and the type rules (spec sections 3, 5.3, 6 and 8).

Values at run time are plain Python objects, exactly as a JSON decoder gives them:
None, bool, int, float, str, list, dict. The rules kept here:

- NULL is None. The empty string is NULL. An object (dict) is NULL to every operator
  except IS NULL (it is a value, just not one that compares).
- Integers are 64-bit: a result or a field outside [-2**63, 2**64 - 1] becomes a double.
- A string is read as a number only if it is plain decimal text (``12``, ``-1.5``,
  ``2e3``, ``.5``; no spaces, no hex, no ``nan``/``inf``) of at most
  limits.number_text_chars_max characters.
- Comparisons (three-valued: True, False, None = UNKNOWN):
  NULL on either side -> UNKNOWN. Two strings compare as strings (code-point order,
  which is UTF-8 byte order), never as numbers. A string and a number: the string is
  converted; if that works they compare as numbers, otherwise the string is greater.
  Booleans are the numbers 1 and 0. Any comparison involving NaN is FALSE (all six
  operators, != included).
- Arrays (spec 8): a comparison, LIKE, IN, BETWEEN, BEGINS/ENDS WITH on an array is
  the OR of the operator over its elements (any TRUE -> TRUE; an empty array is NULL).
  Everything else (arithmetic, functions, truth tests) uses the first element. An
  element that is itself an array stands for its first element.
- Arithmetic: operands become numbers (NULL stays NULL and gives NULL; a non-numeric
  string gives NaN). + - * keep integers when both are; / always gives a double;
  % is C's (the sign of the dividend); x / 0 and x % 0 give NaN.
- The string form of a number: integers in decimal, doubles in the shortest text that
  reads back the same (``4.99``, ``24.0``, ``1e+16``), ``NaN``, ``Infinity``;
  booleans are ``true``/``false``.
- Truth of a value (used by AND/OR/NOT/IF on non-predicates): NULL and NaN are UNKNOWN,
  numbers (and numeric strings) are TRUE when non-zero, other strings are UNKNOWN.

Everything here is pure and total: no function raises on any JSON value.
"""

from __future__ import annotations

import math
import operator
import re

from .limits import array_pairs_max, number_text_chars_max

int_min = -(2**63)
uint_max = 2**64 - 1
NAN = float("nan")
INF = float("inf")

# ASCII digits only: "٣" is text, not a number.
_NUMERIC = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")

OPS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
# The answer when a non-numeric string meets a number: the string is greater.
_STRING_LEFT_GREATER = {"=": False, "!=": True, "<": False, "<=": False, ">": True, ">=": True}
_STRING_RIGHT_GREATER = {"=": False, "!=": True, "<": True, "<=": True, ">": False, ">=": False}


# --- numbers -------------------------------------------------------------------------


def big_int(value: int) -> int | float:
    """An integer kept if it fits 64 bits, else the nearest double (or +-inf)."""
    if int_min <= value <= uint_max:
        return value
    try:
        return float(value)
    except OverflowError:
        return INF if value > 0 else -INF


def parse_number(text: str) -> int | float | None:
    """The number a string spells, or None when it is not numeric text."""
    if len(text) > number_text_chars_max or _NUMERIC.fullmatch(text) is None:
        return None
    if _INTEGER.fullmatch(text) is not None:
        return big_int(int(text)) if len(text) <= 24 else float(text)
    return float(text)


def scalar(value: object) -> object:
    """The value as one operand of a scalar operator: first element, '' and objects NULL."""
    t = type(value)
    if t is str:
        return value or None
    if t is int:
        return value if int_min <= value <= uint_max else big_int(value)
    if t is float or t is bool or value is None:
        return value
    if t is list:
        return scalar(value[0]) if value else None
    return None  # dict and anything else a decoder might give: not comparable


def elements(value: object) -> list:
    """The scalars an array-aware operator looks at: every element, or the value itself."""
    if type(value) is list:
        return [scalar(v) for v in value]
    return [scalar(value)]


def to_number(value: object) -> int | float | None:
    """A scalar as an arithmetic operand: None stays None, text that is not a number is NaN."""
    t = type(value)
    if t is int or t is float or value is None:
        return value
    if t is bool:
        return int(value)
    if t is str:
        number = parse_number(value)
        return NAN if number is None else number
    return None


def to_text(value: object) -> str | None:
    """A scalar as a string operand (LIKE, BEGINS WITH, string functions)."""
    t = type(value)
    if t is str or value is None:
        return value
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if t is float:
        if value != value:
            return "NaN"
        if value == INF:
            return "Infinity"
        if value == -INF:
            return "-Infinity"
        return repr(value)
    return None


# --- three-valued logic ---------------------------------------------------------------


def truth(value: object) -> bool | None:
    """The truth of any value: True, False, or None (UNKNOWN)."""
    value = scalar(value)
    t = type(value)
    if t is bool or value is None:
        return value
    if t is str:
        value = parse_number(value)
        if value is None:
            return None
    if value != value:
        return None
    return value != 0


def not3(a: bool | None) -> bool | None:
    return None if a is None else not a


def any3(results) -> bool | None:
    """OR of three-valued results: True if any is True; None if any is None or there are none."""
    seen_false = False
    seen_unknown = False
    for r in results:
        if r is True:
            return True
        if r is None:
            seen_unknown = True
        else:
            seen_false = True
    return None if seen_unknown or not seen_false else False


def all3(results) -> bool | None:
    """AND of three-valued results: False if any is False, else None if any is None."""
    seen_unknown = False
    for r in results:
        if r is False:
            return False
        if r is None:
            seen_unknown = True
    return None if seen_unknown else True


# --- comparison ------------------------------------------------------------------------


def compare(op: str, a: object, b: object) -> bool | None:
    """Compare two scalars (see the module rules)."""
    if a is None or b is None:
        return None
    a_text = type(a) is str
    b_text = type(b) is str
    if a_text and b_text:
        return OPS[op](a, b)
    if a_text:
        number = parse_number(a)
        if number is None:
            return False if b != b else _STRING_LEFT_GREATER[op]
        a = number
    elif b_text:
        number = parse_number(b)
        if number is None:
            return False if a != a else _STRING_RIGHT_GREATER[op]
        b = number
    if a != a or b != b:
        return False
    return OPS[op](a, b)


def cmp3(op: str, a: object, b: object) -> bool | None:
    """Array-aware comparison of two values.

    Two arrays compare pair by pair (any pair TRUE makes it TRUE). At most
    limits.array_pairs_max pairs are tried; if none of them is TRUE the answer is
    UNKNOWN, since an untried pair might have been.
    """
    if type(a) is list or type(b) is list:
        return any3(_pairs(op, elements(a), elements(b)))
    return compare(op, scalar(a), scalar(b))


def _pairs(op: str, left: list, right: list):
    budget = array_pairs_max
    for x in left:
        for y in right:
            budget -= 1
            if budget < 0:
                yield None
                return
            yield compare(op, x, y)


def between3(value: object, low: object, high: object) -> bool | None:
    """``value BETWEEN low AND high``: some element with low <= e <= high (bounds scalar)."""
    low = scalar(low)
    high = scalar(high)
    return any3(
        all3((compare(">=", e, low), compare("<=", e, high))) for e in elements(value)
    )


def in3(value: object, items: list) -> bool | None:
    """``value IN (items)``: the OR of ``value = item`` (spec 5.3)."""
    return any3(cmp3("=", value, item) for item in items)


def is_null(value: object) -> bool:
    """IS NULL looks at the whole field: NULL, '' and [] are NULL; objects are not."""
    return value is None or value == "" or value == []


# --- arithmetic -------------------------------------------------------------------------


def arith(op: str, a: object, b: object) -> int | float | None:
    a = to_number(scalar(a))
    b = to_number(scalar(b))
    if a is None or b is None:
        return None
    if op == "+":
        r = a + b
    elif op == "-":
        r = a - b
    elif op == "*":
        r = a * b
    elif op == "/":
        if b == 0:
            return NAN
        try:
            return a / b
        except OverflowError:  # int / int beyond double range
            return INF if (a > 0) == (b > 0) else -INF
    else:  # "%"
        if b == 0:
            return NAN
        if type(a) is int and type(b) is int:
            r = abs(a) % abs(b)
            r = -r if a < 0 else r
        else:
            try:
                return math.fmod(a, b)
            except ValueError:  # fmod(inf, x)
                return NAN
    return big_int(r) if type(r) is int else r


def negate(a: object) -> int | float | None:
    a = to_number(scalar(a))
    if a is None:
        return None
    return big_int(-a) if type(a) is int else -a


# --- queue priority ---------------------------------------------------------------------


def priority_key(value: object) -> int:
    """A result as a queue priority: unsigned 64-bit, or -1 (lowest) when it is not one.

    NULL, non-numeric, NaN, infinite, negative or above 2**64 - 1 give -1. Doubles are
    truncated toward zero first, as C converts a double to an unsigned integer, so
    -0.5 gives 0 and 7.9 gives 7. Numeric strings convert per the type rules.
    """
    value = scalar(value)
    t = type(value)
    if value is None:
        return -1
    if t is str:
        value = parse_number(value)
        if value is None:
            return -1
        t = type(value)
    if t is bool:
        return int(value)
    if t is float:
        if value != value or value in (INF, -INF):
            return -1
        value = int(value)
    if 0 <= value <= uint_max:
        return value
    return -1


def plus(a: object) -> int | float | None:
    """Unary plus: the operand as a number (NULL stays NULL, text that is not a number is NaN)."""
    a = to_number(scalar(a))
    return big_int(a) if type(a) is int else a
