"""Run a module with every garbage collection timed: which generation, when, how long.

    python -m bench.gc_probe OUT.json MODULE [ARGS ...]

Runs ``python -m MODULE ARGS`` in this process with a ``gc.callbacks`` hook, and at
exit (``sys.exit``, SIGTERM handled by the module, the end of the module) writes OUT:
a list of ``[epoch seconds at the start, generation, wall seconds, CPU seconds of the
collecting thread]``, one per collection. The CPU time is what a collection costs
whatever else the machine runs; the wall time is what a request waiting behind it sees.
A bench reads it to count the pauses inside its measured window (bench_latency).
"""

from __future__ import annotations

import atexit
import gc
import json
import runpy
import sys
import time


def main() -> None:
    out_path, module, *args = sys.argv[1:]
    records: list[tuple[float, int, float, float]] = []
    started: list[float] = [0.0, 0.0, 0.0]
    clock, cpu, epoch = time.perf_counter, time.thread_time, time.time

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0], started[1], started[2] = epoch(), clock(), cpu()
        else:
            records.append((started[0], info["generation"], clock() - started[1], cpu() - started[2]))

    def dump() -> None:
        with open(out_path, "w") as f:
            json.dump(records, f)

    atexit.register(dump)
    gc.callbacks.append(on_gc)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
