"""Replication and replicated queues: real instances on loopback, measured in one run.

Workloads (docs/benchmarks.md, "Replication"):

1. **Publish rate** of one pipelined publisher waiting for persisted acks, to a single
   instance, to an instance with one ``sync`` destination and to one with one ``async``
   destination; interleaved, medians, ratios against the single instance. Each twice:
   with the source (or the single instance) alone on a core, as it would be on a
   machine of its own, the destination and the client on the other cores ("own
   core"); and with every process wherever the kernel puts it ("shared").
2. **Replication lag** at a paced 5,000 msg/s: publish on A, a subscriber on B; the lag
   of a message is its arrival at B's subscriber minus the moment it was handed to the
   publishing client (both clients live in this process: one clock). ``async`` and
   ``sync``.
3. **Catch-up** after an outage: A holds N records its destination B has never seen; B
   is started, then A, and B's subscriber counts the records as they are replicated:
   the rate from the first to the last.
4. **Replicated queue drain**: N messages published on A into a queue replicated between
   A and B, drained by 4 worker processes: all on a single unreplicated instance
   (baseline), all on the owner A, 2 on A and 2 on B, and all 4 on B (every message
   transferred from A to B before it is delivered). Each layout reports the servers' CPU
   and the workers' own, per message: both share the machine's cores.

    python -m bench.bench_replication [--messages N] [--catchup N] [--runs 3] [--write]

With the queue drain measured (``--only queue``), the last line is a JSON object of its
figures per layout, for ``python -m bench.ab``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import uvloop

from bench.bench_publish import PAYLOAD, free_port, wait_port
from bench.report import git_rev, machine, median, write_section

TOPIC = "bench"
QUEUE = "Bench"
QUEUE_XML = (f"<Queue><Name>{QUEUE}</Name><MessageType>json</MessageType><UnderlyingTopic>{TOPIC}</UnderlyingTopic>"
             "<MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog></Queue>")
LAG_RATE = 5_000  # msg/s
LAG_SECONDS = 10.0
WORKER_IDLE_S = 5.0  # a worker stops after this long without a message (transfers wait ~2 s at first)


class Instance:
    """A ``conveyor serve`` process with its own journal, client port and replication port."""

    def __init__(self, root: Path, name: str, *, queue: bool = False) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.repl_port = free_port()
        self.queue = queue
        self.destinations: list[str] = []
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def replicate_to(self, other: Instance, sync: bool) -> None:
        topics = (TOPIC, QUEUE) if self.queue else (TOPIC,)
        self.destinations.append(
            f"<Destination><Name>{other.name}</Name><SyncType>{'sync' if sync else 'async'}</SyncType>"
            f"<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:{other.repl_port}</InetAddr></Transport>"
            + "".join(f"<Topic><Name>{t}</Name><MessageType>json</MessageType></Topic>" for t in topics)
            + "</Destination>")

    def start(self, cores: set[int] | None = None) -> Instance:
        """Start the server, on ``cores`` only when given (its threads inherit them)."""
        repl = f"<Replication>{''.join(self.destinations)}</Replication>" if self.destinations else ""
        sow = f"<SOW>{QUEUE_XML}</SOW>" if self.queue else ""
        cfg = self.dir / "config.xml"
        cfg.write_text(
            f"<AMPSConfig><Name>{self.name}</Name><Transports>"
            f"<Transport><Name>clients</Name><Type>tcp</Type><InetAddr>127.0.0.1:{self.port}</InetAddr></Transport>"
            f"<Transport><Name>replication</Name><Type>amps-replication</Type>"
            f"<InetAddr>127.0.0.1:{self.repl_port}</InetAddr></Transport></Transports>"
            f"<TransactionLog><JournalDirectory>{self.dir / 'journal'}</JournalDirectory>"
            f"<Topic><Name>{TOPIC}</Name><MessageType>json</MessageType></Topic></TransactionLog>"
            f"{sow}{repl}</AMPSConfig>")
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - the process keeps it
        with on_cores(cores):  # a child starts with its parent's affinity
            self.proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)],
                                         stdout=log, stderr=log)
        wait_port(self.port, timeout=300, proc=self.proc)
        return self

    def cpu_s(self) -> float:
        """User and system CPU seconds of the server process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=120)


def pair(root: Path, *, sync: bool, both_ways: bool = False, queue: bool = False) -> tuple[Instance, Instance]:
    a, b = Instance(root / "a", "A", queue=queue), Instance(root / "b", "B", queue=queue)
    a.replicate_to(b, sync)
    if both_ways:
        b.replicate_to(a, sync)
    return a, b


@contextlib.contextmanager
def on_cores(cores: set[int] | None) -> Iterator[None]:
    """This process (and what it starts) runs on ``cores`` within the block; anywhere
    when None."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which cores the source, the destination and the publishing client run on."""

    source: set[int]
    destination: set[int]
    client: set[int]

    @classmethod
    def own_core(cls) -> Placement | None:
        """The source alone on the first core, as on a machine of its own; the
        destination on the second, the client on the third if there is one, else beside
        the destination. None with fewer than two cores."""
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            return None
        return cls({cores[0]}, {cores[1]}, set(cores[2:]) or {cores[1]})


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


# --- 1. publish rate ------------------------------------------------------------------------


async def publish_rate(uri: str, n: int) -> float:
    from conveyor import AsyncClient

    client = await AsyncClient(f"pub-{time.time_ns()}", max_inflight=20_000).connect(uri)
    start = time.perf_counter()
    for _ in range(n):
        await client.publish(TOPIC, PAYLOAD)
    await client.wait_persisted(timeout=600)
    elapsed = time.perf_counter() - start
    await client.disconnect()
    return n / elapsed


def until_idle(inst: Instance, interval_s: float = 0.3, busy_s: float = 0.01, timeout_s: float = 120) -> None:
    """Until ``inst`` spends less than ``busy_s`` of CPU in ``interval_s``: a destination
    that has recorded everything it was sent."""
    deadline = time.monotonic() + timeout_s
    before = inst.cpu_s()
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        now = inst.cpu_s()
        if now - before < busy_s:
            return
        before = now


class PublishSetup:
    """The three publish layouts of one placement, started once and driven in turn, a
    burst at a time: a single instance, a source with a ``sync`` destination and a
    source with an ``async`` one. Bursts of the three follow each other within seconds,
    so a ratio of two compares the machine at nearly one moment (this host's cores
    change speed on a scale of seconds)."""

    def __init__(self, root: Path, placement: Placement | None) -> None:
        self.placement = placement
        self.layouts: dict[str, list[Instance]] = {
            "single": [Instance(root / "single", "A")],
            "sync": list(pair(root / "sync", sync=True)),
            "async": list(pair(root / "async", sync=False)),
        }
        self.published: dict[str, int] = dict.fromkeys(self.layouts, 0)

    def start(self) -> None:
        cores = [self.placement.source, self.placement.destination] if self.placement else [None, None]
        for instances in self.layouts.values():
            for inst, on in reversed(list(zip(instances, cores))):  # the destination first: the link is up at once
                inst.start(on)
        time.sleep(1.0)  # the links' handshakes

    def burst(self, mode: str, n: int) -> tuple[float, float, float]:
        """(persisted publishes per second, server CPU µs per message over every instance,
        the destination's included: an async destination finishes after the publisher, so
        its CPU is read once it is idle; the source's alone: its own work for the link,
        and on a shared machine what competing with the destination for the cores costs
        it)."""
        instances = self.layouts[mode]
        cpu = [inst.cpu_s() for inst in instances]
        with on_cores(self.placement.client if self.placement else None):
            rate = uvloop.run(publish_rate(instances[0].uri, n))
        if len(instances) == 2:
            until_idle(instances[1])
        spent = [inst.cpu_s() - before for inst, before in zip(instances, cpu)]
        self.published[mode] += n
        return rate, sum(spent) / n * 1e6, spent[0] / n * 1e6

    def check(self) -> None:
        """Every destination holds every message its source was sent (a replay each)."""
        for mode, instances in self.layouts.items():
            if len(instances) == 2:
                wait_replicated(instances[1].uri, self.published[mode])

    def stop(self) -> None:
        for instances in self.layouts.values():
            for inst in instances:
                inst.stop()


def wait_replicated(uri: str, n: int, timeout: float = 300) -> None:
    """Until a replay of the topic on ``uri`` holds ``n`` messages."""

    async def count() -> int:
        from conveyor import AsyncClient

        client = await AsyncClient(f"count-{time.time_ns()}").connect(uri)
        got = 0
        done = asyncio.Event()

        def on_message(_msg) -> None:
            nonlocal got
            got += 1
            if got >= n:
                done.set()

        await client.subscribe(TOPIC, bookmark="0", on_message=on_message)
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            await client.disconnect()
        return got

    uvloop.run(count())


# --- 2. lag at a fixed rate -----------------------------------------------------------------


async def lag_run(a_uri: str, b_uri: str, rate: int, seconds: float) -> list[float]:
    from conveyor import AsyncClient

    sent: dict[int, float] = {}
    lags: list[float] = []
    total = int(rate * seconds)
    done = asyncio.Event()

    def on_message(msg) -> None:
        i = json.loads(msg.data)["i"]
        lags.append(time.perf_counter() - sent[i])
        if len(lags) >= total:
            done.set()

    sub = await AsyncClient(f"lag-sub-{time.time_ns()}").connect(b_uri)
    await sub.subscribe(TOPIC, on_message=on_message)
    pub = await AsyncClient(f"lag-pub-{time.time_ns()}", max_inflight=20_000).connect(a_uri)
    tick = 0.01
    per_tick = int(rate * tick)
    start = time.perf_counter()
    i = 0
    while i < total:
        due = start + (i // per_tick) * tick
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        for _ in range(per_tick):
            sent[i] = time.perf_counter()
            await pub.publish(TOPIC, b'{"i":%d}' % i)
            i += 1
    await pub.wait_persisted(timeout=120)
    await asyncio.wait_for(done.wait(), 120)
    await pub.disconnect()
    await sub.disconnect()
    return lags[len(lags) // 10:]  # the first second warms up connections and caches


def measure_lag(sync: bool, root: Path) -> list[float]:
    a, b = pair(root, sync=sync)
    b.start()
    a.start()
    try:
        time.sleep(1.0)
        return uvloop.run(lag_run(a.uri, b.uri, LAG_RATE, LAG_SECONDS))
    finally:
        a.stop()
        b.stop()


# --- 3. catch-up ----------------------------------------------------------------------------


async def fill(uri: str, n: int, topic: str = TOPIC) -> None:
    from conveyor import AsyncClient

    client = await AsyncClient(f"fill-{time.time_ns()}", max_inflight=20_000).connect(uri)
    for _ in range(n):
        await client.publish(topic, PAYLOAD)
    await client.wait_persisted(timeout=1200)
    await client.disconnect()


async def count_arrivals(uri: str, n: int, started: asyncio.Event) -> tuple[float, float]:
    from conveyor import AsyncClient

    first = last = 0.0
    count = 0
    done = asyncio.Event()

    def on_message(_msg) -> None:
        nonlocal first, last, count
        count += 1
        last = time.perf_counter()
        if count == 1:
            first = last
        if count >= n:
            done.set()

    client = await AsyncClient(f"catchup-{time.time_ns()}").connect(uri)
    await client.subscribe(TOPIC, on_message=on_message)
    started.set()
    await asyncio.wait_for(done.wait(), 1800)
    await client.disconnect()
    return first, last


def measure_catchup(n: int, root: Path) -> tuple[float, float]:
    """(records/s from the first to the last arrival, seconds from A's start to the last)."""
    a, b = pair(root, sync=False)
    a.start()  # B is not running: everything waits in A's journal
    try:
        uvloop.run(fill(a.uri, n))
        a.stop()
        b.start()

        async def run() -> tuple[float, float, float]:
            started = asyncio.Event()
            counter = asyncio.ensure_future(count_arrivals(b.uri, n, started))
            await started.wait()
            t0 = time.perf_counter()
            await asyncio.get_running_loop().run_in_executor(None, a.start)
            first, last = await counter
            return t0, first, last

        t0, first, last = uvloop.run(run())
        return n / (last - first), last - t0
    finally:
        a.stop()
        b.stop()


# --- 4. replicated queue drain --------------------------------------------------------------


async def worker(uri: str, name: str, backlog: int) -> tuple[int, float, float, float]:
    """(messages processed, wall-clock time of the first and of the last, this process's
    CPU seconds from "go" to the end: its start-up and imports left out)."""
    from conveyor import AsyncClient

    client = await AsyncClient(name, ack_batch_size=max(1, backlog // 2)).connect(uri)
    count = 0
    first = last = time.time()

    def on_message(msg) -> None:
        nonlocal count, first, last
        count += 1
        last = time.time()
        if count == 1:
            first = last
        msg.ack()

    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go": every worker is connected
    cpu = time.process_time()
    last = time.time()
    await client.subscribe(QUEUE, max_backlog=backlog, on_message=on_message)
    while time.time() - last < WORKER_IDLE_S:  # from the start too: a worker may get nothing
        await asyncio.sleep(0.1)
    await client.flush()
    await client.disconnect()
    return count, first, last, time.process_time() - cpu


def drain(uris: list[str], n: int, backlog: int = 10) -> tuple[float, float, float, float]:
    """(msg/s from the start to the last message, msg/s from the first message to the
    last, seconds from the start to the first message, the workers' CPU seconds)."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.bench_replication", "worker", uri, f"w{i}-{time.time_ns()}",
                               str(backlog)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i, uri in enumerate(uris)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    start = time.time()  # wall clock: the workers' last-message times are compared with it
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    counts, firsts, lasts = [], [], []
    clients_s = 0.0
    for p in procs:
        count, first, last, cpu = p.communicate(timeout=1800)[0].split()[-4:]
        clients_s += float(cpu)
        if int(count):
            counts.append(int(count))
            firsts.append(float(first))
            lasts.append(float(last))
    assert sum(counts) == n, f"drained {sum(counts)} of {n} (each message must be processed once)"
    return n / (max(lasts) - start), n / (max(lasts) - min(firsts)), min(firsts) - start, clients_s


async def queue_depth(uri: str) -> int:
    from conveyor import AsyncClient

    client = await AsyncClient(f"depth-{time.time_ns()}").connect(uri)
    depth = len(await client.sow(QUEUE))
    await client.disconnect()
    return depth


def wait_depth(uri: str, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while (depth := uvloop.run(queue_depth(uri))) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{uri}: {QUEUE} shows {depth} of {n}")
        time.sleep(0.5)


def measure_queue(layout: str, n: int, root: Path) -> tuple[tuple[float, float, float], float, float]:
    """(:func:`drain`'s rates and first delay, server CPU µs per message over every
    instance, the workers' CPU µs per message). The two cores are shared by both: a
    drain that leaves some idle is bound by a wait, one that uses them whole by the sum."""
    if layout == "single":
        a = Instance(root, "A", queue=True)
        instances = [a]
        uris = [a.uri] * 4
    else:
        a, b = pair(root, sync=False, both_ways=True, queue=True)
        instances = [a, b]
        uris = {"owner": [a.uri] * 4, "split": [a.uri, a.uri, b.uri, b.uri], "other": [b.uri] * 4}[layout]
    for inst in instances:
        inst.start()
    try:
        uvloop.run(fill(a.uri, n))
        for inst in instances:
            wait_depth(inst.uri, n)  # every instance holds every message before the clock starts
        cpu = sum(inst.cpu_s() for inst in instances)
        start_rate, steady, first, clients_s = drain(uris, n)
        servers_s = sum(inst.cpu_s() for inst in instances) - cpu
        return (start_rate, steady, first), servers_s / n * 1e6, clients_s / n * 1e6
    finally:
        for inst in instances:
            inst.stop()


# --- main -----------------------------------------------------------------------------------


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def core_seconds(iterations: int = 1_000_000) -> list[float]:
    """Seconds one fixed Python loop takes on each core, one core at a time. On a
    virtual machine a core's speed moves with what else its host runs, and a single
    instance (one busy core) and a replicated pair (every core busy) feel it
    differently; the probe says what each measurement ran on."""
    cores = sorted(os.sched_getaffinity(0))
    times = []
    try:
        for core in cores:
            os.sched_setaffinity(0, {core})
            start = time.perf_counter()
            total = 0
            for i in range(iterations):
                total += i
            times.append(time.perf_counter() - start)
    finally:
        os.sched_setaffinity(0, cores)
    return times



def _ratio(base: float, value: float) -> str:
    """``base / value``, or "n/a" when a run too short for the CPU clock's ticks measured 0."""
    return f"{base / value:.2f}" if value else "n/a"

def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        count, first, last, cpu = uvloop.run(worker(sys.argv[2], sys.argv[3], int(sys.argv[4])))
        print(count, repr(first), repr(last), repr(cpu), flush=True)
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queue-messages", type=int, default=50_000)
    parser.add_argument("--catchup", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--publish-rounds", type=int, default=15,
                        help="rounds of the three publish layouts, one burst of --messages each")
    parser.add_argument("--only", action="append", choices=("publish", "lag", "queue"),
                        help="run only these workloads (repeatable; with --catchup 0, no catch-up either)")
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    args = parser.parse_args()
    only = set(args.only or ("publish", "lag", "queue"))
    if args.write and (len(only) < 3 or not args.catchup):
        parser.error("--write needs every workload (no --only, a --catchup above 0)")
    loads = [load_average()]
    own_core = Placement.own_core()
    placements: dict[str, Placement | None] = {"own core": own_core} if own_core else {}
    placements["shared"] = None
    modes = ("single", "sync", "async")
    pub: dict[tuple[str, str], list[float]] = {(where, mode): [] for where in placements for mode in modes}
    pub_cpu: dict[tuple[str, str], list[float]] = {key: [] for key in pub}
    pub_source_cpu: dict[tuple[str, str], list[float]] = {key: [] for key in pub}
    pub_cores: list[list[float]] = []  # core_seconds() before each publish round
    lag: dict[str, list[float]] = {"async": [], "sync": []}
    queue: dict[str, list[float]] = {"single": [], "owner": [], "split": [], "other": []}
    queue_steady: dict[str, list[float]] = {layout: [] for layout in queue}  # first to last message
    queue_first: dict[str, list[float]] = {layout: [] for layout in queue}  # seconds to the first message
    queue_cpu: dict[str, list[float]] = {layout: [] for layout in queue}
    queue_clients: dict[str, list[float]] = {layout: [] for layout in queue}
    catchup: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        step = 0

        def fresh() -> Path:
            nonlocal step
            step += 1
            return root / f"s{step}"

        for where, placement in placements.items() if "publish" in only else ():
            setup = PublishSetup(fresh(), placement)
            try:
                setup.start()
                for rnd in range(args.publish_rounds):
                    cores = core_seconds()
                    pub_cores.append(cores)
                    for mode in modes if rnd % 2 == 0 else reversed(modes):
                        rate, cpu, source_cpu = setup.burst(mode, args.messages)
                        pub_source_cpu[where, mode].append(source_cpu)
                        pub[where, mode].append(rate)
                        pub_cpu[where, mode].append(cpu)
                        print(f"round {rnd + 1} publish {mode}, {where}: {rate:,.0f} msg/s, servers {cpu:.1f} µs/msg, "
                              f"source {source_cpu:.1f} µs/msg; core probe {' / '.join(f'{t:.3f}' for t in cores)} s",
                              flush=True)
                setup.check()
            finally:
                setup.stop()
            loads.append(load_average())
        for run in range(args.runs):
            # Every other round in the reverse order: no layout always runs first, on a
            # machine fresh from the previous one's teardown.
            def order(names):
                return list(names) if run % 2 == 0 else list(reversed(names))

            for mode in order(lag) if "lag" in only else ():
                lags = measure_lag(mode == "sync", fresh())
                lag[mode].extend(lags)
                print(f"run {run + 1} lag {mode}: p50 {pct(lags, 50) * 1e3:.2f} ms, p99 {pct(lags, 99) * 1e3:.2f} ms",
                      flush=True)
            for layout in order(queue) if "queue" in only else ():
                (rate, steady, first), cpu, clients = measure_queue(layout, args.queue_messages, fresh())
                queue[layout].append(rate)
                queue_steady[layout].append(steady)
                queue_first[layout].append(first)
                queue_cpu[layout].append(cpu)
                queue_clients[layout].append(clients)
                print(f"run {run + 1} queue drain {layout}: {rate:,.0f} msg/s from the start, {steady:,.0f} msg/s "
                      f"from the first message ({first:.2f} s to it), servers {cpu:.1f} µs/msg, "
                      f"workers {clients:.1f} µs/msg", flush=True)
            loads.append(load_average())
        if args.catchup:
            catchup.append(measure_catchup(args.catchup, fresh()))
            print(f"catch-up of {args.catchup:,}: {catchup[-1][0]:,.0f} records/s, {catchup[-1][1]:.1f} s", flush=True)
            loads.append(load_average())

    def ratios(values: list[float], bases: list[float]) -> str:
        """The median of the rounds' ratios (each round measured both back to back), and
        their range: steadier than a ratio of medians on a noisy machine."""
        each = sorted(v / b for v, b in zip(values, bases))
        return f"{median(each):.2f} ({each[0]:.2f}-{each[-1]:.2f})"

    sections = []
    if "publish" in only:
        rows = ["| cores | publish | msg/s (median) | ratio of medians | ratio per round: median (range) | target "
                "| server CPU µs/msg (all instances) | source CPU µs/msg (ratio) |",
                "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
        for where in placements:
            base, source_base = median(pub[where, "single"]), median(pub_source_cpu[where, "single"])
            for mode, label, target in (("single", "one instance", ""), ("sync", "one `sync` destination", "≥ 0.50"),
                                        ("async", "one `async` destination", "≥ 0.80")):
                key = where, mode
                rows.append(f"| {where} | {label} | {median(pub[key]):,.0f} | {median(pub[key]) / base:.2f} "
                            f"| {ratios(pub[key], pub[where, 'single'])} | {target} | {median(pub_cpu[key]):.1f} "
                            f"| {median(pub_source_cpu[key]):.1f} ({_ratio(source_base, median(pub_source_cpu[key]))}) |")
        if own_core is not None:
            rows.append(f"\n\"own core\": the source (and the single instance) on core {min(own_core.source)} alone, "
                        f"the destination on core {min(own_core.destination)}, the publishing client on "
                        f"{'core ' + ', '.join(map(str, sorted(own_core.client)))}; \"shared\": every process "
                        "wherever the kernel puts it.")
        probe = "; ".join(f"core {core}: {min(times):.3f}-{max(times):.3f} s"
                          for core, times in enumerate(zip(*pub_cores)))
        rows.append(f"\nThe core probe before each publish round (a fixed Python loop of a million "
                    f"additions, on each core in turn; the lower, the faster): {probe}.")
        sections.append("\n".join(rows))
    if "queue" in only:
        qbase, sbase = median(queue["single"]), median(queue_steady["single"])
        names = {"single": "4 workers, one unreplicated instance",
                 "owner": "replicated pair, 4 workers on the owner A",
                 "split": "replicated pair, 2 workers on A and 2 on B",
                 "other": "replicated pair, 4 workers on B (every message transferred)"}
        qrows = ["| queue drain | msg/s from the start (ratio) | msg/s from the first message (ratio) "
                 "| ratio per round, from the first message: median (range) | target | s to the first message "
                 "| server CPU µs/msg (all instances) | workers' CPU µs/msg |",
                 "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
        for layout, label in names.items():
            target = "≥ 0.70 (transfer rate)" if layout == "other" else ""
            qrows.append(f"| {label} | {median(queue[layout]):,.0f} ({median(queue[layout]) / qbase:.2f}) "
                         f"| {median(queue_steady[layout]):,.0f} ({median(queue_steady[layout]) / sbase:.2f}) "
                         f"| {ratios(queue_steady[layout], queue_steady['single'])} | {target} "
                         f"| {median(queue_first[layout]):.2f} | {median(queue_cpu[layout]):.1f} "
                         f"| {median(queue_clients[layout]):.1f} |")
        sections.append("\n".join(qrows))
    if "lag" in only:
        lag_rows = ["| replication | lag p50 (ms) | p99 (ms) | max (ms) |", "| --- | ---: | ---: | ---: |"]
        for mode, values in lag.items():
            lag_rows.append(f"| `{mode}` | {pct(values, 50) * 1e3:.2f} | {pct(values, 99) * 1e3:.2f} "
                            f"| {max(values) * 1e3:.1f} |")
        sections.append("\n".join(lag_rows))
    table = "\n\n".join(sections)
    if catchup:
        rate, total_s = catchup[0]
        table += (f"\n\nCatch-up of {args.catchup:,} records after an outage: {rate:,.0f} records/s from the first to the"
                  f" last arrival; {total_s:.1f} s from the source's start (its recovery included) to the last.")
    print(table)
    if "queue" in only:  # the last line, for bench.ab: the queue drain's figures
        single = median(queue_steady["single"])
        print(json.dumps({layout: {"msg_per_s": median(queue_steady[layout]),
                                   "server_us_per_msg": median(queue_cpu[layout]),
                                   "workers_us_per_msg": median(queue_clients[layout]),
                                   "vs_single": median(queue_steady[layout]) / single} for layout in queue}))
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_replication --runs {args.runs} --write` (about
{round(2 + 1.2 * args.runs)} minutes).

Real instances on loopback, each its own `conveyor serve` process; Python asyncio clients
(uvloop) in the benchmark's process, queue workers in their own processes. Publishes:
bursts of {args.messages:,} messages of 256 bytes from one pipelined publisher that waits
until each is acknowledged as persisted (with a `sync` destination, persisted means on
both disks). A single instance, a pair with a `sync` destination and a pair with an
`async` one are started once and driven in turn, one burst each per round,
{args.publish_rounds} rounds (every other in the reverse order), so the ratio per round
compares bursts a few seconds apart; server CPU is counted until the destination is
idle, and a replay on each destination at the end checks it holds every message. All of
it twice: with every process wherever the kernel puts it, and with the source alone on
a core (see below). Lag: {LAG_RATE:,} msg/s for {LAG_SECONDS:.0f} s published on A, a subscriber on B, the first
10% left out; the lag is from the publish call to the arrival at B's subscriber. Queue
drain: {args.queue_messages:,} messages published on A into a queue replicated both ways
(`async`), every instance holding all of them before the workers start; 4 worker
processes, backlog 10, acks batched by 5; each message must be processed exactly once or
the run fails. The workers' CPU is their processes' own (user and system), from the drain's
start to their end (their start-up left out): they share the cores with the servers. Lag
and queue drain: medians of {args.runs} interleaved runs, every other one in the reverse
order; the ratio per round compares the two measured in the same round.

Machine: {machine()}; commit {git_rev()}; load average (1/5/15 min) before and after
each round: {"; ".join(loads)}.

{table}
"""
        write_section("Replication", body)


if __name__ == "__main__":
    main()
