"""Which seeds a deterministic simulation runs: ``CONVEYOR_SIM_SEED=N`` replays one,
``CONVEYOR_SIM_SEEDS=N`` runs the first N, otherwise the simulation's default count
times ``CONVEYOR_SIM_SCALE`` (a fraction: ``make check`` runs 5% of the seeds, ``make
test`` 10%, ``make test-slow`` all of them; plain ``pytest`` runs all of them too).
Seeds are grouped into test cases of ``batch`` so a failing case still names its seed."""

from __future__ import annotations

import os


def sim_seeds(default: int) -> list[int]:
    one = os.environ.get("CONVEYOR_SIM_SEED")
    if one is not None:
        return [int(one)]
    count = os.environ.get("CONVEYOR_SIM_SEEDS")
    if count is not None:
        return list(range(int(count)))
    scale = float(os.environ.get("CONVEYOR_SIM_SCALE", "1"))
    return list(range(max(1, round(default * scale))))


def seed_batches(default: int, batch: int) -> list[list[int]]:
    seeds = sim_seeds(default)
    return [seeds[i : i + batch] for i in range(0, len(seeds), batch)]
