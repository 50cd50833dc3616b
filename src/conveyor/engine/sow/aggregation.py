"""The incremental state of one view or aggregated subscription: members, groups and
their accumulators (reference G.2, G.4; docs/sow-and-views.md).

A *member* is one underlying message that counts: a SOW record (by its key), a queue
message (by its position) or a record of another view (by its key). Rules:

1. **Per change, not per rescan.** :meth:`add` and :meth:`remove` touch one member and
   its group: each aggregate takes the member's argument value in or out
   (:mod:`conveyor.expr.aggregates`), so a change costs O(aggregates), whatever the
   size of the group (MIN/MAX: O(distinct values) only when the extreme leaves).
2. **A member remembers what it contributed** (group key, aggregate arguments, the
   fields read for the newest-message rule), so removing it needs no payload.
3. The ``Filter`` applies to each message before it counts; a message that does not
   match is not a member.
4. **Changed groups are collected** and rendered once per engine step
   (:meth:`take_changes`): a group that lost its last member reports ``None`` (its
   record is deleted). Several changes to a group within a step produce one update.
5. A projected field outside aggregates that is not a grouping field takes its value
   from the group's newest member (highest ``order``: the record's or message's journal
   position), so the record is the same after a restart and after removals.
6. **A member that fails is left out** (engine/poison.py): a filter or projection that
   raises on a message makes it no member; a group whose record cannot be rendered is
   not reported this time (its last record stands). Both are counted and logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, Iterator, Protocol, cast

from conveyor.engine import poison
from conveyor.expr.aggregates import accumulator
from conveyor.expr.projection import Projection

if TYPE_CHECKING:
    from _typeshed import SupportsDunderGT

    from conveyor.expr import Expression

    #: A member's order (rule 5): a position, or a joined row's tuple of them (joins.py);
    #: compared only with the orders of the same aggregation.
    Order = SupportsDunderGT[Any]


class MemberSink(Protocol):
    """What a source feeds its member changes to: an :class:`Aggregation`, or one side
    of a join (engine/sow/joins.py) that feeds one in turn. ``order``: the member's journal
    position, or a view record's sequence number (rule 5)."""

    def add(self, member: Hashable, order: int, data: Any, meta: Any = None) -> bool: ...

    def remove(self, member: Hashable) -> bool: ...


class _Group:
    __slots__ = ("accs", "size", "newest", "members")

    def __init__(self, names: list[str], track: bool) -> None:
        self.accs = [accumulator(n) for n in names]
        self.size = 0
        self.newest: tuple[Order, Hashable] | None = None  # (order, member) (rule 5)
        self.members: dict[Hashable, Order] | None = {} if track else None  # member -> order


class Aggregation:
    """Rules 1-5 for one projection."""

    __slots__ = ("projection", "filter", "members", "groups", "dirty")

    def __init__(self, projection: Projection, filter: Expression | None = None) -> None:
        self.projection = projection
        self.filter = filter  # a compiled Expression, or None (rule 3)
        self.members: dict[Hashable, tuple[tuple[Hashable, ...], tuple[object, ...], tuple[object, ...], Order]] = {}
        # (member -> (key, args, reads, order))
        self.groups: dict[tuple[Hashable, ...], _Group] = {}
        self.dirty: dict[tuple[Hashable, ...], None] = {}  # an ordered set of group keys

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, member: Hashable, order: Order, data: Any, meta: Any = None) -> bool:
        """``member`` counts now (replacing what it counted before); False if the filter
        leaves it out."""
        if member in self.members:
            self.remove(member)
        flt = self.filter
        try:
            if flt is not None and not flt.matches(data, meta):
                return False
            key, args, reads = self.projection.member(data, meta)
        except Exception as exc:  # noqa: BLE001 - rule 6: not a member
            poison.skipped("projection", f"member {member!r} of a view or aggregated subscription", exc)
            return False
        self.members[member] = (key, args, reads, order)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group(self.projection.aggregates, self.projection.needs_newest)
        group.size += 1
        for acc, value in zip(group.accs, args):
            acc.add(value)
        if group.members is not None:
            group.members[member] = order
            if group.newest is None or order > group.newest[0]:
                group.newest = (order, member)
        self.dirty[key] = None
        return True

    def remove(self, member: Hashable) -> bool:
        """``member`` no longer counts; False if it did not."""
        entry = self.members.pop(member, None)
        if entry is None:
            return False
        key, args, _reads, order = entry
        group = self.groups[key]
        group.size -= 1
        for acc, value in zip(group.accs, args):
            acc.remove(value)
        if group.members is not None:
            del group.members[member]
            if group.newest is not None and group.newest[1] == member:
                group.newest = max(((o, m) for m, o in group.members.items()), default=None,
                                   key=lambda om: om[0])
        if not group.size:
            del self.groups[key]
        self.dirty[key] = None
        return True

    def clear(self) -> None:
        """Forget every member (each group that had one is reported deleted)."""
        for key in self.groups:
            self.dirty[key] = None
        self.members.clear()
        self.groups.clear()

    def record(self, key: tuple[Hashable, ...]) -> dict[str, object] | None:
        """The output record of group ``key`` now (None: no such group)."""
        group = self.groups.get(key)
        if group is None:
            return None
        reads = None
        if group.newest is not None:
            reads = self.members[group.newest[1]][2]
        return self.projection.render(key, [acc.result() for acc in group.accs], reads)

    def take_changes(self) -> list[tuple[tuple[Hashable, ...], dict[str, object] | None]]:
        """Rule 4: (group key, its record or None) for every group changed since the
        last call, in the order they first changed."""
        if not self.dirty:
            return []
        dirty, self.dirty = self.dirty, {}
        out = []
        for key in dirty:
            try:
                out.append((key, self.record(key)))
            except Exception as exc:  # noqa: BLE001 - rule 6: not reported this time
                poison.skipped("projection", f"group {key!r} of a view or aggregated subscription", exc)
        return out

    def records(self) -> Iterator[tuple[tuple[Hashable, ...], dict[str, object]]]:
        for key in self.groups:
            try:
                record = self.record(key)
            except Exception as exc:  # noqa: BLE001 - rule 6: left out
                poison.skipped("projection", f"group {key!r} of a view or aggregated subscription", exc)
                continue
            yield key, cast("dict[str, object]", record)  # a group has a record
