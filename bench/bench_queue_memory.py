"""Queue state memory per message, and bare-queue dispatch + ack throughput.

    python -m bench.bench_queue_memory [--messages N] [--throughput-messages N]

Memory: bytes of server memory per queued (available, never delivered) message, for
1,000,000 messages: tracemalloc (Python allocations made by the queue) and the RSS
growth of this process. The target is <= 64 bytes (docs/queues.md).

Throughput: one at-least-once queue (and one at-most-once), 4 consumers with backlog 10;
each round dispatches and then acknowledges everything delivered, one sow_delete per
consumer. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from typing import Callable

from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.queue.queue import AckOption, Consumer, Queue

MEMORY_TARGET_BYTES = 64


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def _fill(queue: Queue, n: int) -> None:
    enqueue = queue.enqueue
    for i in range(n):
        enqueue(i, 1_700_000_000.0 + i * 1e-4)


def _config(**kw) -> QueueConfig:
    return QueueConfig(name="Bench", message_type="json", **kw)


def memory(n: int, **config) -> tuple[float, float]:
    """(tracemalloc bytes/message, RSS bytes/message) for ``n`` queued messages."""
    gc.collect()
    rss0 = _rss_bytes()
    q = Queue(_config(**config), load=lambda p: None)
    _fill(q, n)
    gc.collect()
    rss = (_rss_bytes() - rss0) / n
    del q
    gc.collect()

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    q = Queue(_config(**config), load=lambda p: None)
    _fill(q, n)
    gc.collect()
    traced = (tracemalloc.get_traced_memory()[0] - base) / n
    tracemalloc.stop()
    assert q.statistics().available == n
    del q
    gc.collect()
    return traced, rss


def throughput(n: int, *, semantics: Semantics, filtered: bool = False) -> float:
    """Messages per second through dispatch + acknowledge."""
    fairness = Fairness.PROPORTIONAL if semantics is Semantics.AT_LEAST_ONCE else Fairness.ROUND_ROBIN
    bodies = [{"k": i % 4} for i in range(n)]
    q = Queue(_config(semantics=semantics, fairness=fairness), load=bodies.__getitem__)
    _fill(q, n)
    consumers = []
    for i in range(4):
        flt = (lambda d, now, i=i: d["k"] == i) if filtered else None
        c = Consumer((1, f"s{i}"), i, filter=flt, max_backlog=10)
        q.add_consumer(c, 0.0)
        consumers.append(c)
    done, elapsed = drain_queue(q, n)
    return done / elapsed


def drain_queue(
    q: Queue, count: int, seen: list[int] | None = None, *, now: float = 0.0, clock: Callable[[], float] = time.perf_counter
) -> tuple[int, float]:
    """Dispatch and acknowledge until ``count`` messages are done: (done, seconds by
    ``clock``). ``now`` starts at ``now`` and moves 1 ms per turn (at most ``count``).

    Every delivery of a turn is acknowledged by its consumer in one call, as a client
    batching its acks would. ``seen`` collects the first 1,000 positions delivered.
    """
    done = 0
    t0 = clock()
    while done < count:
        deliveries = q.dispatch(now)
        if not deliveries:
            raise RuntimeError("stalled")
        if seen is not None and len(seen) < 1000:
            seen += [d.position for d in deliveries]
        by_consumer: dict = {}
        for d in deliveries:
            by_consumer.setdefault(d.consumer, []).append(d.position)
        for c, positions in by_consumer.items():
            q.acknowledge(positions, by=c.owner, option=AckOption.NONE, now=now)
        done += len(deliveries)
        now += 0.001
    return done, clock() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--throughput-messages", type=int, default=200_000)
    args = ap.parse_args(argv)
    n, tn = args.messages, args.throughput_messages

    rows = []
    traced, rss = memory(n)
    rows.append((f"queued messages ({n:,}), tracemalloc", f"{traced:.1f} B/msg"))
    rows.append((f"queued messages ({n:,}), RSS growth", f"{rss:.1f} B/msg"))
    traced_e, _ = memory(n, expiration_s=3600.0)
    rows.append(("same, with Expiration set, tracemalloc", f"{traced_e:.1f} B/msg"))
    for label, kw in (
        ("at-least-once, 4 consumers, backlog 10", dict(semantics=Semantics.AT_LEAST_ONCE)),
        ("at-least-once, 4 filtered consumers, backlog 10",
         dict(semantics=Semantics.AT_LEAST_ONCE, filtered=True)),
        ("at-most-once, 4 consumers, backlog 10", dict(semantics=Semantics.AT_MOST_ONCE)),
    ):
        rate = throughput(tn, **kw)
        rows.append((f"dispatch + ack, {label}", f"{rate:,.0f} msg/s"))

    print(f"Python {sys.version.split()[0]}; target <= {MEMORY_TARGET_BYTES} B/msg\n")
    print("| measure | value |")
    print("| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0 if traced <= MEMORY_TARGET_BYTES else 1


if __name__ == "__main__":
    raise SystemExit(main())
