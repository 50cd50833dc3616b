"""A small tree-walking reference evaluator for the expression language, and a renderer.

Written separately from src/conveyor/expr, straight from docs/expressions.md and the
spec, for clarity rather than speed: no fast paths, no code generation. The property
tests build random trees in the format below, render them to filter text, and check
that ``conveyor.expr.compile(text)`` gives the same result as ``evaluate(tree, ...)``.
bench/bench_expr.py times it as the baseline "interpreter".

Tree format (tuples):
    ("lit", value)                      None, bool, int, float or str
    ("field", steps)                    steps: tuple of names (str) and subscripts (int)
    ("neg", x)
    ("arith", op, a, b)                 op in + - * / %
    ("cmp", op, a, b)                   op in = != < <= > >=
    ("and", a, b)  ("or", a, b)  ("not", a)
    ("between", x, low, high, negated)
    ("in", x, items, negated)
    ("like", x, pattern, negated)       pattern: the regex text
    ("affix", "BEGINS" | "ENDS", x, items, negated)
    ("isnull", x, negated)
    ("call", NAME, args)                IF and COALESCE included
"""

from __future__ import annotations

import math
import re

INT_MIN = -(2**63)
UINT_MAX = 2**64 - 1
NAN = float("nan")

_NUMBER_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
_INT_TEXT = re.compile(r"[+-]?\d+", re.ASCII)


def isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def fit(i: int):
    """Integers are 64-bit; beyond that they become doubles."""
    if INT_MIN <= i <= UINT_MAX:
        return i
    try:
        return float(i)
    except OverflowError:
        return math.inf if i > 0 else -math.inf


def number_of(text: str):
    """The number in a string, or None when it is not plain decimal text."""
    if len(text) > 400 or not _NUMBER_TEXT.fullmatch(text):
        return None
    if _INT_TEXT.fullmatch(text) and len(text) <= 24:
        return fit(int(text))
    return float(text)


def scalar(v):
    """One value for a scalar operator: first element of an array; '' and objects NULL."""
    if isinstance(v, list):
        return scalar(v[0]) if v else None
    if isinstance(v, dict):
        return None
    if isinstance(v, str):
        return v if v else None
    if isinstance(v, bool) or v is None or isinstance(v, float):
        return v
    if isinstance(v, int):
        return fit(v)
    return None


def elems(v):
    if isinstance(v, list):
        return [scalar(e) for e in v]
    return [scalar(v)]


def or3(results):
    results = list(results)
    if any(r is True for r in results):
        return True
    if not results or any(r is None for r in results):
        return None
    return False


def and3(results):
    results = list(results)
    if any(r is False for r in results):
        return False
    if any(r is None for r in results):
        return None
    return True


def not3(r):
    return None if r is None else not r


_PY = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def compare(op, a, b):
    if a is None or b is None:
        return None
    if isinstance(a, str) and isinstance(b, str):
        return _PY[op](a, b)
    if isinstance(a, str):
        n = number_of(a)
        if n is None:  # the string is greater than any number (but NaN compares false)
            return False if isnan(b) else op in (">", ">=", "!=")
        a = n
    elif isinstance(b, str):
        n = number_of(b)
        if n is None:
            return False if isnan(a) else op in ("<", "<=", "!=")
        b = n
    if isnan(a) or isnan(b):
        return False
    return _PY[op](a, b)


def cmp_values(op, a, b):
    if isinstance(a, list) or isinstance(b, list):
        return or3(compare(op, x, y) for x in elems(a) for y in elems(b))
    return compare(op, scalar(a), scalar(b))


def num(v):
    """A scalar as a number for arithmetic."""
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, str):
        n = number_of(v)
        return NAN if n is None else n
    return v


def text(v):
    """A scalar as a string."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def truth(v):
    v = scalar(v)
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, str):
        v = number_of(v)
        if v is None:
            return None
    if isnan(v):
        return None
    return v != 0


def arith(op, a, b):
    a, b = num(scalar(a)), num(scalar(b))
    if a is None or b is None:
        return None
    if op == "/":
        if b == 0:
            return NAN
        try:
            return a / b
        except OverflowError:
            return math.inf if (a > 0) == (b > 0) else -math.inf
    if op == "%":
        if b == 0:
            return NAN
        if isinstance(a, int) and isinstance(b, int):
            r = abs(a) % abs(b)
            return -r if a < 0 else r
        try:
            return math.fmod(a, b)
        except ValueError:
            return NAN
    r = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b}[op]()
    return fit(r) if isinstance(r, int) else r


def field(data, steps):
    cur = data if isinstance(data, dict) else {}
    for s in steps:
        if isinstance(s, int):
            if isinstance(cur, list):
                cur = cur[s] if s < len(cur) else None
            elif cur is not None and s != 0:
                cur = None
        elif isinstance(cur, dict):
            cur = cur.get(s)
        elif isinstance(cur, list):
            found = []
            for e in cur:
                if isinstance(e, dict) and s in e:
                    found.extend(e[s] if isinstance(e[s], list) else [e[s]])
            cur = found
        else:
            cur = None
    return cur


# --- functions (a subset: those the property tests generate, plus the bench's) -----------


def _upper(s):
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)


def _lower(s):
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def _whole(v):
    n = num(v)
    if n is None or isnan(n) or math.isinf(n):
        return None
    return int(n)


def _substr(s, start, *length):
    s, start = text(s), _whole(start)
    if s is None or start is None:
        return None
    i = start - 1 if start > 0 else (0 if start == 0 else max(len(s) + start, 0))
    if length:
        count = _whole(length[0])
        if count is None or count <= 0:
            return None
        return s[i : i + count] or None
    return s[i:] or None


def _strings(f):
    """Wrap a function of strings: NULL in, NULL out."""

    def wrapped(*args):
        texts = [text(a) for a in args]
        if any(t is None for t in texts):
            return None
        return f(*texts)

    return wrapped


def _numeric(f):
    def wrapped(x):
        x = num(x)
        if x is None:
            return None
        return f(x)

    return wrapped


def _round_like(how):
    def f(x):
        if isinstance(x, int) or isnan(x) or math.isinf(x):
            return x
        return float(how(x))

    return f


def _char_value(n):
    if n is None:
        return None
    code = _whole(n)
    return chr(code) if code is not None and 0 <= code <= 255 else "?"


FUNCTIONS = {
    "UPPER": _strings(_upper),
    "LOWER": _strings(_lower),
    "REVERSE": _strings(lambda s: s[::-1]),
    "LENGTH": _strings(len),
    "TRIM": _strings(lambda s: s.strip(" \t\n\r\f\v") or None),
    "INSTR": _strings(lambda s, sub: s.find(sub) + 1),
    "INSTR_I": _strings(lambda s, sub: _lower(s).find(_lower(sub)) + 1),
    "STREQUAL_I": _strings(lambda a, b: _lower(a) == _lower(b)),
    "CONCAT": lambda *args: "".join(t for t in map(text, args) if t is not None) or None,
    "SUBSTR": _substr,
    "ABS": _numeric(lambda x: fit(abs(x)) if isinstance(x, int) else abs(x)),
    "FLOOR": _numeric(_round_like(math.floor)),
    "CEILING": _numeric(_round_like(math.ceil)),
    "CHAR_VALUE": _char_value,
    "NAN_VALUE": lambda: NAN,
    "TRUE_VALUE": lambda: True,
    "FALSE_VALUE": lambda: False,
}

_META_FUNCTIONS = {
    "TOPIC_NAME": "topic",
    "CORRELATION_ID": "correlation_id",
    "BOOKMARK": "bookmark",
    "SOW_KEY": "sow_key",
    "MESSAGE_SIZE": "length",
}


def evaluate(node, data, meta=None):
    """The value of a tree: None is NULL / UNKNOWN."""
    kind = node[0]
    ev = lambda n: evaluate(n, data, meta)  # noqa: E731
    if kind == "lit":
        v = node[1]
        return None if v == "" else v
    if kind == "field":
        return field(data, node[1])
    if kind == "neg":
        v = num(scalar(ev(node[1])))
        if v is None:
            return None
        return fit(-v) if isinstance(v, int) else -v
    if kind == "arith":
        return arith(node[1], ev(node[2]), ev(node[3]))
    if kind == "cmp":
        return cmp_values(node[1], ev(node[2]), ev(node[3]))
    if kind == "and":
        return and3([truth(ev(node[1])), truth(ev(node[2]))])
    if kind == "or":
        return or3([truth(ev(node[1])), truth(ev(node[2]))])
    if kind == "not":
        return not3(truth(ev(node[1])))
    if kind == "between":
        _, x, low, high, negated = node
        lo, hi = scalar(ev(low)), scalar(ev(high))
        r = or3(and3([compare(">=", e, lo), compare("<=", e, hi)]) for e in elems(ev(x)))
        return not3(r) if negated else r
    if kind == "in":
        _, x, items, negated = node
        xv = ev(x)
        r = or3(cmp_values("=", xv, ev(i)) for i in items)
        return not3(r) if negated else r
    if kind == "like":
        _, x, pattern, negated = node

        def one(e):
            t = text(e)
            return None if t is None else re.search(pattern, t, re.ASCII) is not None

        r = or3(one(e) for e in elems(ev(x)))
        return not3(r) if negated else r
    if kind == "affix":
        _, which, x, items, negated = node
        texts = [text(scalar(ev(i))) for i in items]

        def one(e):
            t = text(e)
            if t is None:
                return None
            test = t.startswith if which == "BEGINS" else t.endswith
            return or3(None if it is None else test(it) for it in texts)

        r = or3(one(e) for e in elems(ev(x)))
        return not3(r) if negated else r
    if kind == "isnull":
        v = ev(node[1])
        r = v is None or v == "" or v == []
        return (not r) if node[2] else r
    if kind == "call":
        _, name, args = node
        if name == "IF":
            cond, yes, no = args
            return scalar(ev(yes)) if truth(ev(cond)) is True else scalar(ev(no))
        if name == "COALESCE":
            for a in args:
                v = scalar(ev(a))
                if v is not None:
                    return v
            return None
        if name in _META_FUNCTIONS:
            v = (meta or {}).get(_META_FUNCTIONS[name])
            return scalar(v)
        if name == "UNIX_TIMESTAMP":
            return (meta or {}).get("now")
        return FUNCTIONS[name](*[scalar(ev(a)) for a in args])
    raise ValueError(f"unknown node {node!r}")


def matches(node, data, meta=None) -> bool:
    """A filter matches only when its value is TRUE."""
    return truth(evaluate(node, data, meta)) is True


# --- rendering ------------------------------------------------------------------------------

# Precedence levels: a child is wrapped in parentheses when its level is below what its
# position needs.
_OR, _AND, _NOT, _CMP, _ADD, _MUL, _UNARY, _ATOM = range(1, 9)


def render_literal(v, quote="'"):
    if v is None:
        return "NULL"
    if v is True:
        return "TRUE"
    if v is False:
        return "FALSE"
    if isinstance(v, str):
        body = v.replace("\\", "\\\\").replace(quote, "\\" + quote)
        return quote + body + quote
    return repr(v)


def _name_ok(name: str) -> bool:
    return re.fullmatch(r"@?\w[\w.\-]*", name) is not None


def render_field(steps):
    out = []
    for i, s in enumerate(steps):
        if isinstance(s, int):
            out.append(f"[{s}]")
        elif i == 0 and not _name_ok(s):
            out.append(f"[/{s}]")
        else:
            out.append(f"/{s}")
    return "".join(out)


def render(node, style=None) -> str:
    """Filter text for a tree. ``style`` (a random.Random or None) varies the spelling:
    keyword case, ``=``/``==``, ``!=``/``<>``, quote characters, spacing."""
    return _render(node, style)[0]


def _pick(style, *options):
    return options[0] if style is None else style.choice(options)


def _kw(style, word):
    return _pick(style, word, word.lower(), word.capitalize())


def _wrap(node, level, style):
    text_, own = _render(node, style)
    return f"({text_})" if own < level else text_


def _render(node, style):
    kind = node[0]
    if kind == "lit":
        v = node[1]
        if v is None or isinstance(v, bool):
            return _kw(style, render_literal(v)), _ATOM
        if isinstance(v, str):
            return render_literal(v, _pick(style, "'", '"')), _ATOM
        t = repr(v)
        return t, (_UNARY if t.startswith("-") else _ATOM)
    if kind == "field":
        return render_field(node[1]), _ATOM
    if kind == "neg":
        return "-" + _wrap(node[1], _UNARY, style), _UNARY
    if kind == "arith":
        _, op, a, b = node
        level = _ADD if op in "+-" else _MUL
        return f"{_wrap(a, level, style)} {op} {_wrap(b, level + 1, style)}", level
    if kind == "cmp":
        _, op, a, b = node
        spelled = {"=": _pick(style, "=", "=="), "!=": _pick(style, "!=", "<>")}.get(op, op)
        return f"{_wrap(a, _ADD, style)} {spelled} {_wrap(b, _ADD, style)}", _CMP
    if kind in ("and", "or"):
        level = _AND if kind == "and" else _OR
        word = _kw(style, kind.upper())
        return f"{_wrap(node[1], level, style)} {word} {_wrap(node[2], level + 1, style)}", level
    if kind == "not":
        return f"{_kw(style, 'NOT')} {_wrap(node[1], _NOT, style)}", _NOT
    neg = lambda negated: _kw(style, "NOT") + " " if negated else ""  # noqa: E731
    if kind == "between":
        _, x, low, high, negated = node
        return (
            f"{_wrap(x, _ADD, style)} {neg(negated)}{_kw(style, 'BETWEEN')} "
            f"{_wrap(low, _ADD, style)} {_kw(style, 'AND')} {_wrap(high, _ADD, style)}",
            _CMP,
        )
    if kind == "in":
        _, x, items, negated = node
        inside = ", ".join(_wrap(i, _OR, style) for i in items)
        return f"{_wrap(x, _ADD, style)} {neg(negated)}{_kw(style, 'IN')} ({inside})", _CMP
    if kind == "like":
        _, x, pattern, negated = node
        pattern_text = render_literal(pattern, _pick(style, "'", '"'))
        return f"{_wrap(x, _ADD, style)} {neg(negated)}{_kw(style, 'LIKE')} {pattern_text}", _CMP
    if kind == "affix":
        _, which, x, items, negated = node
        inside = ", ".join(_wrap(i, _OR, style) for i in items)
        words = f"{_kw(style, which)} {_kw(style, 'WITH')}"
        return f"{_wrap(x, _ADD, style)} {neg(negated)}{words} ({inside})", _CMP
    if kind == "isnull":
        _, x, negated = node
        words = f"{_kw(style, 'IS')} {neg(negated)}{_kw(style, 'NULL')}"
        return f"{_wrap(x, _ADD, style)} {words}", _CMP
    if kind == "call":
        _, name, args = node
        inside = ", ".join(_wrap(a, _OR, style) for a in args)
        return f"{_pick(style, name, name.lower())}({inside})", _ATOM
    raise ValueError(f"unknown node {node!r}")


# --- aggregates (reference G.3), from scratch -------------------------------------------------
# Written straight from docs/sow-and-views.md: every function recomputed over the whole
# multiset of a group's values, for comparison with the incremental accumulators.

AGGREGATE_NAMES = ("AVG", "COUNT", "COUNT_DISTINCT", "MIN", "MAX", "STDDEV_POP", "STDDEV_SAMP", "SUM", "ANY")


def _agg_number(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    n = number_of(v)
    return NAN if n is None else n


def _exact(numbers):
    from fractions import Fraction

    return sum((Fraction(x) for x in numbers), Fraction(0))


def _specials(numbers):
    if any(isnan(x) for x in numbers):
        return NAN
    pos = any(x == math.inf for x in numbers)
    neg = any(x == -math.inf for x in numbers)
    if pos and neg:
        return NAN
    if pos:
        return math.inf
    if neg:
        return -math.inf
    return None


def _rank(v):
    """MIN/MAX order: numbers (and numeric text) by value below text by text; NaN last;
    equal numbers ordered int, float, text, then by text."""
    if isinstance(v, bool):
        return (0, int(v), 0, "")
    if isinstance(v, int):
        return (0, v, 1, "")
    if isinstance(v, float):
        return (2, 0, 0, "") if isnan(v) else (0, v, 2, "")
    n = number_of(v)
    if n is None:
        return (1, 0, 0, v)
    return (2, 0, 0, v) if isnan(n) else (0, n, 3, v)


def _same_value(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return ("nan",) if isnan(v) else v
    n = number_of(v)
    if n is None:
        return ("text", v)
    return ("nan",) if isnan(n) else n


def _double(q):
    """An exact rational rounded to a double; beyond the double range, an infinity."""
    from fractions import Fraction

    if abs(q) >= Fraction(2) ** 1024:
        return math.inf if q > 0 else -math.inf
    return float(q)


def aggregate(name, values):
    """Aggregate function ``name`` over every value of a group (NULLs skipped)."""
    present = [s for s in (scalar(v) for v in values) if s is not None]
    if name == "COUNT":
        return len(present)
    if name == "COUNT_DISTINCT":
        return len({_same_value(v) for v in present})
    if not present:
        return None
    if name in ("MIN", "ANY"):
        return min(present, key=_rank)
    if name == "MAX":
        return max(present, key=_rank)
    numbers = [_agg_number(v) for v in present]
    special = _specials(numbers)
    if name in ("STDDEV_POP", "STDDEV_SAMP"):
        n = len(numbers)
        if name == "STDDEV_SAMP" and n < 2:
            return None
        if special is not None:
            return NAN
        from fractions import Fraction

        mean = _exact(numbers) / n
        squares = sum(((Fraction(x) - mean) ** 2 for x in numbers), Fraction(0))
        variance = squares / (n - 1 if name == "STDDEV_SAMP" else n)
        return math.sqrt(float(variance)) if variance < Fraction(2) ** 1024 else math.inf
    if special is not None:
        return special
    all_ints = all(isinstance(x, int) for x in numbers)
    if name == "SUM":
        return fit(sum(numbers)) if all_ints else _double(_exact(numbers))
    if name == "AVG":
        return sum(numbers) / len(numbers) if all_ints else _double(_exact(numbers) / len(numbers))
    raise ValueError(name)


def substitute_aggregates(node, group_messages, meta=None):
    """``node`` with every aggregate call replaced by its value over ``group_messages``."""
    kind = node[0]
    if kind == "call" and node[1] in AGGREGATE_NAMES:
        (arg,) = node[2]
        return ("lit", aggregate(node[1], [evaluate(arg, m, meta) for m in group_messages]))
    out = [kind]
    for part in node[1:]:
        if isinstance(part, tuple) and part and isinstance(part[0], str) and part[0] in _NODE_KINDS:
            out.append(substitute_aggregates(part, group_messages, meta))
        elif isinstance(part, tuple) and part and all(isinstance(p, tuple) and p and p[0] in _NODE_KINDS for p in part):
            out.append(tuple(substitute_aggregates(p, group_messages, meta) for p in part))
        else:
            out.append(part)
    return tuple(out)


_NODE_KINDS = {"lit", "field", "neg", "arith", "cmp", "and", "or", "not", "between", "in", "like", "affix",
               "isnull", "call"}
