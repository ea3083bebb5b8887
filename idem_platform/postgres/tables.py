"""Record-type tables ``idem.<record_type>``: created and widened from the catalog, never narrowed.

At start-up the declared catalog is reconciled with PostgreSQL under the DDL
advisory lock: missing tables are created, missing columns added (nullable),
and a column whose type differs from the declaration is a configuration error
(DESIGN §3: columns are never dropped, narrowed or retyped). Text columns found
in PostgreSQL but not declared were added by schema evolution; they join the
effective spec so later batches fill them.
"""

from __future__ import annotations

import hashlib
import json

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import (
    MAX_IDENTIFIER_BYTES,
    RETYPE_KINDS,
    STRING,
    SYSTEM_COLUMNS,
    Column,
    ColumnType,
    TableSpec,
    typed_column_name,
)
from idem_platform.errors import ConfigError
from idem_platform.postgres.current import refresh_current_view, sync_current
from idem_platform.postgres.schema import DDL_LOCK_ID, SCHEMA


def table_ident(record_type: str) -> sql.Composed:
    """``idem."<record_type>"``, quoted (record types may contain ``-``)."""
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(record_type))


def tables_with_rows(conn: psycopg.Connection, record_types: list[str]) -> frozenset[str]:
    """The record types whose table exists and holds at least one row (one index-free
    look per table: ``EXISTS`` stops at the first visible row)."""
    held = set()
    for record_type in record_types:
        name = table_ident(record_type).as_string(conn)  # quoted: a record type may hold "-" or quotes
        regclass = conn.execute("SELECT to_regclass(%s)", [name]).fetchone()  # one row, always
        if regclass is None or regclass[0] is None:
            continue
        query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table_ident(record_type))
        exists = conn.execute(query).fetchone()  # one row, always
        if exists is not None and exists[0]:
            held.add(record_type)
    return frozenset(held)


def existing_columns(conn: psycopg.Connection, record_type: str) -> dict[str, str]:
    """``{column: formatted type}`` of ``idem.<record_type>``; empty when it does not exist."""
    rows = conn.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """,
        [SCHEMA, record_type],
    ).fetchall()
    return {name: type_ for name, type_ in rows}


def _create(conn: psycopg.Connection, spec: TableSpec) -> None:
    parts: list[sql.Composable] = [
        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(ddl)) for n, ddl in SYSTEM_COLUMNS
    ]
    parts += [
        sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type.postgres)) for c in spec.columns
    ]
    parts.append(sql.SQL("props jsonb"))
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(table_ident(spec.record_type), sql.SQL(", ").join(parts)))
    conn.execute(
        sql.SQL("CREATE INDEX {} ON {} (_commit_id)").format(
            sql.Identifier(_index_name(spec.record_type)), table_ident(spec.record_type)
        )
    )


def _index_name(record_type: str) -> str:
    """``<record_type>_commit_id``, or for a long name its head and a digest: PostgreSQL
    cuts names at 63 bytes, and two long record types must not share one index name."""
    name = f"{record_type}_commit_id"
    if len(name) <= MAX_IDENTIFIER_BYTES:
        return name
    return f"{record_type[:40]}_{hashlib.sha256(record_type.encode()).hexdigest()[:12]}_commit_id"


def add_column(conn: psycopg.Connection, record_type: str, column: Column) -> None:
    """``ALTER TABLE … ADD COLUMN`` (nullable, so old rows read null); an upsert table's
    current view gains it in the same transaction."""
    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
            table_ident(record_type), sql.Identifier(column.name), sql.SQL(column.type.postgres)
        )
    )
    refresh_current_view(conn, record_type)


def add_system_column(conn: psycopg.Connection, record_types: list[str], name: str, ddl: str) -> None:
    """Add a system column (``_kafka``) to the tables that lack it, under the DDL lock.

    Tables that have it already are not touched, so no lock is taken on them.
    """
    lacking = sorted(rt for rt in record_types if name not in existing_columns(conn, rt))
    if not lacking:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        for record_type in lacking:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    table_ident(record_type), sql.Identifier(name), sql.SQL(ddl)
                )
            )
            refresh_current_view(conn, record_type)


def effective_spec(spec: TableSpec, columns: dict[str, str]) -> TableSpec:
    """The declared spec plus text columns that evolution added earlier, each marked
    with its retype (``idem retype``) when its typed companion column exists."""
    system = {name for name, _ in SYSTEM_COLUMNS} | {"props"}
    declared = set(spec.column_names())
    evolved = [
        name
        for name, type_ in columns.items()
        if name not in system and name not in declared and type_ == STRING.postgres
    ]
    widened = spec.with_evolved(evolved)
    return widened.with_retypes(retypes(widened, columns))


def retypes(spec: TableSpec, columns: dict[str, str]) -> dict[str, ColumnType]:
    """Text column -> retyped type, for the spec's text columns whose typed companion
    column (:func:`~idem_platform.contract.catalog.typed_column_name`) exists with its type."""
    found: dict[str, ColumnType] = {}
    for column in spec.columns:
        if column.type != STRING:
            continue
        for kind in RETYPE_KINDS:
            target = ColumnType(kind)
            if columns.get(typed_column_name(column.name, kind)) == target.postgres:
                found[column.name] = target
                break
    return found


def sync_tables(conn: psycopg.Connection, specs: dict[str, TableSpec]) -> dict[str, TableSpec]:
    """Create/widen every declared table; return the effective specs.

    Runs in its own transaction under the DDL advisory lock, and keeps the
    commit's lock order (:class:`idem_platform.write.apply.transaction.ApplyTransaction`):
    catalog rows, then tables, each in name order, so an applying transaction that widens a
    table and this sync never wait on each other in a cycle.

    Raises:
        ConfigError: a declared column exists with another type.
    """
    effective: dict[str, TableSpec] = {}
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        conn.execute(
            f"SELECT 1 FROM {SCHEMA}.catalog WHERE record_type = ANY(%s) ORDER BY record_type FOR UPDATE",
            [sorted(specs)],
        )
        for name in sorted(specs):
            spec = specs[name]
            columns = existing_columns(conn, name)
            if not columns:
                _create(conn, spec)
                columns = existing_columns(conn, name)
            for column in spec.columns:
                found = columns.get(column.name)
                if found is None:
                    add_column(conn, name, column)
                elif found != column.type.postgres:
                    raise ConfigError(
                        f"column {column.name!r} of table idem.{name} is {found} in PostgreSQL but "
                        f"{column.type} ({column.type.postgres}) in idem.yaml; columns are never "
                        "retyped or narrowed (add a new column, or bump schema_version with a migration)",
                        key=f"tables.{name}.columns.{column.name}",
                    )
            effective[name] = effective_spec(spec, existing_columns(conn, name))
            sync_current(conn, effective[name])
        for name in sorted(effective):
            record_catalog(conn, effective[name])
    return {name: effective[name] for name in specs}


def record_catalog(conn: psycopg.Connection, spec: TableSpec) -> None:
    """Upsert the ``idem.catalog`` row of a record type."""
    # "promoted_*": keys older than the word "retype", kept: queries of idem.catalog read them.
    columns = [
        {"name": c.name, "type": str(c.type), "required": c.required, "evolved": c.evolved}
        | ({"promoted_to": str(c.retyped), "promoted_column": c.typed_column} if c.retyped is not None else {})
        for c in spec.columns
    ]
    conn.execute(
        f"""
        INSERT INTO {SCHEMA}.catalog (record_type, schema_version, columns, updated_at)
        VALUES (%s, %s, %s, now())
        ON CONFLICT (record_type) DO UPDATE
        SET schema_version = EXCLUDED.schema_version, columns = EXCLUDED.columns,
            updated_at = now()
        WHERE catalog.columns IS DISTINCT FROM EXCLUDED.columns
           OR catalog.schema_version IS DISTINCT FROM EXCLUDED.schema_version
        """,
        [spec.record_type, spec.schema_version, json.dumps(columns)],
    )
