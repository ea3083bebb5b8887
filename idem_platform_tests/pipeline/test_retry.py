"""The quarantine loop (`idem rejects retry`) on real PostgreSQL and Spark.

Rejects go back through the current catalog, and those that pass are committed
once, through the same write path as an ingest: with the keys a clean ingest gives
the same lines, the rejects marked retried in the same transaction, those that still
fail left quarantined with their new reasons, nothing written by a second retry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from idem_platform.coercion.records import RAW_CAP
from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.pipeline.retry import human_retry_summary, retry_rejects
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.sources.rejects.listing import list_rejects
from idem_platform_tests.helpers.config import example_text, write_config
from idem_platform_tests.helpers.database import reset_database

TABLES = ("indicator", "malware", "threat-actor", "campaign")


def catalog(*, name_required: bool = True, campaign: bool = False) -> str:
    """The example's file drop (``helpers.config.example_text``) on ``local[2]``, with ``name``
    required or not, and with or without a ``campaign`` table."""
    data = yaml.safe_load(example_text())
    data["spark"] = {"master": "local[2]"}
    for table in data["tables"].values():
        table["columns"]["name"] = {"type": "string", "required": name_required}
    if campaign:
        data["tables"]["campaign"] = {"columns": {"name": "string", "budget": "long"}}
    return yaml.safe_dump(data, sort_keys=False)


# The catalog the bad lines fail: `name` required, no `campaign` table.
STRICT = catalog()
# The fix: `name` no longer required, and a `campaign` table for records of that type.
FIXED = catalog(name_required=False, campaign=True)
# Only `name` made optional: campaigns still have no table.
NAME_ONLY = catalog(name_required=False)

LINES = [
    '{"type":"indicator","id":"ioc-1","name":"good.example","confidence":80}',
    '{"type":"indicator","id":"ioc-2","confidence":70}',  # 2: no name (fixable)
    '{"type":"malware","sample_size":12}',  # 3: no name, no id: keyed by its position
    '{"type":"campaign","id":"c-1","name":"spring","budget":5}',  # 4: no such type (fixable)
    '{"type":"indicator","id":"ioc-3","name":"x","confidence":3000000000}',  # 5: out of int32 (not fixable)
    "not json",  # 6: never fixable
    '{"type":"threat-actor","name":"apt","sophistication":2}',  # 7: good, keyed by position
]


def rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(url) as conn:
        return conn.execute(query, list(params)).fetchall()


def use(directory: Path, url: str, text: str) -> IdemConfig:
    """Write ``text`` as the idem.yaml in ``directory`` and sync its tables (what a fixed idem.yaml is)."""
    config = write_config(directory, text)
    with connect(url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    return config


def ingest(url: str, config: IdemConfig, spark: Any, *paths: Path) -> dict[str, Any]:
    connector = config.connector("threatfeed")
    batch = pipeline.plan_batch(url, connector, list(paths))
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(url, config, connector))
    return run.commit_batch(run.CommitRequest(url=url, connector=connector, run_id="test"), coerced, lambda: spark)


def retry(url: str, config: IdemConfig, spark: Any, name: str = "threatfeed", **options: Any) -> dict[str, Any]:
    return retry_rejects(url, config, config.connector(name), lambda: spark, **options)


def keyed_rows(url: str) -> dict[str, tuple[Any, ...]]:
    """``{_source: (key, external id, content hash, name, commit)}`` of every row of every table."""
    found: dict[str, tuple[Any, ...]] = {}
    for table in TABLES:
        exists = rows(url, "SELECT to_regclass(%s)", f'idem.{table_name(table)}')[0][0]
        if exists is None:
            continue
        for source, *values in rows(
            url, f'SELECT _source, _idempotency_key, _external_id, _content_hash, name, _commit_id::text FROM idem.{table_name(table)}'
        ):
            found[source] = tuple(values)
    return found


def counts(url: str) -> tuple[int, int, int]:
    """Commits, rows in every table, rejects."""
    total = sum(
        rows(url, f'SELECT count(*) FROM idem.{table_name(t)}')[0][0]
        for t in TABLES
        if rows(url, "SELECT to_regclass(%s)", f'idem.{table_name(t)}')[0][0] is not None
    )
    return rows(url, "SELECT count(*) FROM idem.commits")[0][0], total, rows(url, "SELECT count(*) FROM idem.rejects")[0][0]


@pytest.fixture
def strict(tmp_path: Path, pg_url: str) -> IdemConfig:
    reset_database(pg_url)
    return use(tmp_path, pg_url, STRICT)


def drop_path(config: IdemConfig, name: str) -> Path:
    directory = config.connector("threatfeed").path
    assert directory is not None
    return directory / name


def test_retried_rejects_get_the_keys_a_clean_ingest_gives(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any
) -> None:
    path = write_lines(drop_path(strict, "feed.ndjson"), LINES)
    first = ingest(pg_url, strict, spark, path)
    assert (first["rows_written"], first["rows_rejected"]) == (2, 5)
    fixed = use(tmp_path, pg_url, FIXED)

    summary = retry(pg_url, fixed, spark)
    retry_commit = summary["commit_id"]
    assert retry_commit and summary["replayed"] is False
    assert summary["retry"]["selected"] == 5
    assert (summary["retry"]["passed"], summary["retry"]["still_failing"]) == (3, 2)
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (3, 0, 2)
    assert summary["tables"]["campaign"]["written"] == 1
    after_retry = keyed_rows(pg_url)
    assert len(after_retry) == 5

    # The same file ingested clean, with the fixed catalog from the start.
    reset_database(pg_url)
    use(tmp_path, pg_url, FIXED)
    clean = ingest(pg_url, fixed, spark, path)
    assert (clean["rows_written"], clean["rows_rejected"]) == (5, 2)
    clean_rows = keyed_rows(pg_url)
    assert set(clean_rows) == set(after_retry)
    for source, (key, ext_id, content_hash, name, _commit) in clean_rows.items():
        assert after_retry[source][:4] == (key, ext_id, content_hash, name), source
    # The record without an id kept its original position in its key.
    position_keyed = [v for s, v in after_retry.items() if s.endswith("#L3")]
    assert position_keyed[0][0].startswith("threatfeed:malware:") and "#L3:" in position_keyed[0][0]
    assert {v[4] for s, v in after_retry.items() if s[-3:] in ("#L2", "#L3", "#L4")} == {retry_commit}


def test_retry_marks_rejects_and_commits_through_the_write_path(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any
) -> None:
    path = write_lines(drop_path(strict, "feed.ndjson"), LINES)
    first = ingest(pg_url, strict, spark, path)
    fixed = use(tmp_path, pg_url, FIXED)
    summary = retry(pg_url, fixed, spark, run_id="retry-run")
    commit_id = summary["commit_id"]

    marked = rows(
        pg_url,
        "SELECT line, retried_commit_id::text, retried_at IS NOT NULL, retries, last_retry_commit_id::text, "
        "last_retry_reasons, commit_id::text FROM idem.rejects ORDER BY line",
    )
    assert [m[0] for m in marked] == [2, 3, 4, 5, 6]  # never deleted
    assert all(m[6] == first["commit_id"] for m in marked)
    passed = {m[0]: m for m in marked if m[1] is not None}
    assert set(passed) == {2, 3, 4} and all(m[1] == commit_id and m[2] and m[3] == 1 for m in passed.values())
    failing = {m[0]: m for m in marked if m[1] is None}
    assert set(failing) == {5, 6}
    assert all(m[3] == 1 and m[4] == commit_id for m in failing.values())
    assert failing[5][5][0]["rule"] == "range" and failing[6][5][0]["rule"] == "json"

    # One commit like any other: commits row, execution log, ledger, no staging left.
    (row,) = rows(
        pg_url, "SELECT run_id, connector, rows_written, rows_skipped, rows_rejected, replay, sources FROM idem.commits "
        "WHERE commit_id = %s", commit_id,
    )
    assert row[:6] == ("retry-run", "threatfeed", 3, 0, 2, False)
    assert {s["retry_of"] for s in row[6]} == {first["commit_id"]} and row[6][0]["source"] == first["files"][0]["key"]
    log = dict(rows(pg_url, "SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s", commit_id))
    assert log == {"written": 3, "rejected": 2}
    ledger = rows(pg_url, "SELECT key, status FROM idem.ingest_ledger WHERE key LIKE 'rejects:%%'")
    assert len(ledger) == 1 and ledger[0][1] == "committed"
    assert rows(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'") == [(0,)]

    # `idem rejects --commit <retry>` lists what the retry left quarantined, with the new reasons.
    with connect(pg_url) as conn:
        left = list_rejects(conn, commit_id=commit_id)
    assert sorted(r["line"] for r in left) == [5, 6]
    assert all(r["last_retry_reasons"] and r["retried_commit_id"] is None for r in left)
    text = human_retry_summary(summary)
    assert f"committed {commit_id}" in text and "3 now pass" in text and "2 still fail" in text


def test_a_second_retry_writes_nothing_and_says_so(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any
) -> None:
    path = write_lines(drop_path(strict, "feed.ndjson"), LINES[:4])  # every reject fixable
    ingest(pg_url, strict, spark, path)
    fixed = use(tmp_path, pg_url, FIXED)
    first = retry(pg_url, fixed, spark)
    assert (first["retry"]["passed"], first["retry"]["still_failing"]) == (3, 0)
    before = counts(pg_url)

    again = retry(pg_url, fixed, spark)
    assert again["commit_id"] is None and again["nothing_to_retry"] is True
    assert (again["rows_written"], again["rows_skipped"], again["rows_rejected"]) == (0, 0, 0)
    assert again["retry"]["selected"] == 0 and again["retry"]["already_retried"] == 3
    assert "no quarantined rejects" in again["retry"]["message"]
    assert counts(pg_url) == before
    assert "nothing retried" in human_retry_summary(again)


def test_a_partial_fix_commits_only_the_fixed_rows(pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any) -> None:
    path = write_lines(drop_path(strict, "feed.ndjson"), LINES)
    ingest(pg_url, strict, spark, path)
    name_only = use(tmp_path, pg_url, NAME_ONLY)
    partial = retry(pg_url, name_only, spark)
    assert (partial["retry"]["passed"], partial["retry"]["still_failing"]) == (2, 3)
    failing = dict(rows(pg_url, "SELECT line, last_retry_reasons FROM idem.rejects WHERE retried_commit_id IS NULL"))
    assert sorted(failing) == [4, 5, 6]
    assert failing[4][0]["rule"] == "record_type"  # the reasons they fail for now

    # Nothing changed: the same rejects against the same catalog are not tried again.
    before = counts(pg_url)
    same = retry(pg_url, name_only, spark)
    assert same["nothing_to_retry"] is True and same["commit_id"] is None
    assert same["retry"]["unchanged"] == 3 and same["retry"]["tried_by"] == [partial["commit_id"]]
    assert counts(pg_url) == before

    # The rest of the fix: the campaign commits now, the two others still fail. `--commit`
    # with a retry's commit retries what that retry left quarantined.
    fixed = use(tmp_path, pg_url, FIXED)
    rest = retry(pg_url, fixed, spark, commit_id=partial["commit_id"])
    assert (rest["retry"]["selected"], rest["retry"]["passed"], rest["retry"]["still_failing"]) == (3, 1, 2)
    assert rest["retry"]["already_retried"] == 2 and rest["retry"]["unchanged"] == 0  # by the partial retry
    retries = dict(rows(pg_url, "SELECT line, retries FROM idem.rejects"))
    assert retries == {2: 1, 3: 1, 4: 2, 5: 2, 6: 2}


def test_commit_filter_retries_one_commits_rejects(pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any) -> None:
    a = ingest(pg_url, strict, spark, write_lines(drop_path(strict, "a.ndjson"), [LINES[1]]))
    b = ingest(pg_url, strict, spark, write_lines(drop_path(strict, "b.ndjson"), [LINES[2], LINES[3]]))
    fixed = use(tmp_path, pg_url, FIXED)
    only_b = retry(pg_url, fixed, spark, commit_id=b["commit_id"])
    assert only_b["retry"]["selected"] == 2 and only_b["rows_written"] == 2
    pending = rows(pg_url, "SELECT commit_id::text FROM idem.rejects WHERE retried_commit_id IS NULL")
    assert pending == [(a["commit_id"],)]
    rest = retry(pg_url, fixed, spark)
    assert rest["retry"]["selected"] == 1 and rest["rows_written"] == 1 and rest["retry"]["already_retried"] == 2


def test_dry_run_counts_in_spark_and_writes_nothing(pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any) -> None:
    path = write_lines(drop_path(strict, "feed.ndjson"), LINES)
    ingest(pg_url, strict, spark, path)
    before = counts(pg_url)
    ledger = rows(pg_url, "SELECT count(*) FROM idem.ingest_ledger")
    fixed = write_config(tmp_path, FIXED)  # not even synced: a dry run runs no DDL either
    dry = retry(pg_url, fixed, spark, dry_run=True)
    assert dry["retry"]["dry_run"] is True and dry["commit_id"] is None
    assert (dry["retry"]["selected"], dry["retry"]["would_pass"], dry["retry"]["would_fail"]) == (5, 3, 2)
    assert counts(pg_url) == before and rows(pg_url, "SELECT count(*) FROM idem.ingest_ledger") == ledger
    assert rows(pg_url, "SELECT to_regclass('idem.campaign')") == [(None,)]
    assert rows(pg_url, "SELECT count(*) FROM idem.rejects WHERE retries > 0") == [(0,)]
    assert "would pass" in human_retry_summary(dry)


def test_truncated_rejects_are_reported_and_left(pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any) -> None:
    long_line = json.dumps({"type": "indicator", "id": "long", "tags": {"blob": "x" * (RAW_CAP + 100)}})
    path = write_lines(drop_path(strict, "feed.ndjson"), [LINES[1], long_line])
    ingest(pg_url, strict, spark, path)
    (stored,) = rows(pg_url, "SELECT raw_length, octet_length(raw), position FROM idem.rejects WHERE line = 2")
    assert stored[0] > stored[1] == RAW_CAP
    fixed = use(tmp_path, pg_url, FIXED)
    summary = retry(pg_url, fixed, spark)
    assert summary["retry"]["selected"] == 1 and summary["rows_written"] == 1
    assert summary["retry"]["not_retryable"] == {"truncated": {"count": 1, "positions": [stored[2]]}}
    assert rows(pg_url, "SELECT retried_commit_id, retries FROM idem.rejects WHERE line = 2") == [(None, 0)]
    assert "1 cannot be retried (raw text cut" in human_retry_summary(summary)
    # Only the truncated one is left: nothing to retry, still reported.
    again = retry(pg_url, fixed, spark)
    assert again["nothing_to_retry"] is True and again["retry"]["not_retryable"]["truncated"]["count"] == 1


def bad_feed(count: int, bad_every: int = 20) -> tuple[list[str], int]:
    """``count`` threat-feed lines, every ``bad_every``-th bad: half of them miss their required
    name, half are of a record type the catalog does not have yet. Returns the lines and how many are bad."""
    lines = []
    bad = 0
    for index, line in enumerate(threatfeed_lines(count, seed=11, duplicate_ratio=0.0)):
        if index % bad_every == 0:
            record = json.loads(line)
            if (index // bad_every) % 2:
                del record["name"]
            else:
                record["type"] = "campaign"
            line = json.dumps(record)
            bad += 1
        lines.append(line)
    return lines, bad


def test_acceptance_5_percent_bad_rows_commit_once_after_the_fix(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any
) -> None:
    lines, bad = bad_feed(2000)
    assert bad == 100
    path = write_lines(drop_path(strict, "feed.ndjson"), lines)
    first = ingest(pg_url, strict, spark, path)
    assert (first["rows_written"], first["rows_skipped"], first["rows_rejected"]) == (1900, 0, 100)

    fixed = use(tmp_path, pg_url, FIXED)
    summary = retry(pg_url, fixed, spark)
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (100, 0, 0)
    assert summary["retry"]["passed"] == 100 and summary["tables"]["campaign"]["written"] == 50
    assert counts(pg_url)[1] == 2000
    before = counts(pg_url)

    again = retry(pg_url, fixed, spark)
    assert again["nothing_to_retry"] is True and again["rows_written"] == 0
    assert counts(pg_url) == before
    assert rows(pg_url, "SELECT count(*) FROM idem.rejects WHERE retried_commit_id IS NULL") == [(0,)]


def test_two_retries_of_the_same_rejects_commit_them_once(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any
) -> None:
    """A retry that planned rejects another retry then took commits nothing (compare-and-set)."""
    path = write_lines(drop_path(strict, "feed.ndjson"), LINES[:4])
    ingest(pg_url, strict, spark, path)
    fixed = use(tmp_path, pg_url, FIXED)
    from idem_platform.sources.rejects import plan_retry

    connector = fixed.connector("threatfeed").model_copy(update={"max_reject_ratio": 1.0})
    tables = pipeline.current_tables(pg_url, fixed, connector)
    stale = plan_retry(pg_url, connector, pipeline.record_spec(connector, tables, ()), commit_id=None)
    # Another retry, with another selection (one commit's: another ledger key), commits first.
    first = retry(pg_url, fixed, spark, commit_id=rows(pg_url, "SELECT commit_id::text FROM idem.commits")[0][0])
    assert first["retry"]["passed"] == 3
    before = counts(pg_url)
    coerced = pipeline.CoercedBatch(stale.batch, connector, tables)
    other = run.commit_batch(run.CommitRequest(url=pg_url, connector=connector, run_id="late"), coerced, lambda: spark)
    assert other["commit_id"] is None and "retried by another run" in other["already_committed"]
    assert counts(pg_url) == before


@pytest.mark.kafka
def test_a_kafka_reject_is_retried_with_its_offset_key(
    pg_url: str, tmp_path: Path, kafka_broker: Any, topic: str, spark: Any
) -> None:
    from idem_platform_tests.helpers.kafka import expected_keys, kafka_config
    from idem_platform_tests.helpers.kafka_broker import create_topic, produce, spread

    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 1)
    values = [
        '{"type":"indicator","id":"k-1","name":"ok"}',
        '{"type":"indicator","id":"k-2","confidence":5}',  # no name
        '{"type":"malware","sample_size":3}',  # no name, no id: keyed by <topic>-0@2
    ]
    messages = spread(values, 1)
    produce(kafka_broker.bootstrap, topic, messages)
    strict = kafka_config(tmp_path, kafka_broker.bootstrap, [topic], pg_url=pg_url)
    connector = strict.connector("events")
    pipeline.prepare_tables(pg_url, strict, connector)
    batch = pipeline.plan_batch(pg_url, connector)
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, strict, connector))
    first = run.commit_batch(run.CommitRequest(url=pg_url, connector=connector, run_id="test"), coerced, lambda: spark)
    assert (first["rows_written"], first["rows_rejected"]) == (1, 2)
    (context,) = rows(pg_url, "SELECT context FROM idem.rejects WHERE line = 2")[0]
    assert context["offset"] == 2 and context["key"] == "k2"

    fixed_text = (tmp_path / "idem.yaml").read_text().replace("{type: string, required: true}", "string")
    fixed = write_config(tmp_path, fixed_text)
    summary = retry(pg_url, fixed, spark, name="events")
    assert (summary["rows_written"], summary["rows_rejected"]) == (2, 0)
    stored = {
        key: (source, meta)
        for table in ("indicator", "malware")
        for key, source, meta in rows(pg_url, f'SELECT _idempotency_key, _source, _kafka FROM idem.{table_name(table)}')
    }
    assert set(stored) == expected_keys(fixed, messages, topic)  # what a clean ingest of the topic gives
    by_source = {source: meta for source, meta in stored.values()}
    assert by_source[f"{topic}-0@2"]["key"] == "k2"  # the message's metadata, as on a first ingest
    assert f"events:malware:{topic}-0@2:" in " ".join(stored)


def test_cli_retry_dry_run_then_retry_then_nothing(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idem_platform.cli import main
    from idem_platform.cli.common import SUMMARY_KEYS

    config = strict
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("IDEM_CONFIG", str(config.source))
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[2]")

    def cli(*argv: str) -> tuple[int, list[str], str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, [line for line in out.splitlines() if line.strip()], err

    path = write_lines(drop_path(config, "feed.ndjson"), LINES)
    code, lines, err = cli("ingest", str(path))
    assert code == 0, err
    ingested = json.loads(lines[0])
    assert ingested["rows_rejected"] == 5

    code, _, err = cli("rejects", "--dry-run")
    assert code == 1 and "--dry-run goes with idem rejects retry" in err
    use(tmp_path, pg_url, FIXED)

    code, lines, err = cli("rejects", "retry", "--dry-run")
    assert code == 0, err
    (dry,) = [json.loads(line) for line in lines]
    assert (dry["retry"]["would_pass"], dry["retry"]["would_fail"], dry["commit_id"]) == (3, 2, None)

    code, lines, err = cli("rejects", "retry", "--commit", ingested["commit_id"])
    assert code == 0, err
    (summary,) = [json.loads(line) for line in lines]
    assert list(summary)[: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert (summary["rows_written"], summary["rows_rejected"], summary["retry"]["passed"]) == (3, 2, 3)
    assert summary["retry"]["commit"] == ingested["commit_id"]
    import dagster as dg

    runs = dg.DagsterInstance.get().get_run_records(dg.RunsFilter(job_name=f"{config.connectors[0].identifier}_retry_rejects"))
    origins = {r.dagster_run.job_code_origin.job_name for r in runs if r.dagster_run.job_code_origin is not None}
    assert len(runs) == 2 and origins == {f"{config.connectors[0].identifier}_retry_rejects"}  # dry run and this one

    code, lines, err = cli("rejects", "retry", "--json")
    assert code == 0, err
    again = json.loads(lines[0])
    assert again["nothing_to_retry"] is True and again["commit_id"] is None and again["retry"]["unchanged"] == 2

    # The listing still lists (and says what the retries did).
    code, lines, _ = cli("rejects", "--commit", ingested["commit_id"])
    listed = {r["line"]: r for r in map(json.loads, lines)}
    assert code == 0 and sorted(listed) == [2, 3, 4, 5, 6]
    assert listed[2]["retried_commit_id"] == summary["commit_id"] and listed[5]["retried_commit_id"] is None
    code, lines, _ = cli("rejects", "retry", "--commit", "nope")
    assert code == 1


def test_dagster_job_retries_from_run_config(pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any) -> None:
    import dagster as dg

    from idem_platform.defs.definitions import build_definitions

    path = write_lines(drop_path(strict, "feed.ndjson"), LINES)
    first = ingest(pg_url, strict, spark, path)
    fixed = use(tmp_path, pg_url, FIXED)
    defs = build_definitions(fixed, postgres_url=pg_url)
    job = defs.resolve_job_def("threatfeed_retry_rejects")
    with dg.instance_for_test() as instance:
        dry = job.execute_in_process(
            instance=instance, run_config={"ops": {"threatfeed__retry_rejects": {"config": {"dry_run": True}}}}
        )
        assert dry.output_for_node("threatfeed__retry_rejects")["retry"]["would_pass"] == 3
        result = job.execute_in_process(
            instance=instance,
            run_config={"ops": {"threatfeed__retry_rejects": {"config": {"commit_id": first["commit_id"]}}}},
        )
        assert result.success
        summary = result.output_for_node("threatfeed__retry_rejects")
        assert summary["rows_written"] == 3 and summary["retry"]["still_failing"] == 2
        (event,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        metadata = {k: v.value for k, v in event.step_output_data.metadata.items()}
        assert metadata["retry/passed"] == 3 and metadata["commit_id"] == summary["commit_id"]
        (run_id,) = rows(pg_url, "SELECT run_id FROM idem.commits WHERE commit_id = %s", summary["commit_id"])[0]
        assert run_id == result.run_id


def test_slices_span_units_and_split_runs(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idem_platform.sources.rejects import plan as retry_plan

    a = write_lines(drop_path(strict, "a.ndjson"), [LINES[1], LINES[2], LINES[3]])
    b = write_lines(drop_path(strict, "b.ndjson"), [LINES[2], LINES[3], LINES[1].replace("ioc-2", "ioc-9")])
    ingest(pg_url, strict, spark, a, b)  # one commit, two sources: six rejects
    fixed = use(tmp_path, pg_url, FIXED)
    monkeypatch.setattr(retry_plan, "MIN_SLICE_REJECTS", 4)
    monkeypatch.setattr(retry_plan, "MAX_SLICE_REJECTS", 4)
    connector = fixed.connector("threatfeed")
    planned = retry_plan.plan_retry(pg_url, connector, pipeline.record_spec(connector, pipeline.current_tables(pg_url, fixed, connector), ()))
    assert [s.records for s in planned.batch.slices] == [4, 2] and len(planned.batch.slices[0].unit_ids) == 2
    assert len(planned.batch.pending) == 2 and len({u.key for u in planned.batch.pending}) == 1

    summary = retry(pg_url, fixed, spark)
    # b's line 2 is a's line 3 again: the same key (it has an id), so one is written, one skipped;
    # the two lines without an id are keyed by their own file's position: both written.
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (5, 1, 0)
    assert rows(pg_url, "SELECT count(*) FROM idem.rejects WHERE retried_commit_id IS NULL") == [(0,)]


def test_rejects_deleted_after_planning_fail_the_retry(
    pg_url: str, tmp_path: Path, strict: IdemConfig, spark: Any
) -> None:
    from idem_platform.errors import TransientError
    from idem_platform.sources.rejects import plan_retry

    ingest(pg_url, strict, spark, write_lines(drop_path(strict, "feed.ndjson"), LINES[:4]))
    fixed = use(tmp_path, pg_url, FIXED)
    connector = fixed.connector("threatfeed").model_copy(update={"max_reject_ratio": 1.0})
    tables = pipeline.current_tables(pg_url, fixed, connector)
    planned = plan_retry(pg_url, connector, pipeline.record_spec(connector, tables, ()))
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM idem.rejects WHERE line = 3")
    before = counts(pg_url)
    coerced = pipeline.CoercedBatch(planned.batch, connector, tables)
    with pytest.raises(TransientError, match="no longer in idem.rejects"):
        run.commit_batch(run.CommitRequest(url=pg_url, connector=connector, run_id="t"), coerced, lambda: spark)
    assert counts(pg_url) == before
    assert rows(pg_url, "SELECT count(*) FROM idem.rejects WHERE retries > 0") == [(0,)]
