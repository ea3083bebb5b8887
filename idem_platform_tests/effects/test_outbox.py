"""The commit's share of effects, on real PostgreSQL and Spark: an outbox row for each
written row meeting the condition, none for skipped, rejected or replayed ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from psycopg import sql

from idem_platform.config import IdemConfig, parse_config
from idem_platform.contract.keys import minted_key
from idem_platform.effects.outbox import minted_key_sql
from idem_platform.idempotency import mint_key
from idem_platform.pipeline.retry import retry_rejects
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.effects import alert, effects_config, outbox
from idem_platform_tests.helpers.faults import kill_at_fault
from idem_platform_tests.helpers.ingest import ingest, ingest_records
from idem_platform_tests.helpers.paths import SPEC_DIR

FIRST = [
    {"type": "indicator", "id": "ioc-1", "name": "bad.example", "confidence": 90},
    {"type": "indicator", "id": "ioc-2", "name": "meh.example", "confidence": 50},
    {"type": "indicator", "id": "ioc-3", "name": "unknown.example"},  # null confidence: never meets it
    {"type": "malware", "id": 7, "name": "emotet"},
    {"type": "indicator", "id": "ioc-4", "name": "x", "confidence": "high"},  # rejected
    {"type": "indicator", "id": "ioc-1", "name": "bad.example", "confidence": 90},  # repeat: skipped
]


@pytest.fixture
def config(tmp_path: Path, pg_url: str) -> IdemConfig:
    enrich = alert("http://127.0.0.1:9/enrich", name="enrich", when=[])
    return effects_config(tmp_path, pg_url, [alert("http://127.0.0.1:9/alert"), enrich])


def _drop(config: IdemConfig, name: str, records: list[dict[str, Any]]) -> Path:
    path = config.connector("threatfeed").path
    assert path is not None
    return write_lines(path / name, [json.dumps(r) for r in records])


def test_written_rows_meeting_the_condition_get_one_row_per_effect(pg_url: str, config: IdemConfig, spark: Any) -> None:
    summary = ingest(pg_url, config, spark, _drop(config, "a.ndjson", FIRST))
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (4, 1, 1)
    assert (summary["effects_created"], summary["effects_suppressed"]) == (4, 0)  # alert: ioc-1; enrich: 3 indicators
    owed = outbox(pg_url)
    assert sorted((r["effect"], r["payload"]["id"]) for r in owed) == [
        ("alert", "ioc-1"), ("enrich", "ioc-1"), ("enrich", "ioc-2"), ("enrich", "ioc-3")
    ]
    assert all(r["status"] == "pending" and r["attempts"] == 0 for r in owed)
    first = next(r for r in owed if r["effect"] == "alert")
    assert first["payload"] == {"indicator": "bad.example", "confidence": 90, "id": "ioc-1"}
    (record_key, content_hash), = rows(
        pg_url, "SELECT _idempotency_key, _content_hash FROM idem.indicator WHERE _external_id = 'ioc-1'"
    )
    assert first["record_key"] == record_key and len(content_hash) == 40
    # The design's minted key of the default parts; the two effects on one row differ.
    assert first["key"] == mint_key("alert", "threatfeed", "indicator", "ioc-1", content_hash)
    other = next(r for r in owed if r["effect"] == "enrich" and r["payload"]["id"] == "ioc-1")
    assert other["key"] == mint_key("enrich", "threatfeed", "indicator", "ioc-1", content_hash) != first["key"]
    commit = rows(pg_url, "SELECT DISTINCT commit_id::text FROM idem.outbox")
    assert commit == [(summary["commit_id"],)]


def test_replays_and_skips_owe_nothing_and_a_replay_run_suppresses(pg_url: str, config: IdemConfig, spark: Any) -> None:
    ingest(pg_url, config, spark, _drop(config, "a.ndjson", FIRST))
    before = outbox(pg_url)
    again = ingest(pg_url, config, spark, _drop(config, "a.ndjson", FIRST), use_spark=False)  # a replayed file
    assert again["replayed"] is True and outbox(pg_url) == before
    # A copy of committed records under another name: every row skipped, nothing owed.
    copy = ingest(pg_url, config, spark, _drop(config, "copy.ndjson", FIRST[:4]))
    assert copy["rows_written"] == 0 and copy["effects_created"] == 0 and outbox(pg_url) == before
    # New rows in a run tagged as a replay: written, and their effects suppressed.
    history = [{"type": "indicator", "id": "ioc-9", "name": "old.example", "confidence": 99}]
    replayed = ingest(pg_url, config, spark, _drop(config, "history.ndjson", history), replay=True)
    assert replayed["rows_written"] == 1
    assert (replayed["effects_created"], replayed["effects_suppressed"]) == (0, 2)
    assert outbox(pg_url) == before
    fresh = [{"type": "indicator", "id": "ioc-5", "name": "new.example", "confidence": 80}, FIRST[0]]
    summary = ingest(pg_url, config, spark, _drop(config, "b.ndjson", fresh))
    assert (summary["rows_written"], summary["rows_skipped"], summary["effects_created"]) == (1, 1, 2)
    assert len(outbox(pg_url)) == len(before) + 2


def test_the_key_in_postgresql_is_the_design_s_minted_key(pg_url: str) -> None:
    vectors = [json.loads(line) for line in (SPEC_DIR / "minted_keys.jsonl").read_text().splitlines() if line.strip()]
    assert vectors
    with connect(pg_url) as conn:
        for vector in vectors:
            parts = tuple(f"p{i}" for i in range(len(vector["parts"])))
            query = sql.SQL("SELECT {} FROM (SELECT {}) t").format(
                minted_key_sql(parts),
                sql.SQL(", ").join(sql.SQL("%s::text AS {}").format(sql.Identifier(p)) for p in parts),
            )
            (key,) = conn.execute(query, vector["parts"]).fetchone() or (None,)
            assert key == vector["key"] == minted_key(vector["parts"])


@pytest.mark.parametrize("point", ["during_apply", "after_apply"])
def test_a_commit_killed_around_its_commit_owes_each_effect_once(
    pg_url: str, config: IdemConfig, spark: Any, tmp_path: Path, point: str
) -> None:
    """Killed after the outbox insert but before COMMIT: nothing is owed, the rerun owes it;
    killed just after COMMIT: it is owed, and the rerun (a replay) owes nothing more."""
    path = _drop(config, "a.ndjson", FIRST)
    marker = tmp_path / f"{point}.pid"
    kill_at_fault(
        idem_command("ingest", "--connector", "threatfeed", str(path)),
        cli_env(pg_url, tmp_path, config, f"{point}:pause:{marker}"),
        marker,
    )
    committed = point == "after_apply"
    assert len(outbox(pg_url)) == (4 if committed else 0)
    rerun = ingest(pg_url, config, spark, path)
    assert rerun["replayed"] is committed
    owed = outbox(pg_url)
    assert sorted((r["effect"], r["payload"]["id"]) for r in owed) == [
        ("alert", "ioc-1"), ("enrich", "ioc-1"), ("enrich", "ioc-2"), ("enrich", "ioc-3")
    ]
    assert rows(pg_url, "SELECT count(DISTINCT commit_id) FROM idem.outbox") == [(1,)]


def test_the_rejects_retry_owes_effects_for_the_rows_it_writes_and_none_for_committed_ones(
    tmp_path: Path, pg_url: str, config: IdemConfig, spark: Any
) -> None:
    nameless = [
        {"type": "indicator", "id": "ioc-7", "confidence": 95},  # no name: a reject, committed later
        {"type": "indicator", "id": "ioc-9", "confidence": 99},  # no name: a reject, only retried
    ]
    first = ingest(pg_url, config, spark, _drop(config, "a.ndjson", [*nameless, FIRST[0]]))
    assert (first["rows_written"], first["effects_created"]) == (1, 2)  # ioc-1: alert and enrich
    # name no longer required: the same ioc-7 record now passes, and is committed by a new file.
    assert config.source is not None
    data = yaml.safe_load(config.source.read_text(encoding="utf-8"))
    data["tables"]["indicator"]["columns"]["name"]["required"] = False
    relaxed = parse_config(yaml.safe_dump(data, sort_keys=False), config.source)
    later = ingest_records(pg_url, relaxed, spark, "threatfeed", "b.ndjson", nameless[:1])
    assert (later["rows_written"], later["effects_created"]) == (1, 2)
    before = outbox(pg_url)
    retried = retry_rejects(pg_url, relaxed, relaxed.connector("threatfeed"), lambda: spark)
    after = outbox(pg_url)
    # ioc-9 written by the retry owes its two effects; ioc-7, committed already, owes nothing more.
    added = [r for r in after if r not in before]
    assert retried["rows_written"] == 1 and retried["effects_created"] == 2
    assert sorted((r["effect"], r["payload"]["id"]) for r in added) == [("alert", "ioc-9"), ("enrich", "ioc-9")]
    again = retry_rejects(pg_url, relaxed, relaxed.connector("threatfeed"), lambda: spark)
    assert again.get("effects_created", 0) == 0 and outbox(pg_url) == after
