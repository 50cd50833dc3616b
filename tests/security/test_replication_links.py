"""Replication links under the security model, on real server processes: a replicated
queue between two instances whose links are mutual TLS (each source authenticated by
its client certificate, entitled to ``Replicate``), with authenticated, entitled
publishers and workers on both sides; and a link whose certificate names a user without
``Replicate``, refused on both ends. (Passwords on links: tests/security/test_tls.py.)"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from conveyor import Client, errors
from tests.integration.instances import free_port
from tests.security.helpers import Pki, make_users, pki, tls_elements  # noqa: F401 (pki: a fixture)
from tests.serverproc import ServerProcess

QUEUE = ("<Queue><Name>WorkQ</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic>"
         "<LeasePeriod>30s</LeasePeriod></Queue>")
USERS = {"pub": "pub-pw", "worker": "worker-pw", "nosy": "nosy-pw"}


class Node:
    """One instance: clients on plain TCP with passwords, replication over mutual TLS."""

    def __init__(self, root: Path, pki: Pki, name: str) -> None:
        self.name, self.pki = name, pki
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.repl_port = free_port()
        self.link_cert = pki.leaf(f"link-{name}", pki.ca.issue_cert(f"{name.lower()}@links",
                                                                      common_name=f"link-{name}"))
        self.proc: ServerProcess | None = None

    def start(self, peer: Node, *, replicators: tuple[str, ...]) -> None:
        """Replicate to ``peer``; accept links from the certificate users ``replicators``."""
        users = make_users(self.dir / "users", USERS)
        cert, key = self.link_cert
        grants = "".join(f"<Grant><User>{u}</User><Replicate>true</Replicate></Grant>" for u in replicators)
        path = self.dir / "config.xml"
        path.write_text(f"""<AMPSConfig><Name>{self.name}</Name><Transports>
          <Transport><Name>clients</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>
          <Transport><Name>replication</Name><Type>amps-replication-secure</Type>
            <InetAddr>127.0.0.1:{self.repl_port}</InetAddr>{tls_elements(self.pki, client_certificates='required')}
          </Transport></Transports>
          <TransactionLog><JournalDirectory>{self.dir / 'journal'}</JournalDirectory>
            <Topic><Name>Work</Name><MessageType>json</MessageType></Topic></TransactionLog>
          <SOW>{QUEUE}</SOW>
          <Authentication><UsersFile>{users}</UsersFile><ClientCertificates>true</ClientCertificates></Authentication>
          <Entitlement>{grants}
            <Grant><User>pub</User><Publish>Work</Publish></Grant>
            <Grant><User>worker</User><Consume>WorkQ</Consume><Acknowledge>WorkQ</Acknowledge><Sow>WorkQ</Sow></Grant>
          </Entitlement>
          <Replication><Destination><Name>{peer.name}</Name><SyncType>sync</SyncType><Transport>
            <Type>amps-replication-secure</Type><InetAddr>127.0.0.1:{peer.repl_port}</InetAddr>
            <CAFile>{self.pki.ca_file}</CAFile><Certificate>{cert}</Certificate><PrivateKey>{key}</PrivateKey>
            </Transport>
            <Topic><Name>Work</Name><MessageType>json</MessageType></Topic>
            <Topic><Name>WorkQ</Name><MessageType>json</MessageType></Topic>
          </Destination></Replication></AMPSConfig>""")
        self.proc = ServerProcess(path).start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def client(self, name: str, user: str) -> Client:
        return Client(name, user_id=user, password=USERS[user]).connect(self.proc.uri)


@pytest.fixture
def pair(tmp_path, pki):
    a, b = Node(tmp_path, pki, "A"), Node(tmp_path, pki, "B")
    yield a, b
    for node in (a, b):
        node.stop()


def test_a_replicated_queue_over_mutual_tls_links(pair):
    """Every message published on A by an entitled publisher is processed once by the
    worker on B (ownership transferred over the links), and the acknowledgements reach A,
    whose copy of the queue empties; nothing reaches a user without grants."""
    a, b = pair
    a.start(b, replicators=("link-B",))
    b.start(a, replicators=("link-A",))
    a.proc.wait_log("replication from B (127.0.0.1:", timeout=60)
    b.proc.wait_log("replication from A (127.0.0.1:", timeout=60)
    assert "authenticated as 'link-A'" in b.proc.log and "authenticated as 'link-B'" in a.proc.log
    with a.client("orders", "pub") as c:
        for i in range(50):
            c.publish("Work", {"i": i})
        c.flush()  # sync links: persisted on B too
    processed: list[int] = []
    with b.client("worker-b", "worker") as c:
        sub = c.subscribe("WorkQ", max_backlog=10)
        deadline = time.monotonic() + 90
        while len(processed) < 50 and time.monotonic() < deadline:
            if (msg := sub.get(timeout=0.5)) is not None:
                processed.append(msg.json()["i"])
                msg.ack()
        c.flush()
    assert sorted(Counter(processed)) == list(range(50)) and len(processed) == 50
    with a.client("viewer-a", "worker") as c:
        deadline = time.monotonic() + 60
        while (left := len(c.sow("WorkQ"))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == 0, f"A still shows {left} messages B's worker acknowledged"
    with pytest.raises(errors.NotEntitled), b.client("nosy-b", "nosy") as c:
        c.subscribe("WorkQ")
    assert "-pw" not in a.proc.log + b.proc.log


def test_a_link_whose_certificate_user_may_not_replicate_is_refused(pair):
    """B accepts only link-Z: A's link (certificate of link-A) is refused with the reason,
    logged on both ends, and A's messages are not recorded on B."""
    a, b = pair
    b.start(a, replicators=("link-Z",))
    a.start(b, replicators=("link-B",))
    b.proc.wait_log("user 'link-A' is not entitled to replicate", timeout=60)
    a.proc.wait_log("REFUSED by the destination: user 'link-A' is not entitled to replicate", timeout=60)
    with a.client("orders", "pub") as c:
        c.publish("Work", {"i": 1})  # sync destination down: persisted acks wait; not flushed
    with b.client("viewer-b", "worker") as c:
        assert c.sow("WorkQ") == []
