"""A sample of the ``coerced`` frame, computed on an executor (for the pandera contract check).

Reads the first lines of the batch's first split and coerces them with the same
functions as the commit, in one small ``mapInArrow`` task, so the check costs a
fraction of a second and never reads the whole batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.filedrop.files import DroppedFile
from idem_platform.filedrop.reader import read_split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _sample(files: tuple[DroppedFile, ...], spec: RecordSpec, limit: int) -> Iterator[pa.RecordBatch]:
    taken = 0
    for file_index, file in enumerate(files):
        for split in file.splits:
            for lines in read_split(file, split, file_index, max_line_bytes=spec.max_line_bytes, block_bytes=1 << 20):
                batch = coerce_batch(lines.slice(0, limit - taken), spec)
                taken += batch.num_rows
                yield batch
                if taken >= limit:
                    return


def coerced_sample(spark: SparkSession, files: tuple[DroppedFile, ...], spec: RecordSpec, limit: int) -> pa.Table:
    """Up to ``limit`` coerced rows from the start of ``files``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        return _sample(files, spec, limit)

    frame = spark.range(0, 1, 1, numPartitions=1).mapInArrow(body, from_arrow_schema(spec.output_schema()))
    return frame.toArrow()
