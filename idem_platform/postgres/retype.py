"""Retyping evolved text columns (``idem retype TYPE COLUMN --to KIND``, was ``idem promote``).

Schema evolution adds an unknown field as a nullable ``text`` column, and it stays
text. Retyping gives such a column a **typed companion** beside it (never a
rewrite of the text column, which keeps every value as it was accepted):

* the companion is named by :func:`~idem_platform.contract.catalog.typed_column_name`
  (``_score__long``): ``_``-prefixed, so no record field can ever evolve into it;
* it is added under the lock order of the commit path — the DDL advisory lock,
  the record type's catalog row ``FOR UPDATE``, then the table (``ALTER TABLE``
  in short ``lock_timeout`` tries, the whole transaction retried, so readers and
  ingests wait 2 s at most per try) — and the catalog row records it
  (``promoted_to``, ``promoted_column``: keys older than the word "retype", kept because
  users' queries of ``idem.catalog`` read them);
* from then on every commit fills it from the same text (see
  :mod:`idem_platform.write.apply.rows`), and existing rows are **backfilled** in
  batches of ``batch_rows`` (one transaction each, keyset order on the primary
  key; only rows whose companion is null and text is not: resumable, idempotent);
* the typed value is what the type's ingest converter (DESIGN §3) makes of the
  text *read as JSON* (:func:`reference_cast`): computed in PostgreSQL by the safe
  casts of ``sql/004_promotion.sql`` (``idem.promote_<kind>``: stored names older than
  the word "retype", kept), which never raise,
  for the backfill and for new rows alike. A text that does not cast leaves the
  companion null: it is no reject (the record was accepted before), and the
  report counts it with examples.

Readers get ``coalesce(companion, text)`` under the column's name from ``idem
read`` (:func:`row_json`); SQL users select
``coalesce(to_jsonb("_score__long"), to_jsonb(score))`` or the companion itself.
No Dagster here: ``idem retype`` and the Dagster job ``idem_retype`` both
call :func:`retype_column`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from idem_platform.coercion.converters import FieldError, converter_for
from idem_platform.contract.canonical import InvalidJSON, parse_and_canonicalize
from idem_platform.contract.catalog import (
    RETYPE_KINDS,
    Column,
    ColumnType,
    TableSpec,
    typed_column_name,
)
from idem_platform.errors import TerminalError, TransientError
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import DDL_LOCK_ID, SCHEMA, qualified_table_name
from idem_platform.postgres.tables import (
    add_column,
    effective_spec,
    existing_columns,
    record_catalog,
    rename_legacy_tables,
    table_ident,
)

DEFAULT_BATCH_ROWS = 50_000
LOCK_TRY_SECONDS = 2.0  # each try to lock the catalog row and the table gives up after this
EXAMPLES = 5  # rows that did not cast, shown per run
EXAMPLE_CHARS = 200


class RetypeRefused(TerminalError):
    """The column cannot be retyped (unknown, declared, retyped to another type...)."""


class RetypeLockTimeout(TransientError):
    """The catalog row or the table stayed locked by others past the retype's lock timeout."""


def retype_cast(target: Column | ColumnType | str) -> sql.Composable:
    """The safe cast function of a retype's target: ``idem.promote_long`` ... (the SQL
    functions keep the name they were stored under, see ``sql/004_promotion.sql``)."""
    if isinstance(target, Column):
        if target.retyped is None:
            raise ValueError(f"column {target.name!r} is not retyped")
        target = target.retyped
    kind = target.kind if isinstance(target, ColumnType) else target
    if kind not in RETYPE_KINDS:
        raise ValueError(f"no retype to {kind!r}")
    return sql.Identifier(SCHEMA, f"promote_{kind}")


# --- the rules, in Python (what the SQL casts implement; the tests hold them together)

_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def text_as_json(text: str) -> Any:
    """A retyped column's text read as JSON: a JSON number, ``true`` or ``false`` is that
    value (as the contract's parser reads it: ``1e400`` is none); any other text is the
    string itself (an RFC 3339 timestamp, ``n/a``, ``"42"`` with its quotes)."""

    if text == "true":
        return True
    if text == "false":
        return False
    if len(text) <= 1000 and _JSON_NUMBER.fullmatch(text):
        try:
            return parse_and_canonicalize(text.encode("ascii"))[0]
        except InvalidJSON:
            return text
    return text


def reference_cast(kind: str, text: str) -> Any:
    """The typed value of ``text`` retyped to ``kind``, or ``None`` when it does not cast.

    The type's ingest converter (:func:`~idem_platform.coercion.converters.converter_for`)
    applied to :func:`text_as_json`; timestamps rounded to microseconds half up, as
    the ingest path stores them. ``idem.promote_<kind>`` computes the same in SQL.
    """

    try:
        value = converter_for(Column("value", ColumnType(kind)))(text_as_json(text))
    except FieldError:
        return None
    if kind == "timestamp":
        micros = value // 1000 + (value % 1000 >= 500)
        return _EPOCH + timedelta(microseconds=micros)
    if kind == "real":
        return float(value)
    return value


# --- reading


def row_json(spec: TableSpec, columns: dict[str, str], alias: str = "t") -> sql.Composable:
    """A row of ``idem.<record_type>`` as jsonb, each retyped column holding
    ``coalesce(companion, text)`` under its own name and no companion shown beside it."""
    row = sql.Identifier(alias)
    retyped = effective_spec(spec, columns).retyped_columns()
    if not retyped:
        return sql.SQL("to_jsonb({})").format(row)
    companions = sql.SQL(", ").join(sql.Literal(c.typed_column) for c in retyped)
    values = sql.SQL(", ").join(
        sql.SQL("{}, coalesce(to_jsonb({}.{}), to_jsonb({}.{}))").format(
            sql.Literal(c.name), row, sql.Identifier(str(c.typed_column)), row, sql.Identifier(c.name)
        )
        for c in retyped
    )
    return sql.SQL("(to_jsonb({}) - ARRAY[{}]::text[]) || jsonb_build_object({})").format(row, companions, values)


# --- retyping


def retype_column(
    url: str,
    spec: TableSpec,
    column: str,
    to: str,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    lock_timeout_seconds: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Retype evolved text column ``column`` of ``spec``'s table to ``to``, then backfill.

    Args:
        url: PostgreSQL.
        spec: the record type as ``idem.yaml`` declares it (its evolved columns are
            read from PostgreSQL).
        column: the evolved text column.
        to: ``long``, ``real``, ``timestamp`` or ``bool``.
        batch_rows: rows per backfill transaction.
        lock_timeout_seconds: how long the DDL may keep trying for its locks.
        progress: called with a line per backfill batch.

    Returns:
        The report: ``record_type, column, to, typed_column, added``
        (``False``: retyped before, this run only resumed the backfill),
        ``rows_retyped, rows_not_cast, not_cast_examples`` (up to 5
        ``{_idempotency_key, value}``), ``batches, batch_rows, seconds``; and
        ``rows_promoted``, ``rows_retyped``'s former name, until the next release.

    Raises:
        RetypeRefused: unknown table or column, a declared or system column, a
            column retyped to another type, a bad ``to`` or ``batch_rows``.
        RetypeLockTimeout: the locks stayed taken past ``lock_timeout_seconds``.
    """
    if to not in RETYPE_KINDS:
        raise RetypeRefused(f"cannot retype to {to!r}: the types a text column is retyped to are {', '.join(RETYPE_KINDS)}")
    if batch_rows < 1:
        raise RetypeRefused(f"batch rows must be at least 1 (got {batch_rows})")
    started = time.monotonic()
    with connect(url, autocommit=True, application_name="idem-retype") as conn:
        added, typed = _add_companion(conn, spec, column, ColumnType(to), lock_timeout_seconds)
        report: dict[str, Any] = {
            "record_type": spec.record_type,
            "column": column,
            "to": to,
            "typed_column": typed,
            "added": added,
        }
        report.update(
            _backfill(conn, spec.record_type, column, typed, to, batch_rows, lock_timeout_seconds, progress)
        )
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


def _set_lock_timeout(conn: psycopg.Connection, seconds: float) -> None:
    conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{max(1, int(seconds * 1000))}ms"])


def _with_lock_tries(conn: psycopg.Connection, what: str, timeout: float, work: Callable[[], Any]) -> Any:
    """Run ``work`` in a transaction whose lock waits end after :data:`LOCK_TRY_SECONDS`;
    on a lock timeout or a lost deadlock, roll everything back (releasing what it held,
    so the commits it made wait can go on), pause, and try again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with conn.transaction():
                _set_lock_timeout(conn, min(LOCK_TRY_SECONDS, timeout))
                return work()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            if time.monotonic() >= deadline:
                raise RetypeLockTimeout(
                    f"waited {timeout:g} s for the locks on {what}: other sessions kept them (see pg_locks / "
                    "pg_stat_activity); nothing was changed by the last try, run the retype again"
                ) from exc
            time.sleep(0.5)


def _add_companion(
    conn: psycopg.Connection, spec: TableSpec, column: str, target: ColumnType, timeout: float
) -> tuple[bool, str]:
    """Check the column and add its typed companion (one transaction); ``(added now, name)``."""
    record_type = spec.record_type
    typed = typed_column_name(column, target.kind)

    def work() -> bool:
        # The one lock order: DDL lock, catalog row, then the table.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        conn.execute(f"SELECT 1 FROM {SCHEMA}.catalog WHERE record_type = %s FOR UPDATE", [record_type])
        rename_legacy_tables(conn, [record_type])  # a table of the old name, no commit since: its new name
        columns = existing_columns(conn, record_type)
        current = _retypable(spec, column, target, columns)
        if current.retyped is not None:
            return False  # retyped before, to this type: only the backfill resumes
        add_column(conn, record_type, Column(typed, target))
        conn.execute(
            sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(
                table_ident(record_type),
                sql.Identifier(typed),
                sql.Literal(f"idem: text column {column} retyped to {target} (idem retype)"),
            )
        )
        record_catalog(conn, effective_spec(spec, existing_columns(conn, record_type)))
        return True

    added = _with_lock_tries(conn, f"the catalog row and table of {qualified_table_name(record_type)}", timeout, work)
    return bool(added), typed


def _retypable(spec: TableSpec, column: str, target: ColumnType, columns: dict[str, str]) -> Column:
    """The column as it is now, if it may be retyped to ``target``.

    Raises:
        RetypeRefused: saying why not.
    """
    table = qualified_table_name(spec.record_type)
    if not columns:
        raise RetypeRefused(f"table {table} does not exist yet: nothing was ingested into it, so it has no evolved columns")
    current = effective_spec(spec, columns)
    by_name = {c.name: c for c in current.columns}
    evolved = sorted(c.name for c in current.columns if c.evolved)
    found = by_name.get(column)
    if found is None:
        if column in columns:
            raise RetypeRefused(
                f"column {column!r} of {table} is one of idem's own ({columns[column]}), not an evolved text column"
            )
        raise RetypeRefused(
            f"{table} has no column {column!r} (its evolved text columns: {', '.join(evolved) or 'none'})"
        )
    if not found.evolved:
        raise RetypeRefused(
            f"column {column!r} of {table} is declared in idem.yaml ({found.type}), not evolved: declared columns "
            "change in idem.yaml, only evolved text columns are retyped"
        )
    if found.retyped is not None and found.retyped != target:
        raise RetypeRefused(
            f"column {column!r} of {table} is already retyped to {found.retyped} (column {found.typed_column}); "
            f"a column is retyped once, not to {target}"
        )
    typed = typed_column_name(column, target.kind)
    if found.retyped is None and typed in columns:
        raise RetypeRefused(
            f"{table} already has a column {typed!r} ({columns[typed]}) that is not a {target} companion of {column!r}"
        )
    return found


def _backfill(
    conn: psycopg.Connection,
    record_type: str,
    column: str,
    typed: str,
    kind: str,
    batch_rows: int,
    timeout: float,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    """Fill the companion of existing rows, ``batch_rows`` rows per transaction, in
    primary-key order from the start: only rows whose companion is null and whose
    text is not (so a rerun, or a run after a crash, resumes where the work is)."""
    statement = sql.SQL(
        """
        WITH batch AS (
            SELECT t._idempotency_key AS key, t.{text} AS value, {cast}(t.{text}) AS typed
            FROM {table} t
            WHERE t._idempotency_key > %(after)s AND t.{typed} IS NULL AND t.{text} IS NOT NULL
            ORDER BY t._idempotency_key
            LIMIT %(limit)s
        ), updated AS (
            UPDATE {table} t SET {typed} = b.typed
            FROM batch b
            WHERE t._idempotency_key = b.key AND b.typed IS NOT NULL AND t.{typed} IS NULL
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM updated), (SELECT max(key) FROM batch),
               (SELECT count(*) FROM batch WHERE typed IS NULL),
               (SELECT coalesce(jsonb_agg(jsonb_build_array(key, left(value, %(chars)s)) ORDER BY key), '[]')
                FROM (SELECT key, value FROM batch WHERE typed IS NULL ORDER BY key LIMIT %(examples)s) x)
        """
    ).format(
        table=table_ident(record_type),
        text=sql.Identifier(column),
        typed=sql.Identifier(typed),
        cast=retype_cast(kind),
    )
    after = ""  # every key sorts after it (keys are never empty)
    retyped = not_cast = batches = 0
    examples: list[dict[str, str]] = []
    while True:
        params = {"after": after, "limit": batch_rows, "chars": EXAMPLE_CHARS, "examples": EXAMPLES}

        def work(params: dict[str, Any] = params) -> Any:
            return conn.execute(statement, params).fetchone()

        scanned, updated, last, failed, sample = _with_lock_tries(conn, f"rows of {qualified_table_name(record_type)}", timeout, work)
        if scanned:
            batches += 1
            retyped += updated
            not_cast += failed
            examples += [{"_idempotency_key": k, "value": v} for k, v in sample][: EXAMPLES - len(examples)]
            if progress is not None:
                progress(
                    f"{qualified_table_name(record_type)}.{column} -> {kind}: batch {batches}: {updated:,} retyped, "
                    f"{failed:,} did not cast"
                )
        if scanned < batch_rows:
            break
        after = last
    return {
        "rows_retyped": retyped,
        "rows_promoted": retyped,  # the former key, kept until the next release (CHANGELOG)
        "rows_not_cast": not_cast,
        "not_cast_examples": examples,
        "batches": batches,
        "batch_rows": batch_rows,
    }


def human_report(report: dict[str, Any]) -> str:
    """A retype's report for a person at a terminal."""
    head = (
        f"{qualified_table_name(report['record_type'])}.{report['column']} retyped to {report['to']} "
        f"(column {report['typed_column']}, {'added now' if report['added'] else 'already there'})"
    )
    lines = [
        head,
        f"  backfill: {report['rows_retyped']:,} rows retyped, {report['rows_not_cast']:,} did not cast "
        f"(text kept, typed null), {report['batches']:,} batch(es) of at most {report['batch_rows']:,} rows, "
        f"{report.get('seconds', 0):.1f} s",
    ]
    lines += [f"  did not cast: {e['_idempotency_key']}  {e['value']!r}" for e in report["not_cast_examples"]]
    return "\n".join(lines)
