"""Upsert tables (``mode: upsert``): the current state beside the history, exactly once and
order-safe, through the real pipeline (Spark, staging, the one commit) on real PostgreSQL.

The property: whatever the split of one event history into files, the order the files are
committed in, repeated events and a replayed file, ``idem.<type>_current`` equals the fold of
the history by ``(order, content hash)``, computed here in Python from the events alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idem_platform.config import parse_config
from idem_platform.errors import ConfigError
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.read.planner import plan_read
from idem_platform.read.render import lines_in_process
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import fresh_config, reset_database, rows
from idem_platform_tests.helpers.ingest import ingest_records
from idem_platform_tests.helpers.threads import at_once
from idem_platform_tests.helpers.upsert import UPSERT


def current(pg_url: str) -> dict[str, dict[str, Any]]:
    """``idem.indicator_current``: identity -> the record as received."""
    return {key: payload for key, payload in rows(pg_url, "SELECT _external_id, _payload FROM idem.indicator_current")}


def canonical_hash(record: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def folded(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The expected current state: per id the version with the greatest (order, content hash);
    none for an id whose greatest version is a delete."""
    best: dict[str, dict[str, Any]] = {}
    for event in events:
        held = best.get(event["id"])
        if held is None or (event["version"], canonical_hash(event)) > (held["version"], canonical_hash(held)):
            best[event["id"]] = event
    return {key: event for key, event in best.items() if event.get("op") != "d"}


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("mode: upsert\n    order_by: name\n    columns: {name: string}", "order_by 'name' must be a declared column of type"),
        ("mode: upsert\n    order_by: seen\n    columns: {version: long}", "order_by 'seen' must be a declared column"),
        ("order_by: version\n    columns: {version: long}", "order_by: only for mode: upsert tables"),
        ("delete_when: {field: op, equals: d}\n    columns: {version: long}", "delete_when: only for mode: upsert"),
        ("mode: upsert\n    order_by: version\n    identity: [tags]\n    columns: {version: long, tags: dynamic}",
         "identity column 'tags' must be a declared column of type"),
        ("mode: upsert\n    order_by: version\n    identity: [version]\n    columns: {version: long}",
         "'version' cannot be both the identity and the order_by"),
        ("mode: merge\n    columns: {version: long}", "mode"),
    ],
)
def test_upsert_keys_are_checked_at_load(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(f"tables:\n  indicator:\n    {table}\n")


@pytest.mark.parametrize("other", ["indicator_current", "indicator_state"])
def test_a_record_type_named_like_an_upsert_tables_state_is_refused(other: str) -> None:
    text = f"tables:\n  indicator:\n    mode: upsert\n    order_by: v\n    columns: {{v: long}}\n  {other}: {{}}\n"
    with pytest.raises(ConfigError, match=f"would share the table idem.{other}"):
        parse_config(text)


def test_an_upsert_table_name_must_leave_room_for_its_view() -> None:
    name = "x" * 60
    with pytest.raises(ConfigError, match="longer than PostgreSQL's 63-byte names"):
        parse_config(f"tables:\n  {name}:\n    mode: upsert\n    order_by: v\n    columns: {{v: long}}\n")


def test_append_stays_the_default() -> None:
    config = parse_config("tables:\n  indicator:\n    columns: {version: long}\n")
    assert config.tables["indicator"].mode == "append" and config.table_specs["indicator"].upsert is None


def test_a_table_of_the_state_tables_name_that_is_not_idems_is_refused(pg_url: str, tmp_path: Path) -> None:
    reset_database(pg_url)
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE idem.indicator_current (x int)")
    config = write_config(tmp_path, UPSERT)
    with connect(pg_url, autocommit=True) as conn, pytest.raises(ConfigError, match="idem.indicator_current exists and is not"):
        sync_tables(conn, config.table_specs)


# --- end to end ------------------------------------------------------------------------------


def test_newer_versions_replace_older_ones_and_every_version_stays_in_history(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = fresh_config(tmp_path, pg_url, UPSERT)
    first = ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 2, "confidence": 20},
        {"id": "a", "version": 1, "confidence": 10},  # older, same batch: history only
        {"id": "b", "version": 5, "confidence": 50},
    ])
    counts = first["tables"]["indicator"]
    assert [counts[k] for k in ("written", "inserted", "updated", "deleted", "stale")] == [3, 2, 0, 0, 1]
    assert first["timings"]["current_state_seconds"] >= 0
    second = ingest_records(pg_url, config, spark, "feed", "2.ndjson", [
        {"id": "a", "version": 3, "confidence": 30},  # newer: replaces
        {"id": "b", "version": 4, "confidence": 40},  # older, later batch: history only
        {"id": "b", "version": 5, "confidence": 50},  # already committed: skipped
    ])
    counts = second["tables"]["indicator"]
    assert (counts["written"], counts["skipped"]) == (2, 1)
    assert (counts["inserted"], counts["updated"], counts["deleted"], counts["stale"]) == (0, 1, 0, 1)
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 30, "b": 50}
    logged = rows(pg_url, "SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s ORDER BY 1", second["commit_id"])
    assert logged == [("idempotent_skip", 1), ("upsert_stale", 1), ("upsert_updated", 1), ("written", 2)]
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator") == [(5,)]
    # idem read's plan: the current state by default, every version with --history
    plan, _ = plan_read(pg_url, config, "indicator", ordered=True, current=True)
    assert sorted(json.loads(line)["confidence"] for line in lines_in_process(plan) if line) == [30, 50]
    plan, _ = plan_read(pg_url, config, "indicator", ordered=True)
    assert len([line for line in lines_in_process(plan) if line]) == 5


def test_idem_read_prints_the_current_state_and_the_history_with_its_flag(
    pg_url: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from idem_platform.cli import main

    config = fresh_config(tmp_path, pg_url, UPSERT)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "confidence": 1}, {"id": "a", "version": 2, "confidence": 2},
        {"id": "b", "version": 1, "op": "d"},
    ])
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("IDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    capsys.readouterr()
    assert main(["--config", str(config.source), "read", "indicator"]) == 0
    out = capsys.readouterr().out
    assert [(r["_external_id"], r["confidence"]) for r in map(json.loads, out.splitlines())] == [("a", 2)]
    assert main(["--config", str(config.source), "read", "indicator", "--history"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_a_delete_before_its_insert_and_an_older_version_after_a_delete(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = fresh_config(tmp_path, pg_url, UPSERT)
    deleted = ingest_records(pg_url, config, spark, "feed", "1.ndjson", [{"id": "a", "version": 5, "op": "d"}])
    assert deleted["tables"]["indicator"]["deleted"] == 1
    older = ingest_records(pg_url, config, spark, "feed", "2.ndjson", [
        {"id": "a", "version": 3, "confidence": 30},  # the insert, arriving after its delete
        {"id": "a", "version": 4, "confidence": 40},
    ])
    assert (older["tables"]["indicator"]["stale"], older["tables"]["indicator"]["inserted"]) == (2, 0)
    assert current(pg_url) == {}
    assert rows(pg_url, "SELECT _deleted, _order FROM idem.indicator_state") == [(True, 5)]
    newer = ingest_records(pg_url, config, spark, "feed", "3.ndjson", [{"id": "a", "version": 6, "confidence": 60}])
    assert newer["tables"]["indicator"]["updated"] == 1
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 60}


def test_a_record_type_with_a_dash_has_unquoted_current_state_relations(pg_url: str, tmp_path: Path, spark: Any) -> None:
    """``threat-actor`` keeps its history in ``idem.threat_actor`` and its current state in
    ``idem.threat_actor_state`` / ``idem.threat_actor_current``: no name needs quoting."""
    config = fresh_config(tmp_path, pg_url, UPSERT.replace("record_type: indicator", "record_type: threat-actor").replace(
        "  indicator:\n", "  threat-actor:\n"
    ))
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "confidence": 10}, {"id": "a", "version": 2, "confidence": 20},
    ])
    assert rows(pg_url, "SELECT _external_id, confidence FROM idem.threat_actor_current") == [("a", 20)]
    assert rows(pg_url, "SELECT count(*) FROM idem.threat_actor") == [(2,)]
    assert rows(pg_url, "SELECT _order FROM idem.threat_actor_state") == [(2,)]


def test_a_delete_marker_may_hold_any_text_and_equals_compares_json_values(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = fresh_config(tmp_path, pg_url, UPSERT.replace("{field: op, equals: d}", "{field: op, equals: '100%(x)s'}"))
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "op": "100%(x)s"}, {"id": "b", "version": 1, "op": 100}, {"id": "c", "version": 1},
    ])
    assert sorted(current(pg_url)) == ["b", "c"]
    config = fresh_config(tmp_path, pg_url, UPSERT.replace("{field: op, equals: d}", "{field: gone, equals: 1}"))
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "gone": 1.0}, {"id": "b", "version": 1, "gone": True}, {"id": "c", "version": 1, "gone": "1"},
    ])
    assert sorted(current(pg_url)) == ["b", "c"]


def test_a_delete_needs_its_identity_and_order_but_not_the_other_required_columns(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = fresh_config(tmp_path, pg_url, UPSERT.replace("confidence: int", "confidence: {type: int, required: true}"))
    summary = ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "confidence": 1},
        {"id": "a", "version": 2, "op": "d"},  # a delete: no confidence needed
        {"id": "b", "version": 1},  # not a delete: confidence is required
        {"id": "c", "op": "d"},  # a delete still needs its order
    ])
    assert (summary["rows_written"], summary["rows_rejected"]) == (2, 2)
    assert [r[0][0]["rule"] for r in rows(pg_url, "SELECT reasons FROM idem.rejects ORDER BY line")] == ["required", "order"]
    assert current(pg_url) == {}


def test_order_compares_timestamps_as_instants_and_a_missing_order_is_a_reject(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    text = UPSERT.replace("order_by: version", "order_by: modified").replace("version: long", "modified: timestamp")
    config = fresh_config(tmp_path, pg_url, text)
    summary = ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "modified": "2026-01-01T10:00:00+02:00", "confidence": 1},  # 08:00Z
        {"id": "a", "modified": "2026-01-01T09:00:00Z", "confidence": 2},  # later as an instant, smaller as text
        {"id": "a", "confidence": 3},  # no order: a reject, never a winner
        {"id": "a", "modified": None, "confidence": 4},
    ])
    assert (summary["rows_written"], summary["rows_rejected"]) == (2, 2)
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 2}
    reasons = rows(pg_url, "SELECT reasons FROM idem.rejects ORDER BY line")
    assert [r[0][0]["rule"] for r in reasons] == ["order", "order"]
    assert "order_by" in reasons[0][0][0]["message"]


def test_a_composite_identity_and_a_new_column_reaches_the_view(pg_url: str, tmp_path: Path, spark: Any) -> None:
    text = UPSERT.replace("delete_when: {field: op, equals: d}", "identity: [source, name]").replace(
        "confidence: int", "confidence: int\n      source: string\n      name: string"
    )
    config = fresh_config(tmp_path, pg_url, text)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "1", "source": "x", "name": "n", "version": 1, "confidence": 1},
        {"id": "2", "source": "x", "name": "n", "version": 2, "confidence": 2, "colour": "red"},  # evolves a column
        {"id": "3", "source": "y", "name": "n", "version": 1, "confidence": 3},
    ])
    assert sorted(rows(pg_url, "SELECT source, name, confidence, colour FROM idem.indicator_current")) == [
        ("x", "n", 2, "red"), ("y", "n", 3, None)
    ]
    summary = ingest_records(pg_url, config, spark, "feed", "2.ndjson", [{"id": "4", "name": "n", "version": 9}])
    assert summary["rows_rejected"] == 1
    ((reasons,),) = rows(pg_url, "SELECT reasons FROM idem.rejects")
    assert reasons[0]["rule"] == "identity"


def test_switching_an_append_table_to_upsert_builds_its_state_from_the_history(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    append = UPSERT.replace("    mode: upsert\n    order_by: version\n    delete_when: {field: op, equals: d}\n", "")
    config = fresh_config(tmp_path, pg_url, append)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "confidence": 1}, {"id": "a", "version": 2, "confidence": 2},
    ])
    assert rows(pg_url, "SELECT to_regclass('idem.indicator_current') IS NULL") == [(True,)]
    config = write_config(tmp_path, UPSERT)
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 2}
    config = write_config(tmp_path, UPSERT.replace("{field: op, equals: d}", "{field: confidence, equals: 2}"))
    with connect(pg_url, autocommit=True) as conn:  # another delete rule: the state is rebuilt
        sync_tables(conn, config.table_specs)
    assert current(pg_url) == {}
    assert rows(pg_url, "SELECT _external_id, _deleted FROM idem.indicator_state") == [("a", True)]
    config = write_config(tmp_path, append)  # back to append: the derived state goes
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    assert rows(pg_url, "SELECT to_regclass('idem.indicator_state') IS NULL") == [(True,)]


# --- the property ----------------------------------------------------------------------------

EVENTS = st.lists(
    st.fixed_dictionaries(
        {"id": st.sampled_from(["a", "b", "c"]), "version": st.integers(1, 3), "confidence": st.integers(0, 2)},
        optional={"op": st.just("d")},
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS, data=st.data())
def test_any_split_order_and_replay_gives_the_fold_of_the_history(
    pg_url: str, tmp_path: Path, spark: Any, events: list[dict[str, Any]], data: st.DataObject
) -> None:
    config = fresh_config(tmp_path, pg_url, UPSERT)
    files = data.draw(st.integers(2, 3), label="files")
    # Each event goes to one or more files (a repeat across files), in any order within each.
    placed: list[list[dict[str, Any]]] = [[] for _ in range(files)]
    for event in events:
        for index in data.draw(st.sets(st.integers(0, files - 1), min_size=1), label="placement"):
            placed[index].append(event)
    placed = [data.draw(st.permutations(p), label="order") for p in placed]
    order = data.draw(st.permutations(range(files)), label="commit order")
    replayed = data.draw(st.sampled_from(order), label="replayed file")
    for index in [*order, replayed]:  # the replayed file is committed again: the same bytes
        ingest_records(pg_url, config, spark, "feed", f"{index}.ndjson", placed[index] or [{"id": "z", "version": 1}])
    expected = folded(events + ([{"id": "z", "version": 1}] if not all(placed) else []))
    assert current(pg_url) == expected


def test_two_commits_at_once_into_one_current_state_give_the_fold(pg_url: str, tmp_path: Path, spark: Any) -> None:
    from idem_platform.pipeline import commit as run
    from idem_platform.pipeline import ingest as pipeline
    from idem_platform.samples import write_lines

    config = fresh_config(tmp_path, pg_url, UPSERT)
    connector = config.connector("feed")
    assert connector.path is not None
    files = {
        "old.ndjson": [{"id": f"i{n}", "version": 1 + 2 * (n % 2), "confidence": 1} for n in range(500)],
        "new.ndjson": [{"id": f"i{n}", "version": 2, "confidence": 2} for n in range(500)],
    }
    paths = [write_lines(connector.path / name, [json.dumps(r) for r in records]) for name, records in files.items()]
    tables = pipeline.current_tables(pg_url, config, connector)

    def commit(path: Path) -> None:
        batch = pipeline.plan_batch(pg_url, connector, [path])
        request = run.CommitRequest(url=pg_url, connector=connector, run_id=path.name)
        run.commit_batch(request, pipeline.CoercedBatch(batch, connector, tables), lambda: spark)

    failures = at_once(commit, paths)
    assert not failures, failures
    assert current(pg_url) == folded([r for records in files.values() for r in records])


# --- Kafka: the same commit path ---------------------------------------------------------------

FILE_AND_KAFKA = """
connectors:
  - name: feed
    kind: filedrop
    path: drop
    record_type: indicator
  - name: events
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topic}]
    record_type: indicator
    key_namespace: feed
tables:
  indicator:
    mode: upsert
    order_by: version
    delete_when: {{field: op, equals: d}}
    columns:
      version: long
      confidence: int
"""


def test_a_kafka_topic_and_a_file_drop_share_one_current_state(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Any, topic: str
) -> None:
    from idem_platform_tests.helpers.kafka import ingest as ingest_kafka
    from idem_platform_tests.helpers.kafka_broker import create_topic, produce

    config = fresh_config(tmp_path, pg_url, FILE_AND_KAFKA.format(bootstrap=kafka_broker.bootstrap, topic=topic))
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 2, "confidence": 2}, {"id": "b", "version": 1, "confidence": 1},
    ])
    create_topic(kafka_broker.bootstrap, topic, 2)
    messages = [
        {"id": "a", "version": 1, "confidence": 1},  # older than the file's: history only
        {"id": "a", "version": 2, "confidence": 2},  # the file's record: skipped (same key namespace)
        {"id": "b", "version": 3, "op": "d"},
        {"id": "c", "version": 1, "confidence": 7},
    ]
    produce(kafka_broker.bootstrap, topic, [(i % 2, None, json.dumps(m).encode(), None) for i, m in enumerate(messages)])
    summary = ingest_kafka(pg_url, config, spark)
    counts = summary["tables"]["indicator"]
    assert [counts[k] for k in ("written", "skipped", "inserted", "updated", "deleted", "stale")] == [3, 1, 1, 0, 1, 1]
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 2, "c": 7}
    again = ingest_kafka(pg_url, config, spark)  # nothing new on the topic
    assert again["rows_written"] == 0
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 2, "c": 7}


# --- a crash inside the commit ------------------------------------------------------------------


@pytest.mark.slow
def test_a_kill_after_the_fold_before_commit_changes_nothing_and_the_rerun_folds_once(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    from idem_platform.samples import write_lines
    from idem_platform_tests.helpers.cli import cli_env, idem_command
    from idem_platform_tests.helpers.faults import kill_at_fault

    config = fresh_config(tmp_path, pg_url, UPSERT)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [{"id": "a", "version": 2, "confidence": 2}])
    second = [{"id": "a", "version": 3, "confidence": 3}, {"id": "a", "version": 1, "confidence": 1}, {"id": "b", "version": 1, "op": "d"}]
    assert config.connector("feed").path is not None
    path = write_lines(config.connector("feed").path / "2.ndjson", [json.dumps(r) for r in second])  # type: ignore[operator]
    marker = tmp_path / "before_apply.pid"
    env = cli_env(pg_url, tmp_path, config, f"before_apply:pause:{marker}")
    kill_at_fault(idem_command("ingest", "--connector", "feed", str(path)), env, marker)
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 2}  # the fold died with its transaction
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator_state") == [(1,)]
    rerun = ingest_records(pg_url, config, spark, "feed", "2.ndjson", second)
    counts = rerun["tables"]["indicator"]
    assert [counts[k] for k in ("inserted", "updated", "deleted", "stale")] == [0, 1, 1, 1]
    assert current(pg_url) == folded([{"id": "a", "version": 2, "confidence": 2}, *second])


# --- idem migrate: old rows rewritten in place ---------------------------------------------------

REVERSE_VERSION = '''
from idem_platform.migrations import schema_migration


@schema_migration("indicator", from_version=1, to_version=2)
def count_down(record):
    record["version"] = 10 - record["version"]
    return record
'''


def test_idem_migrate_folds_the_state_again_from_the_migrated_order(pg_url: str, tmp_path: Path, spark: Any) -> None:
    """A migration that changes the ``order_by`` value of old rows: the state folded from the
    old values would keep a stale order (an older version current, and a new version beating
    it by the old figure); ``idem migrate`` folds the identities of the rows it moved again."""
    import uuid

    from idem_platform.read.migrate.run import migrate

    config = fresh_config(tmp_path, pg_url, UPSERT)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "confidence": 1}, {"id": "a", "version": 2, "confidence": 2},
        {"id": "b", "version": 3, "confidence": 3},
    ])
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 2, "b": 3}
    module = f"upsert_migrations_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module}.py").write_text(REVERSE_VERSION)
    v2 = write_config(tmp_path, UPSERT.replace("    mode: upsert\n", "    mode: upsert\n    schema_version: 2\n") + f"migrations: [{module}]\n")
    report = migrate(spark, pg_url, v2, batch_rows=2)
    assert report["rows_moved"] == 3
    # a: version 1 is now 9, version 2 is 8: the first version is current, at order 9.
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 1, "b": 3}
    assert sorted(rows(pg_url, "SELECT _external_id, _order FROM idem.indicator_state")) == [("a", 9), ("b", 7)]
    # A new version of order 8 is older than the current 9 (it would beat a stale order 2).
    ingest_records(pg_url, v2, spark, "feed", "2.ndjson", [{"id": "a", "version": 8, "confidence": 8}])
    assert {k: v["confidence"] for k, v in current(pg_url).items()} == {"a": 1, "b": 3}
