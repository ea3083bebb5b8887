"""Keys a table already holds are looked up, not staged: re-delivered rows cost a probe, not a COPY.

A commit into tables that hold rows (``CommitPlan.probe_known``) has each staging
attempt look up its batches' keys and stage only the others; the apply counts
the known ones as idempotent skips, exactly as if they had been staged and
skipped by its anti-join.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from idem_platform.coercion.records import coerce_batch
from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.pipeline.ingest import current_tables
from idem_platform.postgres import connect
from idem_platform.postgres.tables import tables_with_rows
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.sources.filedrop import hash_file
from idem_platform.write.apply.attempts import StagedAttempt
from idem_platform.write.apply.transaction import apply_staged
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import StagingWriter, new_attempt_id
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.staging_fixture import claimed_plan


def _plan(pg_url: str, config: IdemConfig, path: Path) -> CommitPlan:
    """A one-slice commit of ``path`` with the tables as a run reads them (evolved columns
    included), probing those that hold rows now."""
    tables = current_tables(pg_url, config, config.connector("threatfeed"))
    return claimed_plan(pg_url, tables, hash_file(path), probe=True)


def _stage(pg_url: str, plan: CommitPlan, batches: list[pa.RecordBatch]) -> tuple[StagedAttempt, StagingWriter]:
    writer = StagingWriter(pg_url, plan, new_attempt_id())
    for batch in batches:
        writer.write(batch)
    writer.close()
    message = StagedAttempt(0, writer.attempt, writer.rows, writer.with_extra, writer.rejected, known=writer.known)
    return message, writer


def _coerced(plan: CommitPlan, lines: list[str]) -> pa.RecordBatch:
    return coerce_batch(lines_batch([line.encode() for line in lines]), plan.spec)


def _rows(pg_url: str) -> int:
    with connect(pg_url) as conn:
        return sum(conn.execute(f'SELECT count(*) FROM idem.{table_name(t)}').fetchone()[0] for t in ("indicator", "malware", "threat-actor"))  # type: ignore[index]


def test_known_keys_are_counted_as_skips_and_never_staged(pg_url: str, threatfeed: IdemConfig, tmp_path: Path) -> None:
    old = list(threatfeed_lines(60, seed=11, duplicate_ratio=0.0))
    first = _plan(pg_url, threatfeed, write_lines(tmp_path / "a.ndjson", old))
    assert first.probe_known == frozenset()  # empty tables: a first load probes nothing
    message, _ = _stage(pg_url, first, [_coerced(first, old)])
    with connect(pg_url) as conn:
        assert apply_staged(conn, first, [message])["rows_written"] == 60

    # The same rows in a new file (other order), 10 new rows, and a known record with one
    # more field: other content, so another key (a new row, not a skip).
    new = list(threatfeed_lines(10, seed=12, duplicate_ratio=0.0, start=1000))
    widened = json.loads(old[0]) | {"first_seen_by": "analyst"}
    lines = [*reversed(old), *new, json.dumps(widened)]
    second = _plan(pg_url, threatfeed, write_lines(tmp_path / "b.ndjson", lines))
    assert second.probe_known == {json.loads(line)["type"] for line in old}
    message, writer = _stage(pg_url, second, [_coerced(second, lines)])
    assert sum(writer.known.values()) == 60  # looked up, not staged
    assert sum(writer.rows.values()) == 11
    with connect(pg_url) as conn:
        result = apply_staged(conn, second, [message])
    assert (result["rows_written"], result["rows_skipped"], result["rows_rejected"]) == (11, 60, 0)
    assert sum(t["skipped"] for t in result["tables"].values()) == 60
    assert _rows(pg_url) == 71
    with connect(pg_url) as conn:
        logged = dict(conn.execute("SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s", [second.commit_id]).fetchall())
    assert logged["written"] == 11 and logged["idempotent_skip"] == 60


def test_an_attempt_stops_probing_a_type_whose_keys_are_new(pg_url: str, threatfeed: IdemConfig, tmp_path: Path) -> None:
    old = list(threatfeed_lines(40, seed=21, duplicate_ratio=0.0))
    first = _plan(pg_url, threatfeed, write_lines(tmp_path / "a.ndjson", old))
    message, _ = _stage(pg_url, first, [_coerced(first, old)])
    with connect(pg_url) as conn:
        apply_staged(conn, first, [message])

    new = list(threatfeed_lines(40, seed=22, duplicate_ratio=0.0, start=5000))
    second = _plan(pg_url, threatfeed, write_lines(tmp_path / "b.ndjson", new + old))
    # A batch of new keys first: the probe finds none, so the attempt stages the rest of
    # each such type; the apply's anti-join still skips the known rows staged after it.
    message, writer = _stage(pg_url, second, [_coerced(second, new), _coerced(second, old)])
    stopped = {json.loads(line)["type"] for line in new}
    assert not stopped & set(writer.known)
    assert sum(writer.rows.values()) + sum(writer.known.values()) == 80
    with connect(pg_url) as conn:
        result = apply_staged(conn, second, [message])
    assert (result["rows_written"], result["rows_skipped"]) == (40, 40)
    assert _rows(pg_url) == 80


@pytest.mark.parametrize("held", [False, True])
def test_tables_with_rows_names_only_tables_that_hold_rows(pg_url: str, threatfeed: IdemConfig, held: bool) -> None:
    with connect(pg_url) as conn:
        if held:
            conn.execute("CREATE TABLE IF NOT EXISTS idem.probe_target (_idempotency_key text PRIMARY KEY)")
            conn.execute("INSERT INTO idem.probe_target VALUES ('k') ON CONFLICT DO NOTHING")
        else:
            conn.execute("DROP TABLE IF EXISTS idem.probe_target")
        assert tables_with_rows(conn, ["indicator", "probe_target", "no_such_type", "odd\"name"]) == ({"probe_target"} if held else set())
