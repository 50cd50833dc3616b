"""The queue checker in CI: 50 server kills of every kind, 0 lost, 0 duplicated, 0
unexpected. ``make soak`` runs the same checker for 1,000 kills (tests/faults/soak.py)."""

from __future__ import annotations

import os
import random

from tests.faults.checker import run_sync

KILLS_CI = 50


def test_fifty_kills_lose_nothing_acknowledged_and_duplicate_nothing(tmp_path):
    seed = int(os.environ.get("CONVEYOR_CHECKER_SEED", random.randrange(2**32)))
    verdict = run_sync(tmp_path, seed=seed, kills=KILLS_CI)
    report = f"seed={seed} (replay: CONVEYOR_CHECKER_SEED={seed})\n{verdict.table()}\n" + "\n".join(verdict.details[-60:])
    print(report)
    assert verdict.ok, report
    assert verdict.acknowledged > 0 and verdict.kills >= KILLS_CI, report
