"""Unit tests, operator by operator, of the type rules and three-valued logic.

``ev`` gives evaluate()'s value; ``m`` gives matches(). Where a rule is a choice made
in docs/expressions.md rather than confirmed AMPS behaviour, the test says so.
"""

from __future__ import annotations

import math

import pytest

from conveyor import expr


def ev(source, data=None, meta=None):
    return expr.compile(source).evaluate({} if data is None else data, meta)


def m(source, data=None, meta=None):
    return expr.compile(source).matches({} if data is None else data, meta)


def both(source, data=None):
    """evaluate() and the TRUE/FALSE code paths must agree (NOT exercises the FALSE path)."""
    value = ev(source, data)
    assert m(source, data) is (value is True)
    assert m(f"NOT ({source})", data) is (value is False)
    return value


# --- literals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, value",
    [
        ("1", 1),
        ("1.5", 1.5),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("2.5E-1", 0.25),
        ("-3", -3),
        ("- 3", -3),
        ("+3", 3),
        ("18446744073709551615", 2**64 - 1),
        ("18446744073709551616", float(2**64)),  # beyond 64 bits: a double
        ("-9223372036854775808", -(2**63)),
        ("'abc'", "abc"),
        ('"abc"', "abc"),
        ("''", None),
        ("TRUE", True),
        ("false", False),
        ("Null", None),
        ("'it\\'s'", "it's"),
        ('"say \\"hi\\""', 'say "hi"'),
        ("'a\\\\b'", "a\\b"),
        ("'\\x01'", "\x01"),
        ("'tab\\there'", "tab\there"),
        ("'keep\\d'", "keep\\d"),  # unknown escapes keep the backslash (regex patterns)
    ],
)
def test_literals(source, value):
    got = ev(source)
    assert got == value and type(got) is type(value)


def test_keywords_are_case_insensitive():
    assert m("/a between 1 and 3 AnD /b iS nOt NuLl", {"a": 2, "b": 1})
    assert m("/s begins with ('x') or /s ends with ('z')", {"s": "yz"})


# --- fields -----------------------------------------------------------------------------------


def test_field_paths():
    data = {"a": {"b": {"c": 3}}, "55": "fix", "first-name": "Jo", "x.y": 1, "@attr": "v"}
    assert ev("/a/b/c", data) == 3
    assert ev("/55", data) == "fix"
    assert ev("/first-name", data) == "Jo"  # XPath names may hold '-' and '.'
    assert ev("/x.y", data) == 1
    assert ev("/@attr", data) == "v"
    assert ev("/a/b/c/d", data) is None
    assert ev("/missing/b", data) is None


def test_long_paths():
    data = {"a": {"b": {"c": {"d": {"e": {"f": [10, 20]}}}}}}
    assert ev("/a/b/c/d/e/f[1]", data) == 20
    assert ev("/a/b/c/d/e/g", data) is None


def test_bracketed_names():
    data = {"Not Xpath Name": {"x": [5, 6]}, "a/b": 1, "Fits&Starts": 2}
    assert ev("[/Not Xpath Name]/x[1]", data) == 6
    assert ev("[/a/b]", data) == 1  # the whole text is one root-level name
    assert ev("[/Fits&Starts] = 2", data) is True


def test_division_needs_space_after_a_field():
    data = {"a": {"2": 7}, "b": 10}
    assert ev("/a/2", data) == 7
    assert ev("/b / 2", data) == 5.0
    assert ev("/b/ 2", data) == 5.0
    assert ev("(/b)/2", data) == 5.0


def test_subscripts():
    data = {"data": [1, [2, 3], {"k": 4}], "one": "x", "obj": {"k": 1}}
    assert ev("/data[0]", data) == 1
    assert ev("/data[1][1]", data) == 3
    assert ev("/data[2]/k", data) == 4
    assert ev("/data[9]", data) is None
    assert ev("/data[99999999999999999999999]", data) is None
    # A single value is a one-element array for subscripts (choice).
    assert ev("/one[0]", data) == "x"
    assert ev("/one[1]", data) is None
    assert ev("/obj[0]/k", data) == 1


def test_step_into_an_array_of_objects_collects_values():
    # Choice: like XPath, /items/sku names every sku of the items array.
    data = {"items": [{"sku": "A"}, {"sku": "B"}, {"other": 1}, 7, {"sku": ["C", "D"]}]}
    assert ev("/items/sku", data) == ["A", "B", "C", "D"]
    assert m("/items/sku = 'B'", data)
    assert m("/items/sku = 'D'", data)
    assert not m("/items/nothing = 'B'", data)
    assert ev("/items/nothing IS NULL", data) is True


def test_non_object_bodies_have_no_fields():
    for body in (None, [1, 2], "text", 5):
        assert expr.compile("/a IS NULL").matches(body)
        assert expr.compile("/a = 1").evaluate(body) is None


def test_mapping_bodies_work():
    from types import MappingProxyType

    assert m("/a/b = 1", MappingProxyType({"a": MappingProxyType({"b": 1})}))


# --- comparison ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, expected",
    [
        ("1 = 1.0", True),
        ("1 != 2", True),
        ("1 <> 1", False),
        ("2 >= 2", True),
        ("'b' > 'a'", True),
        ("'B' < 'a'", True),  # code-point order
        ("'10' < '9'", True),  # two strings never compare as numbers
        ("'2.000' = '2.0'", False),
        ("10 = '10.0'", True),  # string and number: the string is converted
        ("10 < 'abc'", True),  # non-numeric string is greater than any number
        ("'abc' > 10", True),
        ("'abc' = 10", False),
        ("'abc' != 10", True),
        ("10 >= 'abc'", False),
        ("' 10' = 10", False),  # choice: no spaces in numeric text
        ("'0x10' = 16", False),  # choice: no hexadecimal
        ("'1e2' = 100", True),
        ("'+5' = 5", True),
        ("TRUE = 1", True),  # booleans are 1 and 0
        ("FALSE < 1", True),
        ("TRUE = 'true'", False),
        ("NULL = NULL", None),
        ("/x = 1", None),
        ("/x != 1", None),
        ("'' != 'a'", None),
        ("NAN_VALUE() = NAN_VALUE()", False),  # choice: every comparison with NaN is FALSE
        ("NAN_VALUE() != 1", False),
        ("NAN_VALUE() < 1", False),
        ("NAN_VALUE() < 'abc'", False),
    ],
)
def test_comparisons(source, expected):
    assert both(source) is expected


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
@pytest.mark.parametrize(
    "value",
    [None, "", True, False, 0, 5, -2.5, float("nan"), "5", "5.0", "abc", "a", [], [5], ["abc", 1], {"k": 1}],
)
@pytest.mark.parametrize("literal", ["5", "'5'", "'abc'", "5.0", "TRUE", "NULL", "''"])
def test_fast_paths_agree_with_the_generic_rule(op, value, literal):
    """A field against a literal compiles to inlined code; it must give the generic answer."""
    from conveyor.expr.values import cmp3

    data = {"f": value}
    compiled = expr.compile(f"/f {op} {literal}")
    expected = cmp3(op, value, expr.compile(literal).evaluate({}))
    assert compiled.evaluate(data) is expected
    assert compiled.matches(data) is (expected is True)
    assert expr.compile(f"NOT (/f {op} {literal})").matches(data) is (expected is False)
    flipped = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
    assert expr.compile(f"{literal} {flipped} /f").matches(data) is (expected is True)


def test_big_integers_in_messages_become_doubles():
    assert m("/a = 18446744073709551616", {"a": 2**64})
    assert m("/a > 18446744073709551615", {"a": 2**70})


# --- logic --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, and_, or_",
    [
        ("1 = 1", "2 = 2", True, True),
        ("1 = 1", "1 = 2", False, True),
        ("1 = 2", "/x = 1", False, None),
        ("1 = 1", "/x = 1", None, True),
        ("/x = 1", "/y = 1", None, None),
        ("1 = 2", "1 = 3", False, False),
    ],
)
def test_three_valued_and_or(a, b, and_, or_):
    assert both(f"{a} AND {b}") is and_
    assert both(f"{b} AND {a}") is and_
    assert both(f"{a} OR {b}") is or_
    assert both(f"{b} OR {a}") is or_


def test_not():
    assert both("NOT 1 = 1") is False
    assert both("NOT 1 = 2") is True
    assert both("NOT /x = 1") is None  # assumed: NOT UNKNOWN is UNKNOWN
    assert both("NOT NOT 1 = 1") is True


def test_precedence():
    assert ev("1 = 1 OR 1 = 2 AND 1 = 2") is True  # AND binds tighter than OR
    assert ev("(1 = 1 OR 1 = 2) AND 1 = 2") is False
    assert ev("NOT 1 = 2 AND 1 = 1") is True  # NOT binds tighter than AND
    assert ev("1 + 2 * 3") == 7
    assert ev("(1 + 2) * 3") == 9
    assert ev("10 - 4 - 3") == 3  # left-associative
    assert ev("2 * 3 % 4") == 2
    assert ev("-2 * 3") == -6
    assert ev("1 + 1 = 2") is True


def test_truth_of_plain_values():
    # Choice: numbers are TRUE when non-zero; NULL, NaN and non-numeric text are UNKNOWN.
    assert m("/a", {"a": 1}) and m("/a", {"a": "2"}) and m("/a", {"a": True})
    assert not m("/a", {"a": 0}) and m("NOT /a", {"a": 0})
    assert ev("/a AND 1 = 1", {"a": "yes"}) is None
    assert ev("NOT /a", {}) is None
    assert ev("NOT NAN_VALUE()") is None
    assert ev("/a OR 1 = 2", {"a": [0, 1]}) is False  # arrays: the first element


# --- arithmetic ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, value",
    [
        ("7 + 2", 9),
        ("7 - 9", -2),
        ("7 * 2", 14),
        ("7 / 2", 3.5),
        ("6 / 2", 3.0),  # division always gives a double
        ("7 % 3", 1),
        ("-7 % 3", -1),  # C's %: the sign of the dividend
        ("7 % -3", 1),
        ("7.5 % 2", 1.5),
        ("'4' * '2'", 8),
        ("TRUE + 1", 2),
        ("9223372036854775807 + 1", 2**63),
        ("18446744073709551615 + 1", float(2**64)),  # overflow: a double
        ("-9223372036854775808 - 1", float(-(2**63) - 1)),
        ("1.5 * 2", 3.0),
    ],
)
def test_arithmetic(source, value):
    got = ev(source)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("source", ["1 / 0", "1 % 0", "0 / 0", "'abc' + 1", "1 * 'x'", "-'abc'", "1e308 * 10 - 1e308 * 10"])
def test_arithmetic_giving_nan(source):
    assert math.isnan(ev(source))


@pytest.mark.parametrize("source", ["/x + 1", "1 - /x", "/x * /y", "-/x", "'' + 1", "NULL / 2"])
def test_arithmetic_with_null_is_null(source):
    assert ev(source) is None


# --- BETWEEN, IN ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [(0, True), (100, True), (50.5, True), (-1, False), (101, False), ("50", True), ("abc", False),
     (None, None), ("", None), ([200, 50], True), ([200, 300], False), ([], None), ([None, 200], None),
     (float("nan"), False)],
)  # fmt: skip
def test_between(value, expected):
    assert both("/a BETWEEN 0 AND 100", {"a": value}) is expected
    assert both("/a NOT BETWEEN 0 AND 100", {"a": value}) is (None if expected is None else not expected)


def test_between_with_expression_bounds():
    assert both("/a BETWEEN /lo AND /hi + 1", {"a": 5, "lo": 5, "hi": 4}) is True
    assert both("/a BETWEEN /lo AND 10", {"a": 5}) is None
    assert both("/a BETWEEN 'a' AND 'c'", {"a": "b"}) is True


@pytest.mark.parametrize(
    "source, data, expected",
    [
        ("/a IN (1, 2, 3)", {"a": 2}, True),
        ("/a IN (1, 2, 3)", {"a": 2.0}, True),
        ("/a IN (1, 2, 3)", {"a": "2"}, True),
        ("/a IN ('1', '2')", {"a": "2.0"}, False),  # string to string: no numeric conversion
        ("/a IN ('1', '2.0')", {"a": 2}, True),
        ("/a IN (1, 2)", {"a": 5}, False),
        ("/a IN (1, NULL)", {"a": 5}, None),  # a NULL item: no match becomes UNKNOWN
        ("/a IN (1, NULL)", {"a": 1}, True),
        ("/a IN (1, '')", {"a": 5}, None),
        ("/a IN ('x', 'y')", {"a": ["z", "y"]}, True),
        ("/a IN ('x', 'y')", {"a": []}, None),
        ("/a IN (TRUE)", {"a": 1}, True),
        ("/a IN (/b, 3)", {"a": 4, "b": 4}, True),
        ("/a IN (/b, 3)", {"a": 4}, None),
        ("/a IN (/b + 1)", {"a": 4, "b": 3}, True),
        ("NAN_VALUE() IN (1, 2)", {}, False),
        ("/a NOT IN (1, 2)", {"a": 3}, True),
        ("/a NOT IN (1, 2)", {"a": 1}, False),
        ("/a NOT IN (1, 2)", {}, None),
    ],
)
def test_in(source, data, expected):
    assert both(source, data) is expected


# --- BEGINS WITH / ENDS WITH ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, data, expected",
    [
        ("/s BEGINS WITH ('ab', 'x')", {"s": "abc"}, True),
        ("/s BEGINS WITH ('AB')", {"s": "abc"}, False),  # case-sensitive
        ("/s ENDS WITH ('bc')", {"s": "abc"}, True),
        ("/s ENDS WITH ('b')", {"s": "abc"}, False),
        ("/s BEGINS WITH ('a')", {}, None),
        ("/s BEGINS WITH ('a')", {"s": ""}, None),
        ("/s BEGINS WITH ('a', NULL)", {"s": "b"}, None),
        ("/s BEGINS WITH ('a', NULL)", {"s": "a"}, True),
        ("/n BEGINS WITH ('4.')", {"n": 4.99}, True),  # numbers by their text
        ("/n ENDS WITH (99)", {"n": 4.99}, True),
        ("/s BEGINS WITH ('z')", {"s": ["a", "zz"]}, True),
        ("/s BEGINS WITH (/p)", {"s": "abc", "p": "ab"}, True),
        ("/s NOT BEGINS WITH ('a')", {"s": "b"}, True),
        ("/s NOT ENDS WITH ('a')", {}, None),
    ],
)
def test_begins_ends_with(source, data, expected):
    assert both(source, data) is expected


# --- IS NULL --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [(None, True), ("", True), ([], True), ({}, False), ({"a": 1}, False), ([None], False), (0, False),
     ("x", False), (float("nan"), False)],
)  # fmt: skip
def test_is_null(value, expected):
    assert ev("/a IS NULL", {"a": value}) is expected
    assert ev("/a IS NOT NULL", {"a": value}) is (not expected)
    assert m("NOT /a IS NULL", {"a": value}) is (not expected)


def test_is_null_of_missing_field_and_expressions():
    assert ev("/a IS NULL") is True
    assert ev("/a + 1 IS NULL") is True
    assert ev("UPPER('') IS NULL") is True


# --- arrays ---------------------------------------------------------------------------------------


def test_array_rules():
    data = {"data": [1, 2, 3, "zebra", 5], "other": [14, 34, 23, 5], "nested": [[7, 8], 9], "empty": []}
    assert both("/data > 4", data) is True
    assert both("/data < 0", data) is False
    assert both("/empty = 1", data) is None  # an empty array is NULL
    assert both("/nested = 7", data) is True  # a nested array stands for its first element
    assert both("/nested = 8", data) is False
    assert ev("/other * 2", data) == 28  # scalar operators use the first element
    assert ev("UPPER(/data[3])", data) == "ZEBRA"
    assert ev("LENGTH(/other)", data) == 2
    assert both("/data = /other", data) is True
    assert both("/data = /empty", data) is None
    assert both("/data = /nothing", data) is None


def test_array_pairs_are_capped():
    from conveyor.expr import limits

    side = int(limits.array_pairs_max**0.5) + 10
    a = list(range(side))
    b = list(range(side, 2 * side))
    assert ev("/a = /b", {"a": a, "b": b}) is None  # gave up before proving FALSE
    assert ev("/a = /b", {"a": a + [-1], "b": b + [-1]}) is None  # the match is past the cap
    assert ev("/a = /b", {"a": a, "b": [0] + b}) is True
    assert ev("/a = /b", {"a": a[:10], "b": b[:10]}) is False


# --- IF -------------------------------------------------------------------------------------------


def test_if():
    assert ev("IF(/a > 1, 'big', 'small')", {"a": 5}) == "big"
    assert ev("IF(/a > 1, 'big', 'small')", {"a": 0}) == "small"
    assert ev("IF(/a > 1, 'big', 'small')", {}) == "small"  # UNKNOWN picks the second value
    assert ev("IF(/a, /b, /c)", {"a": 1, "b": [3, 4]}) == 3  # values are scalars
    assert ev("IF(1 = 1, 1, 1 / 0)") == 1
    assert m("IF(/a = 1, /b = 2, /c = 3)", {"a": 1, "b": 2})


def test_evaluate_returns_raw_field_values():
    data = {"arr": [1, 2], "obj": {"k": 1}, "s": ""}
    assert ev("/arr", data) == [1, 2]
    assert ev("/obj", data) == {"k": 1}
    assert ev("/s", data) is None  # '' is NULL


def test_fields_and_source():
    e = expr.compile("/a/b[0] = 1 AND [/x y] > /c OR UPPER(/d/e) IN ('A')")
    assert e.source == "/a/b[0] = 1 AND [/x y] > /c OR UPPER(/d/e) IN ('A')"
    assert e.fields == {"/a/b", "/x y", "/c", "/d/e"}
    assert e.paths == {("a", "b"), ("x y",), ("c",), ("d", "e")}
    assert repr(e).startswith("Expression(")


def test_compile_is_cached():
    assert expr.compile("/cached = 1") is expr.compile("/cached = 1")
