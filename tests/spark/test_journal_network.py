"""``conveyor-journal`` over the network (``server`` instead of a directory), against a
real server: the same rows as the local reader on the same journal, pruning from the
server's summaries, a server restart in the middle of a segment, and what is refused
(another journal, a removed segment, a user without ReadJournal, a memory journal).
The standalone-cluster run, with no journal directory on the executors' side, is in
test_cluster_journal.py."""

from __future__ import annotations

import json

import pytest

from conveyor import errors
from conveyor.client.rpc import RpcClient
from conveyor.journal.tools import scan_segment
from conveyor.protocol import messages as m
from conveyor.spark import journal_remote
from conveyor.spark.journal_source import PushdownJournalReader
from conveyor.spark.options import ConnectOptions
from tests.security.helpers import pki  # noqa: F401 (a fixture)
from tests.serverproc import ServerProcess, write_config
from tests.spark.helpers import SECURE_USERS, secure_server

SEGMENT = "<JournalSize>1MB</JournalSize>"
TOPICS = ("orders", "prices", "audit")


def publish(uri: str, count: int, start: int = 0) -> None:
    """``count`` messages over three topics, several segments' worth (1 MB each)."""
    for t, topic in enumerate(TOPICS):
        with RpcClient(uri, client_name=f"feed-{topic}") as rpc:
            rows = [json.dumps({"n": n, "pad": "x" * 150}).encode() for n in range(start + t, start + count, 3)]
            accepted, _ = rpc.publish_batch(topic, rows, first_seq=start // 3 + 1)
            assert accepted == len(rows)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("journal-net")
    s = ServerProcess(write_config(directory, txlog_extra=SEGMENT)).start()
    publish(s.uri, 24_000)
    s.journal = directory / "journal"
    yield s
    s.kill()


def both(spark, server, **options):
    """The same query read over the network and from the directory."""
    net = spark.read.format("conveyor-journal").option("server", server.uri)
    local = spark.read.format("conveyor-journal")
    for key, value in options.items():
        net, local = net.option(key, value), local.option(key, value)
    return net.load(), local.load(str(server.journal))


def test_the_network_reader_returns_the_local_readers_rows(spark, server):
    net, local = both(spark, server, includeOpen="true")
    assert net.rdd.getNumPartitions() == local.rdd.getNumPartitions() >= 4
    assert net.count() == local.count() >= 24_000
    assert net.exceptAll(local).count() == 0 and local.exceptAll(net).count() == 0


def test_pushed_filters_and_summaries_prune_the_same_segments(spark, server):
    """With pushdown=true, a new DataFrame per query (docs/spark-journal.md, "Filters")."""
    lsns = sorted(row.lsn for row in both(spark, server)[1].select("lsn").collect())
    cut = lsns[len(lsns) // 2]
    for where in ("op = 'publish' AND topic = 'prices'", f"lsn < {cut}", "topic IN ('audit') AND lsn >= 1000"):
        net, local = (df.filter(where) for df in both(spark, server, pushdown="true"))
        assert net.rdd.getNumPartitions() == local.rdd.getNumPartitions(), where
        assert sorted(net.collect()) == sorted(local.collect()), where
    # lsn < cut skips the segments past it, by name, on the driver
    everything = both(spark, server)[0].rdd.getNumPartitions()
    assert both(spark, server, pushdown="true")[0].filter(f"lsn < {cut}").rdd.getNumPartitions() < everything


def test_a_server_restart_in_the_middle_of_a_segment_reads_the_same_records(server, monkeypatch):
    monkeypatch.setattr(journal_remote, "READ_BYTES", 16 * 1024)  # many reads per segment
    connect = ConnectOptions()
    first = journal_remote.plan(server.uri, connect, False, lambda *a: True)[0]
    frames = journal_remote.frames(first, connect, retry_s=60.0)
    got = [next(frames) for _ in range(200)]
    server.kill()  # SIGKILL: the reader's connection breaks mid-segment
    server.restart()
    got += list(frames)
    path = server.journal / f"{first.base:020d}.log"
    assert got == list(scan_segment(path))
    assert len(got) > 1000


def test_what_is_refused(spark, server, tmp_path):
    connect = ConnectOptions()
    first = journal_remote.plan(server.uri, connect, False, lambda *a: True)[0]
    other = journal_remote.RemoteSegment(server.uri, "another-journal", first.base, first.end, True)
    with pytest.raises(errors.JournalError, match="positions differ between journals"):
        list(journal_remote.frames(other, connect, 5.0))
    gone = journal_remote.RemoteSegment(server.uri, first.journal, first.base + 1, first.end, True)
    with pytest.raises(errors.JournalError, match="does not exist here"):
        list(journal_remote.frames(gone, connect, 5.0))
    with pytest.raises(errors.JournalError, match="a directory or a server, not both"):
        PushdownJournalReader({"path": str(tmp_path), "server": server.uri})
    with pytest.raises(errors.JournalError, match="journal directory, .* or a server"):
        PushdownJournalReader({})
    memory = ServerProcess(write_config(tmp_path).with_name("config.xml"))
    config = memory.config.read_text()
    start, end = config.index("<TransactionLog>"), config.index("</TransactionLog>") + len("</TransactionLog>")
    memory.config.write_text(config[:start] + config[end:])
    memory.start()
    try:
        with RpcClient(memory.uri) as rpc, pytest.raises(errors.JournalError, match="keeps its journal in memory"):
            rpc.journal_segments()
    finally:
        memory.kill()


def test_over_tls_with_a_user_who_may_read_the_journal(spark, tmp_path, pki):  # noqa: F811
    server = secure_server(tmp_path, pki)
    try:
        ca = str(pki.ca_file)
        df = (spark.read.format("conveyor-journal").option("server", server.tls_uri).option("user", "spark")
              .option("password", SECURE_USERS["spark"]).option("caFile", ca).option("includeOpen", "true").load())
        assert df.filter("op = 'publish'").count() == 0 and df.count() >= 0  # a new journal: no publish yet
        with RpcClient(server.tls_uri, user_id="feed", password=SECURE_USERS["feed"], ca_file=ca) as rpc:
            with pytest.raises(errors.NotEntitled, match="read_journal"):
                rpc.journal_segments()
            with pytest.raises(errors.NotEntitled, match="read_journal"):
                rpc.journal_read(0, 0, 100, "")
    finally:
        server.kill()


def test_damage_on_the_servers_disk_is_caught_by_the_reader(tmp_path):
    """The server sends bytes as they are; the executor checks every frame's CRC."""
    server = ServerProcess(write_config(tmp_path, txlog_extra=SEGMENT)).start()
    try:
        publish(server.uri, 9_000)
        connect = ConnectOptions()
        first = journal_remote.plan(server.uri, connect, False, lambda *a: True)[0]
        assert len(list(journal_remote.frames(first, connect, 5.0))) > 1000
        path = tmp_path / "journal" / f"{first.base:020d}.log"
        with open(path, "r+b") as segment:  # one byte in the middle of a record's payload
            segment.seek(500_000)
            byte = segment.read(1)
            segment.seek(500_000)
            segment.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(errors.JournalCorrupt, match="CRC mismatch"):
            list(journal_remote.frames(first, connect, 5.0))
    finally:
        server.kill()


def test_a_connection_has_at_most_four_journal_reads_at_once(server):
    with RpcClient(server.uri) as rpc:
        listing = rpc.journal_segments()
        base = listing.segments[0].base
        commands = [m.JournalRead(base=base, offset=0, n=4 * 1024 * 1024, journal=listing.journal, cid=f"r{i}")
                    for i in range(12)]
        rpc._send(commands)  # pipelined in one frame: the server holds at most 4 of them at once
        answers = [rpc._next_item() for _ in commands]
    refused = [a for a in answers if a.status == "failure"]
    assert refused and all(a.code == "limit_exceeded" for a in refused)
    assert len(refused) <= 8 and sum(a.status == "success" for a in answers) >= 4
