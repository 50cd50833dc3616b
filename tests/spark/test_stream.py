"""Source -> sink through a real local SparkSession and a real server: task failures,
AvailableNow, fencing, a server restart, batch writes (docs/spark.md, Guarantees)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from pyspark.errors import StreamingQueryException

from tests.security.helpers import pki  # noqa: F401 (a fixture)
from tests.spark import pipeline
from tests.spark.helpers import (
    QUEUE,
    SECURE_USERS,
    assert_exactly_once,
    consumer_info,
    publish_numbers,
    read_topic,
    secure_server,
)

# Deadlines, not durations: a passing test never waits them out. Generous, because the
# Spark tests share two cores with the rest of the suite (and, on a developer machine,
# with whatever else runs there).
PATIENCE_S = 300.0
pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("mode", ["txn", "direct"])
def test_exactly_once_across_failing_tasks(spark, conveyor_server, tmp_path, mode):
    """A read fails halfway through a range, a write fails after staging or publishing
    its partition; Spark retries both tasks (local[2,4])."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 120)
    faults = {"testFaultDir": str(tmp_path)}
    query = pipeline.start(
        spark, uri=uri, consumer="etl", checkpoint=str(tmp_path / "ck"), mode=mode, max_records=40,
        source_extra={"testFaults": "read.d80.p1=raise", **faults},
        sink_extra={"testFaults": "sink.written.b2.p0=raise", **faults},
    )
    query.awaitTermination(PATIENCE_S)
    assert query.exception() is None
    assert sorted(p.name for p in tmp_path.glob("fired-*")) == ["fired-read.d80.p1", "fired-sink.written.b2.p0"]
    rows = read_topic(uri, "out", 120)
    assert_exactly_once(rows, range(120))
    assert len({row["bm"] for row in rows}) == 120  # the source bookmark is a unique key
    assert sorted(row["d"] for row in rows) == list(range(1, 121))
    assert consumer_info(uri, "etl").acked == 120


def test_available_now_stops_at_the_head_of_the_queue(spark, conveyor_server, tmp_path):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 40)
    later = threading.Thread(target=_publish_when_started, args=(uri,))
    later.start()
    query = pipeline.start(spark, uri=uri, consumer="etl", checkpoint=str(tmp_path / "ck"), max_records=10)
    query.awaitTermination(PATIENCE_S)
    later.join()
    assert query.exception() is None
    assert_exactly_once(read_topic(uri, "out", 40), range(40))
    info = consumer_info(uri, "etl")
    assert (info.d, info.acked) == (40, 40)  # the 20 published later are left
    # the next run takes them
    query = pipeline.start(spark, uri=uri, consumer="etl", checkpoint=str(tmp_path / "ck"), max_records=100)
    query.awaitTermination(PATIENCE_S)
    assert_exactly_once(read_topic(uri, "out", 60), range(60))


def _publish_when_started(uri: str) -> None:
    deadline = time.monotonic() + 60
    while consumer_info(uri, "etl").d == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    publish_numbers(uri, 40, 20, name="later")


def test_two_queries_with_one_consumer_the_older_is_fenced(spark, conveyor_server, tmp_path):
    """The newer query's claim fences the older one out: its source fails, and its sink's
    commit of a batch in flight is refused (the fence column), so nothing is published
    twice."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 40)
    every = {"processingTime": "200 milliseconds"}
    older = pipeline.start(spark, uri=uri, consumer="etl", checkpoint=str(tmp_path / "a"), max_records=10, trigger=every)
    _wait(lambda: consumer_info(uri, "etl").acked >= 10, older)
    newer = pipeline.start(spark, uri=uri, consumer="etl", checkpoint=str(tmp_path / "b"), max_records=10, trigger=every)
    try:
        _wait(lambda: not older.isActive or not newer.isActive)
        # Under heavy load Spark itself can fail a query ("Python worker failed to
        # connect back": a 10 s limit in PySpark's worker factory): say so, not "no raise".
        assert newer.isActive, f"the newer query failed: {newer.exception()}"
        with pytest.raises(StreamingQueryException, match="fenced out"):
            older.awaitTermination(PATIENCE_S)
        _wait(lambda: consumer_info(uri, "etl").acked == 40, newer)
        assert newer.isActive
    finally:
        newer.stop()
        older.stop()
    assert_exactly_once(read_topic(uri, "out", 40), range(40))


def test_server_killed_and_restarted(spark, conveyor_server, tmp_path):
    """The query fails with the server; restarted, it finishes exactly once. The
    connectors are given a list whose first server is down (failover between
    instances): every connection skips it."""
    uri = conveyor_server.uri
    servers = f"{_dead_uri()},{uri}"
    publish_numbers(uri, 0, 150)
    query = pipeline.start(spark, uri=servers, consumer="etl", checkpoint=str(tmp_path / "ck"), max_records=30,
                           trigger={"processingTime": "100 milliseconds"})
    _wait(lambda: consumer_info(uri, "etl").acked >= 30, query)
    conveyor_server.kill()
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(PATIENCE_S)
    conveyor_server.restart()
    query = pipeline.start(spark, uri=servers, consumer="etl", checkpoint=str(tmp_path / "ck"), max_records=100)
    query.awaitTermination(PATIENCE_S)
    assert query.exception() is None
    assert_exactly_once(read_topic(uri, "out", 150), range(150))
    assert consumer_info(uri, "etl").acked == 150


@pytest.mark.parametrize("mode", ["txn", "direct"])
def test_batch_write(spark, conveyor_server, mode):
    uri = conveyor_server.uri
    df = spark.range(0, 100, numPartitions=3).selectExpr("to_json(named_struct('n', id)) AS value", "'out' AS topic")
    df.write.format("conveyor").option("server", uri).option("mode", mode).mode("append").save()
    assert_exactly_once(read_topic(uri, "out", 100), range(100))


def _dead_uri() -> str:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def _wait(condition, *queries, timeout: float = PATIENCE_S) -> None:
    """Poll ``condition``; fail at once, with its error, if one of ``queries`` stopped
    (instead of waiting out the deadline for a query that can no longer get there)."""
    deadline = time.monotonic() + timeout
    while not condition():
        for query in queries:
            assert query.isActive, f"the query stopped: {query.exception()}"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_a_query_over_tls_with_credentials(spark, tmp_path, pki):
    """The streaming pipeline end to end against a server that has only a ``tcps``
    transport and authentication: the source, the heartbeat, the tasks and the sink's
    commits all connect with ``user``, ``password`` and ``caFile``."""
    from conveyor import Client

    server = secure_server(tmp_path / "server", pki)
    try:
        with Client("feed", user_id="feed", password=SECURE_USERS["feed"], ca_file=str(pki.ca_file)).connect(
                server.tls_uri) as feeder:
            for n in range(30):
                feeder.publish("in", {"n": n}, sequence=n + 1)
            feeder.flush()
        secure = {"user": "spark", "password": SECURE_USERS["spark"], "caFile": str(pki.ca_file)}
        query = pipeline.start(spark, uri=server.tls_uri, consumer="etl", checkpoint=str(tmp_path / "ck"),
                               max_records=10, source_extra=secure, sink_extra=secure)
        query.awaitTermination(PATIENCE_S)
        assert query.exception() is None
        with Client("check", user_id="spark", password=SECURE_USERS["spark"], ca_file=str(pki.ca_file)).connect(
                server.tls_uri) as reader:
            sub = reader.subscribe("out", bookmark="0")
            rows = [msg.json() for msg in iter(lambda: sub.get(timeout=2), None)]
        assert_exactly_once(rows, range(30))
        assert SECURE_USERS["spark"] not in server.log
    finally:
        server.stop()


def test_a_declared_schema_reads_only_its_columns(spark, conveyor_server, tmp_path):
    """``readStream.schema(...)`` names the columns a query reads (a Python data source
    has no column pruning): the source builds those only; one it lacks fails the query
    before anything is leased."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 30)

    def stream(schema: str, consumer: str):
        return (spark.readStream.format("conveyor").schema(schema).option("server", uri).option("queue", QUEUE)
                .option("consumer", consumer).load())

    df = stream("delivery LONG, data STRING", "etl")
    assert df.columns == ["delivery", "data"]
    query = (df.writeStream.format("memory").queryName("declared").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    query.awaitTermination(PATIENCE_S)
    assert query.exception() is None
    got = sorted((row.delivery, json.loads(row.data)["n"]) for row in spark.sql("SELECT * FROM declared").collect())
    assert got == [(d, d - 1) for d in range(1, 31)]
    assert consumer_info(uri, "etl").acked == 30  # no sink fences: the source's own acks

    bad = (stream("data STRING, price DOUBLE", "etl2").writeStream.format("noop").trigger(availableNow=True)
           .option("checkpointLocation", str(tmp_path / "ck2")).start())
    with pytest.raises(StreamingQueryException, match="has no column 'price'"):
        bad.awaitTermination(PATIENCE_S)
    assert consumer_info(uri, "etl2").d == 0  # refused before its first lease
