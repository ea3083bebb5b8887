"""The Dagster surface: definitions, the partitioned job in process, metadata, checks, retries, PG instance."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from idem_platform.config import IdemConfig
from idem_platform.defs.definitions import build_definitions
from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for
from idem_platform.defs.storage import pool_storage_connections
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.config import example_text, write_config
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.filedrop import drop_dir, run_file_partition
from idem_platform_tests.helpers.paths import EXAMPLE_CONFIG, REPO

GOOD = [
    '{"type":"indicator","id":"i1","name":"a","confidence":1,"embedding":[1,2,3,4,5,6,7,8]}',
    '{"type":"malware","id":"m1","name":"b","sample_size":5}',
    '{"type":"threat-actor","id":"t1","name":"c","aliases":["x"]}',
    "garbage",
]


def run_partition(config: IdemConfig, pg_url: str, instance: dg.DagsterInstance, path: Path) -> dg.ExecuteInProcessResult:
    return run_file_partition(build_definitions(config, postgres_url=pg_url), instance, config, path, raise_on_error=False)


def committed_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    (materialization,) = [m for m in result.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"]
    return {k: v.value for k, v in materialization.metadata.items()}


def test_definitions_expose_assets_job_sensor_schedule_and_checks(threatfeed: IdemConfig) -> None:
    defs = build_definitions(threatfeed)
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == {"threatfeed/ingest", "threatfeed/coerced", "threatfeed/committed", "idem/indicator", "idem/malware", "idem/threat-actor"}
    assert {check.name for check in graph.asset_check_keys} == {"pandera_contract", "commit_consistency", "reject_ratio"}
    assert defs.resolve_job_def("threatfeed_ingest").executor_def is dg.in_process_executor
    # idem's jobs carry their executor; the code location's (the implicit asset job's: the UI's
    # "Materialize", backfills) stays Dagster's default, for a project's own assets.
    assert all(job.executor_def is dg.in_process_executor for job in defs.resolve_all_job_defs() if not job.name.startswith("__"))
    implicit = defs.resolve_implicit_job_def_def_for_assets([dg.AssetKey(["threatfeed", "committed"])])
    assert implicit is not None and implicit.executor_def is dg.multi_or_in_process_executor
    assert defs.resolve_sensor_def("threatfeed_filedrop_sensor").job_name == "threatfeed_ingest"
    assert defs.resolve_schedule_def("ledger_purge_hourly").cron_schedule == "0 * * * *"
    # Before any run the UI shows what committed writes: the tables and their declared columns.
    committed = dg.AssetKey(["threatfeed", "committed"])
    declared = defs.resolve_assets_def(committed).metadata_by_key[committed]
    assert "`idem.threat_actor`" in declared["writes"].value
    columns = {c.name: c for c in declared["columns/indicator"].schema.columns}
    assert columns["confidence"].type == "integer" and columns["name"].constraints.nullable is False
    assert "_idempotency_key" in columns and "props" in columns
    # Rendered as markdown in the UI: placeholders in backticks survive, bare <...> would be tags.
    assert columns["_idempotency_key"].description == "the record key: `<connector>:<record_type>:<ext_id>:<sha1(canonical)[:12]>`"
    sensor = defs.resolve_sensor_def("threatfeed_filedrop_sensor")
    assert "500 files and 1 GiB (one commit" in (sensor.description or "") and "bytes" not in (sensor.description or "")
    assert "`rows_written`" in (defs.resolve_assets_def(committed).descriptions_by_key[committed] or "")
    descriptions = [d.description or "" for d in defs.resolve_all_asset_specs()]
    assert not any(str(threatfeed.source.parent) in d or "DESIGN" in d for d in descriptions)  # no machine paths
    ingest = defs.resolve_assets_def(dg.AssetKey(["threatfeed", "ingest"]))
    assert isinstance(ingest.partitions_def, dg.DynamicPartitionsDefinition)


def test_a_connector_has_one_spelling_and_its_sensor_names_what_it_watches(threatfeed: IdemConfig) -> None:
    # The example's http connector is threatfeed-push: every Dagster name of it says threatfeed_push.
    full = write_config(Path(str(threatfeed.source)).parent, EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    defs = build_definitions(full)
    graph = defs.resolve_asset_graph()
    push = {key.to_user_string() for key in graph.get_all_asset_keys() if key.path[0].startswith("threatfeed_push")}
    assert push == {"threatfeed_push/ingest", "threatfeed_push/coerced", "threatfeed_push/committed"}
    assert not any("-" in key.path[0] for key in graph.get_all_asset_keys())
    assert {graph.get(dg.AssetKey(["threatfeed_push", part])).group_name for part in ("ingest", "committed")} == {"threatfeed_push"}
    job = defs.resolve_job_def("threatfeed_push_ingest")
    assert {node.name for node in job.graph.node_dict.values()} >= {"threatfeed_push__ingest", "threatfeed_push__committed"}
    sensors = {s.name: s.job_name for s in defs.sensors or []}
    assert sensors["threatfeed_filedrop_sensor"] == "threatfeed_ingest"
    assert sensors["threatfeed_push_push_sensor"] == "threatfeed_push_ingest"
    assert sensors["otel_otlp_sensor"] == "otel_ingest"
    assert not any("filedrop" in name for name in sensors if not name.startswith("threatfeed_filedrop"))
    # The CLI takes the name as written or as the UI spells it.
    assert full.connector("threatfeed_push") is full.connector("threatfeed-push")


def test_job_commits_a_partition_and_reports_it(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    path = write_lines(drop_dir(threatfeed) / "d1.ndjson", GOOD)
    result = run_partition(threatfeed, pg_url, instance, path)
    assert result.success
    metadata = committed_metadata(result)
    assert (metadata["rows_written"], metadata["rows_skipped"], metadata["rows_rejected"]) == (3, 0, 1)
    assert metadata["replayed"] is False and metadata["schema_versions"] == {"indicator": 1, "malware": 1, "threat-actor": 1}
    # Numbers people read: flat counts per table, a markdown table, a rounded ratio, the rejects.
    assert "summary" not in metadata and metadata["reject_ratio"] == 0.25
    assert (metadata["written/indicator"], metadata["written/malware"], metadata["skipped/threat-actor"]) == (1, 1, 0)
    assert "| `idem.malware` | 1 | 0 | — |" in metadata["tables"]
    (reject,) = metadata["rejects"].records
    assert reject.data["rule"] == "json" and reject.data["position"].endswith("#L4")
    (coerced,) = result.asset_materializations_for_node("threatfeed__coerced")
    assert coerced.metadata["dagster/row_count"].value == 4  # the lines it coerces, garbage included
    # files: relative to the drop directory, no inode or times; rows_written alone says how many rows
    assert metadata["files"] == [{"file": "d1.ndjson", "key": metadata["files"][0]["key"], "bytes": path.stat().st_size,
                                  "lines": 4, "rows_written": 3, "rows_skipped": 0, "rows_rejected": 1}]
    assert "dagster/row_count" not in metadata
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(m.startswith("slice 1/1 staged: 3 records so far") for m in logs)  # progress
    assert any(m.startswith("applying 3 records into idem.") for m in logs)
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"pandera_contract": True, "commit_consistency": True, "reject_ratio": False}
    assert {e.partition for e in result.get_asset_check_evaluations()} == {"d1.ndjson"}  # results per file
    (ingest,) = result.asset_materializations_for_node("threatfeed__ingest")
    assert ingest.metadata["lines"].value == 4 and ingest.partition == "d1.ndjson"

    again = run_partition(threatfeed, pg_url, instance, path)
    assert again.success
    replay = committed_metadata(again)
    assert replay["replayed"] is True and replay["rows_written"] == 0
    # The replay keeps the partition's warning: its data is the prior commit's, 1 reject in 4.
    checks = {e.check_name: e.passed for e in again.get_asset_check_evaluations()}
    assert checks["reject_ratio"] is False
    assert replay["prior"]["commit_id"] == metadata["commit_id"]
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.indicator").fetchone() == (1,)


def test_committed_alone_materializes_from_the_partitions_latest_plan(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    """What a user does in the UI after a run: select one partition of ``committed`` and
    Materialize. The run has no ``coerced`` step; it loads that partition's latest plan."""
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    path = write_lines(connector.path / "alone.ndjson", GOOD)
    first = run_partition(threatfeed, pg_url, instance, path)
    assert first.success
    defs = build_definitions(threatfeed, postgres_url=pg_url)
    committed_key = dg.AssetKey(["threatfeed", "committed"])
    job = defs.resolve_implicit_job_def_def_for_assets([committed_key])
    assert job is not None
    alone = job.execute_in_process(
        instance=instance, partition_key=partition_key_for(connector, path), asset_selection=[committed_key], raise_on_error=False
    )
    assert alone.success
    metadata = committed_metadata(alone)
    assert metadata["replayed"] is True and metadata["prior"]["commit_id"] == committed_metadata(first)["commit_id"]
    assert metadata["rows_written"] == 0 and metadata["prior"]["rows_written"] == 3  # the partition's rows are the prior's

    never = write_lines(connector.path / "never.ndjson", GOOD)
    key = partition_key_for(connector, never)
    instance.add_dynamic_partitions(partitions_for(connector).name or "", [key])
    missing = job.execute_in_process(instance=instance, partition_key=key, asset_selection=[committed_key], raise_on_error=False)
    assert not missing.success
    (failure,) = [e for e in missing.all_events if e.is_step_failure]
    assert "partition 'never.ndjson' has never been materialized" in str(failure.step_failure_data.error)


def test_commit_consistency_fails_when_the_table_lost_a_row_of_the_commit(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    path = write_lines(drop_dir(threatfeed) / "d4.ndjson", GOOD)
    assert run_partition(threatfeed, pg_url, instance, path).success
    with connect(pg_url) as conn:
        conn.execute("DELETE FROM idem.malware")
    defs = build_definitions(threatfeed, postgres_url=pg_url)
    # Only the check, on that partition: what "Execute" on a check does in the UI.
    result = defs.resolve_job_def("threatfeed_ingest").execute_in_process(
        instance=instance,
        partition_key="d4.ndjson",  # the check reads that partition's latest commit
        op_selection=["threatfeed__committed_commit_consistency"],
        raise_on_error=False,
    )
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.partition == "d4.ndjson"
    assert evaluation.metadata["problems"].value == ["malware: commit says 1, table holds 0"]


def test_failed_run_then_retry_commits_once(pg_url: str, tmp_path: Path, instance: dg.DagsterInstance, spark: Any) -> None:
    reset_database(pg_url)
    strict = write_config(tmp_path, example_text().replace("max_reject_ratio: 1.0", "max_reject_ratio: 0.1"))
    path = write_lines(drop_dir(strict) / "d2.ndjson", GOOD)
    failed = run_partition(strict, pg_url, instance, path)
    assert not failed.success
    with connect(pg_url) as conn:
        status, error = conn.execute("SELECT status, error FROM idem.ingest_ledger").fetchone()
    assert status == "failed" and "max_reject_ratio 0.1" in error["message"]
    # The user relaxes the limit and materializes the partition again from the UI.
    relaxed = write_config(tmp_path, example_text())
    retried = run_partition(relaxed, pg_url, instance, path)
    assert retried.success and committed_metadata(retried)["rows_written"] == 3
    with connect(pg_url) as conn:
        assert conn.execute("SELECT status, attempts FROM idem.ingest_ledger").fetchone() == ("committed", 2)
        assert conn.execute("SELECT count(*) FROM idem.commits").fetchone() == (1,)


def test_runs_are_stored_in_postgres_through_dagster_yaml(
    threatfeed: IdemConfig, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: Any
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "unset")
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE")  # restored after the test, whatever it was
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert os.environ["DAGSTER_EVENT_BATCH_SIZE"] == "1000"  # idem's event log turns batched asset writes on
        path = write_lines(drop_dir(threatfeed) / "d3.ndjson", GOOD[:1])
        # dagster.yaml names idem's pooled subclasses of dagster-postgres's storages.
        assert type(instance.event_log_storage).__name__ == "PooledPostgresEventLogStorage"
        assert type(instance.run_storage).__name__ == "PooledPostgresRunStorage"
        opened = sessions_opened(pg_url)
        result = run_partition(threatfeed, pg_url, instance, path)
        opened = sessions_opened(pg_url) - opened
        assert result.success
    with connect(pg_url) as conn:
        stored = conn.execute("SELECT status FROM runs WHERE run_id = %s", [result.run_id]).fetchone()
        events = conn.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", [result.run_id]).fetchone()[0]
    assert stored == ("SUCCESS",)
    # Dagster's storage keeps its connection for the run: with `storage: postgres:`,
    # dagster-postgres opened a session per stored event (57 sessions for 52 events here);
    # pooled, the run's sessions are idem's own and a few of Dagster's (20).
    assert events > 40 and opened < events * 2 // 3, (opened, events)


def test_pool_storage_connections_pools_a_plain_dagster_postgres_instance(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's own dagster.yaml (``storage: postgres:``): ``idem ingest`` and the postgres
    resource switch its storage to a kept connection, once."""
    home = tmp_path / "plain_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("storage:\n  postgres:\n    postgres_url:\n      env: IDEM_POSTGRES_URL\n")
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.event_log_storage._engine.pool).__name__ == "NullPool"  # type: ignore[attr-defined]
        pool_storage_connections(instance)
        pooled = instance.event_log_storage._engine  # type: ignore[attr-defined]
        assert type(pooled.pool).__name__ == "QueuePool"
        pool_storage_connections(instance)
        assert instance.event_log_storage._engine is pooled  # type: ignore[attr-defined]


def sessions_opened(url: str) -> int:
    """Sessions PostgreSQL has counted for the database so far (closed ones are counted for sure)."""
    with connect(url) as conn:
        return int(conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()[0])


@pytest.mark.slow
def test_dagster_loads_the_workspace(tmp_path: Path) -> None:
    env = {**os.environ, "IDEM_CONFIG": str(EXAMPLE_CONFIG), "DAGSTER_HOME": str(tmp_path)}
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Validation successful for code location idem_platform" in completed.stdout + completed.stderr


@pytest.mark.slow
def test_idem_dev_stops_everything_it_started_on_sigterm(
    threatfeed: IdemConfig, pg_url: str, tmp_path: Path
) -> None:
    """``idem dev`` passes SIGTERM to dagster dev's whole process group (webserver, daemon,
    code server) and nothing of it outlives the grace period; a DAGSTER_HOME that does not
    exist yet is created; no stray warnings at start."""
    import signal
    import urllib.request

    import psutil

    from idem_platform_tests.helpers.kafka_broker import free_port

    port = free_port()
    home = tmp_path / "not-yet" / "dagster_home"
    env = {**os.environ, "IDEM_POSTGRES_URL": pg_url, "DAGSTER_HOME": str(home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "idem_platform.cli", "dev", "--config", str(threatfeed.source), "--port", str(port),
         "--workspace", str(REPO / "workspace.yaml"), "--no-spark-server"],  # its Spark server: test_spark_connect
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "dev.log").open("w"),
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, "idem dev exited early"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the webserver never answered"
            time.sleep(0.25)
        family = psutil.Process(process.pid).children(recursive=True)
        assert len(family) >= 3  # dagster dev, its webserver, its daemon (and code servers)
        assert (home / "dagster.yaml").is_file()
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 143
        gone, alive = psutil.wait_procs(family, timeout=max(1.0, 15 - (time.monotonic() - started)))
        assert not alive, [p.info if hasattr(p, "info") else p.pid for p in alive]
        assert time.monotonic() - started < 15
        said = (tmp_path / "dev.log").read_text()
        # started from a checkout that has its own dagster.yaml: no warning that it is ignored
        assert "will not be used" not in said and "SupersessionWarning" not in said
    finally:
        if process.poll() is None:
            process.kill()


def test_hostile_lines_get_one_outcome_at_line_1_as_at_line_5000_and_never_fail_the_contract(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    """Issue 17: each hostile line is a reject with its reason (or, for ``"id": ""``, the
    connector's ``missing_id`` policy) wherever it stands; the blocking contract check
    samples the first lines and must never refuse the file for a line coercion rejects."""
    from idem_platform.samples import threatfeed_lines

    deep = "[" * 300 + "]" * 300
    hostile = [  # (line, its rule, a word of its reason)
        ('{"type":"indicator","id":"h-sur","name":"bad \\ud800"}', "surrogate", "lone surrogate"),
        ('{"type":"indicator","id":"h-deep","name":"x","tags":' + deep + "}", "json", "deeper than 254"),
        ('{"type":"indicator","id":"h-dup","name":"x","name":"y"}', "duplicate_key", "name"),
        ('{"type":"indicator","id":"h-trunc","name":"x"', "json", "not valid JSON"),
    ]
    empty_id = '{"type":"indicator","id":"","name":"no id"}'
    head = [line for line, _, _ in hostile] + [empty_id]
    good = list(threatfeed_lines(5_000, seed=45, duplicate_ratio=0.0))
    tail = [line.replace('"h-', '"t-') for line in head]
    path = write_lines(drop_dir(threatfeed) / "hostile.ndjson", [*head, *good, *tail])
    result = run_partition(threatfeed, pg_url, instance, path)
    assert result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["pandera_contract"] is True and checks["commit_consistency"] is True
    with connect(pg_url) as conn:
        rejects = conn.execute("SELECT line, reasons FROM idem.rejects ORDER BY line").fetchall()
        empty = conn.execute(
            "SELECT _source FROM idem.indicator WHERE name = 'no id' ORDER BY _source"
        ).fetchall()
    by_line = {line: (reasons[0]["rule"], reasons[0]["message"]) for line, reasons in rejects}
    assert len(by_line) == 2 * len(hostile)  # the hostile lines, nothing else
    offset = len(head) + len(good)
    for index, (_, rule, word) in enumerate(hostile, 1):
        assert by_line[index][0] == by_line[offset + index][0] == rule, (index, by_line[index])
        assert word in by_line[index][1] and word in by_line[offset + index][1]
    # "id": "" is a missing id: the example's policy (position) keys it by its place, at both places.
    assert len(empty) == 2 and empty[0][0].endswith(f"#L{len(head)}")


def test_a_file_with_int64_max_beside_a_null_is_committed_through_the_contract_check(
    threatfeed: IdemConfig, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    """``long`` 2**63-1 in a column that also holds a null once failed the blocking contract
    check (pandas made the column float64, 2**63 did not fit Int64 back): nothing was
    committed and every retry failed alike. The extremes of the other types ride along."""
    lines = [
        '{"type":"malware","id":"m1","name":"b","sample_size":9223372036854775807}',
        '{"type":"malware","id":"m2","name":"c"}',
        '{"type":"malware","id":"m3","name":"d","sample_size":-9223372036854775808,"is_packed":null}',
        '{"type":"indicator","id":"i1","name":"a","confidence":2147483647,"score":1.7976931348623157e308,'
        '"created":"2262-04-11T23:47:16.854775807Z","active":true,"embedding":[3.4028234663852886e38,0,0,0,0,0,0,1e-45]}',
        '{"type":"indicator","id":"i2","name":"z","confidence":null,"score":5e-324,"created":-9223372036854775808}',
        '{"type":"indicator","id":"i3","name":"y","confidence":-2147483648}',
    ]
    path = write_lines(drop_dir(threatfeed) / "int64max.ndjson", lines)
    result = run_partition(threatfeed, pg_url, instance, path)
    assert result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["pandera_contract"] is True and checks["commit_consistency"] is True
    assert committed_metadata(result)["rows_written"] == len(lines)
    with connect(pg_url) as conn:
        sizes = dict(conn.execute("SELECT _external_id, sample_size FROM idem.malware").fetchall())
        confidence = dict(conn.execute("SELECT _external_id, confidence FROM idem.indicator").fetchall())
    assert sizes == {"m1": 2**63 - 1, "m2": None, "m3": -(2**63)}
    assert confidence == {"i1": 2**31 - 1, "i2": None, "i3": -(2**31)}
