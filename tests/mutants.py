"""The mutation check of the queue's parts (docs/testing.md): each mutant is one
deliberate bug, put into a copy of the tree (never into this one); the two simulations
and the queue's other tests run against it, and a mutant that nothing catches is a
missing test.

``python -m tests.mutants`` runs every mutant and prints the table of docs/testing.md;
``--only M4 M12`` some of them; ``--seeds N`` the seeds per simulation (2,000);
``-O`` runs everything without ``__debug__`` checks. A mutant whose text no longer
appears exactly once in its module fails loudly: the code moved, update the mutant.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINE = "src/conveyor/engine"
#: The queue's tests other than the simulations (the "other tests" column).
OTHER_TESTS = ("tests/engine/test_queue_*.py", "tests/engine/test_named_consumers.py", "tests/engine/test_fbm_recovery.py")
SIMULATIONS = ("tests/engine/test_queue_sim.py", "tests/engine/test_engine_sim.py")


@dataclass(frozen=True)
class Mutant:
    id: str
    part: str
    what: str
    module: str  # under src/conveyor/engine
    old: str  # appears exactly once in the module
    new: str


MUTANTS = (
    Mutant("M1", "LeaseTable", "a lease not removed on ack", "queue/leases.py",
           "self._release(self.leased.pop(p).seat, p)", "self._release(self.leased[p].seat, p)"),
    Mutant("M2", "LeaseTable", "cancel count not incremented", "queue/leases.py",
           "n = self._cancels[p] = self._cancels.get(p, 0) + 1", "n = self._cancels[p] = self._cancels.get(p, 0)"),
    Mutant("M3", "LeaseTable", "expiry reason `max_deliveries` dropped", "queue/leases.py",
           "found.append(ExpiryReason.MAX_DELIVERIES)", "pass"),
    Mutant("M4", "LeaseTable", "stale deadline not recognised: a renewed lease expires at its old deadline",
           "queue/leases.py",
           "if lease is None or lease.deadline != d:\n                continue  # stale",
           "if lease is None:\n                continue  # stale"),
    Mutant("M5", "LeaseTable", "backlog slot not freed when an at-most-once delivery is acknowledged",
           "queue/leases.py",
           "seat = self.consumed.pop(p)\n        self._release(seat, p)",
           "seat = self.consumed.pop(p)\n        seat.held.discard(p)"),
    Mutant("M6", "Seats", "round-robin cursor not advanced", "queue/seats.py",
           "self._rr_next = i + 1", "self._rr_next = self._rr_next"),
    Mutant("M7", "Seats", "round-robin cursor not moved back when a consumer before it leaves", "queue/seats.py",
           "self._rr_next -= 1  # rule 2", "pass  # rule 2"),
    Mutant("M8", "Seats", "a filtered cursor skips a message it never evaluated", "queue/seats.py",
           "seat.cursor = k + 1", "seat.cursor = k + 2"),
    Mutant("M9", "Seats", "a message coming back behind a filtered cursor is not offered to that consumer",
           "queue/seats.py",
           "                heappush(seat.candidates, key)\n", "                pass\n"),
    Mutant("M10", "ActiveWindow", "off-by-one: one message too many active", "queue/window.py",
           "return bool(self.inactive) or active >= self.target", "return bool(self.inactive) or active > self.target"),
    Mutant("M11", "ActiveWindow", "a deferred ack not consumed by its offer", "queue/window.py",
           "acked = position in acks", "acked = False"),
    Mutant("M12", "ActiveWindow", "deferred acks not dropped once the refill passes them", "queue/window.py",
           "acks.discard(heappop(heap))  # passed", "heappop(heap)  # passed"),
    Mutant("M13", "Queue", "off-by-one in the backlog: a consumer gets `max_backlog + 1`", "queue/queue.py",
           "if c.outstanding >= c.max_backlog:\n                    continue",
           "if c.outstanding > c.max_backlog:\n                    continue"),
    Mutant("M14", "DeliveryOrder / Queue", "barrier released while an at-most-once delivery awaits its ack",
           "queue/queue.py",
           "if b is not None and not leases.leased and not leases.consumed and",
           "if b is not None and not leases.leased and"),
    Mutant("M15", "DeliveryOrder", "a returned message not put back in the first priority epoch", "queue/order.py",
           "            self._epochs[0].add(key)\n\n    def insert", "            self._epochs[-1].add(key)\n\n    def insert"),
    Mutant("M16", "transitions", "wrong from-state: an available message acknowledged as if leased", "queue/queue.py",
           "self._transitions.move(p, Verb.ACKNOWLEDGE if option is AckOption.NONE else Verb.EXPIRE, _AVAILABLE)",
           "self._transitions.move(p, Verb.ACKNOWLEDGE if option is AckOption.NONE else Verb.EXPIRE, _LEASED)"),
    Mutant("M17", "transitions", "wrong verb in replay: an at-least-once removal replayed as DELIVER",
           "queue/recovery.py",
           "self._removal(position, Verb.ACKNOWLEDGE)", "self._removal(position, Verb.DELIVER)"),
    Mutant("M18", "transitions", "a forced expiry of a lease that does not end the lease", "queue/queue.py",
           "self._transitions.move(p, Verb.EXPIRE, _LEASED)\n                leases.end(p)\n",
           "self._transitions.move(p, Verb.EXPIRE, _LEASED)\n"),
    Mutant("M19", "LeaseTable", "counts kept after an expiry (`forget` not called)", "queue/returns.py",
           "        leases.forget(p)\n        self._replica.forget(p)\n",
           "        self._replica.forget(p)\n"),
    Mutant("M20", "transitions", "wrong from-state the table allows: the Expiration sweep names the message LEASED",
           "queue/queue.py",
           "p = head\n                self._transitions.move(p, Verb.EXPIRE, _AVAILABLE)",
           "p = head\n                self._transitions.move(p, Verb.EXPIRE, _LEASED)"),
    Mutant("M21", "transitions", "the state derivation misses the lease table (`state_of` never says LEASED)",
           "queue/queue.py",
           "if position in leases.leased:\n            return _LEASED\n        if position in leases.consumed:",
           "if False:\n            return _LEASED\n        if position in leases.consumed:"),
    Mutant("M22", "Replica", "an identity not forgotten on ack (the replica part misses acknowledgements)",
           "queue/state.py",
           "GONE = frozenset({S.ACKNOWLEDGED, S.EXPIRED, S.CONSUMED})",
           "GONE = frozenset({S.EXPIRED, S.CONSUMED})"),
)

#: Runs one simulation in the mutated copy, seed by seed from 0: the first failing seed
#: and how it failed, or "not caught".
_SIM_DRIVER = """
import sys
import conveyor
assert conveyor.__file__.startswith(sys.argv[3]), conveyor.__file__  # the mutated copy
which, seeds = sys.argv[1], int(sys.argv[2])
if which == "queue":
    from tests.engine.test_queue_sim import run_seed as run
else:
    from tests.engine.test_engine_sim import Sim
    def run(seed):
        Sim(seed).run()
for seed in range(seeds):
    try:
        run(seed)
    except BaseException as exc:  # pytest's Failed is a BaseException
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"seed {seed} ({type(exc).__name__})")
        break
else:
    print("not caught")
"""


def mutate(tree: Path, mutant: Mutant) -> None:
    path = tree / ENGINE / mutant.module
    text = path.read_text()
    found = text.count(mutant.old)
    if found != 1:
        raise SystemExit(f"{mutant.id}: its text appears {found} times in {mutant.module}, not once: "
                         "the code moved; update the mutant in tests/mutants.py")
    path.write_text(text.replace(mutant.old, mutant.new))


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for part in ("src", "tests", "pyproject.toml"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        else:
            shutil.copy2(src, dest / part)


def run_simulation(tree: Path, which: str, seeds: int, flags: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}{os.pathsep}{tree}")
    out = subprocess.run([sys.executable, *flags, "-c", _SIM_DRIVER, which, str(seeds), str(tree / "src")],
                         cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return f"error: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
    return out.stdout.strip().splitlines()[-1]


def run_other_tests(tree: Path, flags: list[str]) -> str:
    files = sorted({str(p.relative_to(tree)) for pattern in OTHER_TESTS for p in tree.glob(pattern)}
                   - set(SIMULATIONS))
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}{os.pathsep}{tree}")
    out = subprocess.run([sys.executable, *flags, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *files],
                         cwd=tree, env=env, capture_output=True, text=True)
    failed = re.search(r"(\d+) failed", out.stdout)
    if not failed:
        return "none" if out.returncode == 0 else f"error (exit {out.returncode})"
    first = re.search(r"^FAILED \S+::(\w+)", out.stdout, re.M)
    return f"{failed.group(1)}, e.g. `{first.group(1)}`" if first else failed.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="mutant ids (M1 ...)")
    parser.add_argument("--seeds", type=int, default=2000, help="seeds per simulation")
    parser.add_argument("-O", dest="optimized", action="store_true", help="without __debug__ checks")
    args = parser.parse_args()
    flags = ["-O"] if args.optimized else []
    chosen = [m for m in MUTANTS if args.only is None or m.id in args.only]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    print(f"commit {rev}; {args.seeds} seeds per simulation{'; python -O' if args.optimized else ''}\n")
    print("| id | part | mutation (module) | queue simulation | engine simulation | other tests failing (first listed) |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="conveyor-mutants-") as base:
        clean = Path(base) / "clean"
        copy_tree(clean)
        # The unmutated copy first: everything must pass there, or the rows mean nothing.
        baseline = (run_simulation(clean, "queue", args.seeds, flags), run_simulation(clean, "engine", args.seeds, flags),
                    run_other_tests(clean, flags))
        if baseline != ("not caught", "not caught", "none"):
            raise SystemExit(f"the unmutated tree fails ({baseline}): fix that first")
        print(f"| M0 | (none) | the tree as it is | {args.seeds} seeds pass | {args.seeds} seeds pass | none |", flush=True)
        for mutant in chosen:
            started = time.monotonic()
            tree = Path(base) / mutant.id
            shutil.copytree(clean, tree)
            mutate(tree, mutant)
            queue = run_simulation(tree, "queue", args.seeds, flags)
            engine = run_simulation(tree, "engine", args.seeds, flags)
            others = run_other_tests(tree, flags)
            print(f"| {mutant.id} | {mutant.part} | {mutant.what} (`{mutant.module}`) | {queue} | {engine} | {others} |",
                  flush=True)
            print(f"<!-- {mutant.id}: {time.monotonic() - started:.0f} s -->", file=sys.stderr, flush=True)
            shutil.rmtree(tree)


if __name__ == "__main__":
    main()
