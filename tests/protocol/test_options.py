"""The options header: kept parses, and the split that walks around nesting."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import errors
from conveyor.protocol import options
from conveyor.protocol.options import PARSED_TEXT_MAX, parse_options, split_outside


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab=,[]()'\"\\ 1", max_size=30))
def test_split_outside_agrees_with_the_walk_on_any_text(text: str) -> None:
    fast = split_outside(text, ",")
    walk_always = re.compile("")  # matches every text: the walk runs
    real, options._NESTING = options._NESTING, walk_always
    try:
        assert fast == split_outside(text, ",")
    finally:
        options._NESTING = real


def test_a_repeated_header_gives_the_same_immutable_options() -> None:
    first = parse_options("sow_delete", "deliveries=[3]")
    again = parse_options("sow_delete", "deliveries=[3]")
    assert again is first  # kept, not parsed again
    assert first.list("deliveries") == ("3",)
    with pytest.raises(AttributeError):
        first.lists = ()  # type: ignore[misc]  # shared between commands: never changed


def test_the_same_header_of_another_command_is_its_own_parse() -> None:
    assert parse_options("subscribe", "max_backlog=4").get("max_backlog") == 4
    with pytest.raises(errors.UnknownOption):
        parse_options("sow_delete", "max_backlog=4")


def test_a_refused_header_is_refused_every_time() -> None:
    for _ in range(3):
        with pytest.raises(errors.InvalidOption):
            parse_options("sow_delete", "deliveries=[]")


def test_a_long_header_is_parsed_and_not_kept() -> None:
    items = ",".join(str(k % 10) for k in range(PARSED_TEXT_MAX))
    text = f"deliveries=[{items}]"
    assert len(text) > PARSED_TEXT_MAX
    before = options._parse_kept.cache_info().currsize
    opts = parse_options("sow_delete", text)
    assert len(opts.list("deliveries") or ()) == PARSED_TEXT_MAX
    assert options._parse_kept.cache_info().currsize == before
    assert parse_options("sow_delete", text) is not opts


def test_kept_parses_are_bounded() -> None:
    for k in range(options.PARSED_MAX + 100):
        parse_options("sow_delete", f"deliveries=[{k}]")
    assert options._parse_kept.cache_info().currsize == options.PARSED_MAX
