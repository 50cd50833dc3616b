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
"""

from __future__ import annotations

from typing import Iterator, NamedTuple


class Away(NamedTuple):
    owner: str
    published_at: float
    key: int
    arrived: float


class Elsewhere:
    __slots__ = ("_away", "_leaving")

    def __init__(self) -> None:
        self._away: dict[int, Away] = {}
        self._leaving: dict[int, str] = {}  # leased here, owned elsewhere now (rule 3)

    def __contains__(self, position: int) -> bool:
        return position in self._away

    def __len__(self) -> int:
        return len(self._away)

    def __bool__(self) -> bool:
        return bool(self._away)

    def add(self, position: int, owner: str, published_at: float, key: int, arrived: float) -> None:
        self._away[position] = Away(owner, published_at, key, arrived)

    def take(self, position: int) -> Away:
        return self._away.pop(position)

    def get(self, position: int) -> Away | None:
        return self._away.get(position)

    def set_owner(self, position: int, owner: str) -> None:
        self._away[position] = self._away[position]._replace(owner=owner)

    def first(self) -> int | None:
        """The lowest position held here (O(n): barriers and recovery points only)."""
        return min(self._away) if self._away else None

    def items(self) -> Iterator[tuple[int, Away]]:
        """In position order."""
        for p in sorted(self._away):
            yield p, self._away[p]

    def in_arrival_order(self) -> Iterator[tuple[int, Away]]:
        """Roughly oldest first (the order they came here; no sort, no copy): for the
        engine's transfer requests, which stop early. The caller must not change this
        part while it iterates."""
        return iter(self._away.items())

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
