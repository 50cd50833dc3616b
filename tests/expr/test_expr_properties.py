"""Property tests.

1. Random expression trees, rendered to text, give the same result through the
   compiled code as through the reference evaluator (tests/expr/reference_eval.py),
   for ``evaluate`` (value and type) and for ``matches``.
2. Random text, random bytes and random token soup given to ``compile`` raise nothing
   but ExpressionError; whatever compiles also evaluates without raising (how long the
   worst take is measured by bench/bench_expr.py).

Settings keep the whole expr suite under a minute on two cores.
"""

from __future__ import annotations

import math
import os
import random
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import expr
from conveyor.expr import ExpressionError

sys.path.insert(0, os.path.dirname(__file__))
import reference_eval as ref  # noqa: E402
from worst_cases import ROBUSTNESS_MESSAGES, VOCABULARY  # noqa: E402

SETTINGS = settings(max_examples=int(os.environ.get("EXPR_EXAMPLES", "400")), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- messages -----------------------------------------------------------------------------

TEXTS = ["", "a", "A", "ab", "Ab", "abc", "zebra", "b", "x y", "1", "2.0", "-3", "1e2", ".5",
         " 1", "0x10", "nan", "10", "aa", "é", "\n", "a\n", "ba"]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 12),
    st.sampled_from([0, 2**63 - 1, -(2**63), 2**64 - 1, 10**20]),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([0.5, -1.5, 2.0, 1e300, float("nan")]),  # NaN: not JSON, but callers may pass it
    st.sampled_from(TEXTS),
)
values = st.one_of(
    scalars,
    st.lists(st.one_of(scalars, st.lists(scalars, max_size=2)), max_size=4),
    st.fixed_dictionaries({"x": scalars}),
    st.lists(st.fixed_dictionaries({"x": scalars}), max_size=3),
)
messages = st.fixed_dictionaries(
    {},
    optional={
        "a": values,
        "b": values,
        "s": st.sampled_from(TEXTS),
        "n": st.one_of(st.integers(-3, 300), st.floats(-10, 10)),
        "arr": st.lists(scalars, max_size=4),
        "obj": values,
        "name with space": scalars,
    },
)

# --- trees --------------------------------------------------------------------------------

FIELDS = [("a",), ("b",), ("s",), ("n",), ("arr",), ("arr", 0), ("arr", 2), ("obj",), ("obj", "x"),
          ("obj", "x", 0), ("a", "x"), ("a", 1), ("missing",), ("name with space",)]  # fmt: skip
PATTERNS = ["a", "^a", "b$", "^ab$", "(?i)^A", "[0-9]+", "^x.*y", "(.)\\1", "a|b", "^$", "\\d\\.\\d",
            "z", "(?i)B", "^-", "e$"]  # fmt: skip
literals = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.integers(-3, 10),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(TEXTS + ["it's", 'say "hi"', "back\\slash"]),
)
leaves = st.one_of(
    literals.map(lambda v: ("lit", v)),
    st.sampled_from(FIELDS).map(lambda p: ("field", p)),
    st.just(("call", "NAN_VALUE", ())),
)

# name -> number of arguments
FUNCTIONS = {"UPPER": 1, "LOWER": 1, "REVERSE": 1, "LENGTH": 1, "TRIM": 1, "INSTR": 2, "INSTR_I": 2,
             "STREQUAL_I": 2, "CONCAT": 3, "SUBSTR": 2, "ABS": 1, "FLOOR": 1, "CEILING": 1,
             "CHAR_VALUE": 1, "NAN_VALUE": 0, "TRUE_VALUE": 0, "FALSE_VALUE": 0, "IF": 3,
             "COALESCE": 2, "TOPIC_NAME": 0, "CORRELATION_ID": 0}  # fmt: skip


def _extend(children):
    items = st.lists(children, min_size=1, max_size=3).map(tuple)
    return st.one_of(
        st.tuples(st.just("neg"), children),
        st.tuples(st.just("arith"), st.sampled_from("+-*/%"), children, children),
        st.tuples(st.just("cmp"), st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), children, children),
        st.tuples(st.just("and"), children, children),
        st.tuples(st.just("or"), children, children),
        st.tuples(st.just("not"), children),
        st.tuples(st.just("between"), children, children, children, st.booleans()),
        st.tuples(st.just("in"), children, items, st.booleans()),
        st.tuples(st.just("like"), children, st.sampled_from(PATTERNS), st.booleans()),
        st.tuples(st.just("affix"), st.sampled_from(["BEGINS", "ENDS"]), children, items, st.booleans()),
        st.tuples(st.just("isnull"), children, st.booleans()),
        st.sampled_from(sorted(FUNCTIONS)).flatmap(
            lambda name: st.tuples(
                st.just("call"), st.just(name), st.tuples(*[children] * FUNCTIONS[name])
            )
        ),
    )


trees = st.recursive(leaves, _extend, max_leaves=10)
META = {"topic": "ORDERS", "correlation_id": "c-1"}


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


@SETTINGS
@given(tree=trees, message=messages, style_seed=st.integers(0, 2**32 - 1))
def test_compiled_agrees_with_reference(tree, message, style_seed):
    text = ref.render(tree, random.Random(style_seed))
    compiled = expr.compile(text)
    expected = ref.evaluate(tree, message, META)
    got = compiled.evaluate(message, META)
    expected = None if expected == "" else expected
    assert same(got, expected), (text, got, expected)
    assert compiled.matches(message, META) is ref.matches(tree, message, META), text
    # NOT asks each predicate for its FALSE code: check that path too.
    negated = expr.compile(f"NOT ({text})")
    assert negated.matches(message, META) is ref.matches(("not", tree), message, META), text
    assert compiled.priority(message, META) == expr.priority_key(expected)


@SETTINGS
@given(tree=trees)
def test_fields_lists_what_the_tree_reads(tree):
    """Plain rendering (no random spelling) parses, and ``fields`` names every path read."""
    compiled = expr.compile(ref.render(tree))
    assert compiled.source == ref.render(tree)
    read = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if node[0] == "field":
            read.add("".join("/" + s for s in node[1] if isinstance(s, str)))
        else:
            for part in node[1:]:
                if isinstance(part, tuple) and part and isinstance(part[0], str) and part[0] in _KINDS:
                    stack.append(part)
                elif isinstance(part, tuple):
                    stack.extend(p for p in part if isinstance(p, tuple) and p and p[0] in _KINDS)
    assert compiled.fields == read


_KINDS = {"lit", "field", "neg", "arith", "cmp", "and", "or", "not", "between", "in", "like", "affix", "isnull", "call"}


# --- robustness ----------------------------------------------------------------------------

def _check_compile(text: str) -> None:
    """Compiles, or raises ExpressionError with a position and token; what compiles
    evaluates without raising. (How long the worst of these take is measured by
    bench/bench_expr.py, never asserted here.)"""
    try:
        compiled = expr.compile(text)
    except ExpressionError as exc:
        assert isinstance(exc.position, int) and 0 <= exc.position <= len(text)
        assert isinstance(exc.token, str)
        assert str(exc).endswith(f"at position {exc.position}")
    else:
        for message in ROBUSTNESS_MESSAGES:
            compiled.evaluate(message, {"topic": "t"})
            assert compiled.matches(message) in (True, False)
            compiled.priority(message)


@SETTINGS
@given(st.text(max_size=200))
def test_random_text_raises_only_expression_error(text):
    _check_compile(text)


@SETTINGS
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_expression_error(raw):
    _check_compile(raw.decode("utf-8", errors="replace"))


@SETTINGS
@given(st.lists(st.sampled_from(VOCABULARY), max_size=25), st.booleans())
def test_token_soup_raises_only_expression_error(words, glue):
    _check_compile(("" if glue else " ").join(words))
