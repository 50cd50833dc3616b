"""The rules for replicated queues that two instances break together, checked at each
handshake by both ends, the source and the destination alike (docs/replication.md,
"Validation" and "Replicated queues").

Both ends judge the same link, from its source to its destination, with the same
rules, from the two profiles: each end refuses what the other would, so a link is
never refused by one end and streamed by the other's silence (a destination that holds
a replicated queue its source lacks once took the source's messages into a queue they
would never leave)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.config.model import Config, QueueConfig, QueueKind, topic_matcher
from conveyor.engine.replication.route import matches_any
from conveyor.protocol import replication as p

if TYPE_CHECKING:
    from conveyor.engine.replication.source import OutLink

_LOCAL = QueueKind.LOCAL.value
_GROUP_LOCAL = QueueKind.GROUP_LOCAL.value


def check_pair(local: p.Profile, peer: p.Profile, *, outgoing: OutLink | None = None,
               incoming: bool = False) -> list[str]:
    """The rules for replicated queues that ``local`` and ``peer`` break together, as
    sentences naming both instances, the queue and the rule (docs/replication.md,
    "Validation"). ``outgoing``: local replicates to peer through this link (local
    checks it as its source); ``incoming``: peer replicates to local (local checks it
    as its destination). Either way the same rules, so both ends refuse alike."""
    problems: list[str] = []
    if outgoing is not None:
        problems += link_rules(local, peer, [t.name for t in outgoing.dest.topics])
    if incoming:
        carried = [t for d in peer.destinations if d.name == local.instance for t in d.topics]
        problems += link_rules(peer, local, carried)
    return problems


def link_rules(src: p.Profile, dst: p.Profile, carried: list[str]) -> list[str]:
    """The rules broken by the link from ``src`` to ``dst`` that replicates the topics
    ``carried`` (regexes), for every queue either instance holds as replicated whose
    own topic the link carries (a ``LocalQueue`` never is: refused at startup on its
    source, and each instance's own queue on a destination)."""
    problems: list[str] = []
    who = f"{src.instance!r} and {dst.instance!r}"
    carries = matches_any(tuple(carried))
    src_queues = {q.name: q for q in src.queues}
    dst_queues = {q.name: q for q in dst.queues}
    dst_replicates = matches_any(tuple(t for d in dst.destinations for t in d.topics))
    back = matches_any(tuple(t for d in dst.destinations if d.name == src.instance for t in d.topics))
    names = [q.name for q in src.queues if q.kind != _LOCAL and carries(q.name)]
    names += [q.name for q in dst.queues if q.kind != _LOCAL and q.name not in src_queues and carries(q.name)
              and dst_replicates(q.name)]  # held as replicated by the destination
    for name in names:
        mine, theirs = src_queues.get(name), dst_queues.get(name)
        if mine is None or theirs is None:
            holder, other = (dst, src) if mine is None else (src, dst)
            problems.append(f"{who}: {name!r} is a queue on {holder.instance!r} and is replicated, so it must "
                            f"be a queue on {other.instance!r} too")
            continue
        if (theirs.kind, theirs.underlying, theirs.filter, theirs.initial_owner) != (
            mine.kind, mine.underlying, mine.filter, mine.initial_owner
        ):
            problems.append(
                f"{who}: queue {name!r} must have the same definition on both (kind, UnderlyingTopic, "
                f"Filter, InitialOwner): {src.instance!r} has {_shape(mine)}, {dst.instance!r} has {_shape(theirs)}"
            )
        if mine.kind == _GROUP_LOCAL and theirs.kind == _GROUP_LOCAL:
            ours, yours = queue_group(src, mine), queue_group(dst, theirs)
            if ours != yours:
                problems.append(
                    f"{who}: GroupLocalQueue {name!r} is shared only by instances of one group (its "
                    f"GroupLocalQueueDomain, else the instance's Group): {src.instance!r} is in {_group(ours)}, "
                    f"{dst.instance!r} in {_group(yours)}"
                )
        if not _covers(carried, mine.underlying):
            problems.append(f"{who}: the underlying topic {mine.underlying!r} of replicated queue {name!r} must "
                            f"be replicated too (a Topic of destination {dst.instance!r} on {src.instance!r})")
        if not back(name):
            problems.append(f"{who}: queue {name!r} is replicated from {src.instance!r} to "
                            f"{dst.instance!r} but not back: replicated queues need replication both ways "
                            f"(a Destination named {src.instance!r} on {dst.instance!r})")
        for d in dst.destinations:
            if d.name == src.instance or not matches_any(tuple(d.topics))(name):
                continue
            if d.pass_through is None or not topic_matcher(d.pass_through)(src.group):
                problems.append(
                    f"{who}: queue {name!r} arrives on {dst.instance!r} from {src.instance!r} (group "
                    f"{src.group!r}) and is replicated on to {d.name!r}, so destination {d.name!r} needs a "
                    f"PassThrough matching {src.group!r} (acknowledgements and transfers must reach every copy)"
                )
    return problems


def queue_group(profile: p.Profile, q: p.QueueProfile) -> str:
    """The group that shares GroupLocalQueue ``q`` of the instance of ``profile``: its
    domain, else the instance's Group, else "" (no Group). A peer that predates the
    field sends none: its instance's group then ("" when that is its own name, as for
    an instance without a Group)."""
    if q.group is not None:
        return q.group
    return "" if profile.group == profile.instance else profile.group


def configured_queue_group(queue: QueueConfig, config: Config) -> str:
    """The group a GroupLocalQueue of this instance is shared within, as its profile shows it:
    ``GroupLocalQueueDomain``, else the instance's ``Group``, else ""."""
    return queue.group_local_queue_domain or config.group or ""


def _group(group: str) -> str:
    return f"group {group!r}" if group else "no group (no Group, no GroupLocalQueueDomain)"


def _shape(q: p.QueueProfile) -> str:
    return f"({q.kind}, {q.underlying!r}, {q.filter!r}, {q.initial_owner!r})"


def _covers(names: list[str], underlying: str) -> bool:
    if underlying in names or any(n in (".*", ".+", "^.*$") for n in names):
        return True
    return matches_any(tuple(names))(underlying)
