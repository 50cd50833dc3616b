"""PySpark connectors for conveyor (``pip install conveyor[spark]``; docs/spark.md).

``register(spark)`` makes the formats available to a SparkSession:

* ``conveyor``: a queue as a streaming source, topics as a streaming sink and as a
  batch write target (:mod:`conveyor.spark.source`, :mod:`conveyor.spark.sink`).
* ``conveyor-journal``: the transaction log as a batch source
  (:mod:`conveyor.spark.journal_source`).

Importing this package does not import pyspark; ``register`` does.
"""

from __future__ import annotations

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark, *, filter_pushdown: bool = True) -> list[str]:
    """Register the data sources with ``spark``; returns the format names registered.

    ``filter_pushdown`` turns on ``spark.sql.python.filterPushdown.enabled`` (off by
    default in PySpark 4.x), which the journal reader's opt-in ``pushdown=true`` needs: a
    Python reader that implements ``pushFilters`` fails planning while it is off. Pass
    False to leave the session's setting alone (the default journal reader works either
    way; docs/spark-journal.md says why pushdown is not its default).
    """
    from conveyor.spark.datasource import ConveyorDataSource
    from conveyor.spark.journal_source import JournalDataSource

    if filter_pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(ConveyorDataSource)
    spark.dataSource.register(JournalDataSource)
    return [ConveyorDataSource.name(), JournalDataSource.name()]
