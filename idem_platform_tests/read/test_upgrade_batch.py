"""One read batch through :func:`~idem_platform.read.upgrade.upgrade_batch`, no Spark, no PostgreSQL.

The executors group a batch's old rows by stored version and connector and run each
step over a group in one loop; these tests pin what that must keep of the row-by-row
rules: every failure kind names its own row, failing rows never disturb their
neighbours, groups of two connectors strip each one's own version field, and an
integer past 64 bits in ``_payload`` stays exact.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from idem_platform.contract.catalog import SYSTEM_COLUMNS, Column, ColumnType, TableSpec
from idem_platform.migrations import MigrationFailed, MigrationSource
from idem_platform.read.plan import ERROR_COLUMN, ConnectorRules, ReadPlan
from idem_platform.read.planner import frame_columns
from idem_platform.read.upgrade import KEEP, RAISE, SKIP, upgrade_batch
from idem_platform_tests.helpers import migrations_fixture

SPEC = TableSpec(
    "reading",
    3,
    (
        Column("sensor", ColumnType.parse("string"), required=True),
        Column("temperature", ColumnType.parse("real")),
        Column("taken", ColumnType.parse("timestamp")),
        Column("labels", ColumnType.parse("dynamic")),
    ),
)
EXISTING = {name: "" for name, _ in SYSTEM_COLUMNS} | {c.name: "" for c in SPEC.columns} | {"props": ""}
PLAN = ReadPlan(
    url="",
    record_type="reading",
    current_version=3,
    spec=SPEC,
    columns=frame_columns(SPEC, EXISTING),
    migrations=MigrationSource(modules=(migrations_fixture.__name__,), current=(("reading", 3),)),
    connectors=(
        ("sensors", ConnectorRules(version_field="schema_version", known=frozenset({"id"}))),
        ("legacy", ConnectorRules(version_field="v", known=frozenset({"id"}))),
    ),
)
BIG = 123456789012345678901234567890


def batch(rows: list[tuple[str, int, str, Any]]) -> pa.RecordBatch:
    """Rows of (key, stored version, connector, payload); typed columns as a v3 row would hold them."""
    schema = PLAN.arrow_schema()
    columns: dict[str, list[Any]] = {name: [None] * len(rows) for name in schema.names}
    for i, (key, version, connector, payload) in enumerate(rows):
        columns["_idempotency_key"][i] = key
        columns["_schema_version"][i] = version
        columns["_connector"][i] = connector
        columns["_payload"][i] = payload if isinstance(payload, str) else json.dumps(payload)
        if version == 3:
            columns["sensor"][i], columns["temperature"][i] = payload["sensor"], payload["temperature"]
    return pa.RecordBatch.from_pydict(columns, schema=schema)


ROWS = [
    ("k-current", 3, "sensors", {"id": "c", "sensor": "s0", "temperature": 21.5}),
    ("k-v1", 1, "sensors", {"id": "a", "sensor": "s1", "temp": 212, "schema_version": 1, "meta": {"site": "x"}}),
    ("k-broken", 1, "sensors", {"id": "b", "sensor": migrations_fixture.BROKEN_SENSOR, "temp": 50}),
    ("k-legacy", 1, "legacy", {"id": "l", "sensor": "s2", "temp": 32, "v": 1, "serial": BIG}),
    ("k-v2", 2, "sensors", {"id": "d", "sensor": "s3", "temperature": 212}),
    ("k-newer", 4, "sensors", {"id": "n", "sensor": "s4"}),
    ("k-array", 1, "sensors", "[1, 2]"),
    ("k-unfit", 1, "sensors", {"id": "u", "temp": 10}),  # no sensor: required
]


def by_key(result: pa.RecordBatch) -> dict[str, dict[str, Any]]:
    return {row["_idempotency_key"]: row for row in result.to_pylist()}


def test_keep_mode_upgrades_each_group_and_names_each_failing_row() -> None:
    got = by_key(upgrade_batch(batch(ROWS), PLAN, KEEP))
    assert set(got) == {key for key, *_ in ROWS}
    assert all(row["_schema_version"] == 3 for row in got.values())
    assert got["k-current"]["temperature"] == 21.5 and got["k-current"][ERROR_COLUMN] is None
    assert got["k-v1"]["temperature"] == 100.0 and json.loads(got["k-v1"]["labels"]) == {"site": "x"}
    assert got["k-v1"]["props"] is None  # its version field is no unknown field
    assert got["k-v2"]["temperature"] == 100.0  # from v2: one step only
    legacy = got["k-legacy"]
    assert legacy["temperature"] == 0.0 and legacy[ERROR_COLUMN] is None
    assert legacy["props"] == f'{{"serial":{BIG}}}'  # exact, and the legacy connector's `v` stripped
    errors = {key: row[ERROR_COLUMN] for key, row in got.items() if row[ERROR_COLUMN]}
    assert set(errors) == {"k-broken", "k-newer", "k-array", "k-unfit"}
    assert "rename_temp_and_meta" in errors["k-broken"] and "k-broken" in errors["k-broken"]
    assert "ValueError" in errors["k-broken"]
    assert "schema_version 4" in errors["k-newer"]
    assert "not a JSON object" in errors["k-array"] and "k-array" in errors["k-array"]
    assert "k-unfit" in errors["k-unfit"] and "sensor" in errors["k-unfit"]
    assert got["k-broken"]["sensor"] is None  # a failing row's replaced columns are empty


def test_skip_mode_leaves_out_exactly_the_failing_rows() -> None:
    got = by_key(upgrade_batch(batch(ROWS), PLAN, SKIP))
    assert set(got) == {"k-current", "k-v1", "k-legacy", "k-v2"}


def test_raise_mode_fails_on_a_failing_row_naming_its_key_and_step() -> None:
    with pytest.raises(MigrationFailed) as failed:
        upgrade_batch(batch(ROWS[:3]), PLAN, RAISE)
    assert failed.value.key == "k-broken" and failed.value.step == "reading v1->v2"


def test_a_non_dict_result_is_a_failure_of_that_row_only(tmp_path: Any) -> None:
    module = "upgrade_batch_returns_list"
    (tmp_path / f"{module}.py").write_text(
        "from idem_platform.migrations import schema_migration\n\n\n"
        "@schema_migration('reading', from_version=1, to_version=2)\n"
        "def one(record):\n"
        "    return [record] if record.get('sensor') == 'bad' else record\n\n\n"
        "@schema_migration('reading', from_version=2, to_version=3)\n"
        "def two(record):\n"
        "    return record\n",
        encoding="utf-8",
    )
    from dataclasses import replace

    plan = replace(PLAN, migrations=MigrationSource(modules=(module,), base_dir=str(tmp_path), current=(("reading", 3),)))
    rows = [
        ("k-good", 1, "sensors", {"id": "g", "sensor": "good", "temp": 1}),
        ("k-bad", 1, "sensors", {"id": "b", "sensor": "bad", "temp": 2}),
        ("k-good2", 1, "sensors", {"id": "h", "sensor": "good2", "temp": 3}),
    ]
    got = by_key(upgrade_batch(batch(rows), plan, KEEP))
    assert got["k-bad"][ERROR_COLUMN] and "returned list, not a dict" in got["k-bad"][ERROR_COLUMN]
    assert (got["k-good"]["sensor"], got["k-good2"]["sensor"]) == ("good", "good2")
    assert got["k-good"][ERROR_COLUMN] is None and got["k-good2"][ERROR_COLUMN] is None
