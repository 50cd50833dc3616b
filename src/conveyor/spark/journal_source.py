"""``spark.read.format("conveyor-journal").load(journal_directory)``: the journal as a table.

One row per journal record (docs/spark-journal.md has the schema and examples). Rules:

- **Snapshot.** ``partitions()`` lists the segment files once, at planning: one
  partition per SEALED segment (every segment but the newest). The newest segment,
  which a live server may still append to, is left out unless ``includeOpen=true``;
  then it is read up to its size at planning and a torn last record ends it quietly.
- **Pure reads.** ``read()`` depends only on its partition, so Spark may retry it. A
  segment that retention removed or ``journal repair`` shortened after planning fails
  the task: rows are never dropped silently. Damage in a sealed segment raises
  JournalCorrupt.
- **Pruning.** Segments are named by their first position, so ``lsn`` ranges prune by
  name. Everything else prunes through the segment summaries (conveyor.journal.index),
  which are used only when they match their segment; a segment without one is read
  and its summary written as a by-product (``writeSummaries``), so the next query
  prunes it.
- **Filters.** With ``pushdown=true`` the reader implements ``pushFilters``: ranges on
  ``lsn`` and ``ts``, and ``=``/``IN`` on ``topic``, ``queue``, ``op``, ``publisher``,
  ``consumer`` and ``lsn`` are applied here, exactly, and are not evaluated again by
  Spark; everything else is returned to Spark. It is not the default because PySpark
  4.3.0 keeps the reader a pushdown left on the DataFrame's relation and reuses it for
  a later query of the same DataFrame (or view) that has no filter to push: that query
  would read only the rows the earlier filters let through. The default reader has no
  ``pushFilters``: Spark applies every filter, and only the options (``startLsn``,
  ``endLsn``, ``ops``, ``topics``, ``queues``) prune, which is safe however often a
  DataFrame is reused. PySpark refuses a reader with ``pushFilters`` unless
  ``spark.sql.python.filterPushdown.enabled`` is true (``register`` sets it).
- **Over the network.** With ``server`` (a client URI) instead of a directory, the
  driver plans from the server's list of segments and the executors stream them from
  the server (conveyor.spark.journal_remote): same snapshot, pruning, filters and rows,
  with no journal directory anywhere but on the server.
- **Arrow.** ``read()`` yields ``pyarrow.RecordBatch``es (``output=rows`` yields
  tuples instead; slower, kept for the benchmark). There is no column pruning in the
  API, so every column is always produced.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from operator import attrgetter

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from conveyor import records as r
from conveyor.records.facts import OPS, describe_record
from conveyor.errors import JournalCorrupt, JournalError
from conveyor.journal.format import FILE_HEADER_LEN
from conveyor.journal.index import SummaryBuilder, load_summary, write_summary
from conveyor.journal.storage import parse_segment_name, segment_name
from conveyor.journal.tools import scan_segment
from conveyor.spark import journal_remote
from conveyor.spark import options as opt

SCHEMA = StructType(
    [
        StructField("lsn", LongType(), False),  # the record's position in the journal
        StructField("ts", TimestampType()),  # publish time (server clock); null for other ops
        StructField("op", StringType(), False),
        StructField("topic", StringType()),  # publish
        StructField("queue", StringType()),  # every op but publish
        StructField("publisher", LongType()),  # publish
        StructField("seq", LongType()),  # publish
        StructField("consumer", StringType()),  # consumer_*
        StructField("delivery", LongType()),  # consumer_lease: first delivery number; consumer_ack: through
        StructField("positions", ArrayType(LongType())),  # queue ops: the messages (publish lsns)
        StructField("counts", ArrayType(IntegerType())),  # lease, consumer_lease: delivery counts
        StructField("reasons", StringType()),  # expire; publish of a dead letter
        StructField("payload", BinaryType()),  # publish
        StructField("correlation_id", StringType()),
        StructField("fingerprint", LongType()),  # publish from a direct-mode sink
        StructField("txn_index", IntegerType()),  # publish inside a committed transaction
        StructField("txn_total", IntegerType()),
        StructField("expired_queue", StringType()),  # publish of a dead letter: where it expired
        StructField("expired_position", LongType()),
        StructField("epoch", LongType()),  # consumer_claim
        StructField("publishers", ArrayType(LongType())),  # queue_removed, transfer*: the messages' identities
        StructField("seqs", ArrayType(LongType())),
        StructField("epochs", ArrayType(LongType())),  # transfer
        StructField("cancels", ArrayType(IntegerType())),  # transfer
    ]
)
COLUMNS = tuple(SCHEMA.fieldNames())
# Exactly the Arrow schema PySpark checks every RecordBatch against.
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")

#: Rows per RecordBatch (Spark's own default arrow batch size is 10,000).
BATCH_ROWS = 8192

#: Columns whose ``=``/``IN`` filters are applied while reading (and prune by summary).
SET_COLUMNS = {"topic": str, "queue": str, "op": str, "publisher": int, "consumer": str, "lsn": int}
_SUMMARY_SETS = {"topic": "topics", "queue": "queues", "publisher": "publishers", "consumer": "consumers"}
_ROW_INDEX = {name: i for i, name in enumerate(COLUMNS)}
_TS = _ROW_INDEX["ts"]
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICRO = dt.timedelta(microseconds=1)


def _micros(seconds: float) -> int:
    """Publish time as Spark stores it. Summaries prune with the same function."""
    return round(seconds * 1_000_000)


def _literal_micros(value) -> int | None:
    # Spark hands timestamp literals over as UTC-aware datetimes; a naive one is
    # ambiguous, so that filter goes back to Spark.
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return (value - _EPOCH) // _MICRO
    return None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Constraints:
    """What a query lets through: inclusive ranges on lsn and ts (microseconds) and
    allowed-value sets. Built from options and pushed filters; picklable."""

    def __init__(self) -> None:
        self.lsn = [None, None]
        self.ts = [None, None]
        self.sets: dict[str, frozenset] = {}

    def narrow(self, column: str, lo: int | None = None, hi: int | None = None) -> None:
        rng = getattr(self, column)
        if lo is not None:
            rng[0] = lo if rng[0] is None else max(rng[0], lo)
        if hi is not None:
            rng[1] = hi if rng[1] is None else min(rng[1], hi)

    def allow(self, column: str, values) -> None:
        values = frozenset(values)
        self.sets[column] = values & self.sets[column] if column in self.sets else values
        if column == "lsn":
            self.narrow("lsn", min(values, default=0), max(values, default=-1))

    def push(self, f: Filter) -> bool:
        """Take ``f`` if it can be applied exactly; False leaves it to Spark."""
        path = getattr(f, "attribute", ())  # Not has none
        if len(path) != 1:
            return False
        column = path[0]
        if isinstance(f, (EqualTo, EqualNullSafe, In)):
            values = f.value if isinstance(f, In) else (f.value,)
            if column == "ts":
                micros = [_literal_micros(v) for v in values]
                if isinstance(f, In) or None in micros:
                    return False
                self.narrow("ts", micros[0], micros[0])
                return True
            kind = SET_COLUMNS.get(column)
            if kind is None or not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
                return False
            self.allow(column, values)
            return True
        if isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)) and column in ("lsn", "ts"):
            v = _int(f.value) if column == "lsn" else _literal_micros(f.value)
            if v is None:
                return False
            if isinstance(f, GreaterThan):
                self.narrow(column, lo=v + 1)
            elif isinstance(f, GreaterThanOrEqual):
                self.narrow(column, lo=v)
            elif isinstance(f, LessThan):
                self.narrow(column, hi=v - 1)
            else:
                self.narrow(column, hi=v)
            return True
        return False

    def keeps_segment(self, base: int, end: int, summary) -> bool:
        """False when no record of the segment ``[base, end)`` can match."""
        lo, hi = self.lsn
        if (hi is not None and hi < base) or (lo is not None and lo >= end):
            return False
        if summary is None:
            return True
        if summary.records == 0:
            return False
        lo, hi = self.ts
        if lo is not None or hi is not None:
            if summary.ts_min is None:
                return False  # no publish, so no row has a ts
            if (hi is not None and _micros(summary.ts_min) > hi) or (lo is not None and _micros(summary.ts_max) < lo):
                return False
        for column, allowed in self.sets.items():
            if column == "op":
                present = summary.ops.keys()
            elif column in _SUMMARY_SETS:
                present = getattr(summary, _SUMMARY_SETS[column])
                if present is None:
                    continue  # too many to list: unknown
            else:
                continue
            if allowed.isdisjoint(present):
                return False
        return True

    def row_filter(self):
        """A predicate on a row tuple, or None if every row passes."""
        checks = []
        lo, hi = self.ts
        if lo is not None or hi is not None:
            t = _ROW_INDEX["ts"]
            lo = -(1 << 63) if lo is None else lo
            hi = (1 << 63) if hi is None else hi
            checks.append(lambda row: row[t] is not None and lo <= _micros(row[t]) <= hi)
        for column, allowed in self.sets.items():
            checks.append(lambda row, i=_ROW_INDEX[column], allowed=allowed: row[i] in allowed)
        if not checks:
            return None
        return lambda row: all(check(row) for check in checks)


class JournalSegment(journal_remote.PlannedSegment):
    """One segment file, as planned: read ``[base, end)`` from ``path``."""

    def __init__(self, path: str, base: int, end: int, sealed: bool, summarize: bool) -> None:
        super().__init__(base, end, sealed)
        self.path = path
        self.summarize = summarize  # no valid summary at planning: write one while reading


def _when(test: Callable, get: Callable) -> Callable:
    """A cell that is null unless ``test(value)``: records use 0 or -1 for "none"."""
    return lambda rec: value if test(value := get(rec)) else None


_positive = bool  # a non-zero count or fingerprint, a non-empty string
_not_negative = (0).__le__

#: The cells of each record type's row, by column; every other column is null. Adding a
#: column means adding it to SCHEMA and here: rows are built from this table, by name.
_QUEUE_OP: dict[str, Callable] = {"queue": attrgetter("queue"), "positions": attrgetter("positions")}
CELLS: dict[type, dict[str, Callable]] = {
    r.PublishRec: {
        "ts": attrgetter("timestamp"),
        "topic": attrgetter("topic"),
        "publisher": attrgetter("publisher"),
        "seq": attrgetter("seq"),
        "reasons": _when(_positive, attrgetter("expired_reasons")),
        "payload": attrgetter("data"),
        "correlation_id": attrgetter("correlation_id"),
        "fingerprint": _when(_positive, attrgetter("fingerprint")),
        "txn_index": _when(_not_negative, attrgetter("txn_index")),
        "txn_total": _when(_positive, attrgetter("txn_total")),
        "expired_queue": attrgetter("expired_queue"),
        "expired_position": _when(_not_negative, attrgetter("expired_position")),
    },
    r.LeasedRec: {**_QUEUE_OP, "counts": attrgetter("counts")},
    r.ExpiredRec: {"queue": attrgetter("queue"), "positions": lambda rec: [rec.position], "reasons": attrgetter("reasons")},
    r.ConsumerLeasedRec: {**_QUEUE_OP, "consumer": attrgetter("consumer"), "delivery": attrgetter("first"),
                          "counts": attrgetter("counts"), "epoch": _when(_positive, attrgetter("epoch"))},
    r.ConsumerAckedRec: {**_QUEUE_OP, "consumer": attrgetter("consumer"), "delivery": attrgetter("through"),
                         "epoch": _when(_positive, attrgetter("epoch"))},
    # a claim: its epoch, the deliveries its claimer knew (null in older journals) and, on
    # a replicated queue, the messages of its unacknowledged ones
    r.ConsumerClaimedRec: {"queue": attrgetter("queue"), "consumer": attrgetter("consumer"), "epoch": attrgetter("epoch"),
                           "delivery": _when(_not_negative, attrgetter("d")),
                           "positions": _when(bool, attrgetter("positions"))},
    # replication progress: the source instance, and its position below which everything
    # needed is recorded here
    r.ReceivedRec: {"consumer": attrgetter("source"), "delivery": attrgetter("through")},
    # replicated queues: messages are named by (publisher, seq), the same on every instance
    r.QueueRemovedRec: {"queue": attrgetter("queue"), "publishers": attrgetter("publishers"),
                        "seqs": attrgetter("seqs"), "reasons": attrgetter("kind"),
                        "consumer": _when(_positive, attrgetter("origin"))},
    r.QueueCancelledRec: {"queue": attrgetter("queue"), "publishers": attrgetter("publishers"),
                          "seqs": attrgetter("seqs"), "consumer": _when(_positive, attrgetter("origin")),
                          "counts": _when(bool, attrgetter("deliveries")), "cancels": _when(bool, attrgetter("cancels"))},
    r.TransferRequestRec: {"queue": attrgetter("queue"), "publishers": attrgetter("publishers"),
                           "seqs": attrgetter("seqs"), "consumer": attrgetter("requester"),
                           "counts": attrgetter("attempts")},
    r.TransferRec: {"queue": attrgetter("queue"), "publishers": attrgetter("publishers"), "seqs": attrgetter("seqs"),
                    "consumer": attrgetter("owner"), "epochs": attrgetter("epochs"),
                    "counts": attrgetter("deliveries"), "cancels": attrgetter("cancels"),
                    "reasons": lambda rec: "proxied" if rec.proxied else None},
    # a sow_delete: the SOW topic and the positions of the records it removed; one that
    # arrived by replication names them by identity (publishers/seqs) instead
    r.SowDeletedRec: {"topic": attrgetter("topic"), "positions": attrgetter("positions"),
                      "publishers": _when(bool, attrgetter("publishers")), "seqs": _when(bool, attrgetter("seqs")),
                      "consumer": _when(_positive, attrgetter("origin"))},
    # a named consumer's record of a replicated queue from another instance: its kind
    # (lease, ack, claim), delivery number or epoch, and the messages by identity and here
    r.ConsumerReplicatedRec: {"queue": attrgetter("queue"), "consumer": attrgetter("consumer"),
                              "delivery": lambda rec: rec.through if rec.kind == "claim" and rec.through >= 0 else (
                                  None if rec.kind == "claim" else rec.n),
                              "epoch": lambda rec: rec.n if rec.kind == "claim" else (rec.epoch or None),
                              "reasons": attrgetter("kind"),
                              "publishers": _when(bool, attrgetter("publishers")), "seqs": _when(bool, attrgetter("seqs")),
                              "positions": _when(bool, attrgetter("positions"))},
}


def _row_maker(op: str, cells: dict[str, Callable]) -> Callable[[int, object], tuple]:
    """A function (position, record) -> row, built from the record type's cells in
    COLUMNS order. It is compiled to one tuple expression: the reader builds a row per
    record, and a loop over the columns costs it about twice as much."""
    unknown = set(cells) - set(COLUMNS)
    if unknown:
        raise AssertionError(f"journal reader cells for columns not in SCHEMA: {sorted(unknown)}")
    names = {f"cell_{column}": get for column, get in cells.items()}
    parts = []
    for column in COLUMNS:
        if column == "lsn":
            parts.append("position")
        elif column == "op":
            parts.append(repr(op))
        elif column in cells:
            parts.append(f"cell_{column}(rec)")
        else:
            parts.append("None")
    return eval(f"lambda position, rec: ({', '.join(parts)},)", names)  # noqa: S307 - built from constants


_ROWS: dict[type, Callable[[int, object], tuple]] = {t: _row_maker(op, CELLS.get(t, _QUEUE_OP)) for t, op in OPS.items()}


def _row(position: int, rec) -> tuple:
    """The row of one decoded record, with ts in epoch seconds (converted per batch)."""
    return _ROWS[type(rec)](position, rec)


def _arrow_batch(rows: list[tuple]) -> pa.RecordBatch:
    n = len(rows)
    arrays = []
    for i, (col, field) in enumerate(zip(zip(*rows), ARROW_SCHEMA)):
        if col.count(None) == n:
            # Most columns are null for most ops, and pa.array() of an all-None string
            # column is thousands of times slower than pa.nulls().
            arrays.append(pa.nulls(n, field.type))
        elif i == _TS:  # seconds -> microseconds, rounded as _micros() does
            us = pc.round(pc.multiply(pa.array(col, pa.float64()), 1e6), round_mode="half_to_even")
            arrays.append(us.cast(pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(col, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _spark_row(row: tuple) -> tuple:
    ts = row[_TS]
    if ts is None:
        return row
    return (row[0], _EPOCH + dt.timedelta(microseconds=_micros(ts)), *row[2:])


class JournalReader(DataSourceReader):
    """The default reader (``pushdown=false``): options prune, Spark applies every filter."""

    def __init__(self, options) -> None:
        path = opt.text(options, "path")
        self.server = opt.text(options, "server")
        if not path and not self.server:
            raise JournalError('conveyor-journal needs a journal directory, .load("/path/to/journal"), or a '
                               'server to read it from, .option("server", "tcp://host:port")')
        if path and self.server:
            raise JournalError("conveyor-journal reads a directory or a server, not both: drop the path or the "
                               "server option")
        self.directory = path
        self.connect = opt.ConnectOptions.parse(options)
        self.retry_s = opt.seconds(options, "retryTimeout", 60.0)
        self.include_open = opt.flag(options, "includeOpen", False)
        self.write_summaries = opt.flag(options, "writeSummaries", True)
        self.arrow = opt.choice(options, "output", ("arrow", "rows"), "arrow") == "arrow"
        self.constraints = Constraints()
        c = self.constraints
        start, end = opt.integer(options, "startLsn", -1), opt.integer(options, "endLsn", -1)  # -1: not given
        if start >= 0:
            c.narrow("lsn", lo=start)
        if end >= 0:
            c.narrow("lsn", hi=end - 1)  # exclusive, like scan(start, end)
        for option, column in (("ops", "op"), ("topics", "topic"), ("queues", "queue")):
            values = opt.text(options, option)
            if values:
                c.allow(column, [v.strip() for v in values.split(",")])

    def partitions(self) -> list[JournalSegment] | list[journal_remote.RemoteSegment]:
        if self.server:
            return journal_remote.plan(self.server, self.connect, self.include_open, self.constraints.keeps_segment,
                                       self.retry_s)
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            raise JournalError(f"cannot list journal directory {self.directory}: {exc.strerror}") from exc
        bases = sorted(b for b in map(parse_segment_name, names) if b is not None)
        out = []
        for i, base in enumerate(bases):
            path = os.path.join(self.directory, segment_name(base))
            sealed = i + 1 < len(bases)
            if sealed:
                end = bases[i + 1]
                summary = load_summary(path)
            elif self.include_open:
                end = base + os.stat(path).st_size - FILE_HEADER_LEN  # the snapshot of the open segment
                summary = None
            else:
                break
            if self.constraints.keeps_segment(base, end, summary):
                out.append(JournalSegment(path, base, end, sealed, sealed and summary is None and self.write_summaries))
        return out

    def read(self, partition: JournalSegment | journal_remote.RemoteSegment) -> Iterator:
        if isinstance(partition, journal_remote.RemoteSegment):
            yield from self._rows(partition, journal_remote.frames(partition, self.connect, self.retry_s), None)
            return
        if not isinstance(partition, JournalSegment):
            return  # everything pruned: Spark plans one empty InputPartition(None)
        lo, hi = self.constraints.lsn
        # Summarize only a whole sealed segment, as the file was when reading began.
        builder = SummaryBuilder(describe_record) if partition.summarize and lo is None and hi is None else None
        try:
            before = os.stat(partition.path)
        except FileNotFoundError:
            raise JournalError(
                f"journal segment {partition.path} was removed after the query was planned (retention or repair)"
            ) from None
        if before.st_size < FILE_HEADER_LEN + partition.end - partition.base:
            raise JournalError(f"journal segment {partition.path} is shorter than when the query was planned (repair?)")
        yield from self._rows(partition, scan_segment(partition.path, end=partition.end), builder)
        if builder is not None:
            after = os.stat(partition.path)
            if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
                write_summary(partition.path, builder.finish(partition.base, before.st_size, before.st_mtime_ns))

    def _rows(self, partition: journal_remote.PlannedSegment, frames: Iterator[tuple[int, bytes]],
              builder: SummaryBuilder | None) -> Iterator:
        """The rows (or Arrow batches) of ``frames``, one segment's records in order."""
        lo, hi = self.constraints.lsn
        lo = -1 if lo is None else lo
        hi = 1 << 63 if hi is None else hi
        keep = self.constraints.row_filter()
        decode = r.decode
        rows: list[tuple] = []
        try:
            for position, payload in frames:
                if builder is not None:
                    builder.add(position, payload)
                if position < lo:
                    continue  # a position is proven only by walking the frames before it
                if position > hi:
                    break  # positions only grow
                row = _row(position, decode(payload))
                if keep is None or keep(row):
                    rows.append(row)
                    if len(rows) >= BATCH_ROWS:
                        yield from self._emit(rows)
                        rows = []
        except JournalCorrupt:
            if partition.sealed:
                raise
            # The open segment: a torn last record is a write in progress (or a crash
            # recovery will truncate); what came before it is the snapshot.
        if rows:
            yield from self._emit(rows)

    def _emit(self, rows: list[tuple]) -> Iterator:
        if self.arrow:
            yield _arrow_batch(rows)
        else:
            yield from map(_spark_row, rows)


class PushdownJournalReader(JournalReader):
    """``pushdown=true``: also takes the filters it can apply exactly (one query per
    DataFrame: see the module header)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self.constraints.push(f):
                yield f


class JournalDataSource(DataSource):
    """``spark.read.format("conveyor-journal").load(directory)``; see the module header."""

    @classmethod
    def name(cls) -> str:
        return "conveyor-journal"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> JournalReader:
        if opt.flag(self.options, "pushdown", False):  # not the default: see the module header
            return PushdownJournalReader(self.options)
        return JournalReader(self.options)

