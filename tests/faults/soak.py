"""``make soak``: the queue checker (checker.py) over many server kills, with the table.

usage: python -m tests.faults.soak [--kills 1000] [--round 100] [--seed N] [--jobs N] [--replicated] [--dir DIR]
       python -m tests.faults.soak --partitions [--kills 500] [--round 50] [--topology chain|mesh|both] ...

The kills run in rounds of ``--round`` kills, each round a fresh server and journal
with its own seed (derived from ``--seed``), so that a long soak also covers many
starts from an empty journal and keeps each journal small. ``--jobs`` rounds run at
once, each in its own process with its own server (the seeds do not depend on it).
``--replicated``: the server replicates to a sync replica and each fault strikes one of
the two (checker.py). The table adds the rounds up; a failing round prints its seed and what went wrong, and
the command exits 1.

``--partitions``: the partition mode (partitions.py): three instances sharing a
replicated queue, every replication link through a proxy the nemesis cuts, delays and
heals, the process faults on top; ``--kills`` then counts every fault, network or
process, and rounds alternate the chain and the mesh (``--topology`` picks one). Its
table: faults, partitions, lost, duplicated, processed twice (in and outside the window
docs/replication.md states), unexpected, stuck, owner disagreement.
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

from tests.faults import partitions
from tests.faults.checker import Verdict, run_sync


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=None,
                        help="server kills in all (default 1000; --partitions: faults in all, default 500)")
    parser.add_argument("--round", type=int, default=None,
                        help="kills per server and journal (default 100; --partitions: 50)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the whole soak (default: random)")
    parser.add_argument("--jobs", type=int, default=1, help="rounds at once (default 1)")
    parser.add_argument("--replicated", action="store_true", help="with a sync replica (checker.py)")
    parser.add_argument("--partitions", action="store_true",
                        help="the partition mode: three instances, a replicated queue, links cut (partitions.py)")
    parser.add_argument("--topology", choices=("chain", "mesh", "both"), default="both",
                        help="--partitions: the topology of every round (default both, alternating)")
    parser.add_argument("--dir", help="where the journals go (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.partitions:
        return _main_partitions(args)
    args.kills = 1000 if args.kills is None else args.kills
    args.round = 100 if args.round is None else args.round
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


def _main_partitions(args) -> int:
    faults_all = 500 if args.kills is None else args.kills
    per_round = 50 if args.round is None else args.round
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print(f"soak --partitions: {faults_all} faults in rounds of {per_round}, seed {seed}", flush=True)
    started = time.monotonic()
    rounds = []  # (round number, seed, faults, topology)
    done = 0
    while done < faults_all:
        n = min(per_round, faults_all - done)
        k = len(rounds) + 1
        topology = args.topology if args.topology != "both" else partitions.TOPOLOGIES[(k - 1) % 2]
        rounds.append((k, rng.randrange(2**32), n, topology))
        done += n
    total: partitions.PartitionVerdict | None = None
    failed = False
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, \
            concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            pool.submit(_partition_round, Path(tmp) / f"round-{k}", round_seed, n, topology): (k, round_seed, topology)
            for k, round_seed, n, topology in rounds
        }
        for future in concurrent.futures.as_completed(futures):
            k, round_seed, topology = futures[future]
            try:
                v = future.result()
            except Exception as exc:  # noqa: BLE001 (a round that could not finish: say which, go on)
                failed = True
                print(f"round {k}: seed {round_seed}, {topology}: FAILED TO FINISH: {exc!r}", flush=True)
                continue
            print(f"round {k}: seed {round_seed}, {topology}: {sum(v.faults.values()) + sum(v.partitions.values())} "
                  f"faults ({sum(v.partitions.values())} partitions), {v.acknowledged} acknowledged, lost {v.lost}, "
                  f"duplicated {v.duplicated}, processed twice {v.processed_twice} "
                  f"({v.processed_twice_outside_window} outside the window), unexpected {v.unexpected}, "
                  f"stuck {v.stuck}, owner disagreement {v.owner_disagreement}, {v.seconds:.0f} s", flush=True)
            if not v.ok:
                failed = True
                print("\n".join(v.details[-80:]))
            total = v if total is None else _add_partitions(total, v)
    if total is None:
        return 1
    total.seconds = time.monotonic() - started
    chains = sum(1 for r in rounds if r[3] == "chain")
    total.topology = f"chain {chains} rounds, mesh {len(rounds) - chains} rounds"
    jobs = f" --jobs {args.jobs}" if args.jobs > 1 else ""
    topo = f" --topology {args.topology}" if args.topology != "both" else ""
    print(f"\nconveyor soak --partitions, seed {seed} (python -m tests.faults.soak --partitions --kills {faults_all} "
          f"--round {per_round} --seed {seed}{jobs}{topo}):")
    print(total.table())
    return 0 if total.ok and not failed else 1


def _partition_round(directory: Path, seed: int, faults: int, topology: str) -> partitions.PartitionVerdict:
    directory.mkdir()
    return partitions.run_sync(directory, seed=seed, faults=faults, topology=topology)


def _add_partitions(a: partitions.PartitionVerdict, b: partitions.PartitionVerdict) -> partitions.PartitionVerdict:
    quiet = [w for w in (a.quiet_window_s, b.quiet_window_s) if w is not None]
    return partitions.PartitionVerdict(
        topology=a.topology, faults=a.faults + b.faults, partitions=a.partitions + b.partitions,
        kills=a.kills + b.kills, acknowledged=a.acknowledged + b.acknowledged, lost=a.lost + b.lost,
        duplicated=a.duplicated + b.duplicated, processed_twice=a.processed_twice + b.processed_twice,
        processed_twice_in_window=a.processed_twice_in_window + b.processed_twice_in_window,
        unexpected=a.unexpected + b.unexpected, stuck=a.stuck + b.stuck,
        owner_disagreement=a.owner_disagreement + b.owner_disagreement,
        owners_compared=a.owners_compared + b.owners_compared, two_copies=a.two_copies + b.two_copies,
        transfers=a.transfers + b.transfers,
        unsettled=a.unsettled + b.unsettled,
        window_s=max(a.window_s, b.window_s), quiet_window_s=max(quiet) if quiet else None,
        publisher_failovers=a.publisher_failovers + b.publisher_failovers,
        republished=a.republished + b.republished, consumer_moves=a.consumer_moves + b.consumer_moves,
        redelivered=a.redelivered + b.redelivered, seconds=a.seconds + b.seconds, details=[],
    )


if __name__ == "__main__":
    sys.exit(main())
