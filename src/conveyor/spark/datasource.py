"""``ConveyorDataSource``: the ``conveyor`` format (streaming source, streaming sink, batch writes).

``__init__`` only keeps the options (the instance is created in many processes and
pickled); every reader and writer parses and checks them when it is made.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from conveyor.spark import options as opt
from conveyor.spark.sink import ConveyorBatchWriter, ConveyorStreamWriter, SinkOptions
from conveyor.spark.source import ConveyorStreamReader, SourceOptions, source_schema


class ConveyorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "conveyor"

    def schema(self) -> StructType:
        return source_schema(opt.choice(self.options, "dataType", ("string", "binary"), "string"))

    def streamReader(self, schema: StructType) -> ConveyorStreamReader:
        return ConveyorStreamReader(SourceOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ConveyorStreamWriter:
        return ConveyorStreamWriter(SinkOptions.parse(self.options, schema))

    def writer(self, schema: StructType, overwrite: bool) -> ConveyorBatchWriter:
        return ConveyorBatchWriter(SinkOptions.parse(self.options, schema))
