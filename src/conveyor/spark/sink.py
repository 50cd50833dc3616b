"""Sink: Spark rows published to conveyor topics, exactly once (docs/spark.md, "Sink").

Each row is one message: its payload is the ``value`` column (or ``data``, or the
column named by ``valueColumn``; string columns are sent as UTF-8, binary as is), its
topic the ``topic`` option or else a string ``topic`` column. Two modes:

* ``txn`` (default): every task *stages* its rows on the server under a handle naming
  query, batch and partition, plus a random part (a killed driver's task attempt ids
  come back in the next run: reusing its handle would add rows to its staging); the driver's ``commit(messages, batchId)``
  publishes the staged sets of the attempts Spark chose atomically, as ONE duplicate-
  detection unit ``(publisher="{sinkName}/{queryId}", seq=batchId+1)``. A batch
  replayed after a crash answers "duplicate" and its new staging is discarded. Needs no
  determinism. Rows become visible one micro-batch commit later. When the rows carry
  the source's ``fence`` column (:mod:`conveyor.spark.fencing`), the commit also
  carries the named consumers they derive from: the server refuses it with ``fenced``
  if a newer query claimed one of them, and acknowledges their deliveries with the
  output in one step, so fencing is exact.
* ``direct``: every task publishes at once as publisher
  ``"{sinkName}/{queryId}/p{partitionId}"`` with ``seq = batchId << 32 | (i+1)`` and a
  payload fingerprint. Exactly once only if a replayed (batch, partition) holds the same
  rows in the same order (map-only pipelines over our source); ``ordering=canonical``
  sorts each partition by payload to drop the order condition. A different payload
  under an already used (publisher, seq) fails the task (``duplicate_conflict``)
  instead of being lost silently.

Sequence numbers start at 1 (``+1`` above): the server drops ``seq <= highest``, and
a new publisher's highest is 0. The query id is part of every publisher, so a new
checkpoint (batch ids from 0 again) is a new publisher: duplicates possible, no loss.
``write()`` gets no batch id from PySpark; it reads the task's local properties
``streaming.sql.batchId`` and ``sql.streaming.queryId`` (internal names, pinned by the
tests), and ``commit()`` learns the query id and the fences from the commit messages.

Batch writes (``df.write.format("conveyor")``) use the same modes with a publisher
unique to the write job (``{sinkName}/batch/{uuid}``): a retried task is deduplicated,
a rerun job publishes again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from conveyor import errors
from conveyor.spark import fencing
from conveyor.spark import options as opt
from conveyor.spark.faults import fault

log = logging.getLogger("conveyor.spark")

BATCH_ID_KEY = "streaming.sql.batchId"
QUERY_ID_KEY = "sql.streaming.queryId"


@dataclass(frozen=True)
class SinkOptions:
    server: str  # one URI, or several comma separated (failover between instances)
    topic: str | None
    mode: str  # "txn" | "direct"
    sink_name: str
    value_column: str
    topic_column: str | None
    ordering: str  # "none" | "canonical" (direct mode)
    chunk_rows: int  # rows per stage/publish round trip
    timeout: float
    raw: dict
    fence_column: str | None = None  # the source's fencing tokens, when the rows carry them
    connect: opt.ConnectOptions = opt.ConnectOptions()  # credentials and TLS

    @classmethod
    def parse(cls, options, schema: StructType) -> SinkOptions:
        topic = opt.text(options, "topic")
        names = {f.name.lower(): f for f in schema.fields}
        value = opt.text(options, "valueColumn")
        if value is None:
            value = next((n for n in ("value", "data") if n in names), None)
            if value is None and len(schema.fields) == 1:
                value = schema.fields[0].name
        if value is None or value.lower() not in names:
            raise opt.OptionError(
                f"no payload column: name it 'value' (or 'data'), or set option valueColumn; columns: "
                f"{', '.join(f.name for f in schema.fields)}"
            )
        column = names[value.lower()]
        if not isinstance(column.dataType, (StringType, BinaryType)):
            raise opt.OptionError(
                f"payload column {column.name!r} is {column.dataType.simpleString()}: it must be string or binary "
                f"(e.g. to_json(struct(...)) AS value)"
            )
        topic_column = None
        if topic is None:
            field_ = names.get("topic")
            if field_ is None or not isinstance(field_.dataType, StringType):
                raise opt.OptionError("set option 'topic', or give the rows a string column 'topic'")
            topic_column = field_.name
        return cls(
            server=opt.required(options, "server", "e.g. tcp://127.0.0.1:9007"),
            topic=topic,
            mode=opt.choice(options, "mode", ("txn", "direct"), "txn"),
            sink_name=opt.text(options, "sinkName", "spark") or "spark",
            value_column=column.name,
            topic_column=topic_column,
            ordering=opt.choice(options, "ordering", ("none", "canonical"), "none"),
            chunk_rows=opt.integer(options, "chunkRows", 10000, minimum=1),
            timeout=opt.seconds(options, "timeout", 60.0),
            raw={k.lower(): v for k, v in options.items() if k.lower().startswith("test")},
            connect=opt.ConnectOptions.parse(options),
            fence_column=_fence_column(names),
        )


def _fence_column(names: dict) -> str | None:
    column = names.get(fencing.FENCE_COLUMN)
    return column.name if column is not None and isinstance(column.dataType, StringType) else None


@dataclass
class TxnMessage(WriterCommitMessage):
    query_id: str | None
    txns: list[str] = field(default_factory=list)
    rows: int = 0
    fences: list[str] = field(default_factory=list)  # distinct fencing tokens of the rows


@dataclass
class DirectMessage(WriterCommitMessage):
    query_id: str | None
    accepted: int = 0
    duplicates: int = 0


# --- rows out of Arrow batches ------------------------------------------------------------


def _payloads(batch: pa.RecordBatch, o: SinkOptions) -> list[bytes]:
    column = batch.column(o.value_column)
    if column.null_count:
        raise ValueError(f"payload column {o.value_column!r} holds nulls: every row needs a payload")
    if not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())  # UTF-8 bytes, no copy
    return column.to_pylist()


def _runs(batch: pa.RecordBatch, o: SinkOptions) -> Iterator[tuple[str, list[bytes]]]:
    """(topic, payloads) runs of consecutive rows with the same topic, in row order."""
    rows = _payloads(batch, o)
    if o.topic_column is None:
        yield o.topic, rows  # type: ignore[misc]
        return
    topics = batch.column(o.topic_column).to_pylist()
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or topics[i] != topics[start]:
            if topics[start] is None:
                raise ValueError("the 'topic' column holds nulls: every row needs a topic")
            yield topics[start], rows[start:i]
            start = i


def _canonical(batches: Iterator[pa.RecordBatch], o: SinkOptions) -> Iterator[pa.RecordBatch]:
    """The partition sorted by (payload, topic): the same rows give the same numbering."""
    import pyarrow.compute as pc  # in the tasks only: the driver's runners never need it

    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return iter(())
    keys = [("__payload", "ascending")]
    table = table.append_column("__payload", pc.cast(table.column(o.value_column), pa.binary()))
    if o.topic_column is not None:
        keys.append((o.topic_column, "ascending"))
    return iter(table.sort_by(keys).drop_columns(["__payload"]).to_batches())


# --- the two modes, per task ---------------------------------------------------------------


def stage_partition(o: SinkOptions, batches: Iterator[pa.RecordBatch], base: str) -> tuple[list[str], int, list[str]]:
    """Stage every row under ``base/t<i>`` (one handle per topic); returns (handles,
    rows, the distinct fencing tokens of the rows)."""
    import pyarrow.compute as pc  # in the tasks only: the driver's runners never need it

    rpc = o.connect.client(o.server, timeout=o.timeout)
    fences: set[str] = set()
    handles: dict[str, str] = {}
    buffers: dict[str, list[bytes]] = {}
    pending = total = 0

    def flush() -> None:
        for topic, rows in buffers.items():
            if rows:
                rpc.stage(handles[topic], topic, rows)
        buffers.clear()

    try:
        for batch in batches:
            if o.fence_column is not None:
                fences.update(t for t in pc.unique(batch.column(o.fence_column)).to_pylist() if t is not None)
            for topic, rows in _runs(batch, o):
                if topic not in handles:
                    handles[topic] = f"{base}/t{len(handles)}"
                buffers.setdefault(topic, []).extend(rows)
                pending += len(rows)
                total += len(rows)
            if pending >= o.chunk_rows:
                flush()
                pending = 0
        flush()
    finally:
        rpc.close()
    return list(handles.values()), total, sorted(fences)


def publish_partition(o: SinkOptions, batches: Iterator[pa.RecordBatch], publisher: str, seq_base: int) -> tuple[int, int]:
    """Publish every row as ``publisher`` with seq ``seq_base + i + 1``; (accepted, duplicates)."""
    if o.ordering == "canonical":
        batches = _canonical(batches, o)
    rpc = o.connect.client(o.server, client_name=publisher, timeout=o.timeout)
    accepted = duplicates = 0
    i = 0
    try:
        for batch in batches:
            for topic, rows in _runs(batch, o):
                for a in range(0, len(rows), o.chunk_rows):
                    chunk = rows[a : a + o.chunk_rows]
                    got, dup = rpc.publish_batch(topic, chunk, first_seq=seq_base + i + 1)  # + fingerprints
                    accepted, duplicates, i = accepted + got, duplicates + dup, i + len(chunk)
    finally:
        rpc.close()
    return accepted, duplicates


def _discard(o: SinkOptions, txns: list[str]) -> None:
    if not txns:
        return
    with o.connect.client(o.server, timeout=o.timeout) as rpc:
        try:
            rpc.abort_txn(txns)
        except errors.ConveyorError as exc:  # best effort: the server expires staging anyway
            log.warning("abort of %d staged sets failed: %s", len(txns), exc)


# --- streaming ---------------------------------------------------------------------------


class ConveyorStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty(BATCH_ID_KEY) if ctx is not None else None
        query_id = ctx.getLocalProperty(QUERY_ID_KEY) if ctx is not None else None
        if batch_id is None or query_id is None:
            raise RuntimeError(
                f"task local properties {BATCH_ID_KEY!r}/{QUERY_ID_KEY!r} are missing: this Spark version does not set "
                "them (the connector is tested with PySpark 4.3)"
            )
        batch, pid = int(batch_id), ctx.partitionId()
        o = self.options
        fault(o.raw, f"sink.writing.b{batch}.p{pid}.a{ctx.attemptNumber()}")
        if o.mode == "txn":
            # Unique per attempt and per driver run: task attempt ids restart at 0 with
            # the JVM, and staging under a handle a killed run already used would add up.
            base = f"{query_id}/{batch}/{pid}/{ctx.attemptNumber()}-{uuid.uuid4().hex[:16]}"
            txns, rows, fences = stage_partition(o, iterator, base)
            message: WriterCommitMessage = TxnMessage(query_id, txns, rows, fences)
        else:
            publisher = f"{o.sink_name}/{query_id}/p{pid}"
            accepted, dups = publish_partition(o, iterator, publisher, batch << 32)
            message = DirectMessage(query_id, accepted, dups)
        fault(o.raw, f"sink.written.b{batch}.p{pid}")
        return message

    def commit(self, messages: list, batchId: int) -> None:
        o = self.options
        if o.mode == "txn":
            got = [msg for msg in messages if isinstance(msg, TxnMessage)]
            if not got:
                return
            query_id = got[0].query_id
            txns = [t for msg in got for t in msg.txns]
            fences = fencing.parse(t for msg in got for t in msg.fences)
            try:
                with o.connect.client(o.server, timeout=o.timeout) as rpc:
                    outcome, _ = rpc.commit_txn(f"{o.sink_name}/{query_id}", batchId + 1, txns, fences)
            except errors.Fenced as exc:
                _discard(o, txns)
                fence = next(iter(fences))  # only a commit with fences can be fenced
                raise fencing.fenced_error(fence.queue, fence.consumer, exc) from exc
            # "duplicate": a replay of a batch the server published already; the server
            # discards the new staging itself.
            log.info("batch %s: %d rows, commit %s", batchId, sum(m.rows for m in got), outcome)
        fault(o.raw, f"sink.committed.b{batchId}")

    def abort(self, messages: list, batchId: int) -> None:
        if self.options.mode == "txn":
            _discard(self.options, [t for msg in messages if isinstance(msg, TxnMessage) for t in msg.txns])


# --- batch writes ------------------------------------------------------------------------


class ConveyorBatchWriter(DataSourceArrowWriter):
    """Batch writes: the rows of a batch DataFrame carry no fence (no streaming source)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.job = uuid.uuid4().hex  # made once, in the planning worker; pickled to tasks and commit

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx is not None else 0
        o = self.options
        if o.mode == "txn":
            txns, rows, _ = stage_partition(o, iterator, f"batch/{self.job}/{pid}/{uuid.uuid4().hex[:16]}")
            return TxnMessage(self.job, txns, rows)
        accepted, dups = publish_partition(o, iterator, f"{o.sink_name}/batch/{self.job}/p{pid}", 0)
        return DirectMessage(self.job, accepted, dups)

    def commit(self, messages: list) -> None:
        o = self.options
        if o.mode == "txn":
            txns = [t for msg in messages if isinstance(msg, TxnMessage) for t in msg.txns]
            with o.connect.client(o.server, timeout=o.timeout) as rpc:
                rpc.commit_txn(f"{o.sink_name}/batch/{self.job}", 1, txns)

    def abort(self, messages: list) -> None:
        if self.options.mode == "txn":
            _discard(self.options, [t for msg in messages if isinstance(msg, TxnMessage) for t in msg.txns])
