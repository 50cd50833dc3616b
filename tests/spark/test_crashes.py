"""SIGKILL of the driver at the points SPARK.md 4 names, with a job in a subprocess.

One chain of runs (txn mode) on one checkpoint: every run is killed at the first fault
point still armed (each fires once), the next run restarts from the checkpoint, with
another partition count (4.4); the last run finishes. The output must hold every input
message exactly once. (Direct mode's replay deduplication is the same mechanism as its
task retry, tested in test_stream.py; each run here costs a JVM start.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.spark.helpers import (
    assert_exactly_once,
    consumer_info,
    publish_numbers,
    read_topic,
)

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 200

CHAINS = {
    # batches of 50: run 0 dies mid-batch 1 (4.5: partition 1 killed after writing, partition
    # 0 may have staged); run 1 replays batch 1 and dies after leasing batch 2, before
    # the offset log (4.1); run 2 dies after the server committed batch 2, before
    # Spark's commit log (4.6); run 3 replays batch 2 (the commit answers "duplicate")
    # and finishes. Partition counts alternate 2, 3, 2, 3 (4.4).
    "txn": "sink.written.b1.p1=kill,source.leased.d150=kill,sink.committed.b2=kill",
}


def run_job(uri: str, tmp: Path, mode: str, partitions: int) -> subprocess.CompletedProcess:
    args = [
        sys.executable, "-m", "tests.spark.job", "--server", uri, "--checkpoint", str(tmp / "ck"),
        "--mode", mode, "--partitions", str(partitions), "--faults", CHAINS[mode], "--fault-dir", str(tmp),
    ]
    proc = subprocess.Popen(args, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of that run's group
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def test_driver_sigkill_chain_is_exactly_once(conveyor_server, tmp_path, mode="txn"):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, TOTAL)
    kills = CHAINS[mode].count("=kill")
    for run in range(kills + 1):
        started = time.monotonic()
        result = run_job(uri, tmp_path, mode, partitions=2 + run % 2)
        print(f"run {run}: exit {result.returncode} after {time.monotonic() - started:.1f}s, fired "
              f"{sorted(p.name for p in tmp_path.glob('fired-*'))}")
        if run < kills:
            assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
        else:
            assert result.returncode == 0 and "DONE" in result.stdout, result.stderr[-3000:]
    assert len(list(tmp_path.glob("fired-*"))) == kills
    assert_exactly_once(read_topic(uri, "out", TOTAL), range(TOTAL))
    info = consumer_info(uri, "etl")
    assert (info["d"], info["acked"]) == (TOTAL, TOTAL)
