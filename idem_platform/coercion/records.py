"""Lines to typed rows: parse, key, route, coerce and split rows from rejects.

This runs per record inside Spark's Python workers (``mapInArrow``), one Arrow
batch at a time; it never runs as a driver loop. It is deliberately free of
Spark and Dagster so it can be tested as a plain function and reused by every
path (file drop, Kafka, HTTP).

Input batch (the ``ingest`` frame): ``_file`` int32 (index into the batch's
files), ``_line`` int64 (1-based), ``_raw`` binary (the line, possibly cut at
``max_line_bytes``), ``_raw_length`` int64 (the line's real length).

Output batch (the ``coerced`` frame), one row per non-blank line:
system columns, one struct column per record type holding its typed columns
(null for rows of other types and for rejects), ``_errors`` (JSON list, set only
on rejects) and ``_raw`` (only on rejects).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from idem_platform.canonical import InvalidJSON, canonical_value_bytes, parse_and_canonicalize
from idem_platform.catalog import TableSpec, is_safe_column_name
from idem_platform.coercion.columns import convert_column
from idem_platform.coercion.converters import json_kind
from idem_platform.keys import MAX_KEY_LENGTH, ext_id_text, record_key

LINE_BITS = 40
LINE_MASK = (1 << LINE_BITS) - 1
RAW_CAP = 4096
_BOM = b"\xef\xbb\xbf"
_NUL_ESCAPE = b"\\u0000"

LINES_SCHEMA = pa.schema(
    [
        pa.field("_file", pa.int32()),
        pa.field("_line", pa.int64()),
        pa.field("_raw", pa.binary()),
        pa.field("_raw_length", pa.int64()),
    ]
)
SYSTEM_FIELDS = [
    pa.field("_pos", pa.int64()),
    pa.field("_source", pa.string()),
    pa.field("_record_type", pa.string()),
    pa.field("_idempotency_key", pa.string()),
    pa.field("_external_id", pa.string()),
    pa.field("_content_hash", pa.string()),
    pa.field("_payload", pa.string()),
    pa.field("_extra", pa.string()),
    pa.field("_props", pa.string()),
    pa.field("_errors", pa.string()),
    pa.field("_raw", pa.string()),
    pa.field("_raw_length", pa.int64()),
]


@dataclass(frozen=True)
class RecordSpec:
    """Everything a Python worker needs to turn lines into rows; pickled to executors.

    Nothing here refers to driver state: the catalog (with columns added by
    earlier evolution), the connector's rules and the files' hashes travel with
    the task, so the same code runs on ``local[*]`` and on a cluster.
    """

    connector: str
    tables: dict[str, TableSpec]
    file_sha256: tuple[str, ...]
    record_type: str | None = None
    record_type_field: str | None = None
    id_field: str = "id"
    missing_id: str = "position"
    evolve: bool = True
    max_line_bytes: int = 1 << 20
    ignored_fields: frozenset[str] = field(default_factory=frozenset)
    spark_types: bool = False
    dynamic_values: bool = True  # False on the commit path: PostgreSQL reads them from _payload

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


def _raw_text(raw: bytes) -> str:
    text = raw[:RAW_CAP].decode("utf-8", "backslashreplace")
    return text.replace("\x00", "\\x00")


class _TableRows:
    """The records routed to one record type in a batch, converted column by column at the end."""

    def __init__(self, spec: TableSpec, skip: frozenset[str]) -> None:
        self.spec = spec
        self.names = spec.column_names()
        self.known = frozenset(self.names)
        self.skip = self.known | skip  # fields that are never "unknown"
        self.rows: list[int] = []
        self.records: list[dict[str, Any]] = []
        self.values: list[tuple[Any, ...]] = []

    def add(self, row: int, record: dict[str, Any]) -> None:
        """Take a routed record; its column values are read now, while the dict is in cache."""
        self.rows.append(row)
        self.records.append(record)
        self.values.append(tuple(map(record.get, self.names)))

    def convert(self, *, dynamic_values: bool) -> tuple[list[pa.Array], dict[int, list[dict[str, Any]]]]:
        """Typed arrays (one per column) and, per local row, its errors in column order."""
        records = self.records
        columns = list(zip(*self.values, strict=True)) if self.values else [() for _ in self.names]
        arrays = []
        errors: dict[int, list[dict[str, Any]]] = {}
        for column, values in zip(self.spec.columns, columns, strict=True):
            name = column.name
            values = list(values)
            present = [name in record for record in records] if column.required and None in values else None
            array, column_errors = convert_column(column, values, present, dynamic_values=dynamic_values)
            arrays.append(array)
            for index, error in column_errors:
                errors.setdefault(index, []).append(error)
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
    """Exact repeats of an earlier good line of the same task: counted, not coerced or staged again.

    A byte-identical line is the same record, so it gets the same key and would
    only be skipped at commit; recognising it here saves its parsing, its COPY and
    its share of the promote. Lines keyed by their position (no id, ``missing_id:
    position``) are never repeats: their key differs by construction. A repeat of
    a line that turned out to be a reject is a reject too, with the same reasons.
    """

    def __init__(self, limit: int = 250_000) -> None:
        self.limit = limit
        self.seen: dict[bytes, str] = {}
        self.skipped: dict[str, int] = {}

    def count(self, record_type: str) -> None:
        self.skipped[record_type] = self.skipped.get(record_type, 0) + 1

    def remember(self, raw: bytes, record_type: str) -> None:
        if len(self.seen) >= self.limit:
            self.seen.clear()  # bounded memory; repeats after this are simply staged
        self.seen[raw] = record_type


def coerce_batch(batch: pa.RecordBatch, spec: RecordSpec, repeats: RepeatedLines | None = None) -> pa.RecordBatch:
    """Turn one batch of lines into one batch of coerced rows and rejects.

    Blank lines are dropped (they are not records); every other line yields
    exactly one output row: a typed row or a reject carrying all its errors,
    except, when ``repeats`` is given, an exact repeat of an earlier good line,
    which is only counted there. Lines are parsed, keyed and routed one by one;
    typed columns are then converted a whole column at a time
    (:mod:`idem_platform.coercion.columns`).
    """
    files = batch.column("_file").to_pylist()
    lines = batch.column("_line").to_pylist()
    raws = batch.column("_raw").to_pylist()
    raw_lengths = batch.column("_raw_length").to_pylist()
    ignored = spec.ignored_fields | {spec.id_field} | ({spec.record_type_field} if spec.record_type_field else set())
    tables = {name: _TableRows(table, frozenset(ignored)) for name, table in spec.tables.items()}
    fixed_type = spec.record_type
    type_field = spec.record_type_field
    id_field = spec.id_field
    connector = spec.connector
    shas = spec.file_sha256
    evolve = spec.evolve
    max_line_bytes = spec.max_line_bytes

    out_input: list[int] = []
    out_pos: list[int] = []
    out_source: list[str] = []
    out_type: list[str | None] = []
    out_key: list[str | None] = []
    out_ext: list[str | None] = []
    out_hash: list[str | None] = []
    out_payload: list[bytes | None] = []
    out_extra: list[str | None] = []
    out_props: list[str | None] = []
    out_errors: list[str | None] = []
    add_input, add_pos, add_source = out_input.append, out_pos.append, out_source.append
    add_type, add_key, add_ext, add_hash = out_type.append, out_key.append, out_ext.append, out_hash.append
    add_payload, add_extra, add_props = out_payload.append, out_extra.append, out_props.append
    add_errors = out_errors.append
    prefixes = [f"{sha[:16]}#L" for sha in shas]
    sha1 = hashlib.sha1
    positional_ids = spec.missing_id == "position"
    first_in_batch: dict[bytes, int] = {}  # raw line -> its row, for good rows keyed by content
    repeated_in_batch: list[tuple[int, int]] = []  # (input index, row of the first occurrence)

    for i in range(len(raws)):
        raw: bytes = raws[i]
        if not raw or raw.isspace():
            continue  # a blank line is not a record (its number still counts)
        line: int = lines[i]
        if line == 1 and raw.startswith(_BOM):
            raw = raw[3:]
        if repeats is not None:
            known = repeats.seen.get(raw)
            if known is not None:
                repeats.count(known)
                continue
            first = first_in_batch.get(raw)
            if first is not None:
                repeated_in_batch.append((i, first))
                continue
        row = len(out_pos)
        file_index: int = files[i]
        add_input(i)
        add_pos((file_index << LINE_BITS) | line)
        source = f"{prefixes[file_index]}{line}"
        add_source(source)
        try:
            raw_length: int = raw_lengths[i]
            if raw_length > max_line_bytes:
                raise _line_error(
                    "too_long",
                    f"line is {raw_length} bytes long; the limit is {max_line_bytes} (max_line_bytes)",
                )
            try:
                # Trailing "\r\n" is JSON whitespace: no need to strip it first.
                record, canonical = parse_and_canonicalize(raw)
            except InvalidJSON as exc:
                raise _line_error("json", f"line is not valid JSON: {exc}") from None
            if type(record) is not dict:
                raise _line_error("not_object", f"line is {json_kind(record)}, not a JSON object")
            if _NUL_ESCAPE in canonical and _has_nul(record):
                raise _line_error(
                    "nul", "record contains a NUL character (\\u0000), which PostgreSQL cannot store"
                )
            if fixed_type is not None:
                record_type = fixed_type
            else:
                record_type = record.get(type_field)  # type: ignore[arg-type]
                if type(record_type) is not str or record_type not in tables:
                    record_type = _route(record, type_field, tables)  # raises the precise reject
            digest = sha1(canonical).hexdigest()
            ext_id = record.get(id_field)
            if type(ext_id) is not str:  # numbers, missing ids, objects: the slow, exact rules
                ext_id = _ext_id(record, id_field, spec.missing_id, source, digest)
        except _Reject as reject:
            add_type(None)
            add_key(None)
            add_ext(None)
            add_hash(None)
            add_payload(None)
            add_extra(None)
            add_props(None)
            add_errors(json.dumps(reject.errors, ensure_ascii=False))
            continue
        table = tables[record_type]
        table.add(row, record)
        if evolve and not record.keys() <= table.skip:
            extra, props = _unknown(record, table.skip)
            add_extra(extra)
            add_props(props)
        else:
            add_extra(None)
            add_props(None)
        add_type(record_type)
        key = f"{connector}:{record_type}:{ext_id}:{digest[:12]}"
        if len(key) > MAX_KEY_LENGTH or not (ext_id.isascii() and ext_id.isprintable()):
            key = record_key(connector, record_type, ext_id, digest)  # hashes an unsafe ext_id
        add_key(key)
        add_ext(ext_id)
        add_hash(digest)
        add_payload(canonical)
        add_errors(None)
        if repeats is not None and not (positional_ids and record.get(id_field) is None):
            first_in_batch[raw] = row

    converted: dict[str, list[pa.Array]] = {}
    for name in sorted(tables):
        table = tables[name]
        arrays, errors = table.convert(dynamic_values=spec.dynamic_values)
        if errors:
            keep = []
            for local, row in enumerate(table.rows):
                row_errors = errors.get(local)
                if row_errors is None:
                    keep.append(local)
                    continue
                out_type[row] = out_key[row] = out_ext[row] = out_hash[row] = None
                out_payload[row] = out_extra[row] = out_props[row] = None
                out_errors[row] = json.dumps(row_errors, ensure_ascii=False)
            selection = pa.array(keep, type=pa.int64())
            arrays = [array.take(selection) for array in arrays]
            table.rows = [table.rows[local] for local in keep]
        converted[name] = arrays

    if repeats is not None:
        for i, first in repeated_in_batch:
            if out_errors[first] is None:
                repeats.count(out_type[first])  # type: ignore[arg-type]
                continue
            out_input.append(i)  # a repeat of a reject is a reject, with the same reasons
            out_pos.append((files[i] << LINE_BITS) | lines[i])
            out_source.append(f"{prefixes[files[i]]}{lines[i]}")
            for column in (out_type, out_key, out_ext, out_hash, out_payload, out_extra, out_props):
                column.append(None)
            out_errors.append(out_errors[first])
        for raw, row in first_in_batch.items():
            if out_errors[row] is None:
                repeats.remember(raw, out_type[row])  # type: ignore[arg-type]

    n = len(out_pos)
    structs = [
        _struct(tables[name].spec, converted[name], tables[name].rows, n, spark=spec.spark_types)
        for name in sorted(tables)
    ]

    out_raw: list[str | None] = [None] * n
    out_raw_len: list[int | None] = [None] * n
    for row, error in enumerate(out_errors):
        if error is not None:
            i = out_input[row]
            out_raw[row] = _raw_text(raws[i].rstrip(b"\r\n"))
            out_raw_len[row] = raw_lengths[i]
    arrays = [
        pa.array(out_pos, pa.int64()),
        pa.array(out_source, pa.string()),
        pa.array(out_type, pa.string()),
        pa.array(out_key, pa.string()),
        pa.array(out_ext, pa.string()),
        pa.array(out_hash, pa.string()),
        pa.array(out_payload, pa.binary()).cast(pa.string()),
        pa.array(out_extra, pa.string()),
        pa.array(out_props, pa.string()),
        pa.array(out_errors, pa.string()),
        pa.array(out_raw, pa.string()),
        pa.array(out_raw_len, pa.int64()),
        *structs,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=spec.output_schema())


def _unknown(record: dict[str, Any], skip: frozenset[str]) -> tuple[str | None, str | None]:
    """Fields no column declares: evolvable names (rendered as text) vs ``props`` (kept as JSON)."""
    extra: dict[str, str] = {}
    props: dict[str, Any] = {}
    for name in record.keys() - skip:
        value = record[name]
        if is_safe_column_name(name):
            extra[name] = value if type(value) is str else canonical_value_bytes(value).decode("ascii")
        else:
            props[name] = value
    return (
        orjson.dumps(extra, option=orjson.OPT_SORT_KEYS).decode() if extra else None,
        canonical_value_bytes(props).decode("ascii") if props else None,
    )


def coerce_batches(batches: Iterator[pa.RecordBatch], spec: RecordSpec) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: coerce every batch of a partition."""
    for batch in batches:
        yield coerce_batch(batch, spec)


def _route(record: dict[str, Any], type_field: str | None, builders: dict[str, _TableRows]) -> str:
    assert type_field is not None
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
    if ext_id is not None:
        return ext_id
    if missing_id == "position":
        return source
    if missing_id == "content":
        return digest
    raise _line_error(
        "id", f"field '{id_field}' is missing or null and missing_id is 'reject'", id_field
    )


def _has_nul(value: Any) -> bool:
    """Whether a parsed value holds a NUL character in any key or string."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False
