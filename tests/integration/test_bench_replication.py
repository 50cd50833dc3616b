"""The replication benchmark's publish workload still runs, in both placements (tiny
sizes: a smoke test, not a measurement)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_replication_publish_quick():
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_replication", "--only", "publish", "--catchup", "0",
         "--publish-rounds", "1", "--messages", "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    out = out.stdout
    assert "| shared | one `async` destination |" in out
    if len(os.sched_getaffinity(0)) >= 2:
        assert "| own core | one `sync` destination |" in out
        assert out.count("round 1 publish") == 6  # three layouts, two placements
