"""SIGKILL of the driver at the connector's crash points, with a job in a subprocess
(tests/spark/job.py).

One chain of runs (txn mode) on one checkpoint: every run is killed at the first fault
point still armed (each fires once), the next run restarts from the checkpoint, with
another partition count; the last run finishes. The output must hold every input
message exactly once. Each run costs a JVM start and a first batch (about 35 s on two
cores), so ``make test`` runs the ONE chain here: a single kill, where exactly once is
the hardest (the server has committed the batch, Spark's commit log has not), and the
restart from the checkpoint as a query of the test process's own session rather than a
second driver JVM. ``make test-slow`` runs the SHORT chain here (each crash point once,
four runs, about 2.5 minutes) and the FULL one, and the SHORT chain on the standalone
cluster of tests/spark/test_cluster.py. (Direct mode's replay deduplication is the same
mechanism as its task retry, tested in test_stream.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.spark import pipeline
from tests.spark.helpers import (
    assert_exactly_once,
    consumer_info,
    publish_numbers,
    read_topic,
)

ROOT = Path(__file__).resolve().parents[2]
RUN_S_MAX = 300


@dataclass(frozen=True)
class Chain:
    total: int  # messages
    batch: int  # maxRecordsPerBatch
    faults: str

    @property
    def kills(self) -> int:
        return self.faults.count("=kill")


# Batches of 20 over 60 messages: run 0 dies after the server committed batch 1, before
# Spark's commit log; the restart replays batch 1 (the commit answers "duplicate", and
# the source reads nothing: the sink acknowledged it with its output), then takes batch 2.
ONE = Chain(60, 20, "sink.committed.b1=kill")
# Batches of 20 over 60 messages: run 0 dies mid-batch 1 (partition 1 killed after
# staging, partition 0 may have staged); run 1 replays batch 1 and dies after leasing
# batch 2, before the offset log; run 2 dies after the server committed batch 2, before
# Spark's commit log; run 3 replays batch 2 (the commit answers "duplicate", and the
# source reads nothing: the sink acknowledged it with its output) and finishes.
SHORT = Chain(60, 20, "sink.written.b1.p1=kill,source.leased.d60=kill,sink.committed.b2=kill")
# The same over 4 batches of 50, plus an executor-side kill in the middle of a read.
FULL = Chain(200, 50, "sink.written.b1.p1=kill,source.leased.d150=kill,sink.committed.b2=kill,read.d200.p1=kill")


def run_job(uri: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """One driver run of tests/spark/job.py in a session of its own; whatever is left of
    its process group is SIGKILLed when it ends."""
    cmd = [sys.executable, "-m", "tests.spark.job", "--server", uri, "--checkpoint", str(tmp / "ck"),
           "--fault-dir", str(tmp), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=RUN_S_MAX)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_chain(uri: str, tmp: Path, chain: Chain, *extra: str) -> None:
    publish_numbers(uri, 0, chain.total)
    for run in range(chain.kills + 1):
        started = time.monotonic()
        result = run_job(uri, tmp, "--max-records", str(chain.batch), "--partitions", str(2 + run % 2),
                         "--faults", chain.faults, *extra)
        print(f"run {run}: exit {result.returncode} after {time.monotonic() - started:.1f}s, fired "
              f"{sorted(p.name for p in tmp.glob('fired-*'))}")
        if run < chain.kills:
            assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
        else:
            assert result.returncode == 0 and "DONE" in result.stdout, result.stderr[-3000:]
    assert len(list(tmp.glob("fired-*"))) == chain.kills
    assert_exactly_once(read_topic(uri, "out", chain.total), range(chain.total))
    info = consumer_info(uri, "etl")
    assert (info.d, info.acked) == (chain.total, chain.total)


@pytest.mark.timeout(RUN_S_MAX * (ONE.kills + 1))
def test_driver_sigkill_after_the_server_commit_is_exactly_once(spark, conveyor_server, tmp_path):
    """The ONE chain: run 0 (a driver subprocess) is SIGKILLed after the server committed
    batch 1, before Spark's commit log; the restart is a query of this process's session
    (no faults armed, another partition count) from run 0's checkpoint."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, ONE.total)
    result = run_job(uri, tmp_path, "--max-records", str(ONE.batch), "--faults", ONE.faults)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert [p.name for p in tmp_path.glob("fired-*")] == ["fired-sink.committed.b1"]
    query = pipeline.start(spark, uri=uri, consumer="etl", checkpoint=str(tmp_path / "ck"), max_records=ONE.batch,
                           partitions=3)
    assert query.awaitTermination(RUN_S_MAX), "the restarted query did not finish"
    assert query.exception() is None
    assert_exactly_once(read_topic(uri, "out", ONE.total), range(ONE.total))
    info = consumer_info(uri, "etl")
    assert (info.d, info.acked) == (ONE.total, ONE.total)


@pytest.mark.slow  # make test-slow: four driver runs (2.5 minutes); make test runs ONE, above
@pytest.mark.timeout(RUN_S_MAX * (SHORT.kills + 1))
def test_driver_sigkill_short_chain_is_exactly_once(conveyor_server, tmp_path):
    run_chain(conveyor_server.uri, tmp_path, SHORT)


@pytest.mark.slow  # make test-slow: five driver runs over 200 messages
@pytest.mark.timeout(RUN_S_MAX * (FULL.kills + 1))
def test_driver_sigkill_full_chain_is_exactly_once(conveyor_server, tmp_path):
    run_chain(conveyor_server.uri, tmp_path, FULL)
