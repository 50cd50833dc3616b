"""Persisted publishing and replay: conveyor beside NATS JetStream, in one run.

Workload (issue 2): one publisher, 256-byte messages, pipelined, waiting for persisted
acks, 100,000 messages; then a replay of all of them from the start of the log. Both
servers run as separate processes on loopback with their file stores under one temp
directory; both clients are Python (asyncio, uvloop) in this process.

    python -m bench.bench_publish [--messages N] [--runs 3] [--write]
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

from bench.ports import free_port, wait_port
from bench.report import git_rev, machine, median, write_section

PAYLOAD = b'{"pad":"' + b"x" * 246 + b'"}'
assert len(PAYLOAD) == 256


# --- conveyor -------------------------------------------------------------------------------

CONFIG = """<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport></Transports>
<TransactionLog><JournalDirectory>{journal}</JournalDirectory><Topic><Name>bench</Name><MessageType>json</MessageType></Topic></TransactionLog>
</AMPSConfig>"""


def start_conveyor(workdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cfg = workdir / "conveyor.xml"
    cfg.write_text(CONFIG.format(port=port, journal=workdir / "conveyor-journal"))
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, port


async def publish_only(port: int, n: int) -> float:
    """Seconds to publish ``n`` messages, each persisted, from one pipelined client."""
    from conveyor import AsyncClient

    client = await AsyncClient(f"bench-{time.time_ns()}", max_inflight=20_000).connect(f"tcp://127.0.0.1:{port}")
    start = time.perf_counter()
    for _ in range(n):
        await client.publish("bench", PAYLOAD)
    await client.wait_persisted(timeout=300)
    elapsed = time.perf_counter() - start
    await client.disconnect()
    return elapsed


async def conveyor_run(port: int, n: int) -> tuple[float, float]:
    from conveyor import AsyncClient

    publish_s = await publish_only(port, n)
    client = await AsyncClient(f"bench-{time.time_ns()}").connect(f"tcp://127.0.0.1:{port}")

    done = asyncio.Event()
    count = 0

    def on_message(_msg) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    start = time.perf_counter()
    await client.subscribe("bench", bookmark="0", on_message=on_message)
    await asyncio.wait_for(done.wait(), 300)
    replay_s = time.perf_counter() - start
    await client.disconnect()
    return publish_s, replay_s


# --- NATS JetStream -------------------------------------------------------------------------


def start_nats(workdir: Path, port: int | None = None, wait: bool = True) -> tuple[subprocess.Popen, int]:
    """A JetStream server storing under ``workdir``; ``wait``: until its port is open."""
    exe = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    port = port or free_port()
    store = workdir / "nats-store"
    proc = subprocess.Popen([exe, "-js", "-sd", str(store), "-p", str(port), "-a", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if wait:
        wait_port(port)
    return proc, port


async def nats_run(port: int, n: int, window: int = 5000) -> tuple[float, float]:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    stream = f"bench{time.time_ns()}"
    await js.add_stream(StreamConfig(name=stream, subjects=[stream], storage=StorageType.FILE))
    start = time.perf_counter()
    pending: list = []
    for _ in range(n):
        pending.append(asyncio.ensure_future(js.publish(stream, PAYLOAD)))
        if len(pending) >= window:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    publish_s = time.perf_counter() - start

    done = asyncio.Event()
    got = 0

    async def on_msg(_msg) -> None:
        nonlocal got
        got += 1
        if got >= n:
            done.set()

    start = time.perf_counter()
    # An ordered push consumer: the stream from the start, no acks (like a bookmark replay).
    sub = await js.subscribe(stream, cb=on_msg, ordered_consumer=True)
    await asyncio.wait_for(done.wait(), 300)
    await sub.unsubscribe()
    replay_s = time.perf_counter() - start
    await nc.close()
    return publish_s, replay_s


# --- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    parser.add_argument("--skip-nats", action="store_true")
    args = parser.parse_args()
    n = args.messages
    results: dict[str, dict[str, list[float]]] = {"conveyor": {"pub": [], "replay": []}, "nats": {"pub": [], "replay": []}}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        workdir = Path(tmp)
        for run in range(args.runs):
            for name in ("conveyor", "nats"):
                if name == "nats" and args.skip_nats:
                    continue
                rundir = workdir / f"{name}-{run}"
                rundir.mkdir()
                proc, port = (start_conveyor if name == "conveyor" else start_nats)(rundir)
                try:
                    fn = conveyor_run if name == "conveyor" else nats_run
                    pub_s, replay_s = uvloop.run(fn(port, n))
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                results[name]["pub"].append(n / pub_s)
                results[name]["replay"].append(n / replay_s)
                print(f"run {run + 1} {name}: publish {n / pub_s:,.0f} msg/s, replay {n / replay_s:,.0f} msg/s", flush=True)

    def fmt(name: str, key: str) -> str:
        vals = results[name][key]
        return f"{median(vals):,.0f}" if vals else "n/a"

    rows = [
        "| server | persisted publish (msg/s) | replay (msg/s) |",
        "| --- | ---: | ---: |",
        f"| conveyor | {fmt('conveyor', 'pub')} | {fmt('conveyor', 'replay')} |",
    ]
    if not args.skip_nats:
        rows.append(f"| NATS JetStream (file store, default fsync) | {fmt('nats', 'pub')} | {fmt('nats', 'replay')} |")
        rows.append(
            f"| ratio conveyor / NATS | {median(results['conveyor']['pub']) / median(results['nats']['pub']):.2f} | "
            f"{median(results['conveyor']['replay']) / median(results['nats']['replay']):.2f} |"
        )
    table = "\n".join(rows)
    print(table)
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_publish --write` (`make bench` runs every suite).

One publisher, {n:,} messages of 256 bytes, pipelined, waiting until every publish is
acknowledged as persisted (conveyor fsyncs before each persisted ack: group commit);
then one subscriber replays all of them from the start of the log. Python asyncio
clients (uvloop) for both servers, servers in their own processes on loopback.
Medians of {args.runs} runs, measured in one run of the script.

Machine: {machine()}; commit {git_rev()}.

{table}
"""
        write_section("Persisted publishing and replay", body)


if __name__ == "__main__":
    main()
