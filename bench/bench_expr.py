"""Benchmark: content-filter evaluations per second.

    python -m bench.bench_expr [--messages N] [--write docs/benchmarks.md]

Times one filter, ``/region = 'EU' AND /qty > 100 AND /sym LIKE '^A'``, over a list
of varied decoded JSON messages (seeded, so every run sees the same data) with three
evaluators, in one process, interleaved run by run so drift hits all of them alike:

(a) compiled:  ``conveyor.expr.compile(...).matches`` (generated Python, compiled once);
(b) reference: the tree-walking evaluator of tests/expr/reference_eval.py;
(c) lambda:    a hand-written Python lambda doing the same test.

Each figure is the median of 5 runs. Targets: compiled >= 5x the reference, and the
lambda no more than 2x faster than the compiled filter. All three must select the
same messages, or the benchmark stops.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "expr"))

import reference_eval as ref  # noqa: E402

from bench.report import machine, write_section  # noqa: E402
from conveyor import expr  # noqa: E402

FILTER = "/region = 'EU' AND /qty > 100 AND /sym LIKE '^A'"
TREE = (
    "and",
    (
        "and",
        ("cmp", "=", ("field", ("region",)), ("lit", "EU")),
        ("cmp", ">", ("field", ("qty",)), ("lit", 100)),
    ),
    ("like", ("field", ("sym",)), "^A", False),
)
RUNS = 5
RUN_SECONDS_MIN = 0.2  # each run repeats the message list until it lasts this long


def hand_written():
    return lambda m: (
        m.get("region") == "EU"
        and type(q := m.get("qty")) in (int, float)
        and q > 100
        and type(s := m.get("sym")) is str
        and s.startswith("A")
    )


def messages(count: int, seed: int = 20261122) -> list[dict]:
    """Varied orders: some fields missing or null, qty int or float, symbols of 1-5 letters."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        m: dict = {"id": i, "price": round(rng.uniform(1, 500), 2), "side": rng.choice(["buy", "sell"])}
        r = rng.random()
        if r < 0.9:
            m["region"] = rng.choice(["EU", "EU", "US", "APAC", "LATAM"])
        elif r < 0.95:
            m["region"] = None
        r = rng.random()
        if r < 0.8:
            m["qty"] = rng.randint(0, 300)
        elif r < 0.95:
            m["qty"] = round(rng.uniform(0, 300), 1)
        if rng.random() < 0.95:
            m["sym"] = "".join(rng.choice("AABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(rng.randint(1, 5)))
        if rng.random() < 0.3:
            m["tags"] = rng.sample(["fast", "vip", "retry", "bulk"], rng.randint(1, 3))
        out.append(m)
    return out


def time_run(fn, msgs: list, passes: int) -> float:
    """Evaluations per second of one run (``passes`` times over the list)."""
    started = time.perf_counter()
    for _ in range(passes):
        for m in msgs:
            fn(m)
    return passes * len(msgs) / (time.perf_counter() - started)


def calibrate(fn, msgs: list) -> int:
    passes = 1
    while True:
        started = time.perf_counter()
        for _ in range(passes):
            for m in msgs:
                fn(m)
        if time.perf_counter() - started >= RUN_SECONDS_MIN or passes >= 1 << 12:
            return passes
        passes *= 2


def measure(count: int) -> dict:
    msgs = messages(count)
    compiled = expr.compile(FILTER)
    evaluators = {
        "compiled (`conveyor.expr`)": compiled.matches,
        "reference tree-walker (tests)": lambda m: ref.matches(TREE, m),
        "hand-written lambda": hand_written(),
    }
    selections = {name: [i for i, m in enumerate(msgs) if fn(m)] for name, fn in evaluators.items()}
    first = next(iter(selections.values()))
    if any(sel != first for sel in selections.values()):
        raise SystemExit("the evaluators disagree on which messages match: benchmark void")
    passes = {name: calibrate(fn, msgs) for name, fn in evaluators.items()}
    rates: dict[str, list[float]] = {name: [] for name in evaluators}
    for _ in range(RUNS):  # interleaved, so drift affects every evaluator alike
        for name, fn in evaluators.items():
            rates[name].append(time_run(fn, msgs, passes[name]))
    return {
        "messages": count,
        "matches": len(first),
        "medians": {name: statistics.median(r) for name, r in rates.items()},
        "machine": machine(),
    }


def report(result: dict) -> str:
    med = result["medians"]
    compiled, reference, lam = med.values()
    rows = [
        "| evaluator | evaluations/s (median of 5) | ns per evaluation |",
        "|---|---:|---:|",
    ]
    for name, rate in med.items():
        rows.append(f"| {name} | {rate:,.0f} | {1e9 / rate:,.0f} |")
    speedup = compiled / reference
    gap = lam / compiled
    lines = [
        f"Filter `{FILTER}` over {result['messages']:,} varied messages "
        f"({result['matches']:,} match); {result['machine']}.",
        "Command: `python -m bench.bench_expr`.",
        "",
        *rows,
        "",
        f"- compiled / reference = **{speedup:.1f}x** (target >= 5x: {'met' if speedup >= 5 else 'MISSED'})",
        f"- lambda / compiled = **{gap:.2f}x** (target <= 2x: {'met' if gap <= 2 else 'MISSED'})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--write", metavar="FILE", help="replace or append '## Expressions' in FILE")
    args = parser.parse_args(argv)
    body = report(measure(args.messages))
    print(body)
    if args.write:
        write_section("Expressions", body, Path(args.write))


if __name__ == "__main__":
    main()
