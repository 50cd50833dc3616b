"""The worst inputs the expression limits allow, shared by the tests (which check what
the answers are) and bench/bench_expr.py (which measures how long they take: speed is
measured in bench/, never asserted by a test).

- ``WORST_SOURCES``: expressions at the source, node, list and LIKE limits;
- ``WORST_SUBJECTS``, ``random_patterns``: LIKE patterns with the subjects that make
  them backtrack most, up to each pattern's subject limit;
- ``VOCABULARY``, ``token_soup``: random token soup for ``compile``.
"""

from __future__ import annotations

import random
from typing import Callable

from conveyor.expr import limits

#: name -> a source at a limit. Each compiles, except those in WORST_SOURCES_REFUSED.
WORST_SOURCES: dict[str, Callable[[], str]] = {
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
#: name -> the error (a regular expression) of the limit that refuses it
WORST_SOURCES_REFUSED = {"token soup": "more than .* terms"}

VOCABULARY = ["AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "BETWEEN", "BEGINS", "ENDS", "WITH",
              "TRUE", "FALSE", "(", ")", ",", "=", "==", "!=", "<>", "<", "<=", ">", ">=", "+", "-",
              "*", "/", "%", "/a", "/a/b", "/arr[0]", "[/x y]", "1", "2.5", "1e5", "'s'", '"t"', "''",
              "'(a+)+'", "'[a-'", "IF", "COALESCE", "UPPER", "SUBSTR", "FOO", "'^a'", "[", "]",
              "'", '"', "\\", "@", ".", "/@x", "/55", "1.", ".5", "9" * 30]  # fmt: skip
#: messages every compiled expression of the robustness checks is evaluated against
ROBUSTNESS_MESSAGES = ({}, {"a": "x", "arr": [1, "2"]}, {"a": {"b": [None]}}, [1], "text", None)

#: pattern -> the unit its worst subject repeats, up to the pattern's subject limit
WORST_SUBJECTS = {
    ".*x": "a",
    "a.*b.*c": "ab",
    "(.*)\\1x": "a",
    "a{500}b": "a",
    "\\d+\\.\\d+$": "1.",
    "(?:GET|POST)+x": "GET",
    "(a|b|ab)c": "ab",
    "(?=.*a)(?=.*b).*c": "ab",
    "(?i)(a|A)+b": "a",
    "(\\d+)-\\1": "1",
    "(\\w*)\\1\\1\\1x": "a",
    "[^x]*[^y]*z": "a",
    "^[A-Z]+-\\d+$": "A",
}

#: building blocks of random patterns (the property test and the bench draw from them)
PIECES = ["a", "b", ".", "[ab]", "\\d", "x", "(a)", "(?:ab)", "a|b", "\\1", "^", "$", "(?=a)",
          "(a|b)", "[^a]", "\\w", "ab|ba"]  # fmt: skip
QUANTIFIERS = ["", "", "*", "+", "?", "{2,5}", "*?", "{0,40}", "++"]
UNITS = ["a", "ab", "aab", "ba1", "a\n"]
PLAIN_TEXT_SUBJECT_CHARS = 10_000  # plain-text patterns have no subject limit: test this long


def join_pattern(parts: list[tuple[str, str]]) -> str:
    """Pieces with their quantifiers; a multi-character piece is grouped first."""
    return "".join(p + q if len(p) == 1 or p.startswith(("(", "[", "\\")) else f"(?:{p}){q}" for p, q in parts)


def subject(unit: str, chars: int) -> str:
    """``unit`` repeated to exactly ``chars`` characters."""
    return (unit * (chars // len(unit) + 1))[:chars]


def random_patterns(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` seeded (pattern, unit) pairs drawn as the property test draws them."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = [(rng.choice(PIECES), rng.choice(QUANTIFIERS)) for _ in range(rng.randint(1, 6))]
        out.append((join_pattern(parts), rng.choice(UNITS)))
    return out


def token_soup(count: int, seed: int) -> list[str]:
    """``count`` seeded sources of up to 25 vocabulary words, glued or spaced."""
    rng = random.Random(seed)
    return [
        ("" if rng.random() < 0.5 else " ").join(rng.choice(VOCABULARY) for _ in range(rng.randint(0, 25)))
        for _ in range(count)
    ]
