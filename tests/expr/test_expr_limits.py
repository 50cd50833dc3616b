"""The named limits: each is enforced with a clear error, and the worst inputs they
allow still compile (how long they take is measured by bench/bench_expr.py)."""

from __future__ import annotations

import os
import sys

import pytest

from conveyor import expr
from conveyor.expr import ExpressionError, limits

sys.path.insert(0, os.path.dirname(__file__))
from worst_cases import WORST_SOURCES, WORST_SOURCES_REFUSED  # noqa: E402


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


@pytest.mark.parametrize("name", sorted(WORST_SOURCES))
def test_worst_inputs_within_the_limits_compile(name):
    source = WORST_SOURCES[name]()
    assert len(source) <= limits.source_chars_max
    if name in WORST_SOURCES_REFUSED:
        with pytest.raises(ExpressionError, match=WORST_SOURCES_REFUSED[name]):
            expr.compile(source)
    else:
        expr.compile(source)
