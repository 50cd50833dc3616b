"""The queue checker: 50 server kills of every kind, 0 lost, 0 duplicated, 0 unexpected,
and 10 more with a sync replica, either instance struck. ``make test`` runs the 10 with
the replica (every kind of fault, on the source or the replica, about 25 s); the 50 are
marked slow (``make test-slow``: about two minutes on two cores, the longest test of
``make test`` when they were in it). ``make soak`` runs the same checker for 1,000 kills
(tests/faults/soak.py; ``--replicated`` for the replica)."""

from __future__ import annotations

import os
import random

import pytest

from tests.faults.checker import run_sync

KILLS_CI = 50
KILLS_REPLICATED_CI = 10


def _check(tmp_path, kills: int, **kw) -> None:
    seed = int(os.environ.get("CONVEYOR_CHECKER_SEED", random.randrange(2**32)))
    print(f"seed={seed} (replay: CONVEYOR_CHECKER_SEED={seed})")  # shown if the run raises
    verdict = run_sync(tmp_path, seed=seed, kills=kills, **kw)
    report = f"seed={seed}\n{verdict.table()}\n" + "\n".join(verdict.details[-60:])
    print(report)
    assert verdict.ok, report
    assert verdict.acknowledged > 0 and verdict.kills >= kills, report


@pytest.mark.slow  # make test-slow: see the module's docstring
def test_fifty_kills_lose_nothing_acknowledged_and_duplicate_nothing(tmp_path):
    _check(tmp_path, KILLS_CI)


def test_kills_of_a_sync_replica_or_its_source_lose_nothing_acknowledged(tmp_path):
    _check(tmp_path, KILLS_REPLICATED_CI, replicated=True)
