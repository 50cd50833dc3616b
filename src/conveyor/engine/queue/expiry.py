"""Per-message expiration in a queue: messages that carry their own expiry time.

A SOW topic with ``Expiration`` stamps each message with the absolute time it expires
before the message is journaled (docs/sow-and-views.md); a queue over that topic
expires the message at that time ("the message will have the same expiration in the
queue", spec 000 "Topic in the State of the World as an Underlying Topic for a
Queue"). A part of :class:`conveyor.engine.queue.Queue`, beside the queue-wide
``Expiration`` (which the FIFO order makes a check of the head). Rules:

1. Only stamped messages cost anything: a heap of ``(expires_at, position)`` and a
   dict position -> expires_at.
2. A message is due at ``now >= expires_at``. The queue expires a due message that is
   available at once; a leased one when its lease ends (``time_limit``), as for the
   queue-wide Expiration; one owned by another instance (replicated queue, ELSEWHERE)
   is expired by its owner, and here only if it is transferred here first.
3. Entries of messages that are done (acknowledged, delivered, expired by another
   rule) are dropped when they reach the top of the heap, and swept once they
   outnumber the messages still in the queue, so memory stays O(queue).
4. A message's own expiry overrides the queue's ``Expiration``, earlier or later (the
   reference's queue table). A queue with ``Expiration`` checks it at the head of its
   age order while no message carries its own; the first one that does turns the
   queue-wide rule into an entry here for every message in the queue, and for each one
   that enters later (``Queue._note_expiry``), so each message has exactly one expiry.
5. A snapshot keeps the entries (:meth:`export`): a restart from it expires the same
   messages at the same times as a replay of the journal would.

Keyed by position in a queue; a SOW topic keys the same table by SowKey
(engine/sow/topic.py), hence the type parameter.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Callable, Generic, Hashable, Iterable, Iterator, TypeVar

SWEEP_SLACK_MIN = 64  # stale entries tolerated before a sweep, whatever the queue's size

K = TypeVar("K", bound=Hashable)  # a queue's position, or a SOW topic's key


def earliest(a: float | None, b: float | None) -> float | None:
    """The earlier of two deadlines, None being none: how every part's ``next_deadline``
    folds its own into one (asked after every turn of the loop, so no list is built)."""
    if a is None:
        return b
    return a if b is None or a <= b else b


class MessageExpiry(Generic[K]):
    __slots__ = ("_heap", "_at", "_every")

    def __init__(self) -> None:
        self._heap: list[tuple[float, K]] = []
        self._at: dict[K, float] = {}
        self._every: float | None = None  # the queue's Expiration, once it is kept here (rule 4)

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, position: K) -> bool:
        return position in self._at

    def export(self, tracked: Callable[[K], bool]) -> tuple[tuple[K, float], ...]:
        """(position, expiry) of the messages still in the queue (rule 5); a due one that
        waits for its lease to end (:meth:`hold`) is due at once after a restart."""
        return tuple(sorted((p, t) for p, t in self._at.items() if tracked(p)))

    def note(self, position: K, expires_at: float) -> None:
        """Message ``position`` expires at ``expires_at`` (rule 1)."""
        self._at[position] = expires_at
        heappush(self._heap, (expires_at, position))

    def enter(self, position: K, published_at: float, expires_at: float) -> None:
        """A message entering the queue (rule 4): its own expiry (0: none), else the
        queue's Expiration once that is kept here."""
        if expires_at:
            self.note(position, expires_at)
        elif self._every is not None:
            self.note(position, published_at + self._every)

    def enter_all(self, positions: list[K], published_at: list[float]) -> None:
        """:meth:`enter` of messages without an expiry of their own."""
        every = self._every
        if every is not None:
            for p, t in zip(positions, published_at):
                self.note(p, t + every)

    def keep_expiration(self, expiration: float, messages: Iterable[tuple[K, float]]) -> None:
        """Rule 4: the queue's ``expiration`` is kept here from now on, for ``messages``
        (position, publish time: those in the queue) and every later one."""
        self._every = expiration
        for p, t in messages:
            if p not in self._at:
                self.note(p, t + expiration)

    def hold(self, position: K) -> None:
        """``position`` is due but leased: it expires when its lease ends (rule 2)."""
        self._at[position] = -float("inf")

    def again(self, position: K) -> None:
        """``position`` came back to the available messages (transferred here): its expiry,
        if it has one, is looked at again by :meth:`pop_due` (a held one at once)."""
        t = self._at.get(position)
        if t is not None:
            heappush(self._heap, (t, position))

    def expiry_of(self, position: K) -> float | None:
        """When ``position`` expires by its own expiry (None: it has none; -inf: due, held)."""
        return self._at.get(position)

    def due(self, position: K, now: float) -> bool:
        """Whether ``position`` carries an expiry that has passed (rule 2)."""
        t = self._at.get(position)
        return t is not None and now >= t

    def pop_due(self, now: float) -> Iterator[K]:
        """Positions whose expiry is at or before ``now``, in deadline order; each is
        forgotten here (the queue decides what to do with it)."""
        heap, at = self._heap, self._at
        while heap and heap[0][0] <= now:
            t, p = heappop(heap)
            if at.get(p) == t:
                del at[p]
                yield p

    def next_deadline(self) -> float | None:
        heap, at = self._heap, self._at
        while heap and at.get(heap[0][1]) != heap[0][0]:
            heappop(heap)  # a stale entry (rule 3)
        return heap[0][0] if heap else None

    def forget(self, position: K) -> None:
        self._at.pop(position, None)

    def sweep(self, tracked: Callable[[K], bool], live: int) -> None:
        """Rule 3: drop entries of messages no longer in the queue once they outnumber
        the ``live`` ones (``tracked(p)``: still in the queue)."""
        if len(self._at) <= 2 * live + SWEEP_SLACK_MIN:
            return
        self._at = {p: t for p, t in self._at.items() if tracked(p)}
        self._heap = [(t, p) for p, t in self._at.items()]
        heapify(self._heap)
