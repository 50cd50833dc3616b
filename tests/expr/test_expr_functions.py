"""The built-in functions of spec section 7 (and the documented extensions)."""

from __future__ import annotations

import math

import pytest

from conveyor import expr
from conveyor.expr import limits


def ev(source, data=None, meta=None):
    return expr.compile(source).evaluate({} if data is None else data, meta)


@pytest.mark.parametrize(
    "source, value",
    [
        # 7.1 strings
        ("INSTR('abc', 'b')", 2),
        ("INSTR('abc', 'z')", 0),
        ("INSTR('abc', 'B')", 0),
        ("INSTR_I('abc', 'B')", 2),
        ("INSTR(12345, 34)", 3),
        ("INSTR(NULL, 'a')", None),
        ("INSTR('abc', '')", None),
        ("STREQUAL_I('Jane', 'JANE')", True),
        ("STREQUAL_I('Jane', 'Joan')", False),
        ("STREQUAL_I('É', 'é')", False),  # ASCII only
        ("STREQUAL_I(/x, 'a')", None),
        ("UPPER('aBc1é')", "ABC1é"),
        ("LOWER('AbC1É')", "abc1É"),
        ("UPPER(/x)", None),
        ("SUBSTR('fandango', 5)", "ango"),
        ("SUBSTR('fandango', 1, 3)", "fan"),
        ("SUBSTR('fandango', 0, 3)", "fan"),  # choice: 0 counts as 1
        ("SUBSTR('fandango', -3)", "ngo"),  # choice: negative counts from the end
        ("SUBSTR('fandango', 20)", None),  # '' is NULL
        ("SUBSTR('fandango', 2, 0)", None),
        ("SUBSTR('fandango', 2.9, 2)", "an"),  # truncated
        ("SUBSTR('fandango', '2', '2')", "an"),
        ("SUBSTR('fandango', 'x')", None),
        ("REVERSE(SUBSTR('fandango', 5))", "ogna"),
        ("REVERSE(123)", "321"),
        ("CONCAT('a', 1, 2.5, TRUE)", "a12.5true"),
        ("CONCAT('a', NULL, /x, 'b')", "ab"),  # choice: NULL adds nothing
        ("CONCAT(NULL, '')", None),
        ("LENGTH('abc')", 3),
        ("LENGTH(/x)", None),
        ("TRIM('  a b \t')", "a b"),
        ("LTRIM('  a ')", "a "),
        ("RTRIM('  a ')", "  a"),
        ("TRIM('   ')", None),
        ("REPLACE('a-b-c', '-', '+')", "a+b+c"),
        ("REPLACE('a-b-c', '-', '')", "abc"),
        ("REPLACE('a-b-c', NULL, '+')", "a-b-c"),
        ("REPLACE(NULL, '-', '+')", None),
        # 7.6 numbers (extensions: names not confirmed by the spec)
        ("ABS(-3)", 3),
        ("ABS(-2.5)", 2.5),
        ("ABS('-4')", 4),
        ("ABS(/x)", None),
        ("CEILING(1.2)", 2.0),
        ("CEILING(-1.2)", -1.0),
        ("FLOOR(1.8)", 1.0),
        ("FLOOR(7)", 7),
        ("ROUND(2.5)", 3.0),  # half away from zero, as SQL
        ("ROUND(-2.5)", -3.0),
        ("ROUND(1.005, 2)", 1.01),  # on the decimal text, not the binary value
        ("ROUND(1234, -2)", 1200),
        ("ROUND(/x)", None),
        # 7.4 typed values
        ("TRUE_VALUE()", True),
        ("FALSE_VALUE()", False),
        ("CHAR_VALUE(65)", "A"),
        ("CHAR_VALUE(1) = '\\x01'", True),
        ("CHAR_VALUE(256)", "?"),
        ("CHAR_VALUE(-1)", "?"),
        ("CHAR_VALUE(NULL)", None),
        # 7.5 NULL handling
        ("COALESCE(/x, /y, 3)", 3),
        ("COALESCE(/x, '', 'b')", "b"),  # '' is NULL
        ("COALESCE(/x)", None),
        ("COALESCE(/x, NAN_VALUE()) IS NULL", False),
    ],
)
def test_functions(source, value):
    got = ev(source)
    assert got == value and type(got) is type(value)


def test_function_names_are_case_insensitive():
    assert ev("upper('a')") == "A"
    assert ev("Coalesce(NULL, 1)") == 1
    assert ev("if(1 = 1, 'y', 'n')") == "y"


def test_functions_use_the_first_element_of_arrays():
    assert ev("UPPER(/a)", {"a": ["x", "y"]}) == "X"
    assert ev("COALESCE(/a, 5)", {"a": []}) == 5
    assert ev("CONCAT(/a, /b)", {"a": [1, 2], "b": {"k": 1}}) == "1"


def test_nan_value():
    assert math.isnan(ev("NAN_VALUE()"))
    assert ev("NAN_VALUE() IS NULL") is False  # choice: NaN is a value, not NULL
    assert ev("CONCAT(NAN_VALUE())") == "NaN"


def test_string_results_are_capped():
    big = "x" * (limits.string_result_chars_max // 2 + 1)
    assert ev("CONCAT(/s, /s)", {"s": big}) is None
    assert ev("REPLACE(/s, 'x', 'yy')", {"s": big}) is None
    assert ev("LENGTH(CONCAT(/s, 'a'))", {"s": big}) == len(big) + 1


# --- date and time (7.2) --------------------------------------------------------------------------


def test_unix_timestamp_reads_now_from_meta_and_never_the_clock():
    assert ev("UNIX_TIMESTAMP()", meta={"now": 1700000000.25}) == 1700000000.25
    # No time given: NULL, not the system clock (the caller owns time).
    assert ev("UNIX_TIMESTAMP()") is None
    assert ev("UNIX_TIMESTAMP()", meta={"topic": "t"}) is None


@pytest.mark.parametrize(
    "source, value",
    [
        ("STRFTIME('%Y-%m-%d %H:%M:%S', 0)", "1970-01-01 00:00:00"),
        ("STRFTIME('%Y-%m-%dT%H:%M:%S.%f', 1700000000.123456)", "2023-11-14T22:13:20.123456"),
        ("STRFTIME('%H:%M:%S.%03f', 1700000000.5)", "22:13:20.500"),
        ("STRFTIME('100%% %f', 0.25)", "100% 250000"),
        ("STRFTIME('%Y', 'x')", None),
        ("STRFTIME(NULL, 0)", None),
        ("STRFTIME('%Y', 1e30)", None),
        ("STRPTIME('1970-01-02', '%Y-%m-%d')", 86400.0),
        ("STRPTIME('2023-11-14T22:13:20.123', '%Y-%m-%dT%H:%M:%S.%03f')", 1700000000.123),
        ("STRPTIME('2023-11-14 23:13:20 +0100', '%Y-%m-%d %H:%M:%S %z')", 1700000000.0),
        ("STRPTIME('garbage', '%Y')", None),
    ],
)
def test_time_functions(source, value):
    got = ev(source)
    if isinstance(value, float):
        assert got == pytest.approx(value, abs=1e-6)
    else:
        assert got == value


def test_strftime_is_capped_at_128_bytes():
    assert len(ev("STRFTIME(/f, 0)", {"f": "%Y" * 100}).encode()) == limits.strftime_result_bytes_max
    assert ev("STRFTIME(/f, 0)", {"f": "%Y" * 10_000}) is None  # format too long


# --- message functions (7.3) -----------------------------------------------------------------------

META = {
    "topic": "ORDERS",
    "bookmark": "1|2|",
    "sequence": 7,
    "timestamp": 1700000000.5,
    "correlation_id": b"corr-1",
    "client_name": "pub",
    "sow_key": "k1",
    "length": 42,
    "lease_period": 30.0,
}


@pytest.mark.parametrize(
    "source, value",
    [
        ("TOPIC_NAME()", "ORDERS"),
        ("BOOKMARK()", "1|2|"),
        ("CORRELATION_ID()", "corr-1"),  # bytes are decoded as UTF-8
        ("SOW_KEY()", "k1"),
        ("MESSAGE_SIZE()", 42),
        ("LAST_UPDATED()", 1700000000.5),
        ("MESSAGE_SIZE() > 40", True),
    ],
)
def test_message_functions(source, value):
    assert ev(source, meta=META) == value


@pytest.mark.parametrize("name", ["TOPIC_NAME", "BOOKMARK", "CORRELATION_ID", "SOW_KEY", "MESSAGE_SIZE"])
def test_message_functions_without_meta_are_null(name):
    assert ev(f"{name}()") is None
    assert ev(f"{name}()", meta={}) is None
    assert ev(f"{name}() IS NULL", meta={"correlation_id": ""}) is True


def test_last_updated_defaults_to_now():
    assert ev("LAST_UPDATED()", meta={"now": 5.0}) == 5.0
