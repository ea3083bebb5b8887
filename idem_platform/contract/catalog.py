"""The catalog: record types, their typed columns, and how each type maps to Arrow and PostgreSQL.

DESIGN §3 is the source of these mappings; keeping them in one table means the
coercion engine, the staging COPY and the DDL can never disagree about a type.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from dataclasses import dataclass, field

import pyarrow as pa

SCALAR_KINDS = ("bool", "int", "long", "real", "string", "timestamp", "dynamic")
COLUMN_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_VECTOR = re.compile(r"vector\((\d{1,5})\)")

_ARROW = {
    "bool": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "real": pa.float64(),
    "string": pa.string(),
    "timestamp": pa.timestamp("ns", tz="UTC"),
    "dynamic": pa.binary(),
}
_POSTGRES = {
    "bool": "boolean",
    "int": "integer",
    "long": "bigint",
    "real": "double precision",
    "string": "text",
    "timestamp": "timestamp with time zone",
    "dynamic": "jsonb",
    "vector": "real[]",
}


@dataclass(frozen=True)
class ColumnType:
    """A catalog type: one of :data:`SCALAR_KINDS` or ``vector`` with its dimension."""

    kind: str
    dim: int | None = None

    @classmethod
    def parse(cls, text: str) -> ColumnType:
        """Parse ``int``, ``timestamp``, ``vector(8)``...

        Raises:
            ValueError: with the list of valid types.
        """
        text = text.strip()
        if text in SCALAR_KINDS:
            return cls(text)
        match = _VECTOR.fullmatch(text)
        if match and 1 <= int(match.group(1)) <= 16000:
            return cls("vector", int(match.group(1)))
        raise ValueError(
            f"unknown type {text!r}; expected one of {', '.join(SCALAR_KINDS)} or vector(N) "
            "with 1 <= N <= 16000"
        )

    def __str__(self) -> str:
        return f"vector({self.dim})" if self.kind == "vector" else self.kind

    @property
    def arrow(self) -> pa.DataType:
        """The Arrow type of the coerced column (DESIGN §3)."""
        if self.kind == "vector":
            if self.dim is None:  # parse_type always sets it; a hand-built type may not
                raise ValueError("a vector type needs its dimension: vector(N)")
            return pa.list_(pa.float32(), self.dim)
        return _ARROW[self.kind]

    @property
    def spark_arrow(self) -> pa.DataType:
        """The Arrow type Spark can carry: variable lists and microsecond timestamps.

        Spark has no fixed-size list and its TimestampType is microseconds; the
        dimension is still enforced by coercion, and PostgreSQL keeps microseconds.
        """
        if self.kind == "vector":
            return pa.list_(pa.float32())
        if self.kind == "timestamp":
            return pa.timestamp("us", tz="UTC")
        return self.arrow

    @property
    def postgres(self) -> str:
        """The PostgreSQL column type, as ``information_schema`` and DDL spell it."""
        return _POSTGRES[self.kind]


STRING = ColumnType("string")


@dataclass(frozen=True)
class Column:
    """A typed column of a record type's table."""

    name: str
    type: ColumnType
    required: bool = False
    evolved: bool = False  # added by schema evolution, not declared in idem.yaml
    # ``idem retype``: a text column with a typed companion column (see
    # :func:`typed_column_name`) that the commit fills beside it; ``None`` when not retyped.
    retyped: ColumnType | None = None
    # The reject rule of a null or missing value of a required column: ``required`` when
    # declared so, ``order`` or ``identity`` for what an upsert table needs of every record.
    rule: str = "required"

    @property
    def typed_column(self) -> str | None:
        """The companion column of a retyped column (``_score__long``), else ``None``."""
        return typed_column_name(self.name, self.retyped.kind) if self.retyped is not None else None


def table_name(record_type: str) -> str:
    """The table of a record type in schema ``idem``: the record type with ``-`` spelt ``_``
    (``threat-actor`` -> ``threat_actor``).

    Record types use ``[a-z0-9_-]``; a ``-`` would make the table name one that every query
    has to quote (``idem."threat-actor"``), so tables never carry it. The record type itself
    (in the record key, ``_record_type``, ``idem.catalog``) is kept exactly as received; two
    record types that differ only by ``-`` and ``_`` are refused when the config loads.
    """
    return record_type.replace("-", "_")


def commit_index_name(table: str) -> str:
    """The name of table ``table``'s ``_commit_id`` index: ``<table>_commit_id``, or for a long
    name its head and a digest: PostgreSQL cuts names at 63 bytes, and two long tables must
    not share one index name (index names are per schema, like table names)."""
    name = f"{table}_commit_id"
    if len(name) <= MAX_IDENTIFIER_BYTES:
        return name
    return f"{table[:40]}_{hashlib.sha256(table.encode()).hexdigest()[:12]}_commit_id"


# The identity of an upsert table that names no fields: the record's external id (the
# connector's id field), as its record key holds it.
EXTERNAL_ID = "_external_id"
# The implied order of a Debezium-fed upsert table: the change event's source position, not
# a column (a column name cannot start with ``_``), as a ``bigint[]``: ``[source.lsn]`` of the
# PostgreSQL connector, ``[binlog file number, source.pos, source.row]`` of the MySQL one.
SOURCE_POSITION = "_source_position"
# The number that ends a MySQL binlog file name (``mysql-bin.000003``: 3), in Python's and
# PostgreSQL's regular expressions alike (``\Z``: the very end, where ``$`` differs).
BINLOG_FILE_NUMBER = r"\.([0-9]{1,18})\Z"
# The implied order of an upsert table without ``order_by`` (and no Debezium feed): the
# source's own order, ``ARRAY[commit sequence, position in the commit]`` (``bigint[]``), which
# idem writes into the history's ``_source_order`` column as it inserts each version.
SOURCE_ORDER = "_source_order"
UPSERT_ORDER_KINDS = ("int", "long", "real", "timestamp")
IDENTITY_KINDS = ("bool", "int", "long", "string", "timestamp")


@dataclass(frozen=True)
class UpsertSpec:
    """What makes a table an upsert table (``mode: upsert``): one current row per identity.

    Attributes:
        identity: the columns naming an identity (``(EXTERNAL_ID,)``: the record's id).
        order_by: the column whose value orders an identity's versions (a number or a timestamp).
        delete_field, delete_equals: a record whose ``delete_field`` equals ``delete_equals``
            (JSON text of the value) marks its identity deleted; ``None``: no deletes.
        debezium: the table is fed Debezium change events (``format: debezium``): its order
            is the event's source position (``order_by`` is :data:`SOURCE_POSITION`, read from
            the envelope kept in ``_payload``) and ``op: d`` is its delete.

    ``order_by`` :data:`SOURCE_ORDER`: the table names no order, so its versions are in the
    source's own order (see :attr:`by_source`).
    """

    identity: tuple[str, ...]
    order_by: str
    delete_field: str | None = None
    delete_equals: str | None = None
    debezium: bool = False

    @property
    def by_source(self) -> bool:
        """Whether versions are in the source's own order (no ``order_by``): a version is a
        record at its source position (the position is part of its record key, so a content
        that comes back is a new version) and its order is the history's ``_source_order``."""
        return self.order_by == SOURCE_ORDER


@dataclass(frozen=True)
class TableSpec:
    """A record type: its table ``idem.<table_name(record_type)>``, schema version and columns."""

    record_type: str
    schema_version: int
    columns: tuple[Column, ...] = field(default_factory=tuple)
    upsert: UpsertSpec | None = None  # ``mode: upsert``: its state table and current view beside it

    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def with_evolved(self, names: list[str]) -> TableSpec:
        """This spec plus nullable string columns added by earlier evolution."""
        known = set(self.column_names())
        extra = tuple(Column(n, STRING, evolved=True) for n in names if n not in known)
        return dataclasses.replace(self, columns=self.columns + extra)

    def with_retypes(self, retyped: dict[str, ColumnType]) -> TableSpec:
        """This spec with ``retyped`` (text column -> target type) marked on its columns."""
        if not retyped:
            return self
        columns = tuple(
            dataclasses.replace(c, retyped=retyped[c.name]) if c.name in retyped else c for c in self.columns
        )
        return dataclasses.replace(self, columns=columns)

    def retyped_columns(self) -> tuple[Column, ...]:
        """The text columns that have a typed companion column."""
        return tuple(c for c in self.columns if c.retyped is not None)

    def arrow_struct(self, *, spark: bool = False) -> pa.StructType:
        """The Arrow struct of this type's typed columns (the ``coerced`` frame's shape).

        Every child is nullable: the struct is null on rows of other record types
        and on rejects; ``required`` is enforced by coercion, not by Arrow.
        """
        return pa.struct([pa.field(c.name, c.type.spark_arrow if spark else c.type.arrow) for c in self.columns])


SYSTEM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_idempotency_key", 'text COLLATE "C" PRIMARY KEY'),
    ("_connector", "text NOT NULL"),
    ("_record_type", "text NOT NULL"),
    ("_external_id", "text NOT NULL"),
    ("_content_hash", "text NOT NULL"),
    ("_schema_version", "integer NOT NULL"),
    ("_commit_id", "uuid NOT NULL"),
    ("_ingested_at", "timestamp with time zone NOT NULL"),
    ("_source", "text"),
    ("_payload", "jsonb NOT NULL"),
)
# PostgreSQL's own columns of every table (pg_attribute rows with attnum < 0; "oid"
# was one before PostgreSQL 12): ALTER TABLE … ADD COLUMN xmin fails, so a field of
# that name would make its file fail forever. Such fields go to ``props``.
POSTGRES_SYSTEM_COLUMNS = frozenset({"tableoid", "xmin", "cmin", "xmax", "cmax", "ctid", "oid"})
RESERVED_COLUMN_NAMES = frozenset({"props"}) | POSTGRES_SYSTEM_COLUMNS
# idem's own tables in schema ``idem``: a record type of one of these names would be
# written into (and widen) the product's bookkeeping.
RESERVED_TABLE_NAMES = frozenset(
    {"ingest_ledger", "commits", "source_offsets", "rejects", "execution_log", "catalog", "schema_migrations", "outbox"}
)
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are silently truncated
# An upsert table's current state: ``idem.<type>_state`` (one row per identity, tombstones
# included) and the view ``idem.<type>_current`` (its live rows, with the history's columns).
STATE_SUFFIX = "_state"
CURRENT_SUFFIX = "_current"


def upsert_relations(record_type: str) -> tuple[str, str]:
    """The state table's and the current view's names of upsert table ``record_type``
    (beside its history, :func:`table_name`: ``threat-actor`` -> ``threat_actor_current``)."""
    table = table_name(record_type)
    return table + STATE_SUFFIX, table + CURRENT_SUFFIX


@functools.lru_cache(maxsize=4096)
def column_name_problem(name: str) -> str | None:
    """Why field ``name`` cannot be a column (``None`` when it can): the reason a field went
    to ``props``, recorded in the commit's table stats. The same rule as
    :func:`is_safe_column_name`, which the per-record path uses (it only needs yes or no)."""
    if COLUMN_NAME.fullmatch(name) is None:
        if len(name.encode("utf-8", "surrogatepass")) > MAX_IDENTIFIER_BYTES:
            return f"longer than PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte names"
        folded = name.lower()
        if folded != name and COLUMN_NAME.fullmatch(folded) is not None:
            return f"has capitals: PostgreSQL folds names, it would meet {folded!r}"
        return "not a column name (^[a-z_][a-z0-9_]{0,62}$)"
    if name.startswith("_"):
        return "starts with '_', kept for idem's own columns"
    if name in POSTGRES_SYSTEM_COLUMNS:
        return "a PostgreSQL system column name"
    if name in RESERVED_COLUMN_NAMES:
        return "idem's own column"
    return None


def is_safe_column_name(name: str) -> bool:
    """Whether a field name may become a column: ``^[a-z_][a-z0-9_]{0,62}$``, not reserved.

    ``_``-prefixed names are system columns, ``props`` holds what cannot be a
    column, and PostgreSQL's own system columns (``xmin``, ``ctid``…) cannot be
    added, so none may be taken by a field.
    """
    return (
        COLUMN_NAME.fullmatch(name) is not None
        and not name.startswith("_")
        and name not in RESERVED_COLUMN_NAMES
    )


# ``idem retype TYPE COLUMN --to KIND``: the kinds an evolved text column may be retyped to.
RETYPE_KINDS = ("long", "real", "timestamp", "bool")


def typed_column_name(name: str, kind: str) -> str:
    """The typed companion column of text column ``name`` retyped to ``kind``.

    ``_<name>__<kind>`` (``_score__long``), or, when that would pass PostgreSQL's 63
    bytes, ``__<head of name>_<sha1 of name, 10 hex>__<kind>``. It starts with ``_``,
    which no record field may take as a column (:func:`is_safe_column_name`), so no
    field evolving later can collide with it, and no declared column either. Plain
    names start with one ``_`` and a letter (field names cannot start with ``_``),
    hashed ones with two, so the two forms never meet; idem's system columns never
    end in ``__<kind>``.
    """
    plain = f"_{name}__{kind}"
    if len(plain.encode()) <= MAX_IDENTIFIER_BYTES:
        return plain
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    head = name[: MAX_IDENTIFIER_BYTES - len(kind) - len(digest) - 5]
    return f"__{head}_{digest}__{kind}"
