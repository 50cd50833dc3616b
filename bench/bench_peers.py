"""conveyor beside NATS JetStream and Redis Streams, in one run, interleaved.

Five workloads, each on a fresh server process per system and repetition, the systems
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
  message, and in a second row one XACK per batch);
- **latency at 5,000 msg/s**: one process publishes 256-byte messages carrying their
  publish time (a batch every millisecond) and consumes them, acknowledging each:
  conveyor through a queue (backlog 100; delivered once fsynced), NATS through a push
  consumer on a work-queue stream, Redis through a consumer group (XREADGROUP COUNT 100
  BLOCK, one XACK per batch; with `always` both the XADD reply and the reader's copy
  leave after the fsync, with `everysec` before it); latency = arrival - publish call;
- **memory per queued message**: RSS of the server holding ``--queued`` messages (after
  the restart below, so it holds no payload cache it built while filling) minus the RSS
  of the same server started empty, per message;
- **kill -9 to first delivery**: ``--queued`` messages queued, the server SIGKILLed,
  started again on its files; seconds from the start of the process to a consumer's
  first message (conveyor twice: killed right after the fill, and again after a periodic
  checkpoint has snapshotted the queue, as it does every few seconds).

For each run the server process's own CPU time (user + system, from /proc) is read
around the workload: server CPU µs per message is steadier than the rate on a shared
machine. A system whose server is not installed is skipped with one line.

    python -m bench.bench_peers [--messages N] [--queued N] [--latency-seconds S] [--runs 3] [--write]
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

from bench.bench_latency import cpu_seconds, measure, no_collection, pace, stamp_of, summarize, wait_count
from bench.bench_publish import PAYLOAD, free_port, publish_only, start_nats, wait_port
from bench.bench_queue import conveyor_fill, drain, measure_restart_and_memory, nats_fill, rss_bytes
from bench.bench_queue import start_conveyor as start_conveyor_queue
from bench.report import git_rev, machine, median, write_section

REDIS_PIPELINE = 1000  # commands per pipeline: the client's batching, like the others' windows
NATS_WINDOW = 5000  # publishes in flight
LATENCY_RATE = 5000  # msg/s
LATENCY_WARMUP_S = 2.0


# --- servers ----------------------------------------------------------------------------------


def start_redis(workdir: Path, fsync: str, port: int | None = None, wait: bool = True) -> tuple[subprocess.Popen, int]:
    """Redis with its append-only file under ``workdir``; ``wait``: until its port is open."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server")
    port = port or free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--appendonly", "yes",
         "--appendfsync", fsync, "--save", "", "--daemonize", "no", "--protected-mode", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    if wait:
        wait_port(port)
    return proc, port


def start(system: str, workdir: Path, port: int | None = None, wait: bool = True) -> tuple[subprocess.Popen, int]:
    if system == "conveyor":
        proc, port, _ = start_conveyor_queue(workdir, port)
        return proc, port
    if system == "nats":
        return start_nats(workdir, port, wait)
    return start_redis(workdir, system.split("-", 1)[1], port, wait)


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


# --- latency at a steady rate -----------------------------------------------------------------


async def nats_latency(port: int, pid: int, seconds: float) -> dict[str, float]:
    import nats
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="LAT", subjects=["lat"], storage=StorageType.FILE, retention=RetentionPolicy.WORK_QUEUE))
    latencies: list[int] = []
    from_ns = [1 << 62]

    async def on_message(msg) -> None:
        got = time.perf_counter_ns()
        stamp = stamp_of(msg.data)
        if stamp >= from_ns[0]:
            latencies.append(got - stamp)
        await msg.ack()

    await js.subscribe("lat", durable="lat", cb=on_message, manual_ack=True)
    pending: list = []

    def send(batch: list[bytes]) -> None:
        pending.extend(asyncio.ensure_future(js.publish("lat", payload)) for payload in batch)

    sent, used = await _paced(pid, seconds, send, pending, latencies, from_ns)
    await nc.close()
    return summarize(latencies, sent, used)


async def redis_latency(port: int, pid: int, seconds: float) -> dict[str, float]:
    import redis.asyncio as redis

    publisher, reader = redis.Redis(port=port), redis.Redis(port=port)
    await publisher.xgroup_create("lat", "g", id="0", mkstream=True)
    latencies: list[int] = []
    from_ns = [1 << 62]
    stop = asyncio.Event()

    async def consume() -> None:
        while not stop.is_set():
            got = await reader.xreadgroup("g", "c", {"lat": ">"}, count=100, block=100)
            now = time.perf_counter_ns()
            for _stream, entries in got:
                for _id, fields in entries:
                    stamp = stamp_of(fields[b"d"])
                    if stamp >= from_ns[0]:
                        latencies.append(now - stamp)
                await reader.xack("lat", "g", *(mid for mid, _ in entries))

    consumer = asyncio.ensure_future(consume())
    pending: list = []

    def send(batch: list[bytes]) -> None:
        pipe = publisher.pipeline(transaction=False)
        for payload in batch:
            pipe.xadd("lat", {"d": payload})
        pending.append(asyncio.ensure_future(pipe.execute()))

    sent, used = await _paced(pid, seconds, send, pending, latencies, from_ns)
    stop.set()
    await consumer
    await publisher.aclose()
    await reader.aclose()
    return summarize(latencies, sent, used)


async def _paced(pid: int, seconds: float, send, pending: list, latencies: list, from_ns: list[int]
                 ) -> tuple[int, float]:
    """Publish at LATENCY_RATE through ``send``, then wait for the publishes' replies
    (``pending``) and for every measured arrival: (messages sent in the measured span,
    the server's CPU seconds over it). ``from_ns[0]`` is set when the span begins."""
    cpu0: list[float] = []

    def window() -> None:
        cpu0.append(cpu_seconds(pid))
        from_ns[0] = time.perf_counter_ns()

    with no_collection():
        sent = await pace(LATENCY_RATE, seconds, LATENCY_WARMUP_S, send, window)
        await asyncio.gather(*pending)
        await wait_count(latencies, sent)
        return sent, cpu_seconds(pid) - cpu0[0]


def latency(system: str, proc: subprocess.Popen, port: int, seconds: float) -> dict[str, float]:
    if system == "conveyor":
        return uvloop.run(measure(port, proc.pid, LATENCY_RATE, seconds, LATENCY_WARMUP_S, [0.0, 0.0]))
    if system == "nats":
        return uvloop.run(nats_latency(port, proc.pid, seconds))
    return uvloop.run(redis_latency(port, proc.pid, seconds))


# --- memory and kill -9 to first delivery -----------------------------------------------------


async def _first(attempt, deadline: float) -> float:
    """The time ``attempt()`` first returns one (a message's arrival): it is tried again
    every 5 ms, on an error too (the server is still starting), until ``deadline``."""
    while True:
        try:
            got = await attempt()
            if got is not None:
                return got
        except Exception:
            if time.perf_counter() > deadline:
                raise
        if time.perf_counter() > deadline:
            raise TimeoutError("no message before the deadline")
        await asyncio.sleep(0.005)


async def nats_first(port: int, deadline: float) -> float:
    import nats

    async def quiet(_error) -> None:  # refused connections while the server starts
        pass

    async def attempt() -> float | None:
        await _open(port)
        nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False, connect_timeout=1, error_cb=quiet)
        try:
            psub = await nc.jetstream().pull_subscribe("bench", durable="workers", stream="BENCH")
            msgs = await psub.fetch(1, timeout=10)
            return time.perf_counter() if msgs else None
        finally:
            await nc.close()

    return await _first(attempt, deadline)


async def _open(port: int) -> None:
    """Once the port accepts a connection (the clients' own first attempts are slower
    to retry)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()


async def redis_first(port: int, deadline: float) -> float:
    import redis.asyncio as redis

    client = redis.Redis(port=port)

    async def attempt() -> float | None:  # Redis answers LOADING until it has read its append-only file
        got = await client.xreadgroup("workers", "probe", {"bench": ">"}, count=1, block=10_000)
        return time.perf_counter() if got else None

    try:
        return await _first(attempt, deadline)
    finally:
        await client.aclose()


def restart_and_memory(system: str, queued: int, workdir: Path) -> dict[str, float]:
    """Seconds from a restart after SIGKILL to the first delivery, and bytes of RSS per
    queued message (conveyor: bench_queue's measure, which also restarts after a
    checkpoint)."""
    if system == "conveyor":
        restart_s, checkpointed_s, per_msg, _ = measure_restart_and_memory(queued, workdir)
        return {"restart_s": restart_s, "checkpointed_s": checkpointed_s, "bytes_per_msg": per_msg}
    proc, port = start(system, workdir)
    time.sleep(1.0)
    idle = rss_bytes(proc.pid)
    try:
        fill(system, port, queued)
    finally:
        proc.kill()
        proc.wait()
    started = time.perf_counter()
    proc, _ = start(system, workdir, port, wait=False)
    try:
        first = nats_first if system == "nats" else redis_first
        got = uvloop.run(first(port, started + 300))
        time.sleep(0.5)
        per_msg = (rss_bytes(proc.pid) - idle) / queued
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"restart_s": got - started, "bytes_per_msg": per_msg}


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
    ("conveyor", "conveyor", "latency", None),
    ("NATS JetStream (acks before the fsync)", "nats", "latency", None),
    ("Redis Streams, appendfsync always", "redis-always", "latency", None),
    ("Redis Streams, appendfsync everysec", "redis-everysec", "latency", None),
    ("conveyor", "conveyor", "restart", None),
    ("NATS JetStream", "nats", "restart", None),
    ("Redis Streams (AOF, appendfsync always)", "redis-always", "restart", None),
]

#: workload -> the table's lines for it: (figure, keys of the run's result, format, server CPU shown)
FIGURES = {
    "publish": [("msg/s", ("rate",), "{:,.0f}", True)],
    "drain": [("msg/s", ("rate",), "{:,.0f}", True)],
    "latency": [("latency p50 / p99 / max, ms", ("p50_ms", "p99_ms", "max_ms"), "{:.2f}", True)],
    "restart": [
        ("kill -9 to first delivery, s", ("restart_s",), "{:.2f}", False),
        ("the same after a checkpoint, s", ("checkpointed_s",), "{:.2f}", False),
        ("bytes of RSS per queued message", ("bytes_per_msg",), "{:,.0f}", False),
    ],
}


def run_one(system: str, workload: str, acks: int | None, args, workdir: Path) -> dict[str, float]:
    """The run's figures (FIGURES' keys) and ``cpu``, server CPU µs per message."""
    if workload == "restart":
        return restart_and_memory(system, args.queued, workdir)
    n = args.messages
    proc, port = start(system, workdir)
    try:
        if workload == "latency":
            out = latency(system, proc, port, args.latency_seconds)
            return {**out, "cpu": out["server_us_per_msg"]}
        if workload == "publish":
            before, started = cpu_seconds(proc.pid), time.perf_counter()
            publish(system, port, n)
            seconds = time.perf_counter() - started
            used = cpu_seconds(proc.pid) - before
            return {"rate": n / seconds, "cpu": 1e6 * used / n}
        fill(system, port, n)
        before = cpu_seconds(proc.pid)
        kind = "redis" if system.startswith("redis") else system
        rate = drain(kind, uri(system, port), 4, 10, n, acks)
        used = cpu_seconds(proc.pid) - before
        return {"rate": rate, "cpu": 1e6 * used / n}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _printable(out: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:,.2f}" for k, v in out.items() if k != "messages")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000, help="published, and drained (default 100000)")
    ap.add_argument("--queued", type=int, default=1_000_000, help="held for memory and restart (default 1000000)")
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="measured seconds at 5,000 msg/s (default 10)")
    ap.add_argument("--workloads", default="publish,drain,latency,restart", help="a comma-separated subset")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    args = ap.parse_args()
    wanted = set(args.workloads.split(","))
    if wanted - set(FIGURES):
        ap.error(f"unknown workloads: {', '.join(sorted(wanted - set(FIGURES)))}")
    rows = []
    for label, system, workload, acks in ROWS:
        if workload not in wanted:
            continue
        if available(system):
            rows.append((label, system, workload, acks))
        else:
            print(f"skipping {workload} {label}: {system.split('-')[0]} is not installed (make bench-peers)", flush=True)
    results: dict[tuple[str, str], list[dict[str, float]]] = {(label, workload): [] for label, _, workload, _ in rows}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for run in range(args.runs):
            for i, (label, system, workload, acks) in enumerate(rows):
                workdir = Path(tmp) / f"{run}-{i}"
                workdir.mkdir()
                out = run_one(system, workload, acks, args, workdir)
                results[label, workload].append(out)
                print(f"run {run + 1} {workload} {label}: {_printable(out)}", flush=True)
            loads.append(os.getloadavg()[0])
    table = _table(rows, results)
    print(table)
    if args.write:
        write_section("Peers: conveyor, NATS JetStream and Redis Streams, same run", f"""Command:
`.venv/bin/python -m bench.bench_peers --messages {args.messages} --queued {args.queued} --latency-seconds {args.latency_seconds:g} --runs {args.runs} --write`
(`make bench-peers` installs the peers: Debian's `redis-server`, the `nats-server` binary
of the bench extra). What each workload does and what "persisted" means for each system:
see the module header of `bench/bench_peers.py`; in short, conveyor and Redis `always`
acknowledge after the fsync, Redis `everysec` and NATS (file store, default
`sync_interval` of 2 minutes) before.

Machine: {machine()}; commit {git_rev()}; 1-minute load average at the start and after each
repetition: {", ".join(f"{x:.1f}" for x in loads)}. {args.runs} repetitions, the systems
interleaved within each, medians; ratios against the conveyor row of the same workload
(above 1: that system does more per second, or takes more time, memory or CPU per message).

{table}
""")


def _table(rows, results) -> str:
    out = ["| workload | system | figure | median | vs conveyor | server CPU µs/msg | CPU/msg vs conveyor |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    base: dict[tuple[str, str], tuple[float, ...]] = {}
    for label, system, workload, _ in rows:
        runs = results[label, workload]
        for figure, keys, fmt, with_cpu in FIGURES[workload]:
            if keys[0] not in runs[0]:
                continue
            values = tuple(median([r[k] for r in runs]) for k in keys)
            # a peer's restart compares with conveyor's worst case, killed before a checkpoint
            if system == "conveyor":
                base.setdefault((workload, figure), values)
            ref = base.get((workload, figure), values)
            cpu = median([r["cpu"] for r in runs]) if with_cpu else None
            if with_cpu and system == "conveyor":
                base.setdefault((workload, "cpu"), (cpu,))
            cells = [
                " / ".join(fmt.format(v) for v in values),
                " / ".join(f"{v / r:.2f}" for v, r in zip(values, ref)),
                "" if cpu is None else f"{cpu:.1f}",
                "" if cpu is None else f"{cpu / base[workload, 'cpu'][0]:.2f}",
            ]
            out.append(f"| {workload} | {label} | {figure} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
