"""Client: how fast one consumer process receives and acknowledges queue messages.

One server subprocess (bench_queue's configuration: queue Bench over topic bench,
at-least-once, MaxPerSubscriptionBacklog 1000). For each run and each mode the queue
is filled with N 256-byte messages (untimed), then one consumer process subscribes
(backlog 100, or 10 for the cases that say so) and takes and acknowledges all N; it
reports its rate and its CPU time per message (all threads). The blocking ``Client``:

- ``per-message``: ``msg.ack()`` with ``ack_batch_size=1``: every ack sent at once (acks
  the loop takes from the application's thread together share one sow_delete);
- ``batched``: ``msg.ack()`` with the defaults (sent per half backlog, 100 or 50 ms);
- ``auto-ack iterator``: ``auto_ack=True``, asking for the next message acks the last;
- ``auto-ack handler``: ``auto_ack=True`` and a handler (on the subscription's thread);

and ``asyncio batched``: the ``AsyncClient`` on uvloop, ``msg.ack()`` batched; and
``bare socket``: no client at all, the floor under every client on this machine: one
thread on a blocking socket, the protocol's frame codec, one ``sow_delete`` per half
backlog of bookmarks, nothing kept (no resubscription, no reconnection, no batching by
time), so what it costs is the system calls and wake-ups of a round trip plus the least
Python a message can take.
``--baseline OTHER/src`` runs every case with the client of another checkout too,
interleaved, for a before/after in one run.

Rate = N / (time from subscribing to the last acknowledgement persisted, ``flush()``).

    python -m bench.bench_client [--messages N] [--runs 3] [--baseline OTHER/src] [--write]
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

#: (mode, backlog): the blocking ``Client`` in four modes at backlog 100, the two
#: commonest at backlog 10 (a round trip per 5-10 messages), and the ``AsyncClient``.
CASES = (("per-message", 100), ("batched", 100), ("auto-ack iterator", 100), ("auto-ack handler", 100),
         ("batched", 10), ("auto-ack iterator", 10), ("asyncio batched", 100), ("asyncio batched", 10),
         ("bare socket", 100), ("bare socket", 10))
BACKLOG = 100


def async_worker(uri: str, n: int, backlog: int) -> tuple[float, float, int, int]:
    """The ``AsyncClient`` on uvloop, ``msg.ack()`` with the default batching."""
    import uvloop as _uvloop

    from conveyor import AsyncClient

    async def run() -> tuple[float, float, int, int]:
        client = await AsyncClient(f"bench-consumer-{time.time_ns()}").connect(uri)
        before = client.statistics()
        started, cpu = time.perf_counter(), time.process_time()
        sub = await client.subscribe("Bench", max_backlog=backlog)
        for _ in range(n):
            msg = await sub.get(timeout=60)
            if msg is None:
                raise SystemExit("stalled")
            msg.ack()
        await client.flush(timeout=120)
        elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        after = client.statistics()
        await client.disconnect()
        return elapsed, cpu_s, after.frames_sent - before.frames_sent, after.ack_batches - before.ack_batches

    return _uvloop.run(run())


def bare_worker(uri: str, n: int, backlog: int) -> tuple[float, float, int, int]:
    """The floor: a blocking socket and the frame codec, acknowledgements per half backlog."""
    import socket

    from conveyor.client.core import parse_uri
    from conveyor.protocol import messages as m
    from conveyor.protocol.codec import MessageDecoder, encode_frame

    sock = socket.create_connection(parse_uri(uri))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = MessageDecoder()
    sock.sendall(encode_frame([m.Logon(client_name=f"bench-bare-{time.time_ns()}", cid="logon"),
                               m.Subscribe(topic="Bench", sub_id="bare", cid="sub", options=f"max_backlog={backlog}")]))
    batch = max(1, backlog // 2)
    started, cpu = time.perf_counter(), time.process_time()
    got = frames = acks = 0
    pending: list[str] = []
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while got < n:
        size = sock.recv_into(buf)
        if not size:
            raise SystemExit("the server closed the connection")
        decoder.receive_data(bytes(view[:size]))
        for item in decoder.next_items():
            if type(item) is m.Message and item.bookmark is not None:
                got += 1
                pending.append(item.bookmark)
                if len(pending) >= batch or got == n:
                    sock.sendall(encode_frame([m.SowDelete(topic="Bench", bookmark=",".join(pending))]))
                    frames += 1
                    acks += 1
                    pending = []
    # The last acknowledgement persisted, as flush() waits for it in the other modes.
    sock.sendall(encode_frame([m.Flush(cid="flush", ack_type="persisted")]))
    frames += 1
    while not any(type(item) is m.Ack and item.cid == "flush" for item in decoder.next_items()):
        size = sock.recv_into(buf)
        if not size:
            raise SystemExit("the server closed the connection")
        decoder.receive_data(bytes(view[:size]))
    elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    sock.close()
    return elapsed, cpu_s, frames, acks


def worker(mode: str, uri: str, n: int, backlog: int = BACKLOG) -> None:
    """The consumer process: prints "rate frames ack_batches cpu_us_per_msg" (the CPU
    of every thread of this process, from subscribing to the last ack persisted)."""
    if mode.startswith("asyncio") or mode == "bare socket":
        elapsed, cpu_s, frames, acks = (async_worker if mode.startswith("asyncio") else bare_worker)(uri, n, backlog)
        print(f"{n / elapsed:.1f} {frames} {acks} {cpu_s / n * 1e6:.2f}", flush=True)
        return
    from conveyor import Client

    kwargs: dict = {"ack_batch_size": 1} if mode == "per-message" else {}
    if mode.startswith("auto-ack"):
        kwargs["auto_ack"] = True
    with Client(f"bench-consumer-{time.time_ns()}", **kwargs).connect(uri) as client:
        before = client.statistics()
        started = time.perf_counter()
        cpu = time.process_time()
        if mode == "auto-ack handler":
            done = threading.Event()
            count = 0

            def handle(msg) -> None:
                nonlocal count
                count += 1
                if count == n:
                    done.set()

            client.subscribe("Bench", max_backlog=backlog, handler=handle)
            if not done.wait(600):
                raise SystemExit("handler did not see every message")
        else:
            sub = client.subscribe("Bench", max_backlog=backlog)
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
        cpu_us = (time.process_time() - cpu) / n * 1e6
        after = client.statistics()
    print(f"{n / elapsed:.1f} {after.frames_sent - before.frames_sent} {after.ack_batches - before.ack_batches} "
          f"{cpu_us:.2f}", flush=True)


def measure(mode: str, backlog: int, uri: str, port: int, n: int, src: str | None) -> tuple[float, int, int, float]:
    """One run in a fresh consumer process; ``src``: import conveyor's client from that
    source tree instead (the baseline)."""
    uvloop.run(conveyor_fill(port, n))
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([src, str(Path(__file__).resolve().parent.parent)])
    code = f"from bench.bench_client import worker; worker({mode!r}, {uri!r}, {n}, {backlog})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=True,
                         env=env, cwd=Path(__file__).resolve().parent.parent).stdout.split()
    return float(out[0]), int(out[1]), int(out[2]), float(out[3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", metavar="SRC", help="also run each case with the client of this source tree "
                        "(the src/ directory of another checkout), interleaved")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    trees: dict[str, str | None] = {"this tree": None}
    if args.baseline:
        trees = {"baseline": str(Path(args.baseline).resolve()), "this tree": None}
    results: dict[tuple, list[tuple[float, int, int, float]]] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        proc, port, _ = start_conveyor(Path(tmp))
        uri = f"tcp://127.0.0.1:{port}"
        try:
            for run in range(args.runs):
                for mode, backlog in CASES:
                    # the two trees take turns going first: the first of a pair runs faster
                    order = list(trees.items())
                    for tree, src in (order if run % 2 == 0 else order[::-1]):
                        r = measure(mode, backlog, uri, port, args.messages, src)
                        results.setdefault((mode, backlog, tree), []).append(r)
                        print(f"run {run + 1} {mode} backlog {backlog} ({tree}): {r[0]:,.0f} msg/s, "
                              f"{r[3]:.1f} client µs/msg, {r[1]:,} frames, {r[2]:,} ack commands", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    per_k = 1000 / args.messages
    head = "| consumer | backlog | msg/s received and acknowledged | client CPU µs/msg |"
    if args.baseline:
        head += " baseline msg/s | baseline client CPU µs/msg | CPU ratio |"
    rows = [head + " ack commands per 1,000 messages | frames per 1,000 messages |",
            "| --- | ---: | ---: | ---: |" + (" ---: | ---: | ---: |" if args.baseline else "") + " ---: | ---: |"]
    for mode, backlog in CASES:
        mine = results[(mode, backlog, "this tree")]
        rate, cpu = median([r[0] for r in mine]), median([r[3] for r in mine])
        row = f"| {mode} | {backlog} | {rate:,.0f} | {cpu:.1f} |"
        if args.baseline:
            base = results[(mode, backlog, "baseline")]
            b_rate, b_cpu = median([r[0] for r in base]), median([r[3] for r in base])
            row += f" {b_rate:,.0f} | {b_cpu:.1f} | {cpu / b_cpu:.2f} |"
        row += f" {median([r[2] for r in mine]) * per_k:,.1f} | {median([r[1] for r in mine]) * per_k:,.1f} |"
        rows.append(row)
    table = "\n".join(rows)
    print(table)
    if args.write:
        baseline = (f" Baseline: the same cases with the client of another checkout ({git_rev(args.baseline)}), "
                    "interleaved run by run with this tree's, the two taking turns to go first." if args.baseline else "")
        command = "--baseline OTHER/src --write" if args.baseline else "--write"
        body = f"""Command: `.venv/bin/python -m bench.bench_client {command}`.

One consumer process takes {args.messages:,} queued 256-byte messages from an
at-least-once queue and acknowledges each one; the queue is filled before each run
(untimed). Rate = messages / time from subscribing until `flush()` returns (every
acknowledgement persisted). Client CPU = the consumer process's CPU time (every thread)
over the same span, per message. `per-message`: `ack_batch_size=1`, every acknowledgement
sent at once (since this change, those the loop takes from the application's thread
together share one `sow_delete`; before, one each); `batched`: `msg.ack()` with the defaults (a batch per half backlog, 100 acks, or
50 ms); `auto-ack`: `auto_ack=True` (iterator: asking for the next message acknowledges
the previous; handler: returning acknowledges); `asyncio`: the `AsyncClient` on uvloop,
`msg.ack()` batched; `bare socket`: no client, one thread on a blocking socket with the
frame codec and a `sow_delete` per half backlog (the floor under any Python client on
this machine). The blocking client runs its network loop on a thread of its own
(uvloop), so at backlog 10 each round trip of 5-10 messages costs two thread hand-offs
and several system calls: its fixed cost, not the per-message work, sets the CPU figure
there. Ack commands: the `sow_delete` commands the acknowledgements became. Frames:
everything the consumer sent.{baseline}
Medians of {args.runs} runs, one server process for all of them.

Machine: {machine()}; commit {git_rev()}.

{table}
"""
        write_section("Client: receive and acknowledge", body)


if __name__ == "__main__":
    main()
