"""Read one split of a dropped file as Arrow batches of records (lines); runs on executors.

Lines are cut with numpy over 4 MiB blocks and handed to Arrow zero-copy (each
element keeps its trailing ``\\n``; the coercion strips it), so there is no
per-line Python here. A line longer than ``max_line_bytes`` is not accumulated:
its first bytes and its true length are kept and the rest is skipped, so one
2 GB line cannot exhaust an executor's memory; it becomes a reject.

Whether a line arrives whole or as its head depends on where the blocks fall, so
both must lead to the same outcome: the head is always the line's first
:data:`HEAD_BYTES` (what a reject keeps, plus a BOM line 1 may start with), and a
line is only cut when it is over the limit even without that BOM.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from idem_platform.coercion.records import RAW_CAP, UTF8_BOM
from idem_platform.errors import FileChangedError
from idem_platform.sources.filedrop.files import DroppedFile, Split
from idem_platform.write.batch import RECORDS_SCHEMA

BLOCK_BYTES = 4 << 20
HEAD_BYTES = RAW_CAP + len(UTF8_BOM)  # the coercion drops a BOM opening line 1, then keeps RAW_CAP


def _batch(file_index: int, first_line: int, data: bytes, offsets: np.ndarray) -> pa.RecordBatch:
    count = len(offsets) - 1
    raw = pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )
    lengths = np.diff(offsets).astype(np.int64)
    ends_with_newline = np.frombuffer(data, dtype=np.uint8)[offsets[1:] - 1] == 10
    lengths -= ends_with_newline
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(count, file_index, dtype=np.int32)),
            pa.array(np.arange(first_line, first_line + count, dtype=np.int64)),
            raw,
            pa.array(lengths),
            pa.nulls(count, pa.string()),  # a line has no source metadata
            pa.nulls(count, pa.int64()),  # nor a timestamp of its own
        ],
        schema=RECORDS_SCHEMA,
    )


def _single(file_index: int, line: int, head: bytes, length: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([file_index], pa.int32()),
            pa.array([line], pa.int64()),
            pa.array([head], pa.binary()),
            pa.array([length], pa.int64()),
            pa.nulls(1, pa.string()),
            pa.nulls(1, pa.int64()),
        ],
        schema=RECORDS_SCHEMA,
    )


def _fill_head(head: bytes, data: bytes, end: int) -> bytes:
    """``head`` grown from ``data[:end]`` (the same line's next bytes) up to :data:`HEAD_BYTES`."""
    missing = HEAD_BYTES - len(head)
    return head + data[: min(missing, end)] if missing > 0 else head


def read_split(
    file: DroppedFile, split: Split, file_index: int, *, max_line_bytes: int, block_bytes: int = BLOCK_BYTES
) -> Iterator[pa.RecordBatch]:
    """Yield the split's lines as batches of :data:`RECORDS_SCHEMA` (``_unit`` = ``file_index``).

    Raises:
        FileChangedError: the file's size or the split's CRC-32 differ from when
            it was hashed (the batch must fail rather than commit other bytes).
    """
    if os.stat(file.path).st_size != file.size:
        raise FileChangedError(f"{file.path} changed size since it was hashed ({file.key})")
    line = split.first_line
    carry = b""
    oversize_head: bytes | None = None
    oversize_length = 0
    crc = 0
    with open(file.path, "rb", buffering=0) as handle:
        handle.seek(split.start)
        remaining = split.end - split.start
        while remaining > 0:
            block = handle.read(min(block_bytes, remaining))
            if not block:
                raise FileChangedError(f"{file.path} is shorter than when it was hashed ({file.key})")
            remaining -= len(block)
            crc = zlib.crc32(block, crc)
            data = carry + block if carry else block
            newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
            start = 0
            if oversize_head is not None:
                end = int(newlines[0]) if len(newlines) else len(data)
                oversize_head = _fill_head(oversize_head, data, end)
                oversize_length += end
                if len(newlines) == 0:
                    carry = b""
                    continue
                yield _single(file_index, line, oversize_head, oversize_length)
                line += 1
                oversize_head = None
                start = int(newlines[0]) + 1
                newlines = newlines[1:]
            if len(newlines):
                offsets = np.concatenate(([start], newlines + 1)).astype(np.int64)
                yield _batch(file_index, line, data, offsets)
                line += len(newlines)
                start = int(offsets[-1])
            carry = data[start:]
            if len(carry) > max_line_bytes + len(UTF8_BOM):
                oversize_head, oversize_length, carry = carry[:HEAD_BYTES], len(carry), b""
    if crc != split.crc32:
        raise FileChangedError(f"{file.path} changed since it was hashed ({file.key}); nothing was committed")
    if oversize_head is not None:
        yield _single(file_index, line, oversize_head, oversize_length)
    elif carry:
        yield _single(file_index, line, carry, len(carry))
