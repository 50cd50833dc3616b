"""Before/after in one run: a benchmark module against a base revision and this tree.

    python -m bench.ab [--base main] [--repeat 5] [--python-flags -O] MODULE [ARGS ...]

Other processes on a shared machine move absolute figures by tens of percent from one
minute to the next; a ratio taken in the same run, from interleaved repetitions, moves
far less. The base revision is exported (``git archive``) into a temporary directory and
MODULE runs with ``PYTHONPATH`` pointing at its ``src`` (the benchmark module itself is
this tree's, so both sides run the same workload); subprocesses the module starts (a
server, workers) inherit it. The repetitions alternate base/this and this/base, so a
drift in the machine's load falls on both sides alike. Both sides run as pure Python
(``CONVEYOR_PURE=1``): a change is measured on its source, and ``bench_compiled``
measures what the compiled build adds.

MODULE must print, as its last line, one JSON object whose number leaves are the figures
(nested objects and lists are flattened into dotted names). Prints one markdown table:
the median of each figure on each side and their ratio (this / base), with the load
averages seen before every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _flatten(value: object, prefix: str = "") -> dict[str, float]:
    if isinstance(value, bool):
        return {}
    if isinstance(value, (int, float)):
        return {prefix: float(value)}
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {}
    out: dict[str, float] = {}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _figure(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _export(rev: str, into: Path, repo: Path) -> str:
    """Extract ``rev`` of the repository ``repo`` into ``into``; its short commit id."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "src"], cwd=repo, check=True, capture_output=True).stdout
    tar_path = into / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return commit


def _run(module: str, args: list[str], src: Path, flags: list[str]) -> dict[str, float]:
    # Both sides as pure Python: the exported base has no compiled build, and this tree's
    # would make the ratio the compiler's (bench/bench_compiled.py measures that).
    env = dict(os.environ, PYTHONPATH=str(src), CONVEYOR_PURE="1")
    out = subprocess.run(
        [sys.executable, *flags, "-m", module, *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"{module} printed nothing")
    return _flatten(json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="the revision to compare against (default: main)")
    ap.add_argument("--repeat", type=int, default=5, help="runs on each side (default: 5)")
    ap.add_argument("--python-flags", default="", help="flags for both interpreters, e.g. -O")
    ap.add_argument("--git", type=Path, default=ROOT, help="the repository of --base (default: this tree's)")
    ap.add_argument("module")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    flags = ns.python_flags.split()
    here_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or str(ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        base_commit = _export(ns.base, Path(tmp), ns.git)
        sides = {"base": Path(tmp) / "src", "this": ROOT / "src"}
        results: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
        loads: list[float] = []
        for i in range(ns.repeat):
            order = ("base", "this") if i % 2 == 0 else ("this", "base")
            for side in order:
                loads.append(os.getloadavg()[0])
                results[side].append(_run(ns.module, ns.args, sides[side], flags))
                print(f"run {i + 1} {side}: {json.dumps(results[side][-1])}", file=sys.stderr, flush=True)
    names = [k for k in results["base"][0] if all(k in r for side in results.values() for r in side)]
    command = ["python", "-m", "bench.ab", f"--base={ns.base}", f"--repeat={ns.repeat}"]
    if flags:
        command.append(f"--python-flags={ns.python_flags}")
    print(f"`{' '.join([*command, ns.module, *ns.args])}`")
    print()
    print(
        f"base {base_commit}, this {here_commit}{' + uncommitted changes' if dirty else ''}; "
        f"medians of {ns.repeat} interleaved runs each; load average (1 min) before the runs: "
        f"median {statistics.median(loads):.1f}, {min(loads):.1f}-{max(loads):.1f}"
    )
    print()
    print("| figure | base | this | this / base |")
    print("| --- | ---: | ---: | ---: |")
    for name in names:
        b = statistics.median(r[name] for r in results["base"])
        t = statistics.median(r[name] for r in results["this"])
        ratio = f"{t / b:.3f}" if b else "-"
        print(f"| {name} | {_figure(b)} | {_figure(t)} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
