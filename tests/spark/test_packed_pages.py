"""Packed fetch pages (docs/protocol.md, "Columnar fetch"): the server's buffers and the
Arrow batch the source builds from them say what a FetchPage of the same messages says,
for several topics, correlation ids, large publisher ids and both data types."""

from __future__ import annotations

from array import array

import pytest

from conveyor import records
from conveyor.engine import consumers
from conveyor.spark.datasource import ConveyorDataSource
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from conveyor.spark.source import arrow_schema, packed_batch, source_columns, to_batch


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


@pytest.mark.parametrize("packed", [True, False])
def test_a_declared_schema_gets_its_columns_only_in_its_order(packed):
    """A query that declares ``readStream.schema(...)`` gets those of the source's
    columns, in its order, each what the full batch holds for it."""
    source = ConveyorDataSource({})
    full = source.schema()
    declared = StructType([full["delivery"], full["data"], full["bookmark"]])
    assert source_columns(declared, "string") == ("delivery", "data", "bookmark")
    es = entries(12, ["orders"], cid=False)
    [page] = consumers._pages(40, list(range(12)), es, None, "Q", packed=packed)
    make = packed_batch if packed else to_batch
    fence = '["Q","etl",3,52]'
    whole = make(page, arrow_schema(full), "string", fence)
    part = make(page, arrow_schema(declared), "string", fence)
    assert part.schema.names == ["delivery", "data", "bookmark"]
    for name in part.schema.names:
        assert part.column(name).equals(whole.column(name))


@pytest.mark.parametrize("schema,error", [
    ("data STRING, price DOUBLE", "has no column 'price'"),
    ("data BINARY", "column 'data' of the conveyor source is string, not binary .*dataType=binary"),
    ("delivery INT", "column 'delivery' of the conveyor source is bigint, not int"),
    ("data STRING, data STRING", "names a column twice"),
])
def test_a_declared_schema_the_source_cannot_give_is_refused(schema, error):
    with pytest.raises(ValueError, match=error):
        source_columns(_parse(schema), "string")
    with pytest.raises(ValueError, match="names no column"):
        source_columns(StructType([]), "string")
    with pytest.raises(ValueError, match="is binary, not string .*dataType=string, the default"):
        source_columns(_parse("data STRING"), "binary")
    assert source_columns(_parse("data BINARY"), "binary") == ("data",)


def _parse(ddl: str) -> StructType:
    fields = []
    kinds = {"STRING": StringType(), "BINARY": BinaryType(), "INT": IntegerType(), "LONG": LongType(),
             "DOUBLE": DoubleType()}
    for part in ddl.split(","):
        name, kind = part.split()
        fields.append(StructField(name, kinds[kind]))
    return StructType(fields)
