"""What a round trip to the journal's I/O thread costs the process, in CPU.

The group commit hands each group's write to the I/O thread and waits for its end on
the loop; at a low rate a group is a handful of messages, so this hand-off is paid for
a handful. Two ways, alternating, a no-op call each time (uvloop, as the server runs):

- ``executor``: ``loop.run_in_executor`` over a one-thread ``ThreadPoolExecutor`` (what
  the server did before);
- ``io_thread``: ``IoThread.call`` (server/io_thread.py, what it does now).

    python -m bench.bench_handoff [--calls 20000] [--rounds 3]

Prints CPU µs (user + system of the whole process: both threads) and wall µs per round
trip, medians over the rounds, and a JSON line for ``python -m bench.ab``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import resource
import time
from statistics import median

import uvloop

from conveyor.server.io_thread import IoThread


def _noop(x: int) -> int:
    return x


async def _via_executor(calls: int) -> None:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    loop = asyncio.get_running_loop()
    for i in range(calls):
        await loop.run_in_executor(pool, _noop, i)
    pool.shutdown()


async def _via_io_thread(calls: int) -> None:
    io = IoThread("bench-io")
    for i in range(calls):
        await io.call(_noop, i)
    io.shutdown()


WAYS = {"executor": _via_executor, "io_thread": _via_io_thread}


def round_trip(way: str, calls: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per round trip of ``calls`` made one after the other."""
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    uvloop.run(WAYS[way](calls))
    after, ended = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / calls * 1e6, (ended - started) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            got[way].append(round_trip(way, args.calls))
    figures = {}
    for way, runs in got.items():
        cpu, wall = median(r[0] for r in runs), median(r[1] for r in runs)
        print(f"{way:10} CPU {cpu:6.1f} µs, wall {wall:6.1f} µs a round trip")
        figures[way] = {"cpu_us": round(cpu, 1), "wall_us": round(wall, 1)}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
