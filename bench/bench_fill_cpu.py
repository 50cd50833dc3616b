"""Server CPU per message while one pipelined publisher fills a queue (issue 38's publish).

bench_queue's fill: N publishes of 256 bytes to the topic under the ``Bench`` queue, one
``AsyncClient`` waiting until every publish is persisted, no consumer. Server CPU = user +
system time of the server process from before the first publish to the last persisted
ack, per message: the server's own work on each publish (taking it, journaling it,
enqueueing it), which moves far less with the machine's load than the rate does.

    python -m bench.bench_fill_cpu [--messages 200000]

Prints one JSON line {"msg_per_s", "server_us_per_msg"} (for ``python -m bench.ab``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import uvloop

from bench.bench_latency import cpu_seconds
from bench.bench_queue import conveyor_fill, start_conveyor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port, _ = start_conveyor(Path(tmp))
        try:
            time.sleep(0.5)  # start-up work done
            cpu, started = cpu_seconds(proc.pid), time.perf_counter()
            uvloop.run(conveyor_fill(port, args.messages))
            seconds, cpu = time.perf_counter() - started, cpu_seconds(proc.pid) - cpu
        finally:
            proc.terminate()
            proc.wait()
    out = {"msg_per_s": args.messages / seconds, "server_us_per_msg": cpu / args.messages * 1e6}
    print(f"fill {args.messages:,}: {out['msg_per_s']:,.0f} msg/s, server {out['server_us_per_msg']:.1f} us/msg")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
