"""Types of the optional C extension built from ``_native.c`` (see ``native.py``).

The signatures mirror the docstrings of ``_native.c``'s entry points, so that mypy
checks ``native.py``'s callers the same whether or not the extension is built.
"""

from typing import Any

from idem_platform.coercion.native import DirectWrite, LineFacts, ScanPlan

def canonical_line(
    line: bytes, shallow: frozenset[str], /
) -> tuple[dict[str, Any], bytes, str] | None: ...
def scan_lines(raws: list[Any], plan: ScanPlan, facts: LineFacts, /) -> None: ...
def write_direct(plan: DirectWrite, /) -> None: ...
def columns(records: list[dict[str, Any]], names: tuple[str, ...], /) -> list[list[Any]]: ...
def gather(data: bytes | bytearray, ends: list[int], order: list[int], /) -> bytes: ...
