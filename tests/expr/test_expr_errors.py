"""Bad filters raise ExpressionError (a BadFilter) naming the position and the token."""

from __future__ import annotations

import pytest

from conveyor import expr
from conveyor.errors import BadFilter, ClientError, error_for_code
from conveyor.expr import ExpressionError, limits

# (source, position, token, words the message must contain)
BAD = [
    ("/a = 1 AND AND /b = 2", 11, "AND", "unexpected token 'AND'"),
    ("/a = ", 5, "", "unexpected end of expression"),
    ("/a = 'abc", 5, "'abc", "unterminated string"),
    ('/a = "abc', 5, '"abc', "unterminated string"),
    ("/a # 1", 3, "#", "unexpected character '#'"),
    ("FOO(/a)", 0, "FOO", "unknown function 'FOO'"),
    ("/a = 1 AND foo(1)", 11, "FOO", "unknown function 'FOO'"),
    ("SUBSTR(/a)", 0, "SUBSTR", "SUBSTR takes 2 to 3 arguments, not 1"),
    ("UPPER(/a, /b)", 0, "UPPER", "UPPER takes 1 argument, not 2"),
    ("IF(/a, 1)", 0, "IF", "IF takes 3 arguments, not 2"),
    ("COALESCE()", 0, "COALESCE", "COALESCE takes at least 1 argument"),
    ("/a LIKE /b", 8, "/b", "LIKE pattern must be a quoted string"),
    ("/a LIKE '(a+)+'", 8, "(a+)+", "nested quantifiers"),
    ("/a LIKE '[a-'", 8, "[a-", "invalid LIKE pattern"),
    ("/a = 1 = 2", 7, "=", "unexpected token '='"),
    ("1 < 2 < 3", 6, "<", "unexpected token '<'"),
    ("(/a = 1", 7, "", "unexpected end of expression"),
    ("/a = 1)", 6, ")", "unexpected token ')'"),
    ("12abc = 1", 0, "12abc", "invalid number"),
    ("1.2.3", 0, "1.2.3", "invalid number"),
    ("/", 0, "/", "invalid field path"),
    ("/a = /", 5, "/", "invalid field path"),
    ("[/ab = 1", 0, "[/ab = 1", "invalid bracketed field name"),
    ("'\\x4'", 1, "\\x", "invalid \\x escape"),
    ("/a IN ()", 7, ")", "unexpected token ')'"),
    ("/a IN 1, 2", 6, "1", "unexpected token '1'"),
    ("/a BEGINS ('x')", 10, "(", "unexpected token '('"),
    ("/a ENDS WITH 'x'", 13, "'x'", "unexpected token"),
    ("/a IS 1", 6, "1", "unexpected token '1'"),
    ("/a NOT = 1", 7, "=", "unexpected token '='"),
    ("/a BETWEEN 1 OR 2", 13, "OR", "unexpected token 'OR'"),
    ("/a = NOT 1", 5, "NOT", "unexpected token 'NOT'"),
    ("region = 'EU'", 0, "region", "unexpected token 'region'"),
    ("/a[x] = 1", 2, "[", "unexpected character '['"),
    ("", 0, "", "unexpected end of expression"),
    ("   ", 3, "", "unexpected end of expression"),
    ("AND", 0, "AND", "unexpected token 'AND'"),
]


@pytest.mark.parametrize("source, position, token, words", BAD, ids=[b[0] for b in BAD])
def test_bad_filter_position_and_token(source, position, token, words):
    with pytest.raises(ExpressionError) as info:
        expr.compile(source)
    err = info.value
    assert err.position == position
    assert err.token == token
    assert words in str(err)
    assert str(err).endswith(f"at position {position}")


def test_message_format():
    with pytest.raises(ExpressionError) as info:
        expr.compile("/a = 1 AND AND /b = 2")
    assert str(info.value) == "unexpected token 'AND' at position 11"


def test_expression_error_is_a_bad_filter_with_details():
    with pytest.raises(BadFilter) as info:
        expr.compile("/a = ")
    err = info.value
    assert isinstance(err, ClientError)
    assert err.code == "bad_filter"
    assert err.details == {"position": 5, "token": ""}
    rebuilt = error_for_code(err.code, err.message, **err.details)
    assert isinstance(rebuilt, BadFilter) and rebuilt.details["position"] == 5


def test_error_survives_pickling():
    import pickle

    try:
        expr.compile("/a = 1 AND AND /b = 2")
    except ExpressionError as err:
        copy = pickle.loads(pickle.dumps(err))
        assert (copy.position, copy.token, str(copy)) == (err.position, err.token, str(err))


def test_long_tokens_are_cut_in_messages():
    with pytest.raises(ExpressionError) as info:
        expr.compile("/a = '" + "x" * 10_000)
    assert len(info.value.token) <= limits.error_token_chars_max + 3
    assert len(str(info.value)) < 200


def test_non_text_source():
    with pytest.raises(ExpressionError):
        expr.compile(42)  # type: ignore[arg-type]
    assert expr.compile(b"/a = 1").matches({"a": 1})
    with pytest.raises(ExpressionError, match="UTF-8"):
        expr.compile(b"/a = '\xff'")


def test_errors_are_not_cached():
    for _ in range(2):
        with pytest.raises(ExpressionError):
            expr.compile("/a = ")
