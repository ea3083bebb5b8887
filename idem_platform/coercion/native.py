"""The per-record loop's C path: the records it is sure of, in C; every other one in Python.

:func:`~idem_platform.coercion.records.coerce_batch` spends ~17 µs of Python per
threat-feed record: orjson's parse and sorted dump, the checks that make orjson's
output the contract's bytes, SHA-1, routing, the key, and a dozen appends. The
extension ``_native`` (``_native.c``, built by ``pip install`` when a C compiler
and OpenSSL's headers are there; optional) does all of that for the ordinary
record in one pass over its bytes and appends to the very lists and dicts the
Python loop uses. It hands a record back to the Python loop, untouched, whenever
the Python loop could answer differently or words a reject: blank or non-object
lines, anything its strict parser doubts (invalid JSON or UTF-8, NUL, lone
surrogates, repeated keys, non-finite floats, huge integers, numbers PostgreSQL's
numeric cannot hold as ``_payload`` keeps them, deep nesting), a record type, id,
schema version or key that is not the plain kind, unknown fields.
So the Python loop stays the definition; the C path is a shortcut that must agree
with it byte for byte, which ``idem_platform_tests/test_native.py`` checks on
generated records and the spec vectors.

On the commit path it goes one step further (``DirectRows`` in
:mod:`~idem_platform.coercion.records`): an ordinary record whose every value is of the
plain kind becomes its staging row in PostgreSQL's binary COPY format straight from the
line, with no Python object, Arrow array or pgpq pass at all; the Arrow path would stage
the same bytes, which ``idem_platform_tests/test_direct_rows.py`` checks in PostgreSQL.

``IDEM_NATIVE=0`` in the environment turns it off (the Python path alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

from idem_platform.settings import native_allowed

_CoerceLines = Callable[[list[Any], int, tuple[Any, ...]], int]
_CanonicalLine = Callable[[bytes, frozenset[str]], tuple[dict[str, Any], bytes, str] | None]
_Columns = Callable[[list[dict[str, Any]], tuple[str, ...]], list[list[Any]]]


def _load() -> tuple[_CoerceLines | None, _CanonicalLine | None, _Columns | None]:
    """The extension's entry points, or ``None`` each when it is not built.

    A function rather than a module-level ``try`` so each name has one type
    (``_native.pyi`` types the extension), built or not.
    """
    try:
        from idem_platform.coercion import _native
    except ImportError:  # no compiler at install time: the Python path alone
        return None, None, None
    return _native.coerce_lines, _native.canonical_line, _native.columns


_coerce_lines, canonical_line, _columns = _load()

AVAILABLE = _coerce_lines is not None


def enabled() -> bool:
    """Whether batches take the C path (built, and not turned off by ``IDEM_NATIVE=0``)."""
    return AVAILABLE and native_allowed()


def declined(raws: list[Any], plan: tuple[Any, ...]) -> Iterator[int]:
    """The indexes of the records the C path hands to the Python loop, in order.

    The C path runs from the record after the last one handed over: the Python loop
    has finished that record (appended its row or counted it) before the generator
    is resumed, so rows stay in input order.
    """
    assert _coerce_lines is not None
    n = len(raws)
    i = 0
    while i < n:
        i = _coerce_lines(raws, i, plan)
        if i < n:
            yield i
            i += 1


def columns(records: list[dict[str, Any]], names: tuple[str, ...]) -> list[list[Any]]:
    """Per name, its value in every record (``None`` where missing).

    In C when built: one pass over the records, each dict read while it is in cache,
    instead of one ``map(dict.get)`` pass per column over dicts scattered in memory.
    """
    if _columns is not None:
        return _columns(records, names)
    return [list(map(dict.get, records, repeat(name))) for name in names]
