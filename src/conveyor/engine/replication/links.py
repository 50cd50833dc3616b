"""This instance's replication links, both ways: :class:`PeerLinks`, the tables of the
outgoing links (:class:`~conveyor.engine.replication.source.OutLink`, by destination)
and the incoming ones (:class:`~conveyor.engine.replication.sink.InLink`, by
connection), which the replicated queues ask whether a peer is reachable (proxied
transfer) without holding the replication part that holds them, and the wait for the
peers to catch this instance up after its start (``catch_up.py``). Each link's state is
kept beside the side that changes it (``source.py``, ``sink.py``)."""

from __future__ import annotations

from typing import Callable, Iterator

from conveyor import errors
from conveyor.config.model import Config, topic_matcher
from conveyor.engine.replication.catch_up import CatchUp
from conveyor.engine.replication.sink import InLink
from conveyor.engine.replication.source import LinkState, OutLink
from conveyor.protocol import replication as p

PASS_THROUGH_PATTERNS_MAX = 1_000  # peers' PassThrough patterns whose matcher is kept


class PeerLinks:
    """This instance's replication links, both ways: outgoing by destination name,
    incoming by connection. A part of its own so that the replicated queues can ask
    whether a peer is reachable (proxied transfer) without holding the replication
    part that holds them."""

    def __init__(self, config: Config, catch_up: CatchUp | None = None) -> None:
        """``catch_up``: whether this instance still waits for its peers to catch it up
        after its start (catch_up.py; the sink reports each peer's stream to it)."""
        self.catch_up = catch_up if catch_up is not None else CatchUp(config)
        views = frozenset(v.name for v in config.views)
        repl = config.replication
        self.out: dict[str, OutLink] = {d.name: OutLink(d, views) for d in (repl.destinations if repl else ())}
        self.incoming: dict[int, InLink] = {}
        self.group = config.group or config.name  # as the handshake shows it (replication.py)
        self._matchers: dict[str, Callable[[str], bool]] = {}

    def reachable(self, instance: str) -> bool:
        """Whether this instance's records reach ``instance`` now (proxied transfer acts
        only for an owner that is not):

        - a link to or from it is up; or
        - this instance has no ``Destination`` of its own for it, and a peer linked now
          has one in its profile (exchanged at the handshake) whose ``PassThrough``
          matches this instance's group: a request made here travels through that peer.

        An instance this one has a ``Destination`` for is judged by that link alone: in a
        mesh with PassThrough every peer's profile names the owner, and their links to an
        owner that is down are down too. Whether the peer's own link to ``instance`` is
        up is not known here (the protocol does not carry it)."""
        if self._direct(instance):
            return True
        if instance in self.out:
            return False
        return any(self._passes_to(profile, instance) for profile in self._linked())

    def _direct(self, instance: str) -> bool:
        if any(link.state is LinkState.STREAMING and link.peer is not None and link.peer.instance == instance
               for link in self.out.values()):
            return True
        return any(link.profile.instance == instance for link in self.incoming.values())

    def _linked(self) -> Iterator[p.Profile]:
        """The profiles of the peers linked now, either way."""
        for link in self.out.values():
            if link.state is LinkState.STREAMING and link.peer is not None:
                yield link.peer
        for inlink in self.incoming.values():
            yield inlink.profile

    def _passes_to(self, peer: p.Profile, instance: str) -> bool:
        """Whether ``peer`` replicates to ``instance`` and passes this instance's records on."""
        if peer.instance == instance:
            return False
        return any(d.name == instance and d.pass_through and self._matcher(d.pass_through)(self.group)
                   for d in peer.destinations)

    def _matcher(self, pattern: str) -> Callable[[str], bool]:
        matcher = self._matchers.get(pattern)
        if matcher is None:
            try:
                matcher = topic_matcher(pattern)
            except errors.BadTopic:  # a peer's pattern this instance cannot read: it passes nothing
                matcher = _never
            if len(self._matchers) >= PASS_THROUGH_PATTERNS_MAX:
                self._matchers.clear()
            self._matchers[pattern] = matcher
        return matcher


def _never(name: str) -> bool:
    return False
