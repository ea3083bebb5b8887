"""Executors: the rows of a read batch that are older than their table, upgraded to its current shape.

Current rows are not touched (a compare on ``_schema_version`` per batch, in Arrow):
only old rows reach Python. For each, ``_payload`` (the record as received) is
parsed, the version field of the connector that wrote it is dropped, the chain
``v -> v+1 -> ... -> current`` runs (:meth:`~idem_platform.migrations.Chains.upgrade`),
and the upgraded records are coerced with the current catalog by the ingest path's
own converters (:func:`~idem_platform.coercion.columns.convert_column`), so an
upgraded row holds exactly what ingesting the upgraded record would write:

* typed columns as ingest types them (timestamps to the microsecond, rounded half
  up; ``dynamic`` values as canonical JSON text);
* a retyped column's companion as ``idem.promote_<kind>`` would cast its text
  (:func:`~idem_platform.postgres.retype.reference_cast`, the cast's reference);
* ``props``: the upgraded record's fields that are no column of the table (unless
  the connector's contract is ``drop``), as canonical JSON. A read adds no column,
  so a field that ingest would have evolved into a new column lands here.

A row whose migration raises, or whose upgraded record does not fit the catalog
(a ``required`` column left empty, a value of the wrong type), fails the read with
:class:`~idem_platform.migrations.MigrationFailed` naming its key and the step;
with ``skip``, it is left out; with ``keep``, it stays with its reason in
``_migration_error`` (how failures are counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import repeat
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from idem_platform.coercion.columns import convert_column
from idem_platform.coercion.records import _for_spark
from idem_platform.contract.canonical import InvalidJSON, canonical_value_bytes, parse_json_slow
from idem_platform.contract.catalog import Column
from idem_platform.migrations import Chains, MigrationFailed
from idem_platform.postgres.retype import reference_cast
from idem_platform.read.decode import read_rows
from idem_platform.read.plan import ERROR_COLUMN, ConnectorRules, ReadPlan

RAISE, SKIP, KEEP = "raise", "skip", "keep"  # what a failing row does to the read


def parse_payload(text: str) -> Any:
    """``_payload`` (PostgreSQL's jsonb text) as the record, integers exact.

    orjson reads an integer past 64 bits as a float (written back as ``1.2e+22``;
    PostgreSQL itself never writes an exponent): such a payload is parsed again by
    :mod:`json`, which keeps it exact (the canonical form's rule, :mod:`idem_platform.contract.canonical`).
    """
    value = orjson.loads(text)
    if b"e+" in orjson.dumps(value):
        return parse_json_slow(text.encode("utf-8"))
    return value


def json_text(value: Any) -> str:
    """A ``dynamic`` value as JSON text (equal as JSON to what PostgreSQL returns for ingested rows)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except TypeError:  # an integer past 64 bits
        return canonical_value_bytes(value).decode("utf-8")


def upgraded_partition(plan: ReadPlan, index: int, mode: str = RAISE) -> Iterator[pa.RecordBatch]:
    """Partition ``index`` of the plan in the current shape: its non-empty batches, old rows
    upgraded (:func:`upgrade_batch`). What the ``idem_table`` source yields on an executor."""

    for batch in read_rows(plan, index, plan.arrow_schema()):
        upgraded = upgrade_batch(batch, plan, mode)
        if upgraded.num_rows:
            yield upgraded


def upgrade_batch(batch: pa.RecordBatch, plan: ReadPlan, mode: str = RAISE) -> pa.RecordBatch:
    """``batch`` in the current shape: every ``_schema_version`` the current one, old rows upgraded.

    Raises:
        MigrationFailed: (``mode`` ``raise``) a row's migration raised, or its upgraded
            record does not fit the catalog; names the row's key and the step.
    """
    rows = batch.num_rows
    names = batch.schema.names
    stored = batch.column("_schema_version")
    current = plan.current_version
    old = np.asarray(pc.fill_null(pc.not_equal(stored, current), False))
    version_index = names.index("_schema_version")
    batch = batch.set_column(version_index, batch.schema.field(version_index), pa.array(np.full(rows, current, np.int32)))
    if not old.any():
        return batch
    positions = np.flatnonzero(old)
    upgraded = _Upgrade(plan, mode)
    replacements = upgraded.run(
        keys=batch.column("_idempotency_key").take(positions),
        versions=stored.take(positions),
        connectors=batch.column("_connector").take(positions),
        payloads=batch.column("_payload").take(positions),
    )
    index = np.arange(rows, dtype=np.int64)
    index[positions] = rows + np.arange(len(positions), dtype=np.int64)
    taken = pa.array(index)
    for name, values in replacements.items():
        i = names.index(name)
        merged = pa.concat_arrays([batch.column(i), values.cast(batch.schema.field(i).type)]).take(taken)
        batch = batch.set_column(i, batch.schema.field(i), merged)
    if mode == SKIP and upgraded.failures:
        keep = np.ones(rows, dtype=bool)
        keep[positions[sorted(upgraded.failures)]] = False
        batch = batch.filter(pa.array(keep))
    return batch


class _Upgrade:
    """The old rows of one batch: migrated, then coerced column by column."""

    def __init__(self, plan: ReadPlan, mode: str) -> None:
        self.plan = plan
        self.mode = mode
        self.chains: Chains = plan.migrations.chains()
        self.failures: dict[int, str] = {}  # local row -> why (skip/keep)
        self._rules: dict[str, ConnectorRules] = {}
        self._allowed: dict[str, tuple[bool, frozenset[str]]] = {}  # connector -> (drop?, fields never in props)

    def _fail(self, local: int, error: MigrationFailed) -> None:
        if self.mode == RAISE:
            raise error
        self.failures[local] = str(error)

    def _rules_of(self, connector: str) -> ConnectorRules:
        rules = self._rules.get(connector)
        if rules is None:
            rules = self._rules[connector] = self.plan.rules(connector)
        return rules

    def run(self, *, keys: pa.Array, versions: pa.Array, connectors: pa.Array, payloads: pa.Array) -> dict[str, pa.Array]:
        """The replacement values of the old rows, per frame column.

        Rows are grouped by (stored version, connector), usually one or two groups a
        batch, so each group's path and rules are looked up once and each step runs
        over the group in one loop (:meth:`~idem_platform.migrations.Chains.upgrade_many`).
        """
        plan = self.plan
        record_type = plan.record_type
        key_of = _Keys(keys)
        stored = [int(v) for v in versions.to_numpy(zero_copy_only=False)]
        records: list[dict[str, Any] | None] = _parse_payloads(payloads)
        for local, record in enumerate(records):
            if type(record) is not dict:
                problem = record if isinstance(record, _Unparsed) else "_payload is not a JSON object"
                step = f"{record_type} v{stored[local]}->v{plan.current_version}"
                records[local] = None
                self._fail(local, MigrationFailed(
                    f"migration {step} on row {key_of(local)}: {problem}", step=step, key=key_of(local)
                ))
        encoded = pc.dictionary_encode(connectors)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        names = encoded.dictionary.to_pylist()
        version_array = np.asarray(stored, dtype=np.int64)
        connector_names: list[str] = [names[code] for code in codes.tolist()]
        for version in np.unique(version_array).tolist():
            for code, connector in enumerate(names):
                where = np.flatnonzero((version_array == version) & (codes == code))
                if not len(where):
                    continue
                field = self._rules_of(connector).version_field
                group: list[dict[str, Any] | None] = [records[i] for i in where]
                for record in group:
                    if record is not None:
                        record.pop(field, None)
                positions = where.tolist()

                def failed(at: int, error: MigrationFailed, positions: list[int] = positions) -> None:
                    self._fail(positions[at], error)

                def key_at(at: int, positions: list[int] = positions) -> str:
                    return key_of(positions[at])

                try:
                    self.chains.upgrade_many(record_type, group, int(version), key_at, failed)
                except MigrationFailed as exc:
                    if self.mode == RAISE or exc.key is not None:
                        raise
                    for at, position in enumerate(positions):  # the version itself has no path
                        group[at] = None
                        self.failures[position] = str(exc)
                for position, record in zip(positions, group, strict=True):
                    if record is not None:
                        record.pop(field, None)
                    records[position] = record
        upgraded = [record if record is not None else {} for record in records]
        return self._coerce(upgraded, key_of, stored, connector_names)

    def _coerce(
        self, records: list[dict[str, Any]], key_of: _Keys, versions: list[int], connectors: list[str]
    ) -> dict[str, pa.Array]:
        plan = self.plan
        out: dict[str, pa.Array] = {}
        by_name: dict[str, Column] = {c.name: c for c in plan.spec.columns}
        texts: dict[str, list[Any]] = {}
        for column in plan.columns:
            if column.role != "typed":
                continue
            catalog = by_name[column.name]
            values = list(map(dict.get, records, repeat(column.name)))  # one C-level pass per column
            present = [column.name in record for record in records] if catalog.required else None
            if catalog.type.kind == "dynamic":  # any JSON value: only `required` can fail
                array, errors = convert_column(catalog, values, present, dynamic_values=False)
                array = pa.array([None if v is None else json_text(v) for v in values], pa.string())
            else:
                array, errors = convert_column(catalog, values, present, dynamic_values=True)
            for local, error in errors:
                if local not in self.failures:
                    self._fail(local, self._misfit(key_of(local), versions[local], error))
            if catalog.retyped is not None:
                texts[column.name] = array.to_pylist()
            out[column.name] = _frame_array(array, column.arrow)
        for catalog in plan.spec.retyped_columns():
            assert catalog.retyped is not None and catalog.typed_column is not None
            kind = catalog.retyped.kind
            cast = [None if text is None else reference_cast(kind, text) for text in texts[catalog.name]]
            target = next(c.arrow for c in plan.columns if c.name == catalog.typed_column)
            out[catalog.typed_column] = pa.array(cast, type=target)
        out["props"] = pa.array(
            [self._props(record, connector) for record, connector in zip(records, connectors, strict=True)], pa.string()
        )
        if self.failures:
            failed = np.zeros(len(records), dtype=bool)
            failed[sorted(self.failures)] = True
            mask = pa.array(failed)
            out = {name: pc.if_else(mask, pa.scalar(None, array.type), array) for name, array in out.items()}
        out[ERROR_COLUMN] = pa.array([self.failures.get(local) for local in range(len(records))], pa.string())
        return out

    def _misfit(self, key: str, version: int, error: dict[str, Any]) -> MigrationFailed:
        plan = self.plan
        step = f"{plan.record_type} v{version}->v{plan.current_version}"
        names = ", ".join(m.name for m in self.chains.path(plan.record_type, version))
        return MigrationFailed(
            f"migration {step} ({names}) on row {key}: the upgraded record does not fit the catalog of "
            f"{plan.record_type}: {error.get('message')} [{error.get('rule')}]",
            step=step,
            function=names,
            key=key,
        )

    def _props(self, record: dict[str, Any], connector: str) -> str | None:
        """The upgraded record's fields that are no column: what ``props`` holds for it."""
        if not record:
            return None
        found = self._allowed.get(connector)
        if found is None:
            rules = self._rules_of(connector)
            found = self._allowed[connector] = (
                rules.contract == "drop", frozenset(self.plan.spec.column_names()) | rules.known
            )
        drop, allowed = found
        if drop or record.keys() <= allowed:
            return None
        unknown = sorted(record.keys() - allowed)
        return canonical_value_bytes({name: record[name] for name in unknown}).decode("utf-8")


class _Keys:
    """The old rows' keys, converted one by one when an error needs to name one."""

    def __init__(self, keys: pa.Array) -> None:
        self._keys = keys

    def __call__(self, local: int) -> str:
        return str(self._keys[local].as_py())


class _Unparsed(str):
    """Why a ``_payload`` did not parse (in place of its record)."""


# A run of 20 digits: an integer that may be past 64 bits (orjson reads those as floats).
_LONG_DIGITS = r"[0-9]{20}"


def _parse_payloads(payloads: pa.Array) -> list[Any]:
    """Each ``_payload`` parsed (:func:`parse_payload`'s rules); a row that is not JSON holds
    the problem's text instead. Only payloads with 20 digits in a row (found by one Arrow
    pass) take the exact-integer check."""
    texts = payloads.to_pylist()
    suspect = np.asarray(pc.fill_null(pc.match_substring_regex(payloads, _LONG_DIGITS), False))
    loads = orjson.loads
    out: list[Any] = []
    append = out.append
    for text in texts:
        try:
            append(loads(text))
        except (orjson.JSONDecodeError, TypeError) as exc:
            append(_Unparsed(f"_payload is not JSON ({exc})"))
    for local in np.flatnonzero(suspect).tolist():
        try:
            out[local] = parse_payload(texts[local])
        except (InvalidJSON, orjson.JSONDecodeError) as exc:
            out[local] = _Unparsed(f"_payload is not JSON ({exc})")
    return out


def _frame_array(array: pa.Array, target: pa.DataType) -> pa.Array:
    """A converted column (the catalog's Arrow type) in the frame's type."""
    if pa.types.is_binary(array.type):  # dynamic: canonical JSON bytes
        return array.cast(pa.string())
    return _for_spark(array, target)
