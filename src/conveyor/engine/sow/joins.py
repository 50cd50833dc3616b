"""Views over joins: left outer joins of SOW topics or views (reference G.2;
docs/sow-and-views.md, "Joins").

``<UnderlyingTopic><Join>[A].[/f]=[B].[/g]</Join><Join>[B].[/h]=[C].[/k]</Join>...``:
the first ``Join``'s left topic drives the view (its *root*); each ``Join`` adds one
topic on its right, joined to a topic already joined on its left, so the joins form a
tree rooted at the driving topic (a chain ``A-B-C``, a star ``A-B, A-C``, or both).
Every record of the root is joined with the records of each joined topic whose join
value equals its parent record's, compared as text (``12345`` and ``12345.00``
differ); a parent without a match is joined with nothing there (that topic's fields,
and those of every topic below it, are NULL); a record that no root record reaches
yields nothing. The joined rows are the members of the view's
:class:`~conveyor.engine.sow.aggregation.Aggregation`, so grouping and aggregates work as for
one underlying topic. Rules:

1. **Incremental.** A change of a record recomputes the rows of the root records it
   reaches, before or after the change, and nothing else: a root record's own change
   touches its rows; a joined record's change touches the root records that reach a
   parent record with its old or new join value. A row whose records did not change
   stays counted as it is. Nothing is ever rescanned; a record that many root records
   reach (a lookup topic) updates every one of their rows, as the reference warns.
2. **Join values.** NULL and empty text never match, unless ``JoinNullEquivalency`` is
   ``enabled``: then they match each other.
3. **A row** is the message ``{A: root record, B: record, ...}`` (a topic absent where
   nothing matched); the projection's ``[T].[/path]`` is the path ``/T/path`` there
   (:func:`conveyor.config.validation.rewrite_identifiers`). Its message functions describe the root record; its
   order (the newest-row rule of grouping) is its newest record's, then each topic's in
   join order (-1 where absent): unique, so a group's record does not depend on the
   order rows were counted in.
4. **Memory**: the join keeps each record of every joined topic decoded (a change of one
   topic rebuilds rows with the other topics' records without reading the journal).
5. **Shape**, checked at startup (config/sow.py): each ``Join`` after the first
   names, on its left, a topic joined before it and, on its right, a topic not joined
   yet; a topic is joined once.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable

from conveyor import expr
from conveyor.config.model import JoinConfig
from conveyor.engine import poison
from conveyor.engine.sow.aggregation import Aggregation
from conveyor.expr.values import scalar, to_text

def joined_topics(joins: tuple[JoinConfig, ...]) -> tuple[str, ...]:
    """The joined topics in join order, the driving one first (rule 5's shape, which the
    configuration checked: config/sow.py)."""
    topics = [joins[0].left_topic]
    for jc in joins:
        assert jc.left_topic in topics and jc.right_topic not in topics, jc
        topics.append(jc.right_topic)
    return tuple(topics)


class _Side:
    """What a source feeds: the ``add``/``remove`` of an Aggregation, for one topic."""

    __slots__ = ("join", "index")

    def __init__(self, join: "Join", index: int) -> None:
        self.join = join
        self.index = index

    def add(self, member: Hashable, order: int, data: Any, meta: Any = None) -> bool:
        self.join.set(self.index, member, order, data, meta)
        return True

    def remove(self, member: Hashable) -> bool:
        return self.join.delete(self.index, member)


class _Topic:
    """One joined topic: its records, and the indexes its joins read.

    ``index`` is its place in join order (0: the root); ``parent`` the topic it is
    joined to, ``slot`` its place among that parent's children, and ``own`` how its
    record's join value with the parent is computed (None at the root); ``below`` how a
    record's join value for each child is computed, in the children's slot order."""

    __slots__ = ("name", "index", "parent", "slot", "own", "below", "records", "by_value", "by_child_value",
                 "reached")

    def __init__(self, name: str, index: int, parent: int, slot: int,
                 own: Callable[[object, object], object] | None) -> None:
        self.name = name
        self.index = index
        self.parent = parent
        self.slot = slot
        self.own = own
        self.below: list[Callable[[object, object], object]] = []
        # key -> (order, data, meta, own join value, join value per child slot)
        self.records: dict[Hashable, tuple[int, Any, Any, str | None, tuple[str | None, ...]]] = {}
        self.by_value: dict[str, dict[Hashable, None]] = {}  # own join value -> keys
        self.by_child_value: list[dict[str, dict[Hashable, None]]] = []  # per child slot: value -> keys
        # key -> root keys whose rows hold it -> how many of their rows (not at the root)
        self.reached: dict[Hashable, dict[Hashable, int]] = {}


def _index(table: dict[str, dict[Hashable, None]], value: str | None, key: Hashable, add: bool) -> None:
    if value is None:
        return
    if add:
        table.setdefault(value, {})[key] = None
        return
    keys = table[value]
    del keys[key]
    if not keys:
        del table[value]


class Join:
    """Rules 1-5 for a view's ``Join`` children, feeding ``aggregation``."""

    __slots__ = ("aggregation", "topics", "_nulls_match", "_rows")

    def __init__(self, joins: Iterable[JoinConfig], aggregation: Aggregation, *,
                 null_equivalency: bool = False) -> None:
        joins = tuple(joins)
        names = joined_topics(joins)
        self.aggregation = aggregation
        self._nulls_match = null_equivalency
        self.topics: list[_Topic] = [_Topic(names[0], 0, -1, -1, None)]
        for i, jc in enumerate(joins, start=1):
            parent = self.topics[names.index(jc.left_topic)]
            self.topics.append(_Topic(jc.right_topic, i, parent.index, len(parent.below),
                                      expr.compile(jc.right_field).evaluate))
            parent.below.append(expr.compile(jc.left_field).evaluate)
            parent.by_child_value.append({})
        self._rows: dict[Hashable, dict[tuple[Hashable, ...], None]] = {}  # root key -> its rows' members

    def side(self, topic: str) -> _Side:
        """What ``topic``'s source feeds."""
        for t in self.topics:
            if t.name == topic:
                return _Side(self, t.index)
        raise KeyError(topic)

    def _value(self, evaluate: Callable[[object, object], object], data: Any) -> str | None:
        """Rule 2: the join value as text; None: it matches nothing (also when it cannot
        be computed: engine/poison.py, counted and logged)."""
        try:
            text = to_text(scalar(evaluate(data, None)))
        except Exception as exc:  # noqa: BLE001 - one record joins nothing; the view goes on
            poison.skipped("join", "a record of a joined topic", exc, "a view's Join")
            return None
        if text is None or text == "":
            return "" if self._nulls_match else None
        return text

    # --- records --------------------------------------------------------------------------

    def set(self, index: int, key: Hashable, order: int, data: Any, meta: Any) -> None:
        t = self.topics[index]
        old = t.records.get(key)
        affected = self._reaching(t, key, old) if old is not None else {}
        if old is not None:
            self._reindex(t, key, old, add=False)
        entry = (order, data, meta, self._value(t.own, data) if t.own is not None else None,
                 tuple(self._value(evaluate, data) for evaluate in t.below))
        t.records[key] = entry
        self._reindex(t, key, entry, add=True)
        affected.update(self._reaching(t, key, entry))
        for root in affected:
            self._recompute(root, index, key)

    def delete(self, index: int, key: Hashable) -> bool:
        t = self.topics[index]
        old = t.records.pop(key, None)
        if old is None:
            return False
        self._reindex(t, key, old, add=False)
        for root in self._reaching(t, key, old):
            self._recompute(root, index, key)
        return True

    @staticmethod
    def _reindex(t: _Topic, key: Hashable, entry: tuple[int, Any, Any, str | None, tuple[str | None, ...]], *,
                 add: bool) -> None:
        _index(t.by_value, entry[3], key, add)
        for table, value in zip(t.by_child_value, entry[4]):
            _index(table, value, key, add)

    def _reaching(self, t: _Topic, key: Hashable,
                  entry: tuple[int, Any, Any, str | None, tuple[str | None, ...]]) -> dict[Hashable, None]:
        """Rule 1: the root keys whose rows hold the record ``key`` of ``t`` (``entry``),
        or would: those reaching a parent record with its join value."""
        if t.index == 0:
            return {key: None}
        out = dict.fromkeys(t.reached.get(key, ()))
        own = entry[3]
        if own is not None:
            parent = self.topics[t.parent]
            for pkey in parent.by_child_value[t.slot].get(own, ()):
                if parent.index == 0:
                    out[pkey] = None
                else:
                    out.update(dict.fromkeys(parent.reached.get(pkey, ())))
        return out

    # --- rows (rule 3) ----------------------------------------------------------------------

    def _expand(self, root: Hashable) -> list[tuple[Hashable, ...]]:
        """The members of ``root``'s rows: a key, or None, per topic in join order."""
        rows: list[list[Hashable]] = [[root]]
        topics = self.topics
        for t in topics[1:]:
            parent = topics[t.parent]
            grown: list[list[Hashable]] = []
            for row in rows:
                pkey = row[t.parent]
                value = parent.records[pkey][4][t.slot] if pkey is not None else None
                matches = t.by_value.get(value, ()) if value is not None else ()
                for key in matches or (None,):
                    grown.append(row + [key])
            rows = grown
        return [tuple(r) for r in rows]

    def _recompute(self, root: Hashable, changed: int, changed_key: Hashable) -> None:
        """Rule 1: ``root``'s rows now; rows holding the changed record count again."""
        old = self._rows.pop(root, {})
        topics = self.topics
        new = dict.fromkeys(self._expand(root)) if root in topics[0].records else {}
        agg = self.aggregation
        for member in old:
            if member not in new:
                agg.remove(member)
                self._count(member, root, -1)
        for member in new:
            if member not in old:
                self._count(member, root, 1)
            elif member[changed] != changed_key:
                continue  # its records did not change
            self._add_row(member)
        if new:
            self._rows[root] = new

    def _count(self, member: tuple[Hashable, ...], root: Hashable, step: int) -> None:
        for t, key in zip(self.topics[1:], member[1:]):
            if key is None:
                continue
            roots = t.reached.setdefault(key, {})
            n = roots.get(root, 0) + step
            if n:
                roots[root] = n
            else:
                del roots[root]
                if not roots:
                    del t.reached[key]

    def _add_row(self, member: tuple[Hashable, ...]) -> None:
        row: dict[str, Any] = {}
        orders: list[int] = []
        meta = None
        for t, key in zip(self.topics, member):
            if key is None:
                orders.append(-1)
                continue
            order, data, m, _, _ = t.records[key]
            row[t.name] = data
            orders.append(order)
            if t.index == 0:
                meta = m
        # the newest record's order first; all of them make it unique, so the group's
        # newest row is the same whatever order the rows were added in (after a restart)
        self.aggregation.add(member, (max(orders), *orders), row, meta)
