"""Shared by the Spark tests: the queue configuration, publishing and reading back."""

from __future__ import annotations

import json
import time
from collections import Counter

from conveyor import Client
from conveyor.client.rpc import RpcClient
from conveyor.protocol.replies import ConsumerInfoReply
from tests.serverproc import ServerProcess

QUEUE = "In"
QUEUES = """
<Queue>
    <Name>In</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>in</UnderlyingTopic>
    <Semantics>at-least-once</Semantics>
    <LeasePeriod>30s</LeasePeriod>
</Queue>
"""


def publish_numbers(uri: str, start: int, count: int, topic: str = "in", name: str = "numbers") -> None:
    """Publish {"n": start..start+count-1} to ``topic`` (persisted when this returns),
    message n with sequence number n+1: calls with one ``name`` must publish increasing
    ranges."""
    with RpcClient(uri, client_name=name) as rpc:
        rows = [json.dumps({"n": n}).encode() for n in range(start, start + count)]
        accepted, _ = rpc.publish_batch(topic, rows, first_seq=start + 1)
        assert accepted == count


def read_topic(uri: str, topic: str, expected: int, settle: float = 1.0, timeout: float = 30.0) -> list[dict]:
    """Every message of ``topic`` from the start of the log, as JSON: waits for
    ``expected`` messages, then ``settle`` seconds more for any extra (duplicates)."""
    out: list[dict] = []
    with Client(f"reader-{time.monotonic_ns()}").connect(uri) as client:
        sub = client.subscribe(topic, bookmark="0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = sub.get(timeout=settle if len(out) >= expected else 0.5)
            if msg is None:
                if len(out) >= expected:
                    break
                continue
            out.append(json.loads(msg.data))
    return out


def assert_exactly_once(rows: list[dict], numbers: range) -> None:
    counts = Counter(row["n"] for row in rows)
    missing = sorted(set(numbers) - set(counts))
    extra = sorted(n for n, c in counts.items() if c > 1 or n not in numbers)
    assert not missing and not extra, f"missing {missing[:20]}, duplicated/unexpected {extra[:20]}"
    assert len(rows) == len(numbers)


def consumer_info(uri: str, consumer: str) -> ConsumerInfoReply:
    with RpcClient(uri) as rpc:
        return rpc.consumer_info(QUEUE, consumer)


#: Users of :func:`secure_server`: the pipeline's and a feeder's.
SECURE_USERS = {"spark": "spark-pw", "feed": "feed-pw"}


def secure_server(directory, pki) -> ServerProcess:
    """A server with only a ``tcps`` transport (certificates from ``pki``, the security
    tests' fixture), a users file and grants for the pipeline: ``spark`` may run the
    named consumers of the queue, transactions, publish and replay ``out`` and read the
    journal; ``feed`` may publish ``in``. Its ``tls_uri`` is set."""
    from tests.security.helpers import make_users, tls_elements

    users = make_users(directory / "users", SECURE_USERS)
    path = directory / "config.xml"
    path.write_text(f"""<AMPSConfig><Name>spark-tls</Name><Transports>
      <Transport><Name>secure</Name><Type>tcps</Type><InetAddr>127.0.0.1:0</InetAddr>{tls_elements(pki)}</Transport>
      </Transports>
      <TransactionLog><JournalDirectory>{directory / 'journal'}</JournalDirectory>
        <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
      <SOW>{QUEUES}</SOW>
      <Authentication><UsersFile>{users}</UsersFile></Authentication>
      <Entitlement>
        <Grant><User>feed</User><Publish>in</Publish></Grant>
        <Grant><User>spark</User><NamedConsumers>{QUEUE}</NamedConsumers><Publish>out</Publish>
          <Replay>out</Replay><Transactions>true</Transactions><ReadJournal>true</ReadJournal></Grant>
      </Entitlement></AMPSConfig>""")
    server = ServerProcess(path).start()
    server.tls_uri = f"tcps://127.0.0.1:{server.port}"
    return server
