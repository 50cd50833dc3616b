"""LIKE patterns: checked for cost, compiled once, matched as a search.

Rules kept here (spec 5.5, and the choices of docs/expressions.md):
- The pattern is a regular expression in the stdlib ``re`` dialect (close to PCRE),
  compiled with ``re.ASCII``: ``(?i)``, ``\\w``, ``\\d`` and ``\\s`` are not
  Unicode-aware, as in AMPS. Matching is a search (unanchored); ``^``/``$`` anchor.
- The stdlib engine backtracks and has no timeout, so a pattern is accepted only if a
  cost model bounds its worst case:
  * A repeated part (``*``, ``+``, ``{m,n}`` with n > 1) may not contain another
    quantifier, nor an alternation whose branches can start with the same character:
    ``(a+)+``, ``(a|a)*``, ``(a?){30}`` are rejected (they are exponential).
  * Conditional groups ``(?(1)...)`` are rejected.
  * Otherwise a cost model (class _Analysis) bounds the work of one search over a
    subject of n characters: n start positions (only one that goes anywhere when the
    pattern starts with ``^`` or ``\\A``) times C(n), the work of one attempt. Each
    item of the pattern costs its own work once per backtracking path that reaches
    it. A repeat opens up to n + 1 paths (or its range), unless it cannot give
    characters back usefully (it ends the pattern, it is possessive, its count is
    fixed, or what follows can never start with a character it consumes);
    alternations add their paths; backreferences and scans cost their width;
    lookarounds and atomic groups cost their body but open no paths. C(n) is a
    polynomial in n + 1, built in one walk over the parsed pattern.
  * Each pattern gets the largest subject length n whose cost fits
    limits.regex_cost_ticks_max (at most limits.regex_subject_chars_max). If that is
    below limits.regex_subject_chars_min the pattern is rejected; a longer subject
    makes LIKE UNKNOWN (never a guess).
  Backreferences are allowed (``(.)\\1`` is a documented AMPS example).
- A pattern that is only literal text, optionally anchored by ``^`` and ``$``/``\\Z``
  and without flags, is matched with str operations (startswith, endswith, ``in``):
  the same answer, linear time, no subject limit.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Callable

from re import _constants as C  # the stdlib regex parser's opcodes (3.11+)
from re import _compiler as sre_compiler
from re import _parser as sre_parse

from .errors import ExpressionError, shorten
from .limits import (
    regex_class_chars_max,
    regex_cost_ticks_max,
    regex_pattern_chars_max,
    regex_subject_chars_max,
    regex_subject_chars_min,
)

_BYTE_RANGE = frozenset(range(256))
_CATEGORIES = {
    C.CATEGORY_DIGIT: (frozenset(range(48, 58)), False),
    C.CATEGORY_NOT_DIGIT: (_BYTE_RANGE - frozenset(range(48, 58)), True),
    C.CATEGORY_SPACE: (frozenset({9, 10, 11, 12, 13, 32}), False),
    C.CATEGORY_NOT_SPACE: (_BYTE_RANGE - frozenset({9, 10, 11, 12, 13, 32}), True),
    C.CATEGORY_WORD: (
        frozenset([*range(48, 58), *range(65, 91), *range(97, 123), 95]),
        False,
    ),
    C.CATEGORY_NOT_WORD: (
        _BYTE_RANGE - frozenset([*range(48, 58), *range(65, 91), *range(97, 123), 95]),
        True,
    ),
}
_UNIVERSE = (_BYTE_RANGE, True)
_SINGLE_CHAR_OPS = (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN)
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT)


class _Unsafe(Exception):
    """The pattern is outside the accepted subset; the message says why."""


# A character set is (codes below 256, may-match-a-code-above-255). Two sets are
# disjoint only if both parts are: the upper part is not tracked, so it is assumed to
# overlap. Conservative, never wrong in the unsafe direction.
CharSet = tuple[frozenset, bool]


def _with_case(codes: frozenset) -> frozenset:
    extra = {c ^ 0x20 for c in codes if 65 <= c <= 90 or 97 <= c <= 122}
    return codes | extra


def _charset(op, av, ignore_case: bool) -> CharSet:
    if op is C.LITERAL:
        result = (frozenset({av}), False) if av < 256 else (frozenset(), True)
    elif op is C.IN:
        negate = False
        codes: set[int] = set()
        high = False
        for item_op, item_av in av:
            if item_op is C.NEGATE:
                negate = True
            elif item_op is C.LITERAL:
                if item_av < 256:
                    codes.add(item_av)
                else:
                    high = True
            elif item_op is C.RANGE:
                lo, hi = item_av
                codes.update(range(lo, min(hi, 255) + 1))
                high = high or hi > 255
            elif item_op is C.CATEGORY and item_av in _CATEGORIES:
                cat_codes, cat_high = _CATEGORIES[item_av]
                codes |= cat_codes
                high = high or cat_high
            else:
                return _UNIVERSE
        if negate:
            return (_BYTE_RANGE - frozenset(codes), True)
        result = (frozenset(codes), high)
    else:  # ANY, NOT_LITERAL and anything unusual: could be almost anything
        return _UNIVERSE
    if ignore_case:
        result = (_with_case(result[0]), result[1])
    return result


def _disjoint(a: CharSet, b: CharSet) -> bool:
    return not (a[0] & b[0]) and not (a[1] and b[1])


def _first_charset(item, ignore_case: bool) -> CharSet | None:
    """The characters that can start ``item``, if it must consume at least one."""
    op, av = item
    if op in _SINGLE_CHAR_OPS:
        return _charset(op, av, ignore_case)
    if op in _REPEATS:
        lo, _hi, body = av
        if lo >= 1 and len(body) == 1 and body[0][0] in _SINGLE_CHAR_OPS:
            return _charset(body[0][0], body[0][1], ignore_case)
    return None


def _ignore_case(flags: int) -> bool:
    return bool(flags & C.SRE_FLAG_IGNORECASE)


class _Poly(tuple):
    """A polynomial in x = n + 1 with non-negative integer coefficients (index = degree).

    W(n) is a sum of products of per-item factors; each factor is a constant or at most
    n + 1, so W(n) <= a polynomial in n + 1 that the tree gives in one walk. The
    subject limit is then found by evaluating that polynomial, not by re-walking.
    """

    @staticmethod
    def const(c: int) -> _Poly:
        return _Poly((c,))

    def __add__(self, other: _Poly) -> _Poly:  # type: ignore[override]
        size = max(len(self), len(other))
        a = tuple(self) + (0,) * (size - len(self))
        b = tuple(other) + (0,) * (size - len(other))
        return _Poly(x + y for x, y in zip(a, b))

    def __mul__(self, other: _Poly) -> _Poly:  # type: ignore[override]
        out = [0] * (len(self) + len(other) - 1)
        for i, x in enumerate(self):
            if x:
                for j, y in enumerate(other):
                    out[i + j] += x * y
        return _Poly(out)

    def upper(self, other: _Poly) -> _Poly:
        """A polynomial at least as large as both, for every x >= 1."""
        size = max(len(self), len(other))
        a = tuple(self) + (0,) * (size - len(self))
        b = tuple(other) + (0,) * (size - len(other))
        return _Poly(max(x, y) for x, y in zip(a, b))

    def at(self, n: int) -> int:
        x = n + 1
        return sum(c * x**d for d, c in enumerate(self) if c)


_ZERO = _Poly.const(0)
_ONE = _Poly.const(1)
_X = _Poly((0, 1))  # n + 1: bounds anything that grows with the subject (runs, choices)
_BOUNDED_SPAN_MAX = 1024  # a repeat bound up to this counts as a constant, not as n + 1

# The cost model counts "ticks", calibrated on CPython 3.11's engine at about 1.2e9
# ticks per second. A character consumed by a single-character repeat (a tight C
# loop) or compared by a backreference costs 1 to 3 ns: 3 ticks. Any other opcode
# test, and every backtracking step, costs 6 to 17 ns: 20 ticks. Each iteration of a
# repeated group adds about 25 ns of bookkeeping (marks, the general repeat loop): 32
# ticks. Each start position of the search costs about 20 ns: 32 ticks. (Measured
# with the worst subjects of tests/expr/test_expr_regex.py and a random sweep of
# 8,000 patterns, whose slowest single search took about 0.25 s.)
_SCAN = _Poly.const(3)
_STEP = _Poly.const(20)
_SKIP = _Poly.const(3)  # one position skipped while looking for a literal (about 2.5 ns)
_GROUP_ITERATION = _Poly.const(32)
_START = 32


def _skips_to_literal(previous, item, flags: int, previous_op=None) -> bool:
    """Does the engine give back into ``item`` by a quick scan for its character?

    CPython's single-character repeats (REPEAT_ONE, MIN_REPEAT_ONE), when the rest of
    the pattern starts with a case-sensitive literal, skip every position where that
    literal is not next instead of trying the rest there: a few ticks, not a step.
    """
    op = previous_op if previous_op is not None else previous[0]
    if op not in (C.MAX_REPEAT, C.MIN_REPEAT) or item[0] is not C.LITERAL:
        return False
    if _ignore_case(flags):
        return False
    body = previous[1][2]
    return len(body) == 1 and body[0][0] in _SINGLE_CHAR_OPS


class _Analysis:
    """The cost model: for a sequence of parsed items, (W, C) as polynomials in n + 1.

    W is how many ways (backtracking paths) come out of the sequence; C is the work of
    one attempt through it, in ticks: every item is reached once per path through the
    items before it and costs its own work each time (sum of P_before * cost).
    """

    def __init__(self, parsed) -> None:
        self.group_widths = parsed.state.groupwidths
        # Work that happens once per search, not once per attempt: a repeat that ends
        # the pattern runs its full course only when the match succeeds, which ends
        # the search.
        self.once = _ZERO

    def sequence(self, items, flags: int, tail_free: bool, in_repeat: bool) -> tuple[_Poly, _Poly]:
        paths, cost = _ONE, _ZERO
        count = len(items)
        for i, item in enumerate(items):
            following = items[i + 1] if i + 1 < count else None
            factor, work = self.item(item, flags, tail_free and following is None, following, in_repeat)
            if i and _skips_to_literal(items[i - 1], item, flags):
                work = _SKIP  # the engine only stops where the literal is (see below)
            cost = cost + paths * work
            paths = paths * factor
        return paths, cost + paths * _STEP  # each path ends in one final success or failure

    def item(self, item, flags: int, last: bool, following, in_repeat: bool) -> tuple[_Poly, _Poly]:
        op, av = item
        if op in _SINGLE_CHAR_OPS or op is C.AT or op is C.CATEGORY:
            return _ONE, _STEP
        if op is C.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            return self.sequence(body, (flags | add_flags) & ~del_flags, last, in_repeat)
        if op is C.ATOMIC_GROUP:  # never re-entered once left: no ways out but one
            return _ONE, self.sequence(av, flags, last, in_repeat)[1]
        if op in (C.ASSERT, C.ASSERT_NOT):  # lookarounds are atomic in this engine too
            _direction, body = av
            return _ONE, self.sequence(body, flags, False, in_repeat)[1] + _STEP
        if op is C.BRANCH:
            return self.branch(av[1], flags, last, in_repeat)
        if op in _REPEATS:
            return self.repeat(op, av, flags, last, following, in_repeat)
        if op is C.GROUPREF:
            # No choice, but the comparison scans the group's width on every path.
            width = self.group_widths[av] if av < len(self.group_widths) else None
            bounded = width is not None and width[1] <= _BOUNDED_SPAN_MAX
            return _ONE, (_Poly.const(width[1] + 1) if bounded else _X) * _SCAN + _STEP
        if op is C.GROUPREF_EXISTS:
            raise _Unsafe("conditional groups are not supported")
        raise _Unsafe(f"unsupported construct {op}")

    def branch(self, alternatives, flags: int, tail_free: bool, in_repeat: bool) -> tuple[_Poly, _Poly]:
        results = [self.sequence(alt, flags, tail_free, in_repeat) for alt in alternatives]
        firsts = [_first_charset(alt[0], _ignore_case(flags)) if alt else None for alt in alternatives]
        distinct = all(f is not None for f in firsts) and all(
            _disjoint(firsts[a], firsts[b])
            for a in range(len(firsts))
            for b in range(a + 1, len(firsts))
        )
        tries = _Poly.const(len(results)) * _STEP
        if distinct:
            # Branches that start with different characters: at most one goes past its
            # first character, the others cost one test each.
            paths, cost = results[0]
            for w, c in results[1:]:
                paths, cost = paths.upper(w), cost.upper(c)
            return paths, cost + tries
        if in_repeat:
            raise _Unsafe("an alternation inside a repeated part must start each branch differently")
        paths, cost = _ZERO, tries
        for w, c in results:
            paths, cost = paths + w, cost + c
        return paths, cost

    def repeat(self, op, av, flags: int, tail_free: bool, following, in_repeat: bool) -> tuple[_Poly, _Poly]:
        lo, hi, body = av
        repeated = hi > 1
        if repeated and in_repeat:
            raise _Unsafe("nested quantifiers are not allowed")
        inner_paths, inner_cost = self.sequence(body, flags, False, in_repeat or repeated)
        if not repeated:  # x? : either x or nothing
            return inner_paths + _ONE, inner_cost + _STEP
        if inner_paths != _ONE:
            raise _Unsafe("a repeated part may not contain a choice (quantifier or alternation)")
        single = len(body) == 1 and body[0][0] in _SINGLE_CHAR_OPS
        bounded = hi != C.MAXREPEAT and hi <= _BOUNDED_SPAN_MAX
        iterations = _Poly.const(hi) if bounded else _X
        per_iteration = _SCAN if single else inner_cost + _GROUP_ITERATION
        forward = iterations * per_iteration + _STEP
        if tail_free:
            # Only its first ``lo`` iterations can fail; past them the match succeeds.
            self.once = self.once + forward
            return _ONE, _Poly.const(min(lo, _BOUNDED_SPAN_MAX)) * per_iteration + _STEP
        if op is C.POSSESSIVE_REPEAT or lo == hi:
            return _ONE, forward  # nothing to give back
        if following is not None and single:
            ignore = _ignore_case(flags)
            mine = _charset(body[0][0], body[0][1], ignore)
            theirs = _first_charset(following, ignore)
            if theirs is not None and _disjoint(mine, theirs):
                # What follows cannot start inside the run: the engine still gives back
                # one character at a time and tests, but nothing after that goes on.
                give_back = _SKIP if _skips_to_literal(("", av), following, flags, op) else _STEP
                return _ONE, forward + iterations * give_back
        if bounded and hi - lo + 1 <= _BOUNDED_SPAN_MAX:
            return _Poly.const(hi - lo + 1), forward
        return _X, forward


def _anchored_at_start(parsed) -> bool:
    """Does every match have to start at position 0 (``^`` without MULTILINE, or ``\\A``)?"""
    if not parsed.data:
        return False
    first = parsed.data[0]
    if first == (C.AT, C.AT_BEGINNING_STRING):
        return True
    return first == (C.AT, C.AT_BEGINNING) and not parsed.state.flags & C.SRE_FLAG_MULTILINE


def _subject_limit(parsed, budget: int) -> int:
    """The longest subject whose worst case fits the budget: n start positions x C(n)."""
    analysis = _Analysis(parsed)
    _paths, per_attempt = analysis.sequence(parsed.data, parsed.state.flags, True, False)
    once = analysis.once

    if _anchored_at_start(parsed):
        # The search still visits every start position, but the leading anchor fails at
        # once everywhere except position 0 (measured: microseconds for 20,000).
        def cost(n: int) -> int:
            return n * (_START + 20) + per_attempt.at(n) + once.at(n)

    else:

        def cost(n: int) -> int:
            return n * (per_attempt.at(n) + _START) + once.at(n)

    lo, hi = 0, regex_subject_chars_max
    if cost(hi) <= budget:
        return hi
    while lo < hi:  # cost grows with n: binary search
        mid = (lo + hi + 1) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _literal_form(parsed) -> tuple[str, str] | None:
    """(kind, text) when the pattern is plain text with optional anchors and no flags."""
    if parsed.state.flags & ~(C.SRE_FLAG_ASCII | C.SRE_FLAG_UNICODE):
        return None
    items = list(parsed.data)
    start = False
    end = ""
    if items and items[0] in ((C.AT, C.AT_BEGINNING), (C.AT, C.AT_BEGINNING_STRING)):
        start = True
        items = items[1:]
    if items and items[-1] == (C.AT, C.AT_END):
        end = "$"
        items = items[:-1]
    elif items and items[-1] == (C.AT, C.AT_END_STRING):
        end = "z"
        items = items[:-1]
    if any(op is not C.LITERAL for op, _av in items):
        return None
    text = "".join(chr(av) for _op, av in items)
    kind = {
        (True, "$"): "exact",
        (True, "z"): "exact_z",
        (True, ""): "prefix",
        (False, "$"): "suffix",
        (False, "z"): "suffix_z",
        (False, ""): "contains",
    }[(start, end)]
    return kind, text


def _literal_test(kind: str, text: str) -> Callable[[str], bool]:
    with_newline = text + "\n"  # "$" also matches just before a final newline
    if kind == "exact":
        return lambda s: s == text or s == with_newline
    if kind == "exact_z":
        return lambda s: s == text
    if kind == "prefix":
        return lambda s: s.startswith(text)
    if kind == "suffix":
        return lambda s: s.endswith(text) or s.endswith(with_newline)
    if kind == "suffix_z":
        return lambda s: s.endswith(text)
    return lambda s: text in s


@dataclass(frozen=True, slots=True)
class Pattern:
    """A checked LIKE pattern.

    ``kind`` is "regex", or for plain text one of "prefix", "suffix", "suffix_z",
    "exact", "exact_z", "contains" (``text`` holds the text). ``test(s)`` takes a
    non-empty str and gives True, False, or None when ``s`` is longer than
    ``subject_chars_max`` (-1: no limit, for plain text).
    """

    source: str
    kind: str
    text: str
    subject_chars_max: int
    search: Callable | None
    test: Callable[[str], bool | None]
    class_chars: int  # see class_chars(): spent from the expression's budget


def class_chars(items, ignore_case: bool = False) -> int:
    """Code points above 255 that the character classes of a parsed pattern span.

    The stdlib compiler builds a table for each class range, in time proportional to
    its span within 256..0xFFFF (about 6 ms for the whole plane, twice that ignoring
    case), so this is what limits.regex_class_chars_max bounds.
    """
    total = 0
    stack = [(items, ignore_case)]
    while stack:
        seq, ic = stack.pop()
        for op, av in seq:
            if op is C.IN:
                for item_op, item_av in av:
                    if item_op is C.RANGE:
                        lo, hi = max(item_av[0], 256), min(item_av[1], 0xFFFF)
                        if hi >= lo:
                            total += (hi - lo + 1) * (2 if ic else 1)
                # Negation and categories (\W, \D) cost nothing measurable: only
                # explicit ranges are tabulated code point by code point.
            elif op is C.SUBPATTERN:
                _group, add_flags, del_flags, body = av
                scoped = (ic or bool(add_flags & C.SRE_FLAG_IGNORECASE)) and not del_flags & C.SRE_FLAG_IGNORECASE
                stack.append((body, scoped))
            elif op in _REPEATS:
                stack.append((av[2], ic))
            elif op is C.BRANCH:
                stack.extend((alt, ic) for alt in av[1])
            elif op in (C.ASSERT, C.ASSERT_NOT):
                stack.append((av[1], ic))
            elif op is C.ATOMIC_GROUP:
                stack.append((av, ic))
            elif op is C.GROUPREF_EXISTS:
                _group, yes, no = av
                stack.append((yes, ic))
                if no is not None:
                    stack.append((no, ic))
    return total


def _compile_parsed(source: str, parsed):
    """Compile an already parsed pattern (saves parsing twice; falls back to re.compile)."""
    try:
        return sre_compiler.compile(parsed, re.ASCII)
    except (AttributeError, TypeError):  # a Python whose private API moved
        return re.compile(source, re.ASCII)


def is_plain_text(source: str) -> bool:
    """Will compile_pattern match this with str methods (no regex engine, no cost)?"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _literal_form(sre_parse.parse(source, re.ASCII)) is not None
    except Exception:  # noqa: BLE001 - compile_pattern reports the real error
        return False


def _invalid(source: str, pos: int, exc: Exception) -> ExpressionError:
    """A pattern the stdlib refuses: the error names the pattern (cut when long) and,
    when the compiler knows it, the character of the pattern where it stops being one
    (``details["pattern_position"]``), besides the literal's position in the filter."""
    if isinstance(exc, re.error):
        reason = exc.msg if exc.pos is None else f"{exc.msg} (character {exc.pos} of the pattern)"
    elif isinstance(exc, RecursionError):
        reason = "parentheses nested too deeply"
    else:
        reason = str(exc)
    error = ExpressionError(f"invalid LIKE pattern {shorten(source)!r}: {reason}", pos, source)
    if isinstance(exc, re.error) and exc.pos is not None:
        error.details["pattern_position"] = exc.pos
    return error


def compile_pattern(
    source: str,
    pos: int,
    class_chars_left: int = regex_class_chars_max,
    sharing: int = 1,
) -> Pattern:
    """Check and compile a LIKE pattern; errors point at ``pos`` (the literal's offset).

    The expression's budgets are shared by its LIKE operators: ``class_chars_left`` is
    what remains of limits.regex_class_chars_max, and the work budget
    limits.regex_cost_ticks_max is split evenly between the ``sharing`` patterns that
    need the regex engine, so that one evaluation of the whole expression stays
    within it.
    """
    if len(source) > regex_pattern_chars_max:
        raise ExpressionError(
            f"LIKE pattern longer than {regex_pattern_chars_max} characters", pos, source
        )
    try:
        with warnings.catch_warnings():
            # e.g. FutureWarning "possible nested set": not our caller's business.
            warnings.simplefilter("ignore")
            parsed = sre_parse.parse(source, re.ASCII)
    except (re.error, OverflowError, RecursionError, ValueError, TypeError) as exc:
        raise _invalid(source, pos, exc) from None
    literal = _literal_form(parsed)
    if literal is not None:
        kind, text = literal
        return Pattern(source, kind, text, -1, None, _literal_test(kind, text), 0)
    chars = class_chars(parsed.data, _ignore_case(parsed.state.flags))
    if chars > class_chars_left:
        raise ExpressionError(
            "LIKE character classes span too many non-ASCII characters "
            f"(more than {regex_class_chars_max} in one expression)",
            pos,
            source,
        )
    try:
        limit = _subject_limit(parsed, regex_cost_ticks_max // max(sharing, 1))
    except _Unsafe as exc:
        raise ExpressionError(f"LIKE pattern not accepted: {exc}", pos, source) from None
    except RecursionError:
        raise ExpressionError("LIKE pattern nested too deeply", pos, source) from None
    if limit < regex_subject_chars_min:
        shared = f", shared by {sharing} LIKE patterns," if sharing > 1 else ""
        raise ExpressionError(
            "LIKE pattern not accepted: it could backtrack too much "
            f"(fewer than {regex_subject_chars_min} characters fit the work budget{shared})",
            pos,
            source,
        )
    try:
        compiled = _compile_parsed(source, parsed)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        raise _invalid(source, pos, exc) from None
    search = compiled.search

    def test(s: str) -> bool | None:
        if len(s) > limit:
            return None
        return search(s) is not None

    return Pattern(source, "regex", "", limit, search, test, chars)
