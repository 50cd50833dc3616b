"""Every test vector of spec/expressions.md section 9, one parametrised case each.

Ids read ``<subsection>-<status>-<expression>``. Status "doc" results are printed in
the AMPS docs; "inferred" ones follow from a documented rule; "assumed" ones depend
on the three-valued-logic plan of section 6 and must be re-checked against a real
AMPS before they are trusted as AMPS behaviour.

XML and FIX messages appear as the dicts the message-type parsers hand the
expression engine: elements as keys, attributes as ``@name`` keys, FIX tags as keys.
"""

from __future__ import annotations

import math

import pytest

from conveyor import expr

T, F, NULL = True, False, None
ARRAYS = {"data": [1, 2, 3, "zebra", 5], "other": [14, 34, 23, 5]}
ORDER_XML = {"Order": {"@update": "full", "Symbol": "IBM"}}


def _fixml(sym: str, px: str) -> dict:
    return {"FIXML": {"Order": {"@Px": px, "Instrmt": {"@Sym": sym}}}}


FIXML_FILTER = (
    '(/FIXML/Order/Instrmt/@Sym LIKE "^IB.?$") AND '
    '(/FIXML/Order/@Px LIKE "^90\\..*" AND /FIXML/Order/@Px < 91.0)'
)

# (subsection, status, expression, message, expected value of evaluate)
# For filters, "expected" is the three-valued result; matches() must be True iff TRUE.
VECTORS = [
    # 9.1 Comparison and type conversion
    ("9.1", "doc", "1 < 2", {}, T),
    ("9.1", "doc", "10 < '2'", {}, F),
    ("9.1", "doc", "'2.000' <> '2.0'", {}, T),
    ("9.1", "doc", "2 = 2.0", {}, T),
    ("9.1", "doc", "10 < 'Crank It Up'", {}, T),
    ("9.1", "doc", "10 < ''", {}, NULL),
    ("9.1", "doc", "10 > ''", {}, NULL),
    ("9.1", "doc", "'' = ''", {}, NULL),
    ("9.1", "doc", "'' IS NULL", {}, T),
    ("9.1", "inferred", "/A BETWEEN 0 AND 100", {"A": 0}, T),
    ("9.1", "inferred", "/A BETWEEN 0 AND 100", {"A": 100}, T),
    ("9.1", "inferred", "/A BETWEEN 0 AND 100", {"A": 100.5}, F),
    ("9.1", "inferred", "/A BETWEEN 0 AND 100", {"A": "50"}, T),
    ("9.1", "inferred", "/A IN (1, 2, 3)", {"A": 2}, T),
    ("9.1", "inferred", "/A IN (1, 2, 3)", {}, NULL),
    ("9.1", "inferred", "/a = 47", {"a": 1, "b": "47"}, F),
    ("9.1", "inferred", "/b = 47", {"a": 1, "b": "47"}, T),
    ("9.1", "inferred", "/b * 2 = 94", {"a": 1, "b": "47"}, T),
    # 9.2 Identifiers, grouping, arithmetic
    ("9.2", "doc", "/name = 'Gyro'", {"name": "Gyro", "job": "kitten"}, T),
    ("9.2", "inferred", "( /counter % 3 ) == 0", {"counter": 9}, T),
    ("9.2", "inferred", "( /counter % 3 ) == 0", {"counter": 10}, F),
    ("9.2", "inferred", "/Order/Symbol = 'IBM'", ORDER_XML, T),
    ("9.2", "inferred", "/Order/@update = 'full'", ORDER_XML, T),
    ("9.2", "inferred", "/a/b = 5", {"a": {"b": 5}}, T),
    ("9.2", "inferred", "[/Not Xpath Name] = 1", {"Not Xpath Name": 1}, T),
    ("9.2", "inferred", "/x = 1 OR /y = 2 AND /z = 3", {"x": 1, "y": 0, "z": 0}, T),
    ("9.2", "inferred", "(/x = 1 OR /y = 2) AND /z = 3", {"x": 1, "y": 0, "z": 0}, F),
    # 9.3 Arrays
    ("9.3", "doc", "/data = 1", ARRAYS, T),
    ("9.3", "doc", "/data = 'zebra'", ARRAYS, T),
    ("9.3", "doc", "/data != 'zebra'", ARRAYS, T),
    ("9.3", "doc", "/data = 42", ARRAYS, F),
    ("9.3", "doc", "/data LIKE 'z'", ARRAYS, T),
    ("9.3", "doc", "/other > 30", ARRAYS, T),
    ("9.3", "doc", "/other > 50", ARRAYS, F),
    ("9.3", "doc", "/data[0] = 1", ARRAYS, T),
    ("9.3", "doc", '/data[3] = "zebra"', ARRAYS, T),
    ("9.3", "doc", "/data[1] != 1", ARRAYS, T),
    ("9.3", "doc", "/other[1] LIKE '4'", ARRAYS, T),
    ("9.3", "doc", "/data = /other", ARRAYS, T),
    ("9.3", "inferred", "/data IN (42, 'zebra')", ARRAYS, T),
    ("9.3", "inferred", "/other + 1 = 15", ARRAYS, T),
    ("9.3", "inferred", "/empty IS NULL", {"empty": []}, T),
    # 9.4 LIKE and regex
    ("9.4", "doc", '/client/country LIKE "(?i)^us$"', {"client": {"country": "US"}}, T),
    ("9.4", "doc", '/client/country LIKE "(?i)^us$"', {"client": {"country": "us"}}, T),
    ("9.4", "inferred", '/client/country LIKE "(?i)^us$"', {"client": {"country": "USA"}}, F),
    ("9.4", "inferred", '/55 LIKE "TRADE$"', {"55": "ABC_TRADE"}, T),
    ("9.4", "inferred", "/state LIKE '(.)\\1'", {"state": "Tennessee"}, T),
    ("9.4", "inferred", "/state LIKE '(.)\\1'", {"state": "Ohio"}, F),
    ("9.4", "inferred", FIXML_FILTER, _fixml("IBM", "90.25"), T),
    ("9.4", "inferred", FIXML_FILTER, _fixml("IBMX", "90.25"), F),
    ("9.4", "doc", '/pie/filling LIKE "(?i)^apple$"', {"pie": {"filling": "aPpLe"}}, T),
    ("9.4", "inferred", "/s LIKE 'abc'", {"s": "xxabcxx"}, T),
    ("9.4", "inferred", "/s LIKE 'ABC'", {"s": "abc"}, F),
    # 9.5 String functions
    ("9.5", "doc", "REVERSE(SUBSTR('fandango',5)) == 'ogna'", {}, T),
    ("9.5", "inferred", 'INSTR(/eventLevels, "critical") != 0', {"eventLevels": "warn,critical"}, T),
    ("9.5", "inferred", "INSTR('abc','b')", {}, 2),
    ("9.5", "inferred", "INSTR('abc','z')", {}, 0),
    ("9.5", "inferred", "STREQUAL_I(/couponCode, 'QED') == 1", {"couponCode": "qed"}, T),
    ("9.5", "inferred", "INSTR_I(/symbolList, 'MSFT') != 0", {"symbolList": "ibm,msft"}, T),
    ("9.5", "inferred", "UPPER(/ticker) IN ('MSFT','IBM','RHAT','DIS')", {"ticker": "msft"}, T),
    ("9.5", "doc", "STREQUAL_I(/name,'JANE')", {"name": "Jane"}, T),
    ("9.5", "doc", "UPPER(/name) = 'JANE'", {"name": "Jane"}, T),
    (
        "9.5",
        "inferred",
        "/Department BEGINS WITH ('Engineering','Research','Technical')",
        {"Department": "Research Labs"},
        T,
    ),
    ("9.5", "inferred", "/filename ENDS WITH ('gif','png','jpg')", {"filename": "a.txt"}, F),
    ("9.5", "inferred", "/path NOT BEGINS WITH ('/public/dropbox')", {"path": "/private/x"}, T),
    ("9.5", "inferred", "/price NOT ENDS WITH ('99')", {"price": 4.99}, F),
    # 9.6 IF (the message functions are below, they need meta)
    ("9.6", "inferred", "IF(/qty > 500, 1, 0)", {"qty": 600}, 1),
    ("9.6", "inferred", "IF(/x IS NULL, 0, /x)", {}, 0),
    # 9.7 NULL logic (assumed: SQL three-valued logic, section 6)
    ("9.7", "inferred", "/x = 1", {}, NULL),
    ("9.7", "assumed", "/x != 1", {}, NULL),
    ("9.7", "assumed", "NOT (/x = 1)", {}, NULL),
    ("9.7", "inferred", "/x IS NULL", {"x": None}, T),
    ("9.7", "assumed", "/x IS NOT NULL", {"x": ""}, F),
    ("9.7", "inferred", "/x = 1 OR /y = 2", {"y": 2}, T),
    ("9.7", "inferred", "/x = 1 AND /y = 2", {"y": 2}, NULL),
    ("9.7", "inferred", "/s = ''", {"s": ""}, NULL),
]


def _id(vector) -> str:
    section, status, source, message, _ = vector
    return f"{section}-{status}-{source}-{message}"[:120]


@pytest.mark.parametrize("section, status, source, message, expected", VECTORS, ids=[_id(v) for v in VECTORS])
def test_section_9_vector(section, status, source, message, expected):
    e = expr.compile(source)
    value = e.evaluate(message)
    assert value == expected and type(value) is type(expected)
    assert e.matches(message) is (expected is True or (type(expected) is int and expected != 0))


# 9.2 Priority vectors: the result read as an unsigned 64-bit integer, NaN/NULL lowest.
@pytest.mark.parametrize(
    "message, expected",
    [({"price": 10, "qty": 3}, 30), ({"price": 10}, -1)],
    ids=["9.2-inferred-price*qty=30", "9.2-inferred-missing-qty-is-lowest"],
)
def test_section_9_2_priority(message, expected):
    e = expr.compile("/price * /qty")
    assert e.priority(message) == expected
    assert expr.priority_key(e.evaluate(message)) == expected


def test_section_9_2_missing_operand_is_not_a_number():
    value = expr.compile("/price * /qty").evaluate({"price": 10})
    # NULL in arithmetic stays NULL (the spec allows NaN or NULL); both are lowest priority.
    assert value is None or math.isnan(value)


# 9.6 Message functions: the context is the ``meta`` mapping.
META_VECTORS = [
    ("TOPIC_NAME() = 'ORDERS'", {"topic": "ORDERS"}, T),  # underlying topic of queue ORDERS_RISK
    ("CORRELATION_ID() IS NULL", {"topic": "ORDERS"}, T),  # published without a correlation id
    ("BOOKMARK() IS NULL", {"topic": "ORDERS", "sow_key": "k1"}, T),  # a sow query row
]


@pytest.mark.parametrize(
    "source, meta, expected", META_VECTORS, ids=[f"9.6-inferred-{v[0]}" for v in META_VECTORS]
)
def test_section_9_6_message_functions(source, meta, expected):
    e = expr.compile(source)
    assert e.evaluate({}, meta) is expected
    assert e.matches({}, meta) is expected
