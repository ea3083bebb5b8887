"""Types of the optional C extension built from ``_native.c`` (see ``native.py``).

The signatures mirror the docstrings of ``_native.c``'s entry points, so that mypy
checks ``native.py``'s callers the same whether or not the extension is built.
"""

from typing import Any

from idem_platform.coercion.native import BatchPlan

def canonical_line(
    line: bytes, shallow: frozenset[str], /
) -> tuple[dict[str, Any], bytes, str] | None: ...
def coerce_lines(raws: list[Any], plan: BatchPlan, /) -> None: ...
def columns(records: list[dict[str, Any]], names: tuple[str, ...], /) -> list[list[Any]]: ...
