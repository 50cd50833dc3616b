"""State of the World: SOW publish rate and memory per record, restart time, the cost a
view over a queue adds to the drain, and aggregated subscription update latency.

    python -m bench.bench_sow [--keys N] [--updates N] [--drain N] [--latency N] [--runs 3] [--write]

- SOW publish: a server with one SOW topic (Key /id); one asyncio publisher inserts
  ``--keys`` records (1,000,000), pipelined, waiting for every persisted ack; then
  ``--updates`` publishes update random existing keys (update by key). msg/s.
- Memory per record: RSS of the server after a restart with the records (recovery
  fills no payload cache) minus the RSS of the same server with an empty journal, per
  record. Restart: from starting the server process to the first answered query.
- View over a queue: ``--drain`` messages (256 bytes, 5 regions) are queued, then 4
  consumer processes (bench/queue_worker.py, backlog 10) drain them; the same with one
  view over the queue (``SUM(/qty * /price)`` grouped by ``/region``). Runs alternate
  (with, without) so that load on a shared machine hits both alike; medians. The
  server's CPU time during the drain is measured too (load on a shared machine moves
  the rate much more than the CPU a drain takes).
- Aggregated subscription latency: one client holds a ``sow_and_subscribe`` with
  ``projection=[/region,SUM(/qty * /price) AS /v],grouping=[/region]`` on a SOW topic of
  10,000 records; another publishes one update at a time (persisted ack awaited); the time
  from the publish to the aggregated update arriving. Median and 99th percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import uvloop

from bench.bench_publish import free_port, wait_port
from bench.report import git_rev, machine, median, write_section

REGIONS = ("EU", "US", "APAC", "LATAM", "MEA")

CONFIG = """<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport></Transports>
<TransactionLog><JournalDirectory>{journal}</JournalDirectory><Topic><Name>bench</Name><MessageType>json</MessageType></Topic>
<Topic><Name>orders</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW>
<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
<Queue><Name>Bench</Name><MessageType>json</MessageType><UnderlyingTopic>bench</UnderlyingTopic>
<Semantics>at-least-once</Semantics><MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog></Queue>
{view}
</SOW></AMPSConfig>"""

VIEW = """<View><Name>bench_value</Name><UnderlyingTopic>Bench</UnderlyingTopic><MessageType>json</MessageType>
<Projection><Field>/region</Field><Field>SUM(/qty * /price) AS /value</Field></Projection>
<Grouping><Field>/region</Field></Grouping></View>"""

_encode = msgspec.json.Encoder().encode


def order(i: int, rng: random.Random) -> bytes:
    body = {"id": i, "region": rng.choice(REGIONS), "qty": rng.randint(1, 20), "price": rng.choice([9.99, 10, 2.5])}
    body["pad"] = "x" * max(0, 256 - len(_encode(body)) - 9)
    return _encode(body)


def start(workdir: Path, *, view: bool = False, port: int | None = None) -> tuple[subprocess.Popen, int]:
    port = port or free_port()
    cfg = workdir / "conveyor.xml"
    cfg.write_text(CONFIG.format(port=port, journal=workdir / "journal", view=VIEW if view else ""))
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, timeout=600)
    return proc, port


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used: what a view costs the server,
    whatever else shares the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def publish(port: int, topic: str, bodies) -> float:
    """Publish ``bodies`` pipelined, wait for every persisted ack; msg/s."""
    from conveyor import AsyncClient

    client = await AsyncClient(f"pub-{time.time_ns()}", max_inflight=20_000).connect(f"tcp://127.0.0.1:{port}")
    n = 0
    t0 = time.perf_counter()
    for body in bodies:
        await client.publish(topic, body)
        n += 1
    await client.wait_persisted(timeout=1200)
    elapsed = time.perf_counter() - t0
    await client.disconnect()
    return n / elapsed


def sow_publish(keys: int, updates: int, workdir: Path) -> tuple[float, float, float, float]:
    """(insert msg/s, update msg/s, bytes per record (RSS), restart seconds)."""
    empty = workdir / "empty"
    empty.mkdir()
    proc, port = start(empty)
    time.sleep(1.0)
    idle_rss = rss_bytes(proc.pid)
    proc.terminate()
    proc.wait()
    rng = random.Random(1)
    proc, port = start(workdir)
    try:
        insert = uvloop.run(publish(port, "orders", (order(i, rng) for i in range(keys))))
        update = uvloop.run(publish(port, "orders", (order(rng.randrange(keys), rng) for _ in range(updates))))
    finally:
        proc.kill()
        proc.wait()
    started = time.perf_counter()
    proc, port = start(workdir, port=port)
    try:
        restart = uvloop.run(first_answer(port, started))
        time.sleep(0.5)
        per_record = (rss_bytes(proc.pid) - idle_rss) / keys
    finally:
        proc.terminate()
        proc.wait()
    return insert, update, per_record, restart


async def first_answer(port: int, started: float) -> float:
    from conveyor import AsyncClient

    client = await AsyncClient(f"probe-{time.time_ns()}", timeout=600).connect(f"tcp://127.0.0.1:{port}")
    got = await client.sow("orders", top_n=1, filter="/id = 0")
    assert got, "record 0 is missing after the restart"
    elapsed = time.perf_counter() - started
    await client.disconnect()
    return elapsed


def drain_once(n: int, workdir: Path, *, view: bool) -> tuple[float, float]:
    """(msg/s, server CPU seconds) of draining ``n`` queued messages."""
    proc, port = start(workdir, view=view)
    rng = random.Random(2)
    try:
        uvloop.run(publish(port, "bench", (order(i, rng) for i in range(n))))
        uri = f"tcp://127.0.0.1:{port}"
        procs = [
            subprocess.Popen([sys.executable, "-m", "bench.queue_worker", "conveyor", uri, f"w{i}-{time.time_ns()}", "10"],
                             stdout=subprocess.PIPE, text=True)
            for i in range(4)
        ]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        cpu0 = cpu_seconds(proc.pid)
        ends, total = [], 0
        for p in procs:
            total += int(p.communicate(timeout=1200)[0].split()[-1])
            ends.append(time.perf_counter())
        cpu = cpu_seconds(proc.pid) - cpu0
        assert total >= n, f"drained {total} of {n}"
        return n / (max(ends) - t0 - 1.0), cpu  # each worker stops after 1 s idle
    finally:
        proc.terminate()
        proc.wait()


async def latency(port: int, n: int, records: int) -> list[float]:
    from conveyor import AsyncClient

    uri = f"tcp://127.0.0.1:{port}"
    rng = random.Random(3)
    pub = await AsyncClient(f"lat-pub-{time.time_ns()}").connect(uri)
    for i in range(records):
        await pub.publish("orders", order(i, rng))
    await pub.wait_persisted(timeout=600)
    sub_client = await AsyncClient(f"lat-sub-{time.time_ns()}").connect(uri)
    arrived: asyncio.Queue = asyncio.Queue()
    await sub_client.subscribe(
        "orders", command="sow_and_subscribe",
        options="projection=[/region AS /region,SUM(/qty * /price) AS /v],grouping=[/region]",
        on_message=lambda m: arrived.put_nowait(time.perf_counter()),
    )
    await asyncio.sleep(0.5)
    while not arrived.empty():
        arrived.get_nowait()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await pub.publish("orders", order(rng.randrange(records), rng))
        got = await asyncio.wait_for(arrived.get(), 30)
        out.append(got - t0)
        while not arrived.empty():  # an update can move two groups (the old region, the new)
            arrived.get_nowait()
    await sub_client.disconnect()
    await pub.disconnect()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--drain", type=int, default=100_000)
    parser.add_argument("--latency", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        d = root / "sow"
        d.mkdir()
        insert, update, per_record, restart = sow_publish(args.keys, args.updates, d)
        print(f"SOW: insert {insert:,.0f} msg/s, update by key {update:,.0f} msg/s, {per_record:.0f} B/record, "
              f"restart {restart:.2f} s", flush=True)
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpus: dict[bool, list[float]] = {False: [], True: []}
        for run in range(args.runs):
            for view in (False, True):
                d = root / f"drain-{run}-{view}"
                d.mkdir()
                rate, cpu = drain_once(args.drain, d, view=view)
                rates[view].append(rate)
                cpus[view].append(cpu)
                print(f"run {run + 1} drain {'with' if view else 'without'} view: {rate:,.0f} msg/s, "
                      f"server CPU {cpu:.2f} s", flush=True)
        d = root / "latency"
        d.mkdir()
        proc, port = start(d)
        try:
            lat = sorted(uvloop.run(latency(port, args.latency, 10_000)))
        finally:
            proc.terminate()
            proc.wait()
    load_after = os.getloadavg()
    without, with_view = median(rates[False]), median(rates[True])
    cost = (without - with_view) / without * 100
    cpu_without, cpu_with = median(cpus[False]), median(cpus[True])
    cpu_cost = (cpu_with - cpu_without) / cpu_without * 100
    p50, p99 = lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3
    rows = [
        "| measure | value |",
        "| --- | ---: |",
        f"| SOW publish, insert {args.keys:,} keys (msg/s, persisted) | {insert:,.0f} |",
        f"| SOW publish, update by key, {args.updates:,} over {args.keys:,} keys (msg/s, persisted) | {update:,.0f} |",
        f"| server memory per SOW record, {args.keys:,} records (RSS delta) | {per_record:.0f} B |",
        f"| restart to first query answered, {args.keys + args.updates:,} publishes in the log | {restart:.2f} s |",
        f"| drain {args.drain:,} x 256 B, 4 consumers, backlog 10, no view (msg/s) | {without:,.0f} |",
        f"| same, one view over the queue (grouped SUM) (msg/s) | {with_view:,.0f} |",
        f"| cost of the view on the drain rate (target < 20%) | {cost:.1f}% |",
        f"| server CPU per 1,000 messages drained, no view / one view | {cpu_without / args.drain * 1e3 * 1e3:.1f} / "
        f"{cpu_with / args.drain * 1e3 * 1e3:.1f} ms |",
        f"| cost of the view in server CPU (target < 20%) | {cpu_cost:.1f}% |",
        f"| aggregated subscription update latency, median / p99 ({args.latency:,} updates) | {p50:.2f} / {p99:.2f} ms |",
    ]
    table = "\n".join(rows)
    print(table)
    print(f"load average {load[0]:.1f} before, {load_after[0]:.1f} after")
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_sow --write`.

SOW publish: one asyncio publisher, pipelined, every publish acknowledged as persisted;
first {args.keys:,} inserts (one per key), then {args.updates:,} updates of random keys.
Memory: RSS of the server after a restart with the records (no payload cache then)
minus the same server with an empty journal, per record. Restart: from starting the
server process to the first answered query. Drain: {args.drain:,} queued 256-byte
orders, 4 consumer processes (backlog 10), with and without one view over the queue
(`SUM(/qty * /price)` grouped by `/region`, 5 regions); runs alternate, medians of
{args.runs}; the server's CPU time (user + system, from /proc) during the drain is
the figure other load on the machine disturbs least. Latency: publish of one update (persisted ack awaited) to the arrival of
the aggregated subscription's update, SOW topic of 10,000 records.

Machine: {machine()}; commit {git_rev()}. Shared with other agents: load average
{load[0]:.1f} before the runs, {load_after[0]:.1f} after.

{table}
"""
        write_section("State of the World: SOW publish, memory, views over queues, latency", body)


if __name__ == "__main__":
    main()
