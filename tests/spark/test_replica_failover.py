"""A streaming query follows its queue to a replica (docs/spark.md, "Failover between
instances"): two real instances, A replicating the queue's topic and the sink's topic to
B synchronously and B back to A asynchronously, a local SparkSession whose source and
sink are given both (``server=A,B``). A is SIGKILLed while the query runs; the query
continues on B, or fails and is restarted there, with its named consumer's deliveries,
acked pointer and epoch, and the exactly-once commits of the transactional sink. Then A
comes back and the query fails back to it.

``make test`` runs the ``mid-batch`` case (A dies with a batch staged on it: the query
fails, its restart commits the batch on B once, then fails back to A). The ``after the
lease`` case, where the query carries on against B without failing, is marked slow
(``make test-slow``): about 75 s on two cores, and the same failover and failback.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from pyspark.errors import StreamingQueryException

from tests.integration.instances import instances  # noqa: F401 (a fixture)
from tests.spark import pipeline
from tests.spark.helpers import QUEUES, assert_exactly_once, consumer_info, publish_numbers, read_topic

PATIENCE_S = 300.0
pytestmark = pytest.mark.timeout(900)
TOTAL = 150


def _wait(condition, *queries, timeout: float = PATIENCE_S) -> None:
    """Poll ``condition``; fail at once, with its error, if one of ``queries`` stopped
    (under load Spark can fail a query itself: "Python worker failed to connect back")."""
    deadline = time.monotonic() + timeout
    while not condition():
        for query in queries:
            assert query.isActive, f"the query stopped: {query.exception()}"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


@pytest.mark.parametrize("when", [pytest.param("after the lease", marks=pytest.mark.slow), "mid-batch"])
def test_the_query_continues_on_the_replica_exactly_once(spark, instances, tmp_path, when):  # noqa: F811
    """``after the lease``: A dies after leasing a batch, before it is read: the query
    reads, stages and commits it on B and carries on there. ``mid-batch``: A dies while
    the batch is staged on it, so its commit cannot be made on B: the query fails, and
    its restart commits the batch on B once."""
    a = instances("A", queues=QUEUES, topics=("in", "In", "out"), journaled=("in", "out"), admin=True)
    b = instances("B", queues=QUEUES, topics=("in", "In", "out"), journaled=("in", "out"), admin=True)
    a.replicate_to(b, sync=True)
    b.replicate_to(a)
    b.start()
    a.start()
    publish_numbers(a.uri, 0, TOTAL)  # persisted: on both disks (sync)
    b.wait_for_queue(TOTAL, queue="In")
    servers = f"{a.uri},{b.uri}"
    checkpoint = str(tmp_path / "ck")
    # The third batch, deliveries (40, 60], holds still where A is to die: in the driver
    # right after A leased it, or in a sink task right after staging it on A.
    point = "sink.written.b2.p0" if when == "mid-batch" else "source.leased.d60"
    hold = {"testFaults": f"{point}=sleep8", "testFaultDir": str(tmp_path)}
    query = pipeline.start(spark, uri=servers, consumer="etl", checkpoint=checkpoint, max_records=20,
                           trigger={"processingTime": "100 milliseconds"},
                           sink_extra=hold if when == "mid-batch" else None,
                           source_extra=hold if when != "mid-batch" else None)
    _wait(lambda: (tmp_path / f"fired-{point}").exists(), query)
    a.kill()
    # A is down (disaster recovery): the operator lets B take A's messages
    url = f"http://127.0.0.1:{b.admin_port}/amps/administrator/queues/In/enable_proxied_transfer"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert json.loads(resp.read())["done"] is True
    # The query either carries on against B, or fails (a batch staged on A cannot be
    # committed on B: unknown_txn) and is restarted with its checkpoint.
    failed = False
    deadline = time.monotonic() + PATIENCE_S
    while consumer_info(b.uri, "etl").acked < TOTAL and time.monotonic() < deadline:
        if not query.isActive:
            failed = True
            break
        time.sleep(0.2)
    if failed:
        error = query.exception()
        assert error is not None and "stage the batch again" in str(error)  # unknown_txn: staging was on A
    else:
        query.stop()
    assert failed == (when == "mid-batch")
    restarted = pipeline.start(spark, uri=servers, consumer="etl", checkpoint=checkpoint, max_records=50)
    restarted.awaitTermination(PATIENCE_S)
    assert restarted.exception() is None
    assert consumer_info(b.uri, "etl").acked == TOTAL
    assert_exactly_once(read_topic(b.uri, "out", TOTAL), range(TOTAL))

    # Failing back: the operator switches proxied transfer off on B and A comes back. A
    # learns B's claims, deliveries and acknowledgements (its copy of the consumer cuts
    # off nothing B knew, and ends where B's ends); a query run against A first then
    # takes what is published on A next, and every message is in the sink once.
    url = f"http://127.0.0.1:{b.admin_port}/amps/administrator/queues/In/disable_proxied_transfer"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert json.loads(resp.read())["done"] is True
    a.start()
    _wait(lambda: consumer_info(a.uri, "etl") == consumer_info(b.uri, "etl"), timeout=60)
    publish_numbers(a.uri, TOTAL, 30, name="numbers-after")
    back = pipeline.start(spark, uri=f"{a.uri},{b.uri}", consumer="etl", checkpoint=checkpoint, max_records=50)
    back.awaitTermination(PATIENCE_S)
    assert back.exception() is None
    _wait(lambda: consumer_info(a.uri, "etl").acked == consumer_info(b.uri, "etl").acked, timeout=60)
    assert_exactly_once(read_topic(a.uri, "out", TOTAL + 30), range(TOTAL + 30))
