"""Planning a table read on the driver: the current shape's columns, the partitions, the counts.

:func:`plan_read` turns the config and the table as it stands into a
:class:`~idem_platform.read.plan.ReadPlan`: one connection, three short
statements. It lives apart from the plan itself because it needs the driver's
config and a connection, which the executors that carry the plan never do.
"""

from __future__ import annotations

import math
from dataclasses import replace

import psycopg
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import SYSTEM_COLUMNS, TableSpec, table_name
from idem_platform.errors import ConfigError
from idem_platform.migrations import MigrationSource
from idem_platform.postgres.connection import connect
from idem_platform.postgres.current import has_state
from idem_platform.postgres.schema import SCHEMA, qualified_table_name
from idem_platform.postgres.tables import (
    adopt_legacy_tables,
    effective_spec,
    existing_columns,
    table_ident,
)
from idem_platform.read.plan import (
    ERROR_COLUMN,
    PAYLOAD_VERSION,
    ConnectorRules,
    ReadColumn,
    ReadPlan,
)

_SYSTEM_KINDS = {"_schema_version": "int", "_ingested_at": "timestamp", "_payload": "json"}
_CATALOG_KINDS = {"string": "text", "dynamic": "json"}  # others keep their catalog name
ROWS_PER_PARTITION = 125_000
ORDERED_ROWS_PER_PARTITION = 50_000  # `idem read`: each partition reaches the driver whole
MIN_ROWS_PER_PARTITION = 20_000  # below it a table is not worth splitting across the slots
MAX_PARTITIONS = 256
# Rows a plan samples for its bounds. Pages are sampled whole (~20 rows each), so the bounds'
# error follows the pages sampled (~1,000 here: ranges within a few percent), not the rows.
SAMPLE_ROWS = 20_000
MAX_SAMPLED_ROWS = 400_000  # of the whole table, when a filter (a commit) reads a small part of it


def frame_columns(spec: TableSpec, existing: dict[str, str]) -> tuple[ReadColumn, ...]:
    """The frame's columns: idem's system columns, ``_kafka`` when the table has it, the
    catalog's columns (declared and evolved), each retyped column's typed companion,
    ``props``, and the source's error column."""
    columns = [
        ReadColumn(name, _SYSTEM_KINDS.get(name, "text"), name in existing, "system") for name, _ in SYSTEM_COLUMNS
    ]
    if "_kafka" in existing:
        columns.append(ReadColumn("_kafka", "json", True, "meta"))
    for column in spec.columns:
        kind = _CATALOG_KINDS.get(column.type.kind, column.type.kind)
        columns.append(ReadColumn(column.name, kind, column.name in existing, "typed"))
    for column in spec.retyped_columns():
        assert column.retyped is not None and column.typed_column is not None
        columns.append(ReadColumn(column.typed_column, column.retyped.kind, True, "companion"))
    columns.append(ReadColumn("props", "json", "props" in existing, "props"))
    columns.append(ReadColumn(ERROR_COLUMN, "text", False, "error"))
    return tuple(columns)


def connector_rules(config: IdemConfig, record_type: str) -> tuple[tuple[str, ConnectorRules], ...]:
    """Per configured connector (by name, as rows' ``_connector`` holds it), its rules for ``record_type``."""
    return tuple(
        (
            connector.name,
            ConnectorRules(
                version_field=connector.schema_version_field,
                known=frozenset(f for f in (connector.id_field, connector.record_type_field) if f),
                contract=connector.contract_for(record_type),
            ),
        )
        for connector in config.connectors
    )


def plan_read(
    url: str,
    config: IdemConfig,
    record_type: str,
    *,
    commit_id: str | None = None,
    limit: int | None = None,
    parallelism: int = 2,
    ordered: bool = False,
    current: bool = False,
) -> tuple[ReadPlan, dict[int, int]]:
    """Plan a read of ``idem.<record_type>``; return it with the rows per stored version.

    One connection, three short statements: the table's columns, the count per
    ``_schema_version`` (of the rows the read covers) and, for a table worth
    splitting, a page sample of its keys (``ordered``: of ``(_ingested_at, key)``).

    ``current``: of an upsert table, only its current state (one version per identity, none
    of a deleted one); ignored for an append table (its rows are all current).

    Raises:
        ConfigError: an unknown record type, or a ``limit`` below 1.
    """
    if record_type not in config.tables:
        known = ", ".join(sorted(config.tables)) or "none declared"
        raise ConfigError(f"unknown record type {record_type!r} (known: {known})", path=_str(config.source))
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1 (got {limit})")
    declared = config.table_specs[record_type]
    with connect(url, application_name="idem-read-plan") as conn:
        adopt_legacy_tables(conn, [record_type])  # a table of the old name: renamed before it is read
        existing = existing_columns(conn, record_type)
        spec = effective_spec(declared, existing) if existing else declared
        plan = ReadPlan(
            url=url,
            record_type=record_type,
            current_version=declared.schema_version,
            spec=spec,
            columns=frame_columns(spec, existing),
            exists=bool(existing),
            commit_id=commit_id,
            limit=limit,
            ordered=ordered,
            migrations=_migrations(config),
            connectors=connector_rules(config, record_type),
            payload_version=PAYLOAD_VERSION in existing,
            current=current and declared.upsert is not None,
        )
        if not existing:
            return plan, {}
        if plan.current and not has_state(conn, record_type):
            raise ConfigError(
                f"{qualified_table_name(record_type)} has no current state yet (mode: upsert is new): the next ingest builds it "
                "from the history; read the history with --history",
                path=_str(config.source),
            )
        counts = _counts(conn, plan)
        total = sum(counts.values())
        if limit is None:
            plan = replace(plan, bounds=_bounds(conn, plan, total, parallelism))
    return plan, counts


def _migrations(config: IdemConfig) -> MigrationSource:
    return MigrationSource(
        modules=tuple(config.migrations),
        base_dir=str(config.source.parent) if config.source is not None else None,
        current=tuple(sorted((name, table.schema_version) for name, table in config.tables.items())),
    )


def _counts(conn: psycopg.Connection, plan: ReadPlan) -> dict[int, int]:
    """Rows per stored ``_schema_version``, of the rows the plan reads (one statement)."""
    inner = sql.SQL("SELECT _schema_version FROM {}{}{}").format(
        table_ident(plan.record_type), plan.where(), plan.tail(sort=False)
    )
    rows = conn.execute(
        sql.SQL("SELECT _schema_version, count(*) FROM ({}) s GROUP BY 1 ORDER BY 1").format(inner)
    ).fetchall()
    return {int(version): int(count) for version, count in rows}


def partition_count(rows: int, parallelism: int, per_partition: int = ROWS_PER_PARTITION) -> int:
    """How many ranges: ~``per_partition`` rows each, but every slot busy once the table is
    big enough to be worth it."""
    if rows < 2 * MIN_ROWS_PER_PARTITION:
        return 1
    wanted = max(math.ceil(rows / per_partition), min(max(parallelism, 1), rows // MIN_ROWS_PER_PARTITION))
    return min(wanted, MAX_PARTITIONS)


def _bounds(conn: psycopg.Connection, plan: ReadPlan, rows: int, parallelism: int) -> tuple[tuple[str, ...], ...]:
    """Bounds splitting the rows a plan reads into about :func:`partition_count` ranges."""
    count = partition_count(rows, parallelism, ORDERED_ROWS_PER_PARTITION if plan.ordered else ROWS_PER_PARTITION)
    if count <= 1:
        return ()
    # Pages are sampled, then the read's own filter (a commit) applies: aim at the rows read,
    # but never sample more than MAX_SAMPLED_ROWS of the whole table (one commit of a big one).
    stored = conn.execute(
        "SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        [SCHEMA, table_name(plan.record_type)],
    ).fetchone()
    table_rows = max(int(stored[0]) if stored else 0, rows, 1)
    percent = min(100.0, 100.0 * max(SAMPLE_ROWS, 20 * count) / max(rows, 1), 100.0 * MAX_SAMPLED_ROWS / table_rows)
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in plan.range_columns)
    sample = [
        tuple(v.isoformat() if hasattr(v, "isoformat") else v for v in row)
        for row in conn.execute(
            sql.SQL("SELECT {} FROM {} TABLESAMPLE SYSTEM ({}){} ORDER BY {}").format(
                columns, table_ident(plan.record_type), sql.Literal(percent), plan.where(), columns
            )
        ).fetchall()
    ]
    if len(sample) < count:
        return ()
    picked = [sample[len(sample) * i // count] for i in range(1, count)]
    return tuple(dict.fromkeys(picked))  # sorted already; a repeated bound would make an empty range


def _str(path: object) -> str | None:
    return str(path) if path is not None else None
