"""The rules for replicated queues that two instances break together, checked at each
handshake in both directions (docs/replication.md, "Replicated queues")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.config.model import QueueKind, RecordedTopic
from conveyor.engine.replication.route import matches_any
from conveyor.protocol import replication as p

if TYPE_CHECKING:
    from conveyor.engine.replication.source import OutLink


def check_pair(local: p.Profile, peer: p.Profile, *, outgoing: OutLink | None = None, incoming: bool = False,
               local_links: list[OutLink] | None = None) -> list[str]:
    """The rules for replicated queues that ``local`` and ``peer`` break together, as
    sentences naming both instances and the rule (docs/replication.md, "Replicated
    queues"). ``outgoing``: local replicates to peer through this link; ``incoming``:
    peer replicates to local."""
    problems: list[str] = []
    who = f"{local.instance!r} and {peer.instance!r}"
    peer_queues = {q.name: q for q in peer.queues}
    local_queues = {q.name: q for q in local.queues}
    if outgoing is not None:
        replicated = matches_any(tuple(t.name for t in outgoing.dest.topics))
        back = [d for d in peer.destinations if d.name == local.instance]
        for q in local.queues:
            if q.kind == QueueKind.LOCAL.value or not replicated(q.name):
                continue
            other = peer_queues.get(q.name)
            if other is None:
                problems.append(f"{who}: {q.name!r} is a queue on {local.instance!r} and is replicated, so it must "
                                f"be a queue on {peer.instance!r} too")
                continue
            if (other.kind, other.underlying, other.filter, other.initial_owner) != (
                q.kind, q.underlying, q.filter, q.initial_owner
            ):
                problems.append(
                    f"{who}: queue {q.name!r} must have the same definition on both (kind, UnderlyingTopic, "
                    f"Filter, InitialOwner): {local.instance!r} has {_shape(q)}, {peer.instance!r} has {_shape(other)}"
                )
            if not _covers(outgoing.dest.topics, q.underlying):
                problems.append(f"{who}: the underlying topic {q.underlying!r} of replicated queue {q.name!r} must "
                                f"be replicated too (a Topic of destination {outgoing.name!r})")
            if not any(matches_any(tuple(d.topics))(q.name) for d in back):
                problems.append(f"{who}: queue {q.name!r} is replicated from {local.instance!r} to "
                                f"{peer.instance!r} but not back: replicated queues need replication both ways "
                                f"(a Destination named {local.instance!r} on {peer.instance!r})")
    if incoming:
        for q in peer.queues:
            if q.kind == QueueKind.LOCAL.value:
                continue
            mine = local_queues.get(q.name)
            sent = [d for d in peer.destinations if d.name == local.instance]
            if mine is None or not any(matches_any(tuple(d.topics))(q.name) for d in sent):
                continue  # the peer does not replicate this queue to us
            for link in local_links or ():
                if link.name == peer.instance or not link.topic_matches(q.name):
                    continue
                if link.pass_through is None or not link.pass_through(peer.group):
                    problems.append(
                        f"{who}: queue {q.name!r} arrives on {local.instance!r} from {peer.instance!r} (group "
                        f"{peer.group!r}) and is replicated on to {link.name!r}, so destination {link.name!r} needs a "
                        f"PassThrough matching {peer.group!r} (acknowledgements and transfers must reach every copy)"
                    )
    return problems


def _shape(q: p.QueueProfile) -> str:
    return f"({q.kind}, {q.underlying!r}, {q.filter!r}, {q.initial_owner!r})"


def _covers(topics: tuple[RecordedTopic, ...], underlying: str) -> bool:
    names = [t.name for t in topics]
    if underlying in names or any(n in (".*", ".+", "^.*$") for n in names):
        return True
    return matches_any(tuple(names))(underlying)
