"""The compiled build beside the same source as pure Python, in one run.

One git worktree of the revision, built as ``make build`` builds (``setup.py
build_ext --inplace``: the group ``conveyor.native.GROUP`` compiled by mypyc beside its
sources). Every measurement runs twice in that tree: as pure Python (``CONVEYOR_PURE=1``)
and compiled.

- instructions per message of the engine alone (``bench_instructions``' workloads,
  valgrind's callgrind): the same on every run, so the figure that says what compiling
  changed;
- server CPU per message with ``--cpu-rounds N`` > 0: ``bench_fill_cpu`` (a pipelined
  publisher filling a queue) and ``bench_drain_cpu`` (four consumer processes draining
  it), the two builds alternating, medians. These move with the machine's load.

    python -m bench.bench_compiled [--rev HEAD] [--workloads publish,queue,named] [--cpu-rounds 3]

docs/architecture.md, "The compiled build", says which modules compile and why;
docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_instructions import per_message, tree_env
from bench.report import median

ROOT = Path(__file__).resolve().parent.parent


def worktree(rev: str, path: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=ROOT, check=True)
    return path


def build(tree: Path) -> None:
    """The tree's compiled build, in place; fails unless its queue then imports from
    the extension module."""
    out = subprocess.run([sys.executable, "setup.py", "--quiet", "build_ext", "--inplace", "-j", "2"], cwd=tree,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the compiled build failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    check = subprocess.run([sys.executable, "-c", "import conveyor.native as n; print(n.describe())"],
                           cwd=tree, env=tree_env(tree, pure=False), capture_output=True, text=True, check=True)
    if not check.stdout.startswith("compiled"):
        raise SystemExit(f"the built tree runs {check.stdout.strip()} {check.stderr.strip()}")


def server_cpu(tree: Path, pure: bool) -> dict[str, float]:
    """Server µs of CPU per message: fill, drain with batched acks, drain acking each."""
    def run(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", *args], cwd=tree, env=tree_env(tree, pure), capture_output=True,
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
        tree = worktree(args.rev, Path(tmp) / "tree")
        try:
            build(tree)
            for kind in filter(None, args.workloads.split(",")):
                a, b = per_message(tree, kind, args.messages), per_message(tree, kind, args.messages, pure=False)
                rows.append((f"{kind} (instructions per message)", a, b))
                print(f"{kind}: pure {a:,.0f}, compiled {b:,.0f} instructions per message", flush=True)
            cpu: dict[str, dict[str, list[float]]] = {"pure": {}, "compiled": {}}
            for rnd in range(args.cpu_rounds):
                for name in ("pure", "compiled"):
                    for key, value in server_cpu(tree, pure=name == "pure").items():
                        cpu[name].setdefault(key, []).append(value)
                    print(f"round {rnd} {name}: {cpu[name]}", flush=True)
            for key in cpu["pure"]:
                rows.append((f"{key} (server µs per message, median of {args.cpu_rounds})",
                             median(cpu["pure"][key]), median(cpu["compiled"][key])))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    from conveyor.native import GROUP

    print(f"\n{len(GROUP)} modules compiled with mypyc, at {args.rev}\n")
    print("| workload | pure Python | compiled | compiled / pure |\n| --- | ---: | ---: | ---: |")
    for name, a, b in rows:
        print(f"| {name} | {a:,.2f} | {b:,.2f} | {b / a:.3f} |")
    print(json.dumps({name: {"pure": a, "compiled": b} for name, a, b in rows}))


if __name__ == "__main__":
    main()
