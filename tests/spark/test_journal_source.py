"""The ``conveyor-journal`` batch source (conveyor.spark.journal_source) and the segment
summaries it prunes with (conveyor.journal.index), on journals written with the real
Journal and engine records (tests/spark/journal_data.py): decoding, partitions, pruning,
summaries. Pushed-down filters, SQL audits and a journal written by the real server are
in test_journal_queries.py."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time

import msgspec
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from conveyor import records as r
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
)
from conveyor.records.facts import OPS, describe_record
from conveyor.spark.journal_source import COLUMNS, JournalDataSource, JournalSegment
from tests.spark.journal_data import (  # noqa: F401 (journal, pushdown: fixtures)
    T0,
    journal,
    load,
    lsns,
    pushdown,
    sealed_records,
    segment_files,
    segments_read,
    summarize_all,
    write_journal,
)


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
        if isinstance(rec, r.QueueCancelledRec):
            assert (row.publishers, row.seqs, row.consumer) == (rec.publishers, rec.seqs, rec.origin)
            assert (row.counts, row.cancels, row.positions) == (rec.deliveries, rec.cancels, None)
            continue
        if isinstance(rec, r.TransferRequestRec):
            assert (row.publishers, row.seqs, row.consumer, row.counts) == (rec.publishers, rec.seqs, rec.requester, rec.attempts)
            continue
        if isinstance(rec, r.ConsumerReplicatedRec):
            claim = rec.kind == "claim"
            assert (row.consumer, row.reasons) == (rec.consumer, rec.kind)
            assert (row.delivery, row.epoch) == ((rec.through, rec.n) if claim else (rec.n, rec.epoch or None))
            assert (row.publishers, row.seqs, row.positions) == (
                (rec.publishers or None, rec.seqs or None, rec.positions or None) if claim
                else (rec.publishers, rec.seqs, rec.positions))
            continue
        if isinstance(rec, r.TransferRec):
            assert (row.publishers, row.seqs, row.consumer, row.epochs) == (rec.publishers, rec.seqs, rec.owner, rec.epochs)
            assert (row.counts, row.cancels, row.reasons) == (rec.deliveries, rec.cancels, "proxied")
            continue
        if isinstance(rec, r.ExpiredRec):
            assert (row.positions, row.reasons) == ([rec.position], rec.reasons)
        elif isinstance(rec, r.ConsumerClaimedRec):
            assert (row.consumer, row.epoch, row.positions) == (rec.consumer, rec.epoch, rec.positions or None)
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


# --- pruning ----------------------------------------------------------------------


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


def test_schema_columns():
    assert COLUMNS[:4] == ("lsn", "ts", "op", "topic")
    assert {"queue", "publisher", "seq", "consumer", "delivery", "positions", "reasons", "payload"} <= set(COLUMNS)
