"""A streaming job run as a subprocess by the crash and cluster tests: the driver the
tests SIGKILL.

Run in a new session (``start_new_session=True``): a ``kill`` fault (TEST HOOK,
conveyor.spark.faults) SIGKILLs this process group, i.e. this process and its JVM.
Prints ``DONE`` when an AvailableNow query finished; with ``--trigger-ms`` the query
runs until the test kills it.
"""

from __future__ import annotations

import argparse
import os
import sys


def session(master: str, conf: list[str]):
    """A SparkSession on ``master`` with ``conf`` (``key=value`` items), the formats registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from conveyor.spark import register

    builder = (
        SparkSession.builder.master(master).config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for item in conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--consumer", default="etl")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--mode", default="txn")
    p.add_argument("--max-records", type=int, default=50)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--lease-seconds", type=float, default=60.0)
    p.add_argument("--trigger-ms", type=int, default=0, help="processing-time trigger; 0: AvailableNow")
    p.add_argument("--faults", default="")
    p.add_argument("--fault-dir", default="")
    p.add_argument("--master", default="local[2,4]")
    p.add_argument("--conf", action="append", default=[], help="key=value, for the SparkSession")
    a = p.parse_args()
    assert os.getpgid(0) == os.getpid(), "run me with start_new_session=True (the kill hook kills my group)"
    from tests.spark import pipeline

    spark = session(a.master, a.conf)
    faults = {"testFaults": a.faults, "testFaultDir": a.fault_dir, "testKillPgid": str(os.getpgid(0))}
    query = pipeline.start(
        spark, uri=a.server, consumer=a.consumer, checkpoint=a.checkpoint, mode=a.mode,
        max_records=a.max_records, partitions=a.partitions,
        source_extra={**faults, "leaseSeconds": str(a.lease_seconds)}, sink_extra=faults,
        trigger={"processingTime": f"{a.trigger_ms} milliseconds"} if a.trigger_ms else None,
    )
    print("STARTED", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
