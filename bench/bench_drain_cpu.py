"""Server CPU per message while 4 consumer processes drain a queue (issue 16's drain).

bench_queue's drain (N queued 256-byte messages, then 4 consumer processes with
backlog 10 acknowledge every message), conveyor only, twice: acknowledgements batched
(5 per sow_delete, as bench_queue), one sow_delete per message, and one per message on a
queue with ``Leasing=strict`` (each delivery carries its count and each acknowledgement
names it back: the ``sow_delete`` option ``deliveries=[n]``). Server CPU = user +
system time of the server process from the moment the consumers are subscribed to the
end of the drain, per message; it counts only the server's own work, so it moves far
less with the machine's load than the drain rate does.

    python -m bench.bench_drain_cpu [--messages 50000]

Prints one JSON line: mode -> {"msg_per_s", "server_us_per_msg"} (for ``python -m bench.ab``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import uvloop

from bench.bench_latency import cpu_seconds
from bench.bench_queue import CONFIG, conveyor_fill, drain, start_conveyor

STRICT = CONFIG.replace("</Semantics>", "</Semantics><Leasing>strict</Leasing>")
assert STRICT != CONFIG
#: mode -> (ack_batch_size of the consumers (None: backlog // 2), the server's configuration)
MODES = {"batched": (None, CONFIG), "each": (1, CONFIG), "each, strict": (1, STRICT)}
WORKERS, BACKLOG = 4, 10


def measure(mode: str, n: int, workdir: Path) -> dict[str, float]:
    ack_batch, config = MODES[mode]
    proc, port, _ = start_conveyor(workdir, config=config)
    try:
        uvloop.run(conveyor_fill(port, n))
        cpu0 = cpu_seconds(proc.pid)
        rate = drain("conveyor", f"tcp://127.0.0.1:{port}", WORKERS, BACKLOG, n, ack_batch)
        cpu1 = cpu_seconds(proc.pid)  # the workers' idle second costs the server nothing
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"msg_per_s": rate, "server_us_per_msg": (cpu1 - cpu0) / n * 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    args = ap.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for mode in MODES:
            d = Path(tmp) / mode.replace(", ", "-")
            d.mkdir()
            out[mode] = measure(mode, args.messages, d)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
