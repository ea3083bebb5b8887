"""The first records of a batch, coerced exactly as the commit coerces them (for the data-contract check).

The sample is bounded (``limit`` records, read from the start of the first
slices), so the driver computes it itself: the blocking contract check then
never waits for Spark to start, while the executors still do all the
per-record work that grows with the batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.write.batch import SourceBatch


def _sample(batch: SourceBatch, spec: RecordSpec, limit: int) -> Iterator[pa.RecordBatch]:
    taken = 0
    index_of = batch.index_of()
    for piece in batch.slices:
        for records in piece.read(index_of, max_record_bytes=spec.max_line_bytes, limit=limit - taken):
            coerced = coerce_batch(records.slice(0, limit - taken), spec)
            taken += coerced.num_rows
            yield coerced
            if taken >= limit:
                return


def coerced_sample(batch: SourceBatch, spec: RecordSpec, limit: int) -> pa.Table:
    """Up to ``limit`` coerced rows from the start of the batch's pending units (the ``coerced`` schema)."""
    return pa.Table.from_batches(list(_sample(batch, spec, limit)), schema=spec.output_schema())
