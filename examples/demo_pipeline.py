"""Demo: orders through conveyor and PySpark, exactly once (``make demo``; docs/spark.md).

``--cluster`` (``make demo CLUSTER=1``) runs it on a Spark standalone cluster started
here (a master and two workers on loopback, conveyor.spark.standalone) instead of
``local[2]``; ``--master URL`` uses a cluster that is already running.

1. Starts ``conveyor serve`` with the embedded default configuration (topic ``Work``,
   at-least-once queue ``WorkToDo`` over it, topic ``Results``; journal under ./data of a
   scratch directory) on free ports, client and admin alike, so it runs beside a server
   already on 9007 (``make run``).
2. Publishes orders to ``Work``.
3. A streaming query (``Trigger.AvailableNow``) drains ``WorkToDo`` as named consumer
   ``demo-enricher``, enriches every order (region, amount, size class) and publishes it
   to ``Results`` with the transactional sink: each order exactly once.
4. Aggregates: reads ``Results`` back from the journal (``conveyor-journal``), sums
   orders and revenue per region and publishes the totals to ``RegionTotals`` with the
   batch writer (one transaction). (The PySpark Python sink API supports append and
   complete output modes only, not update: a running streaming aggregate next to the
   per-order results would need a second query and a second source.)
5. Audits the journal with Spark SQL: orders in, results out, the totals, and what the
   queue did.
6. Stops the server.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ORDERS = 2000
REGIONS = {0: "north", 1: "south", 2: "east", 3: "west"}


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    """``conveyor serve`` on free ports (client and admin): the server and its URI."""
    log = workdir / "server.log"
    with open(log, "w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", "--port", "0", "--admin-port", "0"], cwd=workdir,
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    for line in server.stdout:  # type: ignore[union-attr]
        if line.startswith("conveyor listening on port"):
            return server, f"tcp://127.0.0.1:{int(line.rsplit(' ', 1)[1])}"
    server.wait(30)
    last = log.read_text().strip().splitlines()[-5:]
    raise SystemExit("the server did not start:\n" + "\n".join(last))


def publish_orders(uri: str) -> None:
    from conveyor import Client

    rng = random.Random(7)
    with Client("demo-order-entry").connect(uri) as client:
        for i in range(ORDERS):
            client.publish("Work", {"order": i, "customer": rng.randrange(100), "qty": rng.randint(1, 9),
                                    "price": round(rng.uniform(1, 50), 2)})
        client.flush()
    print(f"published {ORDERS} orders to Work")


ENRICH = """
    SELECT to_json(named_struct(
             'order', o.order, 'customer', o.customer,
             'region', element_at(map(0, 'north', 1, 'south', 2, 'east', 3, 'west'), o.customer % 4),
             'amount', round(o.qty * o.price, 2),
             'size', CASE WHEN o.qty * o.price >= 200 THEN 'large' ELSE 'small' END,
             'source', bookmark)) AS value,
           fence  -- the source's fencing token: a newer query on this consumer fences this one exactly
    FROM (SELECT from_json(data, 'order INT, customer INT, qty INT, price DOUBLE') AS o, bookmark, fence
          FROM {view})
"""


def start_enrichment(spark, *, uri: str, queue: str = "WorkToDo", consumer: str = "demo-enricher",
                     checkpoint: str, topic: str = "Results", max_records: int = 1000, partitions: int = 2):
    """The demo's streaming query (also timed by bench/bench_spark_cluster.py)."""
    orders = (
        spark.readStream.format("conveyor")
        .option("server", uri).option("queue", queue).option("consumer", consumer)
        .option("maxRecordsPerBatch", str(max_records)).option("numPartitions", str(partitions))
        .load()
    )
    view = f"orders_raw_{consumer.replace('-', '_')}"
    orders.createOrReplaceTempView(view)
    return (
        spark.sql(ENRICH.format(view=view)).writeStream.format("conveyor")
        .option("server", uri).option("topic", topic)  # mode txn: the default
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True).start()
    )


def run_pipeline(spark, uri: str, checkpoint: str) -> None:
    query = start_enrichment(spark, uri=uri, checkpoint=checkpoint)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the streaming query failed: {query.exception()}")
    batches = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]
    print(f"streaming query done: {sum(p['numInputRows'] for p in query.recentProgress)} orders in micro-batches {batches}")


def audit(spark, journal: Path, uri: str) -> None:
    try:
        # Over the network (the server option): executors on other machines need no copy of
        # the journal directory; .load(str(journal)) reads the same rows from the directory.
        journal_df = spark.read.format("conveyor-journal").option("server", uri).option("includeOpen", "true").load()
    except Exception as exc:  # the journal reader ships separately (conveyor.spark.journal_source)
        print(f"journal audit skipped: {exc}")
        return
    journal_df.createOrReplaceTempView("journal")
    spark.sql("""
        SELECT op, coalesce(topic, queue) AS target, count(*) AS records
        FROM journal GROUP BY op, coalesce(topic, queue) ORDER BY op, target
    """).show(truncate=False)
    totals = spark.sql("""
        SELECT r.region, count(*) AS orders, round(sum(r.amount), 2) AS revenue,
               sum(CASE WHEN r.size = 'large' THEN 1 ELSE 0 END) AS large_orders
        FROM (SELECT from_json(CAST(payload AS STRING), 'region STRING, amount DOUBLE, size STRING') AS r
              FROM journal WHERE op = 'publish' AND topic = 'Results')
        GROUP BY r.region
    """)
    totals.selectExpr("to_json(struct(*)) AS value").write.format("conveyor") \
        .option("server", uri).option("topic", "RegionTotals").mode("append").save()
    print("totals per region published to RegionTotals (one transaction); read back from the journal:")
    spark.read.format("conveyor-journal").option("server", uri).option("includeOpen", "true").load() \
        .where("op = 'publish' AND topic = 'RegionTotals'") \
        .selectExpr("CAST(payload AS STRING) AS total").show(truncate=False)
    check = spark.sql("""
        SELECT count(*) AS results, count(DISTINCT get_json_object(CAST(payload AS STRING), '$.order')) AS distinct_orders
        FROM journal WHERE op = 'publish' AND topic = 'Results'
    """).first()
    verdict = "exactly once" if check.results == check.distinct_orders == ORDERS else "NOT exactly once"
    print(f"Results: {check.results} messages for {check.distinct_orders} distinct orders of {ORDERS}: {verdict}")


def session(master: str, extra: dict[str, str]):
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master).appName("conveyor-demo")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if master.startswith("spark://"):  # executors on this machine: talk over loopback
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        builder = builder.config("spark.executor.cores", "1").config("spark.executor.memory", "512m")
    for key, value in extra.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", action="store_true", help="start a standalone cluster (master + 2 workers) and use it")
    p.add_argument("--master", default="local[2]", help="a Spark master URL (default local[2])")
    a = p.parse_args()
    started = time.monotonic()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers import conveyor
    workdir = Path(tempfile.mkdtemp(prefix="conveyor-demo-"))
    cluster = None
    server, uri = start_server(workdir)
    print(f"conveyor serving on {uri}")
    try:
        publish_orders(uri)
        import msgspec

        from conveyor.client.rpc import RpcClient
        from conveyor.spark import register

        master, extra = a.master, {}
        if a.cluster:
            from conveyor.spark.standalone import LocalCluster

            cluster = LocalCluster(workers=2, workdir=str(workdir / "cluster")).start()
            master, extra = cluster.url, cluster.session_conf()
        print(f"master {master}")
        spark = session(master, extra)
        spark.sparkContext.setLogLevel("ERROR")
        print("formats:", ", ".join(register(spark)))
        run_pipeline(spark, uri, str(workdir / "checkpoint"))
        with RpcClient(uri) as rpc:
            info = rpc.consumer_info("WorkToDo", "demo-enricher")
        print("consumer demo-enricher:", msgspec.json.encode(info).decode())
        audit(spark, workdir / "data", uri)
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        server.terminate()
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"demo finished in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
