"""Record-type tables ``idem.<table>``: created and widened from the catalog, never narrowed.

A record type's table is named by :func:`~idem_platform.contract.catalog.table_name`
(``threat-actor`` -> ``idem.threat_actor``): a name no query has to quote. A table that an
earlier version named after the record type itself (``idem."threat-actor"``) is renamed
when first met: :func:`rename_legacy_tables`.

At start-up the declared catalog is reconciled with PostgreSQL under the DDL
advisory lock: missing tables are created, missing columns added (nullable),
and a column whose type differs from the declaration is a configuration error
(DESIGN §3: columns are never dropped, narrowed or retyped). Text columns found
in PostgreSQL but not declared were added by schema evolution; they join the
effective spec so later batches fill them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import (
    RETYPE_KINDS,
    STRING,
    SYSTEM_COLUMNS,
    Column,
    ColumnType,
    TableSpec,
    commit_index_name,
    table_name,
    typed_column_name,
)
from idem_platform.errors import ConfigError
from idem_platform.postgres.current import refresh_current_view, sync_current
from idem_platform.postgres.schema import DDL_LOCK_ID, SCHEMA, qualified_table_name


def table_ident(record_type: str) -> sql.Identifier:
    """``idem.<table>`` of a record type (:func:`~idem_platform.contract.catalog.table_name`),
    as an identifier for composed SQL."""
    return sql.Identifier(SCHEMA, table_name(record_type))


def tables_with_rows(conn: psycopg.Connection, record_types: list[str]) -> frozenset[str]:
    """The record types whose table exists and holds at least one row (one index-free
    look per table: ``EXISTS`` stops at the first visible row)."""
    held = set()
    for record_type in record_types:
        name = table_ident(record_type).as_string(conn)
        regclass = conn.execute("SELECT to_regclass(%s)", [name]).fetchone()  # one row, always
        if regclass is None or regclass[0] is None:
            continue
        query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table_ident(record_type))
        exists = conn.execute(query).fetchone()  # one row, always
        if exists is not None and exists[0]:
            held.add(record_type)
    return frozenset(held)


def existing_columns(conn: psycopg.Connection, record_type: str) -> dict[str, str]:
    """``{column: formatted type}`` of a record type's table; empty when it does not exist."""
    rows = conn.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """,
        [SCHEMA, table_name(record_type)],
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
            sql.Identifier(commit_index_name(table_name(spec.record_type))), table_ident(spec.record_type)
        )
    )


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

    A table an earlier version named after its record type (``idem."threat-actor"``) is
    renamed to its table name first (:func:`rename_legacy_tables`).

    Raises:
        ConfigError: a declared column exists with another type; or a record type's table
            exists under both its old and its new name.
    """
    effective: dict[str, TableSpec] = {}
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        conn.execute(
            f"SELECT 1 FROM {SCHEMA}.catalog WHERE record_type = ANY(%s) ORDER BY record_type FOR UPDATE",
            [sorted(specs)],
        )
        rename_legacy_tables(conn, specs)
        _refuse_legacy_twins(conn, specs)
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
                        f"column {column.name!r} of table {qualified_table_name(name)} is {found} in PostgreSQL but "
                        f"{column.type} ({column.type.postgres}) in idem.yaml; columns are never "
                        "retyped or narrowed (add a new column, or bump schema_version with a migration)",
                        key=f"tables.{name}.columns.{column.name}",
                    )
            effective[name] = effective_spec(spec, existing_columns(conn, name))
            sync_current(conn, effective[name])
        for name in sorted(effective):
            record_catalog(conn, effective[name])
    return {name: effective[name] for name in specs}


def _relation(conn: psycopg.Connection, name: str) -> int | None:
    """The oid of relation ``idem.<name>`` (table or index), ``None`` when there is none."""
    row = conn.execute("SELECT to_regclass(%s)::oid", [sql.Identifier(SCHEMA, name).as_string(conn)]).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def legacy_tables(conn: psycopg.Connection, record_types: Iterable[str]) -> list[str]:
    """The record types (holding ``-``) whose table still has the name an earlier version gave
    it, the record type itself (``idem."threat-actor"``)."""
    return sorted({rt for rt in record_types if table_name(rt) != rt and _relation(conn, rt) is not None})


def rename_legacy_tables(conn: psycopg.Connection, record_types: Iterable[str]) -> list[str]:
    """Rename each legacy table (:func:`legacy_tables`) to its table name, with its
    ``_commit_id`` index and primary key; return the record types renamed.

    The caller holds the DDL lock (``DDL_LOCK_ID``) in its transaction, and passes the
    record types its config declares: only a declared record type's own old table is
    renamed, never one that a record type no longer declared left behind (it could
    become the table of another type, ``threat_actor``). A table is renamed only when its
    new name is free: when both exist, both are left as they are and :func:`sync_tables`
    refuses to go on (which one holds the rows is the operator's call). The index and key
    are renamed too, so the table looks exactly as if created under its new name.
    """
    renamed = []
    for record_type in legacy_tables(conn, record_types):
        table = table_name(record_type)
        oid = _relation(conn, record_type)
        if _relation(conn, table) is not None:
            continue
        conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(sql.Identifier(SCHEMA, record_type), sql.Identifier(table))
        )
        old_index, new_index = commit_index_name(record_type), commit_index_name(table)
        if _relation(conn, old_index) is not None and _relation(conn, new_index) is None:
            conn.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}").format(sql.Identifier(SCHEMA, old_index), sql.Identifier(new_index))
            )
        key = conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s AND contype = 'p'", [oid]).fetchone()
        if key is not None and "-" in key[0] and _relation(conn, key[0].replace("-", "_")) is None:
            conn.execute(
                sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                    sql.Identifier(SCHEMA, table), sql.Identifier(key[0]), sql.Identifier(key[0].replace("-", "_"))
                )
            )
        renamed.append(record_type)
    return renamed


def adopt_legacy_tables(conn: psycopg.Connection, record_types: Iterable[str]) -> list[str]:
    """Rename the record types' old tables (:func:`rename_legacy_tables`) in a transaction of
    their own under the DDL lock; return the record types renamed.

    For the paths that read a table without syncing the catalog first (``idem read``, the
    table assets' IO manager): an old table is found under its new name before the next
    commit renames it. Record types without ``-`` cost nothing, the others one look each.
    """
    dashed = [rt for rt in record_types if table_name(rt) != rt]
    if not dashed:
        return []
    with conn.transaction():
        if not legacy_tables(conn, dashed):
            return []
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        return rename_legacy_tables(conn, dashed)


def _refuse_legacy_twins(conn: psycopg.Connection, record_types: Iterable[str]) -> None:
    """Refuse a record type whose table exists under its old name and its new one: rows
    committed under either would be invisible in the other, and only the operator can say
    which table holds the record type's rows.

    Raises:
        ConfigError: naming both tables.
    """
    for record_type in legacy_tables(conn, record_types):
        old = f'{SCHEMA}."{record_type}"'  # [a-z0-9_-]: nothing to escape
        raise ConfigError(
            f"record type {record_type!r}: both {old} (its table's name before table names spelt '-' as '_') "
            f"and {qualified_table_name(record_type)} exist; move the rows of one into the other and drop it "
            f"(idem renames {old} to {qualified_table_name(record_type)} only when the new name is free)",
            key=f"tables.{record_type}",
        )


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
