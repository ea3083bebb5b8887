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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from idem_platform.coercion import native, rules
from idem_platform.coercion.columns import convert_column
from idem_platform.coercion.rules import DROP, EVOLVE, MAX_UNKNOWN_REASONS, STRICT
from idem_platform.coercion.rules import lone_surrogate as _lone_surrogate
from idem_platform.contract.catalog import TableSpec
from idem_platform.contract.keys import record_keys
from idem_platform.migrations import MigrationSource

__all__ = ["DROP", "EVOLVE", "MAX_UNKNOWN_REASONS", "STRICT", "_lone_surrogate"]  # the contract modes' names, for callers

LINE_BITS = 40
LINE_MASK = (1 << LINE_BITS) - 1
RAW_CAP = 4096
UTF8_BOM = b"\xef\xbb\xbf"  # may open a file: not part of its line 1

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
        debezium: records are Debezium change events (``format: debezium``): a record's
            version is its row image at its source position (:func:`rules.debezium_version`),
            and a message without a value (the tombstone after a delete) is skipped and
            counted (:attr:`RepeatedLines.tombstones`), not a reject.
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
    debezium: bool = False

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


_MISSING = object()


def json_equal(value: Any, equals: Any) -> bool:
    """Whether two JSON values are equal as PostgreSQL's ``jsonb`` compares them: numbers by
    value (``1`` equals ``1.0``), a boolean only to a boolean, a string only to a string."""
    if isinstance(value, bool) or isinstance(equals, bool):
        return isinstance(value, bool) and isinstance(equals, bool) and value is equals
    if isinstance(value, (int, float)) and isinstance(equals, (int, float)):
        return value == equals
    return type(value) is type(equals) and value == equals


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
        self._waive_required_of_deletes(errors)
        for index, unknown in self.unknown.items():  # after the row's column errors
            errors.setdefault(index, []).extend(unknown)
        return arrays, errors

    def _waive_required_of_deletes(self, errors: dict[int, list[dict[str, Any]]]) -> None:
        """A delete of an upsert table (``delete_when``) needs its identity and order, not
        the other required columns: a change feed's delete carries little more than its key."""
        upsert = self.spec.upsert
        if upsert is None or not errors:
            return
        if upsert.debezium:
            field_name: str = rules.DEBEZIUM_OP
            equals: Any = "d"
        elif upsert.delete_field is not None and upsert.delete_equals is not None:
            field_name, equals = upsert.delete_field, json.loads(upsert.delete_equals)
        else:
            return
        for index in list(errors):
            if not json_equal(self.records[index].get(field_name, _MISSING), equals):
                continue
            kept = [e for e in errors[index] if e.get("rule") != "required"]
            if kept:
                errors[index] = kept
            else:
                del errors[index]


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
        self.tombstones = 0  # of ``skipped``: Kafka tombstones of a Debezium feed

    def tombstone(self, record_type: str) -> None:
        """A message without a value on a Debezium feed (the one that follows a delete)."""
        self.count(record_type)
        self.tombstones += 1

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
        and not spec.debezium
        and all(c.type.kind in _DIRECT_KINDS for t in spec.tables.values() for c in t.columns)
    )


def _layouts(state: _Batch) -> dict[str, native.DirectLayout]:
    """Per record type, its typed columns' shapes, for the C path's direct facts."""
    layouts = {}
    for name, table in state.tables.items():
        columns = table.spec.columns
        fields: dict[str, int] = {c.name: index for index, c in enumerate(columns)}
        for known in state.ignored:
            fields.setdefault(known, -1)
        layouts[name] = native.DirectLayout(
            fields=fields,
            kinds="".join(_DIRECT_KINDS[c.type.kind] for c in columns).encode(),
            required=bytes(int(c.required) for c in columns),
            dims=tuple(c.type.dim or 0 for c in columns),
            emitted=sum(c.type.kind != "dynamic" for c in columns),
        )
    return layouts


def coerce_batch(
    batch: pa.RecordBatch, spec: RecordSpec, repeats: RepeatedLines | None = None, direct: DirectRows | None = None
) -> pa.RecordBatch:
    """Turn one batch of lines into one batch of coerced rows and rejects.

    Blank lines are dropped (they are not records); every other line yields
    exactly one output row, in input order: a typed row or a reject carrying all
    its errors, except, when ``repeats`` is given, a repeat (same bytes or same
    key) of an earlier good row of the task, which is only counted there. Each
    line's facts are found first (its record and digest: in C when built), then
    every rule of :mod:`~idem_platform.coercion.rules` decides it; typed columns are
    converted a whole column at a time (:mod:`idem_platform.coercion.columns`).

    With ``direct`` (the commit path, when :func:`direct_supported`), the ordinary
    records go to ``direct`` as staging rows instead of into the returned batch.
    """
    return _coerce_batch(batch, spec, repeats, direct if direct is not None and direct_supported(spec) else None)


def _coerce_batch(
    batch: pa.RecordBatch, spec: RecordSpec, repeats: RepeatedLines | None, direct: DirectRows | None
) -> pa.RecordBatch:
    """The steps of :func:`coerce_batch`: each line's facts, the rules, the repeats, the rows."""
    state = _Batch.read(batch, spec, repeats)
    facts = _line_facts(state, direct is not None)
    _decide_lines(state, facts)
    if repeats is not None:
        _repeat_lines(state, facts, repeats)
    _rows(state, facts)
    if direct is not None:
        _direct_rows(state, facts, direct)
    converted = _convert_tables(state)
    if repeats is not None:
        _settle_repeats(state, repeats)
    return _output_batch(batch, state, converted)


# A line's fate (one byte per input line, ``_Batch.fate``).
_NONE, _REJECT, _ROW, _DIRECT, _KNOWN, _IN_BATCH = 0, 1, 2, 3, 4, 5


def _line_facts(state: _Batch, direct: bool) -> native.LineFacts:
    """Each line's facts: in C when built (see coercion/native.py), else none yet (the
    Python path parses every line in :func:`_decide_lines`). A line a repeat memory already
    knows (an earlier batch's good line) or a too long line is not parsed at all."""
    raws, repeats, n = state.raws, state.repeats, len(state.raws)
    if repeats is not None:
        state.known_lines = list(map(repeats.seen.get, raws))  # type: ignore[arg-type]  # a None line is in no memory
    if not native.enabled() or state.spec.debezium:  # a change event's version is read in Python
        return native.LineFacts(bytearray(n), [None] * n, [None] * n, [None] * n, [None] * n, [None] * n)
    known, skipped = state.known_lines, set(state.too_long)
    if known is not None:
        skipped.update(compress(range(n), map(is_not, known, repeat(None))))
    todo = raws
    if skipped:  # ~10% of lines at most: a copy with holes, not a list built line by line
        todo = raws.copy()
        for i in skipped:
            todo[i] = None
    spec = state.spec
    plan = native.ScanPlan(
        shallow=_shallow_fields(spec), layouts=_layouts(state) if direct else None, fixed_type=spec.record_type,
        type_field=None if spec.record_type is not None else spec.record_type_field,
        id_field=spec.id_field, version_field=spec.version_field,
    )
    facts = native.LineFacts(bytearray(), [], [], [], [], [])
    native.scan_lines(todo, plan, facts)
    return facts


def _decide_lines(state: _Batch, facts: native.LineFacts) -> None:
    """Every line's fate by the rules: a reject (its reasons), a row or direct row (its record
    type, external id and key), a line a memory knows, or nothing (a blank line of a file)."""
    kinds = np.frombuffer(facts.kinds, dtype=np.uint8)
    state.fate = bytearray(len(state.raws))
    state.keys = [None] * len(state.raws)
    state.errors = [None] * len(state.raws)
    identify = _identifier(state, facts)
    parse = _line_parser(state, facts)
    for i in np.flatnonzero(kinds == 0).tolist():
        parse(i)
    for i in np.flatnonzero(kinds == 1).tolist():
        identify(i)
    direct = np.flatnonzero(kinds >= 2)
    if len(direct):
        _decide_direct(state, facts, direct, identify)
    fates = np.frombuffer(state.fate, dtype=np.uint8)
    keyed = np.flatnonzero((fates == _ROW) | (fates == _DIRECT)).tolist()
    _at_their_position(state, facts, keyed)
    if keyed:
        keys = record_keys(
            state.spec.connector, _pick(facts.types, keyed), _pick(facts.ids, keyed), _pick(facts.digests, keyed)
        )
        per_line = np.full(len(state.raws), None, dtype=object)
        per_line[keyed] = keys
        state.keys = per_line.tolist()


def _at_their_position(state: _Batch, facts: native.LineFacts, keyed: list[int]) -> None:
    """The rows of tables in the source's order (upsert tables without ``order_by``) are
    versions at their position: the digest (record key and content hash) covers the
    position (``<file sha256[:16]>#L<line>``, ``<topic>-<partition>@<offset>``) and the
    record, so re-reading a position gives the same key again, and the same record at
    another position (a value that comes back) is a new version. Their lines are never
    repeats of their bytes (``state.positional``)."""
    ordered = {name for name, table in state.tables.items() if table.spec.upsert is not None and table.spec.upsert.by_source}
    if not ordered:
        return
    prefixes = [prefix for prefix, _ in state.spec.units]
    types, digests, units, offsets = facts.types, facts.digests, state.units, state.offsets
    sha1 = hashlib.sha1
    for i in keyed:
        if types[i] in ordered:
            position = f"{prefixes[units[i]]}{offsets[i]}"
            digests[i] = sha1(f"{position}\n{digests[i]}".encode()).hexdigest()
            state.positional.add(i)


def _pick(values: list[Any], at: list[int]) -> list[Any]:
    """``[values[i] for i in at]``, gathered in C (``itemgetter``: a third of the comprehension's cost)."""
    return list(itemgetter(*at)(values)) if len(at) > 1 else [values[i] for i in at]


def _line_parser(state: _Batch, facts: native.LineFacts) -> Callable[[int], None]:
    """``parse(i)``: a line without facts (the Python path's every line, the C path's doubted
    ones): nothing if blank in a file or known to a memory, else parsed and decided, or the
    reject (no value, blank, too long, or :func:`rules.parsed`'s)."""
    raws, lines, known = state.raws, state.spec.lines, state.known_lines
    noun, too_long, raw_lengths, limit = state.spec.noun, state.too_long, state.raw_lengths, state.spec.max_line_bytes
    identify, fate = _identifier(state, facts), state.fate
    sha1 = hashlib.sha1
    debezium = _debezium_reader(state, facts)

    def parse(i: int) -> None:
        raw = raws[i]
        if raw is None and debezium is not None:
            if state.repeats is not None:
                state.repeats.tombstone(state.spec.record_type or "")
            return  # a tombstone: expected after a delete, no record
        blank = not raw or raw.isspace()
        if blank and lines and raw is not None:
            return  # a blank line is not a record (its number still counts)
        if known is not None and known[i] is not None:
            fate[i] = _KNOWN
            return
        try:
            if blank or raw is None:
                if raw is None:
                    raise rules.line_error("no_value", f"{noun} has no value (null: a tombstone or a deletion marker)")
                raise rules.line_error("blank", f"{noun} is blank")
            if i in too_long:
                raise rules.line_error(
                    "too_long", f"{noun} is {int(raw_lengths[i])} bytes long; the limit is {limit} (max_line_bytes)"
                )
            facts.records[i], canonical = rules.parsed(raw, noun)
            if debezium is not None:
                canonical = debezium(i)
        except rules.Reject as reject:
            facts.records[i] = None
            fate[i] = _REJECT
            state.errors[i] = json.dumps(reject.errors, ensure_ascii=False)
            return
        facts.digests[i] = sha1(canonical).hexdigest()
        identify(i)

    return parse


def _debezium_reader(state: _Batch, facts: native.LineFacts) -> Callable[[int], bytes] | None:
    """``version(i)`` of a Debezium feed (else ``None``): line ``i``'s parsed event becomes
    its row image (``facts.records``), external id (``facts.ids``) and the row image as
    ``_upgraded`` (what the apply reads values from in place of the envelope); returns the
    canonical bytes of the normalized version (the key's and hash's), or rejects."""
    spec = state.spec
    if not spec.debezium or spec.record_type is None:
        return None
    record_type = spec.record_type
    upsert = spec.tables[record_type].upsert
    assert upsert is not None and upsert.debezium  # the config refuses a Debezium feed of any other table
    identity, current = upsert.identity, state.currents[record_type]

    def version(i: int) -> bytes:
        record, canonical, ext = rules.debezium_version(facts.records[i], identity)  # type: ignore[arg-type]
        facts.records[i], facts.ids[i] = record, ext
        image = {k: v for k, v in record.items() if k != rules.DEBEZIUM_OP}
        state.upgraded[i] = (current, record, rules.canonical_value_bytes(image).decode("utf-8"))
        return canonical

    return version


def _identifier(state: _Batch, facts: native.LineFacts) -> Callable[[int], None]:
    """``identify(i)``: a parsed line's record type, external id and version (its upgrade noted
    in ``state.upgraded``), by the rules: its fate ``_ROW``, or ``_REJECT`` with the reasons."""
    spec, tables, currents, upgraded, units, offsets = (
        state.spec, state.tables, state.currents, state.upgraded, state.units, state.offsets
    )
    fixed_type, type_field, id_field, missing_id = spec.record_type, spec.record_type_field, spec.id_field, spec.missing_id
    version_field, declared, migrations = spec.version_field, spec.declared_version, spec.migrations
    prefixes = [prefix for prefix, _ in spec.units]
    records, digests, types, ids, fate, errors = facts.records, facts.digests, facts.types, facts.ids, state.fate, state.errors
    positional = state.positional
    debezium = spec.debezium

    def identify(i: int) -> None:
        record, digest = records[i], digests[i]
        assert record is not None and digest is not None
        if debezium:  # routed, identified and at its version by the change event (_debezium_reader)
            fate[i], types[i] = _ROW, fixed_type
            return
        try:
            # The common cases inline (a type of the connector, a plain id, no version stated or
            # declared): every other value goes to the rule itself, which decides it.
            record_type = fixed_type if fixed_type is not None else record.get(type_field)  # type: ignore[arg-type]
            if type(record_type) is not str or record_type not in tables:
                record_type = rules.route(record, type_field, tables)
            ext_id = record.get(id_field)
            if type(ext_id) is not str or not ext_id:  # numbers, missing or empty ids, objects: the exact rules
                ext_id = rules.ext_id(record, id_field, missing_id, f"{prefixes[units[i]]}{offsets[i]}", digest)
                if rules.positional(record, id_field, missing_id):
                    positional.add(i)
            if declared is not None or record.get(version_field) is not None:
                current = currents[record_type]
                version = rules.stated_version(record, version_field, declared, current)
                if version is not None:
                    record = _whole(state, i, record)
                    upgraded[i] = rules.upgrade(record, record_type, version, current, version_field, migrations)
        except rules.Reject as reject:
            fate[i] = _REJECT
            errors[i] = json.dumps(reject.errors, ensure_ascii=False)
            records[i] = digests[i] = types[i] = ids[i] = None
            return
        fate[i], types[i], ids[i] = _ROW, record_type, ext_id

    return identify


def _whole(state: _Batch, i: int, record: dict[str, Any]) -> dict[str, Any]:
    """The line's record with every value: a migration reads the whole record, while the C
    path leaves ``...`` for the fields the commit never reads (:func:`_shallow_fields`)."""
    if not any(value is Ellipsis for value in record.values()):
        return record
    raw = state.raws[i]
    assert raw is not None  # a line with a record has its bytes
    got = native.canonical_line(raw, frozenset())  # type: ignore[misc]
    assert got is not None  # the line parsed once already
    return got[0]


def _decide_direct(state: _Batch, facts: native.LineFacts, lines: np.ndarray, identify: Callable[[int], None]) -> None:
    """Lines with direct facts (a plain record: its type, a plain id, no stated version, its
    typed columns): direct rows, unless a rule needs the record (unknown fields its contract
    does not drop, a declared version): then its record is read and it is decided as any."""
    spec, types = state.spec, facts.types
    if spec.record_type is not None:
        fixed = np.asarray(types, dtype=object)
        fixed[lines] = spec.record_type
        types[:] = fixed.tolist()
    kinds = np.frombuffer(facts.kinds, dtype=np.uint8)
    if spec.declared_version is not None:
        need = lines
    else:  # unknown fields (kind 3) matter unless the type's contract drops them
        unknown = lines[kinds[lines] == 3].tolist()
        need = np.asarray([i for i in unknown if state.tables[types[i]].contract != rules.DROP], dtype=np.int64)
    np.frombuffer(state.fate, dtype=np.uint8)[lines] = _DIRECT
    shallow = _shallow_fields(spec)
    for i in need.tolist():
        got = native.canonical_line(state.raws[i], shallow)  # type: ignore[misc]
        assert got is not None  # the line parsed once already
        facts.records[i], _, facts.digests[i] = got
        identify(i)


def _repeat_lines(state: _Batch, facts: native.LineFacts, repeats: RepeatedLines) -> None:
    """The repeat rules, in input order: a line an earlier batch's good line (same bytes) or
    row (same key) already gave is counted; a key first met earlier in this batch makes the
    line a repeat of that row (``_IN_BATCH``: settled once that row is); a too long line
    whose bytes are an earlier good line of the batch is a repeat of it too. A direct row's
    key is remembered for good at once (its record type: a direct row is good for sure)."""
    fate, keys, known_lines, types = state.fate, state.keys, state.known_lines, facts.types
    seen_keys = repeats.keys
    seen_get = seen_keys.get
    tracked: dict[bytes | None, int] | None = {} if state.too_long else None
    fates = np.frombuffer(fate, dtype=np.uint8)
    # Only lines with a key or known bytes matter (all of them when too long lines are tracked).
    lines = range(len(keys)) if tracked is not None else np.flatnonzero(fates >= _ROW).tolist()
    for i in lines:
        key = keys[i]
        if key is None:
            if fate[i] == _KNOWN:
                repeats.count(known_lines[i])  # type: ignore[index, arg-type]
            elif tracked is not None and i in state.too_long and (first := tracked.get(state.raws[i])) is not None:
                _repeat_of(state, facts, repeats, i, first)
            continue
        known = seen_get(key)
        if known is None:  # this batch's line: a direct row's type, a row's number once settled
            seen_keys[key] = types[i] if fate[i] == _DIRECT else i  # type: ignore[assignment]
            if tracked is not None and i not in state.positional:
                tracked.setdefault(state.raws[i], i)
        elif type(known) is int:
            _repeat_of(state, facts, repeats, i, known)
        else:
            fate[i] = _NONE
            repeats.count(known)  # type: ignore[arg-type]


def _repeat_of(state: _Batch, facts: native.LineFacts, repeats: RepeatedLines, i: int, first: int) -> None:
    """Line ``i`` repeats this batch's line ``first``: counted if that is a direct row (good
    for sure), else settled with it."""
    if state.fate[first] == _DIRECT:
        state.fate[i] = _NONE
        repeats.count(facts.types[first])  # type: ignore[arg-type]
    else:
        state.fate[i] = _IN_BATCH
        state.first[i] = first


def _rows(state: _Batch, facts: native.LineFacts) -> None:
    """The output rows (rejects and rows, in input order), the tables' records and their
    unknown fields, and, with repeats, the memories of this batch's rows."""
    fate = np.frombuffer(state.fate, dtype=np.uint8)
    produced = np.flatnonzero((fate == _REJECT) | (fate == _ROW))
    row_of = np.full(len(fate), -1, dtype=np.int64)
    row_of[produced] = np.arange(len(produced), dtype=np.int64)
    at = produced.tolist()
    out, raws, errors = state.out, state.raws, state.errors
    out.input = at
    out.type, out.key, out.ext, out.hash = (
        [facts.types[i] for i in at], [state.keys[i] for i in at], [facts.ids[i] for i in at],
        [facts.digests[i] for i in at],
    )
    out.payload = [raws[i] if errors[i] is None else None for i in at]
    out.errors = [errors[i] for i in at]
    out.extra, out.props = [None] * len(at), [None] * len(at)
    rows = row_of.tolist()
    _fill_tables(state, facts, np.flatnonzero(fate == _ROW).tolist(), rows)
    state.repeated_in_batch = [(i, rows[first]) for i, first in state.first.items()]
    if state.repeats is not None:
        _remember(state, facts, state.repeats, rows)


def _fill_tables(state: _Batch, facts: native.LineFacts, lines: list[int], rows: list[int]) -> None:
    """Each row's record into its table (upgraded, if it was), and what its unknown fields do."""
    out, upgraded, tables = state.out, state.upgraded, state.tables
    for i in lines:
        table = tables[facts.types[i]]  # type: ignore[index]
        table.rows.append(rows[i])
        table.records.append(upgraded[i][1] if i in upgraded else facts.records[i])  # type: ignore[arg-type]
    for name, table in tables.items():
        if table.contract == rules.DROP:
            continue
        skip = table.skip
        for local, record in enumerate(table.records):
            if not record.keys() <= skip:  # unknown fields: rare, only they cost
                row = table.rows[local]
                out.extra[row], out.props[row], unknown = rules.unknown_fields(record, skip, table.contract, name)
                if unknown is not None:
                    table.unknown[local] = unknown


def _remember(state: _Batch, facts: native.LineFacts, repeats: RepeatedLines, rows: list[int]) -> None:
    """This batch's kept lines into the memories: a direct row's for good (its record type),
    a row's provisionally (its row, settled with the row: ``state.fresh``)."""
    seen_lines, seen_keys, raws, keys, types = repeats.seen, repeats.keys, state.raws, state.keys, facts.types
    fates = np.frombuffer(state.fate, dtype=np.uint8)
    at = np.flatnonzero(fates == _DIRECT).tolist()
    if state.positional:
        at = [i for i in at if i not in state.positional]
    if at:  # (their keys are remembered for good already: _repeat_lines)
        seen_lines.update(zip(_pick(raws, at), _pick(types, at), strict=True))
    at = np.flatnonzero(fates == _ROW).tolist()
    row_keys, row_rows = [keys[i] for i in at], [rows[i] for i in at]
    seen_keys.update(zip(row_keys, row_rows, strict=True))  # type: ignore[arg-type]
    if state.positional:  # a row keyed by its position is no repeat of its bytes: its line is not remembered
        row_raws = [None if i in state.positional else raws[i] for i in at]
        seen_lines.update((raw, row) for raw, row in zip(row_raws, row_rows, strict=True) if raw is not None)
    else:
        row_raws = [raws[i] for i in at]
        seen_lines.update(zip(row_raws, row_rows, strict=True))  # type: ignore[arg-type]
    state.fresh.extend(zip(row_raws, row_keys, row_rows, strict=True))  # type: ignore[arg-type]


def _direct_rows(state: _Batch, facts: native.LineFacts, direct: DirectRows) -> None:
    """The direct rows' COPY tuples, per record type (written in C from the lines' facts and
    the keys the rules gave them)."""
    spec, names = state.spec, list(state.tables)
    direct_at = np.flatnonzero(np.frombuffer(state.fate, dtype=np.uint8) == _DIRECT)
    code_of = {name: code for code, name in enumerate(names)}
    codes = np.fromiter(map(code_of.__getitem__, map(facts.types.__getitem__, direct_at.tolist())), np.int64, len(direct_at))  # type: ignore[arg-type]
    lines = {name: direct_at[codes == code].tolist() for code, name in enumerate(names)}
    units64 = state.units.astype(np.int64)
    bases = np.asarray([base for _, base in spec.units] or [0], dtype=np.int64)
    offsets64 = state.offsets.astype(np.int64)
    pos, offsets, units = ((units64 << LINE_BITS) | (offsets64 - bases[units64])).tobytes(), offsets64.tobytes(), units64.tobytes()
    prefixes = [prefix.encode() for prefix, _ in spec.units]
    for name, at in lines.items():
        keys = _pick(state.keys, at)
        columns = state.tables[name].spec.columns
        native.write_direct(native.DirectWrite(
            lines=at, keys=keys, ids=facts.ids, digests=facts.digests, tails=facts.tails, raws=state.raws,
            pos=pos, offsets=offsets, units=units, prefixes=prefixes,
            emitted=sum(c.type.kind != "dynamic" for c in columns),
            rows=direct.rows.setdefault(name, bytearray()), ends=direct.ends.setdefault(name, []),
        ))
        direct.keys.setdefault(name, []).extend(keys)


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
    # Per input line (set by _line_facts and _decide_lines): its fate (``_NONE``, ``_ROW``, ...),
    # key, reject reasons (JSON) and, with repeats, the record type an earlier batch gave its bytes.
    fate: bytearray = field(default_factory=bytearray)
    keys: list[str | None] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    known_lines: list[str | int | None] | None = None
    first: dict[int, int] = field(default_factory=dict)  # in-batch repeat -> the line it repeats
    # The rows keyed by their position (rules.positional: never repeats, their lines never remembered).
    positional: set[int] = field(default_factory=set)
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
        # A Debezium row image has no id, type or version field: every field of it is the row's.
        ignored = frozenset(
            spec.ignored_fields
            | ({rules.DEBEZIUM_OP} if spec.debezium else {spec.id_field, spec.version_field})
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


def coerce_batches(batches: Iterator[pa.RecordBatch], spec: RecordSpec) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: coerce every batch of a partition."""
    for batch in batches:
        yield coerce_batch(batch, spec)


