"""Journal throughput: ``python -m bench.bench_journal [--quick]``.

Measures, each as the median of 3 runs, in a fresh temporary directory (``/tmp``, on
the same disk as ``/work`` on the project's machines):

- append+commit of 256-byte payloads in groups of 1, 10, 100 and 1000 records per
  commit, fsync on (one write and one fsync per commit: what group commit buys);
- the append() hot path alone (no commit), in microseconds per record;
- scan of 1,000,000 records (records/s), recovery (open) of the same journal, and
  ``read()`` at random positions.

Prints a markdown table. ``--quick`` runs tiny sizes (a smoke test, not a figure).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from conveyor.journal import Journal
from conveyor.journal.verified import PREFIX_SUFFIX, VERIFIED_SUFFIX

PAYLOAD_BYTES = 256
RUNS = 3


def _fresh(**kw) -> tuple[tempfile.TemporaryDirectory, Journal]:
    tmp = tempfile.TemporaryDirectory(prefix="bench-journal-")
    return tmp, Journal.open(tmp.name, **kw)


def bench_group_commit(group: int, records: int) -> tuple[float, float]:
    """(records/s, commits/s) for ``records`` records committed ``group`` at a time."""
    payload = bytes(PAYLOAD_BYTES)
    tmp, j = _fresh(fsync=True)
    try:
        commits = records // group
        t0 = time.perf_counter()
        for _ in range(commits):
            for _ in range(group):
                j.append(payload)
            j.commit()
        dt = time.perf_counter() - t0
    finally:
        j.close()
        tmp.cleanup()
    return commits * group / dt, commits / dt


def bench_append(records: int) -> float:
    """Microseconds per append() (buffer only)."""
    payload = bytes(PAYLOAD_BYTES)
    tmp, j = _fresh(fsync=False)
    try:
        append = j.append
        t0 = time.perf_counter()
        for _ in range(records):
            append(payload)
        dt = time.perf_counter() - t0
        j.commit()
    finally:
        j.close()
        tmp.cleanup()
    return dt / records * 1e6


def bench_reading(records: int) -> dict[str, list[float]]:
    """Scan records/s, open (recovery) records/s and read() µs, RUNS times each."""
    payload = bytes(PAYLOAD_BYTES)
    tmp, j = _fresh(fsync=False, segment_bytes=64 * 1024 * 1024)
    out: dict[str, list[float]] = {"scan": [], "open": [], "open_verified": [], "read": []}
    try:
        positions = [j.append(payload) for _ in range(records)]
        j.close()
        sample = random.Random(1).sample(positions, min(100_000, records))
        for _ in range(RUNS):
            for sidecar in [*Path(tmp.name).glob("*" + VERIFIED_SUFFIX), *Path(tmp.name).glob("*" + PREFIX_SUFFIX)]:
                sidecar.unlink()  # a full check of every segment (it writes the sidecars again)
            t0 = time.perf_counter()
            j = Journal.open(tmp.name, fsync=False)
            out["open"].append(records / (time.perf_counter() - t0))
            j.save_prefix()  # as the server does at each checkpoint
            j.close()
            t0 = time.perf_counter()  # sealed segments verified, the open one's prefix saved
            j = Journal.open(tmp.name, fsync=False)
            out["open_verified"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            n = sum(1 for _ in j.scan())
            out["scan"].append(n / (time.perf_counter() - t0))
            assert n == records
            t0 = time.perf_counter()
            for p in sample:
                j.read(p)
            out["read"].append((time.perf_counter() - t0) / len(sample) * 1e6)
            j.close()
    finally:
        tmp.cleanup()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    args = parser.parse_args(argv)
    scale = 0.01 if args.quick else 1.0
    rows = []
    for group, records in ((1, 3_000), (10, 20_000), (100, 100_000), (1000, 300_000)):
        n = max(group, int(records * scale) // group * group)
        runs = [bench_group_commit(group, n) for _ in range(RUNS)]
        rec = statistics.median(r[0] for r in runs)
        com = statistics.median(r[1] for r in runs)
        rows.append(
            (f"append+commit, {group} per commit (fsync)", f"{rec:,.0f} records/s", f"{com:,.0f} commits/s, {1e3 / com:.2f} ms/commit")
        )
    n = int(1_000_000 * scale)
    us = statistics.median(bench_append(n) for _ in range(RUNS))
    rows.append(("append() alone (buffered)", f"{us:.2f} µs/record", f"{1e6 / us:,.0f} records/s"))
    reading = bench_reading(n)
    scan = statistics.median(reading["scan"])
    rows.append((f"scan of {n:,} records", f"{scan:,.0f} records/s", f"{scan * (PAYLOAD_BYTES + 8) / 1e6:,.0f} MB/s"))
    opened = statistics.median(reading["open"])
    rows.append((f"open (recovery) of {n:,} records", f"{opened:,.0f} records/s", f"{n / opened:.2f} s"))
    verified = statistics.median(reading["open_verified"])
    rows.append(
        ("open of the same, with verified sidecars", f"{verified:.3f} s", f"{n / opened / verified:.0f}x faster: sidecars instead of a record-by-record check (journal/verified.py)")
    )
    rows.append(("read() at random positions", f"{statistics.median(reading['read']):.2f} µs/record", ""))
    print(f"Journal, {PAYLOAD_BYTES}-byte payloads, median of {RUNS} runs\n")
    print("| benchmark | throughput | notes |")
    print("| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
