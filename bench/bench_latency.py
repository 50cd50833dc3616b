"""Latency at a steady publish rate, through a queue, fsynced; and the server's CPU.

One server subprocess with two queues: ``Bench`` (the measured one) and ``Idle``, which
holds ``--queued`` messages that nobody consumes, so that the server serves with the
heap of a real one (the messages are published, the server killed with SIGKILL and
started again: they are rebuilt by recovery, as after any restart). Then one process
publishes 256-byte messages to ``Bench`` at ``--rate`` msg/s (a batch every
millisecond) for ``--seconds`` after ``--warmup`` seconds, and consumes them on a
subscription with backlog 100, acknowledging each (the client batches the acks).
Latency = arrival at the consumer - the publish call, on one clock; the server delivers
a queue message only once it is fsynced. The bench process itself collects no garbage
while it measures (``gc.freeze`` + ``gc.disable``), so its pauses are not counted as
the server's. Server CPU = user + system time of the server process over the measured
seconds, per message.

    python -m bench.bench_latency [--rate 5000] [--seconds 20] [--queued 200000]

Prints a summary, then one JSON line (for ``python -m bench.ab``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import uvloop

from bench.bench_queue import conveyor_fill, start_conveyor

CONFIG = """<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport></Transports>
<TransactionLog><JournalDirectory>{journal}</JournalDirectory>
<Topic><Name>bench</Name><MessageType>json</MessageType></Topic><Topic><Name>idle</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW><Queue><Name>Bench</Name><MessageType>json</MessageType><UnderlyingTopic>bench</UnderlyingTopic>
<Semantics>at-least-once</Semantics><MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog></Queue>
<Queue><Name>Idle</Name><MessageType>json</MessageType><UnderlyingTopic>idle</UnderlyingTopic>
<Semantics>at-least-once</Semantics></Queue></SOW>
</AMPSConfig>"""

PAYLOAD_BYTES = 256
BATCH_INTERVAL_S = 0.001  # the publisher's pace: one batch per millisecond
BACKLOG = 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _payload(stamp_ns: int) -> bytes:
    head = b'{"t":%d,"pad":"' % stamp_ns
    return head + b"x" * (PAYLOAD_BYTES - len(head) - 2) + b'"}'


async def measure(
    port: int, server_pid: int, rate: int, seconds: float, warmup: float, window: list[float]
) -> dict[str, float]:
    """The latency figures; ``window`` gets the epoch seconds of the measured span."""
    from conveyor import AsyncClient

    uri = f"tcp://127.0.0.1:{port}"
    consumer = await AsyncClient(f"lat-consumer-{time.time_ns()}").connect(uri)
    publisher = await AsyncClient(f"lat-publisher-{time.time_ns()}", max_inflight=100_000).connect(uri)
    latencies_ns: list[int] = []
    from_ns = [1 << 62]  # messages published from then on are measured

    def on_message(msg) -> None:
        got = time.perf_counter_ns()
        stamp = stamp_of(msg.data)
        if stamp >= from_ns[0]:
            latencies_ns.append(got - stamp)
        msg.ack()

    await consumer.subscribe("Bench", max_backlog=BACKLOG, on_message=on_message)
    window_cpu: list[float] = []

    def on_window() -> None:
        window_cpu.append(cpu_seconds(server_pid))
        window[0], from_ns[0] = time.time(), time.perf_counter_ns()

    def send(batch: list[bytes]) -> None:
        for payload in batch:
            publisher.publish_nowait("bench", payload)

    with no_collection():
        sent_measured = await pace(rate, seconds, warmup, send, on_window)
        await publisher.wait_persisted(timeout=60)
        await wait_count(latencies_ns, sent_measured)
        cpu1, window[1] = cpu_seconds(server_pid), time.time()
    await publisher.disconnect()
    await consumer.flush(timeout=60)
    await consumer.disconnect()
    return summarize(latencies_ns, sent_measured, cpu1 - window_cpu[0])


@contextlib.contextmanager
def no_collection():
    """The bench process collects no garbage while it measures, so that its own pauses
    are not counted as the server's."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


async def pace(rate: int, seconds: float, warmup: float, send, on_window) -> int:
    """Call ``send`` with a batch of stamped payloads every millisecond, ``rate``
    messages a second, for ``warmup`` + ``seconds``; ``on_window()`` once when the
    measured span begins. Returns the messages sent in that span."""
    loop = asyncio.get_running_loop()
    per_batch = max(1, round(rate * BATCH_INTERVAL_S))
    began = loop.time()
    end = began + warmup + seconds
    measuring = False
    sent = k = 0
    while (now := loop.time()) < end:
        if not measuring and now >= began + warmup:
            measuring = True
            on_window()
        send([_payload(time.perf_counter_ns()) for _ in range(per_batch)])
        if measuring:
            sent += per_batch
        k += 1
        delay = began + k * BATCH_INTERVAL_S - loop.time()
        await asyncio.sleep(delay if delay > 0 else 0)
    return sent


def stamp_of(data: bytes) -> int:
    """The publish time a payload of ``_payload`` carries."""
    return int(data[5:data.index(b",", 5)])


async def wait_count(received: list, expected: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(received) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def summarize(latencies_ns: list[int], sent: int, server_cpu_s: float) -> dict[str, float]:
    if len(latencies_ns) < sent:
        raise SystemExit(f"received {len(latencies_ns)} of {sent}")
    lat = sorted(latencies_ns)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6

    return {
        "messages": len(lat),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": lat[-1] / 1e6,
        "over_5ms": sum(1 for x in lat if x > 5_000_000),
        # wall time includes the drain after the last publish: CPU per message received
        "server_us_per_msg": server_cpu_s / len(lat) * 1e6,
    }


def _collections(probe: Path, window: list[float], messages: int) -> dict[str, float]:
    """The server's garbage collections that started inside the measured window."""
    records = [r for r in json.loads(probe.read_text()) if window[0] <= r[0] <= window[1]]
    out: dict[str, float] = {}
    for gen in (0, 1, 2):
        mine = [r for r in records if r[1] == gen]
        out[f"gc{gen}_count"] = len(mine)
        out[f"gc{gen}_max_ms"] = max((r[2] for r in mine), default=0.0) * 1e3
        out[f"gc{gen}_max_cpu_ms"] = max((r[3] for r in mine), default=0.0) * 1e3
    out["gc_cpu_us_per_msg"] = sum(r[3] for r in records) / messages * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=5000, help="messages per second (default 5000)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds (default 20)")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first (default 2)")
    ap.add_argument("--queued", type=int, default=200_000, help="messages held by the idle queue (default 200000)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        workdir = Path(tmp)
        probe = workdir / "gc.json"
        proc, port, _ = start_conveyor(workdir, config=CONFIG)
        try:
            if args.queued:
                uvloop.run(conveyor_fill(port, args.queued, topic="idle"))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            # the probed server: recovery rebuilds the idle queue
            proc, port, _ = start_conveyor(workdir, port, config=CONFIG, gc_probe=probe)
            window = [0.0, 0.0]
            out = uvloop.run(measure(port, proc.pid, args.rate, args.seconds, args.warmup, window))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        out.update(_collections(probe, window, out["messages"]))
    print(
        f"{args.rate} msg/s for {args.seconds:g} s, {args.queued:,} queued: p50 {out['p50_ms']:.2f} ms, "
        f"p99 {out['p99_ms']:.2f}, p99.9 {out['p999_ms']:.2f}, max {out['max_ms']:.2f} "
        f"({out['over_5ms']} over 5 ms); server {out['server_us_per_msg']:.1f} µs/msg; "
        f"server collections (count, max ms wall/CPU): gen0 {out['gc0_count']} {out['gc0_max_ms']:.1f}/{out['gc0_max_cpu_ms']:.1f}, "
        f"gen1 {out['gc1_count']} {out['gc1_max_ms']:.1f}/{out['gc1_max_cpu_ms']:.1f}, "
        f"gen2 {out['gc2_count']} {out['gc2_max_ms']:.1f}/{out['gc2_max_cpu_ms']:.1f}, "
        f"{out['gc_cpu_us_per_msg']:.2f} µs/msg; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
