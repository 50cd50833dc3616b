"""A journal for the ``conveyor-journal`` tests (test_journal_source.py,
test_journal_queries.py), written with the real Journal and engine records, and what
they read it with. Two files, so that the suite's two workers share them: each module
writes its own ``journal`` and sets ``pushdown`` on its worker's session (the fixtures
are module-scoped, so each module runs on one worker, as a group)."""

from __future__ import annotations

import os

import pytest

from conveyor import records as r
from conveyor.journal import Journal
from conveyor.journal.index import summarize_segment, write_summary
from conveyor.records.facts import describe_record
from conveyor.spark.journal_source import JournalDataSource

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
T0 = 1_700_000_000.0  # publish times are T0 + i seconds
PHASES = [("orders", 101, "Q1"), ("audit", 202, "Q2"), ("prices", 303, "Q3")]
PUBLISHES_PER_PHASE = 150


@pytest.fixture(scope="module", autouse=True)
def pushdown(spark):
    """The conftest session, with Python filter pushdown on (PySpark's default is off)."""
    spark.dataSource.register(JournalDataSource)
    before = spark.conf.get(PUSHDOWN)
    spark.conf.set(PUSHDOWN, "true")
    yield
    spark.conf.set(PUSHDOWN, before)


def write_journal(directory, segment_bytes: int = 4096) -> list[tuple[int, object]]:
    """Three phases, each with its own topic, publisher and queue, so that summaries can
    prune; every record type appears. Returns [(position, record)] in log order."""
    written = []

    def add(rec):
        written.append((j.append(r.encode(rec)), rec))
        return written[-1][0]

    j = Journal.open(directory, segment_bytes=segment_bytes, fsync=False)
    i = 0
    for phase, (topic, publisher, queue) in enumerate(PHASES):
        positions = []
        for n in range(PUBLISHES_PER_PHASE):
            positions.append(add(r.PublishRec(topic, publisher, n, T0 + i, b"m%05d" % i + bytes(30))))
            i += 1
            if n % 10 == 9:
                batch = positions[-10:]
                add(r.LeasedRec(queue, batch[:5], [1, 1, 2, 1, 3]))  # two redeliveries
                add(r.AckedRec(queue, batch[:4]))
                extra = (n // 10) % 8
                if extra == 0:
                    add(r.ReturnedRec(queue, batch[4:5]))
                elif extra == 1:
                    add(r.CancelledRec(queue, batch[5:6]))
                elif extra == 2:
                    add(r.ExpiredRec(queue, batch[6], "ttl,max-deliveries"))
                elif extra == 3:
                    add(r.DeliveredRec(queue, batch[7:9]))
                elif extra == 4:
                    add(r.BarrierRec(queue, batch[9:10]))
                elif extra == 5:
                    add(r.ConsumerClaimedRec(queue, f"spark{phase}", 3 + phase, "token", d=n if phase else -1,
                                             acked=n - 2 if phase else -1, positions=batch[3:5] if phase else []))
                elif extra == 6:
                    add(r.ConsumerLeasedRec(queue, f"spark{phase}", 1 + n, batch[5:8], [1, 2, 1], epoch=phase))
                else:
                    add(r.ConsumerAckedRec(queue, f"spark{phase}", 1 + n, batch[5:8], epoch=phase))
    # Publishes with the optional fields: a dead letter, a transaction, a fingerprint.
    add(r.PublishRec("dead", 404, 1, T0 + i, b"dl", "corr-1", expired_queue="Q3",
                     expired_position=written[-3][0], expired_reasons="ttl"))
    add(r.PublishRec("txn", 505, 7, T0 + i + 1, b"a", fingerprint=12345, txn_index=0, txn_total=2))
    add(r.PublishRec("txn", 505, 7, T0 + i + 1, b"b", fingerprint=678, txn_index=1, txn_total=2))
    add(r.ReceivedRec("east-1", "journal-7", 123456))  # replication progress
    # replicated queues: removals, a transfer request and a (proxied) grant
    add(r.QueueRemovedRec("Q1", [101, 101], [3, 4], "ack", origin="east-1"))
    add(r.TransferRequestRec("Q1", [101, 101], [5, 6], "west-1", [2, 1]))
    add(r.QueueCancelledRec("Q1", [101], [7], [1_700_000_060.5], ["db down"], origin="east-1", deliveries=[2],
                            cancels=[1]))
    add(r.TransferRec("Q1", [101], [5], "west-1", "east-2", [3], [1], [2], proxied=True))
    add(r.SowDeletedRec("orders", ["4611686018427387904"], [128]))  # records deleted from a SOW topic
    add(r.SowDeletedRec("orders", ["17"], [], publishers=[202], seqs=[9], origin="east-1"))  # ... by replication
    add(r.ConsumerReplicatedRec("Q1", "spark", "lease", 7, [101, 101], [5, 6], positions=[40, 48], origin="east-1",
                                epoch=2))
    add(r.ConsumerReplicatedRec("Q1", "spark", "claim", 3, token="t", origin="east-1", through=8))  # an older one
    add(r.ConsumerReplicatedRec("Q1", "spark", "claim", 4, [101, -1], [6, -1], token="t", positions=[48, -1],
                                origin="east-1", through=9, acked=7))  # with the claimer's unacknowledged deliveries
    for k in range(80):  # fill the rest so that the special records end up sealed
        add(r.PublishRec("tail", 606, k, T0 + i + 2 + k, bytes(40)))
    j.close()
    return written


def segment_files(directory) -> list[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".log"))


def sealed_records(directory, written):
    """The records in sealed segments (the default snapshot)."""
    open_base = int(os.path.basename(segment_files(directory)[-1])[:20])
    return [(p, rec) for p, rec in written if p < open_base]


@pytest.fixture(scope="module")
def journal(tmp_path_factory):
    directory = tmp_path_factory.mktemp("journal") / "j"
    written = write_journal(directory)
    return str(directory), written


def load(spark, directory, **options):
    """A new DataFrame, with ``pushdown=true`` unless told otherwise: these tests check
    the pushdown reader too, one query per DataFrame (docs/spark-journal.md, "Filters")."""
    options.setdefault("pushdown", "true")
    return spark.read.format("conveyor-journal").options(**options).load(directory)


def lsns(df) -> list[int]:
    return sorted(row.lsn for row in df.select("lsn").collect())


def segments_read(df) -> int:
    """Partitions of the scan: one per segment read (1 also when every segment was
    pruned: Spark plans a single empty partition then)."""
    return df.rdd.getNumPartitions()


def summarize_all(directory) -> None:
    for path in segment_files(directory)[:-1]:
        assert write_summary(path, summarize_segment(path, describe_record))
