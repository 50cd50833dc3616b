"""Server memory under hostile clients: does RSS stay under the configured budget?

The scenario of issue 15, item 4, against a real ``conveyor serve`` process:

- 4 subscribers to every topic that never read (a 4 KiB socket buffer each);
- 4 bookmark replays of every topic from the beginning, started once the journal holds
  a third of the messages, that never read either;
- a publisher sending one message to each of 300,000 distinct topic names (200-byte
  bodies, all recorded in the journal).

It samples the server's RSS (``/proc/<pid>/status``) every 100 ms and reports the
peak. The budget it checks: the RSS of the idle server, plus ``Limits/OutputBudget``
(the unsent output all connections may hold together), plus 64 MiB for everything
else (the journal's write backlog, allocator slack).

usage: python -m bench.bench_memory_limits [--topics 300000] [--budget 64M] [--no-limits] [--write]

``--no-limits`` leaves ``<Limits>`` out of the configuration (for a server that does not
know it: the figures before the change). ``--write`` puts the table into
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.bench_queue import rss_bytes
from bench.report import git_rev, machine, serve, write_section

HEADROOM_BYTES = 64 * 1024 * 1024
CONFIG = """\
<AMPSConfig>
    <Name>memory-bench</Name>
    <Transports><Transport><Name>tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr><Protocol>amps</Protocol></Transport></Transports>
    <TransactionLog><JournalDirectory>{journal}</JournalDirectory><Topic><Name>t\\..*</Name><MessageType>json</MessageType></Topic></TransactionLog>
    {limits}
</AMPSConfig>
"""


def parse_size(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


class Sampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            rss = rss_bytes(self.pid)
            self.samples.append((time.monotonic() - t0, rss))
            self.peak = max(self.peak, rss)
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def non_reader(port: int, name: str, subscribe: bytes) -> socket.socket:
    from conveyor.protocol import encode_frame
    from conveyor.protocol import messages as m

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(encode_frame([m.Logon(client_name=name)]) + subscribe)
    return sock


async def publish(port: int, topics: int, on_third) -> float:
    from conveyor import AsyncClient

    client = await AsyncClient("bench-publisher", max_inflight=20_000).connect(f"tcp://127.0.0.1:{port}")
    body = {"pad": "x" * 180}
    t0 = time.perf_counter()
    for i in range(topics):
        await client.publish(f"t.{i}", body)
        if i == topics // 3:
            await client.wait_persisted(timeout=600)
            on_third()
    await client.wait_persisted(timeout=3600)
    await client.disconnect()
    return time.perf_counter() - t0


def run(topics: int, budget: int, limits: bool) -> dict:
    from conveyor.protocol import encode_frame
    from conveyor.protocol import messages as m

    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.xml"
        limits_xml = f"<Limits><OutputBudget>{budget}</OutputBudget></Limits>" if limits else ""
        config.write_text(CONFIG.format(journal=Path(tmp) / "journal", limits=limits_xml))
        proc, port, log = serve(config)
        try:
            time.sleep(1.0)
            idle = rss_bytes(proc.pid)
            sampler = Sampler(proc.pid)
            subs = [non_reader(port, f"sub-{i}", encode_frame([m.Subscribe(topic="t\\..*", sub_id="s")]))
                    for i in range(4)]
            replays: list[socket.socket] = []

            def start_replays() -> None:
                replays.extend(
                    non_reader(port, f"replay-{i}", encode_frame([m.Subscribe(topic="t\\..*", sub_id="r", bookmark="0")]))
                    for i in range(4)
                )

            seconds = asyncio.run(publish(port, topics, start_replays))
            time.sleep(3.0)  # let the replays push what they can
            sampler.stop()
            final = rss_bytes(proc.pid)
            for s in subs + replays:
                s.close()
        finally:
            proc.kill()
            proc.wait()
        text = "".join(log)
        return {
            "idle": idle, "peak": sampler.peak, "final": final, "seconds": seconds,
            "cut": text.count("slow consumer"), "budget_cuts": text.count("Limits/OutputBudget"),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_memory_limits")
    parser.add_argument("--topics", type=int, default=300_000)
    parser.add_argument("--budget", default="64M", help="Limits/OutputBudget (default 64M)")
    parser.add_argument("--no-limits", action="store_true", help="leave <Limits> out of the configuration")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    budget = parse_size(args.budget)
    r = run(args.topics, budget, limits=not args.no_limits)
    mib = 1024 * 1024
    allowed = r["idle"] + budget + HEADROOM_BYTES
    table = "\n".join([
        "| measure | value |",
        "| --- | --- |",
        f"| distinct topic names published | {args.topics:,} |",
        f"| idle server RSS | {r['idle'] / mib:.0f} MiB |",
        f"| peak RSS (4 non-reading subscribers, 4 non-reading replays) | {r['peak'] / mib:.0f} MiB |",
        f"| RSS at the end | {r['final'] / mib:.0f} MiB |",
        f"| budget: idle + OutputBudget ({budget / mib:.0f} MiB) + 64 MiB | {allowed / mib:.0f} MiB |",
        f"| connections cut as slow consumers (of them, by the output budget) | {r['cut']} ({r['budget_cuts']}) |",
        f"| publish time | {r['seconds']:.1f} s |",
    ])
    print(table)
    ok = r["peak"] <= allowed
    print("within the budget" if ok else "OVER the budget")
    if args.write:
        write_section(
            "Server memory under non-reading clients (issue 15)",
            f"`python -m bench.bench_memory_limits --topics {args.topics} --budget {args.budget}` "
            f"(rev {git_rev()}; {machine()}; load {os.getloadavg()[0]:.1f}). One run: the figure is a peak.\n\n"
            + table,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
