"""The connectors on a Spark standalone cluster, continued from test_cluster.py (a file
of its own, on a cluster of its own, so that the two xdist workers of ``make test-slow``
run both files side by side): two queries with different named consumers draining one
queue as competing consumers, one of them SIGKILLed; speculative execution with a forced
straggler. Each message exactly once.

Marked slow, so ``make test-slow`` runs them and ``make test`` does not: a cluster (about
25 s) and two to three minutes of tests on two cores. ``make test`` keeps a pipeline on
the cluster (the demo, test_cluster.py), a driver SIGKILLed at the point where exactly
once is hardest (test_crashes.py), and the parts these tests lean on, checked without a
cluster: a dead consumer's leases lapsing to another (tests/engine/test_named_consumers.py)
and the sink committing only the task attempts Spark chose, after a retried write
(test_stream.py).
"""

from __future__ import annotations

import pytest

from tests.spark.helpers import assert_exactly_once, consumer_info, publish_numbers, read_topic
from tests.spark.test_cluster import CLUSTER_TEST_S_MAX, SPECULATION, _kill, _start, _wait, on
from tests.spark.test_crashes import run_job

pytestmark = pytest.mark.slow

@pytest.mark.timeout(CLUSTER_TEST_S_MAX)
def test_two_queries_with_their_own_consumers_share_a_queue(cluster, conveyor_server, tmp_path):
    """Competing consumers: each message goes to one of the two named consumers (one
    executor each); one query is SIGKILLed mid-run, the leases it held lapse and the
    other query takes them; the output holds every message once."""
    uri = conveyor_server.uri
    total = 120
    publish_numbers(uri, 0, total)
    common = ["--max-records", "10", "--trigger-ms", "300", "--lease-seconds", "4", *on(cluster, cores=1)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _start(uri, tmp_path / "a", "--consumer", "a", *common)
    b = _start(uri, tmp_path / "b", "--consumer", "b", *common)
    try:
        _wait(lambda: consumer_info(uri, "a").acked >= 10 and consumer_info(uri, "b").acked >= 10, a, b)
        _kill(a)  # with whatever it had leased, staged or committed
        _wait(lambda: consumer_info(uri, "b").acked + consumer_info(uri, "a").acked >= total, b, timeout=240)
    finally:
        _kill(a)
        _kill(b)
    rows = read_topic(uri, "out", total)
    assert_exactly_once(rows, range(total))
    by_a, by_b = consumer_info(uri, "a"), consumer_info(uri, "b")
    assert by_a.acked > 0 and by_b.acked > 0  # both took part


@pytest.mark.timeout(CLUSTER_TEST_S_MAX)
def test_speculative_execution_with_a_straggler_is_exactly_once(cluster, conveyor_server, tmp_path):
    """spark.speculation=true; the first attempt of one task of batch 0 stalls in its
    read, so the scheduler launches a copy on the other executor. Both attempts stage
    their rows; the sink commits only the attempt Spark chose."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 40)
    faults = "read.d20.p1=sleep25,sink.writing.b0.p1.a1=mark"
    result = run_job(uri, tmp_path, "--max-records", "20", "--faults", faults, *SPECULATION, *on(cluster))
    assert result.returncode == 0 and "DONE" in result.stdout, result.stderr[-3000:]
    fired = sorted(p.name for p in tmp_path.glob("fired-*"))
    assert fired == ["fired-read.d20.p1", "fired-sink.writing.b0.p1.a1"], fired  # a second attempt wrote
    assert_exactly_once(read_topic(uri, "out", 40), range(40))
    assert consumer_info(uri, "etl").acked == 40
