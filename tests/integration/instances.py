"""Instances for multi-process tests: a configuration, a ``conveyor serve`` process, and
its journal read back once it has stopped (tests/integration/test_replication*.py)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from conveyor import Client, records
from conveyor.protocol.bookmarks import publisher_id
from conveyor.journal import Journal
from tests.integration.tcp_proxy import TcpProxy
from tests.serverproc import ServerProcess, free_port  # noqa: F401 (free_port: imported from here by other tests)

TOPIC = "Work"


class Instance:
    """One instance's configuration and process."""

    def __init__(self, root: Path, name: str, *, group: str | None = None, queues: str = "",
                 topics: tuple[str, ...] = (TOPIC,), actions: str = "", admin: bool = False,
                 journaled: tuple[str, ...] = ()) -> None:
        self.name = name
        self.admin_port = free_port() if admin else None  # the admin HTTP interface, if asked for
        self.actions = actions  # an <Actions> element
        self.group = group
        self.queues = queues  # <Queue> elements for the <SOW>
        self.topics = topics  # what each destination replicates
        self.journaled = journaled  # topics the transaction log records besides Work and dr-control
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.repl_port = free_port()
        self.destinations: list[str] = []
        self.proc: ServerProcess | None = None
        self._links_seen: dict[str, int] = {}

    def replicate_to(self, other: Instance, *, sync: bool = False, port: int | None = None,
                     pass_through: str | None = None, extra: str = "", topic_filter: str | None = None) -> None:
        """``topic_filter``: a content Filter on each replicated Topic."""
        pt = f"<PassThrough>{pass_through}</PassThrough>" if pass_through else ""
        flt = f"<Filter>{topic_filter}</Filter>" if topic_filter else ""
        self.destinations.append(
            f"<Destination><Name>{other.name}</Name><SyncType>{'sync' if sync else 'async'}</SyncType>"
            f"<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:{port or other.repl_port}</InetAddr>"
            f"</Transport>{''.join(f'<Topic><Name>{t}</Name><MessageType>json</MessageType>{flt}</Topic>' for t in self.topics)}"
            f"{pt}{extra}</Destination>"
        )

    def config(self) -> Path:
        group = f"<Group>{self.group}</Group>" if self.group else ""
        repl = f"<Replication>{''.join(self.destinations)}</Replication>" if self.destinations else ""
        path = self.dir / "config.xml"
        path.write_text(
            f"<AMPSConfig><Name>{self.name}</Name>{group}<Transports>"
            "<Transport><Name>clients</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>"
            f"<Transport><Name>replication</Name><Type>amps-replication</Type>"
            f"<InetAddr>127.0.0.1:{self.repl_port}</InetAddr></Transport></Transports>"
            f"<TransactionLog><JournalDirectory>{self.dir / 'journal'}</JournalDirectory>"
            f"<Topic><Name>{TOPIC}</Name><MessageType>json</MessageType></Topic>"
            "<Topic><Name>dr-control</Name><MessageType>json</MessageType></Topic>"
            + "".join(f"<Topic><Name>{t}</Name><MessageType>json</MessageType></Topic>" for t in self.journaled)
            + "</TransactionLog>"
            f"<SOW>{self.queues}</SOW>{self.actions}{repl}"
            + (f"<Admin><InetAddr>127.0.0.1:{self.admin_port}</InetAddr></Admin>" if self.admin_port else "")
            + "</AMPSConfig>"
        )
        return path

    def start(self) -> Instance:
        if self.proc is None:
            self.proc = ServerProcess(self.config())
            self.proc.start()
        else:
            self.proc.restart()
        return self

    @property
    def uri(self) -> str:
        return self.proc.uri

    def kill(self) -> None:
        self.proc.kill()

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stop()
        except Exception as exc:  # a graceful stop that hangs is a bug: say what the server said
            self.proc.kill()
            raise AssertionError(f"{self.name} did not stop on SIGTERM ({exc}):\n{self.proc.log[-4000:]}") from None

    def recorded(self) -> list[records.PublishRec]:
        """Every publish in this (stopped) instance's journal."""
        journal = Journal.open(self.dir / "journal", create=False)
        try:
            return [r for _, p in journal.scan() if type(r := records.decode(p)) is records.PublishRec]
        finally:
            journal.close()

    def wait_for_queue(self, count: int, queue: str = "WorkQ", timeout: float = 60.0) -> None:
        """Until a sow of ``queue`` on this instance shows ``count`` messages."""
        deadline = time.monotonic() + timeout
        seen = 0
        with Client(f"viewer-{self.name}-{time.monotonic_ns()}").connect(self.uri) as client:
            while time.monotonic() < deadline:
                seen = len(client.sow(queue))
                if seen >= count:
                    return
                time.sleep(0.1)
        raise AssertionError(f"{self.name}: {queue} shows {seen} of {count} messages")

    def wait_for_link(self, destination: str, timeout: float = 60.0) -> None:
        """Until this instance streams to ``destination`` once more than it had so far."""
        text = f"replication to {destination} ({destination},"
        before = self._links_seen.get(destination, 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.proc.log.count(text)
            if n > before:
                self._links_seen[destination] = n
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no new link to {destination}:\n{self.proc.log[-3000:]}")

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        """Until a replay of the topic on this instance shows ``count`` messages."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            with Client(f"probe-{self.name}-{time.monotonic_ns()}").connect(self.uri) as client:
                sub = client.subscribe(TOPIC, bookmark="0")
                seen = 0
                while sub.get(timeout=0.5) is not None:
                    seen += 1
            if seen >= count:
                return
            time.sleep(0.2)
        raise AssertionError(f"{self.name} shows {seen} of {count} messages:\n{self.proc.log[-3000:]}")


@pytest.fixture
def instances(tmp_path):
    made: list[Instance] = []
    proxies: list[TcpProxy] = []

    def make(name: str, **kw) -> Instance:
        inst = Instance(tmp_path, name, **kw)
        made.append(inst)
        return inst

    make.proxies = proxies
    yield make
    for proxy in proxies:
        proxy.close()
    for inst in made:
        try:
            inst.stop()
        except Exception:  # noqa: BLE001 (a killed one)
            pass


def publish(uri: str, name: str, seqs: range) -> None:
    """Publish ``seqs`` and wait until every one is persisted."""
    with Client(name).connect(uri) as client:
        for i in seqs:
            client.publish(TOPIC, {"i": i}, sequence=i)
        client.flush()


def assert_exactly_once(inst: Instance, expected: set[tuple[int, int]]) -> None:
    ids = Counter((r.publisher, r.seq) for r in inst.recorded())
    twice = [k for k, n in ids.items() if n > 1]
    assert not twice, f"{inst.name} recorded {twice[:5]} more than once"
    missing = expected - set(ids)
    assert not missing, f"{inst.name} lacks {len(missing)} messages, e.g. {sorted(missing)[:5]}"


def ids(name: str, seqs: range) -> set[tuple[int, int]]:
    return {(publisher_id(name), s) for s in seqs}


