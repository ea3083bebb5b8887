"""The three assets of a file-drop connector: ``ingest`` → ``coerced`` → ``committed``.

Partitioned by dropped file; run in one process (``in_process_executor``) so the
Spark session is shared by the steps of a run. Only ``committed`` writes: its IO
manager runs the one promoting transaction.
"""


from pathlib import Path

import dagster as dg
from pydantic import Field

from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.defs.filedrop.partitions import path_for_partition
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import PostgresResource, SparkResource
from idem_platform.pipeline import (
    CoercedBatch,
    IngestBatch,
    check_cluster_reach,
    current_tables,
    plan_batch,
)
from idem_platform.postgres.tables import sync_tables

PLAN_IO_MANAGER = "spark_plan_io_manager"
WAREHOUSE_IO_MANAGER = "warehouse_io_manager"


class IngestConfig(dg.Config):
    """Run config of ``<connector>/ingest``."""

    files: list[str] = Field(
        default_factory=list,
        description="Files to ingest in one commit. Empty: the partition's file in the drop directory.",
    )


def asset_keys(connector: ConnectorConfig) -> tuple[dg.AssetKey, dg.AssetKey, dg.AssetKey]:
    """``<connector>/ingest``, ``<connector>/coerced``, ``<connector>/committed``."""
    return (
        dg.AssetKey([connector.name, "ingest"]),
        dg.AssetKey([connector.name, "coerced"]),
        dg.AssetKey([connector.name, "committed"]),
    )


def build_filedrop_assets(
    idem_config: IdemConfig, connector: ConnectorConfig, partitions: dg.DynamicPartitionsDefinition
) -> list[dg.AssetsDefinition]:
    """The asset factory: three assets per file-drop connector."""
    ingest_key, coerced_key, committed_key = asset_keys(connector)
    group = connector.name.replace("-", "_")
    tags = {"idem/connector": connector.name}

    @dg.asset(
        key=ingest_key,
        partitions_def=partitions,
        io_manager_key=PLAN_IO_MANAGER,
        group_name=group,
        kinds={"spark", "file"},
        tags=tags,
        description=(
            f"Lines of the files dropped into {connector.path}. Hashes each file once, in chunks "
            "(file key, line count, line-aligned splits) and checks the ledger: files already "
            "committed are replays and are never read again. The lines themselves are read by "
            "Spark executors, split by split, when the batch is committed. Idempotent."
        ),
    )
    def ingest(
        context: dg.AssetExecutionContext, config: IngestConfig, postgres: PostgresResource, spark: SparkResource
    ) -> dg.Output[IngestBatch]:
        check_cluster_reach(spark.master, postgres.resolved_url)  # fail at start, not at commit
        paths = [Path(p) for p in config.files] or [path_for_partition(connector, context.partition_key)]
        with postgres.connection(autocommit=True) as conn:
            sync_tables(conn, idem_config.table_specs)
        batch = plan_batch(postgres.resolved_url, connector, paths)
        context.log.info(
            "%d file(s), %d lines; %d already committed", len(batch.files), sum(f.lines for f in batch.files), len(batch.replayed)
        )
        return dg.Output(batch, metadata=to_metadata(batch.metadata()))

    @dg.asset(
        key=coerced_key,
        ins={"ingest": dg.AssetIn(ingest_key)},
        partitions_def=partitions,
        io_manager_key=PLAN_IO_MANAGER,
        group_name=group,
        kinds={"spark", "python"},
        tags=tags,
        description=(
            "The lines parsed, keyed and coerced to the catalog (DESIGN §3) by per-record Python "
            "running inside Spark tasks over Arrow batches: at commit time each split's task "
            "coerces and stages its lines; readers of the lazy frame get the same code through "
            "mapInArrow. Bad lines become rejects with every reason; good rows carry their "
            "record key. Lazy, like ingest. Idempotent."
        ),
    )
    def coerced(context: dg.AssetExecutionContext, ingest: IngestBatch, postgres: PostgresResource) -> dg.Output[CoercedBatch]:
        tables = current_tables(postgres.resolved_url, idem_config, connector)
        value = CoercedBatch(ingest, connector, tables)
        return dg.Output(value, metadata=to_metadata(value.metadata()))

    @dg.asset(
        key=committed_key,
        ins={"coerced": dg.AssetIn(coerced_key)},
        partitions_def=partitions,
        io_manager_key=WAREHOUSE_IO_MANAGER,
        group_name=group,
        kinds={"postgres"},
        tags=tags,
        description=(
            "The batch committed to PostgreSQL exactly once: one transaction widens the tables, "
            "inserts rows new by key, records rejects, the execution log, the commit and the "
            "ledger. Re-materializing a committed file writes nothing and reports the prior "
            "commit (replayed=true)."
        ),
    )
    def committed(coerced: CoercedBatch) -> CoercedBatch:
        return coerced

    return [ingest, coerced, committed]
