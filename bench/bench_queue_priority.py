"""Priority queue vs plain queue: bytes per queued message and dispatch + ack throughput.

    python -m bench.bench_queue_priority [--messages N] [--drain N] [--repeat N] [--write]

Both queues hold ``--messages`` (1,000,000) queued messages; the priority queue's
priorities are random unsigned 64-bit values (1% NULL, the lowest). Memory: the growth of
Python allocations (tracemalloc) and of the process RSS while the queue is filled, per
message. Throughput: the bare Queue (no engine, no I/O), at-least-once, 4 consumers with
backlog 10; each round dispatches and then acknowledges everything delivered, one
sow_delete per consumer, until ``--drain`` messages went through (the queue stays at
least ``messages - drain`` deep). The median of ``--repeat`` runs. The target: the
priority queue within 2x of the plain queue's throughput (docs/queues.md). Prints a
markdown table; ``--write`` also replaces the "Queues: priority" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import random
import sys
import time
import tracemalloc
from typing import Callable

from bench.bench_queue_memory import drain_queue
from bench.report import machine, median, write_section
from conveyor.config.model import QueueConfig
from conveyor.engine.queue.queue import Consumer, Queue

TARGET_RATIO = 2.0  # priority throughput within 2x of the plain queue's
MEMORY_TARGET_BYTES = 64


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def _priorities(n: int, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(64) if rng.random() >= 0.01 else -1 for _ in range(n)]


def _queue(priority: bool) -> Queue:
    cfg = QueueConfig(name="Bench", message_type="json", priority="/p" if priority else None)
    return Queue(cfg, load=lambda p: None)


def fill_queue(q: Queue, n: int, priorities: list[int] | None, clock: Callable[[], float] = time.perf_counter) -> float:
    """Enqueue ``n`` messages; the seconds it took, by ``clock``."""
    enqueue = q.enqueue
    t0 = clock()
    if priorities is None:
        for i in range(n):
            enqueue(i, 1_700_000_000.0 + i * 1e-4)
    else:
        for i in range(n):
            enqueue(i, 1_700_000_000.0 + i * 1e-4, priorities[i])
    return clock() - t0


def memory(n: int, priority: bool) -> tuple[float, float]:
    """(tracemalloc bytes/message, RSS growth bytes/message), measured in a fresh process
    (memory freed by earlier runs would hide the RSS growth)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_memory, (n, priority))


def _memory(n: int, priority: bool) -> tuple[float, float]:
    priorities = _priorities(n) if priority else None
    gc.collect()
    rss0 = _rss_bytes()
    q = _queue(priorities is not None)
    fill_queue(q, n, priorities)
    gc.collect()
    rss = (_rss_bytes() - rss0) / n
    del q
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    q = _queue(priorities is not None)
    fill_queue(q, n, priorities)
    gc.collect()
    traced = (tracemalloc.get_traced_memory()[0] - base) / n
    tracemalloc.stop()
    assert q.statistics().available == n
    return traced, rss


def throughput(n: int, drain: int, priorities: list[int] | None) -> tuple[float, float]:
    """(messages/second through dispatch + acknowledge, enqueue messages/second)."""
    q = _queue(priorities is not None)
    fill_s = fill_queue(q, n, priorities)
    consumers = []
    for i in range(4):
        c = Consumer((1, f"s{i}"), i, max_backlog=10)
        q.add_consumer(c, 0.0)
        consumers.append(c)
    expected = None
    if priorities is not None:
        expected = sorted(range(n), key=lambda p: (priorities[p] < 0, -priorities[p], p))
    first: list[int] = []
    done, elapsed = drain_queue(q, drain, first)
    if expected is not None:  # the bench measures the right thing: priority order
        assert first[:1000] == expected[:1000]
    return done / elapsed, n / fill_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--drain", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args(argv)
    n, drain = args.messages, min(args.drain, args.messages)
    prios = _priorities(n)

    results = {}
    for label, p in (("plain", None), ("priority", prios)):
        rates, fills = [], []
        for _ in range(args.repeat):
            rate, fill = throughput(n, drain, p)
            rates.append(rate)
            fills.append(fill)
            gc.collect()
        traced, rss = memory(n, p is not None)
        results[label] = (median(rates), median(fills), traced, rss)
        gc.collect()

    plain, prio = results["plain"], results["priority"]
    ratio = plain[0] / prio[0]
    rows = [
        ("queue", "plain (FIFO)", "priority (random 64-bit)"),
        ("queued messages", f"{n:,}", f"{n:,}"),
        ("dispatch + ack, 4 consumers, backlog 10", f"{plain[0]:,.0f} msg/s", f"{prio[0]:,.0f} msg/s"),
        ("enqueue (building the queue)", f"{plain[1]:,.0f} msg/s", f"{prio[1]:,.0f} msg/s"),
        ("memory per queued message, tracemalloc", f"{plain[2]:.1f} B", f"{prio[2]:.1f} B"),
        ("memory per queued message, RSS growth", f"{plain[3]:.1f} B", f"{prio[3]:.1f} B"),
    ]
    table = [f"| {rows[0][0]} | {rows[0][1]} | {rows[0][2]} |", "| --- | --- | --- |"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows[1:]]
    ok = ratio <= TARGET_RATIO and prio[2] <= MEMORY_TARGET_BYTES
    body = "\n".join(
        [
            "`python -m bench.bench_queue_priority` — the bare Queue state machine (no engine, "
            f"no I/O); throughput drains {drain:,} messages from a queue of {n:,}, median of "
            f"{args.repeat} runs; priorities random unsigned 64-bit, 1% NULL.",
            "",
            *table,
            "",
            f"Plain / priority throughput: {ratio:.2f}x (target <= {TARGET_RATIO:.0f}x); "
            f"memory target <= {MEMORY_TARGET_BYTES} B per queued message. "
            f"{'Within targets.' if ok else 'OUTSIDE TARGETS.'}",
            "",
            f"Machine: {machine()}.",
        ]
    )
    print(f"Python {sys.version.split()[0]}\n")
    print(body)
    if args.write:
        write_section("Queues: priority", body)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
