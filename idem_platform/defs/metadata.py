"""Turning core dictionaries into Dagster metadata the UI renders well."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg


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
