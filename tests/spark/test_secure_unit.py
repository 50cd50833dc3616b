"""The Spark connector against a server with TLS and authentication, its callbacks driven
by hand as Spark's runner would (no JVM): the source's reader and the sink's staging and
commit reach a ``tcps://`` server with the options ``user``, ``password`` and ``caFile``
(or the environment), and say clearly why when those are missing or wrong."""

from __future__ import annotations

import json
import pickle

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.types import StringType, StructField, StructType

from conveyor import errors
from conveyor.client import Client
from conveyor.spark import fencing
from conveyor.spark.sink import SinkOptions, stage_partition
from conveyor.spark.source import ConveyorStreamReader, SourceOptions, source_schema
from tests.security.helpers import pki  # noqa: F401 (a fixture)
from tests.spark.helpers import QUEUE, SECURE_USERS, secure_server

USERS = SECURE_USERS


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki):
    s = secure_server(tmp_path_factory.mktemp("spark-tls"), pki)
    yield s
    s.stop()


def feed(server, pki, start: int, count: int) -> None:
    with Client("feed", user_id="feed", password=USERS["feed"], ca_file=str(pki.ca_file)).connect(server.tls_uri) as c:
        for n in range(start, start + count):
            c.publish("in", json.dumps({"n": n}).encode(), sequence=n + 1)
        c.flush()


def reader(server, pki, consumer: str, **options: str | None) -> ConveyorStreamReader:
    """A reader authenticated as ``spark`` over TLS; an option given as None is left out."""
    options = {"server": server.tls_uri, "queue": QUEUE, "consumer": consumer, "numpartitions": "2",
               "user": "spark", "password": USERS["spark"], "caFile": str(pki.ca_file), **options}
    return ConveyorStreamReader(SourceOptions.parse({k: v for k, v in options.items() if v is not None}),
                                source_schema())


def test_source_and_sink_over_tls_with_credentials(server, pki):
    """A batch read from the queue over TLS, staged to ``out`` and committed with the
    source's fence: what a micro-batch does, each step authenticated as ``spark``."""
    feed(server, pki, 0, 12)
    r = reader(server, pki, "etl")
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadMaxRows(12))
        executor = pickle.loads(pickle.dumps(r))  # what Spark ships to an executor
        assert USERS["spark"] not in repr(executor.options)
        batches = [b for part in r.partitions(start, end) for b in executor.read(part)]
        numbers = [json.loads(x)["n"] for b in batches for x in b.column("data").to_pylist()]
        assert sorted(numbers) == list(range(12))
        schema = StructType([StructField("value", StringType()), StructField(fencing.FENCE_COLUMN, StringType())])
        sink = SinkOptions.parse({"server": server.tls_uri, "topic": "out", "user": "spark",
                                  "password": USERS["spark"], "caFile": str(pki.ca_file)}, schema)
        handles, rows, fences = stage_partition(sink, iter(b.select(["data", "fence"]).rename_columns(
            ["value", fencing.FENCE_COLUMN]) for b in batches), "query-1/0/0/0")
        assert rows == 12 and len(fences) == 1
        with sink.connect.client(sink.server) as rpc:
            outcome, _ = rpc.commit_txn("spark/query-1", 1, handles, fencing.parse(fences))
            assert outcome == "published"
            assert rpc.consumer_info(QUEUE, "etl").acked == 12  # the fence acknowledged the batch
    finally:
        r.stop()
    with Client("check", user_id="spark", password=USERS["spark"], ca_file=str(pki.ca_file)).connect(
            server.tls_uri) as c:
        sub = c.subscribe("out", bookmark="0")
        got = [json.loads(m.data)["n"] for m in iter(lambda: sub.get(timeout=2), None)]
    assert sorted(got) == list(range(12))


def test_credentials_from_the_environment(server, pki, monkeypatch):
    """The executors' environment (``CONVEYOR_USER``/``CONVEYOR_PASSWORD``) when the
    options carry no credentials."""
    monkeypatch.setenv("CONVEYOR_USER", "spark")
    monkeypatch.setenv("CONVEYOR_PASSWORD", USERS["spark"])
    r = reader(server, pki, "env", user=None, password=None)
    try:
        assert r.initialOffset()["consumer"] == "env"
    finally:
        r.stop()


@pytest.mark.parametrize("case", ["wrong password", "no CA file", "not entitled"])
def test_missing_or_wrong_options_fail_clearly(server, pki, case):
    options = {"wrong password": {"password": "nope"}, "no CA file": {"caFile": None},
               "not entitled": {"user": "feed", "password": USERS["feed"]}}[case]
    r = reader(server, pki, f"bad-{case.replace(' ', '-')}", **options)
    expected = {"wrong password": errors.NotAuthenticated, "no CA file": errors.ConnectionLost,
                "not entitled": errors.NotEntitled}[case]
    try:
        with pytest.raises(expected) as info:
            r.initialOffset()
        if case == "no CA file":
            assert "certificate" in str(info.value).lower()
    finally:
        r.stop()
