"""conveyor beside NATS JetStream and Redis Streams, in one run, interleaved.

Two workloads, each on a fresh server process per system and repetition, the systems
taking turns within each repetition (3 by default; medians):

- **persisted publish**: N messages of 256 bytes from one pipelined Python client, each
  acknowledged once durable as the system defines it (conveyor: fsynced group commit;
  Redis: `appendonly yes` with `appendfsync always`, and again with `everysec`, which
  acknowledges before the fsync; NATS JetStream: file store, whose `sync_interval`
  defaults to 2 minutes, so an acknowledged publish is in the page cache, not on disk);
- **queue drain**: N messages queued first, then 4 consumer processes with a backlog of
  10 each acknowledge every message (conveyor: a queue subscription, acks batched per 5
  and, in a second row, one per message; NATS: a durable pull consumer on a work-queue
  stream, fetch 10, ack each; Redis: a consumer group, XREADGROUP COUNT 10, XACK per
  message, and in a second row one XACK per batch).

For each run the server process's own CPU time (user + system, from /proc) is read
around the workload: server CPU µs per message is steadier than the rate on a shared
machine. A system whose server is not installed is skipped with one line.
Restart time, latency and memory per queued message are measured for conveyor alone
(bench_queue, bench_latency) and not repeated here.

    python -m bench.bench_peers [--messages N] [--runs 3] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench.bench_latency import cpu_seconds
from bench.bench_publish import PAYLOAD, free_port, publish_only, start_nats, wait_port
from bench.bench_queue import conveyor_fill, drain, nats_fill
from bench.bench_queue import start_conveyor as start_conveyor_queue
from bench.report import git_rev, machine, median, write_section

REDIS_PIPELINE = 1000  # commands per pipeline: the client's batching, like the others' windows
NATS_WINDOW = 5000  # publishes in flight


# --- servers ----------------------------------------------------------------------------------


def start_redis(workdir: Path, fsync: str) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--appendonly", "yes",
         "--appendfsync", fsync, "--save", "", "--daemonize", "no", "--protected-mode", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, port


def start(system: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    if system == "conveyor":
        proc, port, _ = start_conveyor_queue(workdir)
        return proc, port
    if system == "nats":
        return start_nats(workdir)
    return start_redis(workdir, system.split("-", 1)[1])


def available(system: str) -> bool:
    if system == "nats":
        return bool(shutil.which("nats-server") or (Path(sys.executable).parent / "nats-server").exists())
    if system.startswith("redis"):
        try:
            import redis  # noqa: F401
        except ImportError:
            return False
        return shutil.which("redis-server") is not None
    return True


# --- publish ----------------------------------------------------------------------------------


async def nats_publish(port: int, n: int) -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="PUB", subjects=["pub"], storage=StorageType.FILE))
    pending: list = []
    for _ in range(n):
        pending.append(asyncio.ensure_future(js.publish("pub", PAYLOAD)))
        if len(pending) >= NATS_WINDOW:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    await nc.close()


async def redis_add(port: int, n: int, stream: str = "bench") -> None:
    import redis.asyncio as redis

    client = redis.Redis(port=port)
    for start in range(0, n, REDIS_PIPELINE):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(REDIS_PIPELINE, n - start)):
            pipe.xadd(stream, {"d": PAYLOAD})
        await pipe.execute()  # the replies come after the AOF write (and, with always, its fsync)
    await client.aclose()


def publish(system: str, port: int, n: int) -> None:
    if system == "conveyor":
        uvloop.run(publish_only(port, n))
    elif system == "nats":
        uvloop.run(nats_publish(port, n))
    else:
        uvloop.run(redis_add(port, n))


# --- drain ------------------------------------------------------------------------------------


async def redis_fill(port: int, n: int) -> None:
    import redis.asyncio as redis

    await redis_add(port, n)
    client = redis.Redis(port=port)
    await client.xgroup_create("bench", "workers", id="0")
    await client.aclose()


def fill(system: str, port: int, n: int) -> None:
    if system == "conveyor":
        uvloop.run(conveyor_fill(port, n))
    elif system == "nats":
        uvloop.run(nats_fill(port, n))
    else:
        uvloop.run(redis_fill(port, n))


def uri(system: str, port: int) -> str:
    scheme = {"conveyor": "tcp", "nats": "nats"}.get(system, "redis")
    return f"{scheme}://127.0.0.1:{port}"


# --- the run ----------------------------------------------------------------------------------

#: (row label, system, workload, worker acks per batch or None)
ROWS = [
    ("conveyor", "conveyor", "publish", None),
    ("NATS JetStream (file, sync every 2 min)", "nats", "publish", None),
    ("Redis Streams, appendfsync always", "redis-always", "publish", None),
    ("Redis Streams, appendfsync everysec", "redis-everysec", "publish", None),
    ("conveyor, acks batched (5)", "conveyor", "drain", 5),
    ("conveyor, one ack per message", "conveyor", "drain", 1),
    ("NATS JetStream, ack each", "nats", "drain", None),
    ("Redis always, XACK each", "redis-always", "drain", 1),
    ("Redis always, XACK per batch", "redis-always", "drain", 10),
    ("Redis everysec, XACK each", "redis-everysec", "drain", 1),
    ("Redis everysec, XACK per batch", "redis-everysec", "drain", 10),
]


def run_one(system: str, workload: str, acks: int | None, n: int, workdir: Path) -> tuple[float, float]:
    """(messages per second, server CPU µs per message)."""
    proc, port = start(system, workdir)
    try:
        if workload == "publish":
            before, started = cpu_seconds(proc.pid), time.perf_counter()
            publish(system, port, n)
            seconds = time.perf_counter() - started
            used = cpu_seconds(proc.pid) - before
            return n / seconds, 1e6 * used / n
        fill(system, port, n)
        before = cpu_seconds(proc.pid)
        kind = "redis" if system.startswith("redis") else system
        rate = drain(kind, uri(system, port), 4, 10, n, acks)
        used = cpu_seconds(proc.pid) - before
        return rate, 1e6 * used / n
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    args = ap.parse_args()
    rows = []
    for label, system, workload, acks in ROWS:
        if available(system):
            rows.append((label, system, workload, acks))
        else:
            print(f"skipping {label}: {system.split('-')[0]} is not installed (make bench-peers)", flush=True)
    results: dict[str, list[tuple[float, float]]] = {label: [] for label, *_ in rows}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for run in range(args.runs):
            for i, (label, system, workload, acks) in enumerate(rows):
                workdir = Path(tmp) / f"{run}-{i}"
                workdir.mkdir()
                rate, cpu = run_one(system, workload, acks, args.messages, workdir)
                results[label].append((rate, cpu))
                print(f"run {run + 1} {workload} {label}: {rate:,.0f} msg/s, server CPU {cpu:.1f} µs/msg", flush=True)
            loads.append(os.getloadavg()[0])
    table = _table(rows, results)
    print(table)
    if args.write:
        write_section("Peers: conveyor, NATS JetStream and Redis Streams, same run", f"""Command:
`.venv/bin/python -m bench.bench_peers --messages {args.messages} --runs {args.runs} --write` (`make bench-peers`
installs the peers: Debian's `redis-server`, the `nats-server` binary of the bench extra).
What each workload does and what "persisted" means for each system: see the module header
of `bench/bench_peers.py`; in short, conveyor and Redis `always` acknowledge after the
fsync, Redis `everysec` and NATS (file store, default `sync_interval` of 2 minutes) before.

Machine: {machine()}; commit {git_rev()}; 1-minute load average at the start and after each
repetition: {", ".join(f"{x:.1f}" for x in loads)}. {args.runs} repetitions, the systems
interleaved within each, medians; ratios against the conveyor row of the same workload
(above 1: that system does more per second, or spends more CPU per message).

{table}
""")


def _table(rows, results) -> str:
    out = ["| workload | system | msg/s | server CPU µs/msg | msg/s vs conveyor | CPU/msg vs conveyor |",
           "| --- | --- | ---: | ---: | ---: | ---: |"]
    base: dict[str, tuple[float, float]] = {}
    for label, system, workload, _ in rows:
        rate = median([r for r, _ in results[label]])
        cpu = median([c for _, c in results[label]])
        if system == "conveyor":
            base.setdefault(workload, (rate, cpu))
        b_rate, b_cpu = base.get(workload, (rate, cpu))
        out.append(f"| {workload} | {label} | {rate:,.0f} | {cpu:.1f} | {rate / b_rate:.2f} | {cpu / b_cpu:.2f} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
