"""The first rows of a batch, coerced exactly as the commit coerces them (for the data-contract check).

The sample is bounded (``limit`` lines, read 1 MiB at a time from the start of
the first splits), so the driver computes it itself: the blocking contract check
then never waits for Spark to start, while the executors still do all the
per-record work that grows with the batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.filedrop.files import DroppedFile
from idem_platform.filedrop.reader import read_split


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


def coerced_sample(files: tuple[DroppedFile, ...], spec: RecordSpec, limit: int) -> pa.Table:
    """Up to ``limit`` coerced rows from the start of ``files`` (the ``coerced`` frame's schema)."""
    return pa.Table.from_batches(list(_sample(files, spec, limit)), schema=spec.output_schema())
