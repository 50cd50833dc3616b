"""The stream reader's callbacks driven by hand, as Spark's runner would (no JVM)."""

from __future__ import annotations

import json
import pickle
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from conveyor import errors
from conveyor.spark import fencing
from conveyor.spark import options as opt
from conveyor.spark.source import (
    ConsumerFenced,
    ConveyorStreamReader,
    SourceOptions,
    source_schema,
)
from tests.spark.helpers import QUEUE, consumer_info, publish_numbers


_READERS: list[ConveyorStreamReader] = []


@pytest.fixture(autouse=True)
def _stop_readers():
    """Stop each test's readers: their heartbeat threads would outlive the test's server."""
    yield
    while _READERS:
        _READERS.pop().stop()


def reader(uri: str, consumer: str = "etl", **extra) -> ConveyorStreamReader:
    options = {"server": uri, "queue": QUEUE, "consumer": consumer, "numpartitions": "2", **extra}
    r = ConveyorStreamReader(SourceOptions.parse(options), source_schema())
    _READERS.append(r)
    return r


def rows(r: ConveyorStreamReader, parts) -> list[int]:
    out = []
    for part in parts:
        for batch in r.read(part):
            out += [json.loads(x)["n"] for x in batch.column("data").to_pylist()]
    return out


def test_offsets_partitions_read_and_ack(conveyor_server, tmp_path):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 25)
    # the last ack is slow to be sent: latestOffset with nothing new must wait for it
    r = reader(uri, testFaults="source.acking.d25=sleep1", testFaultDir=str(tmp_path))
    start = r.initialOffset()
    assert start == r.initialOffset() == {"v": 1, "consumer": "etl", "d": 0, "np": 2}  # deterministic
    assert r.getDefaultReadLimit() == ReadMaxRows(10000)
    end = r.latestOffset(start, ReadMaxRows(10))
    assert end == {"v": 1, "consumer": "etl", "d": 10, "np": 2}
    parts = r.partitions(start, end)
    assert [(p.lo, p.hi) for p in parts] == [(0, 5), (5, 10)]
    executor = pickle.loads(pickle.dumps(r))  # what Spark ships: no live connection inside
    assert executor._rpc is None and executor._background is None and executor.options == r.options
    assert rows(executor, parts) == list(range(10))
    batch = next(iter(executor.read(parts[0])))
    assert batch.schema.names == ["data", "topic", "bookmark", "publisher", "sequence", "timestamp", "delivery", "fence"]
    assert batch.column("delivery").to_pylist() == [1, 2, 3, 4, 5]
    assert set(batch.column("fence").to_pylist()) == {fencing.token(QUEUE, "etl", 1, 10)}  # epoch 1, through 10
    # the next latestOffset acks the previous batch (on the background connection) and
    # takes the deliveries the early lease made (10 of them, for a limit of 10) plus the rest
    end2 = r.latestOffset(end, ReadAllAvailable())
    assert end2["d"] == 25 and soon(uri, lambda c: c.acked >= 10).acked == 10
    assert r.latestOffset(end2, ReadAllAvailable()) is end2  # nothing new: `start` itself
    # and the query may stop here: what is committed is acknowledged before it returns
    assert consumer_info(uri, "etl").acked == 25


def soon(uri: str, done, timeout: float = 10.0):
    """The consumer's info once ``done(info)``: acks and early leases are sent by the
    driver's background connection, off the critical path."""
    deadline = time.monotonic() + timeout
    while not done(info := consumer_info(uri, "etl")):
        assert time.monotonic() < deadline, f"still {info}"
        time.sleep(0.02)
    return info


def test_the_next_batch_is_leased_early_and_taken_whole(conveyor_server):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 30)
    r = reader(uri)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(10))
    assert soon(uri, lambda c: c.d >= 20).d == 20  # the early lease of 11..20
    end2 = r.latestOffset(end, ReadMaxRows(10))
    assert end2["d"] == 20 and soon(uri, lambda c: c.d >= 30).d == 30  # taken, and 21..30 leased early
    assert rows(r, r.partitions(end, end2)) == list(range(10, 20))
    # a crash between the early lease and the next batch: a new reader leases 21..30 again (a re-offer)
    again = reader(uri).latestOffset(end2, ReadMaxRows(10))
    assert again["d"] == 30


def test_crash_after_lease_reoffers_and_replay_keeps_its_split(conveyor_server):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 30)
    first = reader(uri)
    start = first.initialOffset()
    first.latestOffset(start, ReadMaxRows(20))  # leased 1..20, then the driver "dies"
    # restart with another partition count: the same deliveries come back, nothing new
    second = reader(uri, numpartitions="3")
    again = second.latestOffset(start, ReadMaxRows(20))
    assert again == {"v": 1, "consumer": "etl", "d": 20, "np": 3}
    # a replay of a batch planned with np=2 keeps 2 ranges
    planned = {"v": 1, "consumer": "etl", "d": 20, "np": 2}
    assert len(second.partitions(start, planned)) == 2
    assert rows(second, second.partitions(start, again)) == list(range(20))


def test_an_older_reader_is_fenced_out(conveyor_server):
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 10)
    old = reader(uri)
    start = old.initialOffset()
    new = reader(uri)
    new.initialOffset()  # claims the consumer: a newer epoch
    with pytest.raises(ConsumerFenced, match="fenced out") as info:
        old.latestOffset(start, ReadMaxRows(5))
    assert isinstance(info.value, errors.Fenced) and info.value.code == "fenced"


def test_checkpoint_of_another_consumer_and_bad_options(conveyor_server):
    r = reader(conveyor_server.uri)
    with pytest.raises(ValueError, match="belong to consumer 'other'"):
        r.latestOffset({"v": 1, "consumer": "other", "d": 0, "np": 2}, ReadAllAvailable())
    with pytest.raises(opt.OptionError, match="'consumer' is required"):
        SourceOptions.parse({"server": "tcp://h:1", "queue": "q"})
    with pytest.raises(opt.OptionError, match="maxRecordsPerBatch"):
        SourceOptions.parse({"server": "tcp://h:1", "queue": "q", "consumer": "c", "maxrecordsperbatch": "x"})


def test_the_same_batch_asked_for_twice_is_leased_early_twice(conveyor_server):
    """Spark may call latestOffset twice with one start: the second early lease of the
    same range must be made too, or the next call would wait for it until the timeout."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 30)
    r = reader(uri, timeout="5")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(10))
    soon(uri, lambda c: c.d >= 20)  # the early lease of 11..20 is done
    assert r.latestOffset(start, ReadMaxRows(10)) == end  # the same batch again (a re-offer)
    started = time.monotonic()
    assert r.latestOffset(end, ReadMaxRows(10))["d"] == 20
    assert time.monotonic() - started < 3  # taken from the early lease, not after a wait for it


def test_a_partial_early_lease_is_kept_and_topped_up(conveyor_server):
    """The queue held fewer than a batch when the early lease was made: the next batch
    keeps those deliveries and leases the rest after them; nothing is re-offered."""
    uri = conveyor_server.uri
    publish_numbers(uri, 0, 14)
    r = reader(uri)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(10))
    assert soon(uri, lambda c: c.d >= 14).d == 14  # the early lease found 4 (11..14)
    publish_numbers(uri, 14, 16)
    replies, lease = [], r._rpc.lease
    r._rpc.lease = lambda *a, **k: replies.append(lease(*a, **k)) or replies[-1]
    end2 = r.latestOffset(end, ReadMaxRows(10))
    assert end2["d"] == 20
    assert [(g.leased, g.reoffered) for g in replies] == [(6, 0)]  # 15..20 after the early 11..14
    assert rows(r, r.partitions(end, end2)) == list(range(10, 20))
