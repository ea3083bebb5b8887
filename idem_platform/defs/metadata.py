"""Turning core dictionaries into Dagster metadata the UI renders well."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

_BINARY_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(size: int) -> str:
    """``size`` in binary units as people write them (``1 GiB``, ``64 MiB``, ``1.5 KiB``):
    descriptions in the UI are read, and ``1073741824 bytes`` is not."""
    value = float(size)
    for unit in _BINARY_UNITS:
        if abs(value) < 1024 or unit == _BINARY_UNITS[-1]:
            text = f"{value:.1f}".removesuffix(".0")
            if unit == "bytes":
                return "1 byte" if size == 1 else f"{size:,} bytes"
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def to_metadata(values: Mapping[str, Any]) -> dict[str, dg.MetadataValue]:
    """Scalars stay scalars (sortable, plottable); lists and dicts become JSON."""
    out: dict[str, dg.MetadataValue] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[key] = dg.MetadataValue.bool(value)
        elif isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(value)
        elif isinstance(value, str):
            out[key] = dg.MetadataValue.text(value)
        elif value is None:
            out[key] = dg.MetadataValue.null()
        else:
            out[key] = dg.MetadataValue.json(value)
    return out
