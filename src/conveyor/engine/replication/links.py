"""This instance's replication links, both ways: :class:`PeerLinks`, the tables of the
outgoing links (:class:`~conveyor.engine.replication.source.OutLink`, by destination)
and the incoming ones (:class:`~conveyor.engine.replication.sink.InLink`, by
connection), which the replicated queues ask whether a peer is reachable (proxied
transfer) without holding the replication part that holds them. Each link's state is
kept beside the side that changes it (``source.py``, ``sink.py``)."""

from __future__ import annotations

from conveyor.config.model import Config
from conveyor.engine.replication.sink import InLink
from conveyor.engine.replication.source import LinkState, OutLink


class PeerLinks:
    """This instance's replication links, both ways: outgoing by destination name,
    incoming by connection. A part of its own so that the replicated queues can ask
    whether a peer is reachable (proxied transfer) without holding the replication
    part that holds them."""

    def __init__(self, config: Config) -> None:
        views = frozenset(v.name for v in config.views)
        repl = config.replication
        self.out: dict[str, OutLink] = {d.name: OutLink(d, views) for d in (repl.destinations if repl else ())}
        self.incoming: dict[int, InLink] = {}

    def reachable(self, instance: str) -> bool:
        """Whether a link to or from ``instance`` is up (proxied transfer acts only for an
        owner that is not)."""
        if any(link.state is LinkState.STREAMING and link.peer is not None and link.peer.instance == instance
               for link in self.out.values()):
            return True
        return any(link.profile.instance == instance for link in self.incoming.values())
