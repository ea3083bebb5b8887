"""``idem_results``: a Spark Python data source reading an effect's results table, ``idem.<name>``.

What the table IO manager hands an asset that takes a results table as input: a lazy frame,
read on an executor by the ADBC PostgreSQL driver (binary ``COPY`` straight into Arrow, as
:mod:`idem_platform.read.decode` reads the record tables), oldest delivery first. A results
table has one fixed shape (:mod:`idem_platform.effects.results`) and no schema versions, so
there is nothing to migrate; ``response`` (``jsonb``) comes as its JSON text, as ``props``
of a record table does. One input partition: a results table holds one row per delivered
effect, a small table beside the records it answers.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence

import adbc_driver_manager
import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from idem_platform.effects.results import results_ident
from idem_platform.postgres.schema import SCHEMA
from idem_platform.read.decode import as_psycopg_error, conninfo, typed_batch

NAME = "idem_results"
# The frame's columns, in the table's order (response as JSON text).
RESULTS_DDL = (
    "key STRING, effect STRING, record_type STRING, external_id STRING, record_key STRING, "
    "response STRING, status INT, delivered_at TIMESTAMP"
)


def results_schema() -> StructType:
    """The frame's Spark schema (:data:`RESULTS_DDL`)."""
    schema = StructType.fromDDL(RESULTS_DDL)
    assert isinstance(schema, StructType)  # a list of columns parses to a struct
    return schema


def results_query(name: str, limit: int | None) -> str:
    """The ``SELECT`` of ``idem.<name>``: every column in the frame's order, oldest delivery first."""
    query = sql.SQL(
        "SELECT key, effect, record_type, external_id, record_key, response::text AS response, status, "
        "delivered_at FROM {table} ORDER BY delivered_at, key"
    ).format(table=results_ident(name))
    if limit is not None:
        query += sql.SQL(" LIMIT {}").format(sql.Literal(limit))
    return query.as_string(None)


def exists_query(name: str) -> str:
    """Whether ``idem.<name>`` exists (the first dispatcher of its effect creates it)."""
    return sql.SQL("SELECT to_regclass({}) IS NOT NULL").format(sql.Literal(f"{SCHEMA}.{name}")).as_string(None)


class ResultsReader(DataSourceReader):
    def __init__(self, url: str, name: str, limit: int | None, schema: StructType) -> None:
        self.url, self.name, self.limit = url, name, limit
        self.schema = to_arrow_schema(schema, timezone="UTC")  # exactly what Spark checks batches against

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        try:
            with adbc.connect(conninfo(self.url), autocommit=True) as conn, conn.cursor() as cursor:
                cursor.execute(exists_query(self.name))
                exists = cursor.fetchone()
                if not exists or not exists[0]:
                    return  # no dispatcher ran for the effect yet: no rows
                cursor.execute(results_query(self.name, self.limit))
                for batch in cursor.fetch_record_batch():
                    if batch.num_rows:
                        yield typed_batch(batch, self.schema)
        except (adbc_driver_manager.Error, pa.ArrowException, OSError) as exc:  # OSError: lost mid-stream
            raise as_psycopg_error(exc) from None


class ResultsSource(DataSource):
    """Options: ``url``, ``name`` (the results table), ``limit`` (optional)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return results_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        limit = self.options.get("limit")
        return ResultsReader(self.options["url"], self.options["name"], int(limit) if limit else None, schema)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()
_lock = threading.Lock()


def results_frame(spark: SparkSession, url: str, name: str, *, limit: int | None = None) -> DataFrame:
    """The lazy frame of the results table ``idem.<name>`` (empty while the table does not exist)."""
    with _lock:
        if spark not in _registered:
            spark.dataSource.register(ResultsSource)
            _registered.add(spark)
    reader = spark.read.format(NAME).schema(results_schema()).option("url", url).option("name", name)
    if limit is not None:
        reader = reader.option("limit", str(limit))
    return reader.load()
