"""Per-key ordering (docs/queues.md, "Per-key ordering"): a queue with ``OrderingKey``
delivers at most ``MaxInFlightPerKey`` (N) messages of one key at a time, in publish
order, while the other keys flow. A part of :class:`conveyor.engine.queue.Queue`, which
reaches it as ``queue._keys`` (``queue.keys`` for the engine; None without
``OrderingKey``). Rules:

1. **The key is decided at publish time.** The engine evaluates ``OrderingKey`` once,
   at enqueue (engine/queue/bindings.py), as a SOW ``Key``: the scalar result as text.
   A message whose key is NULL (no such field, an empty string, an object) has no key:
   it is ordered with nothing and costs nothing here. A barrier has no key.
2. **A line per key.** Each key keeps its unfinished messages (in the queue: available,
   leased, held for a delayed retry, held here) in publish order. A message is
   deliverable only among the first N of its line; a later one is HELD: it is put in
   the queue's ``Returns`` part with ``not_before = HELD`` (infinity), the same place a
   delayed retry waits, so for every other rule it is an available message that is
   offered to nobody (AVAILABLE for the transition table; in the depth, the recovery
   point, ``available`` statistics; acknowledgeable and expirable by ``sow_delete``;
   a barrier after it waits for it; not in the view). Among deliverable messages the
   queue's own order applies (FIFO, or priority within a barrier epoch).
3. **Only finishing a message moves a line.** A message leaves its line when it leaves
   the queue for good (acknowledged, expired: the transition table's ``on_leave``, live
   and in a replay alike); the message that thereby becomes one of the first N is
   *pending release*. A cancel, a lease expiry, a broken lease or a delayed retry
   leave the message in its line, in its place: nothing later of its key passes it, so
   they never reorder a key. Lines only shrink at the front or where a message
   finished, so a message that was among the first N stays there until it finishes.
4. **Release.** Pending messages are released at the start of the queue's next live
   call that settles (dispatch, acknowledge, add_consumer), at the start of ``expire``
   and in ``end_replay``: back into the delivery order in their place
   (``DeliveryOrder.insert``: the right priority epoch), offered to the filtered
   consumers behind them. A release is no transition and journals nothing. Expiration
   does not look at a held message (as for a delayed retry, it is in no age order); once
   released it is an available message like any other, so ``expire`` (which releases
   first) expires it at once if it is too old; ``next_deadline`` is ``-inf`` while a
   release is pending, so the engine runs ``expire`` before its next dispatch.
5. **Restart.** Keys are decided at enqueue, so replaying the journal rebuilds every
   line. A snapshot does not carry keys: after one is restored, :meth:`restored`
   computes the key of every message it holds again (``key_at``, given by the engine:
   one read of the message each) and holds or releases as rule 2 says.
6. **Replicated queues.** A message another instance owns (ELSEWHERE) is in its key's
   line, unfinished, like any other (:meth:`enter_elsewhere`), but neither offered nor
   held here: its owner decides. Finishing it anywhere removes it here too (rule 3), so
   the next of its key is released on whichever instance owns that one. A message that
   comes here by a transfer waits behind its key as a new one would (:meth:`behind`;
   queue/transfers.py rule 1), and one held behind its key leaves at once when it is
   granted away. Every instance orders the messages of one origin alike (replication
   keeps each source's order), so for a key published on one instance no more than N
   are leased across all instances, always among its first N unfinished ones: an
   instance sees a finish only after it happened, never before.

Complexity: O(1) per enqueue of a keyed message (a dict entry and a deque slot: about
100 bytes per unfinished keyed message), O(N) per finish (its place in the first N of
its line), O(log h) per hold and release (h held messages: the ``Returns`` part's dict
and heap, about 150 bytes each); finishing a held message (a ``sow_delete`` of it) costs
its place in its line.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING, Callable

from conveyor.engine.queue.events import Event
from conveyor.engine.queue.state import QueueStateError
from conveyor.errors import ConfigError

if TYPE_CHECKING:
    from conveyor.config.model import QueueConfig
    from conveyor.engine.explain import MessageFacts
    from conveyor.engine.queue.expiry import MessageExpiry
    from conveyor.engine.queue.leases import LeaseTable
    from conveyor.engine.queue.order import DeliveryOrder
    from conveyor.engine.queue.returns import Returns
    from conveyor.engine.queue.seats import Seats
    from conveyor.engine.queue.state import Transitions

#: ``not_before`` of a message held behind its key (rule 2): never woken by time.
HELD = math.inf


class KeyedOrder:
    """Rules 1-5 over the parts of one queue; ``n``: MaxInFlightPerKey."""

    __slots__ = ("n", "key_at", "_key_of", "_lines", "_pending", "_order", "_leases", "_seats", "_returns",
                 "_stamped")

    def __init__(self, n: int, key_at: Callable[[int], str | None] | None, transitions: Transitions,
                 order: DeliveryOrder, leases: LeaseTable, seats: Seats, returns: Returns,
                 stamped: MessageExpiry[int]) -> None:
        self.n = n
        #: The key of the message at a position, computed again (rule 5; None: no snapshot restore).
        self.key_at = key_at
        self._key_of: dict[int, str] = {}  # unfinished keyed message -> its key
        self._lines: dict[str, deque[int]] = {}  # key -> its unfinished messages, in publish order
        self._pending: list[int] = []  # positions pending release (rule 4)
        self._order = order
        self._leases = leases
        self._seats = seats
        self._returns = returns
        self._stamped = stamped
        transitions.on_leave(self.left)  # rule 3, for messages owned elsewhere too (rule 6)

    @classmethod
    def build(cls, config: QueueConfig, key_at: Callable[[int], str | None] | None, transitions: Transitions,
              order: DeliveryOrder, leases: LeaseTable, seats: Seats, returns: Returns,
              stamped: MessageExpiry[int]) -> KeyedOrder | None:
        """The part of a queue with ``OrderingKey``; None for any other queue."""
        if config.ordering_key is None:
            return None
        for refused, why in ((config.semantics.value == "at-most-once", "an at-most-once queue"),
                             (config.target_queue_depth is not None, "TargetQueueDepth")):
            if refused:
                raise ConfigError(f"queue {config.name!r}: OrderingKey cannot be combined with {why}",
                                  path=f"{config.path}/OrderingKey")
        return cls(config.max_in_flight_per_key, key_at, transitions, order, leases, seats, returns, stamped)

    # --- rules 1-3 -----------------------------------------------------------------------------

    def enter(self, p: int, t: float, order_key: int, barrier: bool, key: str | None) -> bool:
        """A new message (``key``: rule 1): into the delivery order, as ``DeliveryOrder.append``
        (whose answer it returns), or held behind its key (False)."""
        if key is not None and not barrier and self._join(p, key) > self.n:
            self._returns.hold(p, HELD, t, order_key)
            return False
        return self._order.append(p, t, order_key, barrier)

    def enter_elsewhere(self, p: int, key: str | None) -> None:
        """Rule 6: a message another instance owns joins its key's line (``key``: rule 1)."""
        if key is not None:
            self._join(p, key)

    def _join(self, p: int, key: str) -> int:
        """``p`` at the end of its key's line (rule 2); the line's length now."""
        self._key_of[p] = key
        line = self._lines.get(key)
        if line is None:
            self._lines[key] = deque((p,))
            return 1
        line.append(p)
        return len(line)

    def behind(self, p: int) -> bool:
        """Rule 6: whether ``p`` is beyond the first N of its key's line (a message
        transferred here then waits as a new one would)."""
        key = self._key_of.get(p)
        if key is None:
            return False
        line = self._lines[key]
        return len(line) > self.n and p not in islice(line, self.n)

    def left(self, positions: list[int]) -> None:
        """``positions`` left the queue for good (rule 3): the next of their keys may be
        released."""
        key_of, lines, n = self._key_of, self._lines, self.n
        for p in positions:
            key = key_of.pop(p, None)
            if key is None:
                continue
            line = lines[key]
            if len(line) > n:
                i = line.index(p)
                if i < n:
                    self._pending.append(line[n])
                del line[i]
            else:
                line.remove(p)
                if not line:
                    del lines[key]

    def held(self, p: int) -> bool:
        """Whether ``p`` is held behind its key (rule 2)."""
        return self._returns.not_before(p) == HELD

    # --- rule 4 --------------------------------------------------------------------------------

    @property
    def has_events(self) -> bool:
        """Whether a release is pending: ``Queue.next_deadline`` is then ``-inf`` (rule 4)."""
        returns = self._returns
        return any(returns.not_before(p) == HELD for p in self._pending)

    def release(self, now: float) -> None:
        """Rule 4: each pending message back into the delivery order, in its place."""
        pending, returns, order = self._pending, self._returns, self._order
        self._pending = []
        for p in pending:
            if returns.not_before(p) != HELD:
                continue  # it left, or a replayed delivery put it back already
            t, order_key = returns.take_key(p)
            if order.insert(p, t, order_key) or order_key == p:
                self._seats.came_back(order_key, order.store.__contains__, now)
            if self._stamped:
                self._stamped.again(p)  # its own expiry may have passed while it was held

    def take_events(self, now: float) -> list[Event]:
        """:meth:`release`, for the calls that collect events: a release has none."""
        self.release(now)
        return []

    # --- rule 5 --------------------------------------------------------------------------------

    def restored(self) -> None:
        """A snapshot was loaded: rebuild every line from the messages it holds."""
        key_at = self.key_at
        if key_at is None:
            raise QueueStateError("a queue with an OrderingKey restores a snapshot only with its key_at")
        returns, order, replica = self._returns, self._order, self._returns.replica
        positions = sorted([p for p, _ in order.store.items() if p not in order.barriers]
                           + [p for p, _ in returns.items()] + [p for p, _ in replica.items()])
        for p in positions:
            key = key_at(p)
            if key is None:
                continue
            self._key_of[p] = key
            line = self._lines.setdefault(key, deque())
            line.append(p)
            if p in replica:
                continue  # its owner holds or offers it (rule 6)
            if len(line) > self.n:
                if p not in returns:
                    returns.hold_back(p, HELD)
            elif returns.not_before(p) == HELD:
                self._pending.append(p)

    # --- views ---------------------------------------------------------------------------------

    def line_of(self, p: int) -> tuple[str, int, int] | None:
        """(key, unfinished messages of the key before ``p``, how many of them are leased)."""
        key = self._key_of.get(p)
        if key is None:
            return None
        ahead = _before(self._lines[key], p)
        leased = self._leases.leased
        return key, len(ahead), sum(1 for q in ahead if q in leased)

    def held_count(self) -> int:
        """Messages held behind their key here now (O(keys + held); not those owned elsewhere)."""
        n, held = self.n, self.held
        return sum(sum(1 for p in islice(line, n, None) if held(p)) for line in self._lines.values() if len(line) > n)

    def check(self) -> None:
        """Rule 2's invariant (AssertionError): no key has more than N leased, and a key's
        leased messages are among its first N unfinished ones; held ones are after them."""
        leased, replica = self._leases.leased, self._returns.replica
        for key, line in self._lines.items():
            for i, p in enumerate(line):
                assert i < self.n or p not in leased, f"key {key!r}: {p} leased beyond the first {self.n}"
                assert i < self.n or self.held(p) or p in replica, \
                    f"key {key!r}: {p} beyond the first {self.n} but not held"


def _before(line: deque[int], p: int) -> list[int]:
    """The positions of ``line`` before ``p``."""
    out = []
    for q in line:
        if q == p:
            break
        out.append(q)
    return out


def explained(keys: KeyedOrder | None, facts: MessageFacts) -> MessageFacts:
    """``Queue.explain``'s facts with the message's line (rule 2), when the queue has keys."""
    if keys is None:
        return facts
    line = keys.line_of(facts.position)
    held = keys.held(facts.position)
    return replace(facts, ordering=line, ordering_held=held, not_before=None if held else facts.not_before)
