"""The file-drop sensor's batches: many settled files, one run, one commit, a partition and a ledger row per file.

The sensor runs with ``build_sensor_context`` on a real instance (``SensorTicker``),
its requests are executed as the daemon launches them (same job, run config and
tags, plus the run key), on real PostgreSQL and Spark.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from idem_platform.config import IdemConfig
from idem_platform.defs.filedrop.decisions import Wanted, batches, decide
from idem_platform.defs.filedrop.sensors import (
    BYTES_TAG,
    FILES_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    RUN_KEY_TAG,
)
from idem_platform.ledger import LedgerEntry
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import write_lines
from idem_platform.sources.filedrop.files import hash_file
from idem_platform_tests.helpers.config import example_text, write_config
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.paths import REPO
from idem_platform_tests.helpers.sensors import SensorTicker
from idem_platform_tests.helpers.webserver import webserver

SENSOR = "threatfeed_filedrop_sensor"
JOB = "threatfeed_ingest"
COMMITTED = dg.AssetKey(["threatfeed", "committed"])


@pytest.fixture
def instance(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    """The instance as deployed: the repository's dagster.yaml (Dagster's tables in this
    module's database, idem's pooled storages, batched asset event writes)."""
    schema = f"dagster_{uuid.uuid4().hex[:12]}"  # each test its own runs, partitions and cursors
    with connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text().replace("IDEM_POSTGRES_URL", "IDEM_TEST_DAGSTER_URL"))
    separator = "&" if "?" in pg_url else "?"
    monkeypatch.setenv("IDEM_TEST_DAGSTER_URL", f"{pg_url}{separator}options=-csearch_path%3D{schema}")
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")  # what idem's event log sets (restored after)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            yield instance
    finally:
        with connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def config_with(tmp_path: Path, pg_url: str, **settings: Any) -> IdemConfig:
    """The example's file drop with ``settings`` on its connector, on an emptied database."""
    reset_database(pg_url)
    data = yaml.safe_load(example_text())
    data["connectors"][0].update(settings)
    config = write_config(tmp_path, yaml.safe_dump(data, sort_keys=False))
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    return config


def drop(config: IdemConfig, name: str, count: int, *, prefix: str | None = None) -> Path:
    """A file of ``count`` distinct malware lines."""
    directory = config.connector("threatfeed").path
    assert directory is not None
    tag = prefix or Path(name).stem
    return write_lines(directory / name, [f'{{"type":"malware","id":"{tag}-{i}","name":"m{i}"}}' for i in range(count)])


def launch(ticker: SensorTicker, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    """Execute a requested run as the daemon launches it: its run config and tags, and its run key."""
    return ticker.defs.resolve_job_def(JOB).execute_in_process(
        instance=ticker.instance,
        run_config=request.run_config,
        tags={**request.tags, RUN_KEY_TAG: request.run_key or ""},
        partition_key=request.partition_key,
        raise_on_error=False,
    )


def settle(ticker: SensorTicker) -> dg.SensorResult:
    """Two ticks: the first sees the files, the second finds them settled."""
    ticker.tick()
    return ticker.tick()


def skip_message(result: dg.SensorResult) -> str:
    return (result.skip_reason.skip_message or "") if result.skip_reason else ""


def ledger_rows(pg_url: str) -> dict[str, tuple[str, str, int]]:
    """``{file key: (status, owner, attempts)}`` of the connector's ledger."""
    with connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT key, status, owner, attempts FROM idem.ingest_ledger WHERE namespace = 'threatfeed'"
        ).fetchall()
    return {key: (status, owner, attempts) for key, status, owner, attempts in rows}


def malware_rows(pg_url: str) -> tuple[int, int]:
    """(rows, distinct keys) of idem.malware."""
    with connect(pg_url) as conn:
        row = conn.execute("SELECT count(*), count(DISTINCT _idempotency_key) FROM idem.malware").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def materialized(instance: dg.DagsterInstance) -> set[str]:
    return set(instance.get_materialized_partitions(COMMITTED))


def test_settled_files_are_one_range_run_whose_commit_keeps_a_ledger_row_and_a_partition_per_file(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    config = config_with(tmp_path, pg_url)
    paths = [drop(config, f"f{i}.ndjson", 3) for i in range(5)]
    ticker = SensorTicker(config, instance, pg_url, SENSOR)
    result = settle(ticker)
    (request,) = result.run_requests
    names = [p.name for p in paths]
    assert request.partition_key is None
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("f0.ndjson", "f4.ndjson")
    assert request.tags[FILES_TAG] == "5" and int(request.tags[BYTES_TAG]) == sum(p.stat().st_size for p in paths)
    assert request.run_config["ops"]["threatfeed__ingest"]["config"]["files"] == [str(p) for p in paths]
    assert list(result.dynamic_partitions_requests[0].partition_keys) == names
    assert list(instance.get_dynamic_partitions("threatfeed_files")) == names
    # Until its run exists the same request comes again, with the same key (Dagster launches it once).
    assert [r.run_key for r in ticker.tick().run_requests] == [request.run_key]

    run = launch(ticker, request)
    assert run.success
    assert materialized(instance) == set(names)  # every file's partition, by the one run
    assert malware_rows(pg_url) == (15, 15)  # every line once
    rows = ledger_rows(pg_url)
    assert set(rows) == {hash_file(p).key for p in paths}
    assert {status for status, _, _ in rows.values()} == {"committed"}
    assert len({owner for _, owner, _ in rows.values()}) == 1  # one commit claimed them all
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.commits WHERE NOT replay").fetchone() == (1,)
        # Each ledger row keeps its own file (not the batch's list) and the commit's size.
        results = dict(conn.execute("SELECT key, result FROM idem.ingest_ledger WHERE namespace = 'threatfeed'").fetchall())
    for path in paths:
        own = results[hash_file(path).key]
        assert [f["file"] for f in own["files"]] == [str(path)] and own["commit_keys"] == 5
        assert own["rows_written"] == 15
    # Each partition's materialization carries its own file's entry and the batch's size.
    for path in paths:
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=COMMITTED, asset_partitions=[path.name]), limit=1
        ).records
        metadata = record.asset_materialization.metadata  # type: ignore[union-attr]
        assert [f["file"] for f in metadata["files"].value] == [path.name]  # relative to the drop directory
        assert metadata["batch_files"].value == 5 and metadata["batch_rows_written"].value == 15
        assert metadata["rows_written"].value == 3 and "dagster/row_count" not in metadata  # its own, said once
    after = ticker.tick()
    assert after.run_requests == [] and "5 committed" in skip_message(after)


def file_held(pg_url: str, path: Path) -> tuple[int, int]:
    """(rows of idem.malware whose position is in the file, rejects recorded for the file)."""
    key = hash_file(path).key
    with connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM idem.malware WHERE split_part(_source, '#L', 1) = %s", [key.split(":")[1][:16]]
        ).fetchone()
        rejects = conn.execute("SELECT count(*) FROM idem.rejects WHERE source = %s", [key]).fetchone()
    assert rows is not None and rejects is not None
    return int(rows[0]), int(rejects[0])


def partition_metadata(instance: dg.DagsterInstance, partition: str) -> dict[str, Any]:
    """The values of the latest ``committed`` materialization's metadata of ``partition``."""
    (record,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=COMMITTED, asset_partitions=[partition]), limit=1
    ).records
    assert record.asset_materialization is not None
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


def commit_totals(pg_url: str, commit_id: str) -> tuple[int, int, int]:
    """(written, skipped, rejected) of the ``commits`` row."""
    with connect(pg_url) as conn:
        row = conn.execute(
            "SELECT rows_written, rows_skipped, rows_rejected FROM idem.commits WHERE commit_id = %s", [commit_id]
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


BATCH_FIGURES = {  # (rows written, rejects, rows skipped) of each file of the batch
    "a.ndjson": (4, 0, 0),
    "b.ndjson": (3, 1, 0),
    "c.ndjson": (2, 2, 1),  # its last line repeats one of a.ndjson's
    "d.ndjson": (1, 1, 2),  # 3 blank lines (no records), a repeated line, a key committed before
}


def drop_batch(directory: Path) -> list[Path]:
    """The batch of :data:`BATCH_FIGURES` (``y-0`` is committed before it)."""
    good = [f'{{"type":"malware","id":"x-{i}","name":"m{i}"}}' for i in range(10)]
    committed_before = '{"type":"malware","id":"y-0","name":"early"}'
    return [
        write_lines(directory / "a.ndjson", good[:4]),
        write_lines(directory / "b.ndjson", [*good[4:7], "not json"]),
        write_lines(directory / "c.ndjson", [*good[7:9], "{", "[1]", good[0]]),
        write_lines(directory / "d.ndjson", ["", good[9], "   ", good[9], committed_before, "oops", "\t"]),
    ]


def test_a_batch_run_gives_each_file_s_partition_its_own_figures_and_check_evaluations(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    """Issue 35: a file's partition shows what PostgreSQL holds for that file, not the batch's
    totals, its figures add up to the batch's, and each partition has its own
    commit_consistency and reject_ratio evaluation."""
    config = config_with(tmp_path, pg_url, max_reject_ratio=1.0)
    directory = config.connector("threatfeed").path
    assert directory is not None
    ticker = SensorTicker(config, instance, pg_url, SENSOR)
    write_lines(directory / "0.ndjson", ['{"type":"malware","id":"y-0","name":"early"}'])
    (early,) = settle(ticker).run_requests
    assert launch(ticker, early).success
    paths = drop_batch(directory)
    (request,) = settle(ticker).run_requests
    assert request.tags[FILES_TAG] == "4"
    run = launch(ticker, request)
    assert run.success
    figures = {path.name: partition_metadata(instance, path.name) for path in paths}
    for path in paths:
        metadata = figures[path.name]
        rows, rejects = file_held(pg_url, path)
        assert (rows, rejects, metadata["rows_skipped"]) == BATCH_FIGURES[path.name]
        assert metadata["rows_written"] == metadata["written/malware"] == rows
        assert metadata["rows_rejected"] == rejects
        sample = metadata["rejects"].records if rejects else []  # the file's own rejects, one row per reason
        assert ("rejects" in metadata) == bool(rejects) and len({r.data["position"] for r in sample}) == rejects
        assert [f["file"] for f in metadata["files"]] == [path.name]
        assert (metadata["batch_rows_written"], metadata["batch_rows_rejected"], metadata["batch_files"]) == (10, 4, 4)
    # The files' figures add up to the batch's, as the commit recorded it.
    commit_id = figures["a.ndjson"]["commit_id"]
    totals = commit_totals(pg_url, commit_id)
    assert totals == (10, 3, 4)
    for index, name in enumerate(("rows_written", "rows_skipped", "rows_rejected")):
        assert sum(f[name] for f in figures.values()) == figures["a.ndjson"][f"batch_{name}"] == totals[index]
    with connect(pg_url) as conn:  # each ledger row keeps its own file's counts
        results = dict(conn.execute("SELECT key, result FROM idem.ingest_ledger WHERE namespace = 'threatfeed'").fetchall())
    for path in paths:
        (own,) = results[hash_file(path).key]["files"]
        written, rejected, skipped = BATCH_FIGURES[path.name]
        assert (own["rows_written"], own["rows_skipped"], own["rows_rejected"]) == (written, skipped, rejected)
    evaluations = {(e.check_name, e.partition): e.passed for e in run.get_asset_check_evaluations()}
    assert evaluations == {
        **{("commit_consistency", p.name): True for p in paths},
        ("reject_ratio", "a.ndjson"): True, ("reject_ratio", "b.ndjson"): False,
        ("reject_ratio", "c.ndjson"): False, ("reject_ratio", "d.ndjson"): False,
        ("pandera_contract", None): True,
    }
    assert_seen_through_graphql(instance, tmp_path, config, pg_url, paths)


MATERIALIZATIONS = """
query Materializations($key: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $key) { ... on Asset { assetMaterializations(partitions: $partitions) {
    partition metadataEntries { label ... on IntMetadataEntry { intValue } } } } }
  assetNodeOrError(assetKey: $key) { ... on AssetNode { partitionStats { numMaterialized } } }
}
"""
CHECK_EXECUTIONS = """
query Checks($key: AssetKeyInput!, $check: String!, $partition: String) {
  assetCheckExecutions(assetKey: $key, checkName: $check, partition: $partition, limit: 10) {
    partition status evaluation { success partition } }
}
"""


def assert_seen_through_graphql(
    instance: dg.DagsterInstance, tmp_path: Path, config: IdemConfig, pg_url: str, paths: list[Path]
) -> None:
    """What the UI shows (a real webserver's GraphQL API on the same instance, the test's
    Definitions as its code location): each file's partition has its own figures, equal to
    what PostgreSQL holds for the file, and its own evaluation of each check."""
    assert config.source is not None
    key = {"path": COMMITTED.path}
    with webserver(Path(instance.root_directory), tmp_path, config.source, pg_url) as api:
        data = api.query(MATERIALIZATIONS, {"key": key, "partitions": [p.name for p in paths]})
        assert data["assetNodeOrError"]["partitionStats"]["numMaterialized"] == 5  # 0.ndjson and the batch's 4
        shown = {
            event["partition"]: {e["label"]: e.get("intValue") for e in event["metadataEntries"]}
            for event in data["assetOrError"]["assetMaterializations"]
        }
        for path in paths:
            rows, rejects = file_held(pg_url, path)
            figures = shown[path.name]
            assert (figures["rows_written"], figures["rows_rejected"]) == (rows, rejects)
            assert "dagster/row_count" not in figures and figures["rows_skipped"] == BATCH_FIGURES[path.name][2]
        for check in ("commit_consistency", "reject_ratio"):
            for path in paths:
                (execution,) = api.query(
                    CHECK_EXECUTIONS, {"key": key, "check": check, "partition": path.name}
                )["assetCheckExecutions"]
                passed = check == "commit_consistency" or path.name == "a.ndjson"
                assert execution["partition"] == execution["evaluation"]["partition"] == path.name
                assert execution["evaluation"]["success"] is passed
                assert execution["status"] == ("SUCCEEDED" if passed else "FAILED")
            unpartitioned = api.query(CHECK_EXECUTIONS, {"key": key, "check": check, "partition": ""})
            assert unpartitioned["assetCheckExecutions"] == []  # no evaluation without its partition


def test_batches_are_bounded_by_count_and_bytes(tmp_path: Path, pg_url: str, instance: dg.DagsterInstance) -> None:
    config = config_with(tmp_path, pg_url, max_files_per_run=2, max_bytes_per_run=2000)
    for name in ("a", "b", "d", "e", "f"):
        drop(config, f"{name}.ndjson", 2)
    big = drop(config, "c.ndjson", 60)  # over 2000 bytes: alone
    assert big.stat().st_size > 2000
    requests = settle(SensorTicker(config, instance, pg_url, SENSOR)).run_requests
    shapes = [
        r.run_config["ops"]["threatfeed__ingest"]["config"]["files"] for r in requests
    ]
    assert [[Path(f).name for f in files] for files in shapes] == [
        ["a.ndjson", "b.ndjson"], ["c.ndjson"], ["d.ndjson", "e.ndjson"], ["f.ndjson"]
    ]
    ranges = [(r.partition_key, r.tags.get(RANGE_START_TAG), r.tags.get(RANGE_END_TAG)) for r in requests]
    assert ranges == [
        (None, "a.ndjson", "b.ndjson"), ("c.ndjson", None, None), (None, "d.ndjson", "e.ndjson"), ("f.ndjson", None, None)
    ]
    assert len({r.run_key for r in requests}) == 4


def test_a_failed_batch_is_retried_one_file_per_run_and_a_poison_file_fails_alone(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    config = config_with(tmp_path, pg_url, max_reject_ratio=0.5)
    good = [drop(config, "a.ndjson", 2), drop(config, "c.ndjson", 2)]
    directory = config.connector("threatfeed").path
    assert directory is not None
    poison = write_lines(directory / "b.ndjson", [f"not json {i}" for i in range(10)])
    ticker = SensorTicker(config, instance, pg_url, SENSOR)
    (batch,) = settle(ticker).run_requests
    assert batch.tags[FILES_TAG] == "3"
    assert not launch(ticker, batch).success  # 10 of 14 lines rejected: over max_reject_ratio, nothing committed
    rows = ledger_rows(pg_url)
    assert {status for status, _, _ in rows.values()} == {"failed"} and len(rows) == 3
    assert malware_rows(pg_url) == (0, 0)

    retries = ticker.tick().run_requests  # each file alone now, at its next attempt
    assert sorted(r.partition_key or "" for r in retries) == ["a.ndjson", "b.ndjson", "c.ndjson"]
    assert all(r.run_key and r.run_key.endswith("#2") and RANGE_START_TAG not in r.tags for r in retries)
    outcomes = {r.partition_key: launch(ticker, r).success for r in retries}
    assert outcomes == {"a.ndjson": True, "b.ndjson": False, "c.ndjson": True}
    assert malware_rows(pg_url) == (4, 4)
    rows = ledger_rows(pg_url)
    assert {key: status for key, (status, _, _) in rows.items()} == {
        hash_file(good[0]).key: "committed", hash_file(good[1]).key: "committed", hash_file(poison).key: "failed"
    }
    assert materialized(instance) == {"a.ndjson", "c.ndjson"}
    held = ticker.tick()
    assert held.run_requests == []  # the poison file failed on its own: a permanent failure, held
    assert "b.ndjson: failed permanently" in skip_message(held)


def test_a_batch_run_that_ends_before_its_commit_retries_its_files_one_per_run(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    config = config_with(tmp_path, pg_url)
    first, vanishing, last = (drop(config, f"{n}.ndjson", 2) for n in ("a", "b", "c"))
    ticker = SensorTicker(config, instance, pg_url, SENSOR)
    (batch,) = settle(ticker).run_requests
    vanishing.unlink()  # gone before the run reads it: the run fails before its commit claims anything
    assert not launch(ticker, batch).success
    assert ledger_rows(pg_url) == {}  # the ledger never heard of the batch
    retries = ticker.tick().run_requests
    assert [(r.partition_key, r.run_key) for r in retries] == [
        ("a.ndjson", f"a.ndjson@{hash_file(first).sha256[:16]}#1.1"),
        ("c.ndjson", f"c.ndjson@{hash_file(last).sha256[:16]}#1.1"),
    ]
    assert all(launch(ticker, r).success for r in retries)
    assert malware_rows(pg_url) == (4, 4)
    assert ticker.tick().run_requests == []


def test_a_queued_batch_gets_no_other_request_and_a_new_file_its_own_run(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance
) -> None:
    config = config_with(tmp_path, pg_url)
    drop(config, "a.ndjson", 1)
    drop(config, "b.ndjson", 1)
    ticker = SensorTicker(config, instance, pg_url, SENSOR)
    (batch,) = settle(ticker).run_requests
    instance.create_run_for_job(
        ticker.defs.resolve_job_def(JOB),
        run_config=batch.run_config,
        tags={**batch.tags, RUN_KEY_TAG: batch.run_key or ""},
        status=dg.DagsterRunStatus.STARTED,  # the daemon launched it; it has not claimed the files yet
    )
    queued = ticker.tick()
    assert queued.run_requests == [] and f"its run {batch.run_key} is queued or running" in skip_message(queued)
    late = drop(config, "c.ndjson", 1)  # dropped while the batch waits: not added to it
    ticker.tick()
    (request,) = ticker.tick().run_requests
    assert request.partition_key == "c.ndjson"
    assert request.run_key == f"c.ndjson@{hash_file(late).sha256[:16]}#1"


def test_one_partition_from_the_ui_and_a_backfill_range_without_config_and_a_commit_of_a_batch_partition(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    """What the UI launches: "Materialize" on one file's partition (no run config), a
    single-run backfill of a range (no run config), and "Materialize" of ``committed``
    alone for a file that was committed in a batch (it loads the batch's plan: a replay)."""
    config = config_with(tmp_path, pg_url)
    for name in ("a", "b", "c"):
        drop(config, f"{name}.ndjson", 2)
    defs = SensorTicker(config, instance, pg_url, SENSOR).defs
    job = defs.resolve_job_def(JOB)
    instance.add_dynamic_partitions("threatfeed_files", ["a.ndjson", "b.ndjson", "c.ndjson"])
    assert job.execute_in_process(instance=instance, partition_key="a.ndjson", raise_on_error=False).success
    assert malware_rows(pg_url) == (2, 2)
    backfill = job.execute_in_process(
        instance=instance, tags={RANGE_START_TAG: "b.ndjson", RANGE_END_TAG: "c.ndjson"}, raise_on_error=False
    )
    assert backfill.success
    assert malware_rows(pg_url) == (6, 6) and materialized(instance) == {"a.ndjson", "b.ndjson", "c.ndjson"}
    statuses = ledger_rows(pg_url)
    assert len(statuses) == 3 and len({owner for _, owner, _ in statuses.values()}) == 2  # a alone, b and c together
    alone = job.execute_in_process(
        instance=instance, partition_key="c.ndjson", asset_selection=[COMMITTED], raise_on_error=False
    )
    assert alone.success
    (event,) = alone.asset_materializations_for_node("threatfeed__committed")
    assert event.metadata["replayed"].value is True and event.metadata["rows_written"].value == 0
    assert malware_rows(pg_url) == (6, 6)


def wanted(name: str, size: int = 10, attempt: int = 1) -> Wanted:
    return Wanted(name, "ab" * 32, name, Path(name), size, attempt)


def test_batches_group_only_consecutive_partitions_within_the_bounds() -> None:
    position = {p: i for i, p in enumerate(["old", "a", "busy", "b", "c", "d", "e"])}
    files = [wanted("e"), wanted("a"), wanted("b"), wanted("c", size=500), wanted("d")]
    groups = batches(files, position, max_files=10, max_bytes=1000)
    assert [[f.relative for f in g] for g in groups] == [["a"], ["b", "c", "d", "e"]]  # "busy" needs no run
    groups = batches(files, position, max_files=2, max_bytes=1000)
    assert [[f.relative for f in g] for g in groups] == [["a"], ["b", "c"], ["d", "e"]]
    groups = batches(files, position, max_files=10, max_bytes=400)
    assert [[f.relative for f in g] for g in groups] == [["a"], ["b"], ["c"], ["d", "e"]]  # c alone: over the bytes


@pytest.mark.parametrize(
    ("attempts", "retryable", "shared", "expected"),
    [
        (1, False, True, 2),  # a batch's permanent failure may be another file's: once more, alone
        (1, False, False, None),  # its own permanent failure: held
        (3, False, True, None),  # no attempts left
        (1, True, True, 2),  # retryable: retried (alone, as every later attempt)
    ],
)
def test_decide_retries_a_batch_s_permanent_failure_alone(
    attempts: int, retryable: bool, shared: bool, expected: int | None
) -> None:
    entry = LedgerEntry("k", "failed", attempts, "run/c", None, {"message": "m", "retryable": retryable}, "h")
    assert decide("f", "ab" * 32, entry, False, 3, shared=shared).attempt == expected
