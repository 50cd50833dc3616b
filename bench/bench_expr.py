"""Benchmark: content-filter evaluations per second, and the worst cases the limits allow.

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

Worst cases (tests/expr/worst_cases.py; the tests check their answers, this measures
their time): compiling each source at a limit (caches cleared), one LIKE search of each
stress pattern over its worst subject at the pattern's subject limit, the slowest of
200 seeded random patterns on such subjects, and the slowest compile-and-evaluate of
300 seeded random token soups. Each is the median of 3 runs. Target: every one under
1 s (the regex cost budget, limits.regex_cost_ticks_max, is sized for about 0.2 s).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "expr"))

import reference_eval as ref  # noqa: E402
import worst_cases as worst  # noqa: E402

from bench.report import machine, write_section  # noqa: E402
from conveyor import expr  # noqa: E402
from conveyor.expr import ExpressionError  # noqa: E402
from conveyor.expr.expression import _compile_cached  # noqa: E402
from conveyor.expr.regex import compile_pattern  # noqa: E402

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
WORST_RUNS = 3
WORST_SECONDS_TARGET = 1.0  # any single compile or LIKE search at the limits
RANDOM_PATTERNS = 200
RANDOM_SOUPS = 300
SEED = 20261123


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
        "load": os.getloadavg()[0],  # other work on the machine slows every figure alike
    }


def _seconds(fn) -> float:
    """Median wall time of ``WORST_RUNS`` calls of ``fn``."""
    times = []
    for _ in range(WORST_RUNS):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _compile_cold(source: str) -> None:
    _compile_cached.cache_clear()
    re.purge()
    try:
        expr.compile(source)
    except ExpressionError:
        pass  # refused by a limit (WORST_SOURCES_REFUSED): the refusal is what is timed


def _like_worst(pattern: str, unit: str) -> None:
    compiled = compile_pattern(pattern, 0)
    chars = compiled.subject_chars_max if compiled.kind == "regex" else worst.PLAIN_TEXT_SUBJECT_CHARS
    subject = worst.subject(unit, chars)
    compiled.test(subject)
    compiled.test(subject[:-1] + "!")


def _soup(source: str) -> None:
    try:
        compiled = expr.compile(source)
    except ExpressionError:
        return
    for message in worst.ROBUSTNESS_MESSAGES:
        compiled.evaluate(message, {"topic": "t"})
        compiled.matches(message)
        compiled.priority(message)


def measure_worst() -> dict:
    """Seconds per worst case (medians of WORST_RUNS)."""
    compiles = {name: _seconds(lambda src=build(): _compile_cold(src)) for name, build in worst.WORST_SOURCES.items()}
    likes = {pattern: _seconds(lambda p=pattern, u=unit: _like_worst(p, u)) for pattern, unit in worst.WORST_SUBJECTS.items()}
    accepted = []
    for pattern, unit in worst.random_patterns(RANDOM_PATTERNS, SEED):
        try:
            compile_pattern(pattern, 0)
        except ExpressionError:
            continue
        accepted.append((pattern, unit))
    randoms = {pattern: _seconds(lambda p=pattern, u=unit: _like_worst(p, u)) for pattern, unit in accepted}
    soups = {source: _seconds(lambda s=source: _soup(s)) for source in worst.token_soup(RANDOM_SOUPS, SEED)}
    return {"compiles": compiles, "likes": likes, "randoms": randoms, "accepted": len(accepted), "soups": soups}


def report_worst(result: dict) -> str:
    def slowest(times: dict) -> tuple[str, float]:
        key = max(times, key=times.get)
        return key, times[key]

    rows = ["| worst case | slowest | ms (median of 3) | under 1 s |", "|---|---|---:|---|"]

    def row(what: str, times: dict) -> None:
        key, seconds = slowest(times)
        shown = (key if len(key) <= 40 else key[:37] + "...").replace("|", "\\|")  # a table cell
        rows.append(f"| {what} | `{shown}` | {seconds * 1e3:.2f} | {'met' if seconds < WORST_SECONDS_TARGET else 'MISSED'} |")

    row(f"compile at a limit ({len(result['compiles'])} sources, caches cleared)", result["compiles"])
    row(f"LIKE stress pattern at its subject limit ({len(result['likes'])} patterns)", result["likes"])
    row(f"random LIKE pattern at its subject limit ({result['accepted']} accepted of {RANDOM_PATTERNS})", result["randoms"])
    row(f"compile and evaluate random token soup ({len(result['soups'])} sources)", result["soups"])
    return "\n".join(
        [
            "Worst inputs the limits allow (tests/expr/worst_cases.py; the tests check their answers).",
            "",
            *rows,
        ]
    )


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
        f"({result['matches']:,} match); {result['machine']}; load average {result['load']:.1f} at the start.",
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
    body = report(measure(args.messages)) + "\n\n" + report_worst(measure_worst())
    print(body)
    if args.write:
        write_section("Expressions", body, Path(args.write))


if __name__ == "__main__":
    main()
