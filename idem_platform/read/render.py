"""``idem read``'s lines: each row of a read as one JSON object, rendered on the executors.

The shape is the one ``idem read`` printed before reads went through Spark (a row
as PostgreSQL's ``to_jsonb`` renders it), so scripts that read it keep working:
every column under its name, JSON columns (``_payload``, ``props``, ``dynamic``
columns, ``_kafka``) as JSON, timestamps as ``2026-01-31T11:00:00.5+00:00``, vectors
as arrays of their ``real`` values, and a retyped column as its typed value where
there is one, else its text (its companion column is not shown beside it). Keys come
in the frame's column order, and ``_schema_version`` is the current version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from idem_platform.read.plan import ERROR_COLUMN, ReadPlan
from idem_platform.read.upgrade import RAISE, upgraded_partition

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
    companions = {c.typed_column: c.name for c in plan.spec.retyped_columns()}
    shown: list[str] = []
    columns: list[list[Any]] = []
    retyped: dict[str, list[Any]] = {}
    for column in plan.columns:
        if column.role == "error":
            continue
        values = _values(batch.column(column.name), column.kind)
        if column.role == "companion":
            retyped[companions[column.name]] = values
            continue
        shown.append(column.name)
        columns.append(values)
    for name, typed in retyped.items():  # a retyped column: its typed value, else its text
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


def rendered_partition(plan: ReadPlan, index: int, mode: str = RAISE) -> Iterator[pa.RecordBatch]:
    """Partition ``index`` of the plan as ``idem read``'s lines (:func:`render_batch`): what the
    ``idem_table`` source yields on an executor when asked to render."""
    for batch in upgraded_partition(plan, index, mode):
        yield render_batch(batch, plan)


def lines_in_process(plan: ReadPlan, mode: str = RAISE) -> Iterator[str | None]:
    """``idem read``'s lines of a plan whose rows are all current, rendered here, without Spark.

    The same code the executors run (:func:`rendered_partition`), partition after partition
    in order, so the lines are byte for byte those of the Spark read
    (``idem_platform_tests/read/test_read_types.py`` compares both). A Spark session costs
    a small read most of its time (see ``docs/operations.md``), and rows at the current
    version need no migration, so nothing here needs an executor. A row that is older
    all the same (written by a process with an older config since the plan counted) is
    upgraded like on an executor; ``None`` for a row whose upgrade failed (``keep``).
    """
    for index in plan.indexes():
        for batch in rendered_partition(plan, index, mode):
            errors = batch.column("error")
            lines = batch.column("line").to_pylist()
            if errors.null_count == len(errors):
                yield from lines
                continue
            for line, error in zip(lines, errors.to_pylist(), strict=True):
                yield None if error is not None else line
