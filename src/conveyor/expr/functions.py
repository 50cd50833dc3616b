"""The built-in functions (spec section 7), as plain Python functions.

Rules kept here:
- Names are case-insensitive (the table is keyed by the upper-case name).
- Every function receives *scalar* arguments (the compiler passes the first element of
  an array and NULL for '' and objects; spec 8) and never raises: bad input gives NULL.
- A NULL argument gives a NULL result unless the function's row below says otherwise;
  a function that would return '' returns NULL (the empty string is NULL).
- String results longer than limits.string_result_chars_max are NULL.
- Case functions are ASCII-only (AMPS is not Unicode-aware): UPPER('é') == 'é'.
- Time is an argument: UNIX_TIMESTAMP() and LAST_UPDATED() read ``meta['now']``, which
  the caller supplies (the engine passes the time of the decision); without it they are
  NULL. The expression language never reads the clock, so a filter gives the same answer
  live, in recovery and in a simulation with a virtual clock.
- IF and COALESCE are not here: they evaluate their arguments lazily, so the compiler
  builds them (compiler.py).
"""

from __future__ import annotations

import calendar
import math
import re
import string
import time  # gmtime/strftime only: formatting a given time, never reading the clock
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Callable

from .limits import string_result_chars_max, strftime_result_bytes_max, time_text_chars_max
from .values import INF, NAN, big_int, scalar, to_number, to_text

_TO_UPPER = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)
_TO_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ASCII_SPACE = " \t\n\r\f\v"


def ascii_upper(s: str) -> str:
    return s.upper() if s.isascii() else s.translate(_TO_UPPER)


def ascii_lower(s: str) -> str:
    return s.lower() if s.isascii() else s.translate(_TO_LOWER)


def _text_result(s: str) -> str | None:
    if not s or len(s) > string_result_chars_max:
        return None
    return s


def _whole(value: object) -> int | None:
    """A numeric argument as an integer (truncated), or None for NULL/NaN/infinite."""
    number = to_number(value)
    if number is None or number != number or number in (INF, -INF):
        return None
    return int(number)


# --- strings ----------------------------------------------------------------------------


def f_instr(s, sub):
    s, sub = to_text(s), to_text(sub)
    if s is None or sub is None:
        return None
    return s.find(sub) + 1


def f_instr_i(s, sub):
    s, sub = to_text(s), to_text(sub)
    if s is None or sub is None:
        return None
    return ascii_lower(s).find(ascii_lower(sub)) + 1


def f_strequal_i(a, b):
    a, b = to_text(a), to_text(b)
    if a is None or b is None:
        return None
    return ascii_lower(a) == ascii_lower(b)


def f_upper(s):
    s = to_text(s)
    return None if s is None else ascii_upper(s)


def f_lower(s):
    s = to_text(s)
    return None if s is None else ascii_lower(s)


def f_substr(s, start, length=0, *, has_length=False):
    s = to_text(s)
    start = _whole(start)
    if s is None or start is None:
        return None
    # 1-based; 0 counts as 1 and a negative start counts from the end (as in Oracle and
    # MySQL: the AMPS page does not say).
    if start > 0:
        i = start - 1
    elif start == 0:
        i = 0
    else:
        i = max(len(s) + start, 0)
    if has_length:
        count = _whole(length)
        if count is None or count <= 0:
            return None
        return _text_result(s[i : i + count])
    return _text_result(s[i:])


def _substr_dispatch(*args):
    if len(args) == 3:
        return f_substr(args[0], args[1], args[2], has_length=True)
    return f_substr(args[0], args[1])


def f_reverse(s):
    s = to_text(s)
    return None if s is None else s[::-1]


def f_concat(*args):
    parts = [t for t in map(to_text, args) if t is not None]  # NULL adds nothing
    if sum(map(len, parts)) > string_result_chars_max:
        return None
    return "".join(parts) or None


def f_length(s):
    s = to_text(s)
    return None if s is None else len(s)


def f_trim(s):
    s = to_text(s)
    return None if s is None else _text_result(s.strip(_ASCII_SPACE))


def f_ltrim(s):
    s = to_text(s)
    return None if s is None else _text_result(s.lstrip(_ASCII_SPACE))


def f_rtrim(s):
    s = to_text(s)
    return None if s is None else _text_result(s.rstrip(_ASCII_SPACE))


def f_replace(s, old, new):
    s, old, new = to_text(s), to_text(old), to_text(new)
    if s is None:
        return None
    if old is None:
        return s
    new = new or ""  # a NULL replacement deletes: '' is NULL, and REPLACE(s,'x','') must work
    growth = len(new) - len(old)
    if growth > 0 and len(s) + s.count(old) * growth > string_result_chars_max:
        return None
    return _text_result(s.replace(old, new))


# --- numbers ----------------------------------------------------------------------------


def f_abs(x):
    x = to_number(x)
    if x is None:
        return None
    return big_int(abs(x)) if type(x) is int else abs(x)


def _rounded(x, how):
    x = to_number(x)
    if x is None or type(x) is int or x != x or x in (INF, -INF):
        return x
    return float(how(x))


def f_ceiling(x):
    return _rounded(x, math.ceil)


def f_floor(x):
    return _rounded(x, math.floor)


def f_round(x, digits=0):
    """Half away from zero, as SQL; ROUND(x, d) keeps d decimals (d may be negative)."""
    x = to_number(x)
    d = _whole(digits)
    if x is None or d is None:
        return None
    if x != x or x in (INF, -INF):
        return x
    if not -400 <= d <= 400:
        return x if d > 0 else (0 if type(x) is int else 0.0)
    try:
        q = Decimal(repr(x) if type(x) is float else x).quantize(
            Decimal(1).scaleb(-d), rounding=ROUND_HALF_UP
        )
    except InvalidOperation:  # the quantum needs more precision than the context has
        return x
    return big_int(int(q)) if type(x) is int else float(q)


# --- date and time ----------------------------------------------------------------------

_FRACTION = re.compile(r"%%|%03f|%f")


def _now(meta) -> float | None:
    if meta is not None:
        now = meta.get("now")
        if type(now) in (int, float):
            return float(now)
    return None


def f_unix_timestamp(meta):
    return _now(meta)


def f_strftime(fmt, ts):
    """strftime(3) in UTC, plus %f (microseconds) and %03f (milliseconds); <= 128 bytes."""
    fmt = to_text(fmt)
    ts = to_number(ts)
    if fmt is None or ts is None or len(fmt) > time_text_chars_max:
        return None
    if ts != ts or ts in (INF, -INF):
        return None
    try:
        micros = round(ts * 1_000_000)
        seconds, micros = divmod(micros, 1_000_000)

        def fraction(m: re.Match[str]) -> str:
            code = m.group(0)
            if code == "%f":
                return f"{micros:06d}"
            if code == "%03f":
                return f"{micros // 1000:03d}"
            return code

        text = time.strftime(_FRACTION.sub(fraction, fmt), time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        return None
    raw = text.encode("utf-8")
    if len(raw) > strftime_result_bytes_max:
        text = raw[:strftime_result_bytes_max].decode("utf-8", "ignore")
    return text or None


def f_strptime(text, fmt):
    """strptime(3) plus %f / %03f; a time without zone is UTC. Gives a double timestamp."""
    text, fmt = to_text(text), to_text(fmt)
    if text is None or fmt is None:
        return None
    if len(text) > time_text_chars_max or len(fmt) > time_text_chars_max:
        return None
    try:
        parsed = datetime.strptime(text, fmt.replace("%03f", "%f"))
    except (ValueError, OverflowError, TypeError):
        return None
    if parsed.tzinfo is not None:
        return parsed.timestamp()
    return calendar.timegm(parsed.utctimetuple()) + parsed.microsecond / 1_000_000


# --- message functions (spec 7.3) ------------------------------------------------------------


def meta_value(meta, key: str):
    """A message property as a value; missing, '' and undecodable ones are NULL."""
    if meta is None:
        return None
    value = meta.get(key)
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("utf-8", "replace")
    return scalar(value)


def _message_function(key: str) -> Callable:
    def function(meta):
        return meta_value(meta, key)

    return function


def f_last_updated(meta):
    value = meta_value(meta, "timestamp")
    return _now(meta) if value is None else value


# --- typed values (spec 7.4) --------------------------------------------------------------


def f_char_value(n):
    if n is None:
        return None
    code = _whole(n)
    if code is None or not 0 <= code <= 255:
        return "?"  # the newer AMPS docs: out of range gives '?'
    return chr(code)


# --- the table ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    args_min: int
    args_max: int | None  # None: any number
    impl: Callable
    needs_meta: bool = False  # impl takes the message's meta mapping first


def _table(*rows: Function) -> dict[str, Function]:
    return {row.name: row for row in rows}


FUNCTIONS: dict[str, Function] = _table(
    Function("INSTR", 2, 2, f_instr),
    Function("INSTR_I", 2, 2, f_instr_i),
    Function("STREQUAL_I", 2, 2, f_strequal_i),
    Function("UPPER", 1, 1, f_upper),
    Function("LOWER", 1, 1, f_lower),
    Function("SUBSTR", 2, 3, _substr_dispatch),
    Function("REVERSE", 1, 1, f_reverse),
    Function("CONCAT", 1, None, f_concat),
    Function("LENGTH", 1, 1, f_length),
    Function("TRIM", 1, 1, f_trim),
    Function("LTRIM", 1, 1, f_ltrim),
    Function("RTRIM", 1, 1, f_rtrim),
    Function("REPLACE", 3, 3, f_replace),
    Function("ABS", 1, 1, f_abs),
    Function("CEILING", 1, 1, f_ceiling),
    Function("FLOOR", 1, 1, f_floor),
    Function("ROUND", 1, 2, f_round),
    Function("UNIX_TIMESTAMP", 0, 0, f_unix_timestamp, needs_meta=True),
    Function("STRFTIME", 2, 2, f_strftime),
    Function("STRPTIME", 2, 2, f_strptime),
    Function("MESSAGE_SIZE", 0, 0, _message_function("length"), needs_meta=True),
    Function("CORRELATION_ID", 0, 0, _message_function("correlation_id"), needs_meta=True),
    Function("BOOKMARK", 0, 0, _message_function("bookmark"), needs_meta=True),
    Function("TOPIC_NAME", 0, 0, _message_function("topic"), needs_meta=True),
    Function("SOW_KEY", 0, 0, _message_function("sow_key"), needs_meta=True),
    Function("LAST_UPDATED", 0, 0, f_last_updated, needs_meta=True),
    Function("TRUE_VALUE", 0, 0, lambda: True),
    Function("FALSE_VALUE", 0, 0, lambda: False),
    Function("NAN_VALUE", 0, 0, lambda: NAN),
    Function("CHAR_VALUE", 1, 1, f_char_value),
)

#: Built by the compiler, lazily: (min, max) arguments.
SPECIAL_FORMS: dict[str, tuple[int, int | None]] = {"IF": (3, 3), "COALESCE": (1, None)}
