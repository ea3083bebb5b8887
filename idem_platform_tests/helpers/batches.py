"""Arrow batches shaped like what the file-drop reader hands to coercion."""

from __future__ import annotations

import pyarrow as pa


def lines_batch(lines: list[bytes], first_line: int = 1, file_index: int = 0) -> pa.RecordBatch:
    """An ``ingest``-frame batch (``RECORDS_SCHEMA``) of a file's ``lines``, numbered from ``first_line``."""
    from idem_platform.write.batch import RECORDS_SCHEMA

    return pa.RecordBatch.from_arrays(
        [
            pa.array([file_index] * len(lines), pa.int32()),
            pa.array(range(first_line, first_line + len(lines)), pa.int64()),
            pa.array(lines, pa.binary()),
            pa.array([len(line) for line in lines], pa.int64()),
            pa.nulls(len(lines), pa.string()),
            pa.nulls(len(lines), pa.int64()),
        ],
        schema=RECORDS_SCHEMA,
    )
