"""``idem read``'s lines: each row of a read as one JSON object, rendered on the executors.

The shape is the one ``idem read`` printed before reads went through Spark (a row
as PostgreSQL's ``to_jsonb`` renders it), so scripts that read it keep working:
every column under its name, JSON columns (``_payload``, ``props``, ``dynamic``
columns, ``_kafka``) as JSON, timestamps as ``2026-01-31T11:00:00.5+00:00``, vectors
as arrays of their ``real`` values, and a promoted column as its typed value where
there is one, else its text (its companion column is not shown beside it). Keys come
in the frame's column order, and ``_schema_version`` is the current version.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from idem_platform.read.plan import ERROR_COLUMN, ReadPlan

# What the data source yields when asked to render (:func:`render_batch`): the line, why the
# row's migration failed (keep mode), and the columns `idem read` orders by.
RENDERED_DDL = "line string, error string, _ingested_at timestamp, _idempotency_key string"


def _timestamps(array: pa.Array) -> pa.Array:
    """``2026-01-31T11:00:00.5+00:00``: PostgreSQL's JSON form (trailing zeros of the fraction dropped)."""
    # The UTC wall time as text ("2026-01-31 11:00:00.500000"): 20x cheaper than strftime,
    # which looks the zone up per value.
    text = array.cast(pa.timestamp("us")).cast(pa.string())
    text = pc.replace_substring_regex(pc.replace_substring(text, " ", "T"), pattern=r"\.?0+$", replacement="")
    return pc.binary_join_element_wise(text, pa.scalar("+00:00"), "")


def _vectors(array: pa.Array) -> list[Any]:
    """Each vector as JSON text (its ``real`` values written shortest, like PostgreSQL)."""
    array = array.cast(pa.list_(pa.float32()))
    items = pa.ListArray.from_arrays(array.offsets, array.values.cast(pa.string()), mask=array.is_null())
    joined = pc.binary_join_element_wise(pa.scalar("["), pc.binary_join(items, ","), pa.scalar("]"), "")
    return [None if text is None else orjson.Fragment(text) for text in joined.to_pylist()]


def _values(array: pa.Array, kind: str) -> list[Any]:
    """One column as JSON-ready Python values."""
    if kind == "json":
        return [None if text is None else orjson.Fragment(text) for text in array.to_pylist()]
    if kind == "timestamp":
        return _timestamps(array).to_pylist()
    if kind == "vector":
        return _vectors(array)
    return array.to_pylist()


def render_batch(batch: pa.RecordBatch, plan: ReadPlan) -> pa.RecordBatch:
    """One batch of the source frame as ``(line, error)``."""
    companions = {c.typed_column: c.name for c in plan.spec.promoted_columns()}
    shown: list[str] = []
    columns: list[list[Any]] = []
    promoted: dict[str, list[Any]] = {}
    for column in plan.columns:
        if column.role == "error":
            continue
        values = _values(batch.column(column.name), column.kind)
        if column.role == "companion":
            promoted[companions[column.name]] = values
            continue
        shown.append(column.name)
        columns.append(values)
    for name, typed in promoted.items():  # a promoted column: its typed value, else its text
        index = shown.index(name)
        columns[index] = [text if value is None else value for value, text in zip(typed, columns[index], strict=True)]
    errors = batch.column(ERROR_COLUMN)
    failed = errors.null_count < len(errors)
    lines: list[str | None] = []
    for row, row_values in enumerate(zip(*columns, strict=True)):
        if failed and errors[row].is_valid:
            lines.append(None)
            continue
        lines.append(orjson.dumps(dict(zip(shown, row_values, strict=True))).decode("utf-8"))
    return pa.RecordBatch.from_arrays(
        [pa.array(lines, pa.string()), errors, batch.column("_ingested_at"), batch.column("_idempotency_key")],
        names=["line", "error", "_ingested_at", "_idempotency_key"],
    )
