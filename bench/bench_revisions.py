"""The same workloads on two revisions of conveyor, interleaved in one run.

For a change that must not cost speed (the engine rebuilt into owned parts, say):
persisted publish (bench_publish), a 4-consumer queue drain (bench_queue) and the bare
priority queue's dispatch (bench_queue_priority), each run on revision A then B, round
after round, so that both see the same machine and load. Each revision is checked out
into a temporary git worktree and imported from there (``PYTHONPATH``; the server
processes inherit it); the workload code is this checkout's ``bench/``.

    python -m bench.bench_revisions BASE [HEAD] [--rounds 3] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.report import machine, median, write_section

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS = {
    "publish": ("persisted publish, 50,000 x 256 B, one pipelined client (msg/s)", """
import tempfile, uvloop
from pathlib import Path
from bench.bench_publish import start_conveyor, conveyor_run
with tempfile.TemporaryDirectory() as d:
    proc, port = start_conveyor(Path(d))
    try:
        pub_s, _ = uvloop.run(conveyor_run(port, 50_000))
    finally:
        proc.terminate(); proc.wait(timeout=60)
print(50_000 / pub_s)
"""),
    "publish_cpu": ("persisted publish, server CPU per message, 6 x 50,000 x 256 B (µs; lower is better)", """
import os, tempfile, uvloop
from pathlib import Path
from bench.bench_publish import start_conveyor, publish_only
def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
with tempfile.TemporaryDirectory() as d:
    proc, port = start_conveyor(Path(d))
    try:
        uvloop.run(publish_only(port, 10_000))  # warm up: imports, first segment
        before = cpu_s(proc.pid)
        for _ in range(6):
            uvloop.run(publish_only(port, 50_000))
        used = cpu_s(proc.pid) - before
    finally:
        proc.terminate(); proc.wait(timeout=60)
print(1e6 * used / 300_000)
"""),
    "drain": ("queue drain, 50,000 x 256 B, 4 consumer processes, backlog 10 (msg/s)", """
import tempfile
from pathlib import Path
from bench.bench_queue import measure_drain
with tempfile.TemporaryDirectory() as d:
    print(measure_drain("conveyor", 50_000, Path(d)))
"""),
    "priority": ("priority queue dispatch + ack, 200,000 queued, bare Queue (msg/s)", """
from bench.bench_queue_priority import _priorities, throughput
n = 200_000
print(throughput(n, n, _priorities(n))[0])
"""),
}


def _fmt(value: float) -> str:
    """Rates as whole numbers; small figures (µs per message) with two decimals."""
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def checkout(rev: str, into: Path) -> Path:
    path = into / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


def measure(tree: Path, code: str) -> float:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{tree.name}: {out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("head", nargs="?", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=sorted(WORKLOADS), action="append", help="run only these workloads")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    workloads = {name: WORKLOADS[name] for name in (args.only or WORKLOADS)}
    loads = [" / ".join(f"{x:.1f}" for x in os.getloadavg())]
    results: dict[str, dict[str, list[float]]] = {w: {args.base: [], args.head: []} for w in workloads}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {rev: checkout(rev, Path(tmp)) for rev in (args.base, args.head)}
        try:
            for round_ in range(args.rounds):
                for name, (_, code) in workloads.items():
                    for rev, tree in trees.items():
                        value = measure(tree, code)
                        results[name][rev].append(value)
                        print(f"round {round_ + 1} {name} {rev}: {_fmt(value)}", flush=True)
                loads.append(" / ".join(f"{x:.1f}" for x in os.getloadavg()))
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    revs = {rev: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True,
                                text=True).stdout.strip() for rev in (args.base, args.head)}
    rows = [f"| workload | {revs[args.base]} (before) | {revs[args.head]} (after) | after / before |",
            "| --- | ---: | ---: | ---: |"]
    for name, (label, _) in workloads.items():
        before, after = median(results[name][args.base]), median(results[name][args.head])
        rows.append(f"| {label} | {_fmt(before)} | {_fmt(after)} | {after / before:.2f} |")
    table = "\n".join(rows)
    print(table)
    print(json.dumps(results))
    if args.write:
        write_section("Engine rebuilt into owned parts: before and after", f"""Command:
`.venv/bin/python -m bench.bench_revisions {revs[args.base]} {revs[args.head]} --write` (the same workload code
run against each revision's source, interleaved: {args.rounds} rounds, medians).

`{revs[args.base]}` is the last commit before the engine was split into owned parts;
`{revs[args.head]}` is the code measured. Machine: {machine()}; load average (1/5/15 min)
at the start and after each round: {"; ".join(loads)}. Other work shared the machine, so
the absolute figures are low and noisy; the ratio is what this measures.

{table}
""")


if __name__ == "__main__":
    main()
