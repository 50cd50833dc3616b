"""``sow`` queries over records: filter, ``sow_keys``, ``orderby``, ``top_n`` and
``skip_n`` (reference G.1.2; docs/sow-and-views.md), and the production of a result
as its connection drains it. Pure: rows in, messages out; no I/O, no clock.

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
4. **A result is produced as its connection drains it** (:class:`Queries`). The step
   of the command sends ``group_begin`` and up to :data:`QUERY_FIRST_BYTES` of the
   result; what is left is produced by :meth:`Queries.pump`, a turn of the shell's
   loop at a time, for a connection whose socket takes more (``paused``) and within
   the bytes the shell says it has room for (at least one row a turn, at most
   :data:`QUERY_BYTES_PER_PUMP` and the pump's row budget). The filter of a query
   produced so is charged to the turn's filter budget, like a replay's.
5. **The snapshot is taken in the step of the command** (:class:`Snapshot`): the rows
   are read from the live structure during that step and, if the result is not
   finished by its end, what is left is copied (:meth:`Snapshot.freeze`): journal
   positions (a queue's messages, a SOW topic's records, with their keys) or
   references to a view's records, never encoded messages. A message at a position
   never changes, so the result is exactly the state of the step of the command,
   whatever is published, acknowledged, deleted or expired while it is produced. With
   ``orderby`` or ``skip_n`` every row is examined and sorted in that step (one sort
   key per matching record, held while sorting); the result then holds the chosen
   rows' positions or references.
6. **One result at a time per connection**, in the order of the commands: a query whose
   connection has a result on its way takes its snapshot at once and waits, so the
   groups of one connection never interleave. Other output of the connection (live
   messages of its subscriptions, acks of its other commands) is not held back.
7. **A damaged record ends the result**: the record cannot be read (bit rot, or no
   longer in the journal), so the group ends there and the query is answered with a
   failure ack naming why (``journal_corrupt``); what was sent stands.
8. **Retention keeps what a snapshot names**: :meth:`Queries.floor` is the lowest
   position a result on its way still has to read.
"""

from __future__ import annotations

import logging
import re
from array import array
from collections import deque
from typing import Any, Callable, Container, Generic, Hashable, Iterable, Iterator, TypeVar

from conveyor import errors, expr
from conveyor.engine.filter_budget import FilterBudget
from conveyor.engine.outbox import Outbox
from conveyor.expr.aggregates import order_key
from conveyor.expr.values import scalar, to_text
from conveyor.protocol import messages as m

log = logging.getLogger("conveyor.engine")

#: The largest ``batch_size`` (reference G.1.2: above 10,000 is an error).
BATCH_SIZE_MAX = 10_000
#: Rule 4: what the step of the command sends of its result at most, before pacing.
QUERY_FIRST_BYTES = 64 * 1024
#: Rule 4: the bytes one turn adds to a connection's output at most (the shell's room may
#: say less), and the rows it examines at most by default (as a bookmark replay's turn).
QUERY_BYTES_PER_PUMP = 1024 * 1024
QUERY_ROWS_PER_PUMP = 2000
#: What a result message costs on the wire beyond its topic and payload (header, query
#: id, SowKey or bookmark, framing), counted so a turn stays within the room it has.
QUERY_MESSAGE_OVERHEAD = 128

_T = TypeVar("_T")
_K = TypeVar("_K", bound=Hashable)
_R = TypeVar("_R")

_TERM = re.compile(r"\s*(?P<field>\S+)(?P<words>(?:\s+(?:ASC|DESC|TEXT))*)\s*", re.IGNORECASE)


class OrderBy:
    """A parsed ``orderby`` (rule 1)."""

    __slots__ = ("terms",)

    def __init__(self, text: str) -> None:
        terms = []
        for part in text.split(","):
            m_ = _TERM.fullmatch(part)
            if m_ is None or not part.strip():
                raise errors.InvalidOption(f"orderby term {part.strip()!r} is not '/field [ASC|DESC] [TEXT]'",
                                           option="orderby")
            words = m_.group("words").upper().split()
            if "ASC" in words and "DESC" in words:
                raise errors.InvalidOption(f"orderby term {part.strip()!r} is both ASC and DESC", option="orderby")
            try:
                field = expr.compile(m_.group("field"))
            except expr.ExpressionError as exc:
                raise errors.InvalidOption(f"orderby field {m_.group('field')!r}: {exc}", option="orderby") from None
            terms.append((field, "DESC" in words, "TEXT" in words))
        self.terms = tuple(terms)

    def sort_key(self, data: object) -> tuple[tuple[object, ...], ...]:
        """The key of one record per term (``data``: the decoded message)."""
        out: list[tuple[object, ...]] = []
        for field, _desc, as_text in self.terms:
            value = scalar(field.evaluate(data))
            if value is None:
                out.append((0,))
            else:
                out.append((1, to_text(value) or "") if as_text else (1, order_key(value)))
        return tuple(out)

    def order(self, keys: list[tuple[tuple[object, ...], ...]]) -> list[int]:
        """The indexes of ``keys`` (one :meth:`sort_key` per record) in result order:
        stable, one pass per term from the last, each ascending or descending."""
        order = list(range(len(keys)))
        for t in range(len(self.terms) - 1, -1, -1):
            def term(i: int, t: int = t) -> tuple[object, ...]:
                return keys[i][t]
            order.sort(key=term, reverse=self.terms[t][1])
        return order


def check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and not 0 < batch_size <= BATCH_SIZE_MAX:
        raise errors.InvalidOption(f"batch_size must be 1 to {BATCH_SIZE_MAX}, not {batch_size}", option="batch_size")


# --- snapshots (rule 5) -----------------------------------------------------------------------

#: What :meth:`Snapshot.freeze` makes of the rows left: (their iterator, how many, the
#: lowest journal position among them or None).
Frozen = tuple[Iterator[_T], int, "int | None"]


def frozen_positions(rows: Iterator[int]) -> Frozen[int]:
    """Journal positions (a queue's messages), 8 bytes each."""
    held = array("q", rows)
    return iter(held), len(held), min(held) if held else None


def frozen_keyed_positions(rows: Iterator[tuple[_K, int]]) -> Frozen[tuple[_K, int]]:
    """(key, journal position) of a SOW topic's records: a reference to each key (the
    topic holds the key itself) and 8 bytes per position."""
    keys: list[_K] = []
    positions = array("q")
    for key, position in rows:
        keys.append(key)
        positions.append(position)
    return zip(keys, positions), len(keys), min(positions) if positions else None


def frozen_references(rows: Iterator[tuple[_K, _R]]) -> Frozen[tuple[_K, _R]]:
    """(key, record) of a view's records: two references per record (a record the view
    replaces meanwhile stays alive until it is sent)."""
    keys: list[_K] = []
    refs: list[_R] = []
    for key, ref in rows:
        keys.append(key)
        refs.append(ref)
    return zip(keys, refs), len(keys), None


class Snapshot(Generic[_T]):
    """The rows of a query (rule 5): read from the live structure while the step of the
    command lasts, then, once :meth:`freeze` is called, from a copy of what was left.
    ``copy`` None: the rows cannot change (a list of its own, an aggregation nobody
    feeds any more)."""

    __slots__ = ("_rows", "_copy", "rows_held", "floor")

    def __init__(self, rows: Iterable[_T], copy: Callable[[Iterator[_T]], Frozen[_T]] | None = None) -> None:
        self._rows: Iterator[_T] = iter(rows)
        self._copy = copy
        self.rows_held = 0  # rows copied by freeze (tests, statistics)
        self.floor: int | None = None  # the lowest journal position the copy names (rule 8)

    def __iter__(self) -> Snapshot[_T]:
        return self

    def __next__(self) -> _T:
        return next(self._rows)

    def freeze(self) -> None:
        """Copy the rows not read yet, so later steps cannot change them (rule 5)."""
        copy, self._copy = self._copy, None
        if copy is not None:
            self._rows, self.rows_held, self.floor = copy(self._rows)


# --- selection (rules 1 and 2, a row at a time) -----------------------------------------------


class Tally:
    """What a query's acks report: rows returned, Matches, TopicMatches (rule 2)."""

    __slots__ = ("returned", "matches", "examined")

    def __init__(self) -> None:
        self.returned = self.matches = self.examined = 0


def in_order(rows: Iterator[tuple[_K, _R]], matches: Callable[[_R], bool] | None, top_n: int | None,
             tally: Tally) -> Iterator[tuple[_K, _R] | None]:
    """Rules 1 and 2 without a sort: the rows in their order, filtered, up to ``top_n``;
    None for a row examined and not returned (so a turn's work counts it). Past
    ``top_n`` the rest is only counted (at once when there is no filter)."""
    for row in rows:
        tally.examined += 1
        if matches is not None and not matches(row[1]):
            yield None
            continue
        tally.matches += 1
        if top_n is not None and tally.returned >= top_n:
            if matches is None:  # every row matches: count the rest without reading it
                rest = sum(1 for _ in rows)
                tally.examined += rest
                tally.matches += rest
                return
            yield None
            continue
        tally.returned += 1
        yield row


def sorted_rows(rows: Iterator[tuple[_K, _R]], matches: Callable[[_R], bool] | None, *, orderby: OrderBy | None,
                top_n: int | None, skip_n: int, data_of: Callable[[_R], object], key_text: Callable[[_K], str],
                copy: Callable[[Iterator[tuple[_K, _R]]], Frozen[tuple[_K, _R]]], tally: Tally,
                ) -> Snapshot[tuple[_K, _R]]:
    """Rules 1 and 2 with a sort (``orderby``, or ``skip_n``: SowKey order): every row is
    examined now; returns the chosen rows, frozen (rule 5). Held while sorting: the
    matching rows' keys and references, and one sort key each."""
    keys: list[_K] = []
    refs: list[_R] = []
    sort_keys: list[tuple[tuple[object, ...], ...]] = []
    for key, ref in rows:
        tally.examined += 1
        if matches is not None and not matches(ref):
            continue
        keys.append(key)
        refs.append(ref)
        if orderby is not None:
            sort_keys.append(orderby.sort_key(data_of(ref)))
    tally.matches = len(keys)
    if orderby is not None:
        order = orderby.order(sort_keys)
    else:
        order = sorted(range(len(keys)), key=lambda i: key_text(keys[i]))
    del sort_keys
    end = None if top_n is None else skip_n + top_n
    chosen = order[skip_n:end]
    tally.returned = len(chosen)
    snapshot = Snapshot(((keys[i], refs[i]) for i in chosen), copy)
    snapshot.freeze()
    return snapshot


def selection(source: Snapshot[tuple[_K, _R]], matches: Callable[[_R], bool] | None, *, orderby: OrderBy | None,
              top_n: int | None, skip_n: int, data_of: Callable[[_R], object], key_text: Callable[[_K], str],
              copy: Callable[[Iterator[tuple[_K, _R]]], Frozen[tuple[_K, _R]]], tally: Tally,
              ) -> tuple[Snapshot[tuple[_K, _R]], Iterator[tuple[_K, _R] | None]]:
    """Rules 1 and 2 over ``source``: (the snapshot to freeze and hold, the rows to send,
    None for a row examined and not sent): sorted now with ``orderby`` or ``skip_n``,
    else in order, a row at a time."""
    if orderby is not None or skip_n:
        chosen = sorted_rows(source, matches, orderby=orderby, top_n=top_n, skip_n=skip_n, data_of=data_of,
                             key_text=key_text, copy=copy, tally=tally)
        return chosen, chosen
    return source, in_order(source, matches, top_n, tally)


def record_messages(rows: Iterator[tuple[_K, _R] | None], load: Callable[[_R], Any], *, topic: str,
                    query_id: str | None, key_text: Callable[[_K], str] | None,
                    seen: set[Any] | None = None) -> Iterator[m.Message | None]:
    """The messages of a SOW topic's or view's rows (``load(ref)``: the record, an
    :class:`~conveyor.engine.cache.Entry`); ``key_text`` None: no SowKey (``no_sowkey``);
    ``seen``: the keys an oof subscription was sent."""
    for row in rows:
        if row is None:
            yield None
            continue
        key, ref = row
        entry = load(ref)
        if seen is not None:
            seen.add(key)
        yield m.Message(topic=topic, data=entry.data, timestamp=entry.timestamp, query_id=query_id,
                        correlation_id=entry.correlation_id, sow_key=None if key_text is None else key_text(key))


# --- production (rules 4, 6, 7 and 8) ----------------------------------------------------------


class Production:
    """One query's result on its way to its connection: ``begin`` (its ``group_begin``)
    is sent when it starts (rule 6: after the connection's earlier results), then the
    messages ``rows`` yields (None for a row examined and not sent); ``finish(error)`` is
    called once, when they are all sent (``error`` None) or a damaged record ended them
    (rule 7), and sends ``group_end`` and what follows it."""

    __slots__ = ("conn_id", "begin", "rows", "finish", "snapshot", "filter_cost")

    def __init__(self, conn_id: int, begin: m.GroupBegin | None, rows: Iterator[m.Message | m.OutOfFocus | None],
                 finish: Callable[[errors.JournalError | None], None], snapshot: Snapshot[Any],
                 filter_cost: int = 0) -> None:
        self.conn_id = conn_id
        self.begin = begin  # sent when the production starts (then None)
        self.rows = rows
        self.finish = finish
        self.snapshot = snapshot
        self.filter_cost = filter_cost  # the filter's worst case per row examined (rule 4)


def query_failed(cmd_cid: str | None, query_id: str | None, exc: errors.JournalError) -> m.Ack:
    """Rule 7: the ack that ends a query a damaged record cut short."""
    return m.Ack(ack_type="completed", cid=cmd_cid, query_id=query_id, status="failure", code=exc.code,
                 reason=f"the query cannot go on: {exc}")


class Queries:
    """The results on their way, per connection in command order (rules 4 to 8)."""

    def __init__(self, outbox: Outbox, budget: FilterBudget | None = None) -> None:
        self._outbox = outbox
        self._budget = budget  # the turn's filter budget, shared (engine/filter_budget.py)
        self._lines: dict[int, deque[Production]] = {}

    def start(self, prod: Production) -> None:
        """A query's result: produced at once up to QUERY_FIRST_BYTES if its connection
        has nothing on its way, the rest frozen and left for :meth:`pump`."""
        line = self._lines.get(prod.conn_id)
        if line is None:
            if self._produce(prod, QUERY_FIRST_BYTES, QUERY_ROWS_PER_PUMP):
                return
            line = self._lines[prod.conn_id] = deque()
        prod.snapshot.freeze()
        line.append(prod)

    def pump(self, rows_max: int = QUERY_ROWS_PER_PUMP, paused: Container[int] = (),
             room: Callable[[int], int] | None = None) -> bool:
        """One turn: the result at the head of each connection not in ``paused`` moves
        by up to ``rows_max`` rows and the bytes ``room(conn_id)`` gives (at least one
        row). True while one of them has more for the next turn."""
        more = False
        for conn_id, line in list(self._lines.items()):
            if conn_id in paused:
                continue
            cap = QUERY_BYTES_PER_PUMP if room is None else min(QUERY_BYTES_PER_PUMP, room(conn_id))
            if self._produce(line[0], cap, rows_max):
                line.popleft()
                if not line:
                    del self._lines[conn_id]
                    continue
            more = True
        return more

    def _produce(self, prod: Production, cap: int, rows_max: int) -> bool:
        """Up to ``rows_max`` rows and about ``cap`` bytes of ``prod`` (at least one row);
        True once it is finished (``finish`` called)."""
        limit = rows_max
        cost = prod.filter_cost
        budget = self._budget
        if cost and budget is not None:  # rule 4: as a filtered replay (one row at least, paid or not)
            limit = max(1, min(rows_max, budget.left // cost))
            budget.take(limit * cost)
        send = self._outbox.send
        conn_id = prod.conn_id
        if prod.begin is not None:
            send(conn_id, prod.begin)
            prod.begin = None
        count = sent = 0
        try:
            for msg in prod.rows:
                count += 1
                if msg is not None:
                    send(conn_id, msg)
                    sent += len(msg.data) + len(msg.topic) + QUERY_MESSAGE_OVERHEAD
                if count >= limit or sent >= cap:
                    return False
        except errors.JournalError as exc:  # rule 7
            log.error("query of connection %s ended: %s", conn_id, exc)
            prod.finish(exc)
            return True
        prod.finish(None)
        return True

    def forget(self, conn_id: int) -> None:
        """The connection is gone: its results are dropped, unfinished."""
        self._lines.pop(conn_id, None)

    @property
    def pending(self) -> bool:
        return bool(self._lines)

    def querying(self, conn_id: int) -> bool:
        """Whether a result of ``conn_id`` is on its way."""
        return conn_id in self._lines

    def connections(self) -> Iterable[int]:
        return self._lines.keys()

    def floor(self) -> int | None:
        """Rule 8: the lowest journal position a result on its way still has to read."""
        return min((p.snapshot.floor for line in self._lines.values() for p in line if p.snapshot.floor is not None),
                   default=None)

    def statistics(self) -> tuple[int, int]:
        """(results on their way, rows their snapshots hold)."""
        return (sum(len(line) for line in self._lines.values()),
                sum(p.snapshot.rows_held for line in self._lines.values() for p in line))
