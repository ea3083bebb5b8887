"""``idem_filedrop_lines``: a Spark Python data source reading dropped files as lines.

One input partition per split (planned on the driver while hashing), read on the
executors, so a cluster scales the read too. Each row is ``(_file, _line, _raw,
_raw_length)``; batches are Arrow, built without per-line Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from idem_platform.filedrop.files import DroppedFile, Split
from idem_platform.filedrop.reader import read_split

LINES_DDL = "_file int, _line bigint, _raw binary, _raw_length bigint"


class SplitPartition(InputPartition):
    """One split of one file."""

    def __init__(self, index: int, file_index: int, split: Split) -> None:
        super().__init__(index)
        self.file_index = file_index
        self.split = split


class FileLinesReader(DataSourceReader):
    def __init__(self, files: list[DroppedFile], max_line_bytes: int) -> None:
        self.files = files
        self.max_line_bytes = max_line_bytes

    def partitions(self) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        for file_index, file in enumerate(self.files):
            for split in file.splits:
                parts.append(SplitPartition(len(parts), file_index, split))
        # Spark needs at least one partition; an empty file set reads nothing.
        return parts or [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if not isinstance(partition, SplitPartition):
            return iter(())
        file = self.files[partition.file_index]
        return read_split(file, partition.split, partition.file_index, max_line_bytes=self.max_line_bytes)


class FileLinesSource(DataSource):
    """Options: ``files`` (JSON list of :class:`DroppedFile`), ``max_line_bytes``."""

    @classmethod
    def name(cls) -> str:
        return "idem_filedrop_lines"

    def schema(self) -> str:
        return LINES_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        files = [DroppedFile.from_json(f) for f in json.loads(self.options["files"])]
        return FileLinesReader(files, int(self.options.get("max_line_bytes", 1 << 20)))
