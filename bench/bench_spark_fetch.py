"""Spark, without Spark: how long a one-batch query's two tasks wait for their fetches.

A Spark source's micro-batch leases its batch in the driver, then its tasks start (a
few hundred milliseconds: Spark plans the partitions, launches the tasks and their Python
workers) and each fetches its half in packed pages, both at once. This makes those calls
from one process, alternating ``--trees`` when given, and reports the wall time of the
fetch phase (both halves read) after a pause of ``--pause`` seconds standing for the
tasks' start; with the payload cache's default 64 MB and no consumer while the batch was
published, about the first third of it is cached (bench_spark_steps' header), so the
rest is read from the journal, during the fetches or, with the leased batch's read-ahead
(docs/architecture.md, "The payload cache"), in the pause before them.

    python -m bench.bench_spark_fetch [--messages 200000] [--pause 0.3] [--rounds 4] [--trees A B]

With ``--trees``, each tree (a checkout whose ``src`` has its compiled build in place)
runs its own server in turn through ``PYTHONPATH``; the last line is a JSON object of
the medians per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.bench_spark import orders, publish, start_server


def run(n: int, pause: float, rounds: int) -> list[float]:
    """Fetch-phase wall seconds of each round (this process's conveyor)."""
    from conveyor.client.rpc import RpcClient

    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-fetch-"))
    server, uri = start_server(tmp)
    rows = orders(n)
    walls = []
    try:
        for rnd in range(rounds):
            publish(uri, rows, f"bench-pub-{rnd}")
            time.sleep(0.5)  # the publishes' durable side done
            consumer = f"c{rnd}"
            with RpcClient(uri, client_name=f"bench-driver-{rnd}") as rpc:
                epoch = rpc.claim("Orders", consumer, uuid.uuid4().hex).epoch
                assert rpc.lease("Orders", consumer, 0, n, 60.0, None, epoch).leased == n
                time.sleep(pause)
                got: list[int] = []

                def task(lo: int, hi: int) -> None:
                    with RpcClient(uri, client_name=f"bench-task-{rnd}-{lo}") as own:
                        got.append(sum(page.n for page in own.fetch_pages("Orders", consumer, lo, hi, page=10000,
                                                                          packed=True)))

                tasks = [threading.Thread(target=task, args=span) for span in ((0, n // 2), (n // 2, n))]
                started = time.perf_counter()
                for t in tasks:
                    t.start()
                for t in tasks:
                    t.join()
                walls.append(time.perf_counter() - started)
                assert sum(got) == n, f"fetched {sum(got)} of {n}"
                rpc.ack_through("Orders", consumer, n, epoch)
            print(f"round {rnd}: fetch phase {walls[-1]:.3f} s", file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(30)
    return walls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--pause", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--trees", nargs="*", default=None, help="checkouts to alternate, each with its build")
    parser.add_argument("--repeat", type=int, default=2, help="with --trees: runs of each, alternating")
    args = parser.parse_args()
    if not args.trees:
        walls = run(args.messages, args.pause, args.rounds)
        print(json.dumps({"fetch_phase_s": statistics.median(walls)}))
        return
    root = Path(__file__).resolve().parent.parent
    walls_of: dict[str, list[float]] = {tree: [] for tree in args.trees}
    for _ in range(args.repeat):
        for tree in args.trees:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(tree).resolve() / "src"), str(root)]))
            out = subprocess.run([sys.executable, "-m", "bench.bench_spark_fetch", "--messages", str(args.messages),
                                  "--pause", str(args.pause), "--rounds", str(args.rounds)],
                                 env=env, cwd=root, capture_output=True, text=True, check=True, timeout=1800)
            walls_of[tree].append(json.loads(out.stdout.strip().splitlines()[-1])["fetch_phase_s"])
            print(f"{tree}: fetch phase {walls_of[tree][-1]:.3f} s (median of {args.rounds} rounds)", flush=True)
    print(json.dumps({tree: statistics.median(w) for tree, w in walls_of.items()}))


if __name__ == "__main__":
    main()
