"""Streaming source: a named consumer of a conveyor queue as a Spark stream (docs/spark.md).

The server numbers every message it leases to a named consumer with a durable,
gap-free delivery number ``d``; a Spark offset is ``{"v": 1, "consumer": C, "d": D,
"np": K}`` and a micro-batch is the delivery range ``(start.d, end.d]``. Rules:

1. **Ack only what is committed.** ``latestOffset(start)`` runs only after the batch
   ending at ``start`` is in Spark's commit log, so it acks ``<= start.d`` first
   (``commit(end)`` lags a batch and is skipped for the last one). Async progress
   tracking breaks that ordering and is not supported. The transactional sink acks
   earlier, in the same server step as its output (the ``fence`` column, rule 6). The
   ack is handed to the background connection (rule 7): it is sent after the commit,
   never before, but the next batch does not wait for the server's answer. A
   ``latestOffset`` that finds nothing new (an idle stream, the end of AvailableNow,
   where the query may stop) waits until the acks are sent.
2. **A range always yields the same rows.** ``read()`` is a pure fetch of its range,
   whatever the lease state: safe to retry and to speculate. A lease after a crash
   (``after < D`` on the server) re-offers the deliveries already numbered instead of
   leasing new ones.
3. **A replay keeps its split**: ``np`` is taken from the end offset. A replayed batch
   whose deliveries the sink already acknowledged with its output (the driver died
   between the server commit and Spark's commit log) reads nothing: its output exists.
4. **One query per consumer.** The driver-side reader claims the consumer with a fresh
   token on its first call and carries the epoch in every mutating call; a query whose
   consumer was claimed by a newer one fails with :class:`ConsumerFenced`.
5. **Nothing live in ``__init__``** (the reader is pickled): the connection, the claim
   and the lease heartbeat thread are created lazily, in the driver's runner process only.
6. **Every row carries its fence**: ``[queue, consumer, epoch, through]`` in the
   ``fence`` column (:mod:`conveyor.spark.fencing`), the only way the sink can learn it;
   a schema given to ``readStream.schema(...)`` may leave it out (and any other column:
   a Python data source has no column pruning, so a declared schema is how a query
   says what it reads), and then the sink commits without fences.
7. **The next batch is leased while this one runs.** Once ``latestOffset`` has chosen
   ``end``, the driver's background connection (its own thread, which also renews the
   leases every ttl/3 and sends the acks) leases the deliveries after ``end``. The next
   ``latestOffset(end)`` takes that answer if it is for the same ``after``, limit and
   ``upto``: whole if it is a full batch; if it leased fewer (the queue held fewer
   then), with the rest of the batch leased after it (``lease(after=its d)``). Any other
   answer (none, another key, a re-offer) and it leases as before, and the server
   re-offers what the early lease numbered (``after < D``), so an early lease that is
   not used, or a crash in between, costs a re-offer, never a delivery. One early lease
   at a time; fenced by the same epoch.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from conveyor import errors
from conveyor.client.rpc import RpcClient
from conveyor.protocol import replies
from conveyor.protocol.bookmarks import format_bookmark
from conveyor.protocol.messages import FetchPacked, FetchPage
from conveyor.spark import fencing
from conveyor.spark import options as opt
from conveyor.spark.faults import fault
from conveyor.spark.fencing import ConsumerFenced

__all__ = ["ConsumerFenced", "ConveyorStreamReader", "DeliveryRange", "SourceOptions", "source_schema"]

log = logging.getLogger("conveyor.spark")

OFFSET_VERSION = 1


def source_schema(data_type: str = "string") -> StructType:
    """The rows of the source: the payload (``data``: UTF-8 text, or bytes with
    ``dataType=binary``), where it came from, and its delivery number."""
    return StructType([
        StructField("data", BinaryType() if data_type == "binary" else StringType()),
        StructField("topic", StringType()),
        StructField("bookmark", StringType()),  # publisher|seq|position: a unique key
        StructField("publisher", LongType()),  # the publisher id
        StructField("sequence", LongType()),  # the publisher's sequence number
        StructField("timestamp", TimestampType()),  # when the server accepted it
        StructField("delivery", LongType()),  # d: the consumer's delivery number
        StructField(fencing.FENCE_COLUMN, StringType()),  # for the sink: conveyor.spark.fencing
    ])


def source_columns(schema: StructType, data_type: str) -> tuple[str, ...]:
    """The source's columns a reader's ``schema`` names, in its order: every column of
    :func:`source_schema` when the query gave none, else those it declared
    (``readStream.schema("data STRING, delivery LONG")``), each with the source's type
    for it. Anything else is refused here, on the driver, before a lease."""
    full = {f.name: f.dataType for f in source_schema(data_type).fields}
    names = tuple(schema.fieldNames())
    if not names:
        raise ValueError("the conveyor source's schema names no column: declare at least one of " + ", ".join(full))
    for f in schema.fields:
        if f.name not in full:
            raise ValueError(f"the conveyor source has no column {f.name!r}: a declared schema may name only "
                             f"its columns ({', '.join(full)}), in any order")
        if f.dataType != full[f.name]:
            hint = ""
            if f.name == "data":
                hint = (" (binary payloads: option dataType=binary)" if data_type == "string"
                        else " (text payloads: option dataType=string, the default)")
            raise ValueError(f"column {f.name!r} of the conveyor source is {full[f.name].simpleString()}, "
                             f"not {f.dataType.simpleString()}{hint}")
    if len(set(names)) != len(names):
        raise ValueError(f"the conveyor source's schema names a column twice: {', '.join(names)}")
    return names


@dataclass(frozen=True)
class SourceOptions:
    server: str  # one URI, or several comma separated (failover between instances)
    queue: str
    consumer: str
    max_records: int  # per micro-batch; 0 = everything ready
    num_partitions: int
    lease_seconds: float
    fetch_size: int
    data_type: str  # "string" (UTF-8 payloads) or "binary"
    output: str  # "arrow" (RecordBatches) or "rows" (tuples; slower, kept for the benchmark)
    timeout: float
    raw: dict  # for the test hooks
    connect: opt.ConnectOptions = opt.ConnectOptions()  # credentials and TLS

    @classmethod
    def parse(cls, options) -> SourceOptions:
        return cls(
            server=opt.required(options, "server", "e.g. tcp://127.0.0.1:9007, or several comma separated"),
            queue=opt.required(options, "queue"),
            consumer=opt.required(options, "consumer", "a name for this query's consumer, kept in its checkpoint"),
            max_records=opt.integer(options, "maxRecordsPerBatch", 10000),
            num_partitions=opt.integer(options, "numPartitions", 2, minimum=1),
            lease_seconds=opt.seconds(options, "leaseSeconds", 60.0),
            fetch_size=opt.integer(options, "fetchSize", 10000, minimum=1),
            data_type=opt.choice(options, "dataType", ("string", "binary"), "string"),
            output=opt.choice(options, "output", ("arrow", "rows"), "arrow"),
            timeout=opt.seconds(options, "timeout", 30.0),
            raw={k.lower(): v for k, v in options.items() if k.lower().startswith("test")},
            connect=opt.ConnectOptions.parse(options),
        )


@dataclass(frozen=True)
class DeliveryRange(InputPartition):
    """Deliveries ``lo < d <= hi`` of the consumer: one Spark task."""

    lo: int
    hi: int
    index: int
    batch: int  # the end delivery number of the micro-batch
    fence: str  # the fencing token every row carries (rule 6)


class ConveyorStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.columns = source_columns(schema, options.data_type)
        self._reset()

    def _reset(self) -> None:
        self._rpc: RpcClient | None = None
        self._claim: replies.ClaimReply | None = None
        self._upto: int | None = None
        self._background: _Background | None = None
        self._fresh: tuple[int, int] | None = None  # the range the last lease of this run made

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key in ("_rpc", "_claim", "_upto", "_background", "_fresh"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    # --- driver side ----------------------------------------------------------------------

    def _driver(self) -> RpcClient:
        """The driver runner's connection; the first call claims the consumer (rule 4)."""
        if self._rpc is None:
            o = self.options
            rpc = o.connect.client(o.server, timeout=o.timeout)
            self._claim = self._guard(lambda: rpc.claim(o.queue, o.consumer, uuid.uuid4().hex))
            self._rpc = rpc
            log.info("claimed consumer %s of %s: %s", o.consumer, o.queue, self._claim)
        return self._rpc

    @property
    def _epoch(self) -> int:
        self._driver()
        assert self._claim is not None
        return self._claim.epoch

    def _guard(self, call):
        try:
            return call()
        except errors.ConveyorError as exc:
            if fencing.is_fenced(exc):
                if self._background is not None:
                    self._background.stop()
                raise fencing.fenced_error(self.options.queue, self.options.consumer, exc) from exc
            raise

    def _offset(self, d: int) -> dict:
        return {"v": OFFSET_VERSION, "consumer": self.options.consumer, "d": d, "np": self.options.num_partitions}

    def _check(self, offset: dict) -> int:
        if offset.get("v", OFFSET_VERSION) != OFFSET_VERSION:
            raise ValueError(f"unsupported conveyor offset version {offset.get('v')!r} (this connector writes {OFFSET_VERSION})")
        if offset.get("consumer") != self.options.consumer:
            raise ValueError(
                f"the checkpoint's offsets belong to consumer {offset.get('consumer')!r}, not to consumer "
                f"{self.options.consumer!r}: use a new checkpoint location for a new consumer"
            )
        return int(offset["d"])

    def initialOffset(self) -> dict:
        # Called twice on a fresh start: deterministic (the claim is made once per process).
        self._driver()
        assert self._claim is not None
        return self._offset(self._claim.acked)

    def getDefaultReadLimit(self) -> ReadLimit:
        most = self.options.max_records
        return ReadMaxRows(most) if most > 0 else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        rpc = self._driver()
        self._upto = self._guard(lambda: rpc.head(self.options.queue)).upto
        log.info("AvailableNow: leasing up to journal position %s", self._upto)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        after = self._check(start)
        o, rpc, epoch = self.options, self._driver(), self._epoch
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else 0
        background = self._start_background()
        self._guard(background.check)  # a fenced ack or renewal ends the query here
        if after > 0:
            background.ack(after)  # rule 1: the batch ending at `start` is in Spark's commit log by now
        key = (after, most, self._upto)

        def lease_after(d: int) -> replies.LeaseReply:  # the rest of this batch's limit after delivery d
            more = most - (d - after) if most else 0
            return self._guard(lambda: rpc.lease(o.queue, o.consumer, d, more, o.lease_seconds, self._upto, epoch))

        got = background.take(key, o.timeout)  # rule 7
        if got is not None and most and not got.reoffered and got.d - after == got.leased < most:
            # The early lease numbered part of a batch (the queue held fewer then): keep
            # its deliveries and lease the rest after them, rather than lease the batch
            # again (which re-offers each of them, message by message).
            got = lease_after(got.d)
        elif got is None or (most and got.d - after < most):
            got = lease_after(after)
            if got.reoffered and not got.leased and got.d == got.D and (not most or got.d - after < most):
                # An early lease numbered fewer than this batch may take (another limit, a
                # queue that filled up since): take them again and lease the rest after them.
                got = lease_after(got.d)
        end = got.d
        if most:
            end = min(end, after + most)
        if end <= after:
            # Nothing new (an idle stream, the end of AvailableNow): the query may stop
            # here, so what is committed is acknowledged before this returns.
            background.wait_acked(o.timeout)
            self._guard(background.check)
            return start  # `start` itself, or Spark plans an empty batch
        self._fresh = (after, end)
        fault(o.raw, f"source.leased.d{end}")
        background.lease_early((end, most, self._upto))
        return self._offset(end)

    def reportLatestOffset(self):
        return None  # must not lease

    def partitions(self, start: dict, end: dict) -> list[DeliveryRange]:
        lo, hi = self._check(start), self._check(end)
        if hi <= lo:
            return []
        o, rpc, epoch = self.options, self._driver(), self._epoch
        if self._fresh != (lo, hi):
            # A replayed batch (restart) was not leased in this run: renew its leases.
            # The sink may have acknowledged it with its output already (rule 3).
            lo = max(lo, self._guard(lambda: rpc.consumer_info(o.queue, o.consumer)).acked)
            if hi <= lo:
                log.info("deliveries up to %s are acknowledged with the sink's output: the replay reads nothing", hi)
                return []
            got = self._guard(lambda: rpc.reclaim(o.queue, o.consumer, lo, hi, o.lease_seconds, epoch))
            if got.held_elsewhere:
                log.warning("deliveries %s..%s: %s are held elsewhere (leased to another consumer, or owned by "
                            "another instance after a failover): read as they are", lo, hi, got.held_elsewhere)
        self._start_background()
        n = min(int(end.get("np", o.num_partitions)), hi - lo)  # rule 3
        size, extra = divmod(hi - lo, n)
        fence = fencing.token(o.queue, o.consumer, epoch, hi)
        ranges, at = [], lo
        for i in range(n):
            top = at + size + (1 if i < extra else 0)
            ranges.append(DeliveryRange(at, top, i, hi, fence))
            at = top
        return ranges

    def commit(self, end: dict) -> None:
        background = self._start_background()
        self._guard(background.check)
        background.ack(self._check(end))  # rule 1; sent by the background connection

    def stop(self) -> None:  # not reliably called by PySpark: nothing depends on it
        if self._background is not None:
            self._background.stop(flush=True)
        if self._rpc is not None:
            self._rpc.close()

    def _start_background(self) -> _Background:
        if self._background is None:
            self._background = _Background(self.options, self._epoch)
            self._background.start()
        return self._background

    # --- executor side --------------------------------------------------------------------

    def read(self, partition: DeliveryRange) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, DeliveryRange):
            return  # a batch with nothing to read (rule 3): Spark plans one empty partition
        o = self.options
        schema = arrow_schema(self.schema)
        rpc = o.connect.client(o.server, timeout=o.timeout)
        try:
            count, half = 0, partition.lo + (partition.hi - partition.lo) // 2
            arrow = o.output == "arrow"
            for page in rpc.fetch_pages(o.queue, o.consumer, partition.lo, partition.hi, page=o.fetch_size,
                                        packed=arrow):
                n = page.n if isinstance(page, FetchPacked) else len(page.data)
                count += n
                if o.raw and page.lo < half <= page.lo + n:
                    fault(o.raw, f"read.d{partition.batch}.p{partition.index}")
                if n:
                    yield from self._out(page, schema, partition.fence)
        finally:
            rpc.close()
        if count != partition.hi - partition.lo:
            raise errors.ServerError(
                f"deliveries {partition.lo}..{partition.hi} of consumer {o.consumer!r}: the server returned "
                f"{count} messages, not {partition.hi - partition.lo}"
            )

    def _out(self, page: FetchPage | FetchPacked, schema: pa.Schema, fence: str) -> Iterator:
        if isinstance(page, FetchPacked):
            yield packed_batch(page, schema, self.options.data_type, fence)
            return
        if self.options.output == "arrow":
            yield to_batch(page, schema, self.options.data_type, fence)
            return
        text = self.options.data_type == "string"
        picked = [_ALL_COLUMNS.index(name) for name in self.columns]
        for i, (data, topic, publisher, seq, ts, p) in enumerate(
                zip(page.data, page.topics, page.publishers, page.seqs, page.timestamps, page.positions),
                page.lo + 1):
            row = (
                data.decode() if text else data, topic, format_bookmark(publisher, seq, p), publisher, seq,
                datetime.fromtimestamp(ts, UTC), i, fence,
            )
            yield tuple(row[k] for k in picked)


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")  # what Spark checks read()'s batches against


def to_batch(page: FetchPage, schema: pa.Schema, data_type: str, fence: str) -> pa.RecordBatch:
    """One Arrow batch of a fetched page, its columns built from the page's lists in C
    (no Python object per row)."""
    return _batch(schema, data_type, fence, page.lo, len(page.data), data=lambda: pa.array(page.data, pa.binary()),
                  topics=lambda: pa.array(page.topics, pa.string()),
                  publishers=lambda: pa.array(page.publishers, pa.int64()),
                  seqs=lambda: pa.array(page.seqs, pa.int64()), positions=lambda: pa.array(page.positions, pa.int64()),
                  seconds=lambda: pa.array(page.timestamps, pa.float64()))


def packed_batch(page: FetchPacked, schema: pa.Schema, data_type: str, fence: str) -> pa.RecordBatch:
    """:func:`to_batch` of a packed page: its buffers are Arrow's layout already (the
    bodies and their offsets, the numbers), so the columns are views of them, not built
    value by value."""
    if sys.byteorder == "big":
        raise RuntimeError("packed fetch pages are little-endian: this executor is big-endian")
    n = page.n

    def view(kind: pa.DataType, buffer: bytes) -> pa.Array:
        return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(buffer)])

    def topics() -> pa.Array:
        if page.topic_of:
            return pa.array(page.topics, pa.string()).take(view(pa.uint16(), page.topic_of))
        return pa.repeat(pa.scalar(page.topics[0] if page.topics else "", pa.string()), n)

    return _batch(schema, data_type, fence, page.lo, n,
                  data=lambda: pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(page.ends),
                                                                      pa.py_buffer(page.data)]),
                  topics=topics, publishers=lambda: view(pa.uint64(), page.publishers).cast(pa.int64()),
                  seqs=lambda: view(pa.int64(), page.seqs), positions=lambda: view(pa.int64(), page.positions),
                  seconds=lambda: view(pa.float64(), page.timestamps))


Column = Callable[[], "pa.Array"]


def _batch(schema: pa.Schema, data_type: str, fence: str, lo: int, n: int, *, data: Column, topics: Column,
           publishers: Column, seqs: Column, positions: Column, seconds: Column) -> pa.RecordBatch:
    """The source's batch of deliveries ``lo + 1 .. lo + n`` from its message columns,
    with the columns ``schema`` names only (each made when it is named): the bookmark
    joined from its three parts, the timestamp truncated to microseconds as
    ``int(seconds * 1e6)`` would, the delivery numbers and the fence, all in C."""
    import numpy as np
    import pyarrow.compute as pc  # here: the driver's source runner never needs it (60 ms to import)

    def text() -> pa.Array:
        return data().cast(pa.string())  # validates UTF-8 in C

    def bookmarks() -> pa.Array:
        return pc.binary_join_element_wise(publishers().cast(pa.string()), seqs().cast(pa.string()),
                                           positions().cast(pa.string()), "|")

    def timestamps() -> pa.Array:
        micros = pc.multiply(seconds(), 1_000_000.0).cast(pa.int64(), safe=False)
        return micros.cast(schema.field("timestamp").type)

    make: dict[str, Column] = {
        "data": text if data_type == "string" else data,
        "topic": topics,
        "bookmark": bookmarks,
        "publisher": publishers,
        "sequence": seqs,
        "timestamp": timestamps,
        "delivery": lambda: pa.array(np.arange(lo + 1, lo + 1 + n, dtype=np.int64)),
        fencing.FENCE_COLUMN: lambda: pa.repeat(pa.scalar(fence, pa.string()), n),
    }
    return pa.RecordBatch.from_arrays([make[name]() for name in schema.names], schema=schema)


_ALL_COLUMNS = tuple(source_schema().fieldNames())


class _Background:
    """The driver runner's second connection, on a thread of its own (rules 1 and 7):
    renews the consumer's leases every ttl/3, sends the acks of committed batches (the
    highest asked for), and leases the next batch early. The work is done in that order
    of urgency: an ack, then an early lease, then a renewal when due. A fenced answer
    stops it; :meth:`check` raises it in the driver's next call. Other failures (the
    server restarting) are logged and retried: an ack stays pending, an early lease is
    dropped (the driver leases itself)."""

    def __init__(self, options: SourceOptions, epoch: int) -> None:
        self.options = options
        self.epoch = epoch
        self._cond = threading.Condition()
        self._stopped = False
        self._flush = False
        self._ack_wanted = 0  # the highest delivery to acknowledge
        self._ack_sent = 0
        self._early: tuple | None = None  # (after, most, upto) to lease early
        self._early_started: tuple | None = None
        self._early_got: tuple | None = None  # (key, LeaseReply or None when it failed)
        self._fenced: errors.ConveyorError | None = None
        self._thread = threading.Thread(target=self._run, name="conveyor-source-background", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush: bool = False) -> None:
        """Stop (after trying once to send a pending ack when ``flush``, waiting up to the
        timeout for it)."""
        with self._cond:
            self._stopped, self._flush = True, flush
            self._cond.notify_all()
        if flush and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.options.timeout)

    def check(self) -> None:
        if self._fenced is not None:
            raise self._fenced

    def ack(self, d: int) -> None:
        with self._cond:
            if d > self._ack_wanted:
                self._ack_wanted = d
                self._cond.notify_all()

    def wait_acked(self, timeout: float) -> bool:
        """Wait until every ack asked for is sent (or the connection stopped); whether it was."""
        with self._cond:
            return self._cond.wait_for(lambda: self._ack_sent >= self._ack_wanted or self._stopped, timeout)

    def lease_early(self, key: tuple) -> None:
        with self._cond:
            # A new request, even for the key of one made before (Spark may ask for the
            # same batch twice): it is leased again, and the server re-offers it.
            self._early, self._early_got, self._early_started = key, None, None
            self._cond.notify_all()

    def take(self, key: tuple, timeout: float) -> replies.LeaseReply | None:
        """The early lease made for ``key`` (waiting for it if it is under way), or None."""
        with self._cond:
            if self._early != key:
                return None
            self._cond.wait_for(lambda: self._early_got is not None or self._stopped, timeout)
            got = self._early_got
            self._early = self._early_got = None
            self._cond.notify_all()
        return got[1] if got is not None and got[0] == key else None

    def _next(self, due: float) -> tuple[int, tuple | None, bool]:
        """Wait for work: (ack to send or 0, early lease to make or None, renewal due)."""
        with self._cond:
            while True:
                if self._stopped and not (self._flush and self._ack_wanted > self._ack_sent):
                    raise _Stopped
                ack = self._ack_wanted if self._ack_wanted > self._ack_sent else 0
                early = self._early if self._early is not None and self._early_got is None and (
                    self._early_started != self._early) else None
                left = due - time.monotonic()
                if ack or early is not None or left <= 0:
                    self._early_started = early if early is not None else self._early_started
                    return ack, early, left <= 0
                self._cond.wait(left)

    def _run(self) -> None:
        o = self.options
        rpc = o.connect.client(o.server, timeout=o.timeout)
        period = o.lease_seconds / 3
        due = time.monotonic() + period
        try:
            while True:
                ack, early, renew = self._next(due)
                try:
                    if ack:
                        if o.raw:
                            fault(o.raw, f"source.acking.d{ack}")  # test hook: a slow ack
                        rpc.ack_through(o.queue, o.consumer, ack, self.epoch)
                        with self._cond:
                            self._ack_sent = max(self._ack_sent, ack)
                            self._cond.notify_all()  # wait_acked
                            if self._stopped:
                                return
                    if early is not None:
                        after, most, upto = early
                        got = None
                        try:
                            got = rpc.lease(o.queue, o.consumer, after, most, o.lease_seconds, upto, self.epoch)
                        finally:
                            with self._cond:
                                if self._early == early:
                                    self._early_got = (early, got)
                                    self._cond.notify_all()
                    if renew:
                        due = time.monotonic() + period
                        rpc.extend(o.queue, o.consumer, o.lease_seconds, self.epoch)
                except errors.ConveyorError as exc:
                    if fencing.is_fenced(exc):
                        log.warning("consumer %s fenced out: its background connection stops", o.consumer)
                        self._fenced = exc
                        return
                    with self._cond:
                        if self._stopped:
                            return  # stopping: a pending ack is not worth waiting for a server
                        log.warning("conveyor source background call failed (retrying): %s", exc)
                        self._cond.wait(min(1.0, period))
        except _Stopped:
            return
        finally:
            with self._cond:
                self._stopped = True
                self._cond.notify_all()
            rpc.close()


class _Stopped(Exception):
    """Ends the background thread's loop."""
