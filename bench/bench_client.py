"""Client: how fast one consumer process receives and acknowledges queue messages.

One server subprocess (bench_queue's configuration: queue Bench over topic bench,
at-least-once, MaxPerSubscriptionBacklog 1000). For each run and each mode the queue
is filled with N 256-byte messages (untimed), then one consumer process with the
blocking ``Client`` subscribes with backlog 100 and takes and acknowledges all N:

- ``per-message``: ``msg.ack()`` with ``ack_batch_size=1``: one sow_delete per message;
- ``batched``: ``msg.ack()`` with the defaults (sent per half backlog, 100 or 50 ms);
- ``auto-ack iterator``: ``auto_ack=True``, asking for the next message acks the last;
- ``auto-ack handler``: ``auto_ack=True`` and a handler (on the subscription's thread).

Rate = N / (time from subscribing to the last acknowledgement persisted, ``flush()``).

    python -m bench.bench_client [--messages N] [--runs 3] [--write]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvloop

from bench.bench_queue import conveyor_fill, start_conveyor
from bench.report import git_rev, machine, median, write_section

MODES = ("per-message", "batched", "auto-ack iterator", "auto-ack handler")
BACKLOG = 100


def worker(mode: str, uri: str, n: int) -> None:
    """The consumer process: prints "rate frames ack_batches"."""
    from conveyor import Client

    kwargs: dict = {"ack_batch_size": 1} if mode == "per-message" else {}
    if mode.startswith("auto-ack"):
        kwargs["auto_ack"] = True
    with Client(f"bench-consumer-{time.time_ns()}", **kwargs).connect(uri) as client:
        before = client.statistics()
        started = time.perf_counter()
        if mode == "auto-ack handler":
            done = threading.Event()
            count = 0

            def handle(msg) -> None:
                nonlocal count
                count += 1
                if count == n:
                    done.set()

            client.subscribe("Bench", max_backlog=BACKLOG, handler=handle)
            if not done.wait(600):
                raise SystemExit("handler did not see every message")
        else:
            sub = client.subscribe("Bench", max_backlog=BACKLOG)
            for _ in range(n):
                msg = sub.get(timeout=60)
                if msg is None:
                    raise SystemExit("stalled")
                if mode != "auto-ack iterator":
                    msg.ack()
            if mode == "auto-ack iterator":
                sub.get(timeout=0)  # asking once more acknowledges the last message
        client.flush(timeout=120)
        elapsed = time.perf_counter() - started
        after = client.statistics()
    print(f"{n / elapsed:.1f} {after.frames_sent - before.frames_sent} {after.ack_batches - before.ack_batches}", flush=True)


def measure(mode: str, uri: str, port: int, n: int) -> tuple[float, int, int]:
    uvloop.run(conveyor_fill(port, n))
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_client", "--worker", mode, uri, str(n)],
        capture_output=True, text=True, timeout=900, check=True,
    ).stdout.split()
    return float(out[0]), int(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "URI", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    frames: dict[str, list[int]] = {mode: [] for mode in MODES}
    batches: dict[str, list[int]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        proc, port, _ = start_conveyor(Path(tmp))
        uri = f"tcp://127.0.0.1:{port}"
        try:
            for run in range(args.runs):
                for mode in MODES:
                    rate, sent, acks = measure(mode, uri, port, args.messages)
                    rates[mode].append(rate)
                    frames[mode].append(sent)
                    batches[mode].append(acks)
                    print(f"run {run + 1} {mode}: {rate:,.0f} msg/s, {sent:,} frames, {acks:,} ack commands", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    base = median(rates["per-message"])
    rows = [
        "| consumer | msg/s received and acknowledged | vs per-message | ack commands per 1,000 messages | frames per 1,000 messages |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        rate = median(rates[mode])
        per_k = 1000 / args.messages
        rows.append(
            f"| {mode} | {rate:,.0f} | {rate / base:.2f}x | {median(batches[mode]) * per_k:,.1f} | {median(frames[mode]) * per_k:,.1f} |"
        )
    table = "\n".join(rows)
    print(table)
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_client --write`.

One consumer process (the blocking `Client`, iterating, or a handler for the last
row) takes {args.messages:,} queued 256-byte messages from an at-least-once queue with
backlog {BACKLOG} and acknowledges each one; the queue is filled before each run
(untimed). Rate = messages / time from subscribing until `flush()` returns (every
acknowledgement persisted). `per-message`: `ack_batch_size=1`, one `sow_delete` per
message; `batched`: the defaults (a batch per half backlog, 100 acks, or 50 ms);
`auto-ack`: `auto_ack=True` (iterator: asking for the next message acknowledges the
previous; handler: returning acknowledges). Ack commands: the `sow_delete` commands
the acknowledgements became (each gets a persisted ack back). Frames: everything the
consumer sent; the blocking client hands acknowledgements to its loop in batches, so
even per-message acks share frames.
Medians of {args.runs} runs, one server process for all of them.

Machine: {machine()}; commit {git_rev()}.

{table}
"""
        write_section("Client: receive and acknowledge", body)


if __name__ == "__main__":
    main()
