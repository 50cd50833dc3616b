"""Which instances this instance's records reach now, through any chain of links.

Proxied transfer (ownership.py rule 6) acts only for an owner this instance cannot
reach, so "reachable" must be true exactly when a request made here gets to the owner:
directly, or through peers whose ``PassThrough`` passes this instance's records on, as
many hops as the topology has. A peer's profile says which destinations it has, not
whether their links are up; so every instance announces the links it streams on now,
and every instance passes on what it hears (a link-state table, flooded). Rules:

1. **An entry** is one instance's word on its own outgoing links that stream now: each
   destination's instance and its ``PassThrough`` pattern (None: passes nothing on).
   It carries ``(epoch, seq)``: the time its instance started, by its own clock, and a
   count of its changes since. A higher pair replaces a lower one; so a restarted
   instance's entries replace those of its previous life.
2. **Flooding.** Every linked peer, either way, gets the whole table (a few entries per
   instance, a few destinations each) whenever it changed since that connection last
   got it: on a :class:`~conveyor.protocol.replication.Batch` with no records to a
   destination, on an :class:`~conveyor.protocol.replication.Acked` to a source (fields
   older peers ignore). An entry that is not newer changes nothing, so nothing echoes.
3. **Reachable.** ``X`` is reachable when a link to or from ``X`` is up (a peer that
   streams to us is alive), or when a chain of streaming links runs from this instance
   to ``X`` whose every hop after the first passes this instance's group on (the
   first hop is one of our own links, which carry our records whatever their pattern).
   Our own links are taken as they are now, not as last announced.
4. **Peers that announce nothing** (a version before this table) are taken at their
   profile's word, as before it: each destination of theirs whose ``PassThrough``
   matches our group is one more hop, assumed up, except to an instance we have a
   ``Destination`` for: that one is judged by our own link (in a mesh every profile
   names the owner, and whether their links to it are up is what we do not know).
5. **Stale entries are harmless.** An instance's entry is followed only through a link
   that is up into it, as its predecessor reports it; an instance that went down is
   reported so by whoever linked to it, and its own last entry is never reached. The
   table holds at most :data:`ENTRIES_MAX` instances.
6. The answer is computed once per change: a breadth-first walk over the table, cached
   until an entry, an own link or an incoming link changes.
"""

from __future__ import annotations

from typing import Callable, Iterable

from conveyor.protocol import replication as p

ENTRIES_MAX = 1_000  # instances remembered; beyond that a new one is not learnt


class ReachTable:
    """The flooded link-state table of one instance (rules 1, 2, 5)."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.entries: dict[str, p.Reach] = {}
        self.version = 0  # bumped by every change of the table
        self._own_links: tuple[tuple[str, str | None], ...] | None = None
        self._epoch: float | None = None
        self._seq = 0
        self._sent: dict[int, int] = {}  # connection id -> the version it last got

    def own(self, links: Iterable[tuple[str, str | None]], now: float) -> None:
        """This instance's streaming destinations now (rule 1)."""
        current = tuple(sorted(links, key=lambda link: link[0]))
        if current == self._own_links:
            return
        if self._epoch is None:
            self._epoch = now
        self._own_links = current
        self._seq += 1
        self.entries[self.instance] = p.Reach(instance=self.instance, epoch=self._epoch, seq=self._seq,
                                              links=[p.ReachLink(name, through) for name, through in current])
        self.version += 1

    def learn(self, entries: Iterable[p.Reach]) -> None:
        """Entries a peer sent (rule 1): keep each that is newer than ours."""
        for entry in entries:
            if entry.instance == self.instance:
                continue  # only this instance speaks for itself
            known = self.entries.get(entry.instance)
            if known is None:
                if len(self.entries) >= ENTRIES_MAX:
                    continue
            elif (entry.epoch, entry.seq) <= (known.epoch, known.seq):
                continue
            self.entries[entry.instance] = entry
            self.version += 1

    def news(self, conn_ids: Iterable[int]) -> list[tuple[int, list[p.Reach]]]:
        """The table for each live connection that has not had this version of it (rule
        2); forgets connections no longer live."""
        live = set(conn_ids)
        sent = self._sent
        for gone in [c for c in sent if c not in live]:
            del sent[gone]
        if not self.entries:
            return []
        out = []
        table: list[p.Reach] | None = None
        for conn_id in live:
            if sent.get(conn_id) != self.version:
                sent[conn_id] = self.version
                if table is None:
                    table = list(self.entries.values())
                out.append((conn_id, table))
        return out


def reached(me: str, first: Iterable[str], alive: Iterable[str], table: dict[str, p.Reach],
            profiles: dict[str, p.Profile], direct: frozenset[str],
            passes: Callable[[str | None], bool]) -> frozenset[str]:
    """Rule 3: the instances this one's records reach. ``first``: our streaming
    destinations; ``alive``: peers linked to us either way; ``table``: the flooded
    entries; ``profiles``: linked peers' profiles (rule 4, for a peer with no entry);
    ``direct``: the instances we have a Destination for (rule 4);
    ``passes(pattern)``: whether a PassThrough pattern passes our group on."""
    seen = set(alive)
    frontier = [name for name in first if name != me]
    reach = set(frontier)
    while frontier:
        hop = frontier.pop()
        entry = table.get(hop)
        if entry is not None:
            nexts: Iterable[tuple[str, str | None]] = ((link.instance, link.pass_through) for link in entry.links)
        elif hop in profiles:
            nexts = ((d.name, d.pass_through) for d in profiles[hop].destinations if d.name not in direct)
        else:
            continue
        for name, pattern in nexts:
            if name != me and name not in reach and passes(pattern):
                reach.add(name)
                frontier.append(name)
    return frozenset(seen | reach)
