"""Raw records to typed rows: parse, key, route, coerce and split rows from rejects.

This runs per record inside Spark's Python workers, one Arrow batch at a time;
it never runs as a driver loop. It is deliberately free of Spark, Dagster and
any source: every connector (file drop, Kafka, HTTP) feeds it the same batches.

Input batch (:data:`~idem_platform.write.batch.RECORDS_SCHEMA`): ``_unit``
(index of the record's unit, whose position prefix the spec carries),
``_offset`` (line number or offset), ``_raw`` (the bytes, possibly cut at
``max_line_bytes``; null when the source had no value), ``_raw_length``,
``_meta`` (source metadata JSON) and ``_timestamp``.

Output batch (the ``coerced`` frame), one row per record (blank lines of a file
are not records): system columns, one struct column per record type holding its
typed columns (null for rows of other types and for rejects), ``_errors`` (JSON
list, set only on rejects) and ``_raw`` (only on rejects).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from idem_platform.coercion import native
from idem_platform.coercion.columns import convert_column
from idem_platform.coercion.converters import json_kind
from idem_platform.contract.canonical import (
    InvalidJSON,
    RepeatedKey,
    canonical_value_bytes,
    has_nul,
    parse_and_canonicalize,
    repeated_key,
)
from idem_platform.contract.catalog import TableSpec, is_safe_column_name
from idem_platform.contract.keys import MAX_KEY_LENGTH, ext_id_text, record_key
from idem_platform.migrations import MigrationFailed, MigrationSource

LINE_BITS = 40
LINE_MASK = (1 << LINE_BITS) - 1
RAW_CAP = 4096
UTF8_BOM = b"\xef\xbb\xbf"  # may open a file: not part of its line 1
_NUL_ESCAPE = b"\\u0000"
_SURROGATE_ESCAPE = b"\\ud"  # canonical JSON escapes surrogates (pairs, and lone ones) as \udxxx
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Schema contracts (DESIGN §3): what a record's unknown top-level fields do.
EVOLVE, STRICT, DROP = "evolve", "strict", "drop"
MAX_UNKNOWN_REASONS = 32  # a strict reject names at most this many unknown fields, then counts the rest

SYSTEM_FIELDS = [
    pa.field("_pos", pa.int64()),
    pa.field("_source", pa.string()),
    pa.field("_record_type", pa.string()),
    pa.field("_idempotency_key", pa.string()),
    pa.field("_external_id", pa.string()),
    pa.field("_content_hash", pa.string()),
    pa.field("_payload", pa.string()),  # the record's own text (DESIGN §4), not its canonical form
    pa.field("_extra", pa.string()),
    pa.field("_props", pa.string()),
    pa.field("_errors", pa.string()),
    pa.field("_raw", pa.string()),
    pa.field("_raw_length", pa.int64()),
    pa.field("_meta", pa.string()),
    # Only on records older than their table (DESIGN §6): the version they came with and the
    # record upgraded through the migrations (canonical JSON); null on every current record.
    pa.field("_version", pa.int32()),
    pa.field("_upgraded", pa.string()),
]


@dataclass(frozen=True)
class RecordSpec:
    """Everything a Python worker needs to turn raw records into rows; pickled to executors.

    Nothing here refers to driver state: the catalog (with columns added by
    earlier evolution), the connector's rules and the units' position prefixes
    travel with the task, so the same code runs on ``local[*]`` and on a cluster.

    Attributes:
        connector: the key namespace (the connector's name unless it shares keys).
        units: per unit index, ``(position prefix, base)``: a record's position
            is the prefix and its offset; ``_pos`` holds the offset minus the base.
        lines: records are lines of a text file: blank lines are no records and a
            UTF-8 BOM may open line 1. Otherwise a blank or missing value is a reject.
        noun: what a record is called in reject reasons (``line``, ``message``).
        keep_meta: carry the source metadata (``_meta``) into the rows.
        contracts: per record type, its schema contract: ``evolve`` (unknown
            fields go to ``_extra``/``_props``), ``strict`` (a row with unknown
            fields is a reject) or ``drop`` (they stay in ``_payload`` only).
        evolve: the contract of a record type ``contracts`` does not name:
            ``evolve`` (true) or ``drop`` (false).
        version_field: the field a record states its ``schema_version`` in (a system
            field: never a column, never unknown).
        declared_version: the connector's ``schema_version`` for records that state none
            (``None``: the table's current one).
        migrations: what upgrades a record older than its table (imported lazily, on
            the first such record a worker sees).
    """

    connector: str
    tables: dict[str, TableSpec]
    units: tuple[tuple[str, int], ...]
    record_type: str | None = None
    record_type_field: str | None = None
    id_field: str = "id"
    missing_id: str = "position"
    evolve: bool = True
    max_line_bytes: int = 1 << 20
    ignored_fields: frozenset[str] = field(default_factory=frozenset)
    spark_types: bool = False
    dynamic_values: bool = True  # False on the commit path: PostgreSQL reads them from _payload
    lines: bool = True
    noun: str = "line"
    keep_meta: bool = False
    contracts: dict[str, str] = field(default_factory=dict)
    version_field: str = "schema_version"
    declared_version: int | None = None
    migrations: MigrationSource = field(default_factory=MigrationSource)

    def contract(self, record_type: str) -> str:
        """The schema contract of ``record_type`` (see ``contracts``)."""
        return self.contracts.get(record_type) or (EVOLVE if self.evolve else DROP)

    def output_schema(self) -> pa.Schema:
        """The Arrow schema of :func:`coerce_batch`'s output."""
        structs = [
            pa.field(name, spec.arrow_struct(spark=self.spark_types))
            for name, spec in sorted(self.tables.items())
        ]
        return pa.schema(SYSTEM_FIELDS + structs)


class _Reject(Exception):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors


def _line_error(rule: str, message: str, field_name: str | None = None) -> _Reject:
    return _Reject([{"field": field_name, "rule": rule, "message": message}])


def _raw_text(raw: bytes, length: int) -> str:
    """What a reject keeps of its record: the first :data:`RAW_CAP` bytes, as text.

    Only a whole record (``len(raw) >= length``) loses its line end (``\\n``,
    ``\\r\\n``): a reader hands a too-long line over as its head alone, and that
    head must read the same as the first bytes of the whole line would, or a
    reject's text would depend on where the reader's blocks happened to fall.
    """
    if len(raw) >= length:
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    text = raw[:RAW_CAP].decode("utf-8", "backslashreplace")
    return text.replace("\x00", "\\x00")


class _TableRows:
    """The records routed to one record type in a batch, converted column by column at the end."""

    def __init__(self, spec: TableSpec, skip: frozenset[str], contract: str = EVOLVE) -> None:
        self.spec = spec
        self.skip = frozenset(spec.column_names()) | skip  # fields that are never "unknown"
        self.contract = contract
        self.rows: list[int] = []
        self.records: list[dict[str, Any]] = []
        self.unknown: dict[int, list[dict[str, Any]]] = {}  # strict: local row -> its unknown fields' errors

    def add(self, row: int, record: dict[str, Any]) -> None:
        """Take a routed record (its values are read per column in :meth:`convert`)."""
        self.rows.append(row)
        self.records.append(record)

    def unknown_fields(self, record: dict[str, Any], record_type: str) -> tuple[str | None, str | None]:
        """The just added record's unknown fields: its ``_extra`` and ``_props``, or (strict) the
        reasons that make it a reject once its columns are converted (all its errors at once)."""
        if self.contract == STRICT:
            self.unknown[len(self.rows) - 1] = _unknown_field_errors(record, self.skip, record_type)
            return None, None
        return _unknown(record, self.skip)

    def convert(self, *, dynamic_values: bool) -> tuple[list[pa.Array], dict[int, list[dict[str, Any]]]]:
        """Typed arrays (one per column) and, per local row, its errors in column order."""
        records = self.records
        arrays = []
        errors: dict[int, list[dict[str, Any]]] = {}
        names = tuple(column.name for column in self.spec.columns)
        for column, values in zip(self.spec.columns, native.columns(records, names), strict=True):
            name = column.name
            present = [name in record for record in records] if column.required and None in values else None
            array, column_errors = convert_column(column, values, present, dynamic_values=dynamic_values)
            arrays.append(array)
            for index, error in column_errors:
                errors.setdefault(index, []).append(error)
        for index, unknown in self.unknown.items():  # after the row's column errors
            errors.setdefault(index, []).extend(unknown)
        return arrays, errors


def _struct(spec: TableSpec, arrays: list[pa.Array], rows: list[int], length: int, *, spark: bool) -> pa.Array:
    """Scatter a record type's typed columns into a struct column of the whole batch."""
    struct_type = spec.arrow_struct(spark=spark)
    children = [_for_spark(a, struct_type.field(i).type) if spark else a for i, a in enumerate(arrays)]
    if children:
        dense = pa.StructArray.from_arrays(children, fields=list(struct_type))
    else:
        dense = pa.array([{}] * len(rows), type=struct_type)
    index = np.full(length, -1, dtype=np.int32)
    index[np.asarray(rows, dtype=np.int64)] = np.arange(len(rows), dtype=np.int32)
    return dense.take(pa.array(index, mask=index < 0))


def _for_spark(array: pa.Array, target: pa.DataType) -> pa.Array:
    """Spark's shapes: microsecond timestamps (rounded half up) and variable lists."""
    if array.type == target:
        return array
    if pa.types.is_timestamp(target):
        valid = np.asarray(array.is_valid())
        nanos = array.cast(pa.int64()).fill_null(0).to_numpy()
        micros = nanos // 1000 + (nanos % 1000 >= 500)
        return pa.array(micros, type=pa.int64(), mask=~valid).cast(target)
    return array.cast(target)


class RepeatedLines:
    """What one task attempt already emitted, so a repeated record is counted, not staged again.

    Two memories, both per task attempt:

    * exact lines (bytes -> record type): a byte-identical repeat of an earlier good
      line is recognised before it is parsed, saving its parsing, its COPY and its
      share of the apply. Bounded by ``limit`` (cleared when full: later repeats
      are then caught by their key);
    * keys of good rows (key -> record type): the same record written differently
      (another key order, other spacing) has the same key and is counted as a
      repeat too. While this memory holds every key the attempt emitted,
      :attr:`unique` stays true: the attempt's staged rows have distinct keys and
      the apply needs no ``DISTINCT ON`` sort. Past ``key_limit`` keys it is
      cleared and :attr:`unique` turns false (the apply then sorts).

    A repeat of a line that turned out to be a reject is a reject too, with the
    same reasons. Lines keyed by their position (no id, ``missing_id: position``)
    are never repeats: their key differs by construction.
    """

    def __init__(self, limit: int = 250_000, key_limit: int = 1_000_000) -> None:
        self.limit = limit
        self.key_limit = key_limit
        # Values: a record type (a good row of an earlier batch) or, during a
        # batch, the row number of its first occurrence in that batch.
        self.seen: dict[bytes, str | int] = {}
        self.keys: dict[str, str | int] = {}
        self.unique = True
        self.skipped: dict[str, int] = {}

    def count(self, record_type: str) -> None:
        self.skipped[record_type] = self.skipped.get(record_type, 0) + 1

    def settle(
        self, fresh: list[tuple[bytes | None, str, int]], types: list[str | None]
    ) -> None:
        """End of a batch: the provisional entries of its rows (``(line, key, row)``)
        become record types for good rows and are forgotten for rejects; then the
        memories are bounded."""
        lines, keys = self.seen, self.keys
        for raw, key, row in fresh:
            record_type = types[row]
            if record_type is None:
                del keys[key]
                if raw is not None:
                    del lines[raw]
            else:
                keys[key] = record_type
                if raw is not None:
                    lines[raw] = record_type
        if len(lines) > self.limit:
            lines.clear()
        if len(keys) > self.key_limit:
            keys.clear()
            self.unique = False


class DirectRows:
    """Rows the C path wrote straight into PostgreSQL's binary COPY format, per record type.

    On the commit path (:func:`idem_platform.spark.stage.stage_slice`) an ordinary
    record never becomes a Python object: :mod:`idem_platform.coercion._native` writes
    its staging row (the staged system columns, then the typed ones, as the Arrow path
    and pgpq would) into :attr:`rows` of its type, and the staging writer COPYs those
    bytes as they are. Such rows are not in the Arrow batch ``coerce_batch`` returns;
    every record the C path is not sure of still is.

    Attributes:
        rows: per record type, its rows' COPY tuples, back to back (no header).
        keys: per record type, each row's idempotency key.
        ends: per record type, where each row ends in ``rows``.
    """

    def __init__(self, record_types: list[str]) -> None:
        self.rows: dict[str, bytearray] = {name: bytearray() for name in record_types}
        self.keys: dict[str, list[str]] = {name: [] for name in record_types}
        self.ends: dict[str, list[int]] = {name: [] for name in record_types}

    def count(self, record_type: str) -> int:
        return len(self.ends.get(record_type, ()))


_DIRECT_KINDS = {"string": "s", "int": "i", "long": "l", "real": "r", "bool": "b", "timestamp": "t", "vector": "v", "dynamic": "d"}


def direct_supported(spec: RecordSpec) -> bool:
    """Whether a batch of ``spec`` may write direct rows: the commit path's shapes (microsecond
    timestamps, ``dynamic`` values left to PostgreSQL), no connector-declared schema version
    and no source metadata to keep."""
    return (
        native.enabled()
        and spec.spark_types
        and not spec.dynamic_values
        and spec.declared_version is None
        and not spec.keep_meta
        and all(c.type.kind in _DIRECT_KINDS for t in spec.tables.values() for c in t.columns)
    )


def _direct_plan(batch: _Batch, direct: DirectRows, ignored: frozenset[str]) -> native.DirectPlan:
    """What ``_native.coerce_lines`` needs to write direct rows for this batch."""
    spec = batch.spec
    routes = {}
    for name, table in batch.tables.items():
        columns = table.spec.columns
        fields: dict[str, int] = {c.name: index for index, c in enumerate(columns)}
        for known in ignored:
            fields.setdefault(known, -1)
        routes[name] = native.DirectRoute(
            fields=fields,
            kinds="".join(_DIRECT_KINDS[c.type.kind] for c in columns).encode(),
            required=bytes(int(c.required) for c in columns),
            dims=tuple(c.type.dim or 0 for c in columns),
            emitted=sum(c.type.kind != "dynamic" for c in columns),
            drop_unknown=table.contract == DROP,
            rows=direct.rows.setdefault(name, bytearray()),
            keys=direct.keys.setdefault(name, []),
            ends=direct.ends.setdefault(name, []),
        )
    units64 = batch.units.astype(np.int64)
    bases = np.asarray([base for _, base in spec.units] or [0], dtype=np.int64)
    offsets64 = batch.offsets.astype(np.int64)
    pos = (units64 << LINE_BITS) | (offsets64 - bases[units64])
    return native.DirectPlan(
        routes=routes, pos=pos.tobytes(), offsets=offsets64.tobytes(), units=units64.tobytes(),
        prefixes=[prefix.encode() for prefix, _ in spec.units],
        type_field=None if spec.record_type is not None else spec.record_type_field,
        id_field=spec.id_field, version_field=spec.version_field,
    )


def _batch_plan(
    batch: _Batch, decline: Callable[[int], None], direct: DirectRows | None, ignored: frozenset[str]
) -> native.BatchPlan:
    """The one place the C path's plan is built: the batch's output lists, rules and memories
    (the C path appends to the very objects the Python loop uses) and the Python loop itself."""
    spec, out, repeats = batch.spec, batch.out, batch.repeats
    return native.BatchPlan(
        out_input=out.input, out_type=out.type, out_key=out.key, out_ext=out.ext, out_hash=out.hash,
        out_payload=out.payload, out_extra=out.extra, out_props=out.props, out_errors=out.errors,
        routes={
            name: native.RoutePlan(t.rows, t.records, None if t.contract == DROP else t.skip, batch.currents[name], t)
            for name, t in batch.tables.items()
        },
        fixed_type=spec.record_type, type_field=spec.record_type_field, id_field=spec.id_field,
        connector=spec.connector, version_field=spec.version_field, declared=spec.declared_version,
        shallow=_shallow_fields(spec), too_long=batch.too_long, max_key=MAX_KEY_LENGTH,
        seen_lines=repeats.seen if repeats is not None else None,
        seen_keys=repeats.keys if repeats is not None else None,
        skipped=repeats.skipped if repeats is not None else None,
        fresh=batch.fresh if repeats is not None else None,
        in_batch=batch.repeated_in_batch, on_unknown=_TableRows.unknown_fields, decline=decline,
        direct=_direct_plan(batch, direct, ignored) if direct is not None else None,
    )


def coerce_batch(
    batch: pa.RecordBatch, spec: RecordSpec, repeats: RepeatedLines | None = None, direct: DirectRows | None = None
) -> pa.RecordBatch:
    """Turn one batch of lines into one batch of coerced rows and rejects.

    Blank lines are dropped (they are not records); every other line yields
    exactly one output row, in input order: a typed row or a reject carrying all
    its errors, except, when ``repeats`` is given, a repeat (same bytes or same
    key) of an earlier good row of the task, which is only counted there. Lines
    are parsed, keyed and routed one by one; typed columns are then converted a
    whole column at a time (:mod:`idem_platform.coercion.columns`), and positions
    are computed for the whole batch at once.

    With ``direct`` (the commit path, when :func:`direct_supported`), the ordinary
    records go to ``direct`` as staging rows instead of into the returned batch.
    """
    return _coerce_batch(batch, spec, repeats, direct if direct is not None and direct_supported(spec) else None)


def _coerce_batch(
    batch: pa.RecordBatch, spec: RecordSpec, repeats: RepeatedLines | None, direct: DirectRows | None
) -> pa.RecordBatch:
    """The steps of :func:`coerce_batch`: each line to a row (C or Python), the columns, the repeats."""
    state = _Batch.read(batch, spec, repeats)
    take = _line_loop(state)
    if native.enabled():
        # The C path takes the ordinary records, appending to the same lists and dicts,
        # and hands every other one to ``take`` (see coercion/native.py).
        native.coerce_lines(state.raws, _batch_plan(state, take, direct, state.ignored))
    else:
        for i in range(len(state.raws)):
            take(i)
    converted = _convert_tables(state)
    if repeats is not None:
        _settle_repeats(state, repeats)
    return _output_batch(batch, state, converted)


class _Outputs:
    """The output rows' columns, one list each, in output row order (both paths append)."""

    __slots__ = ("input", "type", "key", "ext", "hash", "payload", "extra", "props", "errors")

    def __init__(self) -> None:
        self.input: list[int] = []  # input index of every output row
        self.type: list[str | None] = []
        self.key: list[str | None] = []
        self.ext: list[str | None] = []
        self.hash: list[str | None] = []
        # _payload is the record's own bytes (DESIGN §4: every number exactly as sent): PostgreSQL's
        # jsonb reads them as numeric, where the canonical form (the key's) went through doubles.
        self.payload: list[bytes | None] = []
        self.extra: list[str | None] = []
        self.props: list[str | None] = []
        self.errors: list[str | None] = []

    def reject(self, i: int, errors: str) -> None:
        """A reject row of input ``i`` with ``errors`` (JSON): nulls but its reasons."""
        self.input.append(i)
        for column in (self.type, self.key, self.ext, self.hash, self.payload, self.extra, self.props):
            column.append(None)
        self.errors.append(errors)


@dataclass
class _Batch:
    """One batch in progress: its input columns, its tables' rows and the output columns.

    One object rather than a dozen locals so the batch's steps (the per-line loop, the column
    conversion, the repeats' settling and the output) are separate functions sharing it.
    """

    spec: RecordSpec
    repeats: RepeatedLines | None
    raws: list[bytes | None]
    offsets: np.ndarray
    units: np.ndarray
    raw_lengths: np.ndarray
    too_long: set[int]
    ignored: frozenset[str]
    tables: dict[str, _TableRows]
    currents: dict[str, int]
    out: _Outputs = field(default_factory=_Outputs)
    # input index -> (version, upgraded record, its JSON)
    upgraded: dict[int, tuple[int, dict[str, Any], str]] = field(default_factory=dict)
    repeated_in_batch: list[tuple[int, int]] = field(default_factory=list)  # (input index, row of the first)
    fresh: list[tuple[bytes | None, str, int]] = field(default_factory=list)  # rows first seen in this batch

    @classmethod
    def read(cls, batch: pa.RecordBatch, spec: RecordSpec, repeats: RepeatedLines | None) -> _Batch:
        """The input columns as the loop reads them (a file's BOM off its line 1)."""
        raws = batch.column("_raw").to_pylist()
        offsets = batch.column("_offset").to_numpy(zero_copy_only=False)
        raw_lengths = batch.column("_raw_length").to_numpy(zero_copy_only=False)
        if spec.lines:
            raw_lengths = _without_file_bom(raws, offsets, raw_lengths)
        ignored = frozenset(
            spec.ignored_fields | {spec.id_field, spec.version_field}
            | ({spec.record_type_field} if spec.record_type_field else set())
        )
        return cls(
            spec=spec, repeats=repeats, raws=raws, offsets=offsets,
            units=batch.column("_unit").to_numpy(zero_copy_only=False), raw_lengths=raw_lengths,
            too_long=set(np.flatnonzero(raw_lengths > spec.max_line_bytes).tolist()) if len(raws) else set(),
            ignored=ignored,
            tables={name: _TableRows(table, ignored, spec.contract(name)) for name, table in spec.tables.items()},
            currents={name: table.schema_version for name, table in spec.tables.items()},
        )


def _line_loop(state: _Batch) -> Callable[[int], None]:
    """The per-line loop's body, ``take(i)``: line ``i`` becomes a row, a reject or a counted
    repeat (or nothing: a blank line of a file). Closures over the batch's values (here and in
    the steps' factories), since the Python path calls it for every line and the C path for
    every line it declines: a closure's free variables cost what locals do, attributes more."""
    raws, out, repeats = state.raws, state.out, state.repeats
    lines = state.spec.lines
    seen_lines: dict[bytes, str | int] = repeats.seen if repeats is not None else {}
    repeated_in_batch = state.repeated_in_batch
    checked, identify, keep = _record_checker(state), _identifier(state), _row_keeper(state)
    dumps = json.dumps

    def take(i: int) -> None:
        """Line ``i``: skipped if blank, counted if it repeats a line, else a row or a reject."""
        raw = raws[i]
        blank = not raw or raw.isspace()
        if blank:
            if lines and raw is not None:
                return  # a blank line is not a record (its number still counts)
        elif repeats is not None:
            known = seen_lines.get(raw)  # type: ignore[arg-type]  # not blank: bytes
            if known is not None:
                if isinstance(known, int):
                    repeated_in_batch.append((i, known))  # first seen in this batch
                else:
                    repeats.count(known)  # the record type of a line committed earlier
                return
        try:
            record, canonical = checked(i, raw, blank)
            record_type, digest, ext_id = identify(i, record, canonical)
        except _Reject as reject:
            out.reject(i, dumps(reject.errors, ensure_ascii=False))
            return
        keep(i, raw, record, record_type, digest, ext_id)  # type: ignore[arg-type]  # parsed: bytes

    return take


def _record_checker(state: _Batch) -> Callable[[int, bytes | None, bool], tuple[dict[str, Any], bytes]]:
    """``checked(i, raw, blank)``: line ``i`` parsed, with its canonical bytes; or the reject
    every check of the contract words (no value, blank, too long, not JSON, not an object,
    NUL, a lone surrogate, a repeated key). The definition the C path agrees with."""
    noun, too_long, raw_lengths, limit = state.spec.noun, state.too_long, state.raw_lengths, state.spec.max_line_bytes

    def checked(i: int, raw: bytes | None, blank: bool) -> tuple[dict[str, Any], bytes]:
        if blank or raw is None:
            if raw is None:
                raise _line_error("no_value", f"{noun} has no value (null: a tombstone or a deletion marker)")
            raise _line_error("blank", f"{noun} is blank")
        if i in too_long:
            raise _line_error(
                "too_long", f"{noun} is {int(raw_lengths[i])} bytes long; the limit is {limit} (max_line_bytes)"
            )
        try:
            # Trailing "\r\n" is JSON whitespace: no need to strip it first.
            record, canonical = parse_and_canonicalize(raw)
        except InvalidJSON as exc:
            raise _line_error("json", f"{noun} is not valid JSON: {exc}") from None
        if type(record) is not dict:
            raise _line_error("not_object", f"{noun} is {json_kind(record)}, not a JSON object")
        # Both escapes start with a backslash, which most records' canonical form lacks:
        # ``92 in`` is a memchr, a bytes needle a slower search (~0.5 µs each).
        if 92 in canonical:
            if _NUL_ESCAPE in canonical and has_nul(record):
                raise _line_error("nul", "record contains a NUL character (\\u0000), which PostgreSQL cannot store")
            if _SURROGATE_ESCAPE in canonical and (lone := _lone_surrogate(record)) is not None:
                raise _line_error(
                    "surrogate",
                    f"record contains a lone surrogate (\\u{ord(lone):04x}): not Unicode text, which "
                    "PostgreSQL cannot store",
                )
        # repeated_key's first test, widened to any backslash and inlined: a call per
        # record would cost as much as the counts; ``92 in`` is a memchr, ``b"\\" in`` not.
        if raw.count(58) != canonical.count(58) or 92 in raw:  # ":" and "\"
            repeated = repeated_key(raw, canonical)
            if repeated is not None:
                raise _repeated_key_error(repeated)
        return record, canonical

    return checked


def _identifier(state: _Batch) -> Callable[[int, dict[str, Any], bytes], tuple[str, str, str]]:
    """``identify(i, record, canonical)``: a parsed record's ``(record type, SHA-1 of its
    canonical bytes, external id)``, its upgrade noted in ``state.upgraded`` if it is older
    than its table; or the reject (record type, id, schema version, migration)."""
    spec, tables, currents, upgraded, units, offsets = (
        state.spec, state.tables, state.currents, state.upgraded, state.units, state.offsets
    )
    fixed_type, type_field, id_field, missing_id = spec.record_type, spec.record_type_field, spec.id_field, spec.missing_id
    version_field, declared = spec.version_field, spec.declared_version
    prefixes = [prefix for prefix, _ in spec.units]
    sha1 = hashlib.sha1

    def identify(i: int, record: dict[str, Any], canonical: bytes) -> tuple[str, str, str]:
        if fixed_type is not None:
            record_type = fixed_type
        else:
            routed = record.get(type_field)  # type: ignore[arg-type]  # _route says why it is None
            if type(routed) is str and routed in tables:
                record_type = routed
            else:
                record_type = _route(record, type_field, tables)  # raises the precise reject
        digest = sha1(canonical).hexdigest()
        ext_id = record.get(id_field)
        if type(ext_id) is not str or not ext_id:  # numbers, missing or empty ids, objects: the exact rules
            source = f"{prefixes[units[i]]}{offsets[i]}"
            ext_id = _ext_id(record, id_field, missing_id, source, digest)
        version = record.get(version_field, declared)  # current records: this lookup is all they pay
        if version is not None:
            if type(version) is not int or version != currents[record_type]:
                upgraded[i] = _upgrade(record, record_type, version, currents[record_type], spec)
        elif declared is not None:  # "schema_version": null states nothing: the connector's
            upgraded[i] = _upgrade(record, record_type, declared, currents[record_type], spec)
        return record_type, digest, ext_id

    return identify


def _row_keeper(state: _Batch) -> Callable[[int, bytes, dict[str, Any], str, str, str], None]:
    """``keep(i, raw, record, record type, digest, ext id)``: a good record's row: its key, then
    (unless it repeats a row of the task, which is only counted) its table's record and its
    output columns."""
    spec, out, repeats, tables, upgraded = state.spec, state.out, state.repeats, state.tables, state.upgraded
    out_input = out.input
    connector, id_field, positional_ids = spec.connector, spec.id_field, spec.missing_id == "position"
    seen_lines: dict[bytes, str | int] = repeats.seen if repeats is not None else {}
    seen_keys: dict[str, str | int] = repeats.keys if repeats is not None else {}
    repeated_in_batch, fresh = state.repeated_in_batch, state.fresh
    add_input, add_type, add_key, add_ext, add_hash = (
        out.input.append, out.type.append, out.key.append, out.ext.append, out.hash.append
    )
    add_payload, add_extra, add_props, add_errors = out.payload.append, out.extra.append, out.props.append, out.errors.append

    def keep(i: int, raw: bytes, record: dict[str, Any], record_type: str, digest: str, ext_id: str) -> None:
        key = f"{connector}:{record_type}:{ext_id}:{digest[:12]}"
        if len(key) > MAX_KEY_LENGTH or not (ext_id.isascii() and ext_id.isprintable()):
            key = record_key(connector, record_type, ext_id, digest)  # hashes an unsafe ext_id
        row = len(out_input)
        if repeats is not None:
            known = seen_keys.get(key)
            if known is not None:
                if isinstance(known, int):
                    repeated_in_batch.append((i, known))
                else:
                    repeats.count(known)
                return
            seen_keys[key] = row
            if positional_ids and record.get(id_field) in (None, ""):
                fresh.append((None, key, row))
            else:
                seen_lines[raw] = row
                fresh.append((raw, key, row))
        if upgraded and i in upgraded:
            record = upgraded[i][1]  # coerced in the current shape; _payload stays as received
        table = tables[record_type]
        table.rows.append(row)
        table.records.append(record)
        if table.contract != DROP and not record.keys() <= table.skip:  # unknown fields: rare, only they cost
            extra, props = table.unknown_fields(record, record_type)
        else:
            extra = props = None
        add_input(i)
        add_type(record_type)
        add_key(key)
        add_ext(ext_id)
        add_hash(digest)
        add_payload(raw)  # as received (jsonb keeps its numbers exactly), not the canonical form
        add_extra(extra)
        add_props(props)
        add_errors(None)

    return keep


def _convert_tables(state: _Batch) -> dict[str, list[pa.Array]]:
    """Every table's typed columns; a row a column rejects becomes a reject (its output
    columns cleared, its errors set) and leaves its table."""
    out = state.out
    converted: dict[str, list[pa.Array]] = {}
    for name in sorted(state.tables):
        table = state.tables[name]
        arrays, errors = table.convert(dynamic_values=state.spec.dynamic_values)
        if errors:
            keep = []
            for local, row in enumerate(table.rows):
                row_errors = errors.get(local)
                if row_errors is None:
                    keep.append(local)
                    continue
                out.type[row] = out.key[row] = out.ext[row] = out.hash[row] = None
                out.payload[row] = out.extra[row] = out.props[row] = None
                out.errors[row] = json.dumps(row_errors, ensure_ascii=False)
            selection = pa.array(keep, type=pa.int64())
            arrays = [array.take(selection) for array in arrays]
            table.rows = [table.rows[local] for local in keep]
        converted[name] = arrays
    return converted


def _settle_repeats(state: _Batch, repeats: RepeatedLines) -> None:
    """In-batch repeats once their first occurrence is settled (a repeat of a reject is a
    reject, with the same reasons; of a good row, counted), then the memories."""
    out = state.out
    for i, first in state.repeated_in_batch:
        if out.errors[first] is None:
            first_type = out.type[first]
            assert first_type is not None  # a row without errors was routed to its table
            repeats.count(first_type)
            continue
        out.reject(i, out.errors[first])  # type: ignore[arg-type]  # checked just above
    repeats.settle(state.fresh, out.type)


def _output_batch(batch: pa.RecordBatch, state: _Batch, converted: dict[str, list[pa.Array]]) -> pa.RecordBatch:
    """The output batch: system columns (positions for the whole batch at once, rejects'
    raw text), then one struct column per table."""
    spec, out, tables = state.spec, state.out, state.tables
    n = len(out.input)
    structs = [
        _struct(tables[name].spec, converted[name], tables[name].rows, n, spark=spec.spark_types)
        for name in sorted(tables)
    ]
    taken = np.asarray(out.input, dtype=np.int64)
    out_units = state.units[taken].astype(np.int64)
    out_offsets = state.offsets[taken].astype(np.int64)
    bases = np.asarray([base for _, base in spec.units] or [0], dtype=np.int64)
    prefixes = [prefix for prefix, _ in spec.units]
    source = pc.binary_join_element_wise(
        pa.array(prefixes, pa.string()).take(pa.array(out_units)), pa.array(out_offsets).cast(pa.string()), ""
    )
    out_raw, out_raw_len = _reject_raws(state)
    arrays = [
        pa.array((out_units << LINE_BITS) | (out_offsets - bases[out_units]), pa.int64()),
        source,
        pa.array(out.type, pa.string()),
        pa.array(out.key, pa.string()),
        pa.array(out.ext, pa.string()),
        pa.array(out.hash, pa.string()),
        pa.array(out.payload, pa.binary()).cast(pa.string()),
        pa.array(out.extra, pa.string()),
        pa.array(out.props, pa.string()),
        pa.array(out.errors, pa.string()),
        pa.array(out_raw, pa.string()),
        pa.array(out_raw_len, pa.int64()),
        _metadata(batch.column("_meta"), taken, out.errors, keep=spec.keep_meta),
        *_versions(state.upgraded, out.input, out.errors),
        *structs,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=spec.output_schema())


def _reject_raws(state: _Batch) -> tuple[list[str | None], list[int | None]]:
    """The ``_raw`` and ``_raw_length`` columns: set on rejects only."""
    out = state.out
    n = len(out.input)
    out_raw: list[str | None] = [None] * n
    out_raw_len: list[int | None] = [None] * n
    for row, error in enumerate(out.errors):
        if error is not None:
            i = out.input[row]
            raw = state.raws[i]
            length = int(state.raw_lengths[i])
            out_raw[row] = _raw_text(raw, length) if raw is not None else ""
            out_raw_len[row] = length
    return out_raw, out_raw_len


def _shallow_fields(spec: RecordSpec) -> frozenset[str]:
    """Fields whose values the batch never reads (the C path builds ``...`` for them, ``None``
    if null): ``dynamic`` columns on the commit path, where PostgreSQL takes them from ``_payload``.
    A field that is a ``dynamic`` column of one type but not of another is read: it is not here."""
    if spec.dynamic_values:
        return frozenset()
    dynamic: set[str] | None = None
    for table in spec.tables.values():
        names = {column.name for column in table.columns if column.type.kind == "dynamic"}
        dynamic = names if dynamic is None else dynamic & names
    read = {spec.id_field, spec.version_field, spec.record_type_field}
    return frozenset((dynamic or set()) - read)


def _upgrade(
    record: dict[str, Any], record_type: str, version: Any, current: int, spec: RecordSpec
) -> tuple[int, dict[str, Any], str]:
    """A record that states (or whose connector declares) a version other than its table's
    current one: ``(its version, the record upgraded through the migrations, its canonical
    JSON)``, or a reject (rule ``schema_version`` or ``migration``). The version field is a
    system field: the migrations never see it, and the upgraded record does not hold it."""
    name = spec.version_field
    stated = record.get(name) is not None
    if version == current and type(version) is int:
        return version, record, ""  # the connector's declared version is the current one after all
    if type(version) is not int or version < 1:
        shown = json.dumps(version, ensure_ascii=False)[:60]
        raise _line_error("schema_version", f"field '{name}': {shown} is not a schema version (an integer >= 1)", name)
    if version > current:
        who = "record says" if stated else "connector declares"
        raise _line_error("schema_version", f"{who} schema_version {version} but {record_type} is at {current}", name)
    try:
        result = spec.migrations.chains().upgrade(record_type, {k: v for k, v in record.items() if k != name}, version)
        result.pop(name, None)
        canonical = canonical_value_bytes(result)
    except MigrationFailed as exc:
        raise _line_error("migration", str(exc)) from None
    except (TypeError, ValueError) as exc:  # the migration returned something JSON cannot hold
        raise _line_error("migration", f"{record_type} upgraded from v{version} is not JSON: {exc}") from None
    if (_NUL_ESCAPE in canonical and has_nul(result)) or (
        _SURROGATE_ESCAPE in canonical and _lone_surrogate(result) is not None
    ):
        raise _line_error("migration", f"{record_type} upgraded from v{version} holds text PostgreSQL cannot store")
    return version, result, canonical.decode("utf-8")


def _versions(
    upgraded: dict[int, tuple[int, dict[str, Any], str]], out_input: list[int], out_errors: list[str | None]
) -> tuple[pa.Array, pa.Array]:
    """The ``_version`` and ``_upgraded`` columns: null but on upgraded rows that are not rejects."""
    n = len(out_input)
    if not upgraded:
        return pa.nulls(n, pa.int32()), pa.nulls(n, pa.string())
    versions: list[int | None] = [None] * n
    records: list[str | None] = [None] * n
    for row, i in enumerate(out_input):
        found = upgraded.get(i)
        if found is not None and found[2] and out_errors[row] is None:
            versions[row], _, records[row] = found
    return pa.array(versions, pa.int32()), pa.array(records, pa.string())


def _without_file_bom(raws: list[bytes | None], offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Drop the UTF-8 BOM that opens a file from its line 1 (in ``raws``); return the lengths to use.

    The BOM belongs to the file, not to the line: it is dropped before the line
    is found blank, measured against ``max_line_bytes`` or kept as a reject's
    text, so line 1 gets the outcome the same line gets anywhere else.
    """
    firsts = np.flatnonzero(offsets == 1).tolist() if len(offsets) else []
    opened = [(i, raw) for i in firsts if (raw := raws[i]) is not None and raw.startswith(UTF8_BOM)]
    if not opened:
        return lengths
    lengths = lengths.copy()
    for i, raw in opened:
        raws[i] = raw[len(UTF8_BOM) :]
        lengths[i] -= len(UTF8_BOM)
    return lengths


def _repeated_key_error(repeated: RepeatedKey) -> _Reject:
    """A repeated key is a reject, not data: a parser would keep one of the values
    silently, and which one is the parser's choice, not the producer's."""
    key = json.dumps(repeated.key, ensure_ascii=False)
    if len(key) > 62:
        key = key[:60] + "…\""
    where = repeated.where()
    if len(where) > 200:
        where = where[:100] + "…" + where[-99:]
    times = "twice" if repeated.times == 2 else f"{repeated.times} times"
    return _line_error(
        "duplicate_key", f"object has the key {key} {times} (at {where})", str(repeated.path[0])
    )


def _metadata(meta: pa.Array, taken: np.ndarray, errors: list[str | None], *, keep: bool) -> pa.Array:
    """The output rows' source metadata: always on rejects (a poison message's key and
    offset), on good rows only when the connector keeps it."""
    if meta.null_count == len(meta):
        return pa.nulls(len(taken), pa.string())
    rows = meta.take(pa.array(taken, pa.int64()))
    if keep:
        return rows
    rejected = pa.array([error is not None for error in errors], pa.bool_())
    return pc.if_else(rejected, rows, pa.scalar(None, pa.string()))


def _unknown(record: dict[str, Any], skip: frozenset[str]) -> tuple[str | None, str | None]:
    """Fields no column declares: evolvable names (rendered as text) vs ``props`` (kept as JSON).

    An evolvable field's JSON ``null`` stays ``null`` in ``_extra`` (the apply's
    ``_extra ->> name`` makes it SQL NULL), as a declared ``string`` column stores it: the
    text ``'null'`` would read as the string ``"null"``, which ``IS NULL`` misses and
    ``idem retype`` counts as a failed cast.
    """
    extra: dict[str, str | None] = {}
    props: dict[str, Any] = {}
    for name in record.keys() - skip:
        value = record[name]
        if is_safe_column_name(name):
            extra[name] = value if type(value) is str or value is None else canonical_value_bytes(value).decode("ascii")
        else:
            props[name] = value
    return (
        orjson.dumps(extra, option=orjson.OPT_SORT_KEYS).decode() if extra else None,
        canonical_value_bytes(props).decode("ascii") if props else None,
    )


def _unknown_field_errors(record: dict[str, Any], skip: frozenset[str], record_type: str) -> list[dict[str, Any]]:
    """A strict record type's reasons: one per unknown field, in name order (at most
    :data:`MAX_UNKNOWN_REASONS`, then one that counts the rest)."""
    names = sorted(record.keys() - skip)
    errors: list[dict[str, Any]] = [
        {
            "field": name,
            "rule": "unknown_field",
            "message": f"field '{name if len(name) <= 64 else name[:60] + '…'}': not in the catalog of "
            f"{record_type} (schema_contract: strict)",
        }
        for name in names[:MAX_UNKNOWN_REASONS]
    ]
    if len(names) > MAX_UNKNOWN_REASONS:
        errors.append({
            "field": None,
            "rule": "unknown_field",
            "message": f"{len(names) - MAX_UNKNOWN_REASONS} more fields are not in the catalog of "
            f"{record_type} (schema_contract: strict)",
        })
    return errors


def coerce_batches(batches: Iterator[pa.RecordBatch], spec: RecordSpec) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: coerce every batch of a partition."""
    for batch in batches:
        yield coerce_batch(batch, spec)


def _route(record: dict[str, Any], type_field: str | None, builders: dict[str, _TableRows]) -> str:
    if type_field is None:  # RecordSpec routes by field only when the connector names one
        raise ValueError("routing by field needs a record_type_field")
    value = record.get(type_field)
    if value is None:
        raise _line_error(
            "record_type",
            f"field '{type_field}' is {'null' if type_field in record else 'missing'}; "
            "it names the record's type",
            type_field,
        )
    if type(value) is not str or value not in builders:
        known = ", ".join(sorted(builders))
        raise _line_error(
            "record_type",
            f"field '{type_field}': {json.dumps(value, ensure_ascii=False)[:60]} is not a record type "
            f"of this connector ({known})",
            type_field,
        )
    return value


def _ext_id(record: dict[str, Any], id_field: str, missing_id: str, source: str, digest: str) -> str:
    try:
        ext_id = ext_id_text(record.get(id_field))
    except TypeError as exc:
        raise _line_error("id", f"field '{id_field}' {exc}", id_field) from None
    if ext_id:  # an empty string names nothing: it counts as missing, like null
        return ext_id
    if missing_id == "position":
        return source
    if missing_id == "content":
        return digest
    raise _line_error(
        "id", f"field '{id_field}' is missing, null or empty and missing_id is 'reject'", id_field
    )


def _lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in any key or string of a parsed value (JSON allows
    ``"\\ud800"``; Unicode text, UTF-8 and PostgreSQL do not)."""
    if isinstance(value, str):
        found = _LONE_SURROGATE.search(value)
        return found.group() if found else None
    if isinstance(value, dict):
        for key, item in value.items():
            found_in = _lone_surrogate(key) or _lone_surrogate(item)
            if found_in is not None:
                return found_in
    elif isinstance(value, list):
        for item in value:
            found_in = _lone_surrogate(item)
            if found_in is not None:
                return found_in
    return None


