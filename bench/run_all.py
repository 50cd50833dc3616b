"""Run every benchmark and write docs/benchmarks.md (``make bench``).

Suites that write their own section get ``--write``; for the others the printed
markdown is captured into a section named after the suite.
"""

from __future__ import annotations

import subprocess
import sys

from bench.report import BENCHMARKS_MD, git_rev, machine, write_section

SELF_WRITING = [
    ("bench.bench_publish", ["--write"]),
    ("bench.bench_queue", ["--write"]),
    ("bench.bench_expr", ["--write", str(BENCHMARKS_MD)]),
    ("bench.bench_queue_priority", ["--write"]),
    ("bench.bench_client", ["--write"]),
    ("bench.bench_fbm", ["--write"]),  # minutes: fills 10,000,000 messages twice
    ("bench.bench_spark_journal", ["--write"]),
    ("bench.bench_spark_steps", ["--write"]),
    ("bench.bench_peers", ["--write"]),  # NATS and Redis beside conveyor (make bench-peers-install)
]
CAPTURED = [
    ("bench.bench_journal", "Journal: group commit and scan", []),
    ("bench.bench_queue_memory", "Queue state: memory and bare dispatch", []),
]


def main() -> None:
    only = set(sys.argv[1:])
    for module, args in SELF_WRITING:
        if only and module.split(".")[-1] not in only:
            continue
        print(f"== {module}", flush=True)
        subprocess.run([sys.executable, "-m", module, *args], check=True)
    for module, title, args in CAPTURED:
        if only and module.split(".")[-1] not in only:
            continue
        print(f"== {module}", flush=True)
        out = subprocess.run([sys.executable, "-m", module, *args], check=True, capture_output=True, text=True).stdout
        print(out)
        body = f"Command: `.venv/bin/python -m {module}`.\n\nMachine: {machine()}; commit {git_rev()}.\n\n{out.strip()}\n"
        write_section(title, body)


if __name__ == "__main__":
    main()
