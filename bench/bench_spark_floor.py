"""Spark: what any Python streaming source costs a query before it reads a row.

``bench.bench_spark`` compares a one-batch query of the conveyor source with the same
query over Spark's JSON file source. Part of the difference is not conveyor's: a Python
data source (``pyspark.sql.datasource``) runs its driver side in a Python process that
Spark starts for each query (its imports alone are pyspark, pyarrow and numpy), while the
file source runs in the JVM. This measures that part alone, in one SparkSession
(``local[2]``), alternating:

- ``python source``: a Python streaming source of two rows that does nothing else (no
  connection, no lease), ``Trigger.AvailableNow``, into the ``noop`` sink;
- ``json files``: Spark's JSON file source over a file of the same two rows, the same way.

The difference of the medians is the fixed cost of a Python source, which no work in
the source itself can remove; the last line bounds the one-batch ratio of
``bench.bench_spark`` with it: the file query's time over the file query's time plus
that cost, the best any Python source could score there.

    python -m bench.bench_spark_floor [--rounds 5] [--file-query-s 1.5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.report import median


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--file-query-s", type=float, default=None, metavar="S",
                        help="the file source's one-batch query time of bench.bench_spark, to bound its ratio")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class TwoRows(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_two_rows"

        def schema(self) -> str:
            return "data STRING"

        def streamReader(self, schema):  # noqa: ANN001 (pyspark's signature)
            return TwoRowsReader()

    class TwoRowsReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"o": 0}

        def latestOffset(self) -> dict:
            return {"o": 2}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)] if end["o"] > start["o"] else []

        def read(self, partition):  # noqa: ANN001
            yield ("a",)
            yield ("b",)

    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-floor-"))
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TwoRows)
    files = tmp / "files"
    files.mkdir()
    (files / "rows.json").write_text('{"data": "a"}\n{"data": "b"}\n')
    times: dict[str, list[float]] = {"python source": [], "json files": []}
    try:
        for rnd in range(args.rounds + 1):  # round 0 warms the JVM and the Python workers up
            for job in times:
                started = time.perf_counter()
                if job == "python source":
                    df = spark.readStream.format("bench_two_rows").load()
                else:
                    df = spark.readStream.schema("data STRING").json(str(files))
                query = (df.writeStream.format("noop").option("checkpointLocation", str(tmp / f"ck-{rnd}-{job}"))
                         .trigger(availableNow=True).start())
                query.awaitTermination()
                seconds = time.perf_counter() - started
                if rnd:
                    times[job].append(seconds)
                print(f"round {rnd} {job}: {seconds:.2f} s", flush=True)
    finally:
        spark.stop()
    python_s, files_s = median(times["python source"]), median(times["json files"])
    print(f"two rows, query wall time (medians of {args.rounds}): python source {python_s:.2f} s, "
          f"json files {files_s:.2f} s; a Python source's fixed cost {python_s - files_s:.2f} s")
    if args.file_query_s:
        bound = args.file_query_s / (args.file_query_s + python_s - files_s)
        print(f"best one-batch ratio any Python source could reach beside a {args.file_query_s:.2f} s file query: "
              f"{bound:.0%}")


if __name__ == "__main__":
    main()
