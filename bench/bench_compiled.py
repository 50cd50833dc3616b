"""The server compiled with mypyc beside the same source uncompiled, in one run.

Both trees are git worktrees of one revision. In the compiled one, mypyc builds the
modules of ``COMPILED`` into extension modules beside their sources (Python imports an
extension module ahead of a ``.py`` of the same name); everything else stays Python.
The build runs from the tree's ``src`` directory, with mypy's default options.

Two measurements, each against the uncompiled tree in the same run:

- instructions per message of the engine alone (``bench_instructions``' workloads,
  valgrind's callgrind): the same on every run, so the figure that says what compiling
  changed;
- server CPU per message with ``--cpu-rounds N`` > 0: ``bench_fill_cpu`` (a pipelined
  publisher filling a queue) and ``bench_drain_cpu`` (four consumer processes draining
  it), the two trees alternating, medians. These move with the machine's load.

    python -m bench.bench_compiled [--rev HEAD] [--workloads publish,queue,named] [--cpu-rounds 3]

The compiled build is a measurement, not how conveyor runs: docs/architecture.md,
"Compiled modules", says which modules compile, what stops the rest and what it gave.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_instructions import per_message
from bench.report import median

ROOT = Path(__file__).resolve().parent.parent

#: The modules compiled, as one group (calls between them are native): the engine's
#: command path, delivery, named consumers, transactions, the queue's parts, the payload
#: cache, the publish log, the outbox, topic routing and the JSON check. Left out, with
#: the reason (docs/architecture.md, "Compiled hot paths"): the modules of msgspec
#: records (engine/rows.py, engine/queue/rows.py, queue/events.py, queue/snapshot.py,
#: the protocol's messages: mypyc drops a Struct's class options and its fields' generic
#: types), the frame codec (the replication link's decoder, a Python class, subclasses
#: its decoder), queue/report.py (a ``__slots__`` mypyc refuses), engine/ports.py
#: (runtime-checkable protocols); the rest of the tree is not on a message's path.
COMPILED = [
    "conveyor/protocol/payload.py",
    *(f"conveyor/engine/{name}.py" for name in (
        "core", "consumers", "delivery", "subscribing", "routes", "fingerprints", "sessions", "txn", "actions",
        "cache", "outbox", "publish_log", "topics", "replication/held_delivery",
    )),
    *(f"conveyor/engine/queue/{name}.py" for name in (
        "budget", "store", "priority", "paging", "state", "recovery", "seats", "window", "keys", "order",
        "consumer", "expiry", "intake", "leases", "named", "transfers", "returns", "replica", "queue", "bindings",
    )),
]


def worktree(rev: str, path: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=ROOT, check=True)
    return path


def build(tree: Path) -> None:
    """mypyc builds ``COMPILED`` in place (from ``src``: the project's pyproject.toml is
    for the package, not for this build)."""
    out = subprocess.run([sys.executable, "-m", "mypyc", *COMPILED], cwd=tree / "src", capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    built = sorted((tree / "src" / "conveyor").rglob("*.so"))
    if len(built) != len(COMPILED):
        raise SystemExit(f"mypyc built {len(built)} extension modules for {len(COMPILED)} sources")
    check = subprocess.run([sys.executable, "-c", "import conveyor.engine.queue.queue as q; print(q.__file__)"],
                           cwd=tree, env=env_of(tree), capture_output=True, text=True, check=True)
    if not check.stdout.strip().endswith(".so"):
        raise SystemExit(f"the compiled tree imports {check.stdout.strip()}, not its extension module")


def env_of(tree: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{tree / 'src'}:{tree}", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp")}


def server_cpu(tree: Path) -> dict[str, float]:
    """Server µs of CPU per message: fill, drain with batched acks, drain acking each."""
    def run(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", *args], cwd=tree, env=env_of(tree), capture_output=True,
                             text=True, check=True)
        return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])

    fill = run("bench.bench_fill_cpu", "--messages", "200000")
    drain = run("bench.bench_drain_cpu", "--messages", "100000")
    return {"fill": fill["server_us_per_msg"], "drain, acks batched": drain["batched"]["server_us_per_msg"],
            "drain, acks each": drain["each"]["server_us_per_msg"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--workloads", default="publish,queue,named")
    ap.add_argument("--cpu-rounds", type=int, default=0)
    args = ap.parse_args()
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        pure, compiled = worktree(args.rev, Path(tmp) / "pure"), worktree(args.rev, Path(tmp) / "compiled")
        try:
            build(compiled)
            for kind in filter(None, args.workloads.split(",")):
                a, b = per_message(pure, kind, args.messages), per_message(compiled, kind, args.messages)
                rows.append((f"{kind} (instructions per message)", a, b))
                print(f"{kind}: pure {a:,.0f}, compiled {b:,.0f} instructions per message", flush=True)
            cpu: dict[str, dict[str, list[float]]] = {"pure": {}, "compiled": {}}
            for rnd in range(args.cpu_rounds):
                for name, tree in (("pure", pure), ("compiled", compiled)):
                    for key, value in server_cpu(tree).items():
                        cpu[name].setdefault(key, []).append(value)
                    print(f"round {rnd} {name}: {cpu[name]}", flush=True)
            for key in cpu["pure"]:
                rows.append((f"{key} (server µs per message, median of {args.cpu_rounds})",
                             median(cpu["pure"][key]), median(cpu["compiled"][key])))
        finally:
            for tree in (pure, compiled):
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    print(f"\n{len(COMPILED)} modules compiled with mypyc, at {args.rev}\n")
    print("| workload | pure Python | compiled | compiled / pure |\n| --- | ---: | ---: | ---: |")
    for name, a, b in rows:
        print(f"| {name} | {a:,.2f} | {b:,.2f} | {b / a:.3f} |")
    print(json.dumps({name: {"pure": a, "compiled": b} for name, a, b in rows}))


if __name__ == "__main__":
    main()
