"""``sow`` queries over records: filter, ``sow_keys``, ``orderby``, ``top_n`` and
``skip_n`` (reference G.1.2; docs/sow-and-views.md). Pure: records in, records out.

Rules:

1. ``orderby`` is a comma list of ``/field [ASC|DESC] [TEXT]``; ascending by default.
   ``TEXT`` sorts on the value's string form; otherwise the order of MIN and MAX
   (numbers by value below strings by text). NULL sorts first ascending, last
   descending. Without ``orderby`` the order is the records' order (SowKey order when
   ``skip_n`` is given, so pages are stable).
2. ``skip_n`` (needs ``top_n``) skips that many matching records, ``top_n`` caps the
   result. ``Matches`` counts every record that passed the filter (it may exceed what
   is returned); ``TopicMatches`` counts the records examined.
3. ``batch_size`` is at most :data:`BATCH_SIZE_MAX`; conveyor sends a result as one
   group of messages in as many frames as it needs, whatever the batch size.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, TypeVar

from conveyor import errors, expr
from conveyor.expr.aggregates import order_key
from conveyor.expr.values import scalar, to_text

#: The largest ``batch_size`` (reference G.1.2: above 10,000 is an error).
BATCH_SIZE_MAX = 10_000

_Row = TypeVar("_Row")  # what a query selects from: a record, as its caller holds it

_TERM = re.compile(r"\s*(?P<field>\S+)(?P<words>(?:\s+(?:ASC|DESC|TEXT))*)\s*", re.IGNORECASE)


class OrderBy:
    """A parsed ``orderby`` (rule 1)."""

    __slots__ = ("terms",)

    def __init__(self, text: str) -> None:
        terms = []
        for part in text.split(","):
            m = _TERM.fullmatch(part)
            if m is None or not part.strip():
                raise errors.InvalidOption(f"orderby term {part.strip()!r} is not '/field [ASC|DESC] [TEXT]'",
                                           option="orderby")
            words = m.group("words").upper().split()
            if "ASC" in words and "DESC" in words:
                raise errors.InvalidOption(f"orderby term {part.strip()!r} is both ASC and DESC", option="orderby")
            try:
                field = expr.compile(m.group("field"))
            except expr.ExpressionError as exc:
                raise errors.InvalidOption(f"orderby field {m.group('field')!r}: {exc}", option="orderby") from None
            terms.append((field, "DESC" in words, "TEXT" in words))
        self.terms = tuple(terms)

    def sort(self, rows: list[_Row], data_of: Callable[[_Row], object]) -> None:
        """Sort ``rows`` in place; ``data_of(row)``: the decoded message."""
        for field, desc, as_text in reversed(self.terms):
            def key(row: _Row, field: expr.Expression = field, as_text: bool = as_text) -> tuple[object, ...]:
                value = scalar(field.evaluate(data_of(row)))
                if value is None:
                    return (0,)
                return (1, to_text(value) or "") if as_text else (1, order_key(value))
            rows.sort(key=key, reverse=desc)


def check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and not 0 < batch_size <= BATCH_SIZE_MAX:
        raise errors.InvalidOption(f"batch_size must be 1 to {BATCH_SIZE_MAX}, not {batch_size}", option="batch_size")


def select(rows: Iterable[_Row], matches: Callable[[_Row], bool], *, orderby: OrderBy | None, top_n: int | None,
           skip_n: int, data_of: Callable[[_Row], object], key_of: Callable[[_Row], str]) -> tuple[list[_Row], int, int]:
    """(rows to return, Matches, TopicMatches) by rules 1 and 2."""
    examined = 0
    hits = []
    for row in rows:
        examined += 1
        if matches(row):
            hits.append(row)
    if orderby is not None:
        orderby.sort(hits, data_of)
    elif skip_n:
        hits.sort(key=key_of)
    end = None if top_n is None else skip_n + top_n
    return hits[skip_n:end], len(hits), examined
