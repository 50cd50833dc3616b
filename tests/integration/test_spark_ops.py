"""The Spark connector's server operations against the real server, across SIGKILL
(docs/spark-server.md). A tiny blocking client over a raw socket, on the codec."""

from __future__ import annotations

import itertools
import json
import socket
import time

from conveyor import Client
from conveyor.protocol import messages as m
from conveyor.protocol.codec import MessageDecoder, encode_frame

QUEUES = """
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <LeasePeriod>30s</LeasePeriod>
</Queue>
<Queue>
    <Name>Out</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>out</UnderlyingTopic>
    <LeasePeriod>30s</LeasePeriod>
</Queue>
"""


class Raw:
    """One connection; ``call`` sends a command and waits for its Ack."""

    _cids = itertools.count(1)

    def __init__(self, port: int, name: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.decoder = MessageDecoder()
        self.pending: list = []
        self.call(m.Logon(client_name=name, ack_type="processed"))

    def send(self, cmd) -> str:
        cid = f"c{next(self._cids)}"
        self.sock.sendall(encode_frame([type(cmd)(**{**_fields(cmd), "cid": cid})]))
        return cid

    def wait(self, cid: str) -> tuple[list[m.Message], m.Ack]:
        got = []
        while True:
            for item in self.pending:
                if isinstance(item, m.Ack) and item.cid == cid:
                    self.pending = []
                    return got, item
                if isinstance(item, m.Message) and item.query_id == cid:
                    got.append(item)
            self.pending = []
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            self.decoder.receive_data(data)
            self.pending = self.decoder.next_items()

    def call(self, cmd) -> tuple[list[m.Message], m.Ack]:
        return self.wait(self.send(cmd))

    def ok(self, cmd) -> dict:
        _, ack = self.call(cmd)
        assert ack.status == "success", (ack.code, ack.reason)
        return ack.result

    def close(self) -> None:
        self.sock.close()


def _fields(cmd) -> dict:
    return {f: getattr(cmd, f) for f in cmd.__struct_fields__}


def port_of(server) -> int:
    return int(server.uri.rsplit(":", 1)[1])


def publish(uri: str, topic: str, count: int) -> None:
    with Client("pub").connect(uri) as client:
        for n in range(count):
            client.publish(topic, {"n": n})
        client.flush()


def numbers(msgs) -> list[int]:
    return [json.loads(x.data)["n"] for x in msgs]


def test_deliveries_and_the_acked_pointer_survive_sigkill(server_factory):
    server = server_factory(queues=QUEUES, recorded="jobs|out")
    publish(server.uri, "jobs", 20)
    drv = Raw(port_of(server), "driver")
    assert drv.ok(m.Lease(queue="Jobs", consumer="etl", after=0, max=10, ttl=30))["d"] == 10
    msgs, ack = drv.call(m.Fetch(queue="Jobs", consumer="etl", lo=0, hi=10))
    assert ack.result == {"count": 10} and numbers(msgs) == list(range(10))
    assert [x.delivery for x in msgs] == list(range(1, 11))
    assert drv.ok(m.AckThrough(queue="Jobs", consumer="etl", d=5)) == {"acked": 5}
    assert drv.ok(m.Lease(queue="Jobs", consumer="etl", after=10, max=5, ttl=30))["d"] == 15
    server.kill()
    drv.close()
    server.restart()
    drv = Raw(port_of(server), "driver")
    info = drv.ok(m.ConsumerInfo(queue="Jobs", consumer="etl"))
    assert info == {"d": 15, "acked": 5, "epoch": 0, "unacked": 10}
    msgs, _ = drv.call(m.Fetch(queue="Jobs", consumer="etl", lo=5, hi=15))
    assert numbers(msgs) == list(range(5, 15))  # nothing unacked lost
    r = drv.ok(m.Lease(queue="Jobs", consumer="etl", after=5, max=0, ttl=30))  # driver replays
    assert (r["d"], r["renewed"]) == (15, 10)
    assert drv.ok(m.Lease(queue="Jobs", consumer="etl", after=15, ttl=30))["d"] == 20
    msgs, _ = drv.call(m.Fetch(queue="Jobs", consumer="etl", lo=15, hi=20))
    assert numbers(msgs) == list(range(15, 20))
    drv.ok(m.AckThrough(queue="Jobs", consumer="etl", d=20))
    with Client("check").connect(server.uri) as client:
        assert client.sow("Jobs") == []  # every message acked exactly through the consumer
    drv.close()


def test_commit_txn_is_exactly_once_across_sigkill(server_factory):
    server = server_factory(queues=QUEUES, recorded="jobs|out")
    rows = [json.dumps({"n": n}).encode() for n in range(3000)]
    sink = Raw(port_of(server), "sink")
    for part in range(3):
        sink.ok(m.Stage(txn=f"q1/1/{part}", topic="out", rows=rows[part * 1000 : (part + 1) * 1000]))
    sink.send(m.CommitTxn(publisher="sink/q1", seq=1, txns=[f"q1/1/{p}" for p in range(3)]))
    time.sleep(0.01)
    server.kill()  # maybe before, maybe during, maybe after the commit's group write
    sink.close()
    server.restart()
    sink = Raw(port_of(server), "sink")
    _, ack = sink.call(m.CommitTxn(publisher="sink/q1", seq=1, txns=["q1/1/0"]))
    if ack.status == "failure":  # the commit never became durable: Spark stages again
        assert ack.code == "unknown_txn"
        sink.ok(m.Stage(txn="q1/1/0", topic="out", rows=rows))
        assert sink.ok(m.CommitTxn(publisher="sink/q1", seq=1, txns=["q1/1/0"])) == {"published": 3000}
    else:
        assert ack.status == "duplicate"
    _, again = sink.call(m.CommitTxn(publisher="sink/q1", seq=1, txns=[]))
    assert again.status == "duplicate"
    with Client("check").connect(server.uri) as client:
        got = client.sow("Out")
    assert sorted(x.json()["n"] for x in got) == list(range(3000))
    sink.close()


def test_claim_fences_the_older_connection(server_factory):
    server = server_factory(queues=QUEUES, recorded="jobs|out")
    publish(server.uri, "jobs", 3)
    a = Raw(port_of(server), "query-a")
    b = Raw(port_of(server), "query-b")
    ea = a.ok(m.Claim(queue="Jobs", consumer="etl", token="a"))["epoch"]
    assert a.ok(m.Lease(queue="Jobs", consumer="etl", after=0, max=1, epoch=ea))["d"] == 1
    eb = b.ok(m.Claim(queue="Jobs", consumer="etl", token="b"))["epoch"]
    assert eb == ea + 1
    _, ack = a.call(m.AckThrough(queue="Jobs", consumer="etl", d=1, epoch=ea))
    assert (ack.status, ack.code) == ("failure", "fenced")
    server.kill()
    server.restart()
    b = Raw(port_of(server), "query-b")
    _, ack = b.call(m.Lease(queue="Jobs", consumer="etl", after=1, epoch=ea))
    assert ack.code == "fenced"
    assert b.ok(m.Lease(queue="Jobs", consumer="etl", after=1, epoch=eb))["d"] == 3
