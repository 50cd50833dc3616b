"""LIKE: semantics (search, flags, anchors, arrays) and the cost rules of regex.py."""

from __future__ import annotations

import os
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import expr
from conveyor.expr import ExpressionError, limits
from conveyor.expr.regex import compile_pattern

sys.path.insert(0, os.path.dirname(__file__))
from worst_cases import (  # noqa: E402
    PIECES,
    PLAIN_TEXT_SUBJECT_CHARS,
    QUANTIFIERS,
    UNITS,
    WORST_SUBJECTS,
    join_pattern,
    subject,
)


def like(pattern: str, value):
    return expr.compile(f"/s LIKE '{pattern}'").evaluate({"s": value})


# --- semantics ------------------------------------------------------------------------------


def test_like_is_an_unanchored_search():
    assert like("abc", "xxabcxx") is True
    assert like("^abc", "xxabc") is False
    assert like("abc$", "xxabc") is True


def test_like_is_case_sensitive_unless_flagged():
    assert like("ABC", "abc") is False
    assert like("(?i)ABC", "xabcx") is True


def test_like_is_not_unicode_aware():
    # (?i) folds ASCII only, and \w is [A-Za-z0-9_], as in AMPS.
    assert like("(?i)^é$", "É") is False
    assert like("^\\w$", "é") is False
    assert like("^\\w$", "e") is True


def test_like_on_numbers_uses_their_text():
    e = expr.compile("/n LIKE '^4\\.9'")
    assert e.evaluate({"n": 4.99}) is True
    assert expr.compile("/n LIKE '^1$'").evaluate({"n": True}) is False
    assert expr.compile("/n LIKE '^true$'").evaluate({"n": True}) is True


def test_like_with_null_and_empty_is_unknown():
    assert like("a", None) is None
    assert like("^$", "") is None  # '' is NULL, even for a pattern that matches ''
    assert expr.compile("/s NOT LIKE 'a'").evaluate({}) is None


def test_like_over_arrays_is_any_element():
    e = expr.compile("/s LIKE '^b'")
    assert e.evaluate({"s": ["a", "b"]}) is True
    assert e.evaluate({"s": ["a", "c"]}) is False
    assert e.evaluate({"s": ["a", None]}) is None
    assert e.evaluate({"s": []}) is None


def test_not_like():
    assert expr.compile("/s NOT LIKE '^a'").matches({"s": "ba"})
    assert not expr.compile("/s NOT LIKE '^a'").matches({"s": "ab"})


@pytest.mark.parametrize(
    "pattern, kind",
    [
        ("abc", "contains"),
        ("^abc", "prefix"),
        ("abc$", "suffix"),
        ("abc\\Z", "suffix_z"),
        ("^abc$", "exact"),
        ("\\Aabc\\Z", "exact_z"),
        ("a.c", "regex"),
        ("(?i)abc", "regex"),
        ("(?m)^abc", "regex"),
    ],
)
def test_plain_text_patterns_skip_the_regex_engine(pattern, kind):
    assert compile_pattern(pattern, 0).kind == kind


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab\n", max_size=6),
    start=st.sampled_from(["", "^", "\\A"]),
    end=st.sampled_from(["", "$", "\\Z"]),
    subject=st.text(alphabet="ab\n", min_size=1, max_size=8),
)
def test_plain_text_fast_path_agrees_with_re_search(text, start, end, subject):
    pattern = start + text.replace("\n", "\\n") + end
    compiled = compile_pattern(pattern, 0)
    assert compiled.test(subject) is (re.search(pattern, subject, re.ASCII) is not None)
    e = expr.compile("/s LIKE " + repr(pattern).replace("\\\\", "\\"))
    assert e.matches({"s": subject}) is (re.search(pattern, subject, re.ASCII) is not None)


# --- cost rules -----------------------------------------------------------------------------

ACCEPTED = ["(.)\\1", "^IB.?$", "^90\\..*", "(?i)^us$", "\\d+\\.\\d+$", "(?:GET|POST)+x", "(a|b|ab)c",
            "a{500}b", "(?=.*a)(?=.*b).*c", "(?i)(a|A)+b", "(\\d+)-\\1", "[^x]*[^y]*z", ".*x",
            "a.*b.*c", "(.*)\\1x", "^[A-Z]+-\\d+$", "(\\w*)\\1\\1\\1x"]  # fmt: skip
REJECTED = {
    "(a+)+": "nested quantifiers",
    "(a*)*b": "nested quantifiers",
    "(x+x+)+y": "nested quantifiers",
    "^(\\w+\\s?)*$": "nested quantifiers",
    "(a?){30}a{30}": "may not contain a choice",
    "(a|a)*": "alternation inside a repeated part",
    "x(a|ab)*y": "alternation inside a repeated part",
    "a.*b.*c.*d": "backtrack too much",
    "[a-z]*[a-z]*[a-z]*x": "backtrack too much",
    "a{0,1000}a{0,1000}b": "backtrack too much",
    "(a)?(?(1)b|c)": "conditional groups",
}


@pytest.mark.parametrize("pattern", ACCEPTED)
def test_accepted_patterns(pattern):
    compiled = compile_pattern(pattern, 0)
    assert compiled.kind == "regex"
    assert limits.regex_subject_chars_min <= compiled.subject_chars_max <= limits.regex_subject_chars_max


@pytest.mark.parametrize("pattern, reason", sorted(REJECTED.items()))
def test_rejected_patterns_name_the_rule(pattern, reason):
    with pytest.raises(ExpressionError) as info:
        expr.compile(f"/s LIKE '{pattern}'")
    assert reason in str(info.value)
    assert info.value.position == 8 and info.value.token == pattern


def test_pattern_length_limit():
    with pytest.raises(ExpressionError, match="longer than"):
        compile_pattern("a" * (limits.regex_pattern_chars_max + 1), 0)


def test_invalid_pattern_is_an_expression_error():
    with pytest.raises(ExpressionError, match="invalid LIKE pattern '\\[a-': unterminated character set"):
        expr.compile("/s LIKE '[a-'")


def test_an_invalid_pattern_is_named_with_the_position_where_it_breaks():
    """Issue 32, defect 3: one line naming the pattern, where it breaks in the pattern,
    and where the pattern is in the filter."""
    with pytest.raises(ExpressionError) as refused:
        expr.compile("/t LIKE 'orders.(eu'")
    text = str(refused.value)
    assert "'orders.(eu'" in text and "character 7 of the pattern" in text and "at position 8" in text
    assert "\n" not in text
    assert refused.value.details["pattern_position"] == 7 and refused.value.details["position"] == 8


def test_wide_unicode_classes_share_one_budget():
    # Each class costs the stdlib compiler time in proportion to its span.
    one = "[\u0100-\uffff]x"
    expr.compile(f"/s LIKE '{one}'")
    with pytest.raises(ExpressionError, match="character classes"):
        expr.compile(" OR ".join(f"/s LIKE '{one}{i}'" for i in range(10)))


def test_subject_longer_than_the_pattern_limit_is_unknown():
    compiled = compile_pattern(".*x", 0)
    n = compiled.subject_chars_max
    e = expr.compile("/s LIKE '.*x'")
    assert e.evaluate({"s": "a" * (n - 1) + "x"}) is True
    assert e.evaluate({"s": "a" * n + "x"}) is None
    assert not expr.compile("/s NOT LIKE '.*x'").matches({"s": "a" * (n + 10)})


def test_plain_text_patterns_have_no_subject_limit():
    e = expr.compile("/s LIKE 'needle'")
    assert e.matches({"s": "x" * (limits.regex_subject_chars_max * 2) + "needle"})


# Subjects that make each accepted pattern backtrack as much as it can.
@pytest.mark.parametrize("pattern, unit", sorted(WORST_SUBJECTS.items()))
def test_worst_case_answers_at_the_subject_limit_and_is_unknown_beyond(pattern, unit):
    """How long these take is measured by bench/bench_expr.py (docs/benchmarks.md);
    here: an accepted pattern answers on its worst subject of the longest length it
    accepts, and a longer subject is UNKNOWN, never a guess."""
    compiled = compile_pattern(pattern, 0)
    n = compiled.subject_chars_max
    assert limits.regex_subject_chars_min <= n <= limits.regex_subject_chars_max
    worst = subject(unit, n)
    assert compiled.test(worst) in (True, False)
    assert compiled.test(worst + unit[0]) is None


@settings(max_examples=int(os.environ.get("EXPR_REGEX_EXAMPLES", "60")), deadline=None)
@given(
    parts=st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from(QUANTIFIERS)), min_size=1, max_size=6),
    unit=st.sampled_from(UNITS),
)
def test_random_accepted_patterns_answer_on_worst_subjects(parts, unit):
    pattern = join_pattern(parts)
    try:
        compiled = compile_pattern(pattern, 0)
    except ExpressionError:
        return
    n = compiled.subject_chars_max if compiled.kind == "regex" else PLAIN_TEXT_SUBJECT_CHARS
    worst = subject(unit, n)
    assert compiled.test(worst) in (True, False), pattern
    assert compiled.test(worst[:-1] + "!") in (True, False), pattern
    if compiled.kind == "regex":
        assert compiled.test(worst + "!") is None, pattern
