"""The pipeline the Spark tests run: source -> a map -> sink (used in-process and by job.py)."""

from __future__ import annotations

# n from the payload, plus where it came from: a map-only transformation. The source's
# fence column goes along to the sink (exact fencing, conveyor.spark.fencing).
SELECT = (
    "to_json(named_struct('n', CAST(get_json_object(data, '$.n') AS INT), 'bm', bookmark, 'd', delivery)) AS value",
    "fence",
)


def start(spark, *, uri: str, consumer: str, checkpoint: str, topic: str = "out", mode: str = "txn",
          max_records: int = 50, partitions: int = 2, source_extra: dict | None = None,
          sink_extra: dict | None = None, trigger: dict | None = None):
    """Start the query; ``trigger`` defaults to AvailableNow."""
    df = (
        spark.readStream.format("conveyor")
        .option("server", uri).option("queue", "In").option("consumer", consumer)
        .option("maxRecordsPerBatch", str(max_records)).option("numPartitions", str(partitions))
        .options(**(source_extra or {}))
        .load()
    )
    writer = (
        df.selectExpr(*SELECT).writeStream.format("conveyor")
        .option("server", uri).option("topic", topic).option("mode", mode)
        .options(**(sink_extra or {}))
        .option("checkpointLocation", checkpoint)
    )
    return writer.trigger(**(trigger or {"availableNow": True})).start()
