"""Messages of a replicated queue that another instance owns (docs/replication.md,
"Replicated queues").

A part of :class:`conveyor.engine.queue.Queue`, which moves messages through the
transition table (ELSEWHERE) and tells this part what happened. Rules:

1. A message here is recorded and in the view, never delivered: only its owner
   delivers it. It keeps its publish time, its order key (a priority queue needs it when
   the message comes back) and when it arrived here (the engine's transfer heuristic
   asks for messages that have waited longer than acknowledgements usually take).
2. Its owner may change while it stays here (a transfer between two other instances).
3. A message leased here whose ownership moves away (two instances claimed it during a
   disaster recovery) keeps its lease; it goes away when the lease ends
   (:meth:`leaving`), never back to the available messages.
4. Messages not yet asked for are kept apart, in the order they came (:meth:`unasked`):
   the engine's requests look only at those, and at its own list of requests due again,
   instead of walking past every message in flight on every look.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, NamedTuple


class Away(NamedTuple):
    owner: str
    published_at: float
    key: int
    arrived: float


class Elsewhere:
    __slots__ = ("_away", "_unasked", "_leaving")

    def __init__(self) -> None:
        self._away: dict[int, Away] = {}
        # Rule 4: the same entries, less those asked for. An OrderedDict, as entries leave
        # from the front: a dict's iterator would step over every slot they left behind.
        self._unasked: OrderedDict[int, Away] = OrderedDict()
        self._leaving: dict[int, str] = {}  # leased here, owned elsewhere now (rule 3)

    def __contains__(self, position: int) -> bool:
        return position in self._away

    def __len__(self) -> int:
        return len(self._away)

    def __bool__(self) -> bool:
        return bool(self._away)

    def add(self, position: int, owner: str, published_at: float, key: int, arrived: float) -> None:
        self._away[position] = self._unasked[position] = Away(owner, published_at, key, arrived)

    def take(self, position: int) -> Away:
        self._unasked.pop(position, None)
        return self._away.pop(position)

    def get(self, position: int) -> Away | None:
        return self._away.get(position)

    def set_owner(self, position: int, owner: str) -> None:
        away = self._away[position] = self._away[position]._replace(owner=owner)
        if position in self._unasked:
            self._unasked[position] = away

    def asked(self, position: int) -> None:
        """Rule 4: a request went out for it."""
        self._unasked.pop(position, None)

    def first(self) -> int | None:
        """The lowest position held here (O(n): barriers and recovery points only)."""
        return min(self._away) if self._away else None

    def items(self) -> Iterator[tuple[int, Away]]:
        """In position order."""
        for p in sorted(self._away):
            yield p, self._away[p]

    def in_arrival_order(self) -> Iterator[tuple[int, Away]]:
        """Roughly oldest first (the order they came here; no sort, no copy): for the
        engine's proxied claims, which stop early. The caller must not change this
        part while it iterates."""
        return iter(self._away.items())

    def unasked(self) -> Iterator[tuple[int, Away]]:
        """Rule 4: those not asked for, in the order they came (the order of ``arrived``
        while the clock runs forward). The caller must not change this part while it
        iterates: it marks what it asked for (:meth:`asked`) afterwards."""
        return iter(self._unasked.items())

    # --- rule 3 ------------------------------------------------------------------------------

    def owned_away_while_leased(self, position: int, owner: str) -> None:
        self._leaving[position] = owner

    def leaving(self, position: int) -> str | None:
        """The new owner of a message whose lease here just ended, if it moved away."""
        return self._leaving.pop(position, None)

    def leaving_owners(self) -> dict[int, str]:
        """Rule 3's messages: position -> the owner they go to when their lease ends."""
        return dict(self._leaving)

    def forget(self, position: int) -> None:
        self._leaving.pop(position, None)
