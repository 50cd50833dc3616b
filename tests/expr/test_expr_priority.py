"""Queue priority: the result read as an unsigned 64-bit integer; anything else is -1."""

from __future__ import annotations

import pytest

from conveyor import expr
from conveyor.expr import priority_key

UINT_MAX = 2**64 - 1


@pytest.mark.parametrize(
    "value, key",
    [
        (None, -1),
        ("", -1),
        ("abc", -1),
        (float("nan"), -1),
        (float("inf"), -1),
        (-1, -1),
        (-0.5, 0),  # doubles truncate toward zero first, as C converts them
        (0, 0),
        (7, 7),
        (7.9, 7),
        ("12", 12),
        ("12.7", 12),
        ("-3", -1),
        (True, 1),
        (False, 0),
        (UINT_MAX, UINT_MAX),
        (UINT_MAX + 1, -1),
        (float(2**64), -1),
        (float(2**63), 2**63),
        ([5, 6], 5),  # an array: its first element
        ([], -1),
        ({"a": 1}, -1),
    ],
)
def test_priority_key(value, key):
    assert priority_key(value) == key


def test_priority_orders_delivery():
    e = expr.compile("/price * /qty")
    messages = [{"price": 10, "qty": 3}, {"price": 10}, {"price": 1, "qty": 100}, {"price": "x", "qty": 1}]
    keys = [e.priority(m) for m in messages]
    assert keys == [30, -1, 100, -1]
    assert sorted(range(4), key=lambda i: -keys[i])[:2] == [2, 0]


def test_priority_of_boolean_and_text_expressions():
    assert expr.compile("/a = 1").priority({"a": 1}) == 1
    assert expr.compile("/a = 1").priority({"a": 2}) == 0
    assert expr.compile("/a = 1").priority({}) == -1
    assert expr.compile("/p").priority({"p": "42"}) == 42
    assert expr.compile("IF(/vip, 100, 1)").priority({"vip": True}) == 100
