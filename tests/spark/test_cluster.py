"""The connectors on a Spark standalone cluster: a master and two workers in processes
of their own (conveyor.spark.standalone), shared by every test of this module; each
driver is a subprocess (tests/spark/job.py, the demo), its executors in the workers.

Covered here: the demo pipeline (``make test``'s one pipeline on a cluster); a worker
SIGKILLed in the middle of a batch and the short driver-SIGKILL chain (test_crashes.py),
both marked slow (``make test-slow``: two and four minutes on two cores). Two queries
sharing a queue and speculative execution are in test_cluster_queries.py (slow too), so
that ``make test-slow``'s two xdist workers run them side by side, each file on a
cluster of its own. Every test checks the output topic, replayed from the log, against
the input: each message exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conveyor.spark.standalone import LocalCluster
from tests.spark.helpers import assert_exactly_once, consumer_info, publish_numbers, read_topic
from tests.spark.test_crashes import ROOT, SHORT, run_chain, run_job

# Generous: each driver run starts a JVM and executors, and CI shares two cores.
CLUSTER_TEST_S_MAX = 900
CHAIN_TEST_S_MAX = 1500

# Executors are on "other hosts" (127.0.0.2, 127.0.0.3): a task of a lost executor is
# rerun on the other one, and a speculative copy may run there.
SPECULATION = [
    "--conf", "spark.speculation=true", "--conf", "spark.speculation.quantile=0.5",
    "--conf", "spark.speculation.multiplier=1.5", "--conf", "spark.speculation.minTaskRuntime=1s",
    "--conf", "spark.speculation.interval=200ms",
]


def on(cluster: LocalCluster, cores: int | None = None) -> list[str]:
    """job.py's arguments for a driver on the cluster; ``cores``: at most that many (an
    application takes every free core by default, and a second one would get none)."""
    conf = cluster.session_conf()
    if cores is not None:
        conf["spark.cores.max"] = str(cores)
    args = ["--master", conf.pop("spark.master")]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


@pytest.mark.timeout(CLUSTER_TEST_S_MAX)
def test_demo_pipeline_on_the_cluster(cluster):
    """`make demo CLUSTER=1`, with the tests' cluster."""
    result = subprocess.run(
        [sys.executable, "examples/demo_pipeline.py", "--master", cluster.url], cwd=ROOT, capture_output=True,
        text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2000 messages for 2000 distinct orders of 2000: exactly once" in result.stdout, result.stdout[-2000:]
    assert f"master {cluster.url}" in result.stdout


@pytest.mark.slow  # make test-slow: about 4 minutes; make test runs a one-kill chain in local mode (test_crashes.py)
@pytest.mark.timeout(CHAIN_TEST_S_MAX)
def test_driver_sigkill_short_chain_on_the_cluster(cluster, conveyor_server, tmp_path):
    # One executor per run: each of the four runs launches its executors anew.
    run_chain(conveyor_server.uri, tmp_path, SHORT, *on(cluster, cores=1))


@pytest.mark.slow  # a SIGKILL run on the cluster, about 2 minutes: make test-slow
@pytest.mark.timeout(CLUSTER_TEST_S_MAX)
def test_worker_sigkilled_mid_batch_loses_and_duplicates_nothing(cluster, conveyor_server, tmp_path):
    """A task of batch 1 holds still in the sink's write(); the test SIGKILLs the worker
    it runs on (worker, executor, Python workers). Spark reruns the task on the other
    executor; the lost attempt's staging is never committed."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 60)
    marker = tmp_path / "fired-sink.writing.b1.p+"  # faults.py: "*" is "+" in marker names
    job = _start(uri, tmp_path, "--max-records", "20", "--faults", "sink.writing.b1.p*=sleep60", *on(cluster))
    victim = None
    try:
        _wait(lambda: marker.exists() and marker.read_text(), job)
        victim = cluster.worker_of(int(marker.read_text()))
        assert victim is not None, "the task's Python worker is not under a worker of the cluster"
        cluster.kill_worker(victim)
        assert job.wait(timeout=300) == 0 and "DONE" in _out(job), _err(job)
    finally:
        _kill(job)
        if victim is not None:
            cluster.restart_worker(victim)
    assert_exactly_once(read_topic(uri, "out", 60), range(60))
    assert consumer_info(uri, "etl").acked == 60


def _start(uri: str, tmp: Path, *args: str) -> subprocess.Popen:
    """A driver that runs until it ends or is killed; its output goes to files (a pipe
    nobody reads would fill up and stall it)."""
    cmd = [sys.executable, "-m", "tests.spark.job", "--server", uri, "--checkpoint", str(tmp / "ck"),
           "--fault-dir", str(tmp), *args]
    with open(tmp / "job.out", "w") as out, open(tmp / "job.err", "w") as err:
        job = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=out, stderr=err, text=True)
    job.tmp = tmp  # type: ignore[attr-defined]
    return job


def _out(job: subprocess.Popen) -> str:
    return (job.tmp / "job.out").read_text()  # type: ignore[attr-defined]


def _err(job: subprocess.Popen) -> str:
    return (job.tmp / "job.err").read_text()[-3000:]  # type: ignore[attr-defined]


def _kill(job: subprocess.Popen) -> None:
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait(timeout=30)


def _wait(condition, *jobs: subprocess.Popen, timeout: float = 300.0) -> None:
    """Poll ``condition`` (server state the test cannot be told about otherwise); fail
    at once if a job died."""
    deadline = time.monotonic() + timeout
    while not condition():
        for job in jobs:
            if job.poll() is not None:
                raise AssertionError(f"job exited {job.returncode}: {_err(job)}")
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)
