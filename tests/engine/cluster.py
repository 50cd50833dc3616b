"""Several engines joined by a simulated network, in virtual time (docs/replication.md).

Each node is a :class:`~tests.engine.engine_harness.Harness` (an engine over a
MemoryJournal); this module plays the part of the replication shell and of the network
between them, with no sockets and no clock. Rules it keeps, as the server does:

- A link is one outgoing ``Destination`` of a node. :meth:`Cluster.connect` runs the
  handshake (``Hello`` -> ``Welcome`` or ``Refused``) and the link streams from there.
- Frames travel in order, one direction at a time, only when a test (or the simulation)
  moves them (:meth:`Cluster.deliver`): a link may be slow, and what is in flight when
  it is cut is lost (:meth:`Cluster.cut`), as with TCP.
- A crash keeps only the committed journal (un-fsynced writes are lost) and the last
  written checkpoint; every link of the node goes down.
- Link connection ids are taken from a range of their own so they never collide with
  the client connections of the harness.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from conveyor import errors, records
from conveyor.protocol import replication as p

from .engine_harness import START_TIME, Harness

LINK_CONN_BASE = 1_000_000


@dataclass
class Link:
    src: str
    dest: str  # the Destination's Name (the peer's instance name)
    up: bool = False
    src_conn: int = 0
    dst_conn: int = 0
    to_dst: deque = field(default_factory=deque)  # frames the source sent
    to_src: deque = field(default_factory=deque)  # frames the destination sent
    refused: str | None = None


class Cluster:
    def __init__(self, configs: dict[str, str], *, now: float = START_TIME):
        self.now = now
        self.nodes: dict[str, Harness] = {
            name: Harness(xml, now=now, journal_id=f"{name}-journal-1") for name, xml in configs.items()
        }
        self.links: dict[tuple[str, str], Link] = {}
        for name, h in self.nodes.items():
            repl = h.config.replication
            for dest in repl.destinations if repl else ():
                self.links[(name, dest.name)] = Link(name, dest.name)
        self._next_conn = LINK_CONN_BASE
        self.down: set[str] = set()  # crashed and not restarted

    # --- time ----------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for name, h in self.nodes.items():
            if name not in self.down:
                h.now = self.now
                h.advance(0.0)

    # --- links ---------------------------------------------------------------------------

    def _conn(self) -> int:
        self._next_conn += 1
        return self._next_conn

    def connect(self, src: str, dest: str) -> bool:
        """Open link ``src`` -> ``dest`` and run the handshake; False if refused."""
        link = self.links[(src, dest)]
        if link.up or src in self.down or dest in self.down:
            return link.up
        a, b = self.nodes[src], self.nodes[dest]
        link.src_conn, link.dst_conn = self._conn(), self._conn()
        b.engine.replica_connected(link.dst_conn)
        b.engine.replica_frames(link.dst_conn, [self.hello(src, dest)], self.now)
        b._collect()
        answer = b.take(link.dst_conn)
        reply = answer[0] if answer else None
        if not isinstance(reply, p.Welcome):
            link.refused = getattr(reply, "reason", "no answer")
            b.engine.replica_disconnected(link.dst_conn)
            return False
        try:
            a.engine.link_up(dest, link.src_conn, reply, self.now)
        except errors.ReplicationRefused as exc:
            link.refused = str(exc)
            b.engine.replica_disconnected(link.dst_conn)
            return False
        link.up, link.refused = True, None
        a._collect()
        self._pull(link)
        return True

    def hello(self, src: str, dest: str) -> p.Hello:
        """The handshake's first message, from ``src`` to ``dest`` (a test may stand in
        for an older peer by changing it here)."""
        return self.nodes[src].engine.link_hello(dest)

    def connect_all(self) -> None:
        for src, dest in self.links:
            self.connect(src, dest)

    def cut(self, src: str, dest: str, reason: str = "cut") -> None:
        """The link's connection breaks: what is in flight is lost."""
        link = self.links[(src, dest)]
        if not link.up:
            return
        link.up = False
        link.to_dst.clear()
        link.to_src.clear()
        a, b = self.nodes[src], self.nodes[dest]
        if src not in self.down:
            a.engine.link_down(dest, link.src_conn, reason, self.now)
            a.take(link.src_conn)
            a._collect()
        if dest not in self.down:
            b.engine.replica_disconnected(link.dst_conn)
            b.take(link.dst_conn)
            b._collect()

    def _pull(self, link: Link) -> None:
        """Move what each end wrote into the network."""
        link.to_dst.extend(self.nodes[link.src].take(link.src_conn))
        link.to_src.extend(self.nodes[link.dest].take(link.dst_conn))

    def deliver(self, src: str, dest: str, frames: int | None = None) -> int:
        """Move up to ``frames`` frames each way over link ``src -> dest`` (None: all
        in flight now); how many moved."""
        link = self.links[(src, dest)]
        if not link.up:
            return 0
        self._pull(link)
        a, b = self.nodes[src], self.nodes[dest]
        moved = 0
        for _ in range(len(link.to_dst) if frames is None else min(frames, len(link.to_dst))):
            b.engine.replica_frames(link.dst_conn, [link.to_dst.popleft()], self.now)
            moved += 1
        b._collect()
        for _ in range(len(link.to_src) if frames is None else min(frames, len(link.to_src))):
            a.engine.link_acked(link.src_conn, link.to_src.popleft(), self.now)
            moved += 1
        a._collect()
        self._pull(link)
        return moved

    # --- nodes ------------------------------------------------------------------------------

    def commit(self, name: str) -> None:
        if name not in self.down:
            self.nodes[name].commit()

    def settle(self, rounds_max: int = 1000) -> None:
        """Commit everywhere and move every frame until nothing moves."""
        for _ in range(rounds_max):
            for name in self.nodes:
                self.commit(name)
            moved = sum(self.deliver(src, dest) for (src, dest), link in self.links.items() if link.up)
            if not moved and all(
                self.nodes[n].journal.end == self.nodes[n].journal.durable_end for n in self.nodes if n not in self.down
            ):
                return
        raise AssertionError("the cluster did not settle")

    def crash(self, name: str) -> None:
        """SIGKILL of a node: un-fsynced writes are lost; its links go down."""
        for (src, dest), link in self.links.items():
            if name in (src, dest) and link.up:
                self.cut(src, dest, f"{name} crashed")
        self.down.add(name)

    def restart(self, name: str) -> None:
        h = self.nodes[name]
        h.crash(now=self.now)
        self.down.discard(name)

    # --- inspection -----------------------------------------------------------------------------

    def publishes(self, name: str) -> list[records.PublishRec]:
        """Every durable publish record of node ``name``, in journal order."""
        journal = self.nodes[name].journal
        return [r for _, payload in journal.scan() if type(r := records.decode(payload)) is records.PublishRec]

    def identities(self, name: str, topic: str | None = None) -> list[tuple[int, int, int]]:
        """(publisher, seq, txn_index) of every durable publish (on ``topic``)."""
        return [(r.publisher, r.seq, r.txn_index) for r in self.publishes(name) if topic is None or r.topic == topic]


def destination(name: str, *, sync: bool = False, topics: Iterable[str] = (".*",), pass_through: str | None = None,
                extra: str = "") -> str:
    """One ``<Destination>`` element (the address is never dialled in the simulation)."""
    topic_xml = "".join(f"<Topic><Name>{t}</Name><MessageType>json</MessageType></Topic>" for t in topics)
    pt = f"<PassThrough>{pass_through}</PassThrough>" if pass_through else ""
    return (f"<Destination><Name>{name}</Name><SyncType>{'sync' if sync else 'async'}</SyncType>"
            f"<Transport><Type>amps-replication</Type><InetAddr>{name}:10005</InetAddr></Transport>"
            f"{topic_xml}{pt}{extra}</Destination>")


def instance_xml(name: str, destinations: Iterable[str] = (), *, group: str | None = None, sow: str = "",
                 topics: Iterable[str] = ("Work", "Orders", "Other")) -> str:
    """A complete configuration for instance ``name`` with the given destinations."""
    recorded = "".join(f"<Topic><Name>{t}</Name><MessageType>json</MessageType></Topic>" for t in topics)
    group_xml = f"<Group>{group}</Group>" if group else ""
    repl = f"<Replication>{''.join(destinations)}</Replication>" if destinations else ""
    return (f"<AMPSConfig><Name>{name}</Name>{group_xml}"
            f"<TransactionLog><JournalDirectory>./journals</JournalDirectory>{recorded}</TransactionLog>"
            f"<SOW>{sow}</SOW>{repl}</AMPSConfig>")
