"""Spark: rows/s through the conveyor streaming source, beside Spark's own JSON file source.

One SparkSession (``local[2]``), one run of each job per round, medians over rounds:

- ``conveyor -> conveyor sink``: the source drains N queued JSON messages (one
  micro-batch, ``Trigger.AvailableNow``), ``from_json`` + a computed column, the txn
  sink publishes N results to a topic. The query declares the one column it reads
  (``readStream.schema("data STRING")``: a Python data source has no column pruning,
  docs/spark.md); ``conveyor (every column)`` is the same query without it, the source
  building its eight columns.
- ``json files -> conveyor sink``: the same N messages read from JSON-lines files with
  ``spark.readStream.json`` (same schema, one micro-batch), the same transformation and
  the same sink. The sink is identical so the difference is the source.
- the same two sources into the ``noop`` sink (the source alone), and the conveyor
  source yielding tuples instead of Arrow batches (``output=rows``: why Arrow).

Untimed before each conveyor run: N messages are published to the queue's topic (each
run drains its own N). Timed: ``start()`` to the end of the query.

    python -m bench.bench_spark [--messages N] [--rounds 3] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_publish import free_port
from bench.report import git_rev, machine, median, spark_python, write_section

CONFIG = """<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport></Transports>
<TransactionLog><JournalDirectory>{journal}</JournalDirectory><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW><Queue><Name>Orders</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic>
<Semantics>at-least-once</Semantics></Queue></SOW>
</AMPSConfig>"""
SCHEMA = "id LONG, customer INT, qty INT, price DOUBLE, note STRING"
TRANSFORM = "to_json(named_struct('id', o.id, 'customer', o.customer, 'amount', o.qty * o.price)) AS value"


def orders(n: int, start: int = 0) -> list[bytes]:
    rng = random.Random(start)
    return [
        json.dumps({"id": i, "customer": rng.randrange(1000), "qty": rng.randint(1, 9),
                    "price": round(rng.uniform(1, 100), 2), "note": "x" * 40}).encode()
        for i in range(start, start + n)
    ]


def start_server(workdir: Path, config: str = CONFIG) -> tuple[subprocess.Popen, str]:
    """``conveyor serve`` with ``config`` (``{port}``, ``{journal}`` filled in); (process, uri)."""
    port = free_port()
    cfg = workdir / "conveyor.xml"
    cfg.write_text(config.format(port=port, journal=workdir / "journal"))
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("conveyor listening on port"):
            return proc, f"tcp://127.0.0.1:{port}"
    raise SystemExit("server did not start")


def publish(uri: str, rows: list[bytes], name: str) -> None:
    from conveyor.client.rpc import RpcClient

    with RpcClient(uri, client_name=name) as rpc:
        for a in range(0, len(rows), 20000):
            rpc.publish_batch("orders", rows[a : a + 20000], first_seq=a + 1)


def timed(query, started: float) -> tuple[float, float]:
    """(wall seconds since ``started``, seconds inside micro-batches that had rows)."""
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(query.exception())
    wall = time.perf_counter() - started
    inside = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress if p["numInputRows"])
    return wall, inside / 1000


def sink(df, uri: str, kind: str, checkpoint: str):
    writer = df.writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    if kind == "noop":
        return writer.format("noop").start()
    return writer.format("conveyor").option("server", uri).option("topic", "results").start()


def conveyor_job(spark, uri: str, n: int, consumer: str, sink_kind: str, tmp: Path, output: str = "arrow",
                 columns: str | None = "data STRING"):
    reader = spark.readStream.format("conveyor")
    if columns:
        reader = reader.schema(columns)
    df = (
        reader.option("server", uri).option("queue", "Orders")
        .option("consumer", consumer).option("maxRecordsPerBatch", str(n)).option("numPartitions", "2")
        .option("output", output).load()
    )
    out = df.selectExpr(f"from_json(data, '{SCHEMA}') AS o").selectExpr(TRANSFORM)
    return sink(out, uri, sink_kind, str(tmp / f"ck-{consumer}"))


def file_job(spark, uri: str, files: Path, sink_kind: str, tmp: Path, tag: str):
    df = spark.readStream.schema(SCHEMA).json(str(files))
    out = df.selectExpr("struct(*) AS o").selectExpr(TRANSFORM)
    return sink(out, uri, sink_kind, str(tmp / f"ck-files-{tag}"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    n = args.messages
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from conveyor.spark import register

    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    server, uri = start_server(tmp)
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    rows = orders(n)
    files = tmp / "files"
    files.mkdir()
    for part in range(2):  # two files: two partitions, as the conveyor source's numPartitions=2
        (files / f"part-{part}.json").write_bytes(b"\n".join(rows[part::2]) + b"\n")
    jobs = ["conveyor -> conveyor sink", "json files -> conveyor sink", "conveyor (every column) -> conveyor sink",
            "conveyor -> noop", "json files -> noop", "conveyor (tuples) -> noop"]
    times: dict[str, list[float]] = {job: [] for job in jobs}
    batch_times: dict[str, list[float]] = {job: [] for job in jobs}
    published = 0
    try:
        for rnd in range(args.rounds + 1):  # round 0 warms the JVM and the Python workers up
            for job in jobs:
                kind = "noop" if job.endswith("noop") else "conveyor"
                if job.startswith("conveyor"):
                    publish(uri, rows, f"bench-pub-{published}")
                    published += 1
                    output = "rows" if "tuples" in job else "arrow"
                    columns = None if "every column" in job else "data STRING"
                    started = time.perf_counter()
                    query = conveyor_job(spark, uri, n, f"c{published}", kind, tmp, output, columns)
                else:
                    started = time.perf_counter()
                    query = file_job(spark, uri, files, kind, tmp, f"{rnd}-{kind}")
                seconds, inside = timed(query, started)
                if rnd:
                    times[job].append(seconds)
                    batch_times[job].append(inside)
                print(f"round {rnd} {job}: {n / seconds:,.0f} rows/s ({seconds:.2f}s; in the batch {inside:.2f}s)",
                      flush=True)
    finally:
        spark.stop()
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    rate = {job: n / median(times[job]) for job in jobs}
    batch_rate = {job: n / median(batch_times[job]) for job in jobs}
    lines = [
        f"| {job} | {rate[job]:,.0f} | {median(times[job]):.2f} | {batch_rate[job]:,.0f} | {median(batch_times[job]):.2f} |"
        for job in jobs
    ]
    ratio = rate["conveyor -> conveyor sink"] / rate["json files -> conveyor sink"]
    ratio_noop = rate["conveyor -> noop"] / rate["json files -> noop"]
    ratio_batch = batch_rate["conveyor -> conveyor sink"] / batch_rate["json files -> conveyor sink"]
    ratio_every = rate["conveyor (every column) -> conveyor sink"] / rate["json files -> conveyor sink"]
    table = "\n".join([
        "| Job | rows/s, query wall time | seconds | rows/s, inside the micro-batch | seconds |",
        "| --- | ---: | ---: | ---: | ---: |", *lines,
    ])
    print(table)
    print(f"conveyor source / file source: {ratio:.0%} with the conveyor sink ({ratio_batch:.0%} inside the batch), "
          f"{ratio_every:.0%} with every column, {ratio_noop:.0%} into noop")
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_spark --write` ({n:,} messages of about 110 bytes,
{args.rounds} timed rounds after a warm-up round, medians).

Machine: {machine()}; commit {git_rev()}; {spark_python()}. Spark `local[2]`, one micro-batch per run
(`Trigger.AvailableNow`), 2 input partitions for both sources, the same transformation
(`from_json` + a computed column + `to_json`) and, in the first two rows, the same sink
(the conveyor txn sink publishing every row to a topic), so the difference is the source.
Before each conveyor run, N messages are published to the queue (untimed). "Query wall
time" is `start()` to the end of the query: it includes starting the query, which for a
Python data source means starting Python workers (planning, the source runner), a fixed
cost of a few seconds the file source does not pay. "Inside the micro-batch" is Spark's
own `triggerExecution` time of the batch (lease, plan, read, transform, write, commit).

{table}

Conveyor source / file source, same conveyor sink: **{ratio:.0%}** of the rate by query
wall time, **{ratio_batch:.0%}** inside the micro-batch (goal: at least 50%); into `noop`,
{ratio_noop:.0%}. The conveyor queries declare the one column they read
(`readStream.schema("data STRING")`); the `every column` row is the first query without
that declaration, the source building all eight of its columns: **{ratio_every:.0%}**.
The `tuples` row is the same source yielding Python tuples instead of Arrow batches
from `read()`. Where the time goes: docs/spark.md, "Performance".
"""
        write_section("Spark: streaming source and sink", body)
    # the last line, for bench.ab: seconds per job (wall and inside the batch) and the ratios
    print(json.dumps({"ratio": ratio, "ratio_batch": ratio_batch, "ratio_noop": ratio_noop, "ratio_every": ratio_every,
                      "wall_s": {job: median(times[job]) for job in jobs},
                      "batch_s": {job: median(batch_times[job]) for job in jobs}}))


if __name__ == "__main__":
    main()
