"""Aggregates and projections (reference G.3, G.4): the incremental view state against a
recomputation from scratch with the reference evaluator.

1. Property: random projections (aggregate functions over random argument trees, with
   arithmetic around them and plain fields beside them), random messages added and
   removed in random order: after every change, every group's record equals the one
   recomputed from the group's current messages by tests/expr/reference_eval.py.
2. Vectors from the reference: the MIN/MAX example set, NULL handling, SUM's types.
3. Errors: aggregates in filters, nested aggregates, AS rules, non-deterministic
   functions.
"""

from __future__ import annotations

import math
import os
import random
import sys

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import expr
from conveyor.engine.sow.aggregation import Aggregation
from conveyor.expr import ExpressionError
from conveyor.expr.aggregates import accumulator
from conveyor.expr.projection import Projection
from conveyor.expr.values import scalar

sys.path.insert(0, os.path.dirname(__file__))
import reference_eval as ref  # noqa: E402
from test_expr_properties import same, scalars, trees  # noqa: E402

SETTINGS = settings(max_examples=int(os.environ.get("EXPR_EXAMPLES", "200")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

GROUPS = ["EU", "US", "ASIA", None]
NUMBERS = st.one_of(
    st.integers(-5, 100), st.floats(-1e6, 1e6, allow_nan=False, width=32), st.sampled_from([0.1, 0.2, 0.3, 1e16, -1e16]),
)
group_values = st.sampled_from(GROUPS)
messages = st.fixed_dictionaries(
    {"g": group_values},
    optional={"a": st.one_of(NUMBERS, scalars), "b": st.one_of(NUMBERS, scalars), "n": NUMBERS,
              "s": st.sampled_from(["x", "y", "10", "9", ""])},
)
AGGREGATE_TREES = st.tuples(st.sampled_from(ref.AGGREGATE_NAMES), trees).map(lambda p: ("call", p[0], (p[1],)))
PLAIN_ARGS = st.sampled_from([("field", ("a",)), ("field", ("n",)), ("field", ("b",)), ("field", ("s",)),
                              ("arith", "*", ("field", ("n",)), ("field", ("a",)))])
SIMPLE_AGGREGATES = st.tuples(st.sampled_from(ref.AGGREGATE_NAMES), PLAIN_ARGS).map(lambda p: ("call", p[0], (p[1],)))
FIELD_TREES = st.one_of(
    AGGREGATE_TREES,
    SIMPLE_AGGREGATES,
    SIMPLE_AGGREGATES.map(lambda t: ("arith", "+", t, ("lit", 1))),
    st.tuples(SIMPLE_AGGREGATES, SIMPLE_AGGREGATES).map(lambda p: ("arith", "/", p[0], p[1])),
    st.sampled_from([("field", ("g",)), ("field", ("a",)), ("field", ("s",))]),
)


def _group_key(message: dict) -> tuple:
    v = scalar(ref.field(message, ("g",)))
    return (("bool", v) if isinstance(v, bool) else v,)


def _expected(field_trees, members: dict) -> dict:
    """group key -> the record recomputed from the group's current messages."""
    groups: dict = {}
    for member, (order, message) in members.items():
        groups.setdefault(_group_key(message), []).append((order, message))
    out = {}
    for key, rows in groups.items():
        msgs = [m for _, m in rows]
        newest = max(rows, key=lambda r: r[0])[1]
        record = {}
        for i, tree in enumerate(field_trees):
            value = scalar(ref.evaluate(ref.substitute_aggregates(tree, msgs), newest))
            if value is not None:
                record[f"f{i}"] = value
        out[key] = record
    return out


def _same_record(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(same(got[k], want[k]) for k in got)


@SETTINGS
@given(field_trees=st.lists(FIELD_TREES, min_size=1, max_size=4), pool=st.lists(messages, min_size=1, max_size=12),
       seed=st.integers(0, 2**32 - 1))
def test_incremental_groups_equal_a_recomputation(field_trees, pool, seed):
    rng = random.Random(seed)
    fields = [f"{ref.render(t, rng)} AS /f{i}" for i, t in enumerate(field_trees)]
    projection = Projection(fields, ["/g"])
    agg = Aggregation(projection)
    members: dict = {}
    order = 0
    for _ in range(25):
        if members and rng.random() < 0.4:
            member = rng.choice(sorted(members))
            agg.remove(member)
            del members[member]
        else:
            member = rng.randrange(8)  # re-adding a member replaces what it counted
            message = rng.choice(pool)
            order += 1
            agg.add(member, order, message)
            members[member] = (order, message)
        changed = dict(agg.take_changes())
        want = _expected(field_trees, members)
        for key, record in changed.items():
            if key not in want:
                assert record is None, (fields, key, record)
            else:
                assert _same_record(record, want[key]), (fields, key, record, want[key])
        assert set(agg.groups) == set(want)
        for key, record in agg.records():
            assert _same_record(record, want[key]), (fields, key, record, want[key])


@SETTINGS
@given(name=st.sampled_from(ref.AGGREGATE_NAMES), values=st.lists(st.one_of(NUMBERS, scalars), max_size=10),
       seed=st.integers(0, 2**32 - 1))
def test_accumulator_after_adds_and_removes_equals_the_definition(name, values, seed):
    rng = random.Random(seed)
    acc = accumulator(name)
    held: list = []
    for v in values:
        acc.add(v)
        held.append(v)
        if held and rng.random() < 0.4:
            gone = held.pop(rng.randrange(len(held)))
            acc.remove(gone)
    assert same(acc.result(), ref.aggregate(name, held)), (name, held, acc.result())


# --- vectors ---------------------------------------------------------------------------------


def _over(name, values):
    acc = accumulator(name)
    for v in values:
        acc.add(v)
    return acc.result()


def test_min_and_max_of_the_reference_example():
    """G.3: the set 7, '015', 'dog', 3.5, '9' gives MIN 3.5 and MAX 'dog'."""
    values = [7, "015", "dog", 3.5, "9"]
    assert _over("MIN", values) == 3.5
    assert _over("MAX", values) == "dog"


def test_nulls_are_skipped_and_an_empty_group_is_null_but_for_count():
    values = [None, "", 4, None]
    assert _over("COUNT", values) == 1
    assert _over("SUM", values) == 4
    for name in ("SUM", "AVG", "MIN", "MAX", "STDDEV_POP"):
        assert _over(name, [None, ""]) is None
    assert _over("COUNT", [None]) == 0 and _over("COUNT_DISTINCT", []) == 0


def test_sum_keeps_integers_and_rounds_doubles_once():
    assert _over("SUM", [1, 2, 3]) == 6 and type(_over("SUM", [1, 2, 3])) is int
    acc = accumulator("SUM")
    for v in (0.1, 0.2, 0.3, 1e16, -1e16):
        acc.add(v)
    acc.remove(0.2)
    assert acc.result() == math.fsum([0.1, 0.3, 1e16, -1e16])  # exact: 0.4, not 0.0
    assert math.isnan(_over("SUM", [1, "dog"]))  # a non-numeric value makes it NaN


def test_sums_near_the_largest_double_are_exact_through_an_overflow():
    """Doubles whose sum passes the largest double (found by the property test above):
    the result is infinity while the exact sum is beyond the doubles, and exact again
    once values leave; AVG is the exact sum over the count throughout."""
    big = 2.5681330498033083e307
    total, avg = accumulator("SUM"), accumulator("AVG")
    for _ in range(8):
        total.add(big)
        avg.add(big)
    assert total.result() == math.inf and avg.result() == big
    for _ in range(5):
        total.remove(big)
        avg.remove(big)
    assert total.result() == float(Fraction(big) * 3) and avg.result() == big
    total.add(-big)
    total.add(0.5)
    assert total.result() == float(Fraction(big) * 2 + Fraction(1, 2))
    for v in (big, big, -big, 0.5):
        total.remove(v)
    assert total.result() == big
    total.remove(big)
    assert total.result() is None  # nothing left
    assert _over("SUM", [big] * 8 + [-big] * 8 + [1.5]) == 1.5
    assert _over("SUM", [-big] * 8) == -math.inf


def test_count_distinct_equates_by_the_type_rules():
    assert _over("COUNT_DISTINCT", [7, 7.0, "7", "x", "x"]) == 2


# --- errors ----------------------------------------------------------------------------------


def test_aggregates_are_refused_in_filters():
    with pytest.raises(ExpressionError, match="allowed only in the projection"):
        expr.compile("SUM(/x) > 3")


@pytest.mark.parametrize("fields, message", [
    (["SUM(SUM(/x)) AS /t"], "inside aggregate"),
    (["SUM(/x)"], "needs AS"),
    (["SUM(/x, /y) AS /t"], "takes 1 argument"),
    (["UNIX_TIMESTAMP() AS /t"], "not deterministic"),
    (["/a AS /t", "/b AS /t"], "two projected fields"),
    (["/a AS"], "AS must be followed"),
])
def test_projection_errors(fields, message):
    with pytest.raises(ExpressionError, match=message):
        Projection(fields, ["/g"])


def test_a_nested_output_path_builds_objects():
    p = Projection(["SUM(/qty) AS /detail/qty", "/g"], ["/g"])
    agg = Aggregation(p)
    agg.add(1, 1, {"g": "EU", "qty": 3})
    agg.add(2, 2, {"g": "EU", "qty": 4})
    assert dict(agg.records()) == {("EU",): {"detail": {"qty": 7}, "g": "EU"}}
