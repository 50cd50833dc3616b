"""Views over a join: a left outer join of two SOW topics or views (reference G.2;
docs/sow-and-views.md, "Joins").

``<UnderlyingTopic><Join>[L].[/f]=[R].[/g]</Join></UnderlyingTopic>``: every record of
``L`` is joined with the records of ``R`` whose ``/g`` equals its ``/f``, compared as
text (``12345`` and ``12345.00`` differ); a left record without a match is joined with
nothing (the right side's fields are NULL); a right record without a match yields
nothing. The joined rows are the members of the view's
:class:`~conveyor.engine.aggregation.Aggregation`, so grouping and aggregates work as for
one underlying topic. Rules:

1. **Incremental.** A change of a left record replaces its rows; a change of a right
   record touches the rows of the left records with its old or new join value only
   (the first match of a left record replaces its unmatched row, the last one leaving
   brings it back). Nothing is ever rescanned; a right record matching many left
   records (a lookup topic) updates every one of their rows, as the reference warns.
2. **Join values.** NULL and empty text never match, unless ``JoinNullEquivalency`` is
   ``enabled``: then they match each other.
3. **A row** is the message ``{L: left record, R: right record}`` (the right side
   absent when unmatched); the projection's ``[L].[/path]`` is the path ``/L/path``
   there (:func:`rewrite_identifiers`). Its message functions describe the left record;
   its order (the newest-row rule of grouping) is the newer of its two records', then
   the left's, then the right's: unique, so a group's record does not depend on the
   order rows were counted in.
4. **Memory**: the join keeps each record of both sides decoded (a change of one side
   rebuilds rows with the other side's records without reading the journal).
5. One ``Join`` of two different topics per view; more are refused at startup
   (:class:`~conveyor.engine.state_of_world.StateOfTheWorld`).
"""

from __future__ import annotations

import re
from typing import Any, Hashable

from conveyor import expr
from conveyor.config.model import JoinConfig
from conveyor.engine.aggregation import Aggregation
from conveyor.expr.nodes import Field, walk
from conveyor.expr.parser import parse
from conveyor.expr.projection import split_as
from conveyor.expr.values import scalar, to_text

# ``[type].[topic].[/path]`` or ``[topic].[/path]`` outside string literals (rule 3).
_IDENTIFIER = re.compile(
    r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
    r"|(?:\[[^\[\]/]+\]\.)?\[(?P<topic>[^\[\]/]+)\]\.\[(?P<path>/[^\[\]]+)\]"
)


def rewrite_identifiers(text: str) -> str:
    """Rule 3: ``[T].[/p]`` becomes ``[/T]/p`` (the path ``/T/p`` of a joined row)."""

    def one(m: re.Match) -> str:
        if m.group(1) is not None:
            return m.group(1)  # a string literal stays as it is
        return f"[/{m.group('topic')}]{m.group('path')}"

    return _IDENTIFIER.sub(one, text)


def unknown_roots(field: str, topics: tuple[str, ...]) -> list[str]:
    """The field paths of a projected or grouping field (already rewritten; its ``AS``
    path aside) that do not start with one of the joined ``topics``: in a join every
    identifier names its topic."""
    text, _ = split_as(field)
    return ["/" + "/".join(map(str, n.steps)) for n in walk(parse(text))
            if isinstance(n, Field) and n.steps and n.steps[0] not in topics]


class _Side:
    """What a source feeds: the ``add``/``remove`` of an Aggregation, for one side."""

    __slots__ = ("join", "left")

    def __init__(self, join: "Join", left: bool) -> None:
        self.join = join
        self.left = left

    def add(self, member: Hashable, order: int, data: Any, meta: Any = None) -> bool:
        if self.left:
            self.join.left_set(member, order, data, meta)
        else:
            self.join.right_set(member, order, data)
        return True

    def remove(self, member: Hashable) -> bool:
        if self.left:
            return self.join.left_delete(member)
        return self.join.right_delete(member)


class Join:
    """Rules 1-4 for one ``Join``, feeding ``aggregation``."""

    __slots__ = ("aggregation", "left_topic", "right_topic", "_left_value", "_right_value", "_nulls_match",
                 "left", "right", "_left_by", "_right_by", "left_side", "right_side")

    def __init__(self, config: JoinConfig, aggregation: Aggregation, *, null_equivalency: bool = False) -> None:
        self.aggregation = aggregation
        self.left_topic = config.left_topic
        self.right_topic = config.right_topic
        self._left_value = expr.compile(config.left_field).evaluate
        self._right_value = expr.compile(config.right_field).evaluate
        self._nulls_match = null_equivalency
        self.left: dict[Hashable, tuple[str | None, int, Any, Any]] = {}  # key -> (join value, order, data, meta)
        self.right: dict[Hashable, tuple[str | None, int, Any]] = {}  # key -> (join value, order, data)
        self._left_by: dict[str, dict[Hashable, None]] = {}  # join value -> left keys
        self._right_by: dict[str, dict[Hashable, None]] = {}  # join value -> right keys
        self.left_side = _Side(self, True)
        self.right_side = _Side(self, False)

    def _value(self, evaluate, data: Any) -> str | None:
        """Rule 2: the join value as text; None: it matches nothing."""
        text = to_text(scalar(evaluate(data, None)))
        if text is None or text == "":
            return "" if self._nulls_match else None
        return text

    # --- rows (rule 3) ----------------------------------------------------------------------

    def _add_row(self, lkey: Hashable, rkey: Hashable | None) -> None:
        _, lorder, ldata, meta = self.left[lkey]
        row = {self.left_topic: ldata}
        rorder = -1
        if rkey is not None:
            _, rorder, rdata = self.right[rkey]
            row[self.right_topic] = rdata
        # the newer record's order first; both orders make it unique, so the group's
        # newest row is the same whatever order the rows were added in (after a restart)
        self.aggregation.add((lkey, rkey), (max(lorder, rorder), lorder, rorder), row, meta)

    def _matches(self, value: str | None) -> dict[Hashable, None]:
        return self._right_by.get(value, {}) if value is not None else {}

    # --- left side ----------------------------------------------------------------------------

    def left_set(self, key: Hashable, order: int, data: Any, meta: Any) -> None:
        self.left_delete(key)
        value = self._value(self._left_value, data)
        self.left[key] = (value, order, data, meta)
        if value is not None:
            self._left_by.setdefault(value, {})[key] = None
        matches = self._matches(value)
        for rkey in matches or (None,):
            self._add_row(key, rkey)

    def left_delete(self, key: Hashable) -> bool:
        entry = self.left.pop(key, None)
        if entry is None:
            return False
        value = entry[0]
        for rkey in self._matches(value) or (None,):
            self.aggregation.remove((key, rkey))
        if value is not None:
            keys = self._left_by[value]
            del keys[key]
            if not keys:
                del self._left_by[value]
        return True

    # --- right side (rule 1) -------------------------------------------------------------------

    def right_set(self, key: Hashable, order: int, data: Any) -> None:
        self.right_delete(key)
        value = self._value(self._right_value, data)
        self.right[key] = (value, order, data)
        if value is None:
            return
        keys = self._right_by.setdefault(value, {})
        first = not keys
        keys[key] = None
        agg = self.aggregation
        for lkey in self._left_by.get(value, ()):
            if first:
                agg.remove((lkey, None))  # its first match replaces the unmatched row
            self._add_row(lkey, key)

    def right_delete(self, key: Hashable) -> bool:
        entry = self.right.pop(key, None)
        if entry is None:
            return False
        value = entry[0]
        if value is None:
            return True
        keys = self._right_by[value]
        del keys[key]
        if not keys:
            del self._right_by[value]
        agg = self.aggregation
        for lkey in self._left_by.get(value, ()):
            agg.remove((lkey, key))
            if not keys:
                self._add_row(lkey, None)  # its last match left: unmatched again
        return True
