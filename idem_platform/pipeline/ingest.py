"""The write path's first stages, for every connector: plan → records → coerced.

Each stage is a plain function so the Dagster assets (one stage each), the CLI
and tests drive the very same code. The ``ingest`` and ``coerced`` values are
small plans whose frames are lazy: the records are read once, by the
executors, when :func:`idem_platform.pipeline.commit.commit_batch` commits them.

Planning reads the ledger: units already committed (a dropped file, a Kafka
range) are replays and never reach Spark, so a fully replayed batch starts no
Spark job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idem_platform import errors
from idem_platform.coercion.records import RecordSpec, coerce_batches
from idem_platform.config import ConnectorConfig, IdemConfig, PushConnectorBase
from idem_platform.contract.catalog import TableSpec
from idem_platform.ledger import Ledger, LedgerEntry
from idem_platform.postgres.connection import connect, is_unix_socket_url
from idem_platform.postgres.tables import (
    add_system_column,
    effective_spec,
    existing_columns,
    sync_tables,
)
from idem_platform.sources.filedrop.files import hash_file
from idem_platform.sources.filedrop.plan import batch_of_files
from idem_platform.sources.kafka.ranges import plan_kafka
from idem_platform.write.batch import SourceBatch, Unit

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from idem_platform.sources.kafka.ranges import RangeRequest


def read_ledger(url: str, namespace: str, keys: list[str]) -> dict[str, LedgerEntry]:
    """Ledger rows of ``keys`` (no lock)."""
    with connect(url) as conn, conn.transaction():
        return Ledger(conn, namespace).entries(keys)


def plan_files(url: str, connector: ConnectorConfig, paths: Sequence[str | Path]) -> SourceBatch:
    """Hash every file (chunked) and split the batch into pending files and replays.

    The order a commit reads its files in is the order of their versions in an upsert table
    without ``order_by`` (and decides which of two files gives a record first), so it must
    not depend on who listed them: dropped files in path order; the bodies a push connector
    landed in the order they landed (their mtime, then path: their names are content hashes)."""
    ordered = sorted(dict.fromkeys(Path(p).resolve() for p in paths))
    hashed = [hash_file(p, max_split_bytes=connector.split_bytes) for p in ordered]
    if isinstance(connector, PushConnectorBase):
        hashed.sort(key=lambda f: (f.mtime_ns, f.path))
    entries = read_ledger(url, connector.name, sorted({f.key for f in hashed}))
    return batch_of_files(connector.name, hashed, entries, max_slice_bytes=connector.split_bytes)


def plan_batch(
    url: str,
    connector: ConnectorConfig,
    paths: Sequence[str | Path] = (),
    *,
    ranges: Sequence[RangeRequest] | None = None,
) -> SourceBatch:
    """Plan what the connector has waiting: the given files, or Kafka offset ranges.

    Args:
        url: PostgreSQL (the ledger, and the committed Kafka offsets).
        connector: the connector.
        paths: a file-drop connector's files.
        ranges: a Kafka connector's explicit ranges (the sensor's request); ``None``
            plans every partition from its committed offset to the high watermark.

    Raises:
        ConfigError: arguments that do not fit the connector's kind.
        KafkaError: the brokers cannot be reached.
    """
    if connector.kind == "kafka":
        if paths:
            raise errors.ConfigError(f"connector {connector.name!r} reads Kafka topics, not files")

        return plan_kafka(url, connector, ranges)
    if ranges:
        raise errors.ConfigError(f"connector {connector.name!r} reads files, not Kafka ranges")
    return plan_files(url, connector, paths)


def prepare_tables(url: str, config: IdemConfig, connector: ConnectorConfig) -> None:
    """Create or widen the declared tables, plus the connector's source-metadata column (``_kafka``)."""
    with connect(url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
        if connector.meta_column is not None:
            add_system_column(conn, sorted(config.tables_for(connector)), connector.meta_column, "jsonb")


def current_tables(url: str, config: IdemConfig, connector: ConnectorConfig) -> dict[str, TableSpec]:
    """The connector's tables as PostgreSQL has them now (declared + evolved columns)."""
    specs = config.tables_for(connector)
    with connect(url) as conn:
        return {name: effective_spec(spec, existing_columns(conn, name)) for name, spec in specs.items()}


def record_spec(connector: ConnectorConfig, tables: dict[str, TableSpec], units: Sequence[Unit]) -> RecordSpec:
    """What executors need to coerce this batch's records."""
    return RecordSpec(
        connector=connector.key_prefix,
        tables=tables,
        units=tuple((unit.position_prefix, unit.base) for unit in units),
        record_type=connector.record_type,
        record_type_field=connector.record_type_field,
        id_field=connector.id_field,
        missing_id=connector.missing_id,
        evolve=connector.contract == "evolve",
        contracts={name: connector.contract_for(name) for name in tables},
        max_line_bytes=connector.max_line_bytes,
        spark_types=True,
        lines=connector.kind != "kafka",
        noun="message" if connector.kind == "kafka" else "line",
        keep_meta=connector.meta_column is not None,
        version_field=connector.schema_version_field,
        declared_version=connector.schema_version,
        migrations=connector.migrations,
        debezium=connector.debezium,
    )


def records_frame(spark: SparkSession, batch: SourceBatch, connector: ConnectorConfig) -> DataFrame:
    """The ``ingest`` frame: one row per raw record of the pending units (lazy)."""
    # Late import (pulls in PySpark): off idem --help's imports (the CLI imports this module).
    from idem_platform.spark.records_source import batch_option
    from idem_platform.spark.session import register_sources

    return (
        register_sources(spark).read.format("idem_source_records")
        .option("batch", batch_option(batch))
        .option("max_record_bytes", str(connector.max_line_bytes))
        .load()
    )


def coerced_frame(records: DataFrame, spec: RecordSpec) -> DataFrame:
    """The ``coerced`` frame: ``mapInArrow`` of the coercion over the records (lazy)."""
    # Late import (PySpark): off idem --help's imports (the CLI imports this module).
    from pyspark.sql.pandas.types import from_arrow_schema

    def coerce(batches: Any) -> Any:
        return coerce_batches(batches, spec)

    return records.mapInArrow(coerce, from_arrow_schema(spec.output_schema()))


def check_cluster_reach(master: str, url: str) -> None:
    """Fail early when executors elsewhere could not reach an embedded (socket-only) PostgreSQL.

    Raises:
        EmbeddedPostgresError: naming ``IDEM_POSTGRES_URL``.
    """
    # Late import (pulls in PySpark): off idem --help's imports (the CLI imports this module).
    from idem_platform.spark.session import is_local_master

    if not is_local_master(master) and is_unix_socket_url(url):
        raise errors.EmbeddedPostgresError(
            f"Spark master {master!r} runs executors outside this process, but PostgreSQL is reached "
            "through a Unix socket (the embedded server listens on no TCP port). Set IDEM_POSTGRES_URL "
            "to a TCP URL every executor can reach, e.g. postgresql://user:pass@db-host:5432/idem"
        )


@dataclass(frozen=True)
class CoercedBatch:
    """A planned batch plus the catalog its records are coerced to (the ``coerced`` asset's value).

    Small and picklable: the frame itself is rebuilt lazily from it, so any
    process (a retried step, a cluster driver) can resume from this value.
    """

    batch: SourceBatch
    connector: ConnectorConfig
    tables: dict[str, TableSpec]

    def spec(self) -> RecordSpec:
        return record_spec(self.connector, self.tables, self.batch.pending)

    def frame(self, spark: SparkSession) -> DataFrame:
        """The lazy ``coerced`` frame (records read and coerced by executors when an action runs)."""
        return coerced_frame(records_frame(spark, self.batch, self.connector), self.spec())

    def metadata(self) -> dict[str, Any]:
        return {
            "record_types": sorted(self.tables),
            "columns": {
                name: {c.name: str(c.type) + (" required" if c.required else "") for c in spec.columns}
                for name, spec in sorted(self.tables.items())
            },
            "schema_versions": {name: spec.schema_version for name, spec in sorted(self.tables.items())},
            "schema_contracts": {name: self.connector.contract_for(name) for name in sorted(self.tables)},
        }
