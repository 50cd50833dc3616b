"""Replication between real server processes on loopback (docs/replication.md).

Every instance is a ``conveyor serve`` subprocess with a client transport and an
incoming replication transport; links are real TCP connections, cut by a proxy where a
test needs a network fault, and servers die by SIGKILL. What each instance recorded is
read from its journal once it has stopped, so "exactly once" is checked record by
record, not by waiting for silence.
"""

from __future__ import annotations

import random
import socket
import time
from collections import Counter
from pathlib import Path

import pytest

from conveyor import Client, records
from conveyor.engine.bookmarks import publisher_id
from conveyor.journal import Journal
from tests.integration.tcp_proxy import TcpProxy
from tests.serverproc import ServerProcess

TOPIC = "Work"


def free_port() -> int:
    """A free port below the kernel's ephemeral range (32768 and up on Linux), so that
    no outgoing connection takes it between a SIGKILL and the restart that binds it again."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


class Instance:
    """One instance's configuration and process."""

    def __init__(self, root: Path, name: str, *, group: str | None = None) -> None:
        self.name = name
        self.group = group
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.repl_port = free_port()
        self.destinations: list[str] = []
        self.proc: ServerProcess | None = None

    def replicate_to(self, other: Instance, *, sync: bool = False, port: int | None = None,
                     pass_through: str | None = None, extra: str = "") -> None:
        pt = f"<PassThrough>{pass_through}</PassThrough>" if pass_through else ""
        self.destinations.append(
            f"<Destination><Name>{other.name}</Name><SyncType>{'sync' if sync else 'async'}</SyncType>"
            f"<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:{port or other.repl_port}</InetAddr>"
            f"</Transport><Topic><Name>{TOPIC}</Name><MessageType>json</MessageType></Topic>{pt}{extra}"
            "</Destination>"
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
            f"<Topic><Name>{TOPIC}</Name><MessageType>json</MessageType></Topic></TransactionLog>{repl}</AMPSConfig>"
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


def test_async_one_way_with_a_link_cut_mid_stream(instances):
    """A -> B async through a proxy that drops the connection twice while 3,000
    messages stream: B has each exactly once, with its publisher, sequence and time."""
    a, b = instances("A"), instances("B")
    b.start()
    proxy = TcpProxy(b.repl_port)
    instances.proxies.append(proxy)
    a.replicate_to(b, port=proxy.port)
    a.start()
    with Client("orders").connect(a.uri) as client:
        for i in range(1, 3001):
            client.publish(TOPIC, {"i": i}, sequence=i)
            if i in (1000, 2000):
                client.flush()
                proxy.cut()
        client.flush()
    b.wait_for(3000)
    a.stop()
    b.stop()
    assert_exactly_once(b, ids("orders", range(1, 3001)))
    a_recs = {(r.publisher, r.seq): r.timestamp for r in a.recorded()}
    b_recs = {(r.publisher, r.seq): (r.timestamp, r.origin) for r in b.recorded()}
    assert all(b_recs[k] == (t, "A") for k, t in a_recs.items())


def test_sync_persisted_ack_means_the_destination_has_it_on_disk(instances):
    """A <-> B sync: SIGKILL A right after flush() says everything is persisted, then
    SIGKILL B too: every message is in B's journal."""
    a, b = instances("A"), instances("B")
    a.replicate_to(b, sync=True)
    b.replicate_to(a, sync=True)
    a.start()
    b.start()
    publish(a.uri, "payments", range(1, 2001))
    a.kill()
    b.kill()
    assert_exactly_once(b, ids("payments", range(1, 2001)))


def test_sigkill_of_the_destination_mid_stream_then_restart(instances):
    a, b = instances("A"), instances("B")
    a.replicate_to(b)
    b.start()
    a.start()
    publish(a.uri, "feed", range(1, 2001))
    b.kill()
    publish(a.uri, "feed", range(2001, 3001))  # while B is down
    b.start()
    b.wait_for(3000)
    a.stop()
    b.stop()
    assert_exactly_once(b, ids("feed", range(1, 3001)))


def test_sigkill_of_the_source_then_both_restarted_in_either_order(instances):
    a, b = instances("A"), instances("B")
    a.replicate_to(b)
    b.replicate_to(a)
    a.start()
    b.start()
    publish(a.uri, "feed", range(1, 1001))
    publish(b.uri, "other", range(1, 1001))
    a.kill()
    b.kill()
    b.start()  # the destination first
    a.start()
    publish(a.uri, "feed", range(1001, 1501))
    a.wait_for(2500)
    b.wait_for(2500)
    a.kill()
    a.start()  # and the source alone
    publish(a.uri, "feed", range(1501, 2001))
    b.wait_for(3000)
    a.stop()
    b.stop()
    expected = ids("feed", range(1, 2001)) | ids("other", range(1, 1001))
    assert_exactly_once(a, expected)
    assert_exactly_once(b, expected)


def test_chain_with_pass_through_and_a_ring_without_loops(instances):
    """A -> B -> C with PassThrough on B, and C -> A closing a ring: every message once
    on every instance, nothing comes back to where it was published."""
    a, b, c = instances("A", group="ga"), instances("B", group="gb"), instances("C", group="gc")
    a.replicate_to(b, pass_through=".*")
    b.replicate_to(c, pass_through=".*")
    c.replicate_to(a, pass_through=".*")
    for inst in (a, b, c):
        inst.start()
    publish(a.uri, "from-a", range(1, 501))
    publish(b.uri, "from-b", range(1, 501))
    publish(c.uri, "from-c", range(1, 501))
    for inst in (a, b, c):
        inst.wait_for(1500)
    for inst in (a, b, c):
        inst.stop()
    expected = ids("from-a", range(1, 501)) | ids("from-b", range(1, 501)) | ids("from-c", range(1, 501))
    for inst in (a, b, c):
        assert_exactly_once(inst, expected)
    paths = {tuple(r.path) for r in c.recorded() if r.publisher == publisher_id("from-a")}
    assert paths == {("A", "B")}


def test_a_publisher_that_fails_over_records_nothing_twice(instances, tmp_path):
    """A publisher with a FilePublishStore publishes to A, loses A (SIGKILL) before every
    persisted ack arrived, and republishes from its store on B: each message is recorded
    once on B, and once on A after A comes back (B's persisted acks wait for A, its
    sync destination)."""
    from conveyor.client import FilePublishStore

    a, b = instances("A"), instances("B")
    a.replicate_to(b, sync=True)
    b.replicate_to(a, sync=True)
    a.start()
    b.start()
    store = tmp_path / "publisher.store"
    client = Client("trades", publish_store=FilePublishStore(store), reconnect=False).connect(a.uri)
    for i in range(1, 1001):
        client.publish(TOPIC, {"i": i})
    a.kill()  # some of them persisted (on A and B), some perhaps not
    try:
        client.close()
    except Exception:  # noqa: BLE001 (the server is gone)
        pass
    with Client("trades", publish_store=FilePublishStore(store)).connect(b.uri) as client:
        # The store republishes what was not persisted; B drops what it has. B's sync
        # destination A is down, so B holds the persisted acks until A is back.
        a.start()
        client.flush()
    a.wait_for(1000)
    a.stop()
    b.stop()
    assert_exactly_once(a, ids("trades", range(1, 1001)))
    assert_exactly_once(b, ids("trades", range(1, 1001)))


def test_a_destination_that_breaks_a_rule_is_refused_loudly(instances):
    """Validation: a destination named after another instance is refused, with both
    names in the log, and the source keeps serving."""
    a, b = instances("A"), instances("B")
    b.start()
    wrong = Instance(a.dir.parent, "Bee")
    wrong.repl_port = b.repl_port
    a.replicate_to(wrong)
    a.start()
    a.proc.wait_log("answered as instance 'B'", timeout=30)
    publish(a.uri, "still-serving", range(1, 11))
