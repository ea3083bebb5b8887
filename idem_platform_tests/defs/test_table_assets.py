"""The warehouse tables as Dagster assets (issue 13): the graph, the materializations every
commit reports, the table IO manager that hands downstream assets Spark DataFrames, and the
example's ``indicator_daily_confidence``. Real PostgreSQL, Spark and Dagster throughout."""

from __future__ import annotations

import datetime as dt
import shutil
import uuid
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from pyspark.sql import DataFrame

from idem_platform.config import IdemConfig, parse_config
from idem_platform.contract.catalog import table_name
from idem_platform.defs.definitions import build_definitions, resources_for
from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for
from idem_platform.defs.tables import TABLE_IO_MANAGER, count_rows, table_asset_specs, table_key
from idem_platform.errors import ConfigError
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers import migrations_fixture
from idem_platform_tests.helpers.config import example_text, write_config
from idem_platform_tests.helpers.database import reset_database

LINES = [
    # 2026-01-01 (UTC): low, medium, high (+02:00 is still the 1st in UTC)
    '{"type":"indicator","id":"i1","name":"a","confidence":10,"created":"2026-01-01T05:00:00Z","colour":"red"}',
    '{"type":"indicator","id":"i2","name":"b","confidence":50,"created":"2026-01-01T23:59:59Z"}',
    '{"type":"indicator","id":"i3","name":"c","confidence":90,"created":"2026-01-02T00:30:00+02:00"}',
    # 2026-01-02: the bands' edges (33 low, 34 medium, 67 high) and no confidence
    '{"type":"indicator","id":"i4","name":"d","confidence":33,"created":"2026-01-02T10:00:00Z"}',
    '{"type":"indicator","id":"i5","name":"e","confidence":34,"created":"2026-01-02T11:00:00Z"}',
    '{"type":"indicator","id":"i6","name":"f","confidence":67,"created":"2026-01-02T12:00:00Z"}',
    '{"type":"indicator","id":"i7","name":"g","created":"2026-01-02T13:00:00Z"}',
    # no created: the day it was ingested
    '{"type":"indicator","id":"i8","name":"h","confidence":66}',
    '{"type":"malware","id":"m1","name":"x","sample_size":5}',
    "not json",
]
INDICATOR = table_key("indicator")


def ingest(
    config: IdemConfig, pg_url: str, instance: dg.DagsterInstance, name: str, lines: list[str], connector_name: str = "threatfeed"
) -> dg.ExecuteInProcessResult:
    """Drop a file and run the connector's job on its partition, as the sensor's run would."""
    connector = config.connector(connector_name)
    assert connector.path is not None
    path = write_lines(connector.path / name, lines)
    key = partition_key_for(connector, path)
    instance.add_dynamic_partitions(partitions_for(connector).name or "", [key])
    result = build_definitions(config, postgres_url=pg_url).resolve_job_def(f"{connector_name}_ingest").execute_in_process(
        instance=instance, partition_key=key, run_config={"ops": {f"{connector_name}__ingest": {"config": {"files": [str(path)]}}}}
    )
    assert result.success
    return result


def table_events(instance: dg.DagsterInstance, record_type: str) -> list[dg.AssetMaterialization]:
    """The table asset's materializations, newest first."""
    records = instance.fetch_materializations(table_key(record_type), limit=100).records
    return [r.asset_materialization for r in records if r.asset_materialization is not None]


def count(pg_url: str, record_type: str) -> int:
    with connect(pg_url) as conn:
        return int(conn.execute(f'SELECT count(*) FROM idem.{table_name(record_type)}').fetchone()[0])  # type: ignore[index]


def materialize_asset(
    config: IdemConfig, pg_url: str, instance: dg.DagsterInstance, asset: dg.AssetsDefinition
) -> dg.ExecuteInProcessResult:
    """Materialize one user asset in the code location's definitions, as the UI would."""
    defs = dg.Definitions.merge(build_definitions(config, postgres_url=pg_url), dg.Definitions(assets=[asset]))
    job = defs.resolve_implicit_job_def_def_for_assets([asset.key])
    assert job is not None
    return job.execute_in_process(instance=instance, asset_selection=[asset.key], raise_on_error=False)


def test_each_written_table_is_an_asset_downstream_of_its_writers(tmp_path: Path) -> None:
    # Beside the example's file drop: an HTTP connector of indicators only, a Kafka connector
    # of malware only, and an OTLP connector writing its implicit log table.
    config = parse_config(
        example_text().replace(
            "\ntables:",
            "\n- {name: pushed, kind: http, path: drop/push, record_type: indicator}"
            "\n- {name: events, kind: kafka, bootstrap_servers: '127.0.0.1:1', topics: [events], record_type: malware}"
            "\n- {name: otel, kind: otlp, path: drop/otel}"
            "\ntables:",
        ),
        tmp_path / "idem.yaml",
    )
    defs = build_definitions(config, postgres_url="postgresql://postgres@127.0.0.1:5432/postgres")
    graph = defs.resolve_asset_graph()
    tables = {k: graph.get(k) for k in graph.get_all_asset_keys() if k.path[0] == "idem"}
    parents = {k.to_user_string(): sorted(p.to_user_string() for p in node.parent_keys) for k, node in tables.items()}
    assert parents == {
        "idem/indicator": ["pushed/committed", "threatfeed/committed"],
        "idem/malware": ["events/committed", "threatfeed/committed"],
        "idem/threat-actor": ["threatfeed/committed"],
        "idem/log": ["otel/committed"],  # the implicit table: only its otlp connector writes it
    }
    indicator = tables[INDICATOR]
    # Loadable, never materializable here: only the connectors' commits write a table.
    assert not indicator.is_materializable and not indicator.is_executable
    assert indicator.partitions_def is None and indicator.group_name == "idem_tables"
    assets_def = defs.resolve_assets_def(INDICATOR)
    assert assets_def.get_io_manager_key_for_asset_key(INDICATOR) == TABLE_IO_MANAGER
    # Every file's rows are in the table: the unpartitioned table depends on all of committed's partitions.
    committed = dg.AssetKey(["threatfeed", "committed"])
    mapping = graph.get_partition_mapping(INDICATOR, committed)
    assert isinstance(mapping, dg.AllPartitionMapping)
    spec = next(s for s in defs.resolve_all_asset_specs() if s.key == INDICATOR)
    assert spec.metadata["dagster/table_name"] == "idem.indicator" and spec.metadata["schema_version"] == 1
    # A record type with '-': the key keeps it as written, the table name is the real, unquoted table.
    actor = next(s for s in defs.resolve_all_asset_specs() if s.key == dg.AssetKey(["idem", "threat-actor"]))
    assert actor.metadata["dagster/table_name"] == "idem.threat_actor" and "`idem.threat_actor`" in str(actor.description)
    assert "postgres" in spec.kinds and spec.tags["idem/record_type"] == "indicator"
    columns = {c.name: c for c in spec.metadata["dagster/column_schema"].columns}
    assert list(columns)[:2] == ["_idempotency_key", "_connector"] and list(columns)[-1] == "props"
    assert columns["_idempotency_key"].type == "text" and columns["_idempotency_key"].constraints.unique
    assert columns["_ingested_at"].type == "timestamp with time zone" and not columns["_ingested_at"].constraints.nullable
    assert columns["name"].constraints.nullable is False and columns["confidence"].type == "integer"
    assert columns["embedding"].type == "real[]" and columns["tags"].type == "jsonb"
    # A table a Kafka connector writes has its _kafka column; the others have none.
    malware = next(s for s in defs.resolve_all_asset_specs() if s.key == table_key("malware"))
    assert "_kafka" in {c.name for c in malware.metadata["dagster/column_schema"].columns}
    assert "_kafka" not in columns
    # Column lineage: a typed column is the field of that name from each writer's commit;
    # idem's own columns and props come from the record as received (_payload).
    lineage = spec.metadata["dagster/column_lineage"]
    assert isinstance(lineage, dg.TableColumnLineage) and set(lineage.deps_by_column) == set(columns)
    writers = [dg.AssetKey(["pushed", "committed"]), dg.AssetKey(["threatfeed", "committed"])]

    def feeds(column: str) -> list[tuple[dg.AssetKey, str]]:
        return sorted(((d.asset_key, d.column_name) for d in lineage.deps_by_column[column]), key=str)

    assert feeds("confidence") == [(key, "confidence") for key in writers]
    assert feeds("_idempotency_key") == feeds("props") == [(key, "_payload") for key in writers]
    log = next(s for s in defs.resolve_all_asset_specs() if s.key == table_key("log"))
    assert {d.asset_key for deps in log.metadata["dagster/column_lineage"].deps_by_column.values() for d in deps} == {
        dg.AssetKey(["otel", "committed"])
    }
    # committed's own metadata shows the same declared schema (one builder for both).
    declared = defs.resolve_assets_def(committed).metadata_by_key[committed]["columns/indicator"].schema
    assert [c.name for c in declared.columns] == list(columns)


def test_a_connector_named_idem_cannot_shadow_a_table(tmp_path: Path) -> None:
    text = example_text().replace("name: threatfeed", "name: idem").replace("threat-actor:", "committed:")
    config = parse_config(text, tmp_path / "idem.yaml")
    with pytest.raises(ConfigError, match="record type 'committed' and connector 'idem' would both be the Dagster asset idem/committed"):
        table_asset_specs(config)


def test_each_commit_materializes_the_tables_it_wrote(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    first = ingest(threatfeed, pg_url, instance, "first.ndjson", LINES)
    (committed,) = [m for m in first.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"]
    commit_id = committed.metadata["commit_id"].value
    (indicator,) = table_events(instance, "indicator")
    metadata = {k: v.value for k, v in indicator.metadata.items()}
    assert metadata["dagster/row_count"] == count(pg_url, "indicator") == 8 and metadata["row_count_exact"] is True
    assert (metadata["commit_id"], metadata["rows_written"], metadata["schema_version"]) == (commit_id, 8, 1)
    assert metadata["partition"] == "first.ndjson" and metadata["dagster/table_name"] == "idem.indicator"
    # The columns as PostgreSQL has them now: evolution added colour, which idem.yaml does not declare.
    columns = {c.name: c for c in metadata["dagster/column_schema"].columns}
    assert columns["colour"].type == "text" and "schema evolution" in (columns["colour"].description or "")
    assert metadata["new_columns"] == "colour"
    assert "colour" not in {c.name for c in next(
        s for s in build_definitions(threatfeed).resolve_all_asset_specs() if s.key == INDICATOR
    ).metadata["dagster/column_schema"].columns}
    (malware,) = table_events(instance, "malware")
    assert malware.metadata["dagster/row_count"].value == 1
    assert table_events(instance, "threat-actor") == []  # the commit wrote none of it
    # The events belong to the run that committed (the UI links them to it).
    logged = [e.asset_key for e in first.get_asset_materialization_events() if e.step_key == "threatfeed__committed"]
    assert set(logged) == {dg.AssetKey(["threatfeed", "committed"]), INDICATOR, table_key("malware")}

    # A second file: the table grew; its count is the table's, not the commit's.
    ingest(threatfeed, pg_url, instance, "second.ndjson", ['{"type":"indicator","id":"i9","name":"z","confidence":1}'])
    latest, _ = table_events(instance, "indicator")
    assert (latest.metadata["dagster/row_count"].value, latest.metadata["rows_written"].value) == (9, 1)
    assert len(table_events(instance, "malware")) == 1  # not touched: nothing reported
    # A replay of a committed file writes nothing, and reports no table materialization.
    again = ingest(threatfeed, pg_url, instance, "first.ndjson", LINES)
    assert len(table_events(instance, "indicator")) == 2
    assert [m.asset_key for m in again.asset_materializations_for_node("threatfeed__committed")] == [
        dg.AssetKey(["threatfeed", "committed"])
    ]


def test_row_count_is_exact_for_small_tables_and_the_estimate_for_big_ones(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    ingest(threatfeed, pg_url, instance, "count.ndjson", LINES)
    with connect(pg_url, autocommit=True) as conn:
        assert count_rows(conn, "indicator") == (8, True)
        # No statistics yet: even above the size limit the count is exact.
        exact = count_rows(conn, "indicator", exact_max_bytes=0)
        assert (exact.rows, exact.exact) == (8, True)
        conn.execute("ANALYZE idem.indicator")
        conn.execute("DELETE FROM idem.indicator WHERE _external_id IN ('i1', 'i2')")
        # Above the limit, with statistics: PostgreSQL's estimate (one catalog row), labelled as such.
        estimate = count_rows(conn, "indicator", exact_max_bytes=0)
        assert (estimate.rows, estimate.exact) == (8, False)  # the density ANALYZE saw, not the deletes
        assert count_rows(conn, "indicator") == (6, True)
        assert count_rows(conn, "no-such-table") == (0, True)


def test_a_user_asset_receives_the_table_as_a_spark_dataframe(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    first = ingest(threatfeed, pg_url, instance, "read.ndjson", LINES)
    (committed,) = [m for m in first.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"]
    received: dict[str, Any] = {}

    @dg.asset(ins={"indicator": dg.AssetIn(INDICATOR)})
    def indicator_names(indicator: DataFrame) -> dg.MaterializeResult:
        received["type"] = type(indicator)
        received["columns"] = indicator.columns
        rows = indicator.select("name", "confidence", "colour", "_schema_version", "_commit_id").collect()
        received["rows"] = sorted((r["name"], r["confidence"], r["colour"], r["_schema_version"], str(r["_commit_id"])) for r in rows)
        return dg.MaterializeResult(metadata={"rows": len(rows)})

    result = materialize_asset(threatfeed, pg_url, instance, indicator_names)
    assert result.success
    assert issubclass(received["type"], DataFrame)
    assert {"_idempotency_key", "_payload", "name", "embedding", "colour", "props"} <= set(received["columns"])
    commit_id = committed.metadata["commit_id"].value
    assert received["rows"][:2] == [("a", 10, "red", 1, commit_id), ("b", 50, None, 1, commit_id)]
    assert [r[0] for r in received["rows"]] == list("abcdefgh")
    # What was read is recorded on the table: an observation with the rows per stored version.
    (observation,) = result.asset_observations_for_node("indicator_names")
    assert observation.asset_key == INDICATOR
    seen = {k: v.value for k, v in observation.metadata.items()}
    assert seen["rows_by_version"] == {"1": 8} and seen["current_version"] == 1 and seen["rows"] == 8
    assert seen["table"] == "idem.indicator" and seen["skip_failed_migrations"] is False

    # Input metadata narrows the read: one commit's rows, at most N of them.
    second = ingest(threatfeed, pg_url, instance, "read2.ndjson", ['{"type":"indicator","id":"i9","name":"z"}'])
    (later,) = [m for m in second.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"]

    @dg.asset(ins={"indicator": dg.AssetIn(INDICATOR, metadata={"commit_id": later.metadata["commit_id"].value})})
    def latest_commit(indicator: DataFrame) -> dg.MaterializeResult:
        received["latest"] = [r["name"] for r in indicator.select("name").collect()]
        return dg.MaterializeResult()

    @dg.asset(ins={"indicator": dg.AssetIn(INDICATOR, metadata={"limit": 3})})
    def first_three(indicator: DataFrame) -> dg.MaterializeResult:
        received["limited"] = indicator.count()
        return dg.MaterializeResult()

    assert materialize_asset(threatfeed, pg_url, instance, latest_commit).success
    assert materialize_asset(threatfeed, pg_url, instance, first_three).success
    assert received["latest"] == ["z"] and received["limited"] == 3


def test_a_commit_lets_an_eager_downstream_asset_run_once(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    """A user's asset chained off a table with ``AutomationCondition.eager()`` is requested
    after each commit that wrote the table, once, and not after a replay (nothing written)."""

    @dg.asset(deps=[INDICATOR], automation_condition=dg.AutomationCondition.eager())
    def indicator_report() -> None: ...

    defs = dg.Definitions.merge(build_definitions(threatfeed, postgres_url=pg_url), dg.Definitions(assets=[indicator_report]))
    selection = dg.AssetSelection.assets(indicator_report.key)
    cursor = None

    def requested() -> bool:
        nonlocal cursor
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, asset_selection=selection, cursor=cursor)
        cursor = result.cursor
        assert result.total_requested in (0, 1)
        return result.get_num_requested(indicator_report.key) == 1

    assert not requested()  # the table has never been written: nothing to chain off
    ingest(threatfeed, pg_url, instance, "eager-1.ndjson", LINES)
    assert requested()
    assert not requested()  # no new commit: not again
    ingest(threatfeed, pg_url, instance, "eager-2.ndjson", ['{"type":"indicator","id":"i9","name":"z"}'])
    assert requested()
    ingest(threatfeed, pg_url, instance, "eager-1.ndjson", LINES)  # a replay writes nothing
    assert not requested()
    # A commit that wrote only another table leaves the indicator's readers alone.
    ingest(threatfeed, pg_url, instance, "eager-3.ndjson", ['{"type":"malware","id":"m9","name":"y"}'])
    assert not requested()


READINGS_V1 = """
connectors:
  - {name: sensors, kind: filedrop, path: drop/sensors, record_type: reading, id_field: id}
tables:
  reading:
    schema_version: 1
    columns: {sensor: {type: string, required: true}, temp: real, meta: dynamic}
"""
READINGS_V3 = """
connectors:
  - {name: sensors, kind: filedrop, path: drop/sensors, record_type: reading, id_field: id}
tables:
  reading:
    schema_version: 3
    columns: {sensor: {type: string, required: true}, temperature: real, labels: dynamic}
migrations: [MODULE]
"""


def test_old_rows_arrive_migrated_and_a_failing_migration_fails_the_read_unless_skipped(
    pg_url: str, tmp_path: Path, instance: dg.DagsterInstance, spark: Any
) -> None:
    """Rows written at v1, read by an asset after the table moved to v3
    (:mod:`idem_platform_tests.helpers.migrations_fixture`: rename, then °F -> °C; sensor
    ``broken`` cannot be migrated)."""
    reset_database(pg_url)
    v1 = write_config(tmp_path, READINGS_V1)
    ingest(v1, pg_url, instance, "old.ndjson", [
        '{"id":"r1","sensor":"s1","temp":212,"meta":{"site":"a"}}',
        '{"id":"r2","sensor":"broken","temp":50}',
    ], connector_name="sensors")
    module = f"reading_migrations_{uuid.uuid4().hex[:10]}"
    shutil.copy(migrations_fixture.__file__, tmp_path / f"{module}.py")
    v3 = write_config(tmp_path, READINGS_V3.replace("MODULE", module))
    received: dict[str, Any] = {}

    def reader(name: str, metadata: dict[str, Any]) -> dg.AssetsDefinition:
        @dg.asset(name=name, ins={"reading": dg.AssetIn(table_key("reading"), metadata=metadata)})
        def read_readings(reading: DataFrame) -> dg.MaterializeResult:
            rows = reading.select("_external_id", "_schema_version", "temperature", "labels").collect()
            received[name] = sorted((r[0], r[1], r[2], r[3]) for r in rows)
            return dg.MaterializeResult()

        return read_readings

    failing = materialize_asset(v3, pg_url, instance, reader("strict_reader", {}))
    assert not failing.success
    (failure,) = [e for e in failing.all_events if e.is_step_failure]
    said = failure.step_failure_data.error.to_string()
    key = "sensors:reading:r2:"
    assert key in said and "reading v1->v2" in said and "has no calibration" in said

    skipping = materialize_asset(v3, pg_url, instance, reader("lenient_reader", {"skip_failed_migrations": True}))
    assert skipping.success
    assert received["lenient_reader"] == [("r1", 3, 100.0, '{"site":"a"}')]  # °F -> °C, meta -> labels
    (observation,) = skipping.asset_observations_for_node("lenient_reader")
    seen = {k: v.value for k, v in observation.metadata.items()}
    assert seen["rows_by_version"] == {"1": 2} and seen["current_version"] == 3
    assert seen["skipped"] == 1 and seen["skip_failed_migrations"] is True


def test_the_table_io_manager_refuses_to_write(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance
) -> None:
    @dg.asset(io_manager_key=TABLE_IO_MANAGER)
    def sneaky() -> int:
        return 1

    result = dg.materialize(
        [sneaky], instance=instance, resources=resources_for(threatfeed, postgres_url=pg_url), raise_on_error=False
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error
    while error is not None and "only reads tables" not in error.message:
        error = error.cause
    assert error is not None, failure.step_failure_data.error
    assert "sneaky: idem_table_io_manager only reads tables" in error.message
    assert "(<connector>/committed)" in error.message
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.commits").fetchone() == (0,)


def test_the_example_counts_indicators_per_day_and_confidence_band(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    from idem_platform.examples.threatfeed import example_definitions, indicator_daily_confidence

    ingest(threatfeed, pg_url, instance, "example.ndjson", LINES)
    defs = example_definitions(threatfeed, postgres_url=pg_url)
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey("indicator_daily_confidence")
    assert set(graph.get(key).parent_keys) == {INDICATOR}
    job = defs.resolve_implicit_job_def_def_for_assets([key])
    assert job is not None
    result = job.execute_in_process(instance=instance, asset_selection=[key])
    (event,) = result.asset_materializations_for_node("indicator_daily_confidence")
    metadata = {k: v.value for k, v in event.metadata.items()}
    assert metadata["indicators"] == 8 and metadata["days"] == metadata["dagster/row_count"] == 3
    assert metadata["bands"] == {"low": 2, "medium": 3, "high": 2, "unknown": 1}
    with connect(pg_url) as conn:
        (today,) = conn.execute("SELECT (_ingested_at AT TIME ZONE 'UTC')::date FROM idem.indicator WHERE _external_id = 'i8'").fetchone()  # type: ignore[misc]
    lines = metadata["by_day"].splitlines()
    assert lines[0] == "| day | low | medium | high | unknown | total |"
    assert lines[2:] == [  # newest first
        f"| {today} | 0 | 1 | 0 | 0 | 1 |",
        "| 2026-01-02 | 1 | 1 | 1 | 1 | 4 |",
        "| 2026-01-01 | 1 | 1 | 1 | 0 | 3 |",
    ]
    assert today > dt.date(2026, 1, 2)
    assert indicator_daily_confidence.key == key


def test_the_example_needs_an_indicator_table(tmp_path: Path) -> None:
    from idem_platform.examples.threatfeed import example_definitions

    text = example_text().replace("  indicator:\n", "  ioc:\n")
    config = parse_config(text, tmp_path / "idem.yaml")
    with pytest.raises(ConfigError, match="the threat-feed example reads the indicator table; this config declares ioc, malware, threat-actor"):
        example_definitions(config)


def test_assets_listed_in_the_config_join_the_generated_code_location(tmp_path: Path) -> None:
    """``assets:`` in idem.yaml: the modules' assets join ``build_definitions`` (what ``make dev``
    loads); a module of the config's own directory is importable; a missing one fails the load
    naming it."""
    own = tmp_path / "my_reports.py"
    own.write_text(
        "import dagster as dg\n"
        "from idem_platform.defs.tables import table_key\n\n"
        "@dg.asset(ins={'malware': dg.AssetIn(table_key('malware'))})\n"
        "def malware_families(malware) -> None:\n"
        "    return None\n",
        encoding="utf-8",
    )
    text = example_text() + "\nassets: [idem_platform.examples.threatfeed, my_reports]\n"
    config = write_config(tmp_path, text)
    keys = {k.to_user_string() for k in build_definitions(config).resolve_asset_graph().get_all_asset_keys()}
    assert {"indicator_daily_confidence", "malware_families", "idem/indicator"} <= keys
    graph = build_definitions(config).resolve_asset_graph()
    assert table_key("malware") in graph.get(dg.AssetKey("malware_families")).parent_keys
    broken = write_config(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path, example_text() + "\nassets: [no_such_reports]\n")
    with pytest.raises(ConfigError, match="assets: module 'no_such_reports' cannot be imported"):
        build_definitions(broken)


@pytest.mark.parametrize("order", [{"order_by": "confidence"}, {}], ids=["order_by", "source order"])
def test_an_upsert_tables_asset_is_its_current_state(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any, order: dict[str, str]
) -> None:
    reset_database(pg_url)
    data = yaml.safe_load(example_text())
    data["tables"]["indicator"].update({"mode": "upsert", **order})
    config = write_config(tmp_path, yaml.safe_dump(data, sort_keys=False))
    ingest(config, pg_url, instance, "versions.ndjson", [
        '{"type":"indicator","id":"i1","name":"a","confidence":10}',
        '{"type":"indicator","id":"i1","name":"b","confidence":20}',
        '{"type":"indicator","id":"i2","name":"c","confidence":5}',
    ])
    (event,) = table_events(instance, "indicator")
    metadata = {k: v.value for k, v in event.metadata.items()}
    assert metadata["dagster/table_name"] == "idem.indicator_current" and metadata["dagster/row_count"] == 2
    assert [metadata[k] for k in ("rows_written", "inserted", "updated", "deleted", "stale")] == [3, 2, 0, 0, 1]
    received: dict[str, list[str]] = {}

    @dg.asset(ins={"indicator": dg.AssetIn(INDICATOR)})
    def current_names(indicator: DataFrame) -> None:
        received["current"] = sorted(r["name"] for r in indicator.select("name").collect())

    @dg.asset(ins={"indicator": dg.AssetIn(INDICATOR, metadata={"history": True})})
    def every_name(indicator: DataFrame) -> None:
        received["history"] = sorted(r["name"] for r in indicator.select("name").collect())

    assert materialize_asset(config, pg_url, instance, current_names).success
    assert materialize_asset(config, pg_url, instance, every_name).success
    assert received == {"current": ["b", "c"], "history": ["a", "b", "c"]}
