"""The bare Queue's enqueue and dispatch + ack, in CPU time: a before/after measure that
other processes on the machine disturb far less than wall time does.

    python -m bench.bench_queue_cpu [--messages N] [--drain N] [--repeat N]

The workloads of bench_queue_memory and bench_queue_priority (at-least-once FIFO,
priority with random unsigned 64-bit priorities, 4 filtered consumers, at-most-once;
4 consumers with backlog 10; each round dispatches, then acknowledges everything
delivered, one sow_delete per consumer), timed with ``time.process_time`` (this process
only). Enqueue: ``--messages`` into an empty queue; dispatch + ack: the best of
``--repeat`` drains of ``--drain`` messages each. Prints one JSON line: kind ->
{"enqueue": msg/s, "dispatch_ack": msg/s} (``python -m bench.ab bench.bench_queue_cpu``
compares it with main's code in the same run). Run it under ``python -O`` too: the queue's
``__debug__`` checks are on in the server, which runs without ``-O``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from bench.bench_queue_memory import _config, drain_queue
from bench.bench_queue_priority import _priorities, fill_queue
from conveyor.config.model import Fairness, Semantics
from conveyor.engine.queue.queue import Consumer, Queue

KINDS = ("plain", "prio", "filtered", "amo")


def _queue(kind: str, n: int) -> Queue:
    if kind == "prio":
        return Queue(_config(priority="/p"), load=lambda p: None)
    bodies = [{"k": i % 4} for i in range(n)]
    semantics = Semantics.AT_MOST_ONCE if kind == "amo" else Semantics.AT_LEAST_ONCE
    fairness = Fairness.ROUND_ROBIN if kind == "amo" else Fairness.PROPORTIONAL
    return Queue(_config(semantics=semantics, fairness=fairness), load=bodies.__getitem__)


def measure(kind: str, n: int, drain: int, repeat: int) -> dict[str, int]:
    q = _queue(kind, n)
    enqueue_s = fill_queue(q, n, _priorities(n) if kind == "prio" else None, clock=time.process_time)
    for i in range(4):
        flt = (lambda d, now, i=i: d["k"] == i) if kind == "filtered" else None
        q.add_consumer(Consumer((1, f"s{i}"), i, filter=flt, max_backlog=10), 0.0)
    best, now = float("inf"), 0.0
    for _ in range(repeat):
        _, seconds = drain_queue(q, drain, now=now, clock=time.process_time)
        best = min(best, seconds)
        now += drain * 0.001  # past the last turn's now: at least one delivery a turn
    return {"enqueue": round(n / enqueue_s), "dispatch_ack": round(drain / best)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--drain", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.drain * args.repeat > args.messages:
        ap.error("--drain x --repeat must not exceed --messages")
    out = {}
    for kind in KINDS:
        out[kind] = measure(kind, args.messages, args.drain, args.repeat)
        gc.collect()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
