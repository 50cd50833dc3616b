"""The server-steps benchmark of a Spark micro-batch still runs (tiny sizes: a smoke
test, not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_spark_steps_quick():
    out = subprocess.run([sys.executable, "-m", "bench.bench_spark_steps", "--messages", "2000", "--rounds", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("round ") == 2
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(figures) == {"lease", "fetch", "stage", "commit", "end", "source"}
    assert all(value >= 0 for value in figures.values())
