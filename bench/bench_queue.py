"""Queue draining, memory per queued message and restart time, beside NATS JetStream.

Issue 4 workloads:
- drain 100,000 queued 256-byte messages with 4 consumer processes, backlog 10, every
  message acknowledged (conveyor: batched acks; NATS: a shared durable pull consumer
  on a work-queue stream, fetch 10, ack each);
- server memory per queued message with 1,000,000 queued (RSS after a restart, which
  holds no payload cache, minus the same server with an empty journal);
- time from the restart of the server process to the first delivery, 1,000,000 queued.

    python -m bench.bench_queue [--messages N] [--queued N] [--runs 3] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

import conveyor
from bench.bench_publish import PAYLOAD, free_port, start_nats, wait_port
from bench.report import git_rev, machine, median, write_section
from conveyor.server.server import CHECKPOINT_INTERVAL_S

CONFIG = """<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport></Transports>
<TransactionLog><JournalDirectory>{journal}</JournalDirectory><Topic><Name>bench</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW><Queue><Name>Bench</Name><MessageType>json</MessageType><UnderlyingTopic>bench</UnderlyingTopic>
<Semantics>at-least-once</Semantics><MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog></Queue></SOW>
</AMPSConfig>"""


def start_conveyor(
    workdir: Path, port: int | None = None, config: str = CONFIG, gc_probe: Path | None = None
) -> tuple[subprocess.Popen, int, float]:
    """A server over ``workdir``; ``gc_probe``: its collections timed into that file
    (bench.gc_probe)."""
    port = port or free_port()
    cfg = workdir / "conveyor.xml"
    cfg.write_text(config.format(port=port, journal=workdir / "journal"))
    started = time.perf_counter()
    probe = ["-m", "bench.gc_probe", str(gc_probe)] if gc_probe is not None else ["-m"]
    proc = subprocess.Popen([sys.executable, *probe, "conveyor", "serve", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, timeout=300)
    return proc, port, started


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


#: The priority queue's payloads: 64 priorities, taken in turn (256 bytes, as PAYLOAD).
PRIORITY_PAYLOADS = [b'{"p":%2d,"pad":"' % k + b"x" * 238 + b'"}' for k in range(64)]
PRIORITY_CONFIG = CONFIG.replace("<UnderlyingTopic>bench</UnderlyingTopic>", "<UnderlyingTopic>bench</UnderlyingTopic><Priority>/p</Priority>")


async def conveyor_fill(port: int, n: int, topic: str = "bench", payloads: list[bytes] | None = None) -> None:
    """``n`` publishes of PAYLOAD, or of ``payloads`` in turn."""
    from conveyor import AsyncClient

    client = await AsyncClient(f"filler-{time.time_ns()}", max_inflight=20_000).connect(f"tcp://127.0.0.1:{port}")
    payloads = payloads or [PAYLOAD]
    for i in range(n):
        await client.publish(topic, payloads[i % len(payloads)])
    await client.wait_persisted(timeout=600)
    await client.disconnect()


async def nats_fill(port: int, n: int) -> None:
    import nats
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="BENCH", subjects=["bench"], storage=StorageType.FILE, retention=RetentionPolicy.WORK_QUEUE))
    await js.add_consumer("BENCH", durable_name="workers", ack_policy="explicit", max_ack_pending=1000)
    pending = []
    for _ in range(n):
        pending.append(asyncio.ensure_future(js.publish("bench", PAYLOAD)))
        if len(pending) >= 5000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    await nc.close()


def drain(kind: str, uri: str, workers: int, backlog: int, n: int, ack_batch: int | None = None) -> float:
    extra = [str(ack_batch)] if ack_batch is not None else []
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.queue_worker", kind, uri, f"w{i}-{time.time_ns()}", str(backlog), *extra],
            stdout=subprocess.PIPE, text=True,
        )
        for i in range(workers)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    # Workers are subscribed: the clock starts when the last one is ready. The queue was
    # filled before they started, so all of it is waiting for them.
    start = time.perf_counter()
    counts = []
    ends = []
    for p in procs:
        out = p.communicate(timeout=600)[0]
        counts.append(int(out.split()[-1]))
        ends.append(time.perf_counter())
    total = sum(counts)
    assert total >= n, f"{kind}: drained {total} of {n}"
    # Each worker stops after 1 s of idleness: subtract it.
    return n / (max(ends) - start - 1.0)


def measure_drain(kind: str, n: int, workdir: Path) -> float:
    if kind == "conveyor":
        proc, port, _ = start_conveyor(workdir)
        uri = f"tcp://127.0.0.1:{port}"
        fill = conveyor_fill
    else:
        proc, port = start_nats(workdir)
        uri = f"nats://127.0.0.1:{port}"
        fill = nats_fill
    try:
        uvloop.run(fill(port, n))
        return drain(kind, uri, 4, 10, n)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def first_delivery(port: int, deadline: float) -> float:
    from conveyor import AsyncClient

    while True:
        try:
            client = await AsyncClient(f"probe-{time.time_ns()}", timeout=120).connect(f"tcp://127.0.0.1:{port}")
            break
        except Exception:
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(0.005)
    sub = await client.subscribe("Bench", max_backlog=1)
    msg = await sub.get(timeout=120)
    assert msg is not None
    got = time.perf_counter()
    await client.disconnect()
    return got


def restart_to_first_delivery(workdir: Path) -> tuple[subprocess.Popen, float]:
    """Start the server on ``workdir``'s journal: (the process, seconds to the first
    delivery). The package's bytecode is compiled first, as an installed wheel's is: a
    start that compiles every module (``PYTHONDONTWRITEBYTECODE`` with a source tree)
    takes about 0.2 s more."""
    compileall.compile_dir(Path(conveyor.__file__).parent, quiet=1)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--config", str(workdir / "conveyor.xml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    port = int(re.search(r"127\.0\.0\.1:(\d+)", (workdir / "conveyor.xml").read_text()).group(1))
    try:
        got = uvloop.run(first_delivery(port, started + 300))
    except BaseException:
        proc.kill()
        raise
    return proc, got - started


def measure_restart_and_memory(queued: int, workdir: Path, priority: bool = False) -> tuple[float, float, float, float]:
    """(seconds from restart to first delivery when the server was SIGKILLed right after
    the fill, the same after a periodic checkpoint (the queue's snapshot), bytes per
    queued message (RSS), idle RSS); ``priority``: the queue has a Priority."""
    config = PRIORITY_CONFIG if priority else CONFIG
    empty_dir = workdir / "empty"
    empty_dir.mkdir()
    proc, port, _ = start_conveyor(empty_dir, config=config)
    time.sleep(1.0)
    idle_rss = rss_bytes(proc.pid)
    proc.terminate()
    proc.wait()

    proc, port, _ = start_conveyor(workdir, config=config)
    uvloop.run(conveyor_fill(port, queued, payloads=PRIORITY_PAYLOADS if priority else None))
    proc.kill()
    proc.wait()
    proc, restart_s = restart_to_first_delivery(workdir)
    try:
        time.sleep(0.5)
        per_msg = (rss_bytes(proc.pid) - idle_rss) / queued
        time.sleep(CHECKPOINT_INTERVAL_S + 3.0)  # a periodic checkpoint: the queue's snapshot
    finally:
        proc.kill()
        proc.wait()
    proc, checkpointed_s = restart_to_first_delivery(workdir)
    proc.terminate()
    proc.wait()
    return restart_s, checkpointed_s, per_msg, idle_rss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--skip-nats", action="store_true")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"conveyor": [], "nats": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        for run in range(args.runs):
            for kind in ("conveyor", "nats"):
                if kind == "nats" and args.skip_nats:
                    continue
                d = root / f"{kind}-{run}"
                d.mkdir()
                rate = measure_drain(kind, args.messages, d)
                rates[kind].append(rate)
                print(f"run {run + 1} {kind}: drained {rate:,.0f} msg/s", flush=True)
        d = root / "restart"
        d.mkdir()
        restart_s, checkpointed_s, per_msg, idle_rss = measure_restart_and_memory(args.queued, d)
        print(f"restart to first delivery with {args.queued:,} queued: {restart_s:.2f} s killed after the fill, "
              f"{checkpointed_s:.2f} s after a checkpoint; {per_msg:.0f} B/queued message (RSS)", flush=True)
        d = root / "restart-priority"
        d.mkdir()
        p_restart_s, p_checkpointed_s, p_per_msg, _ = measure_restart_and_memory(args.queued, d, priority=True)
        print(f"priority queue: {p_restart_s:.2f} s killed after the fill, {p_checkpointed_s:.2f} s after a "
              f"checkpoint; {p_per_msg:.0f} B/queued message (RSS)", flush=True)
    rows = ["| measure | conveyor | NATS JetStream | ratio |", "| --- | ---: | ---: | ---: |"]
    c = median(rates["conveyor"])
    if rates["nats"]:
        nn = median(rates["nats"])
        rows.append(f"| drain {args.messages:,} x 256 B, 4 consumer processes, backlog 10 (msg/s) | {c:,.0f} | {nn:,.0f} | {c / nn:.2f} |")
    else:
        rows.append(f"| drain {args.messages:,} x 256 B, 4 consumer processes, backlog 10 (msg/s) | {c:,.0f} | | |")
    rows.append(f"| server memory per queued message, {args.queued:,} queued (RSS delta) | {per_msg:.0f} B | | |")
    rows.append(f"| restart to first delivery, {args.queued:,} queued, SIGKILL right after the fill | {restart_s:.2f} s | | |")
    rows.append(f"| restart to first delivery, {args.queued:,} queued, SIGKILL after a periodic checkpoint | "
                f"{checkpointed_s:.2f} s | | |")
    rows.append(f"| priority queue (64 priorities): memory per queued message | {p_per_msg:.0f} B | | |")
    rows.append(f"| priority queue: restart to first delivery, SIGKILL right after the fill | {p_restart_s:.2f} s | | |")
    rows.append(f"| priority queue: restart to first delivery, SIGKILL after a periodic checkpoint | {p_checkpointed_s:.2f} s | | |")
    table = "\n".join(rows)
    print(table)
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_queue --write`.

Drain: the queue is filled first (untimed); then 4 consumer processes subscribe with
backlog 10 and acknowledge every message (conveyor batches acknowledgements, 5 per
frame; NATS acks each message of a shared durable pull consumer on a work-queue
stream, fetching 10 at a time). Rate = messages / time until the last consumer is done.
Medians of {args.runs} runs. Memory: RSS of the server after a restart with
{args.queued:,} messages queued, minus the RSS of the same server with an empty
journal, per message (the payload cache is empty after a restart; it is bounded at
64 MiB in any case). Restart: from starting the server process to the first message a
consumer receives, after a SIGKILL right after the fill (the publishes since the last
periodic checkpoint are replayed), then again after a SIGKILL once a periodic checkpoint
(every {CHECKPOINT_INTERVAL_S:.0f} s; it holds the queue's snapshot) has been written.

Machine: {machine()}; commit {git_rev()}.

{table}
"""
        write_section("Queues: drain, memory, restart", body)


if __name__ == "__main__":
    main()
