"""The hot part of a batch in C: each line's facts, and the direct rows' COPY tuples.

:func:`~idem_platform.coercion.records.coerce_batch` spends ~12 µs of Python per
threat-feed record on the Python path, most of it on orjson's parse and sorted dump,
the checks that make orjson's output the contract's bytes, and SHA-1. The extension
``_native`` (``_native.c``, built by ``pip install`` when a C compiler and OpenSSL's
headers are there; optional) does that part in one pass over a line's bytes and hands
back the line's *facts* (:class:`LineFacts`): its record and the SHA-1 of its canonical
bytes, or, for a plain record on the commit path, its type, id and SHA-1 and its typed
columns already in PostgreSQL's binary COPY format. It decides nothing: where its strict
parser doubts a line (invalid JSON or UTF-8, NUL, lone surrogates, repeated keys,
non-finite floats, huge integers, numbers PostgreSQL's numeric cannot hold as ``_payload``
keeps them, deep nesting, not an object) the line has no facts and the Python path parses
it. Every rule (routing, ids, keys, repeats, versions, unknown fields, contract modes)
is :mod:`~idem_platform.coercion.rules`' and :mod:`~idem_platform.coercion.records`', the
same on both paths; ``idem_platform_tests/coercion/test_native.py`` and ``test_fuzz.py``
check that both give the same bytes.

On the commit path the kept direct lines become their staging rows in a second call
(:func:`write_direct`), with the keys the rules gave them: no Python object, Arrow array or
pgpq pass per record (``idem_platform_tests/coercion/test_direct_rows.py`` checks in
PostgreSQL that they stage what the Arrow path would).

The boundary is typed plans (:class:`ScanPlan`, :class:`DirectLayout`, :class:`LineFacts`,
:class:`DirectWrite`), which C reads by attribute name and checks once per call: a wrong or
incomplete plan is a ``TypeError`` or ``ValueError`` naming the attribute, never a crash.
The C module keeps no buffer of its own between calls (each call has its scratch), so a
call made while another runs, from a collector callback or another thread, is safe; it
untracks the JSON trees it builds from the cyclic garbage collector (they cannot hold
cycles), so a batch's records do not set off the collector's full passes.

``IDEM_NATIVE=0`` in the environment turns it off (the Python path alone).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from idem_platform.settings import native_allowed

# The plans the C entry points read, by attribute name, once per call (checked attribute by
# attribute in C: a wrong or missing one is a TypeError or ValueError naming it, never a crash).


@dataclass(frozen=True, slots=True)
class DirectLayout:
    """One record type's typed columns, as the direct facts write them.

    Attributes:
        fields: column name -> its index; ignored fields (the id, version and type fields and
            ``ignored_fields``) -> -1. Any other field is an unknown one (``LineFacts.kinds`` 3).
        kinds: one letter per column (``s i l r b t v d``: string, int, long, real, bool,
            timestamp, vector, dynamic).
        required: one byte per column, 1 if the column is required.
        dims: per column, its vector dimension (0 for other kinds).
        emitted: how many columns the row holds (all but the ``dynamic`` ones).
    """

    fields: dict[str, int]
    kinds: bytes
    required: bytes
    dims: tuple[int, ...]
    emitted: int


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """What :func:`scan_lines` needs to find a batch's facts.

    Attributes:
        shallow: fields whose values are never read (see ``canonical_line``).
        layouts: record type -> its :class:`DirectLayout`, for direct facts; ``None``: records only.
        fixed_type: the connector's one record type, or ``None`` (routed by ``type_field``).
        type_field, id_field, version_field: as in ``RecordSpec`` (``type_field`` ``None`` with a
            fixed type).
    """

    shallow: frozenset[str]
    layouts: dict[str, DirectLayout] | None
    fixed_type: str | None
    type_field: str | None
    id_field: str
    version_field: str | None


@dataclass(frozen=True, slots=True)
class LineFacts:
    """Per input line, what :func:`scan_lines` found (one entry per line in each list).

    Attributes:
        kinds: 0 (no facts: the Python path parses the line), 1 (its record and digest),
            2 (direct facts: its type, id, digest and typed columns), 3 (direct facts, and a
            field its layout does not know).
        records: the parsed record (kind 1), else ``None``.
        digests: the SHA-1 hex of its canonical bytes (kinds 1 to 3).
        types: the record type field's value (kinds 2 and 3, routed by field), else ``None``.
        ids: the id field's value, a plain non-empty string (kinds 2 and 3).
        tails: the typed columns in PostgreSQL's binary COPY format (kinds 2 and 3).
    """

    kinds: bytearray
    records: list[dict[str, Any] | None]
    digests: list[str | None]
    types: list[str | None]
    ids: list[str | None]
    tails: list[bytes | None]


@dataclass(frozen=True, slots=True)
class DirectWrite:
    """What :func:`write_direct` needs to write one record type's kept direct rows.

    Attributes:
        lines: the input lines to write (each with direct facts), in order.
        keys: each one's idempotency key (as the rules gave it).
        ids, digests, tails: ``LineFacts``' lists of the batch.
        raws: the batch's lines (``_payload`` is the line as received).
        pos, offsets, units: per input line, its ``_pos``, offset and unit (native int64s).
        prefixes: per unit, its position prefix (UTF-8).
        emitted: the record type's columns in the row (all but the ``dynamic`` ones).
        rows, ends: ``DirectRows``' buffers of this record type (appended to).
    """

    lines: list[int]
    keys: list[str]
    ids: list[str | None]
    digests: list[str | None]
    tails: list[bytes | None]
    raws: list[bytes | None]
    pos: bytes
    offsets: bytes
    units: bytes
    prefixes: list[bytes]
    emitted: int
    rows: bytearray
    ends: list[int]


_ScanLines = Callable[[list[Any], ScanPlan, LineFacts], None]
_WriteDirect = Callable[[DirectWrite], None]
_CanonicalLine = Callable[[bytes, frozenset[str]], tuple[dict[str, Any], bytes, str] | None]
_Columns = Callable[[list[dict[str, Any]], tuple[str, ...]], list[list[Any]]]
_Gather = Callable[[bytes | bytearray, list[int], list[int]], bytes]


def _load() -> tuple[_ScanLines | None, _WriteDirect | None, _CanonicalLine | None, _Columns | None, _Gather | None]:
    """The extension's entry points, or ``None`` each when it is not built.

    A function rather than a module-level ``try`` so each name has one type
    (``_native.pyi`` types the extension), built or not.
    """
    try:
        from idem_platform.coercion import _native
    except ImportError:  # no compiler at install time: the Python path alone
        return None, None, None, None, None
    return _native.scan_lines, _native.write_direct, _native.canonical_line, _native.columns, _native.gather


_scan_lines, _write_direct, canonical_line, _columns, _gather = _load()

AVAILABLE = _scan_lines is not None


def enabled() -> bool:
    """Whether batches take the C path (built, and not turned off by ``IDEM_NATIVE=0``)."""
    return AVAILABLE and native_allowed()


def scan_lines(raws: list[Any], plan: ScanPlan, facts: LineFacts) -> None:
    """Append each line's facts to ``facts`` (one call per batch: the plan is read and
    checked once)."""
    assert _scan_lines is not None
    _scan_lines(raws, plan, facts)


def write_direct(plan: DirectWrite) -> None:
    """Append the COPY tuples of ``plan.lines`` to ``plan.rows`` (their ends to ``plan.ends``)."""
    assert _write_direct is not None
    _write_direct(plan)


def columns(records: list[dict[str, Any]], names: tuple[str, ...]) -> list[list[Any]]:
    """Per name, its value in every record (``None`` where missing).

    In C when built: one pass over the records, each dict read while it is in cache,
    instead of one ``map(dict.get)`` pass per column over dicts scattered in memory.
    """
    if _columns is not None:
        return _columns(records, names)
    return [list(map(dict.get, records, repeat(name))) for name in names]


def gather(data: bytes | bytearray, ends: list[int], order: list[int]) -> bytes:
    """The pieces of ``data`` that ``order`` names (0-based), one after another; piece ``i``
    is ``data[ends[i - 1]:ends[i]]`` (from 0 for ``i == 0``).

    In C when enabled: one copy per piece. The Python join below makes a memoryview per
    piece, about 2 µs a staged row on the shared benchmark's rows, a fifth of the
    executors' per-record CPU.
    """
    if _gather is not None and enabled():
        return _gather(data, ends, order)
    view = memoryview(data)
    return b"".join(view[(ends[i - 1] if i else 0) : ends[i]] for i in order)
