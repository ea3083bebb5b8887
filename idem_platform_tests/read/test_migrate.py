"""``idem migrate`` (issue 13, item 5): old rows upgraded in place, in Spark, batch by batch.

Each test builds ``idem.reading`` with rows at v1, v2 and v3 (the chain of
:mod:`idem_platform_tests.helpers.migrations_fixture`, copied beside the config as in
``test_migrations``): rows written while the table was at v1, then, the config bumped
to v3, records that state v1, v2 and v3. At v3 ``temperature`` is no declared column:
v3 records evolve it into a text column, which is retyped to ``real``, so a migrated
row's retyped companion must be refilled too.
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from idem_platform.cli import main
from idem_platform.config import IdemConfig
from idem_platform.migrations import MigrationFailed
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.postgres.retype import retype_column
from idem_platform.read import read_table
from idem_platform.read.migrate.counts import plan_migration
from idem_platform.read.migrate.errors import MigrateLockTimeout
from idem_platform.read.migrate.prepare import prepare_table
from idem_platform.read.migrate.report import human_report
from idem_platform.read.migrate.run import migrate
from idem_platform.read.migrate.task import MigrateTask
from idem_platform.read.planner import plan_read
from idem_platform.read.upgrade import RAISE
from idem_platform.samples import write_lines
from idem_platform_tests.helpers import migrations_fixture
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.faults import kill_at_fault

V1 = migrations_fixture.V1_CONFIG  # the sensors feed before any bump

V3_COLUMNS = {"sensor": migrations_fixture.REQUIRED_SENSOR, "taken": "timestamp", "labels": "dynamic"}


def v3_config(modules: str, version: int = 3) -> str:
    """The sensors feed at ``version`` (3, or 4 after the next bump), migrations from ``modules``."""
    return migrations_fixture.reading_config(version, V3_COLUMNS, migrations=modules)


# v3 -> v4 (for the bump after a migrate): temperature becomes temperature_k, in kelvin.
STEP_V4 = '''
from idem_platform.migrations import schema_migration


@schema_migration("reading", from_version=3, to_version=4)
def to_kelvin(record):
    if record.get("temperature") is not None:
        record["temperature_k"] = round(record.pop("temperature") + 273.15, 6)
    return record
'''

V4_COLUMNS = "      temperature_k: real\n"

TYPED = ("sensor", "taken", "labels", "temperature", "_temperature__real", "props")
UNCHANGED = ("_idempotency_key", "_connector", "_external_id", "_content_hash", "_commit_id", "_ingested_at", "_source", "_payload")
JSON_COLUMNS = ("_payload", "props", "labels", "_kafka")


@dataclass
class Table:
    v1: IdemConfig
    v3: IdemConfig
    root: Path
    modules: str
    old: int  # rows below v3
    by_version: dict[str, int]  # rows below v3 per stored version


def ingest(url: str, config: IdemConfig, spark: Any, file: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The write path as the job runs it (plan, coerce on Spark, commit)."""
    connector = config.connector("sensors")
    assert connector.path is not None
    path = write_lines(connector.path / file, [json.dumps(r) for r in records])
    pipeline.prepare_tables(url, config, connector)
    batch = pipeline.plan_batch(url, connector, [path])
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(url, config, connector))
    request = run.CommitRequest(url=url, connector=connector, run_id="test", replay=False)
    return run.commit_batch(request, coerced, lambda: spark)


def build(url: str, spark: Any, root: Path, *, v1_rows: int = 12, broken: bool = False) -> Table:
    """``idem.reading`` with ``v1_rows`` rows written at v1 (one with a field that goes to
    ``props``, one of the broken sensor if asked), then 4 rows each stating v1, v2, v3."""
    reset_database(url)
    v1 = write_config(root, V1)
    first = [
        {"id": f"a{i:02d}", "sensor": f"s{i}", "temp": 32 + 9 * i, "taken": f"2026-01-0{1 + i % 9}T00:00:00.25Z",
         "meta": {"i": i}} | ({"Odd-Field": i} if i == 0 else {})
        for i in range(v1_rows)
    ]
    if broken:
        first.append({"id": "zz", "sensor": migrations_fixture.BROKEN_SENSOR, "temp": 1})
    assert ingest(url, v1, spark, "v1.ndjson", first)["rows_written"] == len(first)
    module = f"reading_migrations_{uuid.uuid4().hex[:10]}"
    shutil.copy(migrations_fixture.__file__, root / f"{module}.py")
    v3 = write_config(root, v3_config(module))
    later = (
        [{"schema_version": 1, "id": f"b{i}", "sensor": f"t{i}", "temp": 50 + i, "meta": ["m", i]} for i in range(4)]
        + [{"schema_version": 2, "id": f"c{i}", "sensor": f"u{i}", "temperature": 60 + i, "labels": {"c": i}} for i in range(4)]
        + [{"id": f"d{i}", "sensor": f"v{i}", "temperature": 10.5 + i, "labels": [i]} for i in range(4)]
    )
    assert ingest(url, v3, spark, "v3.ndjson", later)["rows_written"] == 12
    retyped = retype_column(url, v3.table_specs["reading"], "temperature", "real")
    assert retyped["typed_column"] == "_temperature__real"
    old = len(first) + 8
    return Table(v1, v3, root, module, old, {"1": len(first) + 4, "2": 4})


def rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(url) as conn:
        return conn.execute(query, list(params)).fetchall()


def snapshot(url: str) -> list[tuple[Any, ...]]:
    """Every row whole, with its tuple version (``xmin``): equal only if nothing was written."""
    return rows(url, "SELECT _idempotency_key, xmin::text, to_jsonb(t)::text FROM idem.reading t ORDER BY 1")


def unchanged_columns(url: str) -> list[tuple[Any, ...]]:
    return rows(url, f"SELECT {', '.join(UNCHANGED)} FROM idem.reading ORDER BY 1")


def versions(url: str) -> dict[str, tuple[int, int | None]]:
    """Per external id: ``(_schema_version, _payload_version)`` (the latter null before a migrate)."""
    has = rows(url, "SELECT 1 FROM information_schema.columns WHERE table_name = 'reading' AND column_name = '_payload_version'")
    payload = "_payload_version" if has else "NULL::int"
    return {ext: (v, p) for ext, v, p in rows(url, f"SELECT _external_id, _schema_version, {payload} FROM idem.reading")}


def read_rows(spark: Any, url: str, config: IdemConfig) -> dict[str, dict[str, Any]]:
    """``read_table``'s rows by key, JSON columns parsed (a read upgrades into canonical JSON
    text; PostgreSQL prints jsonb its own way: equal as JSON)."""
    read = read_table(spark, url, config, "reading")
    out = {}
    for row in read.frame.collect():
        values = row.asDict()
        for name in JSON_COLUMNS:
            if values.get(name) is not None:
                values[name] = json.loads(values[name])
        out[values["_idempotency_key"]] = values
    return out


@pytest.fixture
def table(pg_url: str, spark: Any, tmp_path: Path) -> Table:
    return build(pg_url, spark, tmp_path)


@pytest.fixture
def env(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[2]")
    return tmp_path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.strip()], err


# ---------------------------------------------------------------- dry run


def test_dry_run_counts_per_step_and_writes_nothing(
    table: Table, pg_url: str, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(pg_url)
    report = plan_migration(pg_url, table.v3)
    assert report["dry_run"] is True and report["rows_to_move"] == table.old == 20 and report["rows_moved"] == 0
    entry = report["tables"]["reading"]
    assert (entry["current_version"], entry["rows_current"], entry["rows_newer"]) == (3, 4, 0)
    assert entry["rows_by_version"] == table.by_version == {"1": 16, "2": 4}
    module = table.modules
    assert entry["steps"] == [  # a v1 row goes through both steps: counts are cumulative
        {"step": "reading v1->v2", "function": f"{module}.rename_temp_and_meta", "rows_to_move": 16, "rows_moved": 0, "rows_failed": 0},
        {"step": "reading v2->v3", "function": f"{module}.fahrenheit_to_celsius", "rows_to_move": 20, "rows_moved": 0, "rows_failed": 0},
    ]
    code, lines, err = cli(capsys, "migrate", "--dry-run", "--config", str(table.v3.source))
    assert code == 0, err
    printed = json.loads(lines[-1])
    assert printed["tables"]["reading"]["steps"] == entry["steps"] and printed["rows_to_move"] == 20
    shown = human_report(report)
    assert "idem.reading (v3): 4 current, 16 at v1, 4 at v2" in shown
    assert f"reading v2->v3 ({module}.fahrenheit_to_celsius): 20 would move" in shown
    # Nothing written, not even the migrate's column.
    assert snapshot(pg_url) == before
    assert all(p is None for _, p in versions(pg_url).values())
    code, lines, err = cli(capsys, "migrate", "--dry-run", "--type", "nope", "--config", str(table.v3.source))
    assert code == 1 and err.strip().splitlines()[-1] == "idem: error: unknown record type 'nope' (known: reading)"


# ---------------------------------------------------------------- migrating


def test_migrate_writes_what_a_read_returned_and_a_second_run_moves_nothing(
    table: Table, pg_url: str, spark: Any
) -> None:
    read_before = read_rows(spark, pg_url, table.v3)
    fixed = unchanged_columns(pg_url)
    stored = versions(pg_url)
    assert sum(1 for v, _ in stored.values() if v < 3) == 20

    lines: list[str] = []
    report = migrate(spark, pg_url, table.v3, batch_rows=7, progress=lines.append)
    entry = report["tables"]["reading"]
    assert (report["dry_run"], report["rows_moved"], report["rows_failed"]) == (False, 20, 0)
    assert (entry["rows_moved"], entry["batches"], entry["rows_left"]) == (20, 3, 0)  # 7 + 7 + 6
    assert entry["rows_moved_by_version"] == {"1": 16, "2": 4}
    assert [(s["step"], s["rows_to_move"], s["rows_moved"]) for s in entry["steps"]] == [
        ("reading v1->v2", 16, 16), ("reading v2->v3", 20, 20),
    ]
    assert any("20 rows moved to v3 in 3 batch(es)" in line for line in lines)
    shown = human_report(report)
    assert shown.startswith("idem migrate: 20 rows moved to their current version, 0 failed")
    assert f"reading v1->v2 ({table.modules}.rename_temp_and_meta): 16 moved" in shown

    # Every row at v3 once; the payload's version kept for the rows that moved.
    after = versions(pg_url)
    assert sorted(after) == sorted(stored)
    assert after == {ext: (3, None if v == 3 else v) for ext, (v, _) in stored.items()}
    assert unchanged_columns(pg_url) == fixed  # key, commit, ingested_at, source, payload, hash
    # Reads return what they returned before; now straight from the table.
    read_after = read_rows(spark, pg_url, table.v3)
    assert read_after == read_before
    assert read_table(spark, pg_url, table.v3, "reading").rows_by_version == {3: 24}
    # The typed columns themselves hold the upgrade: a v1 reading of 41 °F, renamed and converted,
    # its retyped companion refilled, its unknown field still in props.
    ((temperature, typed, labels, props, temp),) = rows(
        pg_url, "SELECT temperature, _temperature__real, labels, props, temp FROM idem.reading WHERE _external_id = 'a01'"
    )
    assert (temperature, typed, labels, props, temp) == ("5.0", 5.0, {"i": 1}, None, 41.0)  # temp: an old column, kept
    assert rows(pg_url, "SELECT props FROM idem.reading WHERE _external_id = 'a00'") == [({"Odd-Field": 0},)]

    # A second run finds nothing below v3 and writes nothing.
    before_second = snapshot(pg_url)
    again = migrate(spark, pg_url, table.v3, batch_rows=7)
    assert (again["rows_to_move"], again["rows_moved"], again["tables"]["reading"]["batches"]) == (0, 0, 0)
    assert again["tables"]["reading"]["steps"] == []
    assert snapshot(pg_url) == before_second


def test_after_the_next_bump_migrated_rows_upgrade_from_their_payload(
    table: Table, pg_url: str, spark: Any
) -> None:
    migrate(spark, pg_url, table.v3, batch_rows=50)
    module = f"reading_v4_{uuid.uuid4().hex[:10]}"
    (table.root / f"{module}.py").write_text(STEP_V4, encoding="utf-8")
    text = v3_config(f"{table.modules}, {module}", version=4)
    v4 = write_config(table.root, text.replace("      labels: dynamic\n", "      labels: dynamic\n" + V4_COLUMNS))
    # a01 was stored at v1 (temp 41 °F) and moved to v3: its payload is still v1, so v4 comes
    # from the whole chain v1 -> v4 on the payload, not from v3 -> v4 on a v1 record.
    read = read_rows(spark, pg_url, v4)
    by_ext = {row["_external_id"]: row for row in read.values()}
    assert by_ext["a01"]["temperature_k"] == 278.15 and by_ext["c1"]["temperature_k"] == round(round((61 - 32) * 5 / 9, 6) + 273.15, 6)
    assert by_ext["d0"]["temperature_k"] == 283.65  # stored at v3, never migrated
    plan = plan_migration(pg_url, v4)["tables"]["reading"]
    assert plan["rows_by_version"] == {"1": 16, "2": 4, "3": 4} and plan["rows_current"] == 0
    assert [s["rows_to_move"] for s in plan["steps"]] == [16, 20, 24]
    report = migrate(spark, pg_url, v4, batch_rows=50)
    assert report["rows_moved"] == 24
    assert {ext: v for ext, v in versions(pg_url).items()} == {
        ext: (4, 3 if ext.startswith("d") else 2 if ext.startswith("c") else 1) for ext in by_ext
    }
    assert read_rows(spark, pg_url, v4) == read


def test_a_raising_migration_fails_naming_the_key_unless_skipped(
    pg_url: str, spark: Any, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = build(pg_url, spark, env, v1_rows=3, broken=True)
    ((key,),) = rows(pg_url, "SELECT _idempotency_key FROM idem.reading WHERE _external_id = 'zz'")
    stored = versions(pg_url)
    with pytest.raises(MigrationFailed) as raised:
        migrate(spark, pg_url, table.v3, batch_rows=100)
    assert (raised.value.key, raised.value.step) == (key, "reading v1->v2")
    assert str(raised.value).startswith(
        f"migration reading v1->v2 ({table.modules}.rename_temp_and_meta) raised on row {key}: ValueError"
    )
    assert {ext: v for ext, (v, _) in versions(pg_url).items()} == {ext: v for ext, (v, _) in stored.items()}

    code, lines, err = cli(capsys, "migrate", "--config", str(table.v3.source))
    last = err.strip().splitlines()[-1]
    assert code == 1 and last.startswith(f"idem: error: migration reading v1->v2 ({table.modules}.rename_temp_and_meta) raised on row {key}")
    assert "--skip-failed" in last

    code, lines, err = cli(capsys, "migrate", "--skip-failed", "--json", "--config", str(table.v3.source))
    assert code == 0, err
    entry = json.loads(lines[-1])["tables"]["reading"]
    assert (entry["rows_to_move"], entry["rows_moved"], entry["rows_failed"], entry["rows_left"]) == (12, 11, 1, 1)
    assert [(s["rows_moved"], s["rows_failed"]) for s in entry["steps"]] == [(7, 1), (11, 0)]
    (example,) = entry["failed_examples"]
    assert example["_idempotency_key"] == key and example["version"] == 1 and "ValueError" in example["error"]
    assert {ext: v for ext, (v, _) in versions(pg_url).items()} == {ext: 1 if ext == "zz" else 3 for ext in stored}

    code, lines, err = cli(capsys, "migrate", "--skip-failed", "--json", "--config", str(table.v3.source))
    assert code == 0 and json.loads(lines[-1])["tables"]["reading"]["rows_moved"] == 0


def test_two_migrates_at_once_move_each_row_once(table: Table, pg_url: str) -> None:
    """Two tasks holding the same old rows (as two ``idem migrate`` runs would), interleaved
    batch by batch: the version guard lets each row move once, and each task counts only
    the rows it moved."""
    with connect(pg_url, autocommit=True) as conn:
        prepare_table(conn, table.v3, "reading", 10)
    plan, _ = plan_read(pg_url, table.v3, "reading")
    task = MigrateTask.for_plan(plan, RAISE, 5, 10)
    first, second = task.migrate_range(0), task.migrate_range(0)
    outputs = [next(first)]  # read all 20 old rows, moved 5
    outputs += [next(second)]  # read the 15 still old, moved 5 of those the first one holds too
    outputs += list(first) + list(second)
    moved = [row for batch in outputs for row in batch.to_pylist() if row["kind"] == "moved"]
    assert sum(row["rows"] for row in moved) == 20
    assert rows(pg_url, "SELECT count(*) FROM idem.reading WHERE _schema_version = 3") == [(24,)]


def test_a_batch_waits_for_row_locks_then_gives_up_cleanly(table: Table, pg_url: str, spark: Any) -> None:
    """Row locks only: a session holding one old row makes the batch wait (2 s tries, rolled
    back and tried again) until the lock timeout, which leaves the batch unwritten. The
    one-time ALTER TABLE (``_payload_version``) waits for the table's users the same way."""
    holder = connect(pg_url)
    try:
        holder.execute("SELECT 1 FROM idem.reading WHERE _external_id = 'a03' FOR UPDATE")
        with pytest.raises(MigrateLockTimeout, match=r"waited 1 s for the locks on the catalog row and table of idem.reading: .* nothing was changed"):
            migrate(spark, pg_url, table.v3, batch_rows=100, lock_timeout_seconds=1)
        holder.rollback()
        with connect(pg_url, autocommit=True) as conn:
            prepare_table(conn, table.v3, "reading", 10)
        holder.execute("SELECT 1 FROM idem.reading WHERE _external_id = 'a03' FOR UPDATE")
        with pytest.raises(MigrateLockTimeout, match=r"waited 1 s for the locks on rows of idem.reading: .*that batch was rolled back"):
            migrate(spark, pg_url, table.v3, batch_rows=100, lock_timeout_seconds=1)
        assert rows(pg_url, "SELECT count(*) FROM idem.reading WHERE _schema_version = 3") == [(4,)]
        # Released while the batch retries: it goes through.
        threading.Timer(3.0, holder.rollback).start()
        report = migrate(spark, pg_url, table.v3, batch_rows=100, lock_timeout_seconds=60)
        assert report["rows_moved"] == 20
    finally:
        holder.close()


# ---------------------------------------------------------------- a crash midway


@pytest.mark.slow
def test_killed_midway_then_rerun_every_row_at_v3_exactly_once(table: Table, pg_url: str, tmp_path: Path, spark: Any) -> None:
    fixed = unchanged_columns(pg_url)
    marker = tmp_path / "paused.pid"
    command = idem_command("migrate", "--batch-rows", "3", "--json")
    # Paused after its third batch committed, then the whole process group is killed.
    kill_at_fault(command, cli_env(pg_url, tmp_path, table.v3, f"migrate_batch:pause:{marker}:batch=3"), marker)
    counted = dict(rows(pg_url, "SELECT _schema_version, count(*) FROM idem.reading GROUP BY 1"))
    assert counted[3] == 4 + 9 and sum(counted.values()) == 24  # three batches of 3 moved, the rest not yet

    # The kill needs a process of its own; the rerun runs in this one (the session's Spark, no second JVM).
    report = migrate(spark, pg_url, table.v3, batch_rows=3)
    assert (report["rows_to_move"], report["rows_moved"], report["tables"]["reading"]["rows_left"]) == (11, 11, 0)
    assert rows(pg_url, "SELECT count(*), count(DISTINCT _idempotency_key), min(_schema_version), max(_schema_version) FROM idem.reading") == [
        (24, 24, 3, 3)
    ]
    assert unchanged_columns(pg_url) == fixed
    assert rows(pg_url, "SELECT count(*) FROM idem.reading WHERE _payload_version IS NOT NULL") == [(20,)]


# ---------------------------------------------------------------- Dagster


def test_the_dagster_job_counts_then_migrates(table: Table, pg_url: str) -> None:
    from idem_platform.defs.definitions import build_definitions

    job = build_definitions(table.v3, postgres_url=pg_url).resolve_job_def("idem_migrate")
    before = snapshot(pg_url)
    with dg.instance_for_test() as instance:
        dry = job.execute_in_process(instance=instance, run_config={"ops": {"migrate": {"config": {"dry_run": True}}}})
        assert dry.success
        assert (dry.output_for_node("migrate")["rows_to_move"], dry.output_for_node("migrate")["rows_moved"]) == (20, 0)
        assert snapshot(pg_url) == before

        result = job.execute_in_process(
            instance=instance, run_config={"ops": {"migrate": {"config": {"types": ["reading"], "batch_rows": 8}}}}
        )
        assert result.success
        report = result.output_for_node("migrate")
        assert (report["rows_moved"], report["tables"]["reading"]["batches"]) == (20, 3)
        (output,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
        metadata = {k: v.value for k, v in output.event_specific_data.metadata.items()}
        assert metadata["rows_moved"] == 20 and metadata["reading/rows_moved"] == 20
        (materialization,) = result.asset_materializations_for_node("migrate")
        assert materialization.asset_key == dg.AssetKey(["idem", "reading"])
        assert materialization.metadata["schema_version"].value == 3

        refused = job.execute_in_process(
            instance=instance, run_config={"ops": {"migrate": {"config": {"types": ["nope"]}}}}, raise_on_error=False
        )
        assert not refused.success
        failure = refused.failure_data_for_node("migrate")
        assert failure is not None and "unknown record type 'nope'" in str(failure.user_failure_data.description)
    assert rows(pg_url, "SELECT min(_schema_version) FROM idem.reading") == [(3,)]
