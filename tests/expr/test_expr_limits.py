"""The named limits: each is enforced with a clear error, and the worst inputs they
allow still parse and compile in well under a second."""

from __future__ import annotations

import re
import time

import pytest

from conveyor import expr
from conveyor.expr import ExpressionError, limits
from conveyor.expr.expression import _compile_cached


def _compile_time(source: str) -> float:
    _compile_cached.cache_clear()
    re.purge()
    started = time.perf_counter()
    try:
        expr.compile(source)
    except ExpressionError:
        pass
    return time.perf_counter() - started


def test_source_length_limit():
    ok = "/a = '" + "x" * (limits.source_chars_max - 7) + "'"
    assert len(ok) == limits.source_chars_max
    assert expr.compile(ok).matches({"a": "x" * (limits.source_chars_max - 7)})
    with pytest.raises(ExpressionError, match="longer than") as info:
        expr.compile(ok + " ")
    assert info.value.position == limits.source_chars_max


def test_nesting_limit():
    depth = limits.nesting_depth_max
    assert expr.compile("(" * depth + "1" + ")" * depth).evaluate({}) == 1
    for source in (
        "(" * (depth + 1) + "1" + ")" * (depth + 1),
        "NOT " * (depth + 1) + "1",
        "-" * (depth + 1) + "1",
        "UPPER(" * (depth + 1) + "'a'" + ")" * (depth + 1),
        " + ".join(["1"] * (depth + 2)),
    ):
        with pytest.raises(ExpressionError, match="nested deeper"):
            expr.compile(source)


def test_node_count_limit():
    n = limits.node_count_max // 3
    expr.compile(" OR ".join(f"/a = {i}" for i in range(n - 2)))
    with pytest.raises(ExpressionError, match="more than .* terms"):
        expr.compile(" OR ".join(f"/a = {i}" for i in range(n + 1)))


def test_literal_lists_are_cheap_and_bounded():
    e = expr.compile("/a IN (" + ", ".join(str(i) for i in range(10_000)) + ")")
    assert e.matches({"a": 9_999}) and not e.matches({"a": 10_000})
    with pytest.raises(ExpressionError, match="list has more than"):
        expr.compile("/a IN (" + ", ".join("1" for _ in range(limits.list_items_max + 1)) + ")")


def test_like_count_limit():
    n = limits.regex_count_max
    expr.compile(" OR ".join(f"/a LIKE 'x{i}'" for i in range(n)))
    with pytest.raises(ExpressionError, match=f"more than {n} LIKE"):
        expr.compile(" OR ".join(f"/a LIKE 'x{i}'" for i in range(n + 1)))


def test_like_patterns_share_the_work_budget():
    from conveyor.expr.regex import compile_pattern

    alone = compile_pattern("a.*b", 0).subject_chars_max
    shared = compile_pattern("a.*b", 0, sharing=100).subject_chars_max
    assert shared < alone
    with pytest.raises(ExpressionError, match="shared by 128 LIKE patterns"):
        expr.compile(" OR ".join(f"/a LIKE 'a.*b.*c{i}'" for i in range(128)))


WORST = {
    "comparisons": lambda: " OR ".join(f"/f{i} = 'x{i}'" for i in range(limits.node_count_max // 3 - 1)),
    "between": lambda: " OR ".join(f"/f{i}/g BETWEEN {i} AND {i + 1}" for i in range(limits.node_count_max // 5)),
    "in list": lambda: "/a IN (" + ", ".join(str(i) for i in range(limits.list_items_max)) + ")",
    "string list": lambda: "/a IN (" + ", ".join(f"'{i}'" for i in range(12_000)) + ")",
    "likes": lambda: " OR ".join(f"/a LIKE '{'[a-z]b' * 40}.*{i}'" for i in range(limits.regex_count_max)),
    "unicode classes": lambda: " OR ".join(f"/a LIKE '[\u0100-\uffff]{i}'" for i in range(4)),
    "deep": lambda: "UPPER(" * 60 + "/a" + ")" * 60,
    "long path": lambda: "/a" * (limits.source_chars_max // 2 - 10) + " = 1",
    "concat": lambda: "CONCAT(" + ",".join(["/a"] * 4000) + ") = 1",
    "long string": lambda: "/a = '" + "x" * (limits.source_chars_max - 10) + "'",
    "long number": lambda: "/a = " + "9" * (limits.source_chars_max - 10),
    "token soup": lambda: "( " * 30 + "/a = 1 AND " * 5000,
}


@pytest.mark.parametrize("name", sorted(WORST))
def test_worst_inputs_compile_quickly(name):
    source = WORST[name]()
    assert len(source) <= limits.source_chars_max
    assert _compile_time(source) < 1.0
