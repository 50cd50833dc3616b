"""Which seeds a deterministic simulation runs: ``CONVEYOR_SIM_SEED=N`` replays one,
``CONVEYOR_SIM_SEEDS=N`` runs the first N, otherwise the simulation's default count.
Seeds are grouped into test cases of ``batch`` so a failing case still names its seed."""

from __future__ import annotations

import os


def sim_seeds(default: int) -> list[int]:
    one = os.environ.get("CONVEYOR_SIM_SEED")
    if one is not None:
        return [int(one)]
    return list(range(int(os.environ.get("CONVEYOR_SIM_SEEDS", default))))


def seed_batches(default: int, batch: int) -> list[list[int]]:
    seeds = sim_seeds(default)
    return [seeds[i : i + batch] for i in range(0, len(seeds), batch)]
