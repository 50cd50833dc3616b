"""Spark: steady-state streaming, the conveyor source beside Spark's JSON file source.

bench_spark measures one ``AvailableNow`` micro-batch, start-up included. This one runs
a streaming query that is already started and waiting, and feeds it while it runs:

- **conveyor**: the source on queue ``Orders`` (``maxRecordsPerBatch`` = ``--batch``,
  ``numPartitions`` = ``--partitions``) -> ``from_json`` -> bench_spark's transform ->
  the sink (``noop``; ``--sink conveyor``: the txn sink publishing every result to a
  topic; ``--sink both``: both, one after the other). A publisher process (``AsyncClient``,
  pipelined, persisted acks) publishes ``--messages`` JSON orders to topic ``orders``
  at full speed, or at ``--rate`` messages/s.
- **files**: ``spark.readStream.schema(...).json(dir)`` with ``maxFilesPerTrigger`` =
  ``--partitions``, the same transform and sink. A writer process writes the same
  orders into files of ``--batch / --partitions`` lines (so a micro-batch is the same
  number of rows in the same number of tasks as the conveyor source's), each written
  under a staging directory and renamed into the watched one when complete. It writes
  at ``--rate``, or else at the rate the conveyor publisher reached in the same round.

Each round runs conveyor, then files, in one SparkSession (``local[2]``) and against
one ``conveyor serve``; an untimed warm-up round (``--warmup`` messages) comes first.
Both producers start only once the query is started and waiting for data, so start-up
is never measured. A run ends when the query has committed all N rows (``--timeout``
fails it otherwise).

Measures, per run:

- **rows/s in batches**: the sum of ``numInputRows`` over the sum of the batches'
  ``triggerExecution`` durations, leaving out the first ``--skip`` batches that had
  rows (warm-up): the query's rate while it works; **rows/s wall**: N over the time
  from the start of the first batch with rows to the end of the last one.
- **latency per micro-batch**: every message carries its publish time (``"ts":
  time.time()`` in the producer, for a file line the time it was written, so a file
  line also waits for its file to fill). The query computes ``min(o.ts)`` and
  ``percentile_approx(o.ts, 0.5)`` per batch with ``observe()``, reported in the
  batch's progress. Every row of a batch becomes visible in the sink at the same
  moment, the end of the batch (progress ``timestamp`` + ``triggerExecution``, after
  the commit), so the batch's median latency is that end minus the median ts and its
  maximum is that end minus the smallest ts. Reported: the median over the measured
  batches of the per-batch median, and the largest per-batch maximum. At full speed
  the producer outruns the query, a backlog builds and latency grows with it (queueing,
  not processing); below the query's capacity (``--rate``) it is the pipeline's own.
- **CPU per message**: user + system time from the producer's start to the last
  committed batch, over N: of the server process (``/proc/<pid>/stat``: publish,
  lease, fetch, ack and, with the conveyor sink, staging and commits), and of Spark: the
  driver JVM (where ``local`` executors run) and every process under it (the Python
  workers: the source's runner and readers, ``from_json`` runs in the JVM), counting
  exited children through their parents' ``cutime``/``cstime``. The producer process
  is in neither figure.

    python -m bench.bench_spark_stream [--messages 2000000] [--rate 0] [--batch 50000]
        [--sink noop|conveyor|both] [--rounds 1] [--py-spy FILE] [--write]

``--py-spy FILE`` records the server with py-spy (``--nonblocking``, raw collapsed
stacks) during the last conveyor run; the sampler takes CPU from the same 2 cores, so
do not ``--write`` figures from such a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

from bench.bench_latency import cpu_seconds
from bench.bench_spark import SCHEMA, TRANSFORM, orders, start_server
from bench.report import git_rev, machine, median, spark_python, write_section

ROOT = Path(__file__).resolve().parent.parent
STREAM_SCHEMA = SCHEMA + ", ts DOUBLE"
TEMPLATES = 50_000  # distinct orders the producers cycle through (ids repeat; nothing depends on them)
QUEUE, TOPIC = "Orders", "orders"


# --- producers (subprocesses: `--role publish` / `--role write`) ---------------------------


def stamp(row: bytes) -> bytes:
    """``row`` (a JSON object) with ``"ts": <now>`` as its first field."""
    return b'{"ts":%.6f,' % time.time() + row[1:]


async def _publish(uri: str, n: int, rate: float) -> float:
    from conveyor import AsyncClient

    rows = orders(TEMPLATES)
    client = await AsyncClient(f"bench-stream-{uuid.uuid4().hex[:8]}", max_inflight=20_000).connect(uri)
    started = time.perf_counter()
    for i in range(n):
        if rate and i % 500 == 0:
            ahead = started + i / rate - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await client.publish(TOPIC, stamp(rows[i % TEMPLATES]))
    await client.wait_persisted(timeout=600)
    seconds = time.perf_counter() - started
    await client.disconnect()
    return seconds


def _write_files(target: Path, n: int, rate: float, lines: int) -> float:
    rows = orders(TEMPLATES)
    staging = target.parent / (target.name + "-staging")
    staging.mkdir(exist_ok=True)
    started = time.perf_counter()
    i = part = 0
    while i < n:
        path = staging / f"part-{part:06d}.json"
        with open(path, "wb") as f:
            end = min(n, i + lines)
            while i < end:
                if rate:
                    ahead = started + i / rate - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)
                top = min(end, i + 500)
                f.write(b"".join(stamp(rows[j % TEMPLATES]) + b"\n" for j in range(i, top)))
                i = top
        os.rename(path, target / path.name)  # atomic: the file source never sees a partial file
        part += 1
    return time.perf_counter() - started


def producer_main(args) -> None:
    if args.role == "publish":
        import uvloop

        seconds = uvloop.run(_publish(args.uri, args.messages, args.rate))
    else:
        seconds = _write_files(Path(args.dir), args.messages, args.rate, args.lines)
    print(json.dumps({"seconds": seconds, "rate": args.messages / seconds}), flush=True)


def start_producer(role: str, n: int, rate: float, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.bench_spark_stream", "--role", role, "--messages", str(n), "--rate", str(rate)]
    for key, value in kw.items():
        cmd += [f"--{key}", str(value)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def producer_rate(proc: subprocess.Popen, timeout: float) -> float:
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"producer failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])["rate"]


def stop_process(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


# --- CPU of a process tree ----------------------------------------------------------------


def tree_cpu(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live process under it, each with
    the CPU of its exited (reaped) children."""
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))  # ppid; utime stime cutime cstime
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- the queries --------------------------------------------------------------------------


def conveyor_stream(spark, uri: str, consumer: str, batch: int, partitions: int):
    df = (
        spark.readStream.format("conveyor").option("server", uri).option("queue", QUEUE).option("consumer", consumer)
        .option("maxRecordsPerBatch", str(batch)).option("numPartitions", str(partitions)).load()
    )
    return df.selectExpr(f"from_json(data, '{STREAM_SCHEMA}') AS o")


def file_stream(spark, directory: Path, partitions: int):
    df = spark.readStream.schema(STREAM_SCHEMA).option("maxFilesPerTrigger", str(partitions)).json(str(directory))
    return df.selectExpr("struct(*) AS o")


def start_query(parsed, sink: str, uri: str, checkpoint: Path, trigger: float):
    from pyspark.sql import functions as F

    observed = parsed.observe(
        "lat", F.count(F.lit(1)).alias("rows"), F.min("o.ts").alias("first_ts"),
        F.percentile_approx("o.ts", 0.5).alias("mid_ts"),
    )
    writer = observed.selectExpr(TRANSFORM).writeStream.option("checkpointLocation", str(checkpoint))
    if trigger:
        writer = writer.trigger(processingTime=f"{trigger} seconds")
    if sink == "noop":
        return writer.format("noop").start()
    return writer.format("conveyor").option("server", uri).option("topic", "results").start()


def wait_ready(query, timeout: float) -> None:
    """Until the query has run its first (empty) trigger and waits for data."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(query.exception())
        status = query.status
        if status["message"].startswith("Waiting for data") and not status["isTriggerActive"]:
            return
        time.sleep(0.05)
    raise TimeoutError("the query did not start")


def epoch_of(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def follow(query, n: int, timeout: float, producer: subprocess.Popen) -> list:
    """The progress of every batch with rows, until N rows are committed."""
    batches: dict[int, object] = {}
    rows, deadline = 0, time.monotonic() + timeout
    while rows < n:
        if query.exception() is not None:
            raise RuntimeError(query.exception())
        if not query.isActive:
            raise RuntimeError("the query stopped")
        if producer.poll() not in (None, 0):
            raise RuntimeError(f"the producer failed with exit code {producer.returncode}")
        for p in query.recentProgress:
            if p.numInputRows and p.batchId not in batches:
                batches[p.batchId] = p
                rows += p.numInputRows
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rows:,} of {n:,} rows after {timeout:.0f}s")
        time.sleep(0.05)
    if rows != n:
        print(f"  warning: the query read {rows:,} rows, not {n:,}", flush=True)
    return [batches[b] for b in sorted(batches)]


def summarize(progress: list, n: int, skip: int) -> dict:
    ends = [epoch_of(p.timestamp) + p.durationMs["triggerExecution"] / 1000 for p in progress]
    steady = list(zip(progress, ends))[skip:] or list(zip(progress, ends))[-1:]
    p50s, maxes = [], []
    for p, end in steady:
        lat = p.observedMetrics["lat"]
        p50s.append(end - lat["mid_ts"])
        maxes.append(end - lat["first_ts"])
    rows = sum(p.numInputRows for p, _ in steady)
    inside = sum(p.durationMs["triggerExecution"] for p, _ in steady) / 1000
    return {
        "batch_rate": rows / inside,
        "wall_rate": n / (ends[-1] - epoch_of(progress[0].timestamp)),
        "batches": len(progress),
        "batch_rows": rows / len(steady),
        "lat_p50": median(p50s),
        "lat_max": max(maxes),
    }


# --- one run ------------------------------------------------------------------------------


class Bench:
    def __init__(self, spark, server: subprocess.Popen, uri: str, tmp: Path, args) -> None:
        self.spark, self.server, self.uri, self.tmp, self.args = spark, server, uri, tmp, args
        self.jvm = spark.sparkContext._gateway.proc.pid
        self.runs = 0

    def run(self, source: str, sink: str, n: int, rate: float, profile: str | None = None) -> dict:
        a = self.args
        self.runs += 1
        tag = f"{self.runs}-{source}-{sink}"
        checkpoint = self.tmp / f"ck-{tag}"
        if source == "conveyor":
            consumer = f"stream-{tag}"
            parsed = conveyor_stream(self.spark, self.uri, consumer, a.batch, a.partitions)
        else:
            watched = self.tmp / f"files-{tag}"
            watched.mkdir()
            parsed = file_stream(self.spark, watched, a.partitions)
        query = start_query(parsed, sink, self.uri, checkpoint, a.trigger)
        producer = spy = None
        try:
            wait_ready(query, a.timeout)
            server0, spark0 = cpu_seconds(self.server.pid), tree_cpu(self.jvm)
            if source == "conveyor":
                producer = start_producer("publish", n, rate, uri=self.uri)
                if profile:
                    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                                            str(self.server.pid), "-f", "raw", "-o", profile, "--nonblocking"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            else:
                lines = max(1, a.batch // a.partitions)
                producer = start_producer("write", n, rate, dir=watched, lines=lines)
            progress = follow(query, n, a.timeout, producer)
            server1, spark1 = cpu_seconds(self.server.pid), tree_cpu(self.jvm)
            stop_process(spy, signal.SIGINT)  # py-spy writes its file on SIGINT
            produced = producer_rate(producer, a.timeout)
        finally:
            stop_process(spy, signal.SIGINT)
            stop_process(producer)
            query.stop()
        if source == "conveyor":
            self._ack_rest(consumer, n)
        else:
            shutil.rmtree(watched, ignore_errors=True)
        shutil.rmtree(checkpoint, ignore_errors=True)
        out = summarize(progress, n, a.skip)
        out.update(producer_rate=produced, spark_us=(spark1 - spark0) / n * 1e6,
                   server_us=(server1 - server0) / n * 1e6 if source == "conveyor" else None)
        return out

    def _ack_rest(self, consumer: str, n: int) -> None:
        """The source acknowledges a batch in the next ``latestOffset``, which a stopped
        query never runs: acknowledge the last one here so the next run's consumer does
        not get its messages again after the lease ends."""
        from conveyor.client.rpc import RpcClient

        with RpcClient(self.uri, client_name=f"bench-ack-{consumer}") as rpc:
            info = rpc.consumer_info(QUEUE, consumer)
            if info.d != n:
                print(f"  warning: consumer {consumer} was delivered {info.d:,} messages, not {n:,}", flush=True)
            if info.acked < info.d:
                epoch = rpc.claim(QUEUE, consumer, uuid.uuid4().hex).epoch
                rpc.ack_through(QUEUE, consumer, info.d, epoch)


# --- main ---------------------------------------------------------------------------------


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from conveyor.spark import register

    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def fmt_us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--rate", type=float, default=0, help="messages/s of the producers; 0: full speed")
    parser.add_argument("--batch", type=int, default=50_000, help="rows per micro-batch (maxRecordsPerBatch)")
    parser.add_argument("--partitions", type=int, default=2, help="tasks per micro-batch")
    parser.add_argument("--trigger", type=float, default=0, help="processing-time trigger in seconds; 0: default")
    parser.add_argument("--sink", choices=("noop", "conveyor", "both"), default="noop")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=200_000, help="messages of the untimed first round; 0: none")
    parser.add_argument("--skip", type=int, default=1, help="first batches with rows left out of rows/s and latency")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    parser.add_argument("--py-spy", dest="py_spy", help="record the server during the last conveyor run into FILE")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--role", choices=("publish", "write"), help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--lines", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        producer_main(args)
        return
    n = args.messages
    sinks = ["noop", "conveyor"] if args.sink == "both" else [args.sink]
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-stream-", dir=os.environ.get("BENCH_TMP")))
    server = spark = None
    results: dict[tuple[str, str], list[dict]] = {(src, s): [] for s in sinks for src in ("conveyor", "files")}
    try:
        server, uri = start_server(tmp)
        spark = spark_session()
        bench = Bench(spark, server, uri, tmp, args)
        rounds = [(0, args.warmup)] * bool(args.warmup) + [(r, n) for r in range(1, args.rounds + 1)]
        for rnd, count in rounds:
            for sink in sinks:
                last = rnd == args.rounds and sink == sinks[0]
                got = bench.run("conveyor", sink, count, args.rate, args.py_spy if last else None)
                rate = args.rate or got["producer_rate"]
                other = bench.run("files", sink, count, rate)
                for source, r in (("conveyor", got), ("files", other)):
                    print(f"round {rnd}{' (warm-up)' if not rnd else ''} {source} -> {sink}: "
                          f"{r['batch_rate']:,.0f} rows/s in batches, {r['wall_rate']:,.0f} wall, "
                          f"{r['batches']} batches of {r['batch_rows']:,.0f}, "
                          f"latency p50 {r['lat_p50']:.2f}s max {r['lat_max']:.2f}s, server {fmt_us(r['server_us'])} "
                          f"us/msg, Spark {r['spark_us']:.0f} us/msg, producer {r['producer_rate']:,.0f}/s", flush=True)
                    if rnd:
                        results[(source, sink)].append(r)
        server_peak = peak_rss_mb(server.pid)
    finally:
        if spark is not None:
            spark.stop()
        if server is not None:
            stop_process(server)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(key: tuple[str, str], field: str) -> float | None:
        values = [r[field] for r in results[key] if r[field] is not None]
        return median(values) if values else None

    lines = []
    for source, sink in results:
        key = (source, sink)
        bound = " (producer)" if med(key, "wall_rate") >= 0.95 * med(key, "producer_rate") else ""
        lines.append(
            f"| {'conveyor' if source == 'conveyor' else 'json files'} -> {sink} | {med(key, 'batch_rate'):,.0f} | "
            f"{med(key, 'wall_rate'):,.0f}{bound} | {med(key, 'batch_rows'):,.0f} | {med(key, 'lat_p50'):.2f} | "
            f"{med(key, 'lat_max'):.2f} | "
            f"{fmt_us(med(key, 'server_us'))} | {med(key, 'spark_us'):.0f} | {med(key, 'producer_rate'):,.0f} |"
        )
    table = "\n".join([
        "| Source -> sink | rows/s in batches | rows/s wall | rows per batch | latency p50 (s) | latency max (s) "
        "| server CPU µs/msg | Spark CPU µs/msg | producer msg/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *lines,
    ])
    ratios = []
    for sink in sinks:
        batch = med(("conveyor", sink), "batch_rate") / med(("files", sink), "batch_rate")
        wall = med(("conveyor", sink), "wall_rate") / med(("files", sink), "wall_rate")
        ratios.append(f"into `{sink}`: **{batch:.0%}** in batches, **{wall:.0%}** by wall time")
    ratio_text = "; ".join(ratios)
    print(table)
    print(f"conveyor / file source rows/s, {ratio_text.replace('**', '').replace('`', '')}; "
          f"server peak RSS {server_peak:,.0f} MB")
    figures = {"server_peak_mb": server_peak}
    for source, sink in results:  # the last line, for bench.ab
        for field in ("batch_rate", "wall_rate", "lat_p50", "server_us", "spark_us"):
            value = med((source, sink), field)
            if value is not None:
                figures[f"{source}.{sink}.{field}"] = value
    print(json.dumps(figures))
    if args.write:
        rounds_text = f"{args.rounds} timed round{'s' * (args.rounds > 1)}" + (
            f" after an untimed warm-up round of {args.warmup:,}" if args.warmup else "") + (
            ", medians" if args.rounds > 1 else "")
        skip_text = f"{args.skip} batch{'es' * (args.skip != 1)}" if args.skip else "no batch"
        rate = f"at {args.rate:,.0f} messages/s" if args.rate else "at full speed"
        files_rate = rate if args.rate else "at the rate the conveyor publisher reached in the same round"
        trigger = f"a {args.trigger:g} s processing-time trigger" if args.trigger else "the default trigger"
        body = f"""Command: `.venv/bin/python -m bench.bench_spark_stream {' '.join(sys.argv[1:])}`
({n:,} messages of about 130 bytes per run; {rounds_text}).

Machine: {machine()}; commit {git_rev()}; {spark_python()}. Spark `local[2]`, {trigger}, micro-batches of
{args.batch:,} rows in {args.partitions} tasks for both sources, bench_spark's transformation
(`from_json` + a computed column + `to_json`). The query is started and waiting before
anything is produced, so start-up is not measured. Conveyor: a publisher process
(`AsyncClient`, persisted acks) publishes {rate} to the queue's topic while the query
runs. Files: a writer process writes the same JSON lines into files of
{args.batch // args.partitions:,} lines, renamed into the watched directory when complete
(`maxFilesPerTrigger={args.partitions}`), {files_rate}. The producers share the 2 cores with the server and Spark.

"Rows/s in batches": rows over the time spent inside micro-batches (Spark's
`triggerExecution`), leaving out the first {skip_text}: the query's capacity while its
batches are full; a query faster than its producer runs smaller batches, each paying
the fixed cost of a micro-batch, and the figure then follows the producer. "Wall": N
over first batch start to last batch end; "(producer)" marks a run whose wall rate is
the producer's (the query kept up). "Rows per batch": mean over the measured batches.
Latency: each message carries its publish time (a file line: when it was written); a
batch's rows are visible when the batch commits, so per batch p50 = batch end - median
publish time and max = batch end - earliest (both from an `observe()` metric); the
table gives the median per-batch p50 and the largest max.
When the producer outruns the query the backlog, not the pipeline, sets the latency.
CPU: user + system time from the producer's start to the last batch, per message, of
the server process and of the Spark driver JVM with all its Python workers (the
producers not counted). Server peak RSS: {server_peak:,.0f} MB.

{table}

Conveyor source / file source, rows/s, {ratio_text}.
"""
        write_section("Spark: steady-state streaming", body)


if __name__ == "__main__":
    main()
