"""Aggregate functions (reference G.3), kept incrementally: every accumulator can take a
value out again, so a view over a changing set (SOW records replaced, queue messages
leased and returned) is updated per change, never recomputed.

Rules kept here:
- An accumulator's result depends only on the multiset of values it holds, never on
  the order they came and went, so an incremental view equals a recomputation from
  scratch (the property tests check this against tests/expr/reference_eval.py).
- NULL values (None, '', objects, empty arrays) are skipped by every function; an
  array stands for its first element (spec 8: functions are not array-aware).
- ``SUM`` is the exact sum, rounded once: integers are summed as integers (the result
  stays an integer while no value is a double, 64-bit rules applied to the result);
  with any double the exact sum of every value is rounded once to a double. Doubles
  are held as Shewchuk partials (as ``math.fsum``), which add and subtract exactly;
  near the largest double, where partials would overflow, as an exact Fraction.
  A non-numeric string makes the result NaN (it counts as NaN), as do +inf and -inf
  together; ``AVG`` is that exact sum over ``COUNT``.
- ``STDDEV_POP`` / ``STDDEV_SAMP`` keep exact rational sums of x and x*x; ``STDDEV_SAMP``
  of fewer than two values is NULL.
- ``MIN`` / ``MAX`` / ``ANY``: numbers (and numeric strings) compare numerically and
  rank below non-numeric strings, which compare as strings; NaN ranks above all. Ties
  between equal numbers of different spellings are broken by type (int, float,
  string) and text, so the result is one definite value. ``ANY`` is the ``MIN``
  (one of the group's values, the same one every time).
- ``COUNT_DISTINCT``: values equal by the type rules count once (7, 7.0 and '7').
- An empty group (every value NULL) gives NULL for every function but ``COUNT`` and
  ``COUNT_DISTINCT`` (0).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

from .values import NAN, big_int, parse_number, scalar, to_number

INF = math.inf

#: The aggregate function names (reference G.3), each taking one argument.
AGGREGATES = frozenset({"AVG", "COUNT", "COUNT_DISTINCT", "MIN", "MAX", "STDDEV_POP", "STDDEV_SAMP", "SUM", "ANY"})


# --- exact float sums (Shewchuk) ---------------------------------------------------------

#: Integers below this magnitude convert to a double exactly.
_FLOAT_EXACT_INT = 2**53
#: Partials and values below this magnitude never overflow when added (the largest
#: double is just under 2**1024); at or above it a sum is kept as a Fraction instead.
_PARTIALS_MAX = 2.0**1000


def _add_partials(partials: list[float], x: float) -> None:
    """Add ``x`` to the non-overlapping partials exactly (as math.fsum does)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x] if x else []


class _Sum:
    """The exact sum of numbers, with the NaN and infinity counts (the module rules)."""

    __slots__ = ("n", "ints", "partials", "big", "floats", "nans", "pos_inf", "neg_inf")

    def __init__(self) -> None:
        self.n = 0
        self.ints = 0
        self.partials: list[float] = []
        # The doubles' exact sum once partials could overflow (values near the largest
        # double: Shewchuk's partials hold no infinity exactly); None until then.
        self.big: Fraction | None = None
        self.floats = 0
        self.nans = 0
        self.pos_inf = 0
        self.neg_inf = 0

    def change(self, x, sign: int) -> None:
        self.n += sign
        if type(x) is int:
            self.ints += sign * x
            return
        self.floats += sign
        if x != x:
            self.nans += sign
        elif x == INF:
            self.pos_inf += sign
        elif x == -INF:
            self.neg_inf += sign
        else:
            v = x if sign > 0 else -x
            partials = self.partials
            if self.big is None and -_PARTIALS_MAX < v < _PARTIALS_MAX and (
                    not partials or -_PARTIALS_MAX < partials[-1] < _PARTIALS_MAX):  # [-1]: the largest
                _add_partials(partials, v)
            else:
                if self.big is None:
                    self.big = sum((Fraction(p) for p in partials), Fraction(0))
                    self.partials = []
                self.big += Fraction(v)
            if not self.floats:
                self.partials = []  # no double left: they sum to zero exactly
                self.big = None

    def special(self):
        if self.nans or (self.pos_inf and self.neg_inf):
            return NAN
        if self.pos_inf:
            return INF
        if self.neg_inf:
            return -INF
        return None

    def exact(self) -> Fraction:
        total = Fraction(self.ints) + sum((Fraction(p) for p in self.partials), Fraction(0))
        return total if self.big is None else total + self.big

    def total(self):
        if not self.n:
            return None
        special = self.special()
        if special is not None:
            return special
        if not self.floats:
            return big_int(self.ints)
        if self.big is None and -_FLOAT_EXACT_INT < self.ints < _FLOAT_EXACT_INT:
            # The same single rounding, fast: fsum rounds the exact sum of its inputs
            # once, and these inputs are exact (the integer part converts exactly).
            try:
                return math.fsum(self.partials) + 0.0 if not self.ints else math.fsum([*self.partials, self.ints])
            except OverflowError:
                pass  # an intermediate overflow: the rational sum below decides
        try:
            return float(self.exact())
        except OverflowError:
            return INF if self.exact() > 0 else -INF


# --- the accumulators --------------------------------------------------------------------


class Accumulator:
    """One aggregate over a changing multiset: ``add(v)``, ``remove(v)``, ``result()``.
    ``v`` is the argument's value for one member (any runtime value)."""

    __slots__ = ()

    def add(self, value) -> None:
        raise NotImplementedError

    def remove(self, value) -> None:
        raise NotImplementedError

    def result(self) -> object:
        raise NotImplementedError


class Count(Accumulator):
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def add(self, value) -> None:
        if scalar(value) is not None:
            self.n += 1

    def remove(self, value) -> None:
        if scalar(value) is not None:
            self.n -= 1

    def result(self):
        return self.n


class Sum(Accumulator):
    __slots__ = ("s",)

    def __init__(self) -> None:
        self.s = _Sum()

    def add(self, value) -> None:
        x = to_number(scalar(value))
        if x is not None:
            self.s.change(x, 1)

    def remove(self, value) -> None:
        x = to_number(scalar(value))
        if x is not None:
            self.s.change(x, -1)

    def result(self):
        return self.s.total()


class Avg(Sum):
    __slots__ = ()

    def result(self):
        s = self.s
        if not s.n:
            return None
        special = s.special()
        if special is not None:
            return special
        if not s.floats:
            return s.ints / s.n
        try:
            return float(s.exact() / s.n)
        except OverflowError:
            return INF if s.exact() > 0 else -INF


class StdDev(Accumulator):
    """Exact rational sums of x and x*x (the module rules)."""

    __slots__ = ("sample", "n", "sx", "sxx", "nans", "infs")

    def __init__(self, sample: bool) -> None:
        self.sample = sample
        self.n = 0
        self.sx = Fraction(0)
        self.sxx = Fraction(0)
        self.nans = 0
        self.infs = 0

    def _change(self, value, sign: int) -> None:
        x = to_number(scalar(value))
        if x is None:
            return
        self.n += sign
        if x != x:
            self.nans += sign
        elif x in (INF, -INF):
            self.infs += sign
        else:
            f = Fraction(x)
            self.sx += sign * f
            self.sxx += sign * f * f

    def add(self, value) -> None:
        self._change(value, 1)

    def remove(self, value) -> None:
        self._change(value, -1)

    def result(self):
        n = self.n
        if n == 0 or (self.sample and n < 2):
            return None
        if self.nans or self.infs:
            return NAN
        spread = n * self.sxx - self.sx * self.sx
        variance = spread / (n * (n - 1) if self.sample else n * n)
        try:
            return math.sqrt(float(variance))
        except OverflowError:
            return INF


def order_key(value) -> tuple:
    """MIN / MAX order (the module rules): a total order over scalar values."""
    t = type(value)
    if t is bool:
        return (0, int(value), 0, "")
    if t is int:
        return (0, value, 1, "")
    if t is float:
        if value != value:
            return (2, 0, 0, "")
        return (0, value, 2, "")
    n = parse_number(value)
    if n is None:
        return (1, 0, 0, value)
    if n != n:
        return (2, 0, 0, value)
    return (0, n, 3, value)


def equality_key(value) -> object:
    """COUNT_DISTINCT equality: numbers and numeric text by value, other text as text."""
    t = type(value)
    if t is bool:
        return int(value)
    if t is int or t is float:
        return ("nan",) if value != value else value
    n = parse_number(value)
    if n is None:
        return ("text", value)
    return ("nan",) if n != n else n


class _Counted(Accumulator):
    """A multiset of scalar values by a key; subclasses read it."""

    __slots__ = ("counts", "key")

    def __init__(self, key: Callable) -> None:
        self.counts: dict = {}  # key -> [count, value]
        self.key = key

    def add(self, value) -> None:
        v = scalar(value)
        if v is None:
            return
        k = self.key(v)
        hit = self.counts.get(k)
        if hit is None:
            self.counts[k] = [1, v]
            self._added(k)
        else:
            hit[0] += 1

    def remove(self, value) -> None:
        v = scalar(value)
        if v is None:
            return
        k = self.key(v)
        hit = self.counts[k]
        hit[0] -= 1
        if not hit[0]:
            del self.counts[k]
            self._removed(k)

    def _added(self, k) -> None:
        pass

    def _removed(self, k) -> None:
        pass


class Extreme(_Counted):
    """MIN (``lowest``) or MAX: the cached best key, found again only when it goes."""

    __slots__ = ("lowest", "best")

    def __init__(self, lowest: bool) -> None:
        super().__init__(order_key)
        self.lowest = lowest
        self.best = None

    def _added(self, k) -> None:
        if self.best is None or (k < self.best if self.lowest else k > self.best):
            self.best = k

    def _removed(self, k) -> None:
        if k == self.best:
            if not self.counts:
                self.best = None
            else:
                self.best = min(self.counts) if self.lowest else max(self.counts)

    def result(self):
        return None if self.best is None else self.counts[self.best][1]


class CountDistinct(_Counted):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(equality_key)

    def result(self):
        return len(self.counts)


_MAKERS: dict[str, Callable[[], Accumulator]] = {
    "COUNT": Count,
    "SUM": Sum,
    "AVG": Avg,
    "STDDEV_POP": lambda: StdDev(False),
    "STDDEV_SAMP": lambda: StdDev(True),
    "MIN": lambda: Extreme(True),
    "MAX": lambda: Extreme(False),
    "ANY": lambda: Extreme(True),
    "COUNT_DISTINCT": CountDistinct,
}


def accumulator(name: str) -> Accumulator:
    """A new, empty accumulator for aggregate function ``name`` (upper case)."""
    return _MAKERS[name]()
