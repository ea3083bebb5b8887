"""Task attempts are not rows: only attempts whose commit messages arrived are applied and counted."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.errors import TransientError
from idem_platform.ledger import Ledger
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.sources.filedrop import Split, hash_file
from idem_platform.write.apply.attempts import StagedAttempt
from idem_platform.write.apply.claim import ClaimLost
from idem_platform.write.apply.transaction import apply_staged
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import (
    STAGED_SYSTEM,
    StagingWriter,
    attempt_table,
    drop_stale_staging,
    new_attempt_id,
    staged_rows,
)
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.staging_fixture import claimed_plan


def _batch(lines: list[str], first_line: int, spec: RecordSpec) -> pa.RecordBatch:
    return coerce_batch(lines_batch([line.encode() for line in lines], first_line), spec)


@pytest.fixture
def staged(pg_url: str, threatfeed: IdemConfig, tmp_path: Path) -> tuple[CommitPlan, list[str], RecordSpec]:
    lines = list(threatfeed_lines(40, seed=3, duplicate_ratio=0.0))
    path = write_lines(tmp_path / "f.ndjson", lines)
    hashed = hash_file(path)
    middle = hashed.splits[0].start + len("\n".join(lines[:20]).encode()) + 1
    # Two input partitions (splits) so the plan expects two commit messages.
    file = replace(
        hashed,
        splits=(Split(0, middle, 1, 0), Split(middle, hashed.size, 21, 0)),
    )
    tables = threatfeed.tables_for(threatfeed.connector("threatfeed"))
    plan = claimed_plan(pg_url, tables, file)
    return plan, lines, plan.spec


def _stage(pg_url: str, plan: CommitPlan, batch: pa.RecordBatch, partition: int) -> StagedAttempt:
    attempt = new_attempt_id()
    writer = StagingWriter(pg_url, plan, attempt)
    writer.write(batch)
    writer.close()
    return StagedAttempt(partition, attempt, writer.rows, writer.with_extra, writer.rejected)


def test_only_accepted_attempts_are_applied(pg_url: str, staged: tuple[CommitPlan, list[str], RecordSpec]) -> None:
    plan, lines, spec = staged
    half_0 = _batch(lines[:20], 1, spec)
    half_1 = _batch(lines[20:], 21, spec)
    failed = _stage(pg_url, plan, half_0.slice(0, 7), 0)  # died mid-way: its message never arrived
    accepted_0 = _stage(pg_url, plan, half_0, 0)
    speculative_0 = _stage(pg_url, plan, half_0, 0)  # a second attempt of partition 0 also reported
    accepted_1 = _stage(pg_url, plan, half_1, 1)
    assert failed.rows  # those rows really are in staging
    with connect(pg_url) as conn:
        result = apply_staged(conn, plan, [accepted_0, None, accepted_1, speculative_0])
    assert result["rows_written"] == 40 and result["rows_skipped"] == 0 and result["rows_rejected"] == 0
    with connect(pg_url) as conn:
        total = sum(
            conn.execute(f'SELECT count(*) FROM idem.{table_name(t)} WHERE _commit_id = %s', [plan.commit_id]).fetchone()[0]
            for t in plan.tables
        )
        assert total == 40
        assert conn.execute("SELECT status FROM idem.ingest_ledger").fetchone() == ("committed",)
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)


def test_a_missing_partition_commits_nothing(pg_url: str, staged: tuple[CommitPlan, list[str], RecordSpec]) -> None:
    plan, lines, spec = staged
    only = _stage(pg_url, plan, _batch(lines[:20], 1, spec), 0)
    with connect(pg_url) as conn, pytest.raises(TransientError, match="cover 1 of 2 partitions"):
        apply_staged(conn, plan, [only])


def test_a_claim_taken_by_another_run_commits_nothing(pg_url: str, staged: tuple[CommitPlan, list[str], RecordSpec]) -> None:
    plan, lines, spec = staged
    messages = [_stage(pg_url, plan, _batch(lines[:20], 1, spec), 0), _stage(pg_url, plan, _batch(lines[20:], 21, spec), 1)]
    with connect(pg_url) as conn, conn.transaction():
        Ledger(conn, "threatfeed").take_over(plan.units[0].key, "another-run/xyz")
    with connect(pg_url) as conn, pytest.raises(ClaimLost, match="no longer owns it"):
        apply_staged(conn, plan, messages)
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.commits").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM idem.indicator").fetchone() == (0,)
    assert json.dumps(messages[0].rows)


def test_a_zombie_attempt_still_copying_never_blocks_the_commit(
    pg_url: str, staged: tuple[CommitPlan, list[str], RecordSpec]
) -> None:
    plan, lines, spec = staged
    zombie = _stage(pg_url, plan, _batch(lines[:20], 1, spec), 0)  # a speculative copy Spark did not kill
    messages = [_stage(pg_url, plan, _batch(lines[:20], 1, spec), 0), _stage(pg_url, plan, _batch(lines[20:], 21, spec), 1)]
    record_type = next(rt for rt, n in zombie.rows.items() if n)
    zombie_table = attempt_table(plan.staging_table(record_type), zombie.attempt)
    with connect(pg_url) as holder:
        # What a COPY in flight holds on the zombie's table.
        holder.execute(f'LOCK TABLE idem_staging."{zombie_table}" IN ROW EXCLUSIVE MODE')
        started = time.monotonic()
        with connect(pg_url) as conn:
            result = apply_staged(conn, plan, messages)
        assert time.monotonic() - started < 30
        assert result["rows_written"] == 40
        with connect(pg_url) as conn:
            left = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'idem_staging'")}
        assert left == {zombie_table}  # everything else went with the commit
    with connect(pg_url) as conn, conn.transaction():
        # The purge drops a committed commit's leftovers at once, whatever their age.
        assert drop_stale_staging(conn, 24 * 3600) == 1
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)


@pytest.mark.parametrize("attempt", ["", "0123456789abcdeg", "0123456789ABCDEF", "0123456789abcdef0"])
def test_an_attempt_id_must_name_a_short_safe_table(attempt: str) -> None:
    with pytest.raises(ValueError, match="lowercase hex"):
        attempt_table("c0_0", attempt)


def test_staged_rows_are_the_batch_rows_of_their_type_in_staging_columns(
    staged: tuple[CommitPlan, list[str], RecordSpec],
) -> None:
    """Each record type's staged rows: exactly its rows of the batch (not another type's, not
    a reject), in order, with the staging columns' values, also from a slice of a batch."""
    plan, lines, spec = staged
    extra = json.loads(lines[0]) | {"not_in_catalog": 1}
    batch = _batch([*lines, "{not json", json.dumps(extra)], 1, spec)
    assert len(set(batch.column("_record_type").to_pylist()) - {None}) >= 2  # several types to tell apart
    for part in (batch, batch.slice(3, len(lines) - 5)):
        expected_rows = part.to_pylist()
        for record_type, table in plan.tables.items():
            rows, with_extra = staged_rows(part, record_type, table)
            mine = [r for r in expected_rows if r["_record_type"] == record_type]
            names = [name for name, _ in STAGED_SYSTEM]
            typed = [c.name for c in table.columns if c.type.kind != "dynamic"]
            assert rows.schema.names == names + typed
            assert rows.to_pylist() == [
                {**{n: r[n] for n in names}, **{n: r[record_type][n] for n in typed}} for r in mine
            ]
            assert with_extra == sum(r["_extra"] is not None for r in mine)


def _set(batch: pa.RecordBatch, name: str, row: int, value: str) -> pa.RecordBatch:
    values = batch.column(name).to_pylist()
    values[row] = value
    return batch.set_column(batch.schema.get_field_index(name), name, pa.array(values, batch.schema.field(name).type))


def test_a_row_postgresql_refuses_at_staging_is_that_records_reject(
    pg_url: str, staged: tuple[CommitPlan, list[str], RecordSpec]
) -> None:
    """What coercion lets through and PostgreSQL still refuses (here: NUL in a good row's
    source metadata, NUL in a typed text column, NUL in a reject's context) is that record's
    reject, the batch's other rows staged: never a failed batch, never a transient error."""
    plan, lines, spec = staged
    half_0 = _batch([*lines[:19], "not json"], 1, spec)
    assert half_0.column("_errors").null_count == 19
    half_0 = _set(half_0, "_meta", 2, '{"key":"\\u0000"}')  # jsonb refuses \u0000
    typed = [i for i, t in enumerate(half_0.column("_record_type").to_pylist()) if t == "indicator"]
    assert typed[-1] > 2  # another row than the one whose metadata is refused
    struct = half_0.column("indicator")
    names = struct.field(struct.type.get_field_index("name")).to_pylist()
    names[typed[-1]] = "a\x00b"  # text refuses NUL
    children = [pa.array(names, pa.string()) if f.name == "name" else struct.field(i) for i, f in enumerate(struct.type)]
    half_0 = half_0.set_column(
        half_0.schema.get_field_index("indicator"), "indicator",
        pa.StructArray.from_arrays(children, fields=list(struct.type), mask=struct.is_null()),
    )
    half_0 = _set(half_0, "_meta", 19, '{"key":"\\u0000"}')  # the reject's own context
    first = _stage(pg_url, plan, half_0, 0)
    assert sum(first.rows.values()) == 17 and first.rejected == 3
    with connect(pg_url) as conn:
        result = apply_staged(conn, plan, [first, _stage(pg_url, plan, _batch(lines[20:], 21, spec), 1)])
    assert (result["rows_written"], result["rows_rejected"]) == (37, 3)
    with connect(pg_url) as conn:
        rejects = conn.execute("SELECT line, raw, reasons, context FROM idem.rejects ORDER BY line").fetchall()
    assert [line for line, *_ in rejects] == sorted([3, typed[-1] + 1, 20])
    by_line = {line: (raw, reasons, context) for line, raw, reasons, context in rejects}
    assert by_line[3][1][0]["rule"] == "postgres" and "'_meta'" in by_line[3][1][0]["message"]
    assert by_line[3][0] == half_0.column("_payload")[2].as_py() and by_line[3][2] is None
    assert by_line[typed[-1] + 1][1][0]["rule"] == "postgres" and "'name'" in by_line[typed[-1] + 1][1][0]["message"]
    assert [r["rule"] for r in by_line[20][1]] == ["json", "postgres"] and by_line[20][2] is None
