"""Packed fetch pages (docs/protocol.md, "Columnar fetch"): the server's buffers and the
Arrow batch the source builds from them say what a FetchPage of the same messages says,
for several topics, correlation ids, large publisher ids and both data types."""

from __future__ import annotations

from array import array

import pytest

from conveyor import records
from conveyor.engine import consumers
from conveyor.spark.datasource import ConveyorDataSource
from conveyor.spark.source import arrow_schema, packed_batch, to_batch


def entries(n: int, topics: list[str], cid: bool) -> list[records.PlainPublish]:
    return [records.PlainPublish(topics[i % len(topics)], 2**62 + 7 * i, i + 1, 1764000000.123456 + i / 7,
                                 ('{"n": %d, "é": "%s"}' % (i, "x" * (i % 5))).encode(),
                                 f"c{i}" if cid and i % 2 else None)
            for i in range(n)]


@pytest.mark.parametrize("topics,cid", [(["orders"], False), (["a", "b", "c"], True)])
def test_a_packed_page_holds_what_a_page_holds(topics, cid):
    es = entries(10, topics, cid)
    positions = [100 + 37 * i for i in range(10)]
    plain = consumers._pages(5, positions, es, "q1", "Q", packed=False)
    packed = consumers._pages(5, positions, es, "q1", "Q", packed=True)
    assert [(p.lo, p.n) for p in packed] == [(p.lo, len(p.data)) for p in plain]
    for a, b in zip(plain, packed):
        ends = array("i", b.ends)
        assert [b.data[ends[i]:ends[i + 1]] for i in range(b.n)] == a.data
        assert list(array("Q", b.publishers)) == a.publishers and list(array("q", b.seqs)) == a.seqs
        assert list(array("d", b.timestamps)) == a.timestamps and list(array("q", b.positions)) == a.positions
        named = [b.topics[i] for i in array("H", b.topic_of)] if b.topic_of else [b.topics[0]] * b.n
        assert named == a.topics
        assert (b.correlation_ids or [None] * b.n) == a.correlation_ids
        assert (b.query_id, b.queue) == (a.query_id, a.queue) == ("q1", "Q")


@pytest.mark.parametrize("data_type", ["string", "binary"])
@pytest.mark.parametrize("topics", [["orders"], ["a", "b"]])
def test_the_arrow_batch_of_a_packed_page_is_the_batch_of_its_page(data_type, topics):
    source = ConveyorDataSource({"dataType": data_type})
    schema = arrow_schema(source.schema())
    es = entries(25, topics, cid=True)
    positions = list(range(10, 260, 10))
    [plain] = consumers._pages(40, positions, es, None, "Q", packed=False)
    [packed] = consumers._pages(40, positions, es, None, "Q", packed=True)
    fence = '["Q","etl",3,65]'
    assert packed_batch(packed, schema, data_type, fence).equals(to_batch(plain, schema, data_type, fence))
