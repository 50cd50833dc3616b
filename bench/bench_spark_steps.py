"""Spark, without Spark: the server's share of one micro-batch, step by step.

``bench.bench_spark`` times whole queries: start-up, Spark's own work and the server's
share together, and its ratio moves by ten points from one run to the next on a shared
2-core host. This one makes the calls a one-batch query makes of the server, from one
client, and reports the server's CPU seconds for each step (read from /proc: every
thread of the server process), medians over rounds:

- ``lease``: the source's ``latestOffset`` leases N deliveries to a fresh named consumer;
- ``fetch``: its two tasks read their halves (packed pages, as the Arrow path does);
- ``stage``: the sink's two tasks stage N result rows (one handle each);
- ``commit``: the sink's commit publishes them and acknowledges the N deliveries (the
  fence) in one step;
- ``end``: the ``lease`` that finds nothing new and the ``ack_through`` the source sends
  at the end of the query.

Before each round N JSON messages (as bench_spark's) are published, untimed. The
payload cache holds what it admits of them (docs/architecture.md, "The payload cache"):
with the default 64 MB and no consumer while they are published, about the first third,
so the second task's fetch reads the journal.

    python -m bench.bench_spark_steps [--messages 200000] [--rounds 5] [--write]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from bench.bench_latency import cpu_seconds
from bench.bench_spark import orders, publish, start_server
from bench.report import git_rev, machine, median, write_section

STEPS = ("lease", "fetch", "stage", "commit", "end")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from conveyor.client.rpc import RpcClient
    from conveyor.native import describe
    from conveyor.spark import fencing

    n, half = args.messages, args.messages // 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-steps-"))
    server, uri = start_server(tmp)

    rows = orders(n)
    results = [row[:60] for row in rows]
    seconds: dict[str, list[float]] = {step: [] for step in STEPS}
    try:
        for rnd in range(args.rounds):
            publish(uri, rows, f"bench-pub-{rnd}")
            time.sleep(0.5)  # the publishes' durable side done
            consumer, query = f"c{rnd}", f"q{rnd}"
            with RpcClient(uri, client_name=f"bench-steps-{rnd}") as rpc:
                epoch = rpc.claim("Orders", consumer, uuid.uuid4().hex).epoch
                handles = [f"{query}/0/{part}/0-{uuid.uuid4().hex[:16]}" for part in range(2)]

                def lease() -> None:
                    assert rpc.lease("Orders", consumer, 0, n, 60.0, None, epoch).leased == n

                def fetch() -> None:
                    for lo in (0, half):
                        got = sum(page.n for page in rpc.fetch_pages("Orders", consumer, lo, min(n, lo + half),
                                                                     page=10000, packed=True))
                        assert got == min(n, lo + half) - lo

                def stage() -> None:
                    for part, (lo, hi) in enumerate(((0, half), (half, n))):
                        for a in range(lo, hi, 10000):
                            rpc.stage(handles[part], "results", results[a:min(hi, a + 10000)])

                def commit() -> None:
                    fences = fencing.parse([fencing.token("Orders", consumer, epoch, n)])
                    outcome, _ = rpc.commit_txn(f"bench/{query}", 1, handles, fences)
                    assert outcome == "published"

                def end() -> None:
                    assert rpc.lease("Orders", consumer, n, n, 60.0, None, epoch).leased == 0
                    assert rpc.ack_through("Orders", consumer, n, epoch).acked == n

                line = []
                for step, call in zip(STEPS, (lease, fetch, stage, commit, end)):
                    before = cpu_seconds(server.pid)
                    call()
                    seconds[step].append(cpu_seconds(server.pid) - before)
                    line.append(f"{step} {seconds[step][-1]:.2f}s")
            print(f"round {rnd + 1}: " + ", ".join(line), flush=True)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {step: median(seconds[step]) for step in STEPS}
    source = med["lease"] + med["fetch"] + med["end"]
    table = "\n".join([
        "| step | server CPU, s | µs a message |",
        "| --- | ---: | ---: |",
        *(f"| {step} | {med[step]:.3f} | {med[step] / n * 1e6:.2f} |" for step in STEPS),
        f"| the source's share (lease, fetch, end) | {source:.3f} | {source / n * 1e6:.2f} |",
    ])
    print(table)
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_spark_steps --write` ({n:,} messages of about 110
bytes, {args.rounds} rounds, medians; the server {describe()}).

Machine: {machine()}; commit {git_rev()}. The calls a one-batch query of `bench.bench_spark`
makes of the server, made by one client without Spark, and the server's CPU for each
(all its threads, from /proc). The sink's steps (stage, commit) are the same for the
file source's query into the conveyor sink; the source's share is what the conveyor
query pays beyond it on the server.

{table}
"""
        write_section("Spark: the server's share of a micro-batch", body)
    # the last line, for bench.ab: server CPU seconds per step
    print(json.dumps({**med, "source": source}))


if __name__ == "__main__":
    main()
