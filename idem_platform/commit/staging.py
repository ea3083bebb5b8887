"""Per-commit staging tables and the executors' COPY into them.

Each commit gets one UNLOGGED table per record type plus one for rejects in
schema ``idem_staging``. Executors COPY their partitions in (CSV rendered by
Arrow's C++ writer, never row by row in Python), each row tagged with its task
attempt through the ``_attempt`` column's default, so the promoting transaction
can take exactly the attempts whose commit messages reached the driver.
Staging columns already have the final PostgreSQL types: JSON and arrays are
parsed by the parallel COPYs, not by the single promoting INSERT.
"""

from __future__ import annotations

import io
import json
import time

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from psycopg import sql

from idem_platform.catalog import Column, TableSpec
from idem_platform.commit.plan import CommitPlan
from idem_platform.postgres.schema import STAGING_SCHEMA

ATTEMPT_SETTING = "idem.attempt"
STAGED_SYSTEM: tuple[tuple[str, str], ...] = (
    ("_pos", "bigint NOT NULL"),
    ("_idempotency_key", 'text COLLATE "C" NOT NULL'),
    ("_external_id", "text NOT NULL"),
    ("_content_hash", "text NOT NULL"),
    ("_source", "text"),
    ("_payload", "jsonb NOT NULL"),
    ("_extra", "jsonb"),
    ("_props", "jsonb"),
)
STAGED_REJECT: tuple[tuple[str, str], ...] = (
    ("_pos", "bigint NOT NULL"),
    ("_raw", "text NOT NULL"),
    ("_raw_length", "bigint NOT NULL"),
    ("_errors", "jsonb NOT NULL"),
)
_CSV = pacsv.WriteOptions(include_header=False, batch_size=4096)


def staged_columns(spec: TableSpec) -> list[Column]:
    """The typed columns staged: all but ``dynamic`` ones, which the promote takes
    from ``_payload`` (``_payload -> 'field'``) instead of parsing them twice."""
    return [c for c in spec.columns if c.type.kind != "dynamic"]


def staged_ident(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(STAGING_SCHEMA), sql.Identifier(name))


def _attempt_column() -> sql.Composable:
    return sql.SQL("_attempt text NOT NULL DEFAULT current_setting({})").format(
        sql.Literal(ATTEMPT_SETTING)
    )


def create_staging(conn: psycopg.Connection, plan: CommitPlan) -> None:
    """Create the commit's staging tables (own transaction)."""
    with conn.transaction():
        for record_type, spec in sorted(plan.tables.items()):
            columns = [_attempt_column()]
            columns += [sql.SQL(f"{{}} {ddl}").format(sql.Identifier(n)) for n, ddl in STAGED_SYSTEM]
            columns += [
                sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type.postgres))
                for c in staged_columns(spec)
            ]
            _create(conn, plan.staging_table(record_type), columns, plan)
        columns = [_attempt_column()]
        columns += [sql.SQL(f"{{}} {ddl}").format(sql.Identifier(n)) for n, ddl in STAGED_REJECT]
        _create(conn, plan.rejects_table, columns, plan)


def _create(conn: psycopg.Connection, name: str, columns: list[sql.Composable], plan: CommitPlan) -> None:
    conn.execute(
        sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(staged_ident(name), sql.SQL(", ").join(columns))
    )
    comment = {"commit_id": plan.commit_id, "owner": plan.owner, "created_at": time.time()}
    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(staged_ident(name), sql.Literal(json.dumps(comment)))
    )


def drop_staging(conn: psycopg.Connection, plan: CommitPlan) -> None:
    """Drop the commit's staging tables, in the caller's transaction (or autocommit)."""
    for name in plan.staging_tables():
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(staged_ident(name)))


def drop_commit_staging(conn: psycopg.Connection, commit_id: str) -> int:
    """Drop every staging table of ``commit_id`` (a dead run's leftovers)."""
    prefix = "c" + commit_id.replace("-", "") + "_"
    return _drop_where(conn, "c.relname LIKE %s", [prefix + "%"])


def drop_stale_staging(conn: psycopg.Connection, older_than_seconds: int) -> int:
    """Drop staging tables created more than ``older_than_seconds`` ago (the purge schedule)."""
    return _drop_where(
        conn,
        "(obj_description(c.oid, 'pg_class')::jsonb ->> 'created_at')::double precision "
        "< extract(epoch FROM now()) - %s",
        [older_than_seconds],
    )


def _drop_where(conn: psycopg.Connection, condition: str, params: list[object]) -> int:
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE n.nspname = %s AND c.relkind = 'r' AND {condition}",
        [STAGING_SCHEMA, *params],
    ).fetchall()
    for (name,) in rows:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(staged_ident(name)))
    return len(rows)


def _vector_literal(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A list<float32> column as PostgreSQL array literals ``{1,2.5,…}`` (vectorised)."""
    as_text = pc.cast(column, pa.list_(pa.string()))
    joined = pc.binary_join(as_text, ",")
    return pc.binary_join_element_wise("{", joined, "}", "")


def _render_column(array: pa.Array) -> pa.Array:
    kind = array.type
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind):
        return _vector_literal(array)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pc.cast(array, pa.string())
    return array


def rows_csv(batch: pa.RecordBatch, record_type: str, spec: TableSpec) -> tuple[bytes, int, int]:
    """CSV (staging column order) of the batch's rows of ``record_type``.

    Returns:
        ``(csv, rows, rows carrying unknown fields in _extra)``.
    """
    rows = batch.filter(pc.equal(batch.column("_record_type"), record_type))
    if rows.num_rows == 0:
        return b"", 0, 0
    typed = rows.column(record_type)
    arrays = [rows.column(name) for name, _ in STAGED_SYSTEM]
    names = [name for name, _ in STAGED_SYSTEM]
    for index, column in enumerate(spec.columns):
        if column.type.kind == "dynamic":
            continue
        arrays.append(_render_column(typed.field(index)))
        names.append(column.name)
    with_extra = rows.num_rows - rows.column("_extra").null_count
    return _csv(pa.Table.from_arrays(arrays, names=names)), rows.num_rows, with_extra


def rejects_csv(batch: pa.RecordBatch) -> tuple[bytes, int]:
    """CSV of the batch's rejects."""
    rows = batch.filter(pc.is_valid(batch.column("_errors")))
    if rows.num_rows == 0:
        return b"", 0
    names = [name for name, _ in STAGED_REJECT]
    return _csv(pa.Table.from_arrays([rows.column(n) for n in names], names=names)), rows.num_rows


def _csv(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink, _CSV)
    return sink.getvalue()


class StagingWriter:
    """One task attempt's COPY stream into the commit's staging tables.

    Args:
        url: PostgreSQL URL reachable from this executor.
        plan: the commit plan.
        attempt: a unique id of this task attempt.
    """

    def __init__(self, url: str, plan: CommitPlan, attempt: str) -> None:
        self.plan = plan
        self.attempt = attempt
        self.conn = psycopg.connect(url, autocommit=True, application_name=f"idem-stage-{attempt[:8]}")
        self.conn.execute("SELECT set_config(%s, %s, false)", [ATTEMPT_SETTING, attempt])
        self.rows: dict[str, int] = {}
        self.with_extra: dict[str, int] = {}
        self.rejected = 0

    def _copy(self, table: str, columns: list[str], data: bytes) -> int:
        statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
            staged_ident(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        )
        with self.conn.cursor() as cursor:
            with cursor.copy(statement) as copy:
                copy.write(data)
            return cursor.rowcount

    def write(self, batch: pa.RecordBatch) -> None:
        """Stage one batch of the ``coerced`` frame."""
        for record_type, spec in self.plan.tables.items():
            data, count, with_extra = rows_csv(batch, record_type, spec)
            if count:
                columns = [n for n, _ in STAGED_SYSTEM] + [c.name for c in staged_columns(spec)]
                copied = self._copy(self.plan.staging_table(record_type), columns, data)
                assert copied == count, f"COPY staged {copied} of {count} rows"
                self.rows[record_type] = self.rows.get(record_type, 0) + count
                self.with_extra[record_type] = self.with_extra.get(record_type, 0) + with_extra
        data, count = rejects_csv(batch)
        if count:
            self._copy(self.plan.rejects_table, [n for n, _ in STAGED_REJECT], data)
            self.rejected += count

    def close(self) -> None:
        self.conn.close()
