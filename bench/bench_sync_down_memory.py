"""What a down sync replication destination costs the source, in memory per publish.

Two engines wired by the cluster harness of the tests (real engines and journals, an
in-memory network); the link to the sync destination is cut, one publisher publishes N
messages (one frame each, persisted acks asked), and tracemalloc measures what the
source engine holds more than before. Then ``--publishers 50`` interleaves fifty.

    python -m bench.bench_sync_down_memory [--n 100000] [--publishers 1]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

from tests.engine.cluster import Cluster, destination, instance_xml


def measure(n: int, publishers: int) -> float:
    cluster = Cluster({"A": instance_xml("A", [destination("B", sync=True)]), "B": instance_xml("B", [])})
    cluster.connect_all()
    a = cluster.nodes["A"]
    conns = [a.connect(f"app-{i}") for i in range(publishers)]
    cluster.cut("A", "B")
    for seq in range(1, 1001):  # warm up: caches, first segment
        a.publish(conns[0], "Work", {"n": seq}, seq=seq, ack_type="persisted")
    a.commit()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(n):
        conn = conns[i % publishers]
        seq = 1001 + i // publishers if conn == conns[0] else 1 + i // publishers
        a.publish(conn, "Work", {"n": i}, seq=seq, ack_type="persisted")
        if i % 1000 == 999:
            a.commit()
    a.commit()
    a.acks(conns[0])  # what the harness collected for the test is not the engine's
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    # The journal (in memory here, on disk in a server) and the test harness are not
    # what the source holds for the destination: count the engine's allocations only.
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename")
                if "/conveyor/engine/" in stat.traceback[0].filename)
    return grown / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--publishers", type=int, default=1)
    args = ap.parse_args()
    print(f"{measure(args.n, args.publishers):.1f} bytes per publish held by the source "
          f"({args.n:,} publishes, {args.publishers} publisher(s), sync destination down)")


if __name__ == "__main__":
    main()
