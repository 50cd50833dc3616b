"""The journal benchmark still runs (tiny sizes: a smoke test, not a measurement)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_journal_quick():
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_journal", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert "| append+commit, 1000 per commit (fsync) |" in out
    assert "| scan of " in out
