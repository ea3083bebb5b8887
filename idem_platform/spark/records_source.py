"""``idem_source_records``: a Spark Python data source reading a planned batch's raw records.

One input partition per slice (a file's split, a run of Kafka offsets), read on
the executors by the slice itself, so a cluster scales the read too. Rows have
:data:`~idem_platform.write.batch.RECORDS_SCHEMA`; batches are Arrow, built
without per-record Python in the driver.

The slices travel as one pickled option (``batch``): they are small plans (a
path and byte range, a topic partition and offsets), never records.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from idem_platform.write.batch import SourceBatch

RECORDS_DDL = "_unit int, _offset bigint, _raw binary, _raw_length bigint, _meta string, _timestamp bigint"


def batch_option(batch: SourceBatch) -> str:
    """The ``batch`` option: the batch's pending units and slices, pickled."""
    return base64.b64encode(pickle.dumps(batch)).decode("ascii")


class SlicePartition(InputPartition):
    """One slice of the batch."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class SourceRecordsReader(DataSourceReader):
    def __init__(self, batch: SourceBatch, max_record_bytes: int) -> None:
        self.batch = batch
        self.max_record_bytes = max_record_bytes

    def partitions(self) -> Sequence[InputPartition]:
        # Spark needs at least one partition; an empty batch reads nothing.
        return [SlicePartition(i) for i in range(len(self.batch.slices))] or [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SlicePartition):
            return iter(())
        piece = self.batch.slices[partition.index]
        return piece.read(self.batch.index_of(), max_record_bytes=self.max_record_bytes)


class SourceRecordsSource(DataSource):
    """Options: ``batch`` (:func:`batch_option`), ``max_record_bytes``."""

    @classmethod
    def name(cls) -> str:
        return "idem_source_records"

    def schema(self) -> str:
        return RECORDS_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        batch = pickle.loads(base64.b64decode(self.options["batch"]))
        return SourceRecordsReader(batch, int(self.options.get("max_record_bytes", 1 << 20)))
