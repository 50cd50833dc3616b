"""This instance's replication links, both ways: :class:`PeerLinks`, the tables of the
outgoing links (:class:`~conveyor.engine.replication.source.OutLink`, by destination)
and the incoming ones (:class:`~conveyor.engine.replication.sink.InLink`, by
connection), which the replicated queues ask whether a peer is reachable (proxied
transfer) without holding the replication part that holds them, and the wait for the
peers to catch this instance up after its start (``catch_up.py``). Each link's state is
kept beside the side that changes it (``source.py``, ``sink.py``); which instances are
reachable through chains of links is the flooded table of ``reach.py``."""

from __future__ import annotations

from typing import Callable, Iterator

from conveyor import errors
from conveyor.config.model import Config, topic_matcher
from conveyor.engine.outbox import Outbox
from conveyor.engine.replication.catch_up import CatchUp
from conveyor.engine.replication.reach import ReachTable, reached
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
        self.instance = config.name
        self.reach = ReachTable(config.name)
        self._direct_names = frozenset(self.out)
        self._reached_key: tuple[int, tuple[str, ...], tuple[str, ...]] | None = None
        self._reached: frozenset[str] = frozenset()

    def reachable(self, instance: str) -> bool:
        """Whether this instance's records reach ``instance`` now (proxied transfer acts
        only for an owner that is not): a link to or from it is up, or a chain of
        streaming links passing this instance's group on leads there (reach.py rule 3)."""
        key = (self.reach.version, tuple(peer.instance for _, peer in self._streaming()),
               tuple(inlink.profile.instance for inlink in self.incoming.values()))
        if key != self._reached_key:
            self._reached_key = key
            profiles = {profile.instance: profile for profile in self._linked()}
            self._reached = reached(self.instance, key[1], key[2], self.reach.entries, profiles,
                                    self._direct_names, self._passes)
        return instance in self._reached

    def learn(self, entries: list[p.Reach]) -> None:
        """A peer's link-state table arrived (on a Batch or an Acked: reach.py rule 2)."""
        if entries:
            self.reach.learn(entries)

    def announce(self, outbox: Outbox, now: float) -> None:
        """Send the link-state table to every linked peer that has not had it since it
        changed (reach.py rule 2): on an empty Batch to a destination, on an Acked to
        a source, acknowledging nothing new: through 0)."""
        self.reach.own(((peer.instance, link.dest.pass_through) for link, peer in self._streaming()), now)
        outs = {link.conn_id: link for link, _ in self._streaming() if link.conn_id is not None}
        for conn_id, table in self.reach.news([*outs, *self.incoming]):
            out = outs.get(conn_id)
            if out is not None:
                outbox.send(conn_id, p.Batch(through=out.sent, reach=table))
            else:
                outbox.send(conn_id, p.Acked(through=0, reach=table))

    def _streaming(self) -> Iterator[tuple[OutLink, p.Profile]]:
        """The outgoing links that stream now, with their destination's profile."""
        for link in self.out.values():
            if link.state is LinkState.STREAMING and link.peer is not None:
                yield link, link.peer

    def _linked(self) -> Iterator[p.Profile]:
        """The profiles of the peers linked now, either way."""
        for _, peer in self._streaming():
            yield peer
        for inlink in self.incoming.values():
            yield inlink.profile

    def _passes(self, pattern: str | None) -> bool:
        """Whether a peer's PassThrough pattern passes this instance's records on."""
        return pattern is not None and self._matcher(pattern)(self.group)

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
