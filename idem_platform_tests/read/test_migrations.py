"""Schema versions and migrations (DESIGN §6): the registry and its chains, versions at ingest,
and the read path that returns every row in the current shape (read_table and `idem read`).

The chain under test is ``reading`` v1 -> v2 -> v3 (:mod:`idem_platform_tests.helpers.migrations_fixture`:
rename a field, then change its unit), copied beside each config under a fresh module name,
so every config here imports its migrations from its own directory.
"""

from __future__ import annotations

import copy
import json
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from idem_platform.cli import main
from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import Column, ColumnType, TableSpec
from idem_platform.errors import ConfigError
from idem_platform.migrations import (
    Chains,
    MigrationChainError,
    MigrationFailed,
    MigrationSource,
    registered,
)
from idem_platform.postgres import connect
from idem_platform.read import migration_errors, read_table
from idem_platform.read.planner import partition_count, plan_read
from idem_platform.read.source import source_frame
from idem_platform.read.table import TableRead, read_lines
from idem_platform_tests.helpers import migrations_fixture
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.ingest import ingest_records

FIXTURE_MODULE = migrations_fixture.__name__

V1 = migrations_fixture.V1_CONFIG  # the sensors feed before any bump

LEGACY = """  - name: legacy                  # its producers still send v1 records, without saying so
    kind: filedrop
    path: drop/legacy
    record_type: reading
    id_field: id
    schema_version: 1
"""
V3_COLUMNS = {"sensor": migrations_fixture.REQUIRED_SENSOR, "temperature": "real", "taken": "timestamp", "labels": "dynamic"}


def v3_config(module: str) -> str:
    """The sensors feed and the legacy one at v3, migrations from ``module``."""
    return migrations_fixture.reading_config(3, V3_COLUMNS, connectors=migrations_fixture.SENSORS + LEGACY, migrations=module)



def migrations_beside(directory: Path) -> str:
    """A copy of the fixture module in ``directory`` under a fresh name; returns the name."""
    name = f"reading_migrations_{uuid.uuid4().hex[:10]}"
    shutil.copy(migrations_fixture.__file__, directory / f"{name}.py")
    return name


# ---------------------------------------------------------------- the registry and its chains


def test_every_registered_migration_turns_each_fixture_into_the_next_version() -> None:
    steps = registered([FIXTURE_MODULE])
    assert {(m.record_type, m.from_version, m.to_version) for m in steps} == {("reading", 1, 2), ("reading", 2, 3)}
    for migration in steps:
        cases = [c for c in migrations_fixture.FIXTURES[migration.record_type] if migration.from_version in c]
        assert cases, f"no fixture at v{migration.from_version} for {migration.name}"
        for case in cases:
            given = copy.deepcopy(case[migration.from_version])
            assert migration.function(given) == case[migration.to_version], migration.name
    chains = Chains(current={"reading": 3}, steps={"reading": {m.from_version: m for m in steps}})
    for case in migrations_fixture.FIXTURES["reading"]:
        for version, record in case.items():  # any version, the whole way to the current one
            assert chains.upgrade("reading", copy.deepcopy(record), version) == case[3]


def config_with(directory: Path, module_source: str | None, version: int, migrations: list[str]) -> IdemConfig:
    if module_source is not None:
        (directory / "chain_module.py").write_text(module_source, encoding="utf-8")
    text = (
        "connectors:\n  - {name: feed, kind: filedrop, path: drop, record_type: gauge}\n"
        f"tables:\n  gauge:\n    schema_version: {version}\n    columns: {{value: real}}\n"
        f"migrations: {json.dumps(migrations)}\n"
    )
    return write_config(directory, text)


def unique_module(directory: Path, body: str) -> str:
    name = f"chain_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text("from idem_platform.migrations import schema_migration\n" + body, encoding="utf-8")
    return name


STEP = '@schema_migration("gauge", from_version={a}, to_version={b})\ndef {name}(record):\n    return record\n'


def test_a_gap_fails_the_definitions_load_naming_the_type_and_the_step(tmp_path: Path) -> None:
    from idem_platform.defs.definitions import build_definitions

    module = unique_module(tmp_path, STEP.format(a=1, b=2, name="one_two"))  # v2->v3 is missing
    config = config_with(tmp_path, None, 3, [module])
    with pytest.raises(MigrationChainError) as raised:
        build_definitions(config, postgres_url="postgresql://unused@127.0.0.1:1/none")
    message = str(raised.value)
    assert "gauge: schema_version is 3 but no migration v2->v3 is registered" in message
    assert "@schema_migration('gauge', from_version=2, to_version=3)" in message
    assert message.startswith(f"{config.source}: migrations: ") and "\n" not in message


@pytest.mark.parametrize(
    ("body", "version", "expected"),
    [
        (STEP.format(a=1, b=2, name="a") + STEP.format(a=1, b=2, name="b"), 2, "gauge: 2 migrations for v1->v2: "),
        (STEP.format(a=1, b=2, name="a") + STEP.format(a=2, b=3, name="b"), 2, "migration v2->v3 (chain_"),
        ('@schema_migration("other", from_version=1, to_version=2)\ndef a(record):\n    return record\n', 1,
         "other: migrations registered"),
    ],
    ids=["duplicate", "past-current", "undeclared-type"],
)
def test_broken_chains_are_config_errors(tmp_path: Path, body: str, version: int, expected: str) -> None:
    config = config_with(tmp_path, None, version, [unique_module(tmp_path, body)])
    with pytest.raises(MigrationChainError, match="broken migration chain") as raised:
        config.chains()
    assert expected in str(raised.value)


def test_an_unimportable_module_and_a_chain_without_modules(tmp_path: Path) -> None:
    config = config_with(tmp_path, None, 1, ["no_such_module_here"])
    with pytest.raises(ConfigError, match="module 'no_such_module_here' cannot be imported") as raised:
        config.chains()
    assert "migrations" in str(raised.value)
    with pytest.raises(MigrationChainError, match=r"no migration v1->v2 is registered .*\(none listed\)"):
        config_with(tmp_path, None, 2, []).chains()
    assert config_with(tmp_path, None, 1, []).chains().path("gauge", 1) == []


def test_connector_versions_are_checked_against_the_tables(tmp_path: Path) -> None:
    newer = V1.replace("    id_field: id\n", "    id_field: id\n    schema_version: 2\n")
    with pytest.raises(ConfigError, match=r"connector 'sensors': schema_version 2 is newer than tables.reading.schema_version \(1\)"):
        write_config(tmp_path, newer)
    clash = V1.replace("      temp: real\n", "      temp: real\n      schema_version: int\n")
    with pytest.raises(ConfigError, match="schema_version_field 'schema_version' is a column of reading"):
        write_config(tmp_path, clash)
    renamed = clash.replace("    id_field: id\n", "    id_field: id\n    schema_version_field: v\n")
    assert write_config(tmp_path, renamed).connector("sensors").schema_version_field == "v"


# ---------------------------------------------------------------- versions at ingest (no Spark)

GAUGE = TableSpec("gauge", 3, (Column("value", ColumnType("real")),))


def test_the_version_field_is_a_system_field_even_for_strict_contracts(tmp_path: Path) -> None:
    module = migrations_beside(tmp_path)
    source = MigrationSource((module,), str(tmp_path), (("reading", 3),))
    spec = RecordSpec(
        connector="sensors",
        tables={"reading": TableSpec("reading", 3, (Column("sensor", ColumnType("string"), True), Column("temperature", ColumnType("real"))))},
        units=(("f#L", 0),),
        record_type="reading",
        contracts={"reading": "strict"},
        migrations=source,
    )
    lines = [
        b'{"id":"a","sensor":"s","temperature":20,"schema_version":3}',
        b'{"id":"b","sensor":"s","temp":212,"schema_version":1}',
        b'{"id":"c","sensor":"s","schema_version":4}',
        b'{"id":"d","sensor":"s","schema_version":true}',
        b'{"id":"e","sensor":"broken","schema_version":1}',
        b'{"id":"f","sensor":"s","schema_version":null,"temperature":1}',
    ]
    out = coerce_batch(lines_batch(lines), spec).to_pylist()
    a, b, c, d, e, f = out
    assert a["_errors"] is None and a["_props"] is None and a["_version"] is None and a["reading"]["temperature"] == 20
    assert b["_errors"] is None and b["_version"] == 1 and b["reading"]["temperature"] == 100.0
    assert json.loads(b["_upgraded"]) == {"id": "b", "sensor": "s", "temperature": 100.0}
    assert json.loads(b["_payload"])["temp"] == 212  # as received
    assert json.loads(c["_errors"]) == [
        {"field": "schema_version", "rule": "schema_version", "message": "record says schema_version 4 but reading is at 3"}
    ]
    assert json.loads(d["_errors"])[0]["message"] == "field 'schema_version': true is not a schema version (an integer >= 1)"
    (reason,) = json.loads(e["_errors"])
    assert reason["rule"] == "migration" and reason["message"].startswith(
        f"migration reading v1->v2 ({module}.rename_temp_and_meta) raised: ValueError: sensor 'broken'"
    )
    assert f["_errors"] is None and f["_version"] is None  # null states nothing: the table's current version


# ---------------------------------------------------------------- a table of mixed versions


@dataclass
class Mixed:
    v1: IdemConfig
    v3: IdemConfig
    module: str
    commits: dict[str, str]


READINGS_V1 = [
    {"id": "r1", "sensor": "s1", "temp": 212, "taken": "2026-01-01T00:00:00.25Z", "meta": {"site": "a"}},
    {"id": "r2", "sensor": "s2", "temp": 32},
    {"id": "r3", "sensor": "s3", "meta": ["x", 1]},
]
READINGS_V3 = [
    {"id": "r4", "sensor": "s4", "temperature": 21.5, "labels": ["now"]},
    {"schema_version": 1, "id": "r5", "sensor": "s5", "temp": 98.6, "meta": {"k": 1}},
    {"schema_version": 2, "id": "r6", "sensor": "s6", "temperature": 50},
    {"schema_version": 3, "id": "r7", "sensor": "s7", "temperature": -1},
    {"schema_version": 4, "id": "x1", "sensor": "s"},
    {"schema_version": "two", "id": "x2", "sensor": "s"},
    {"schema_version": 1, "id": "x3", "sensor": "broken", "temp": 1},
]
# Per id: the v3 temperature (°C), labels, stored _schema_version.
EXPECTED = {
    "r1": (100.0, {"site": "a"}, 1),
    "r2": (0.0, None, 1),
    "r3": (None, ["x", 1], 1),
    "r4": (21.5, ["now"], 3),
    "r5": (37.0, {"k": 1}, 1),
    "r6": (10.0, None, 2),
    "r7": (-1.0, None, 3),
    "r8": (10.0, None, 1),
}


@pytest.fixture(scope="module")
def mixed(pg_url: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Mixed:
    """``idem.reading`` with rows written at v1 (while the table was at v1), then, the config
    bumped to v3, rows sent at v1, v2 and v3, and a connector that declares v1."""
    reset_database(pg_url)
    root = tmp_path_factory.mktemp("versions")
    v1 = write_config(root, V1)
    first = ingest_records(pg_url, v1, spark, "sensors", "v1.ndjson", READINGS_V1)
    assert (first["rows_written"], first["rows_rejected"]) == (3, 0)
    module = migrations_beside(root)
    v3 = write_config(root, v3_config(module))
    v3.chains()
    second = ingest_records(pg_url, v3, spark, "sensors", "v3.ndjson", READINGS_V3)
    assert (second["rows_written"], second["rows_rejected"]) == (4, 3)
    third = ingest_records(pg_url, v3, spark, "legacy", "legacy.ndjson", [{"id": "r8", "sensor": "s8", "temp": 50}])
    assert third["rows_written"] == 1
    return Mixed(v1, v3, module, {"v1": first["commit_id"], "v3": second["commit_id"], "legacy": third["commit_id"]})


def test_ingest_upgrades_old_records_and_rejects_newer_or_bad_versions(mixed: Mixed, pg_url: str) -> None:
    stored = {
        ext: (version, temperature, labels, payload)
        for ext, version, temperature, labels, payload in rows(
            pg_url,
            "SELECT _external_id, _schema_version, temperature, labels, _payload FROM idem.reading "
            "WHERE _commit_id <> %s",
            mixed.commits["v1"],
        )
    }
    # Rows keep the version they came with; their typed columns are the current shape.
    assert {ext: (v, t, lab) for ext, (v, t, lab, _) in stored.items()} == {
        ext: (EXPECTED[ext][2], EXPECTED[ext][0], EXPECTED[ext][1]) for ext in ("r4", "r5", "r6", "r7", "r8")
    }
    assert stored["r5"][3] == READINGS_V3[1]  # _payload: as received, version field and all
    reasons = [
        r[0][0]
        for r in rows(pg_url, "SELECT reasons FROM idem.rejects WHERE commit_id = %s ORDER BY line", mixed.commits["v3"])
    ]
    assert [r["rule"] for r in reasons] == ["schema_version", "schema_version", "migration"]
    assert reasons[0]["message"] == "record says schema_version 4 but reading is at 3"
    assert reasons[1]["message"] == "field 'schema_version': \"two\" is not a schema version (an integer >= 1)"
    assert f"migration reading v1->v2 ({mixed.module}.rename_temp_and_meta) raised: ValueError" in reasons[2]["message"]
    # The version field is no column and never lands in props.
    columns = {r[0] for r in rows(pg_url, "SELECT column_name FROM information_schema.columns WHERE table_name = 'reading'")}
    assert "schema_version" not in columns
    assert rows(pg_url, "SELECT count(*) FROM idem.reading WHERE props IS NOT NULL") == [(0,)]


def by_id(frame: Any) -> dict[str, dict[str, Any]]:
    return {row["_external_id"]: row.asDict() for row in frame.collect()}


def test_read_table_returns_every_row_in_the_current_shape(mixed: Mixed, pg_url: str, spark: Any) -> None:
    read = read_table(spark, pg_url, mixed.v3, "reading")
    assert read.current_version == 3 and read.rows_by_version == {1: 5, 2: 1, 3: 2}
    assert read.skipped is None and read.old_rows == 6
    got = by_id(read.frame)
    assert {ext: (row["temperature"], json.loads(row["labels"]) if row["labels"] else None, row["_schema_version"])
            for ext, row in got.items()} == {ext: (t, lab, 3) for ext, (t, lab, _) in EXPECTED.items()}
    assert read.frame.columns[-5:] == ["sensor", "temperature", "taken", "labels", "props"]
    assert "temp" not in read.frame.columns and "meta" not in read.frame.columns  # old columns stay in the table only
    assert got["r1"]["taken"].isoformat() == "2026-01-01T00:00:00.250000"  # UTC, the session's time zone
    assert all(row["props"] is None for row in got.values())
    assert got["r1"]["_payload"] and json.loads(got["r1"]["_payload"])["temp"] == 212
    # An upgraded row reads exactly as a row that ingest upgraded: r5 went through the same chain at ingest.
    (stored,) = rows(pg_url, "SELECT temperature, labels FROM idem.reading WHERE _external_id = 'r5'")
    assert (got["r5"]["temperature"], json.loads(got["r5"]["labels"])) == stored
    # One commit, a limit.
    only = read_table(spark, pg_url, mixed.v3, "reading", commit_id=mixed.commits["legacy"])
    assert only.rows_by_version == {1: 1} and [r["sensor"] for r in only.frame.collect()] == ["s8"]
    first = read_table(spark, pg_url, mixed.v3, "reading", limit=2)
    assert sum(first.rows_by_version.values()) == 2 and sorted(by_id(first.frame)) == ["r1", "r2"]


def test_key_ranges_read_every_row_once(mixed: Mixed, pg_url: str, spark: Any) -> None:
    plan, counts = plan_read(pg_url, mixed.v3, "reading")
    assert plan.partitions == 1 and sum(counts.values()) == 8  # a small table is one partition
    keys = sorted(r[0] for r in rows(pg_url, "SELECT _idempotency_key FROM idem.reading"))
    split = replace(plan, bounds=((keys[2],), (keys[5],)))  # three ranges
    frame = source_frame(spark, split)
    assert frame.rdd.getNumPartitions() == 3
    assert sorted(r["_idempotency_key"] for r in frame.collect()) == keys
    # Without ranges in ingest order, `idem read`'s lines are sorted by Spark.
    lines = list(read_lines(TableRead(frame, "reading", 3, counts, None, split, spark)))
    assert [json.loads(line)["_external_id"] for line in lines if line] == list(EXPECTED)
    # An ordered read: ranges of (_ingested_at, key), each sorted by PostgreSQL.
    ordered, _ = plan_read(pg_url, mixed.v3, "reading", ordered=True)
    stamps = rows(pg_url, "SELECT _ingested_at, _idempotency_key FROM idem.reading ORDER BY 1, 2")
    bounds = tuple((ts.isoformat(), key) for ts, key in (stamps[3], stamps[6]))
    ordered = replace(ordered, bounds=bounds)
    assert "ORDER BY" in ordered.query(1).as_string(None) and "ORDER BY" not in split.query(1).as_string(None)
    in_order = TableRead(source_frame(spark, ordered), "reading", 3, counts, None, ordered, spark)
    assert [json.loads(line)["_external_id"] for line in read_lines(in_order) if line] == list(EXPECTED)
    assert [len(p) for p in source_frame(spark, ordered).rdd.glom().collect()] == [3, 3, 2]
    assert partition_count(10_000, 2) == 1 and partition_count(100_000, 2) == 2 and partition_count(1_000_000, 2) == 8
    assert partition_count(1_000_000, 2, 50_000) == 20


def test_a_table_not_created_yet_reads_empty(mixed: Mixed, pg_url: str, spark: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path, V1.replace("reading", "gauge"))
    read = read_table(spark, pg_url, config, "gauge")
    assert read.rows_by_version == {} and read.frame.count() == 0 and "sensor" in read.frame.columns


@pytest.fixture
def env(mixed: Mixed, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mixed:
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("IDEM_CONFIG", str(mixed.v3.source))
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[2]")
    return mixed


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.strip()], err


def test_idem_read_prints_rows_in_the_current_shape(env: Mixed, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = cli(capsys, "read", "reading")
    assert code == 0, err
    printed = [json.loads(line) for line in lines]
    assert [row["_external_id"] for row in printed] == ["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"]  # ingest order
    assert {row["_external_id"]: (row["temperature"], row["labels"], row["_schema_version"]) for row in printed} == {
        ext: (t, lab, 3) for ext, (t, lab, _) in EXPECTED.items()
    }
    assert printed[0]["taken"] == "2026-01-01T00:00:00.25+00:00" and printed[0]["_payload"]["temp"] == 212
    assert "temp" not in printed[0] and printed[0]["props"] is None
    assert json.loads(err.strip().splitlines()[-1]) == {
        "record_type": "reading", "rows": 8, "current_version": 3, "rows_by_version": {"1": 5, "2": 1, "3": 2},
    }
    code, lines, err = cli(capsys, "read", "reading", "--limit", "2", "--commit", env.commits["v3"])
    assert code == 0 and [json.loads(line)["_external_id"] for line in lines] == ["r4", "r5"]


def test_a_raising_migration_fails_the_read_naming_the_key(
    env: Mixed, pg_url: str, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # A reading of the broken sensor, written while the table was at v1: no migration ran then.
    broken = ingest_records(pg_url, env.v1, spark, "sensors", "broken.ndjson", [{"id": "b1", "sensor": "broken", "temp": 1}])
    try:
        ((key,),) = rows(pg_url, "SELECT _idempotency_key FROM idem.reading WHERE _commit_id = %s", broken["commit_id"])
        step = f"migration reading v1->v2 ({env.module}.rename_temp_and_meta) raised on row {key}: ValueError"
        read = read_table(spark, pg_url, env.v3, "reading")
        with pytest.raises(MigrationFailed) as raised, migration_errors():
            read.frame.collect()
        assert str(raised.value).startswith(step)
        assert (raised.value.key, raised.value.step) == (key, "reading v1->v2")

        skipping = read_table(spark, pg_url, env.v3, "reading", skip_failed=True)
        assert skipping.skipped is None and skipping.frame.count() == 8
        assert skipping.count_skipped() == 1 and skipping.skipped == 1

        code, lines, err = cli(capsys, "read", "reading")
        assert code == 1 and err.strip().splitlines()[-1].startswith(f"idem: error: {step}")
        code, lines, err = cli(capsys, "read", "reading", "--skip-failed-migrations")
        assert code == 0 and len(lines) == 8
        assert json.loads(err.strip().splitlines()[-1])["skipped"] == 1
    finally:
        with connect(pg_url, autocommit=True) as conn:
            conn.execute("DELETE FROM idem.reading WHERE _commit_id = %s", [broken["commit_id"]])


def test_skipping_counts_nothing_when_every_migration_passes(env: Mixed, pg_url: str, spark: Any, tmp_path: Path) -> None:
    read = read_table(spark, pg_url, env.v3, "reading", skip_failed=True)
    assert read.skipped is None and read.count_skipped() == 0 and read.frame.count() == 8
    empty = read_table(spark, pg_url, write_config(tmp_path, V1.replace("reading", "gauge")), "gauge", skip_failed=True)
    assert empty.skipped == 0  # nothing older than the current version: known without a job


def test_key_ranges_of_a_larger_table_come_out_even(mixed: Mixed, pg_url: str, tmp_path: Path) -> None:
    """Bounds come from a page sample: enough pages that two ranges hold about half each,
    for the whole table and for one commit of it (a filter the sample applies after)."""
    from idem_platform.postgres.schema import ensure_schema
    from idem_platform.postgres.tables import sync_tables

    config = write_config(tmp_path, V1.replace("reading", "gauge"))
    big, small = str(uuid.uuid4()), str(uuid.uuid4())
    with connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)
        sync_tables(conn, config.table_specs)
        conn.execute(
            "INSERT INTO idem.gauge (_idempotency_key, _connector, _record_type, _external_id, _content_hash, "
            "_schema_version, _commit_id, _ingested_at, _source, _payload, sensor) "
            "SELECT 'sensors:gauge:g' || lpad(i::text, 6, '0') || ':' || substr(md5(i::text), 1, 12), 'sensors', "
            "'gauge', 'g' || i, md5(i::text), 1, CASE WHEN i <= 50000 THEN %s ELSE %s END::uuid, now(), 'f#L' || i, "
            "jsonb_build_object('id', 'g' || i, 'sensor', 's'), 's' FROM generate_series(1, 60000) i",
            [big, small],
        )
        conn.execute("ANALYZE idem.gauge")
        for commit, total in ((None, 60_000), (big, 50_000)):
            plan, counts = plan_read(pg_url, config, "gauge", commit_id=commit, parallelism=2)
            sizes = [
                conn.execute(
                    sql.SQL("SELECT count(*) FROM idem.gauge{}").format(plan.where(index))
                ).fetchone()[0]  # type: ignore[index]
                for index in plan.indexes()
            ]
            assert plan.partitions == 2 and sum(counts.values()) == total and sum(sizes) == total
            assert max(sizes) < 0.6 * total, sizes  # ~10 sampled pages made ranges off by 20 %
