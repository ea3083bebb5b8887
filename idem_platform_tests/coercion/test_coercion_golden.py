"""Golden cases of DESIGN §3, one per cell: catalog type x JSON value -> Arrow value, stored value or reject.

``cases/coercion_golden.jsonl`` holds one case a line:

* ``id``: the case's name (also the record's ``id``);
* ``type``, ``required``, ``field``: the column the value is coerced to;
* ``json``: the value as raw JSON text, written into the record as it stands
  (``1E2`` stays ``1E2``, ``"\\ud83d\\ude00"`` stays escaped); ``null`` = the
  field is missing from the record;
* the outcome, either
  - ``arrow``: the coerced Arrow value in a JSON-comparable form (timestamps as
    epoch nanoseconds, vectors as their float32 values, ``dynamic`` as its
    canonical JSON text) and ``stored``: what PostgreSQL returns for it
    (timestamps as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC, ``real[]`` and jsonb as
    psycopg reads them), or
  - ``reject``: the exact reason ``idem.rejects.reasons`` holds (``field``,
    ``rule``, ``message``);
* ``note`` (optional): why the cell is what it is, where DESIGN §3 does not
  spell it out.

Values are compared as canonical JSON text, so ``1`` is not ``1.0`` and ``-0.0``
is not ``0.0``.

:func:`test_golden_case` runs every case through :func:`coerce_batch` (no
Spark); :func:`test_golden_cases_through_the_commit_path` writes them all to one
file, ingests it once with Spark and compares what PostgreSQL stores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from psycopg import sql

from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.contract.catalog import SCALAR_KINDS, Column, ColumnType, TableSpec
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.paths import CASES_DIR

CASES_FILE = CASES_DIR / "coercion_golden.jsonl"
CONNECTOR = "golden"
_KEYS = {"id", "type", "required", "field", "json", "arrow", "stored", "reject", "note"}


@dataclass(frozen=True)
class Case:
    """One cell of the coercion table (see the module docstring for the fields)."""

    id: str
    type: str
    required: bool
    field: str
    json: str | None
    arrow: Any = None
    stored: Any = None
    reject: dict[str, Any] | None = None
    note: str | None = None

    @property
    def column(self) -> Column:
        return Column(self.field, ColumnType.parse(self.type), required=self.required)

    @property
    def table(self) -> str:
        """The record type holding this case's column: one per (type, required)."""
        kind = str(ColumnType.parse(self.type)).replace("(", "_").rstrip(")")
        return f"g_{kind}" + ("_required" if self.required else "")

    def line(self) -> str:
        """The record, the value's JSON text written into it verbatim (or the field left out)."""
        head = f'{{"type":{json.dumps(self.table)},"id":{json.dumps(self.id)}'
        return head + ("}" if self.json is None else f",{json.dumps(self.field)}:{self.json}}}")


@cache
def load_cases() -> tuple[Case, ...]:
    cases = []
    for number, text in enumerate(CASES_FILE.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        data = json.loads(text)
        where = f"{CASES_FILE.name}:{number}"
        assert not set(data) - _KEYS, f"{where}: unknown keys {sorted(set(data) - _KEYS)}"
        outcome = {"arrow", "stored", "reject"} & set(data)
        assert outcome in ({"arrow", "stored"}, {"reject"}), f"{where}: either arrow and stored, or reject"
        cases.append(Case(**data))
    return tuple(cases)


def table_specs(cases: tuple[Case, ...]) -> dict[str, TableSpec]:
    """The record types the cases need: one table with one column per (type, required)."""
    columns: dict[str, Column] = {}
    for case in cases:
        known = columns.setdefault(case.table, case.column)
        assert known == case.column, f"{case.id}: table {case.table} already has column {known}"
    return {name: TableSpec(name, 1, (column,)) for name, column in columns.items()}


def canonical(value: Any) -> str:
    """Strict JSON-comparable form: ``1`` != ``1.0``, ``-0.0`` != ``0.0``."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def arrow_form(array: pa.Array) -> Any:
    """The one value of a coerced column, JSON-comparable (see the module docstring)."""
    if pa.types.is_timestamp(array.type):
        return array.cast(pa.int64()).to_pylist()[0]
    value = array.to_pylist()[0]
    if isinstance(value, bytes):  # dynamic: canonical JSON bytes (ASCII)
        return value.decode("ascii")
    return value


def stored_form(value: Any) -> Any:
    """A value as psycopg returns it, JSON-comparable."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


CASES = load_cases()
SPEC = RecordSpec(
    connector=CONNECTOR,
    tables=table_specs(CASES),
    units=(("0123456789abcdef#L", 0),),
    record_type_field="type",
    id_field="id",
    missing_id="reject",
)


def test_the_cases_cover_every_catalog_type_both_ways() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    kinds = {ColumnType.parse(case.type).kind for case in CASES}
    assert kinds == {*SCALAR_KINDS, "vector"}
    for kind in kinds:
        mine = [c for c in CASES if ColumnType.parse(c.type).kind == kind]
        assert any(c.reject is None for c in mine) and any(c.reject for c in mine), kind
        assert any(c.json == "null" and not c.required and c.reject is None for c in mine), f"{kind}: null"
        assert any(c.required and c.reject and c.reject["rule"] == "required" for c in mine), f"{kind}: required"


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_golden_case(case: Case) -> None:
    """A one-line batch through the executors' coercion, without Spark: the Arrow value or the exact reason."""
    out = coerce_batch(lines_batch([case.line().encode()]), SPEC)
    assert out.num_rows == 1
    row = out.to_pylist()[0]
    if case.reject is not None:
        assert row["_errors"] is not None, f"accepted as {row[case.table]}"
        assert json.loads(row["_errors"]) == [case.reject]
        assert row["_record_type"] is None and row[case.table] is None
        return
    assert row["_errors"] is None, json.loads(row["_errors"])
    assert row["_record_type"] == case.table
    struct = out.column(case.table)
    assert isinstance(struct, pa.StructArray)
    assert canonical(arrow_form(struct.field(case.field))) == canonical(case.arrow)


def test_golden_cases_through_the_commit_path(pg_url: str, tmp_path: Path, spark: Any) -> None:
    """Every case in one file, ingested once with Spark: what PostgreSQL stores, and every reject."""
    reset_database(pg_url)
    tables = "\n".join(
        f"  {name}:\n    columns:\n      {column.name}: "
        f"{{type: {column.type}, required: {str(column.required).lower()}}}"
        for name, spec in sorted(SPEC.tables.items())
        for column in spec.columns
    )
    config = write_config(
        tmp_path,
        f"connectors:\n  - {{name: {CONNECTOR}, kind: filedrop, path: drop, record_type_field: type, "
        f"id_field: id, missing_id: reject}}\ntables:\n{tables}\n",
    )
    assert {name: spec.columns for name, spec in config.table_specs.items()} == {
        name: spec.columns for name, spec in SPEC.tables.items()
    }
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    connector = config.connector(CONNECTOR)
    assert connector.path is not None
    path = write_lines(connector.path / "golden.ndjson", [case.line() for case in CASES])

    batch = pipeline.plan_batch(pg_url, connector, [path])
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, config, connector))
    request = run.CommitRequest(url=pg_url, connector=connector, run_id="golden")
    summary = run.commit_batch(request, coerced, lambda: spark)

    accepted = [case for case in CASES if case.reject is None]
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (
        len(accepted),
        0,
        len(CASES) - len(accepted),
    )
    stored: dict[str, Any] = {}
    with connect(pg_url) as conn:
        for name, spec in SPEC.tables.items():
            query = sql.SQL("SELECT _external_id, {} FROM idem.{}").format(
                sql.Identifier(spec.columns[0].name), sql.Identifier(name)
            )
            stored.update((ext_id, stored_form(value)) for ext_id, value in conn.execute(query))
        rejected = dict(conn.execute("SELECT line, reasons FROM idem.rejects").fetchall())
    wrong = []
    for line, case in enumerate(CASES, 1):
        if case.reject is not None:
            if rejected.get(line) != [case.reject]:
                got = rejected.get(line) or f"a row {stored.get(case.id)!r}"
                wrong.append(f"{case.id}: expected reject {case.reject}, got {got}")
        elif case.id not in stored or canonical(stored[case.id]) != canonical(case.stored):
            got = stored.get(case.id, "<no row>")
            wrong.append(f"{case.id}: expected {canonical(case.stored)}, stored {got!r}")
    assert not wrong, "\n".join(wrong)
