"""A per-topic routing cache with a bound on the number of topics it remembers.

The engine caches, per topic name, answers it would otherwise recompute for every
publish: is the topic recorded, which queues take from it, which subscriptions listen.
Topic names come from clients, so a cache that remembers every name grows without
bound (100,000 distinct names cost about 110 MB across the engine's caches). A
:class:`RouteCache` forgets its oldest entry once it holds ``entries_max`` topics: a
forgotten topic is only recomputed (a regex match per pattern), never answered wrong.
"""

from __future__ import annotations

from typing import Generic, TypeVar

V = TypeVar("V")

#: Topics each routing cache remembers. Real deployments publish to a few hundred
#: topics; a client that publishes to a new name each time gets the recompute cost
#: (microseconds) instead of the memory.
TOPIC_ROUTES_MAX = 8192


class RouteCache(dict[str, V], Generic[V]):
    """``dict`` lookups (``get``) at full speed; ``put`` evicts the oldest entry first."""

    __slots__ = ("entries_max",)

    def __init__(self, entries_max: int = TOPIC_ROUTES_MAX) -> None:
        super().__init__()
        self.entries_max = entries_max

    def put(self, topic: str, value: V) -> V:
        if len(self) >= self.entries_max:
            del self[next(iter(self))]  # dicts keep insertion order: the oldest goes
        self[topic] = value
        return value
