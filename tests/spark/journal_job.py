"""A driver run by test_cluster_journal.py on the standalone cluster: it reads the
server's journal with ``conveyor-journal`` over the network (``server``: the executors
get no path) and from its directory, and prints a digest of each read.

Prints ``READ_START <epoch s>`` before the network read and ``READ_END <epoch s>`` after
it (the test restarts the server in between), then one ``DIGEST <mode> <json>`` line per
read: rows, sum of positions, an XOR of a hash of every column of every row, and rows per
op. Equal digests mean the same rows (a duplicated row would change the count).
"""

from __future__ import annotations

import argparse
import json
import time

from pyspark.sql import functions as f

from tests.spark.job import session

DIGEST = ("count(*) AS rows", "sum(CAST(lsn AS DECIMAL(38, 0))) AS lsns",
          "bit_xor(xxhash64(lsn, ts, op, topic, queue, publisher, seq, consumer, delivery, positions, counts, reasons, "
          "payload, correlation_id, fingerprint, txn_index, txn_total, expired_queue, expired_position, epoch, "
          "publishers, seqs, epochs, cancels)) AS hash")


def digest(df) -> dict:
    """One query (one planning, one read of every partition)."""
    per_op = df.groupBy("op").agg(*(f.expr(e) for e in DIGEST)).collect()
    hashed = 0
    for row in per_op:
        hashed ^= row.hash
    return {"rows": sum(row.rows for row in per_op), "lsns": str(sum(row.lsns for row in per_op)), "hash": hashed,
            "ops": {row.op: row.rows for row in per_op}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--journal", required=True, help="the directory, for the local read to compare with")
    p.add_argument("--master", required=True)
    p.add_argument("--conf", action="append", default=[], help="key=value, for the SparkSession")
    a = p.parse_args()
    spark = session(a.master, a.conf)
    net = spark.read.format("conveyor-journal").option("server", a.server).option("retryTimeout", "120").load()
    print("READ_START", time.time(), flush=True)
    network = digest(net)
    print("READ_END", time.time(), flush=True)
    network["partitions"] = net.rdd.getNumPartitions()
    local_df = spark.read.format("conveyor-journal").load(a.journal)
    local = digest(local_df)
    local["partitions"] = local_df.rdd.getNumPartitions()
    print("DIGEST network", json.dumps(network, sort_keys=True), flush=True)
    print("DIGEST local", json.dumps(local, sort_keys=True), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
