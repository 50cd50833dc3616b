"""``make soak``: the queue checker (checker.py) over many server kills, with the table.

usage: python -m tests.faults.soak [--kills 1000] [--round 100] [--seed N] [--jobs N] [--replicated] [--dir DIR]

The kills run in rounds of ``--round`` kills, each round a fresh server and journal
with its own seed (derived from ``--seed``), so that a long soak also covers many
starts from an empty journal and keeps each journal small. ``--jobs`` rounds run at
once, each in its own process with its own server (the seeds do not depend on it).
``--replicated``: the server replicates to a sync replica and each fault strikes one of
the two (checker.py). The table adds the rounds up; a failing round prints its seed and what went wrong, and
the command exits 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.faults.checker import Verdict, run_sync


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1000, help="server kills in all (default 1000)")
    parser.add_argument("--round", type=int, default=100, help="kills per server and journal (default 100)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the whole soak (default: random)")
    parser.add_argument("--jobs", type=int, default=1, help="rounds at once (default 1)")
    parser.add_argument("--replicated", action="store_true", help="with a sync replica (checker.py)")
    parser.add_argument("--dir", help="where the journals go (default: a temporary directory)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print(f"soak: {args.kills} kills in rounds of {args.round}, seed {seed}", flush=True)
    started = time.monotonic()
    total: Verdict | None = None
    rounds = []  # (round number, seed, kills)
    done = 0
    while done < args.kills:
        kills = min(args.round, args.kills - done)
        rounds.append((len(rounds) + 1, rng.randrange(2**32), kills))
        done += kills
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, \
            concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            pool.submit(_round, Path(tmp) / f"round-{k}", round_seed, kills, args.replicated): (k, round_seed)
            for k, round_seed, kills in rounds
        }
        for future in concurrent.futures.as_completed(futures):
            k, round_seed = futures[future]
            verdict = future.result()
            print(f"round {k}: seed {round_seed}: {verdict.kills} kills, {verdict.acknowledged} acknowledged, "
                  f"lost {verdict.lost}, duplicated {verdict.duplicated}, unexpected {verdict.unexpected}, "
                  f"{verdict.seconds:.0f} s", flush=True)
            if not verdict.ok:
                print("\n".join(verdict.details[-80:]))
            total = verdict if total is None else _add(total, verdict)
    assert total is not None
    total = _add(total, None, seconds=time.monotonic() - started)
    jobs = (f" --jobs {args.jobs}" if args.jobs > 1 else "") + (" --replicated" if args.replicated else "")
    print(f"\nconveyor soak, seed {seed} (python -m tests.faults.soak --kills {args.kills} --seed {seed}{jobs}):")
    print(total.table())
    return 0 if total.ok else 1


def _round(directory: Path, seed: int, kills: int, replicated: bool) -> Verdict:
    directory.mkdir()
    return run_sync(directory, seed=seed, kills=kills, replicated=replicated)


def _add(a: Verdict, b: Verdict | None, *, seconds: float | None = None) -> Verdict:
    if b is None:
        b = Verdict(0, Counter(), 0, 0, 0, 0, 0, 0, 0, 0.0, [])
    return Verdict(
        kills=a.kills + b.kills,
        faults=a.faults + b.faults,
        acknowledged=a.acknowledged + b.acknowledged,
        lost=a.lost + b.lost,
        duplicated=a.duplicated + b.duplicated,
        unexpected=a.unexpected + b.unexpected,
        recovered=a.recovered + b.recovered,
        redelivered=a.redelivered + b.redelivered,
        consumer_resets=a.consumer_resets + b.consumer_resets,
        seconds=seconds if seconds is not None else a.seconds + b.seconds,
        details=[],
    )

if __name__ == "__main__":
    sys.exit(main())
