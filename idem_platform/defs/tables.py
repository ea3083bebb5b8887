"""The warehouse tables as Dagster assets: ``idem/<record_type>`` for each record type's table.

Each record type a connector writes is one asset, keyed ``["idem", <record_type>]``
(the PostgreSQL schema and, as Dagster's SQL integrations key tables, the table: for a
record type with ``-`` the key keeps the record type as written, ``idem/threat-actor``,
while its ``dagster/table_name`` is the real table, ``idem.threat_actor``), in the
group ``idem_tables``, downstream of the ``<connector>/committed`` asset of every
connector that writes it. It is an :class:`~dagster.AssetSpec`, not a materializable
asset: only the connectors' exactly-once commits write the table, and the UI must not
offer a "Materialize" that would write it any other way. Instead,

* every commit that writes rows reports a materialization of each table it wrote
  (:func:`table_materializations`, from the ``committed`` asset's body) with
  the table's row count, its column schema as PostgreSQL has it now (evolution
  widens it), the schema version, the commit id and the rows written;
* the asset's IO manager (``idem_table_io_manager``,
  :class:`~idem_platform.defs.io_managers.TableIOManager`) makes it loadable: an
  asset with ``ins={"indicator": dg.AssetIn(table_key("indicator"))}`` receives
  the table as a lazy Spark DataFrame in its current schema version;
* its ``dagster/column_lineage`` names the field of each writer's ``committed`` asset
  that feeds each column (:func:`column_lineage`), and its materializations, recorded on
  the instance by the committing run, are what ``AutomationCondition.eager()`` on a
  downstream asset reacts to: it runs once after each commit that wrote the table.

The table assets are unpartitioned although ``committed`` is partitioned per file or
offset range: a table holds every partition's rows (``AllPartitionMapping``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import dagster as dg
import psycopg
from psycopg import sql

from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.contract.catalog import (
    SOURCE_ORDER,
    SYSTEM_COLUMNS,
    TableSpec,
    table_name,
    upsert_relations,
)
from idem_platform.defs.connector.names import asset_keys
from idem_platform.defs.resources import DEFAULT_KEYS, TABLE_IO_MANAGER_KEY, ResourceKeys
from idem_platform.errors import ConfigError
from idem_platform.postgres.current import state_ident
from idem_platform.postgres.schema import SCHEMA, qualified_table_name
from idem_platform.postgres.tables import effective_spec, existing_columns, table_ident

TABLE_IO_MANAGER = TABLE_IO_MANAGER_KEY  # the default database's (ResourceKeys.table_io_manager)
TABLE_GROUP = "idem_tables"
KEY_PREFIX = SCHEMA  # ["idem", <record_type>]: the schema and the table
RECORD_TYPE_TAG = "idem/record_type"
UPSERT_COUNTS = ("inserted", "updated", "deleted", "stale")  # an upsert table's materialization metadata
# Up to this size the row count is exact: count(*) of 1M rows shaped like the threat feed's
# (601 MB, made with generate_series) took 0.17-0.27 s cached on the 2-core VM. Above it,
# PostgreSQL's own estimate (pg_class.reltuples scaled to the table's current size, what the
# planner uses) is reported, labelled as one, so a small commit into a 10M-row table never
# pays a multi-second scan.
EXACT_COUNT_MAX_BYTES = 1 << 30
# What the connectors' asset keys end with: a table key must not be one of them.
_STEP_NAMES = ("ingest", "coerced", "committed")
_COLUMN_NOTES = {
    # Backticks: Dagster renders descriptions as markdown, where a bare <record_type> is an HTML tag.
    "_idempotency_key": "the record key: `<connector>:<record_type>:<ext_id>:<sha1(canonical)[:12]>`",
    "_schema_version": "the schema version the row was written with",
    "_commit_id": "the commit (idem.commits) that wrote the row",
    "_source": "where the record was: `<file sha256[:16]>#L<line>`, `<topic>-<partition>@<offset>`",
    "_payload": "the record as received",
    "_kafka": "the Kafka message's key, headers and timestamp",
    "_source_order": "an upsert table's source order: `[commit number, position in the commit]`",
    "props": "fields with no column of their own",
}


def table_key(record_type: str) -> dg.AssetKey:
    """The asset key of a record type's table: ``["idem", <record_type>]``.

    The record type as written, ``-`` included (``idem/threat-actor``): the key names what
    users declare and query by (``idem read threat-actor``), and keys of tables that an
    earlier version wrote keep their history. The table's real name is its
    ``dagster/table_name`` (:func:`~idem_platform.postgres.schema.qualified_table_name`)."""
    return dg.AssetKey([KEY_PREFIX, record_type])


def queried_name(spec: TableSpec) -> str:
    """What readers query: ``idem.<table>_current`` of an upsert table, else ``idem.<table>``."""
    if spec.upsert is not None:
        return f"{SCHEMA}.{upsert_relations(spec.record_type)[1]}"
    return qualified_table_name(spec.record_type)


def record_type_of(key: dg.AssetKey) -> str | None:
    """The record type of a table asset's key, ``None`` for any other key."""
    path = key.path
    return path[1] if len(path) == 2 and path[0] == KEY_PREFIX else None


def writers(config: IdemConfig) -> dict[str, list[ConnectorConfig]]:
    """Record type -> the connectors that write it (:meth:`IdemConfig.tables_for`), in config order."""
    out: dict[str, list[ConnectorConfig]] = {}
    for connector in config.connectors:
        for record_type in config.tables_for(connector):
            out.setdefault(record_type, []).append(connector)
    return dict(sorted(out.items()))


def _ddl_type(ddl: str) -> str:
    """The type of a system column's DDL: ``'text COLLATE "C" PRIMARY KEY'`` -> ``text``."""
    lowered = ddl.lower()
    cut = min((i for i in (lowered.find(" collate "), lowered.find(" not null"), lowered.find(" primary key")) if i >= 0),
              default=len(ddl))
    return ddl[:cut].strip()


def _system_column(name: str, type_: str, ddl: str) -> dg.TableColumn:
    return dg.TableColumn(
        name,
        type_,
        description=_COLUMN_NOTES.get(name),
        constraints=dg.TableColumnConstraints(
            nullable="NOT NULL" not in ddl and "PRIMARY KEY" not in ddl, unique="PRIMARY KEY" in ddl
        ),
    )


def declared_schema(spec: TableSpec, *, meta_column: str | None = None) -> dg.TableSchema:
    """The table's columns as the catalog declares them: idem's system columns, the typed
    columns (``required`` ones not nullable: coercion rejects a row without them), ``props``;
    ``meta_column`` (``_kafka``) when a Kafka connector writes the table."""
    columns = [_system_column(name, _ddl_type(ddl), ddl) for name, ddl in SYSTEM_COLUMNS]
    if meta_column:
        columns.append(dg.TableColumn(meta_column, "jsonb", description=_COLUMN_NOTES.get(meta_column)))
    if spec.upsert is not None and spec.upsert.by_source:
        columns.append(dg.TableColumn(SOURCE_ORDER, "bigint[]", description=_COLUMN_NOTES[SOURCE_ORDER]))
    columns += [
        dg.TableColumn(
            c.name,
            c.type.postgres,
            description=f"{c.type}" + (", added by schema evolution" if c.evolved else ""),
            constraints=dg.TableColumnConstraints(nullable=not c.required),
        )
        for c in spec.columns
    ]
    columns.append(dg.TableColumn("props", "jsonb", description=_COLUMN_NOTES["props"]))
    return dg.TableSchema(columns=columns)


def live_schema(spec: TableSpec, columns: Mapping[str, str]) -> dg.TableSchema:
    """The table's columns as PostgreSQL has them now (``columns``: :func:`existing_columns`),
    in table order: evolved columns and ``idem retype``'s typed companions included."""
    system = dict(SYSTEM_COLUMNS)
    effective = effective_spec(spec, dict(columns))
    by_name = {c.name: c for c in effective.columns}
    companions = {c.typed_column: c for c in effective.retyped_columns()}
    out = []
    for name, type_ in columns.items():
        if name in system:
            out.append(_system_column(name, type_, system[name]))
        elif name in by_name:
            column = by_name[name]
            notes = [str(column.type)]
            if column.evolved:
                notes.append("added by schema evolution")
            if column.retyped is not None:
                notes.append(f"retyped to {column.retyped} in {column.typed_column}")
            out.append(
                dg.TableColumn(
                    name, type_, description=", ".join(notes),
                    constraints=dg.TableColumnConstraints(nullable=not column.required),
                )
            )
        elif name in companions:
            out.append(dg.TableColumn(name, type_, description=f"typed companion of {companions[name].name} (idem retype)"))
        else:
            out.append(dg.TableColumn(name, type_, description=_COLUMN_NOTES.get(name)))
    return dg.TableSchema(columns=out)


def column_lineage(schema: dg.TableSchema, spec: TableSpec, connectors: list[ConnectorConfig]) -> dg.TableColumnLineage:
    """Which field of which connector feeds each column of the table (``dagster/column_lineage``).

    A typed column is the record's field of the same name, from every connector that
    writes the type (its ``committed`` asset, the commit that wrote the row). idem's own
    columns and ``props`` are derived from the record as received: they depend on
    ``_payload``. The UI draws this as column-level lineage from the connectors' commits.
    """
    typed = set(spec.column_names())
    committed = [asset_keys(c)[2] for c in connectors]
    return dg.TableColumnLineage(
        deps_by_column={
            column.name: [
                dg.TableColumnDep(asset_key=key, column_name=column.name if column.name in typed else "_payload")
                for key in committed
            ]
            for column in schema.columns
        }
    )


def check_not_shadowed(config: IdemConfig, name: str, what: str) -> None:
    """``idem/<name>`` (a table asset) is not also a step of a connector named ``idem``.

    Raises:
        ConfigError: a connector named ``idem`` and ``name`` (``what``: a record type, a
            results table) named like one of its steps would give two assets one key.
    """
    if name in _STEP_NAMES and any(c.identifier == KEY_PREFIX for c in config.connectors):
        raise ConfigError(
            f"{what} {name!r} and connector {KEY_PREFIX!r} would both be the Dagster asset "
            f"{KEY_PREFIX}/{name} (tables are keyed {KEY_PREFIX}/<table>); rename the connector",
            path=str(config.source) if config.source else None,
            key="connectors",
        )


def table_asset_specs(config: IdemConfig, resource_keys: ResourceKeys = DEFAULT_KEYS) -> list[dg.AssetSpec]:
    """One loadable, non-materializable asset per record type a connector writes
    (loaded by ``resource_keys.table_io_manager``).

    Raises:
        ConfigError: a connector named ``idem`` and a record type named like one of its
            steps would give two assets one key.
    """
    specs = []
    for record_type, connectors in writers(config).items():
        check_not_shadowed(config, record_type, "record type")
        spec = config.table_specs[record_type]
        meta = next((c.meta_column for c in connectors if c.meta_column), None)
        names = ", ".join(f"`{c.name}`" for c in connectors)
        schema = declared_schema(spec, meta_column=meta)
        specs.append(
            dg.AssetSpec(
                table_key(record_type),
                deps=[
                    dg.AssetDep(asset_keys(c)[2], partition_mapping=dg.AllPartitionMapping()) for c in connectors
                ],
                group_name=TABLE_GROUP,
                kinds={"postgres"},
                tags={RECORD_TYPE_TAG: record_type},
                description=(
                    _upsert_description(spec)
                    + f"The table `{qualified_table_name(record_type)}`: every `{record_type}` record committed exactly once "
                    f"by {names} (schema version {spec.schema_version}). Only those commits write it; each "
                    "reports a materialization here with the row count and the columns as they are now. "
                    f"An asset with `ins={{'{record_type.replace('-', '_')}': AssetIn({list(table_key(record_type).path)!r})}}` "
                    "receives it as a Spark DataFrame in the current schema version (older rows migrated on read)."
                ),
                metadata={
                    "dagster/table_name": queried_name(spec),
                    "dagster/column_schema": schema,
                    "dagster/column_lineage": column_lineage(schema, spec, connectors),
                    "schema_version": spec.schema_version,
                },
            ).with_io_manager_key(resource_keys.table_io_manager)
        )
    return specs


def _upsert_description(spec: TableSpec) -> str:
    """The first words of an upsert table's asset description: what it is and how to get the history."""
    if spec.upsert is None:
        return ""
    if spec.upsert.debezium:
        order = "source position (Debezium's `source.lsn`, or a MySQL event's binlog `file`, `pos` and `row`)"
    elif spec.upsert.by_source:
        order = "source order (`_source_order`: the commit, then the file's line or the partition's offset)"
    else:
        order = f"`{spec.upsert.order_by}`"
    return (
        f"The current state of `{spec.record_type}` (`mode: upsert`): `{queried_name(spec)}`, one row per identity, "
        f"the version with the greatest {order}; this is what the asset loads "
        "(`AssetIn(..., metadata={'history': True})`: every version). "
    )


class RowCount(NamedTuple):
    """A table's row count and whether it is exact (``count(*)``) or PostgreSQL's estimate."""

    rows: int
    exact: bool


def count_rows(conn: psycopg.Connection, record_type: str, *, exact_max_bytes: int = EXACT_COUNT_MAX_BYTES) -> RowCount:
    """The rows of a record type's table: exact up to ``exact_max_bytes`` of table, else the estimate.

    The estimate is the planner's: ``reltuples / relpages`` (the density the last ANALYZE
    saw; autovacuum keeps it fresh) times the table's pages now, one catalog row read. A
    big table that was never analyzed has no density yet (only right after its first,
    big, commit): it is counted exactly, which costs a fraction of that commit.
    """
    query = sql.SQL("SELECT count(*) FROM {}").format(table_ident(record_type))
    return count_relation(conn, table_name(record_type), query, exact_max_bytes)


def count_current(conn: psycopg.Connection, record_type: str, *, exact_max_bytes: int = EXACT_COUNT_MAX_BYTES) -> RowCount:
    """The rows of an upsert table's current state (``idem.<type>_current``: live identities),
    counted in its narrow state table; above ``exact_max_bytes`` the state table's estimate,
    deleted identities included (labelled inexact)."""
    state = upsert_relations(record_type)[0]
    query = sql.SQL("SELECT count(*) FROM {} WHERE NOT _deleted").format(state_ident(record_type))
    return count_relation(conn, state, query, exact_max_bytes)


def count_relation(conn: psycopg.Connection, relation: str, query: sql.Composed, exact_max_bytes: int) -> RowCount:
    """``query``'s count, or the estimate of table ``idem.<relation>`` when it is over
    ``exact_max_bytes`` and analyzed (:func:`count_rows`)."""
    stats = conn.execute(
        """
        SELECT c.reltuples, c.relpages, pg_relation_size(c.oid),
               pg_relation_size(c.oid) / current_setting('block_size')::bigint
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
        """,
        [SCHEMA, relation],
    ).fetchone()
    if stats is None:
        return RowCount(0, True)
    reltuples, relpages, size, pages = stats
    if size > exact_max_bytes and reltuples >= 0 and relpages > 0:
        return RowCount(round(reltuples / relpages * pages), False)
    counted = conn.execute(query).fetchone()
    return RowCount(int(counted[0]) if counted else 0, True)


def table_materializations(
    conn: psycopg.Connection,
    specs: Mapping[str, TableSpec],
    summary: Mapping[str, Any],
    *,
    partition: str | None = None,
) -> list[dg.AssetMaterialization]:
    """One materialization per table a commit wrote rows to (``summary["tables"]``).

    Each carries ``dagster/row_count`` (exact, or PostgreSQL's estimate for a big table:
    ``row_count_exact`` says which), ``dagster/column_schema`` as PostgreSQL has the
    table now, ``schema_version``, the commit id, the rows written and skipped, and the
    connector and partition that brought them. A replay or a commit that wrote nothing
    to a table reports nothing for it: the table did not change.
    """
    commit_id = summary.get("commit_id")
    versions = summary.get("schema_versions") or {}
    events = []
    for record_type, counts in sorted((summary.get("tables") or {}).items()):
        written = int(counts.get("written") or 0)
        if not written and not counts.get("new_columns"):
            continue
        spec = specs.get(record_type)
        columns = existing_columns(conn, record_type)
        upsert = spec is not None and spec.upsert is not None
        count = count_current(conn, record_type) if upsert else count_rows(conn, record_type)
        metadata: dict[str, Any] = {
            "dagster/row_count": dg.MetadataValue.int(count.rows),
            "row_count_exact": dg.MetadataValue.bool(count.exact),
            "dagster/table_name": dg.MetadataValue.text(queried_name(spec) if spec else qualified_table_name(record_type)),
            "schema_version": dg.MetadataValue.int(
                int(versions.get(record_type) or (spec.schema_version if spec else 1))
            ),
            "commit_id": dg.MetadataValue.text(str(commit_id)),
            "rows_written": dg.MetadataValue.int(written),
            "rows_skipped": dg.MetadataValue.int(int(counts.get("skipped") or 0)),
        }
        if spec is not None and columns:
            metadata["dagster/column_schema"] = dg.MetadataValue.table_schema(live_schema(spec, columns))
        if counts.get("new_columns"):
            metadata["new_columns"] = dg.MetadataValue.text(", ".join(counts["new_columns"]))
        for key in UPSERT_COUNTS if upsert else ():  # what the commit did to the current state
            metadata[key] = dg.MetadataValue.int(int(counts.get(key) or 0))
        if summary.get("connector"):
            metadata["connector"] = dg.MetadataValue.text(str(summary["connector"]))
        if partition is not None:
            metadata["partition"] = dg.MetadataValue.text(partition)
        events.append(
            dg.AssetMaterialization(
                asset_key=table_key(record_type),
                description=f"commit {commit_id}: {written:,} rows written"
                + ("" if count.exact else f"; about {count.rows:,} rows in the table (PostgreSQL's estimate)"),
                metadata=metadata,
            )
        )
    return events
