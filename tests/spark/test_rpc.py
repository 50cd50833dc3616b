"""conveyor.client.rpc.RpcClient against the real server (no Spark)."""

from __future__ import annotations

import socket
import time

import pytest

from conveyor import errors
from conveyor.client.rpc import RpcClient
from conveyor.protocol.messages import FetchPacked
from conveyor.protocol.replies import CommitReply, ConsumerInfoReply
from conveyor.spark.datasource import ConveyorDataSource
from conveyor.spark.source import arrow_schema, packed_batch, to_batch
from tests.serverproc import ServerProcess, write_config
from tests.spark.helpers import QUEUE, QUEUES, publish_numbers, read_topic


def test_named_consumer_calls(conveyor_server, monkeypatch):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 30)
    with RpcClient(uri) as rpc:
        claim = rpc.claim(QUEUE, "c", "token-1")
        epoch = claim.epoch
        assert (claim.d, claim.acked) == (0, 0)
        assert rpc.lease(QUEUE, "c", 0, 10, 30, epoch=epoch).d == 10
        # paging: 10 deliveries in pages of 3, in d order
        got = list(rpc.fetch(QUEUE, "c", 0, 10, page=3))
        assert [m.delivery for m in got] == list(range(1, 11))
        assert got[0].data == b'{"n": 0}' and got[0].publisher and got[0].seq == 1 and got[0].bookmark
        # column by column: the same deliveries, fields and order
        pages = list(rpc.fetch_pages(QUEUE, "c", 0, 10, page=3))
        assert [(p.lo, len(p.data)) for p in pages] == [(0, 3), (3, 3), (6, 3), (9, 1)]
        assert [(d, t, f"{pb}|{s}|{pos}", pb, s, ts) for p in pages
                for d, t, pb, s, ts, pos in zip(p.data, p.topics, p.publishers, p.seqs, p.timestamps, p.positions)
                ] == [(x.data, x.topic, x.bookmark, x.publisher, x.seq, x.timestamp) for x in got]
        # a server that answers message by message (before columnar fetch): read the same
        def rows(pages):
            return [(p.lo, p.data, p.topics, p.publishers, p.seqs, p.timestamps, p.positions, p.correlation_ids)
                    for p in pages]

        columnar = rows(rpc.fetch_pages(QUEUE, "c", 0, 10, page=4))
        fetch_items = rpc._fetch
        monkeypatch.setattr(rpc, "_fetch", lambda *a, columns, packed=False: fetch_items(*a, columns=False))
        assert rows(rpc.fetch_pages(QUEUE, "c", 0, 10, page=4)) == columnar
        assert [lo for lo, *_ in columnar] == [0, 4, 8]
        monkeypatch.undo()
        # packed: the same pages, each field in one buffer, and the same Arrow batches from them
        packed = list(rpc.fetch_pages(QUEUE, "c", 0, 10, page=4, packed=True))
        assert all(isinstance(p, FetchPacked) for p in packed) and [(p.lo, p.n) for p in packed] == [(0, 4), (4, 4), (8, 2)]
        schema = arrow_schema(ConveyorDataSource({}).schema())
        assert [packed_batch(p, schema, "string", "f") for p in packed] == [
            to_batch(p, schema, "string", "f") for p in rpc.fetch_pages(QUEUE, "c", 0, 10, page=4)]
        # a re-offer (after < D) leases nothing new
        again = rpc.lease(QUEUE, "c", 5, 10, 30, epoch=epoch)
        assert (again.d, again.leased, again.reoffered) == (10, 0, 5)
        assert rpc.ack_through(QUEUE, "c", 5, epoch=epoch).acked == 5
        assert rpc.ack_through(QUEUE, "c", 5, epoch=epoch).acked == 5  # idempotent
        assert rpc.extend(QUEUE, "c", 30, epoch=epoch).renewed == 5
        assert rpc.reclaim(QUEUE, "c", 5, 10, 30, epoch=epoch).held_elsewhere == 0
        assert rpc.consumer_info(QUEUE, "c") == ConsumerInfoReply(d=10, acked=5, epoch=epoch, unacked=5)
        assert rpc.head(QUEUE).upto > 0
        with pytest.raises(errors.BadDeliveryRange):
            list(rpc.fetch(QUEUE, "c", 0, 3))  # acked: no longer kept
        # fencing: a newer claim makes the old epoch fail, with its code
        with RpcClient(uri) as other:
            newer = other.claim(QUEUE, "c", "token-2").epoch
        with pytest.raises(errors.Fenced):
            rpc.lease(QUEUE, "c", 10, 10, 30, epoch=epoch)
        assert rpc.lease(QUEUE, "c", 10, 0, 30, epoch=newer).d == 30  # the connection is still usable


def test_stage_commit_abort_and_large_stages(conveyor_server):
    uri = conveyor_server.uri
    big = [b'{"pad": "' + b"x" * 3000 + b'", "n": %d}' % i for i in range(3000)]  # ~9 MB: several frames
    with RpcClient(uri) as rpc:
        assert rpc.stage("q1/0/0/1/t0", "out", big) == 3000
        assert rpc.stage("q1/0/1/2/t0", "out", [b'{"n": -1}']) == 1
        assert rpc.commit_txn("sink/q1", 1, ["q1/0/0/1/t0", "q1/0/1/2/t0"]) == ("published", CommitReply(published=3001))
        rpc.stage("q1/0/0/3/t0", "out", [b'{"n": -2}'])
        assert rpc.commit_txn("sink/q1", 1, ["q1/0/0/3/t0"])[0] == "duplicate"  # a replayed batch
        rpc.stage("q1/1/0/4/t0", "out", [b'{"n": -3}'])
        assert rpc.abort_txn(["q1/1/0/4/t0"]) == 1
        with pytest.raises(errors.ConveyorError) as info:
            rpc.commit_txn("sink/q1", 2, ["q1/1/0/4/t0"])
        assert info.value.code == "unknown_txn"
    rows = read_topic(uri, "out", 3001)
    assert sorted(r["n"] for r in rows) == [-1, *range(3000)]


def test_publish_batch_dedup_and_conflict(conveyor_server):
    uri = conveyor_server.uri
    rows = [b'{"n": %d}' % i for i in range(100)]
    with RpcClient(uri, client_name="sink/q/p0") as rpc:
        assert rpc.publish_batch("out", rows, first_seq=1) == (100, 0)
        # a retried task: the same rows again, plus 20 new ones
        assert rpc.publish_batch("out", rows + [b'{"n": %d}' % i for i in range(100, 120)], first_seq=1) == (20, 100)
        with pytest.raises(errors.ConveyorError) as info:  # same seq, other payload: loud
            rpc.publish_batch("out", [b'{"n": 999}'], first_seq=5)
        assert info.value.code == "duplicate_conflict"
    with RpcClient(uri, client_name="sink/q/p1", timeout=20) as rpc:
        started = time.monotonic()
        with pytest.raises(errors.BadMessage, match="not JSON"):  # refused before the journal: at once
            rpc.publish_batch("out", [b'{"n": 1000}', b'{"n": 1001} trailing'], first_seq=1)
        assert time.monotonic() - started < 10
    assert sorted(r["n"] for r in read_topic(uri, "out", 121)) == [*range(120), 1000]


def test_connection_lost_raises_and_next_call_reconnects(conveyor_server):
    rpc = RpcClient(conveyor_server.uri, timeout=5)
    assert rpc.head(QUEUE).upto >= 0
    conveyor_server.kill()
    with pytest.raises((errors.ConnectionLost, errors.TimedOut)):
        rpc.head(QUEUE)
    conveyor_server.restart()
    assert rpc.head(QUEUE).upto >= 0
    rpc.close()


def test_a_connection_closed_while_idle_is_reopened_once(tmp_path):
    server = ServerProcess(write_config(tmp_path, queues=QUEUES, transport_extra="<IdleTimeout>1s</IdleTimeout>")).start()
    try:
        rpc = RpcClient(server.uri)
        epoch = rpc.claim(QUEUE, "c", "t").epoch
        time.sleep(2.5)  # the server closes the idle connection
        assert rpc.ack_through(QUEUE, "c", 0, epoch=epoch).acked == 0
        rpc.close()
    finally:
        server.kill()


def test_a_list_of_servers_skips_one_that_is_down(conveyor_server):
    """Failover between instances: the first URI refuses connections (nothing listens
    there), the call goes to the next; after a restart of that one, calls resume."""
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    with RpcClient(f"{dead}, {conveyor_server.uri}", timeout=5) as rpc:
        assert rpc.claim(QUEUE, "c", "t").epoch == 1
        assert rpc.server == conveyor_server.uri
        conveyor_server.kill()
        with pytest.raises((errors.ConnectionLost, errors.TimedOut)):
            rpc.head(QUEUE)
        conveyor_server.restart()
        assert rpc.consumer_info(QUEUE, "c").epoch == 1  # journaled: it survives the restart
    with pytest.raises(errors.ConnectionLost, match="cannot connect to"):
        RpcClient(dead, timeout=5).head(QUEUE)
    with pytest.raises(errors.ClientError, match="no server URI"):
        RpcClient(" , ")
