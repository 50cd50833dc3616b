"""The ``conveyor-journal`` batch source (conveyor.spark.journal_source) and the segment
summaries it prunes with (conveyor.journal.index), on journals written with the real
Journal and engine records, and one written by the real server."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time

import msgspec
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from conveyor import Client
from conveyor import records as r
from conveyor.records.facts import OPS, describe_record
from conveyor.errors import JournalError
from conveyor.journal import (
    FILE_HEADER_LEN,
    Journal,
    encode_frame,
    repair,
    scan_segment,
)
from conveyor.journal.index import (
    SealSummarizer,
    load_summary,
    summarize_segment,
    summary_path,
    write_summary,
)
from conveyor.spark.journal_source import (
    COLUMNS,
    SCHEMA,
    JournalDataSource,
    JournalSegment,
)
from tests.serverproc import ServerProcess, write_config

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
                    add(r.ConsumerClaimedRec(queue, f"spark{phase}", 3 + phase, "token", d=n if phase else -1))
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
    add(r.TransferRec("Q1", [101], [5], "west-1", "east-2", [3], [1], [2], proxied=True))
    add(r.SowDeletedRec("orders", ["4611686018427387904"], [128]))  # records deleted from a SOW topic
    add(r.SowDeletedRec("orders", ["17"], [], publishers=[202], seqs=[9], origin="east-1"))  # ... by replication
    add(r.ConsumerReplicatedRec("Q1", "spark", "lease", 7, [101, 101], [5, 6], positions=[40, 48], origin="east-1",
                                epoch=2))
    add(r.ConsumerReplicatedRec("Q1", "spark", "claim", 3, token="t", origin="east-1", through=8))
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


# --- decoding -----------------------------------------------------------------------


def test_every_record_type_has_an_op_name():
    assert set(OPS) == set(r.Record.__args__)
    assert len(set(OPS.values())) == len(OPS)


def test_every_op_is_decoded(spark, journal):
    directory, written = journal
    expected = sealed_records(directory, written)
    rows = {row.lsn: row for row in load(spark, directory).collect()}
    assert sorted(rows) == [p for p, _ in expected]
    assert {row.op for row in rows.values()} == set(OPS.values())
    seen = set()
    for position, rec in expected:
        row = rows[position]
        assert row.op == OPS[type(rec)]
        if type(rec) in seen and not (isinstance(rec, r.PublishRec) and rec.topic in ("dead", "txn")):
            continue
        seen.add(type(rec))
        if isinstance(rec, r.PublishRec):
            assert row.ts == dt.datetime.fromtimestamp(rec.timestamp)  # Spark shows local time
            assert (row.topic, row.publisher, row.seq, bytes(row.payload)) == (rec.topic, rec.publisher, rec.seq, rec.data)
            assert row.queue is None and row.positions is None
            assert row.correlation_id == rec.correlation_id
            assert row.fingerprint == (rec.fingerprint or None)
            assert (row.txn_index, row.txn_total) == ((rec.txn_index, rec.txn_total) if rec.txn_total else (None, None))
            assert row.expired_queue == rec.expired_queue
            assert row.reasons == (rec.expired_reasons or None)
            assert row.expired_position == (rec.expired_position if rec.expired_queue else None)
            continue
        if isinstance(rec, r.SowDeletedRec):
            assert (row.ts, row.queue, row.payload) == (None, None, None)
            assert (row.topic, row.positions) == (rec.topic, rec.positions)
            assert (row.publishers, row.seqs, row.consumer) == (
                (rec.publishers, rec.seqs, rec.origin) if rec.origin else (None, None, None))
            continue
        assert row.ts is None and row.topic is None and row.payload is None
        if isinstance(rec, r.ReceivedRec):
            assert (row.queue, row.consumer, row.delivery) == (None, rec.source, rec.through)
            continue
        assert row.queue == rec.queue
        if isinstance(rec, r.QueueRemovedRec):
            assert (row.publishers, row.seqs, row.reasons, row.consumer) == (rec.publishers, rec.seqs, rec.kind, rec.origin)
            assert row.positions is None
            continue
        if isinstance(rec, r.TransferRequestRec):
            assert (row.publishers, row.seqs, row.consumer, row.counts) == (rec.publishers, rec.seqs, rec.requester, rec.attempts)
            continue
        if isinstance(rec, r.ConsumerReplicatedRec):
            claim = rec.kind == "claim"
            assert (row.consumer, row.reasons) == (rec.consumer, rec.kind)
            assert (row.delivery, row.epoch) == ((rec.through, rec.n) if claim else (rec.n, rec.epoch or None))
            assert (row.publishers, row.seqs, row.positions) == (
                (None, None, None) if claim else (rec.publishers, rec.seqs, rec.positions))
            continue
        if isinstance(rec, r.TransferRec):
            assert (row.publishers, row.seqs, row.consumer, row.epochs) == (rec.publishers, rec.seqs, rec.owner, rec.epochs)
            assert (row.counts, row.cancels, row.reasons) == (rec.deliveries, rec.cancels, "proxied")
            continue
        if isinstance(rec, r.ExpiredRec):
            assert (row.positions, row.reasons) == ([rec.position], rec.reasons)
        elif isinstance(rec, r.ConsumerClaimedRec):
            assert (row.consumer, row.epoch, row.positions) == (rec.consumer, rec.epoch, None)
            assert row.delivery == (rec.d if rec.d >= 0 else None)
        else:
            assert row.positions == rec.positions
        if isinstance(rec, (r.LeasedRec, r.ConsumerLeasedRec)):
            assert row.counts == rec.counts
        if isinstance(rec, r.ConsumerLeasedRec):
            assert (row.consumer, row.delivery, row.epoch) == (rec.consumer, rec.first, rec.epoch or None)
        if isinstance(rec, r.ConsumerAckedRec):
            assert (row.consumer, row.delivery, row.epoch) == (rec.consumer, rec.through, rec.epoch or None)
    assert {"dead", "txn"} <= {row.topic for row in rows.values()}


def test_rows_output_matches_arrow_output(spark, journal):
    directory, _ = journal
    arrow = sorted(load(spark, directory).collect())
    rows = sorted(load(spark, directory, output="rows").collect())
    assert arrow == rows


# --- snapshot and partitions --------------------------------------------------------


def test_one_partition_per_sealed_segment_and_include_open(spark, journal):
    directory, written = journal
    files = segment_files(directory)
    assert len(files) >= 8
    assert segments_read(load(spark, directory)) == len(files) - 1
    with_open = load(spark, directory, includeOpen="true")
    assert segments_read(with_open) == len(files)
    assert lsns(with_open) == [p for p, _ in written]


def test_include_open_stops_quietly_at_a_torn_tail(spark, tmp_path):
    written = write_journal(tmp_path / "j")
    last = segment_files(tmp_path / "j")[-1]
    with open(last, "ab") as f:
        f.write(b"\x50\x00\x00\x00garbage")  # a record being written: length, part of it
    assert lsns(load(spark, str(tmp_path / "j"), includeOpen="true")) == [p for p, _ in written]


# --- pruning and filters ------------------------------------------------------------


def test_lsn_ranges_prune_by_segment_name(spark, journal):
    directory, written = journal
    bases = [int(os.path.basename(p)[:20]) for p in segment_files(directory)]
    lo, hi = bases[3] + 1, bases[5] - 1  # inside segments 3 and 4
    df = load(spark, directory).filter(f"lsn BETWEEN {lo} AND {hi}")
    assert segments_read(df) == 2
    assert lsns(df) == [p for p, _ in written if lo <= p <= hi]
    df = load(spark, directory).filter(f"lsn > {bases[-2]}")  # only in the last sealed one
    assert segments_read(df) == 1
    assert lsns(load(spark, directory, startLsn=str(bases[2]), endLsn=str(bases[4]), pushdown="false")) == [
        p for p, _ in written if bases[2] <= p < bases[4]
    ]


def test_summaries_prune_topic_queue_op_publisher_and_time(spark, tmp_path):
    directory = str(tmp_path / "j")
    written = write_journal(directory)
    summarize_all(directory)
    expected = sealed_records(directory, written)
    bases = [int(os.path.basename(p)[:20]) for p in segment_files(directory)]

    def segments_with(pred):
        # which sealed segments hold a record matching pred
        out = set()
        for p, rec in expected:
            if pred(rec):
                out.add(max(b for b in bases if b <= p))
        return len(out)

    cases = [
        ("topic = 'audit'", lambda rec: getattr(rec, "topic", None) == "audit"),
        ("queue = 'Q3'", lambda rec: getattr(rec, "queue", None) == "Q3"),
        ("publisher IN (101, 404)", lambda rec: getattr(rec, "publisher", None) in (101, 404)),
        ("op = 'consumer_claim'", lambda rec: isinstance(rec, r.ConsumerClaimedRec)),
        ("consumer = 'spark1'", lambda rec: getattr(rec, "consumer", None) == "spark1"),
        (f"ts >= timestamp_seconds({T0 + 310}) AND ts < timestamp_seconds({T0 + 320})",
         lambda rec: isinstance(rec, r.PublishRec) and T0 + 310 <= rec.timestamp < T0 + 320),
    ]
    total = len(bases) - 1
    for k, (where, pred) in enumerate(cases):
        df = load(spark, directory).filter(where)
        want = segments_with(pred)
        assert 0 < want < total, where
        assert segments_read(df) == want, where  # planning only: cheap
        if k in (0, 5):  # the rows (the filter matrix below checks the rest)
            assert lsns(df) == sorted(p for p, rec in expected if pred(rec)), where
    # a value no summary lists prunes every segment
    assert segments_read(load(spark, directory).filter("topic = 'nowhere'")) == 1


FILTERS = [
    "op = 'publish' AND topic = 'orders' AND lsn <= 3000",
    "queue IN ('Q1', 'Q3') AND op IN ('lease', 'expire', 'consumer_ack')",
    "(publisher = 202 OR queue = 'Q1') AND NOT (op = 'lease')",  # OR, NOT: Spark's
    "topic LIKE 'ord%' AND seq > 100",
    "ts > timestamp_seconds(1700000100) AND ts <= timestamp_seconds(1700000200.5)",
    "ts = timestamp_seconds(1700000042)",
    "lsn IN (0, 47) OR lsn < 100",
    "op = 'publish' AND queue = 'Q1'",  # no row has both
    "consumer IN ('spark0', 'spark2') AND delivery >= 50",
    "publisher = 505 AND txn_index = 1 OR size(positions) > 2 AND array_contains(counts, 3)",
]


@pytest.fixture(scope="module")
def unfiltered(spark, journal):
    """Every row, read once without pushdown, as an in-memory DataFrame."""
    directory, _ = journal
    return spark.createDataFrame(load(spark, directory, pushdown="false").collect(), SCHEMA)


@pytest.mark.parametrize("where", FILTERS)
def test_pushed_filters_give_the_same_rows_as_spark(spark, journal, unfiltered, where):
    directory, _ = journal
    pushed = sorted(load(spark, directory).filter(where).collect())
    assert pushed == sorted(unfiltered.filter(where).collect())


def test_unhandled_filters_stay_in_the_plan(spark, journal):
    directory, _ = journal
    df = load(spark, directory).filter("queue = 'Q1' AND op = 'lease' AND topic LIKE '%x%'")
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "Contains" in plan or "LIKE" in plan.upper()
    assert "Q1" not in plan.split("BatchScan")[0]  # queue = 'Q1' was taken by the reader


def test_pushdown_disabled(spark, journal):
    directory, written = journal
    spark.conf.set(PUSHDOWN, "false")
    try:
        with pytest.raises(Exception, match="DATA_SOURCE_PUSHDOWN_DISABLED"):
            load(spark, directory).filter("op = 'ack'").collect()
        plain = load(spark, directory, pushdown="false")
        assert plain.filter("op = 'ack'").count() == sum(
            isinstance(rec, r.AckedRec) for _, rec in sealed_records(directory, written)
        )
        # the options still prune and filter without pushFilters
        opt = load(spark, directory, pushdown="false", ops="ack,lease", queues="Q2")
        assert {(row.op, row.queue) for row in opt.collect()} == {("ack", "Q2"), ("lease", "Q2")}
    finally:
        spark.conf.set(PUSHDOWN, "true")


# --- summaries: written on demand, never trusted when stale -------------------------


def test_reader_writes_missing_summaries_and_they_match_the_server_ones(spark, tmp_path):
    directory = str(tmp_path / "j")
    write_journal(directory)
    files = segment_files(directory)
    assert not any(os.path.exists(summary_path(p)) for p in files)
    load(spark, directory).count()  # a full read writes them as a by-product
    for path in files[:-1]:
        assert load_summary(path) == summarize_segment(path, describe_record)
    assert not os.path.exists(summary_path(files[-1]))  # never for the open segment


def test_stale_summaries_are_ignored(spark, tmp_path):
    """A summary that does not match its segment any more is never used to prune:
    here every summary lies (no topics at all), and none may be believed."""
    directory = str(tmp_path / "j")
    written = write_journal(directory)
    summarize_all(directory)
    files = segment_files(directory)
    for k, path in enumerate(files[:-1]):
        s = load_summary(path)
        if k % 3 == 0:
            os.utime(path, ns=(s.mtime_ns + 1_000_000, s.mtime_ns + 1_000_000))  # touched
        elif k % 3 == 1:
            shutil.copy(summary_path(files[k - 1]), summary_path(path))  # someone else's
            continue
        else:
            # Same size and mtime, another (valid) last record: as if rewritten.
            position, payload = list(scan_segment(path))[-1]
            rec = r.decode(payload)
            other = r.encode(msgspec.structs.replace(rec, seq=rec.seq ^ 1) if isinstance(rec, r.PublishRec)
                             else msgspec.structs.replace(rec, queue=rec.queue[::-1]))
            assert len(other) == len(payload)
            with open(path, "r+b") as f:
                f.seek(FILE_HEADER_LEN + position - s.base)
                f.write(encode_frame(other))
            os.utime(path, ns=(s.mtime_ns, s.mtime_ns))
            assert os.stat(path).st_size == s.size
        lie = msgspec.structs.replace(s, topics=[], queues=[], publishers=[])
        with open(summary_path(path), "wb") as f:
            f.write(msgspec.json.encode(lie))
    assert all(load_summary(path) is None for path in files[:-1])
    df = load(spark, directory, writeSummaries="false").filter("topic = 'orders' OR topic = 'audit'")
    assert segments_read(df) == len(files) - 1
    orders = load(spark, directory, writeSummaries="false").filter("topic = 'orders'")
    assert segments_read(orders) == len(files) - 1
    assert lsns(orders) == [p for p, rec in sealed_records(directory, written) if getattr(rec, "topic", None) == "orders"]


def test_repair_and_a_new_segment_under_an_old_name(tmp_path):
    directory = str(tmp_path / "j")
    write_journal(directory)
    summarize_all(directory)
    files = segment_files(directory)
    victim = files[5]
    # damage segment 5: repair truncates it and removes everything after it
    s = load_summary(victim)
    with open(victim, "r+b") as f:
        f.seek(s.size - 3)
        f.write(b"\xff\xff\xff")
    repair(directory)
    assert load_summary(victim) is None  # truncated: size differs
    assert all(not os.path.exists(p) for p in files[6:])
    # the server appends again: new segments reuse the removed names with new content
    j = Journal.open(directory, segment_bytes=2048, fsync=False)
    j.on_seal = SealSummarizer(describe_record)
    for k in range(300):
        j.append(r.encode(r.PublishRec("new", 1, k, T0, bytes(40))))
        if k % 50 == 0:
            j.commit()
    j.close()
    new_files = segment_files(directory)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(os.path.exists(summary_path(p)) for p in new_files[5:-1]):
        time.sleep(0.05)
    for path in new_files[:-1]:
        s = load_summary(path)
        if path in files[:5]:
            assert s is not None and "new" not in s.topics
        elif path in new_files[5:]:
            assert s is not None and s == summarize_segment(path, describe_record), path
    # the old sidecars of removed segments whose names did not come back were removed
    assert all(os.path.exists(p) for p in (summary_path(q) for q in new_files[:-1]))
    stray = [n for n in os.listdir(directory) if n.endswith(".summary") and n[: -len(".summary")] not in os.listdir(directory)]
    assert stray == []


def test_a_segment_removed_or_shortened_after_planning_fails_the_read(tmp_path):
    directory = str(tmp_path / "j")
    write_journal(directory)
    reader = JournalDataSource(CaseInsensitiveDict(path=directory)).reader(None)
    parts = reader.partitions()
    assert all(isinstance(p, JournalSegment) for p in parts)
    os.unlink(parts[0].path)  # retention
    with pytest.raises(JournalError, match="removed after the query was planned"):
        list(reader.read(parts[0]))
    with open(parts[1].path, "r+b") as f:  # repair
        f.truncate(os.path.getsize(parts[1].path) - 10)
    with pytest.raises(JournalError, match="shorter"):
        list(reader.read(parts[1]))
    assert sum(b.num_rows for b in reader.read(parts[2])) > 0


def test_read_only_directory_still_reads(spark, tmp_path):
    directory = tmp_path / "j"
    written = write_journal(directory)
    os.chmod(directory, 0o555)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("running as root: the directory stays writable")
        assert lsns(load(spark, str(directory)).filter("op = 'publish'")) == [
            p for p, rec in sealed_records(str(directory), written) if isinstance(rec, r.PublishRec)
        ]
        assert not any(n.endswith(".summary") for n in os.listdir(directory))
    finally:
        os.chmod(directory, 0o755)


# --- SQL audits, and a journal written by the real server ---------------------------


def test_audit_queries(spark, journal):
    directory, written = journal
    load(spark, directory).createOrReplaceTempView("journal")
    per_queue = spark.sql("""
        SELECT queue,
               sum(CASE WHEN op = 'lease' THEN size(positions) ELSE 0 END) AS leased,
               sum(CASE WHEN op = 'ack' THEN size(positions) ELSE 0 END) AS acked,
               sum(CASE WHEN op = 'expire' THEN 1 ELSE 0 END) AS expired
        FROM journal WHERE queue IS NOT NULL GROUP BY queue ORDER BY queue
    """).collect()
    expected = sealed_records(directory, written)
    for row in per_queue:
        recs = [rec for _, rec in expected if getattr(rec, "queue", None) == row.queue]
        assert row.leased == sum(len(x.positions) for x in recs if isinstance(x, r.LeasedRec))
        assert row.acked == sum(len(x.positions) for x in recs if isinstance(x, r.AckedRec))
        assert row.expired == sum(isinstance(x, r.ExpiredRec) for x in recs)
    redeliveries = spark.sql("""
        SELECT count(*) AS n FROM journal LATERAL VIEW explode(counts) AS c
        WHERE op IN ('lease', 'consumer_lease') AND c > 1
    """).first().n
    assert redeliveries == sum(
        sum(c > 1 for c in rec.counts) for _, rec in expected if isinstance(rec, (r.LeasedRec, r.ConsumerLeasedRec))
    )
    per_publisher = dict(spark.sql(
        "SELECT publisher, count(*) FROM journal WHERE op = 'publish' GROUP BY publisher"
    ).collect())
    assert per_publisher[202] == PUBLISHES_PER_PHASE


def test_the_server_summarizes_segments_it_seals(spark, tmp_path):
    config = write_config(tmp_path, txlog_extra="<JournalSize>1M</JournalSize>")
    server = ServerProcess(config).start()
    try:
        with Client("pub-a").connect(server.uri) as client:
            for n in range(2500):
                client.publish("alpha" if n < 1200 else "beta", {"n": n, "pad": "x" * 900})
            client.flush()
        directory = str(tmp_path / "journal")
        files = segment_files(directory)
        assert len(files) >= 3
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(load_summary(p) for p in files[:-1]):
            time.sleep(0.1)
        for p in files[:-1]:
            saved, fresh = load_summary(p), summarize_segment(p, describe_record)
            assert saved == fresh, f"{p}: server's summary {saved!r} != recomputed {fresh!r}; {os.listdir(directory)}; stderr: {server.stderr_lines[-20:]}"
        df = load(spark, directory, writeSummaries="false", includeOpen="true")
        beta = df.filter("topic = 'beta'")
        assert segments_read(beta) < len(files), (segments_read(beta), files)
        assert beta.count() == 1300
        assert df.filter("op = 'publish'").count() == 2500
    finally:
        server.kill()


def test_schema_columns():
    assert COLUMNS[:4] == ("lsn", "ts", "op", "topic")
    assert {"queue", "publisher", "seq", "consumer", "delivery", "positions", "reasons", "payload"} <= set(COLUMNS)
