"""The connectors from a Spark Connect client (``pyspark.sql.connect``): a Connect server
started from the installed PySpark (conveyor.spark.standalone.ConnectServer) is the
driver; this process only sends plans.

``register(spark)`` on a Connect session registers the data sources on the server (the
client pickles the classes by reference; the server's Python workers import
``conveyor``). Covered: the streaming source and the transactional sink with a failing
task, exactly once; the journal reader with pushed-down filters; a batch write.

The journal reader and the batch write are marked slow (``make test-slow``): 20-35 s on
two cores, for code ``make test`` runs in local mode (test_journal_*.py, test_stream.py);
the registration of both data sources on the Connect server is checked by the fixture,
in ``make test`` too.
"""

from __future__ import annotations

import pytest

from conveyor.spark import register
from conveyor.spark.standalone import ConnectServer
from tests.spark import pipeline
from tests.spark.helpers import assert_exactly_once, consumer_info, publish_numbers, read_topic

CONNECT_TEST_S_MAX = 600


@pytest.fixture(scope="module")
def connect():
    # The Connect builder itself: the generic one marks the whole process as a Connect
    # client, which would change code paths for the local-mode tests sharing it.
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    with ConnectServer() as server:
        session = RemoteSession.builder.remote(server.url).getOrCreate()
        assert register(session) == ["conveyor", "conveyor-journal"]
        yield session
        session.stop()


@pytest.mark.timeout(CONNECT_TEST_S_MAX)
def test_stream_from_a_connect_client_is_exactly_once(connect, conveyor_server, tmp_path):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 60)
    faults = {"testFaultDir": str(tmp_path), "testFaults": "read.d40.p1=raise"}  # retried by the server's Spark
    query = pipeline.start(connect, uri=uri, consumer="etl", checkpoint=str(tmp_path / "ck"), max_records=20,
                           source_extra=faults)
    query.awaitTermination(CONNECT_TEST_S_MAX)
    assert query.exception() is None
    assert [p.name for p in tmp_path.glob("fired-*")] == ["fired-read.d40.p1"]
    assert_exactly_once(read_topic(uri, "out", 60), range(60))
    assert consumer_info(uri, "etl").acked == 60


@pytest.mark.slow  # make test-slow: see the module's docstring
@pytest.mark.timeout(CONNECT_TEST_S_MAX)
def test_journal_reader_and_batch_write_from_a_connect_client(connect, conveyor_server):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 25)
    df = connect.range(0, 10).selectExpr("to_json(named_struct('n', id)) AS value")
    df.write.format("conveyor").option("server", uri).option("topic", "out").mode("append").save()
    assert_exactly_once(read_topic(uri, "out", 10), range(10))
    journal = str(conveyor_server.config.parent / "journal")
    rows = (
        connect.read.format("conveyor-journal").option("includeOpen", "true").load(journal)
        .where("op = 'publish' AND lsn >= 0").groupBy("topic").count().collect()
    )
    assert {row["topic"]: row["count"] for row in rows} == {"in": 25, "out": 10}
