"""FileBackedMetadata: server memory and restart time with a deep queue, with and without.

    python -m bench.bench_fbm [--messages 10000000] [--small 1000000] [--runs 3]
                              [--drain 100000] [--write]

For each of FBM disabled / enabled, in one run of this script:
- fill: one pipelined publisher, persisted, ``--messages`` 64-byte messages (timed);
- memory: server RSS after a SIGKILL and a restart (no payload cache), minus the RSS
  of the same server on an empty journal, per queued message;
- restart: SIGKILL, start the server process, time until a consumer gets its first
  message (median of ``--runs``), and the server's own "recovered N journal records
  in X s" (so the rest is journal open, imports and the first delivery);
- the same at ``--small`` messages (a separate journal);
- drain: ``bench.bench_queue``'s drain (4 consumer processes, backlog 10) of
  ``--drain`` queued 256-byte messages, to show the hot path does not collapse when
  the queue pages (with 100,000 queued, 17 of its 25 chunks are on disk).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench import bench_queue
from bench.bench_publish import free_port, wait_port
from bench.report import git_rev, machine, median, write_section

PAYLOAD64 = b'{"pad":"' + b"x" * 54 + b'"}'
assert len(PAYLOAD64) == 64

CONFIG = """<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport></Transports>
<TransactionLog><JournalDirectory>{journal}</JournalDirectory><Topic><Name>bench</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW><Queue><Name>Bench</Name><MessageType>json</MessageType><UnderlyingTopic>bench</UnderlyingTopic>
<Semantics>at-least-once</Semantics><MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog>
<FileBackedMetadata>{fbm}</FileBackedMetadata></Queue></SOW>
</AMPSConfig>"""


class Server:
    def __init__(self, workdir: Path, fbm: bool) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.cfg = workdir / "conveyor.xml"
        self.cfg.write_text(CONFIG.format(port=self.port, journal=workdir / "journal", fbm="enabled" if fbm else "disabled"))
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> float:
        started = time.perf_counter()
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(self.cfg)],
                                         stdout=subprocess.DEVNULL, stderr=log)
        if wait:
            wait_port(self.port, timeout=600)
        return started

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)

    def recovered(self) -> tuple[int, float]:
        found = re.findall(r"recovered (\d+) journal records in ([\d.]+) s", self.log.read_text())
        count, seconds = found[-1]
        return int(count), float(seconds)


async def fill(port: int, n: int) -> None:
    from conveyor import AsyncClient

    client = await AsyncClient(f"filler-{time.time_ns()}", max_inflight=20_000).connect(f"tcp://127.0.0.1:{port}")
    for _ in range(n):
        await client.publish("bench", PAYLOAD64)
    await client.wait_persisted(timeout=3600)
    await client.disconnect()


def idle_rss(workdir: Path) -> int:
    d = workdir / "idle"
    d.mkdir()
    s = Server(d, False)
    s.start()
    time.sleep(1.0)
    rss = bench_queue.rss_bytes(s.proc.pid)
    s.stop()
    return rss


def measure(workdir: Path, fbm: bool, n: int, runs: int, rss0: int) -> dict:
    s = Server(workdir, fbm)
    s.start()
    t0 = time.perf_counter()
    uvloop.run(fill(s.port, n))
    fill_s = time.perf_counter() - t0
    live_rss = bench_queue.rss_bytes(s.proc.pid)
    time.sleep(bench_queue_checkpoint_wait())  # a periodic checkpoint (FBM: the snapshot) after the fill
    s.kill()
    restarts, recovers, counts, rss = [], [], [], []
    for _ in range(runs):
        started = s.start(wait=False)
        got = uvloop.run(bench_queue.first_delivery(s.port, started + 900))
        restarts.append(got - started)
        count, seconds = s.recovered()
        counts.append(count)
        recovers.append(seconds)
        time.sleep(1.0)
        rss.append(bench_queue.rss_bytes(s.proc.pid))
        s.kill()
    journal_bytes = sum(p.stat().st_size for p in (workdir / "journal").glob("*") if p.is_file())
    pages = workdir / "journal" / "queues"
    page_bytes = sum(p.stat().st_size for p in pages.glob("*")) if pages.is_dir() else 0
    return {
        "fill_s": fill_s,
        "fill_rate": n / fill_s,
        "live_rss": live_rss,
        "rss": median(rss),
        "per_msg": (median(rss) - rss0) / n,
        "restart_s": median(restarts),
        "recover_s": median(recovers),
        "records": median(counts),
        "journal_bytes": journal_bytes,
        "page_bytes": page_bytes,
    }


def bench_queue_checkpoint_wait() -> float:
    from conveyor.server.server import CHECKPOINT_INTERVAL_S

    return CHECKPOINT_INTERVAL_S + 3.0


def drain_rate(workdir: Path, fbm: bool, n: int, runs: int) -> float:
    config = bench_queue.CONFIG
    if fbm:
        bench_queue.CONFIG = config.replace("</Semantics>", "</Semantics><FileBackedMetadata>enabled</FileBackedMetadata>")
    try:
        rates = []
        for run in range(runs):
            d = workdir / f"drain-{fbm}-{run}"
            d.mkdir()
            rates.append(bench_queue.measure_drain("conveyor", n, d))
        return median(rates)
    finally:
        bench_queue.CONFIG = config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--small", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--drain", type=int, default=100_000)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    results: dict = {}
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        rss0 = idle_rss(root)
        for n in sorted({args.small, args.messages}):
            for fbm in (False, True):
                d = root / f"{n}-{fbm}"
                d.mkdir()
                r = measure(d, fbm, n, args.runs, rss0)
                results[n, fbm] = r
                print(f"{n:,} queued, FBM {fbm}: {r}", flush=True)
                subprocess.run(["rm", "-rf", str(d)])  # disk: 10M x 64 B is ~1.3 GB of journal
        drains = {fbm: drain_rate(root, fbm, args.drain, args.runs) for fbm in (False, True)}
        print(f"drain: {drains}", flush=True)
    wall = time.perf_counter() - wall

    big, small = args.messages, args.small
    mib = 1024 * 1024
    rows = ["| measure | FBM disabled | FBM enabled |", "| --- | ---: | ---: |"]

    def row(label, fmt, key, n):
        rows.append(f"| {label} | {fmt(results[n, False][key])} | {fmt(results[n, True][key])} |")

    for n in sorted({small, big}, reverse=True):
        row(f"fill {n:,} x 64 B, persisted, pipelined (msg/s)", lambda v: f"{v:,.0f}", "fill_rate", n)
        row(f"server RSS after restart, {n:,} queued", lambda v: f"{v / mib:,.0f} MiB", "rss", n)
        row(f"RSS delta per queued message, {n:,} queued", lambda v: f"{v:.1f} B", "per_msg", n)
        row(f"restart to first delivery, {n:,} queued (median of {args.runs})", lambda v: f"{v:.2f} s", "restart_s", n)
        row(f"of which recover() (records replayed), {n:,} queued",
            lambda v: f"{v:.2f} s", "recover_s", n)
        rows[-1] = rows[-1][:-2] + f" ({results[n, True]['records']:,.0f} records) |"
        rows[-1] = rows[-1].replace(f"| {results[n, False]['recover_s']:.2f} s |",
                                    f"| {results[n, False]['recover_s']:.2f} s ({results[n, False]['records']:,.0f} records) |", 1)
        row(f"page file on disk, {n:,} queued", lambda v: f"{v / mib:,.0f} MiB", "page_bytes", n)
    rows.append(f"| drain {args.drain:,} x 256 B, 4 consumer processes, backlog 10 (msg/s, median of {args.runs}) "
                f"| {drains[False]:,.0f} | {drains[True]:,.0f} |")
    table = "\n".join(rows)
    print(table)
    print(f"wall time of the whole run: {wall / 60:.1f} min")
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_fbm --write` (defaults: `--messages 10000000
--small 1000000 --runs 3 --drain 100000`); the whole run took {wall / 60:.0f} minutes.

One queue, at-least-once, with `FileBackedMetadata` disabled and enabled, each on its
own journal. Fill: one publisher, pipelined, waiting until every publish is persisted.
Memory: server RSS after a SIGKILL and a restart (no payload cache), minus the RSS of the
same server on an empty journal ({rss0 / mib:.0f} MiB), per queued message. Restart: from
starting the server process (SIGKILLed after a periodic checkpoint) to the first message
a consumer receives; "recover()" is the server's own log line (the rest is opening the
journal, which checks every record's CRC, imports and the first delivery). Drain: as in
"Queues: drain, memory, restart".

Machine: {machine()}; commit {git_rev()}.

{table}
"""
        write_section("Queues: FileBackedMetadata", body)


if __name__ == "__main__":
    main()
