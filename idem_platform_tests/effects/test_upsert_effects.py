"""Effects on an upsert table's changes, through the real pipeline on real PostgreSQL: an
outbox row per change of the current state (inserted, updated, deleted, as ``on_change``
asks), none for a stale version, a version superseded in its batch, a replayed file, an
older version arriving late or a rebuild of the state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from idem_platform.config import IdemConfig
from idem_platform.errors import ConfigError
from idem_platform.idempotency import mint_key
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import fresh_config, rows
from idem_platform_tests.helpers.effects import outbox
from idem_platform_tests.helpers.ingest import ingest_records
from idem_platform_tests.helpers.upsert import UPSERT

# The upsert table with an effect on its changes; ``ON_CHANGE`` stands for each test's ``on_change``.
UPSERT_EFFECT = UPSERT + """effects:
  - name: changed
    record_type: indicator
    ON_CHANGE
    python:
      function: "json:dumps"
      body: {id: external_id, version: version, change: change}
effect_modules: [json]
"""


def _config(tmp_path: Path, pg_url: str, on_change: str = "on_change: [inserted, updated, deleted]") -> IdemConfig:
    return fresh_config(tmp_path, pg_url, UPSERT_EFFECT.replace("ON_CHANGE", on_change))


def _owed(pg_url: str) -> list[tuple[str, int, str]]:
    return sorted((r["payload"]["id"], r["payload"]["version"], r["payload"]["change"]) for r in outbox(pg_url))


def test_each_change_of_the_current_state_owes_one_row_and_history_only_versions_none(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = _config(tmp_path, pg_url)
    first = ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "version": 1, "confidence": 1},
        {"id": "a", "version": 3, "confidence": 3},  # supersedes version 1 in the batch: only 3 fires
        {"id": "a", "version": 2, "confidence": 2},
        {"id": "b", "version": 1, "confidence": 1},
    ])
    assert first["effects_created"] == 2
    assert _owed(pg_url) == [("a", 3, "inserted"), ("b", 1, "inserted")]
    second = ingest_records(pg_url, config, spark, "feed", "2.ndjson", [
        {"id": "a", "version": 2, "confidence": 9},  # older than the current 3, arriving late: stale
        {"id": "b", "version": 2, "confidence": 2},  # updated
        {"id": "c", "version": 5, "op": "d"},  # a delete of an identity never seen: a tombstone
    ])
    assert second["tables"]["indicator"]["stale"] == 1 and second["effects_created"] == 2
    assert _owed(pg_url) == [("a", 3, "inserted"), ("b", 1, "inserted"), ("b", 2, "updated"), ("c", 5, "deleted")]
    third = ingest_records(pg_url, config, spark, "feed", "3.ndjson", [{"id": "a", "version": 4, "op": "d"}])
    assert third["effects_created"] == 1 and ("a", 4, "deleted") in _owed(pg_url)
    # The key: the upsert default parts, the change and the version's content hash among them.
    (content_hash,), = rows(pg_url, "SELECT _content_hash FROM idem.indicator WHERE _external_id = 'b' "
                                    "AND (_payload ->> 'version') = '2'")
    key = next(r["key"] for r in outbox(pg_url) if r["payload"] == {"id": "b", "version": 2, "change": "updated"})
    assert key == mint_key("changed", "feed", "indicator", "b", "updated", content_hash)


def test_a_replayed_file_a_late_older_version_and_a_rebuild_owe_nothing(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = _config(tmp_path, pg_url, "")  # the default: inserted and updated
    records = [{"id": "a", "version": 2, "confidence": 2}, {"id": "b", "version": 1, "op": "d"}]
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", records)
    assert _owed(pg_url) == [("a", 2, "inserted")]  # a delete is not asked for by default
    before = outbox(pg_url)
    again = ingest_records(pg_url, config, spark, "feed", "1.ndjson", records)
    assert again.get("effects_created", 0) == 0 and outbox(pg_url) == before
    late = ingest_records(pg_url, config, spark, "feed", "2.ndjson", [{"id": "a", "version": 1, "confidence": 1}])
    assert late["rows_written"] == 1 and late["effects_created"] == 0 and outbox(pg_url) == before
    # Another delete rule: the state is rebuilt from the history, and that owes nothing.
    rebuilt = write_config(tmp_path, UPSERT_EFFECT.replace("ON_CHANGE", "").replace("{field: op, equals: d}",
                                                                                   "{field: confidence, equals: 1}"))
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, rebuilt.table_specs)
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator_state") == [(2,)]
    assert outbox(pg_url) == before


def test_a_run_tagged_as_a_replay_changes_the_state_and_counts_what_it_suppressed(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = _config(tmp_path, pg_url)
    connector = config.connector("feed")
    assert connector.path is not None
    path = write_lines(connector.path / "old.ndjson", ['{"id": "a", "version": 1}', '{"id": "a", "version": 2}'])
    pipeline.prepare_tables(pg_url, config, connector)
    coerced = pipeline.CoercedBatch(
        pipeline.plan_batch(pg_url, connector, [path]), connector, pipeline.current_tables(pg_url, config, connector)
    )
    request = run.CommitRequest(url=pg_url, connector=connector, run_id="test", replay=True)
    summary = run.commit_batch(request, coerced, lambda: spark)
    assert (summary["effects_created"], summary["effects_suppressed"]) == (0, 1)  # the winner, version 2
    assert outbox(pg_url) == [] and rows(pg_url, "SELECT count(*) FROM idem.indicator_current") == [(1,)]


def test_on_change_and_the_change_part_are_for_upsert_tables_only(tmp_path: Path) -> None:
    append = UPSERT_EFFECT.replace("    mode: upsert\n    order_by: version\n    delete_when: {field: op, equals: d}\n", "")
    with pytest.raises(ConfigError, match="not an upsert table"):
        write_config(tmp_path, append.replace("ON_CHANGE", "on_change: [inserted]"))
    with pytest.raises(ConfigError, match="'change' is neither a column"):
        write_config(tmp_path, append.replace("ON_CHANGE", ""))
    with pytest.raises(ConfigError, match="on_change"):
        write_config(tmp_path, UPSERT_EFFECT.replace("ON_CHANGE", "on_change: [renamed]"))
