"""The admin interface: what statistics cost the broker, and how fast the API answers.

1. **Cost on publish and drain.** A real server (subprocess) with 1,000 queues; one
   publisher sends N 256-byte messages to the topic of one queue, waiting for every
   persisted ack; then one consumer drains that queue, acknowledging each message.
   Each round runs twice, interleaved: without the admin interface (``--no-admin``) and
   with it while a scraper fetches ``/metrics`` every second (the history sampler runs
   too). The figure is the median time of each phase and the difference.
2. **Response time with 1,000 queues and 10,000 clients.** A server in this process
   (its loop on a thread of its own) with 1,000 queues holding messages, and 10,000
   simulated client sessions (the engine's real logon and subscribe, each with a queue
   subscription; the sockets are stand-ins that count bytes). Each route is fetched
   over one keep-alive connection; the median and the worst of the repetitions.

    python -m bench.bench_admin [--messages N] [--rounds 3] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.report import git_rev, machine, median, write_section

QUEUES = 1000
CLIENTS = 10_000
PAYLOAD = b'{"pad":"' + b"x" * 246 + b'"}'


def config_xml(directory: Path, admin: bool) -> str:
    queues = "\n".join(
        f"<Queue><Name>Q{i}</Name><MessageType>json</MessageType><UnderlyingTopic>t{i}</UnderlyingTopic></Queue>"
        for i in range(QUEUES)
    )
    admin_xml = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>" if admin else ""
    return f"""<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>tcp</Name><InetAddr>127.0.0.1:0</InetAddr></Transport></Transports>
{admin_xml}
<TransactionLog><JournalDirectory>{directory}/journal</JournalDirectory>
<Topic><Name>^t[0-9]+$</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW>{queues}</SOW>
<Limits><MaxConnections>{CLIENTS + 100}</MaxConnections></Limits></AMPSConfig>"""


# --- 1. cost on publish and drain ---------------------------------------------------------------


def start_server(directory: Path, admin: bool) -> tuple[subprocess.Popen, int, str | None]:
    path = directory / "config.xml"
    path.write_text(config_xml(directory, admin))
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    admin_url = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("conveyor admin on "):
            admin_url = line.split()[-1]
        if line.startswith("conveyor listening on port "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(line.split()[-1]), admin_url
    raise RuntimeError("the server did not start")


def scrape_every_second(url: str, stop: threading.Event, counts: list[float]) -> None:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    while not stop.wait(1.0):
        started = time.perf_counter()
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        counts.append(time.perf_counter() - started)


def publish_and_drain(port: int, n: int) -> tuple[float, float]:
    from conveyor import Client

    uri = f"tcp://127.0.0.1:{port}"
    with Client(f"bench-pub-{time.time_ns()}").connect(uri) as client:
        started = time.perf_counter()
        for _ in range(n):
            client.publish("t7", PAYLOAD)
        client.flush()
        publish_s = time.perf_counter() - started
    with Client(f"bench-drain-{time.time_ns()}").connect(uri) as client:
        started = time.perf_counter()
        sub = client.subscribe("Q7", max_backlog=1000)
        for _ in range(n):
            msg = sub.get(timeout=60)
            assert msg is not None, "the queue ran dry"
            msg.ack()
        client.flush()
        drain_s = time.perf_counter() - started
    return publish_s, drain_s


def cost(n: int, rounds: int) -> dict:
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    scrapes: list[float] = []
    for _ in range(rounds):
        for mode in ("off", "on"):  # interleaved: the machine is shared
            with tempfile.TemporaryDirectory(prefix="bench-admin-") as tmp:
                proc, port, admin_url = start_server(Path(tmp), admin=mode == "on")
                stop = threading.Event()
                scraper = None
                if admin_url:
                    scraper = threading.Thread(target=scrape_every_second, args=(admin_url, stop, scrapes), daemon=True)
                    scraper.start()
                try:
                    results[mode].append(publish_and_drain(port, n))
                finally:
                    stop.set()
                    if scraper:
                        scraper.join(timeout=30)
                    proc.terminate()
                    proc.wait(timeout=60)
    out = {}
    for phase, i in (("publish", 0), ("drain", 1)):
        off = median(r[i] for r in results["off"])
        on = median(r[i] for r in results["on"])
        out[phase] = (off, on, (on - off) / off * 100)
    out["scrape_s"] = median(scrapes) if scrapes else None
    out["scrapes"] = len(scrapes)
    return out


# --- 2. response time with 1,000 queues and 10,000 clients ------------------------------------------


class _Transport:
    """A stand-in socket for a simulated client: it counts what it is given."""

    def __init__(self) -> None:
        self.buffered = 0

    def writelines(self, frames) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name):
        return ("10.0.0.1", 40000)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def _populate(server) -> None:
    from conveyor.protocol import messages as m
    from conveyor.server.connection import Connection

    engine = server.engine
    publisher = Connection(server, server.config.transports[0])
    publisher.connection_made(_Transport())
    batch = [m.Publish(topic=f"t{i}", data=PAYLOAD) for i in range(QUEUES) for _ in range(5)]
    server.handle(publisher, [m.Logon(client_name="bench-publisher")] + batch)
    await server.wait_durable(server.journal.end)
    for c in range(CLIENTS):
        conn = Connection(server, server.config.transports[0])
        conn.connection_made(_Transport())
        server.handle(conn, [m.Logon(client_name=f"client-{c}", user_id="bench"),
                             m.Subscribe(topic=f"Q{c % QUEUES}", sub_id="s1", cid="1")])
    await server.wait_durable(server.journal.end)
    assert len(engine.sessions) == CLIENTS + 1


def response_times(repeats: int) -> list[tuple[str, float, float, int]]:
    from conveyor.config import load_text
    from conveyor.server.server import Server

    import logging

    logging.getLogger("conveyor").setLevel(logging.ERROR)  # 10,000 closes at the end are not news
    tmp = tempfile.mkdtemp(prefix="bench-admin-api-")
    config = load_text(config_xml(Path(tmp), admin=True))
    ready = threading.Event()
    box: dict = {}

    def run() -> None:
        import uvloop

        async def main() -> None:
            server = Server(config)
            await server.start()
            await _populate(server)
            box["server"] = server
            box["stop"] = asyncio.Event()
            ready.set()
            await server.run_until(box["stop"])

        uvloop.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(600)
    server = box["server"]
    bookmark_position = server.engine.queues["Q17"].details().messages[0].position
    routes = [
        "/healthz", "/api/summary", "/api/queues/Q17", "/api/queues/Q17/details",
        f"/api/queues/Q17/explain?bookmark={bookmark_position}", "/api/queues", "/api/history",
        "/metrics", "/api/clients", "/api/subscriptions", "/amps/instance",
    ]
    conn = http.client.HTTPConnection("127.0.0.1", server.admin.port, timeout=120)
    out = []
    for route in routes:
        times, size = [], 0
        for _ in range(repeats):
            started = time.perf_counter()
            conn.request("GET", route)
            resp = conn.getresponse()
            body = resp.read()
            times.append(time.perf_counter() - started)
            assert resp.status == 200, (route, resp.status, body[:200])
            size = len(body)
        out.append((route, statistics.median(times), max(times), size))
    box["stop"].set()
    thread.join(timeout=120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    c = cost(args.messages, args.rounds)
    api = response_times(args.repeats)
    load_after = os.getloadavg()[0]
    lines = [
        f"Command: `python -m bench.bench_admin --messages {args.messages} --rounds {args.rounds} "
        f"--repeats {args.repeats}` (rev {git_rev()}; {machine()}; load average {load_before:.1f} before, "
        f"{load_after:.1f} after: the machine is shared with other work).",
        "",
        f"**Statistics on the publish and drain paths.** A server with {QUEUES:,} queues; {args.messages:,} "
        "256-byte messages published to one queue's topic (every persisted ack awaited), then drained by one "
        f"consumer acknowledging each. Median of {args.rounds} interleaved rounds, without the admin interface "
        "and with it while `/metrics` is scraped every second.",
        "",
        "| phase | no admin interface | admin + scrape every 1 s | difference |",
        "| --- | --- | --- | --- |",
    ]
    for phase in ("publish", "drain"):
        off, on, pct = c[phase]
        lines.append(f"| {phase} | {off:.2f} s ({args.messages / off:,.0f} msg/s) | {on:.2f} s "
                     f"({args.messages / on:,.0f} msg/s) | {pct:+.1f}% |")
    if c["scrape_s"] is not None:
        lines += ["", f"One `/metrics` scrape of {QUEUES:,} queues during the runs: median {c['scrape_s'] * 1000:.1f} ms "
                      f"({c['scrapes']} scrapes)."]
    lines += [
        "",
        f"**Admin API response time** with {QUEUES:,} queues (5 messages each) and {CLIENTS:,} simulated "
        f"clients (each logged on with one queue subscription), one keep-alive connection, {args.repeats} "
        "requests per route.",
        "",
        "| route | median | worst | response bytes |",
        "| --- | --- | --- | --- |",
    ]
    for route, med, worst, size in api:
        lines.append(f"| `{route}` | {med * 1000:.1f} ms | {worst * 1000:.1f} ms | {size:,} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("Admin interface: statistics cost and API response time", text)


if __name__ == "__main__":
    main()
