"""The plan of a table read: what each partition selects, small and picklable.

The plan travels to the executors inside the Spark data source
(:mod:`idem_platform.read.source`), which read their partitions with it and
upgrade old rows with it; nothing there refers to driver state. It is kept apart
from the planning that builds it (:mod:`idem_platform.read.planner`: the config,
a connection, the counts and the page sample), which runs on the driver only:
this module is what both sides share, the plan's fields and the SQL they make.

Partitions are ranges of ``_idempotency_key`` (boundaries from a page sample of
the table, ``TABLESAMPLE SYSTEM``), not ranges of pages: a key never moves, so
a row rewritten while the read runs (``idem migrate``, a retype's backfill)
is read once, in one version or the other, never twice and never not at all.
An *ordered* read (``idem read``) uses ranges of ``(_ingested_at, _idempotency_key)``
instead, each sorted by PostgreSQL: partition after partition, the rows come in
that order with no sort in Spark. Each partition reads in its own snapshot: a
commit that lands during the read may be visible to some partitions only (read
again for a consistent view).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from psycopg import sql

from idem_platform.contract.catalog import TableSpec
from idem_platform.migrations import MigrationSource
from idem_platform.postgres.current import state_ident
from idem_platform.postgres.tables import table_ident

# How a frame column is read from the table's CSV and what Arrow type it has in the frame
# (Spark's shapes: microsecond timestamps, variable lists; JSON columns as their text).
ARROW_TYPES: dict[str, pa.DataType] = {
    "text": pa.string(),
    "json": pa.string(),
    "bool": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "real": pa.float64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "vector": pa.list_(pa.float32()),
}
# What each kind is sent as: the binary COPY behind the read then has one fixed Arrow
# type per column whatever the stored one (``jsonb`` as its text, an evolved column cast).
POSTGRES_TYPES: dict[str, str] = {
    "text": "text",
    "json": "text",
    "bool": "boolean",
    "int": "integer",
    "long": "bigint",
    "real": "double precision",
    "timestamp": "timestamptz",
    "vector": "real[]",
}
ORDER = ("_ingested_at", "_idempotency_key")  # what `idem read` and a --limit read in
ERROR_COLUMN = "_migration_error"  # the source's own column: why a row's upgrade failed (keep mode)
# The version of a row's _payload when `idem migrate` moved the row past it (null: _schema_version).
PAYLOAD_VERSION = "_payload_version"
_REBUILT_ROLES = frozenset({"typed", "companion", "props"})  # what the upgrade replaces in an old row


@dataclass(frozen=True)
class ReadColumn:
    """One column of the frame.

    Attributes:
        name: the frame column.
        kind: a key of :data:`ARROW_TYPES`.
        present: whether the table has it (a column declared since the last ingest has
            not been added yet: it reads null).
        role: ``system``, ``meta`` (``_kafka``), ``typed`` (a catalog column),
            ``companion`` (a retyped column's typed value), ``props`` or ``error``.
    """

    name: str
    kind: str
    present: bool = True
    role: str = "system"

    @property
    def arrow(self) -> pa.DataType:
        return ARROW_TYPES[self.kind]


@dataclass(frozen=True)
class ConnectorRules:
    """What an upgraded row needs of the connector that wrote it: the field that states a
    record's version (stripped before the migrations run), the fields that are never
    unknown (its id and record type fields) and its schema contract for this type
    (``drop``: unknown fields stay out of ``props``)."""

    version_field: str = "schema_version"
    known: frozenset[str] = frozenset()
    contract: str = "evolve"


@dataclass(frozen=True)
class ReadPlan:
    """One read of ``idem.<record_type>`` in its current shape (picklable)."""

    url: str
    record_type: str
    current_version: int
    spec: TableSpec  # the effective catalog: declared, evolved and retyped columns
    columns: tuple[ReadColumn, ...]
    exists: bool = True
    commit_id: str | None = None
    limit: int | None = None
    # Partition i reads the rows whose range columns are in [bounds[i-1], bounds[i]).
    bounds: tuple[tuple[str, ...], ...] = ()
    ordered: bool = False  # ranges of ORDER, each partition sorted (else ranges of keys, unsorted)
    part: int | None = None  # read this one partition only (`idem read` fetches them one by one)
    only_old: bool = False  # read only rows older than the current version
    # The table has _payload_version (idem migrate moved some rows): an old row is upgraded
    # from its payload's own version, which a moved row no longer shares with _schema_version.
    payload_version: bool = False
    migrations: MigrationSource = field(default_factory=MigrationSource)
    connectors: tuple[tuple[str, ConnectorRules], ...] = ()
    # An upsert table's current state: only the versions its live state rows name (one
    # per identity), as ``idem.<type>_current`` shows them; else every version (the history).
    current: bool = False

    @property
    def partitions(self) -> int:
        return len(self.bounds) + 1 if self.exists else 0

    def indexes(self) -> list[int]:
        """The partitions this plan's frame reads."""
        if self.part is not None:
            return [self.part] if self.part < self.partitions else []
        return list(range(self.partitions))

    def rules(self, connector: str) -> ConnectorRules:
        """The rules of the connector named ``connector`` (defaults for one no longer configured)."""
        for name, rules in self.connectors:
            if name == connector:
                return rules
        return ConnectorRules()

    def arrow_schema(self) -> pa.Schema:
        """The frame's Arrow schema (every field nullable, as Spark reads it)."""
        return pa.schema([pa.field(c.name, c.arrow) for c in self.columns])

    def where(self, index: int | None = None) -> sql.Composable:
        """The rows partition ``index`` reads (``None``: every partition's)."""
        conditions: list[sql.Composable] = []
        if self.current:
            conditions.append(
                sql.SQL("EXISTS (SELECT 1 FROM {state} s WHERE s._record_key = {table}._idempotency_key AND NOT s._deleted)").format(
                    state=state_ident(self.record_type), table=table_ident(self.record_type)
                )
            )
        if self.commit_id is not None:
            conditions.append(sql.SQL("_commit_id = {}::uuid").format(sql.Literal(self.commit_id)))
        if self.only_old:
            conditions.append(sql.SQL("_schema_version <> {}").format(sql.Literal(self.current_version)))
        if index is not None and self.bounds:
            if index > 0:
                conditions.append(self._compare(">=", self.bounds[index - 1]))
            if index < len(self.bounds):
                conditions.append(self._compare("<", self.bounds[index]))
        if not conditions:
            return sql.SQL("")
        return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)

    @property
    def range_columns(self) -> tuple[str, ...]:
        """What the partitions' bounds are values of."""
        return ORDER if self.ordered else ("_idempotency_key",)

    def _compare(self, operator: str, bound: tuple[str, ...]) -> sql.Composable:
        """``(_ingested_at, _idempotency_key) >= ('…'::timestamptz, '…')``: a row comparison."""
        values = [
            sql.SQL("{}::timestamptz").format(sql.Literal(v)) if c == "_ingested_at" else sql.Literal(v)
            for c, v in zip(self.range_columns, bound, strict=True)
        ]
        return sql.SQL("({}) {} ({})").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in self.range_columns), sql.SQL(operator), sql.SQL(", ").join(values)
        )

    def tail(self, *, sort: bool = True) -> sql.Composable:
        """``ORDER BY …`` of an ordered read, and ``LIMIT n`` of a limited one (always sorted)."""
        if self.limit is None and not (sort and self.ordered):
            return sql.SQL("")
        order = sql.SQL(" ORDER BY {}").format(sql.SQL(", ").join(sql.Identifier(c) for c in ORDER))
        if self.limit is None:
            return order
        return order + sql.SQL(" LIMIT {}").format(sql.Literal(self.limit))

    def _version_expression(self) -> sql.Composable:
        """``_schema_version`` as the upgrade needs it: a current row's own, an old row's
        payload version (``idem migrate`` keeps ``_payload`` as received and records its
        version in ``_payload_version`` when it moves the row's typed columns on)."""
        return sql.SQL(
            "CASE WHEN _schema_version = {current} THEN _schema_version "
            "ELSE coalesce({payload}, _schema_version) END"
        ).format(current=sql.Literal(self.current_version), payload=sql.Identifier(PAYLOAD_VERSION))

    def _select(self, column: ReadColumn) -> sql.Composable:
        """What the read selects for ``column``, cast to its kind's type. An old row's typed
        columns, companions and ``props`` are rebuilt from its ``_payload`` by the upgrade,
        so they are not sent."""
        cast = sql.SQL(POSTGRES_TYPES[column.kind])
        if not column.present:
            return sql.SQL("NULL::{}").format(cast)
        if column.name == "_schema_version" and self.payload_version:
            return sql.SQL("({})::{}").format(self._version_expression(), cast)
        if column.role in _REBUILT_ROLES:
            return sql.SQL("(CASE WHEN _schema_version = {} THEN {} END)::{}").format(
                sql.Literal(self.current_version), sql.Identifier(column.name), cast
            )
        return sql.SQL("{}::{}").format(sql.Identifier(column.name), cast)

    def query(self, index: int) -> sql.Composed:
        """``SELECT …`` of partition ``index``: every frame column, cast to its kind's type."""
        select = sql.SQL(", ").join(self._select(c) for c in self.columns)
        return sql.SQL("SELECT {} FROM {}{}{}").format(select, table_ident(self.record_type), self.where(index), self.tail())
