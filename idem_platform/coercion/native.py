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
with it byte for byte, which ``idem_platform_tests/coercion/test_native.py`` checks on
generated records and the spec vectors.

On the commit path it goes one step further (``DirectRows`` in
:mod:`~idem_platform.coercion.records`): an ordinary record whose every value is of the
plain kind becomes its staging row in PostgreSQL's binary COPY format straight from the
line, with no Python object, Arrow array or pgpq pass at all; the Arrow path would stage
the same bytes, which ``idem_platform_tests/coercion/test_direct_rows.py`` checks in PostgreSQL.

The boundary is a typed plan (:class:`BatchPlan` and its parts, built in one place,
``records._batch_plan``), which the C path reads by attribute name and checks once per
batch: a wrong or incomplete plan is a ``TypeError`` or ``ValueError`` naming the attribute.
One call per batch takes the records it is sure of and hands each other one, in input
order, to the Python loop (``BatchPlan.decline``). The C module keeps no buffer of its own
between calls (each call has its scratch), so a call made while another runs, from a
collector callback or another thread, is safe; and it untracks the JSON trees it builds
from the cyclic garbage collector (they cannot hold cycles), so a batch's kept records do
not set off the collector's full passes.

``IDEM_NATIVE=0`` in the environment turns it off (the Python path alone).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from idem_platform.settings import native_allowed

# The plan ``_native.coerce_lines`` reads, by attribute name, once per batch: named and
# typed here, checked attribute by attribute in C (a wrong or missing one is a TypeError
# or ValueError naming it, never a crash). records.py builds them in one place
# (``_batch_plan``); the lists, dicts and bytearrays they hold are the batch's own, which
# both paths append to.


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """One record type on the dict path: where its rows go and what its records may hold.

    Attributes:
        rows: the table's output row numbers (``_TableRows.rows``).
        records: the table's records (``_TableRows.records``).
        known: the field names that are never unknown, or ``None`` (a ``drop`` table
            never looks at unknown fields).
        current: the table's current schema version.
        table: handed to ``BatchPlan.on_unknown`` with a record that has unknown fields.
    """

    rows: list[int]
    records: list[dict[str, Any]]
    known: frozenset[str] | None
    current: int
    table: object


@dataclass(frozen=True, slots=True)
class DirectRoute:
    """One record type on the direct path: its columns' shapes and where its COPY rows go.

    Attributes:
        fields: column name -> its index; ignored fields (the id, version and type fields and
            ``ignored_fields``) -> -1.
        kinds: one letter per column (``s i l r b t v d``: string, int, long, real, bool,
            timestamp, vector, dynamic).
        required: one byte per column, 1 if the column is required.
        dims: per column, its vector dimension (0 for other kinds).
        emitted: how many columns the row holds (all but the ``dynamic`` ones).
        drop_unknown: the table's contract is ``drop`` (unknown fields stay in ``_payload``).
        rows, keys, ends: ``DirectRows``' buffers of this record type.
    """

    fields: dict[str, int]
    kinds: bytes
    required: bytes
    dims: tuple[int, ...]
    emitted: int
    drop_unknown: bool
    rows: bytearray
    keys: list[str]
    ends: list[int]


@dataclass(frozen=True, slots=True)
class DirectPlan:
    """What the C path needs to write direct rows (``DirectRows``) for a batch.

    Attributes:
        routes: record type -> its :class:`DirectRoute`.
        pos, offsets, units: per input line, its ``_pos``, offset and unit (native int64s).
        prefixes: per unit, its position prefix (UTF-8).
        type_field: the field naming the record type (``None``: a fixed record type).
        id_field, version_field: the id and schema-version fields.
    """

    routes: dict[str, DirectRoute]
    pos: bytes
    offsets: bytes
    units: bytes
    prefixes: list[bytes]
    type_field: str | None
    id_field: str
    version_field: str | None


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """One batch for ``_native.coerce_lines``: the output lists both paths append to, the
    batch's rules, the task's repeat memories and the Python loop for every declined record.

    Attributes:
        out_input, out_type, ..., out_errors: the output columns (``_coerce_batch``'s lists).
        routes: record type -> its :class:`RoutePlan`.
        fixed_type: the connector's one record type, or ``None`` (routed by ``type_field``).
        type_field, id_field, connector, version_field: as in ``RecordSpec``.
        declared: the connector's declared schema version, or ``None``.
        shallow: fields whose values are never read (see ``canonical_line``).
        too_long: input indexes of records over ``max_line_bytes``.
        max_key: the longest idempotency key kept as it is.
        seen_lines, seen_keys, skipped, fresh: ``RepeatedLines``' memories, or all ``None``.
        in_batch: ``(input index, row of its first occurrence)`` of in-batch repeats.
        on_unknown: ``(table, record, record type) -> (_extra, _props)``.
        decline: the Python loop's body, called with the index of every record the C path
            hands over (the C path goes on with the next record once it returns).
        direct: the direct rows' plan, or ``None``.
    """

    out_input: list[int]
    out_type: list[str | None]
    out_key: list[str | None]
    out_ext: list[str | None]
    out_hash: list[str | None]
    out_payload: list[bytes | None]
    out_extra: list[str | None]
    out_props: list[str | None]
    out_errors: list[str | None]
    routes: dict[str, RoutePlan]
    fixed_type: str | None
    type_field: str | None
    id_field: str
    connector: str
    version_field: str
    declared: int | None
    shallow: frozenset[str]
    too_long: set[int]
    max_key: int
    seen_lines: dict[bytes, str | int] | None
    seen_keys: dict[str, str | int] | None
    skipped: dict[str, int] | None
    fresh: list[tuple[bytes | None, str, int]] | None
    in_batch: list[tuple[int, int]]
    on_unknown: Callable[[Any, dict[str, Any], str], tuple[str | None, str | None]]
    decline: Callable[[int], object]
    direct: DirectPlan | None


_CoerceLines = Callable[[list[Any], BatchPlan], None]
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


def coerce_lines(raws: list[Any], plan: BatchPlan) -> None:
    """Run the batch's per-record loop: the C path takes the records it is sure of and calls
    ``plan.decline(i)`` (the Python loop's body) for each other one, in input order, so the
    output rows stay in input order. One call per batch: the plan is read and checked once."""
    assert _coerce_lines is not None
    _coerce_lines(raws, plan)


def columns(records: list[dict[str, Any]], names: tuple[str, ...]) -> list[list[Any]]:
    """Per name, its value in every record (``None`` where missing).

    In C when built: one pass over the records, each dict read while it is in cache,
    instead of one ``map(dict.get)`` pass per column over dicts scattered in memory.
    """
    if _columns is not None:
        return _columns(records, names)
    return [list(map(dict.get, records, repeat(name))) for name in names]
