"""Column-at-a-time conversion: Arrow's C++ converters first, the exact per-value rules on any doubt.

The per-value converters in :mod:`converters` are the contract. Here each column
of a batch is first scanned for the Python types it holds; when they are the
plain ones (only ints for an ``int`` column, only RFC 3339-shaped strings for a
``timestamp``...) the whole column goes through Arrow in one call, which is 5-20x
cheaper than a Python call per value. Whenever that fast path could disagree with
the contract (a float in an int column: Arrow would truncate it; a bool in a real
column: Arrow would make it 1.0; anything Arrow refuses), the column falls back
to the per-value converters, which produce the exact errors.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from idem_platform.coercion.converters import FLOAT32_MAX, FieldError, converter_for
from idem_platform.contract.catalog import Column

RFC3339_SHAPE = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
_NONE = type(None)
_INTS = {int, _NONE}
_NUMBERS = {int, float, _NONE}
_BOOLS = {bool, _NONE}
_STRS = {str, _NONE}
_LISTS = {list, _NONE}
_ELEMENTS = {int, float}
ColumnErrors = list[tuple[int, dict[str, Any]]]


def _fast(column: Column, values: list[Any], kinds: set[type]) -> pa.Array | None:
    """The whole column through Arrow, or ``None`` when only the exact path may decide."""
    kind = column.type.kind
    target = column.type.arrow
    try:
        if kind in ("int", "long"):
            return pa.array(values, type=target) if kinds <= _INTS else None
        if kind == "real":
            return pa.array(values, type=target) if kinds <= _NUMBERS else None
        if kind == "bool":
            return pa.array(values, type=target) if kinds <= _BOOLS else None
        if kind == "string":
            return pa.array(values, type=target) if kinds <= _STRS else None
        if kind == "timestamp":
            if kinds <= _STRS:
                text = pa.array(values, type=pa.string())
                if not pc.all(pc.match_substring_regex(text, RFC3339_SHAPE)).as_py():
                    return None
                return pc.cast(text, target)
            if kinds <= _INTS:
                return pa.array(values, type=pa.int64()).cast(target)
            return None
        if kind == "vector":
            if not kinds <= _LISTS:
                return None
            if not set(map(type, chain.from_iterable(v for v in values if v is not None))) <= _ELEMENTS:
                return None
            lists = pa.array(values, type=pa.list_(pa.float64()))
            bounds = pc.min_max(pc.list_value_length(lists))
            if {bounds["min"].as_py(), bounds["max"].as_py()} - {None, column.type.dim}:
                return None
            flat = lists.flatten()
            if len(flat) and pc.max(pc.abs(flat)).as_py() > FLOAT32_MAX:
                return None
            return lists.cast(pa.list_(pa.float32())).cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    return None


def _exact(column: Column, values: list[Any]) -> tuple[pa.Array, ColumnErrors]:
    """Every value through the contract's converter; errors kept per row."""
    convert = converter_for(column)
    out: list[Any] = []
    errors: ColumnErrors = []
    for index, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(convert(value))
        except FieldError as exc:
            errors.append((index, exc.to_json()))
            out.append(None)
    return pa.array(out, type=column.type.arrow), errors


def _required(column: Column, problem: str) -> str:
    """The reject message of a null or missing required value, naming what needs it."""
    need = {"order": " (the order_by of an upsert table)", "identity": " (the identity of an upsert table)"}
    return f"field '{column.name}': {problem}{need.get(column.rule, '')}"


def convert_column(
    column: Column, values: list[Any], present: list[bool] | None = None, *, dynamic_values: bool = True
) -> tuple[pa.Array, ColumnErrors]:
    """Convert one column of a batch.

    Args:
        column: the catalog column.
        values: one value per row (``None`` for null or missing).
        present: per row, whether the field was present (for the required
            message: ``required but null`` vs ``required but missing``).
        dynamic_values: render ``dynamic`` values (canonical JSON). The commit
            path passes ``False``: PostgreSQL takes them from ``_payload``.

    Returns:
        The Arrow array (null where a value failed) and ``(row, error)`` pairs.
    """
    errors: ColumnErrors = []
    kinds = set(map(type, values))
    if column.type.kind == "dynamic":
        if dynamic_values:
            array, errors = _exact(column, values)
        else:
            array = pa.nulls(len(values), type=column.type.arrow)
    else:
        fast = _fast(column, values, kinds)
        if fast is None:
            array, errors = _exact(column, values)
        else:
            array = fast
    if column.required and _NONE in kinds:
        name = column.name
        for index in np.flatnonzero(np.fromiter((v is None for v in values), dtype=bool, count=len(values))):
            problem = "required but null" if present is not None and present[index] else "required but missing"
            errors.append((int(index), {"field": name, "rule": column.rule, "message": _required(column, problem)}))
        errors.sort(key=lambda item: item[0])
    return array, errors

