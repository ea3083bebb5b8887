"""One converter per catalog type: a JSON value in, the Arrow-ready Python value out.

Every converter either returns a value or raises :class:`FieldError` naming the
field, the (shortened) value, what was expected and the rule, e.g.
``field 'confidence': 3000000000 out of int32 range``. Nothing is silently
wrapped, truncated, nulled or reinterpreted (an epoch in nanoseconds stays
nanoseconds, NaN never passes). Converters are built once per column and called
per value inside Spark's Python workers, so they stay small and branch-light.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from idem_platform.coercion.timestamps import NS_MAX, NS_MIN, TimestampError, parse_rfc3339_ns
from idem_platform.contract.canonical import canonical_value_bytes
from idem_platform.contract.catalog import Column

Converter = Callable[[Any], Any]
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
FLOAT32_MAX = 3.4028234663852886e38
_SHOW_LIMIT = 40


class FieldError(ValueError):
    """A value that does not fit its column; ``to_json`` is what ``idem.rejects`` stores."""

    def __init__(self, field: str, rule: str, message: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"field '{field}': {message}")

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "rule": self.rule, "message": str(self)}


def show(value: Any) -> str:
    """A value as JSON text, shortened for messages."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 1] + "…"


def json_kind(value: Any) -> str:
    """The JSON name of a Python value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _integer(name: str, bounds: tuple[int, int], label: str) -> Converter:
    low, high = bounds

    def convert(value: Any) -> int:
        if type(value) is int:
            number = value
        elif type(value) is float:
            if not value.is_integer():
                raise FieldError(name, "type", f"{show(value)} is not an integer")
            number = int(value)
        else:
            raise FieldError(name, "type", f"expected an integer, got {json_kind(value)} {show(value)}")
        if number < low or number > high:
            raise FieldError(name, "range", f"{show(value)} out of {label} range")
        return number

    return convert


def _real(name: str) -> Converter:
    def convert(value: Any) -> float:
        kind = type(value)
        if kind is float:
            return value
        if kind is int:
            try:
                return float(value)
            except OverflowError:
                raise FieldError(name, "range", f"{show(value)} out of double range") from None
        raise FieldError(name, "type", f"expected a number, got {json_kind(value)} {show(value)}")

    return convert


def _bool(name: str) -> Converter:
    def convert(value: Any) -> bool:
        if value is True or value is False:
            return value
        raise FieldError(name, "type", f"expected true or false, got {json_kind(value)} {show(value)}")

    return convert


def _string(name: str) -> Converter:
    def convert(value: Any) -> str:
        if type(value) is str:
            return value
        return canonical_value_bytes(value).decode("ascii")

    return convert


def _timestamp(name: str) -> Converter:
    def convert(value: Any) -> int:
        kind = type(value)
        if kind is str:
            try:
                return parse_rfc3339_ns(value)
            except TimestampError as exc:
                raise FieldError(name, exc.rule, f"{show(value)} {exc}") from None
        if kind is int:
            if NS_MIN <= value <= NS_MAX:
                return value
            raise FieldError(name, "range", f"{show(value)} out of range for epoch nanoseconds")
        raise FieldError(
            name,
            "type",
            f"expected an RFC3339 string or integer epoch nanoseconds, got {json_kind(value)} "
            f"{show(value)}",
        )

    return convert


def _vector(name: str, dim: int) -> Converter:
    def convert(value: Any) -> list[float]:
        if type(value) is not list:
            raise FieldError(name, "type", f"expected an array of {dim} numbers, got {json_kind(value)}")
        if len(value) != dim:
            raise FieldError(name, "length", f"expected {dim} elements, got {len(value)}")
        out = []
        for index, item in enumerate(value):
            kind = type(item)
            if kind is not float and kind is not int:
                what = "null" if item is None else f"{json_kind(item)} {show(item)}"
                raise FieldError(name, "type", f"element {index} is {what}, not a number")
            if not -FLOAT32_MAX <= item <= FLOAT32_MAX:
                raise FieldError(name, "range", f"element {index} ({show(item)}) out of float32 range")
            # A float: Arrow refuses an int float32 cannot hold exactly (16777217), failing the batch.
            out.append(float(item))
        return out

    return convert


def _dynamic(name: str) -> Converter:
    def convert(value: Any) -> bytes:
        return canonical_value_bytes(value)

    return convert


def converter_for(column: Column) -> Converter:
    """The converter of one column (nulls are handled by the caller)."""
    kind = column.type.kind
    name = column.name
    if kind == "int":
        return _integer(name, INT32, "int32")
    if kind == "long":
        return _integer(name, INT64, "int64")
    if kind == "real":
        return _real(name)
    if kind == "bool":
        return _bool(name)
    if kind == "string":
        return _string(name)
    if kind == "timestamp":
        return _timestamp(name)
    if kind == "vector":
        if column.type.dim is None:
            raise ValueError(f"column {name!r}: a vector type needs its dimension")
        return _vector(name, column.type.dim)
    if kind == "dynamic":
        return _dynamic(name)
    raise AssertionError(f"unhandled catalog type {kind}")

