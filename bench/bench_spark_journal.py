"""Spark journal reader throughput: ``python -m bench.bench_spark_journal [--quick] [--write]``.

Writes a journal of 1,000,000 publish records (100-byte payloads, 16 MiB segments,
10 topics each covering a tenth of the log, 10 publishers round-robin) and measures,
as the median of 3 runs each, rows per second of:

- ``read()`` alone, in this process, yielding Arrow batches and yielding tuples (what
  the reader costs without Spark);
- ``spark.read.format("conveyor-journal").load(dir).count()`` in ``local[2]``, with
  Arrow batches (the default) and with tuples (``output=rows``);
- pushed-down filters (``pushdown=true``): ``publisher = 3`` (applied to rows, no
  segment pruned), ``topic = 't3'`` (segments pruned by their summaries) and an ``lsn``
  range (segments pruned by name). Rows/s counts every record of the journal, so
  pruning shows as speed;
- the same ``count()`` and ``topic = 't3'`` over the network: ``conveyor serve`` on the
  same journal, read with ``.option("server", uri)`` (the executors stream the segments
  from the server and verify every frame's checksum themselves).

``--write`` replaces the "Spark journal reader" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

from pathlib import Path

from bench.bench_spark import start_server
from bench.report import git_rev, machine, spark_python, write_section
from conveyor.records.facts import describe_record
from conveyor.records import encode_publish
from conveyor.journal import Journal
from conveyor.journal.index import summarize_segment, write_summary

RUNS = 3
PAYLOAD = bytes(100)


def write_journal(directory: str, records: int, segment_bytes: int) -> None:
    j = Journal.open(directory, segment_bytes=segment_bytes, fsync=False)
    for i in range(records):
        j.append(encode_publish(f"t{i * 10 // records}", i % 10, i, 1_700_000_000 + i / 1000, PAYLOAD, None))
        if i % 100_000 == 0:
            j.commit()
    j.close()


def summarize(directory: str) -> None:
    names = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    for name in names[:-1]:
        path = os.path.join(directory, name)
        write_summary(path, summarize_segment(path, describe_record))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_reader_alone(directory: str, output: str) -> int:
    from pyspark.sql.datasource import CaseInsensitiveDict

    from conveyor.spark.journal_source import JournalDataSource

    reader = JournalDataSource(CaseInsensitiveDict(path=directory, output=output)).reader(None)
    n = 0
    for part in reader.partitions():
        for item in reader.read(part):
            n += item.num_rows if output == "arrow" else 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a figure")
    ap.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = ap.parse_args()
    records = 20_000 if args.quick else 1_000_000
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from conveyor.spark.journal_source import JournalDataSource

    with tempfile.TemporaryDirectory(prefix="bench-spark-journal-") as workdir:
        tmp = os.path.join(workdir, "journal")  # the server's {journal}
        write_journal(tmp, records, 256 * 1024 if args.quick else 16 * 1024 * 1024)
        summarize(tmp)
        segments = len([n for n in os.listdir(tmp) if n.endswith(".log")])
        sealed_rows = bench_reader_alone(tmp, "arrow")
        results: list[tuple[str, float]] = []

        def measure(label: str, fn) -> None:
            times = [timed(fn) for _ in range(RUNS)]
            results.append((label, sealed_rows / statistics.median(times)))
            print(f"{label}: {results[-1][1]:,.0f} rows/s", file=sys.stderr, flush=True)

        measure("read() alone, Arrow batches", lambda: bench_reader_alone(tmp, "arrow"))
        measure("read() alone, tuples", lambda: bench_reader_alone(tmp, "rows"))

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.python.filterPushdown.enabled", "true")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(JournalDataSource)

        def load(**options):
            if "server" in options:
                return spark.read.format("conveyor-journal").options(**options).load()
            return spark.read.format("conveyor-journal").options(**options).load(tmp)

        load().count()  # warm up the JVM and the Python workers
        last_base = max(int(n[:20]) for n in os.listdir(tmp) if n.endswith(".log"))
        cases = [
            ("Spark count(), Arrow batches", lambda: load().count()),
            ("Spark count(), tuples (output=rows)", lambda: load(output="rows").count()),
            ("Spark, publisher = 3 (row filter, no pruning)",
             lambda: load(pushdown="true").filter("publisher = 3").count()),
            ("Spark, topic = 't3' (summary pruning)", lambda: load(pushdown="true").filter("topic = 't3'").count()),
            ("Spark, lsn < 10% of the log (name pruning)",
             lambda: load(pushdown="true").filter(f"lsn < {last_base // 10}").count()),
        ]
        for label, fn in cases:
            measure(label, fn)
        server, uri = start_server(Path(workdir))
        try:
            load(server=uri).count()  # warm up
            measure("Spark count() over the network (server option)", lambda: load(server=uri).count())
            measure("Spark, topic = 't3' over the network (summary pruning)",
                    lambda: load(server=uri, pushdown="true").filter("topic = 't3'").count())
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        spark.stop()

    lines = [
        (
            f"{sealed_rows:,} publish records in {segments - 1} sealed segments of 16 MiB (100-byte payloads); "
            "rows/s = records in the journal / median time of 3 runs, so pruning shows as speed."
        ),
        "",
        "| case | rows/s |",
        "| --- | ---: |",
        *(f"| {label} | {rate:,.0f} |" for label, rate in results),
    ]
    table = "\n".join(lines)
    print(table)
    if args.write and not args.quick:
        body = (
            "Command: `.venv/bin/python -m bench.bench_spark_journal --write` (local[2]).\n\n"
            f"Machine: {machine()}; commit {git_rev()}; {spark_python()}.\n\n{table}\n"
        )
        write_section("Spark journal reader", body)


if __name__ == "__main__":
    main()
