"""The file-drop ``ingest`` asset; ``coerced`` and ``committed`` come from :mod:`idem_platform.defs.connector`.

Partitioned by dropped file; run in one process (``in_process_executor``) so the
Spark session is shared by the steps of a run.
"""

from pathlib import Path

import dagster as dg
from pydantic import Field

from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.connectors.batch import SourceBatch
from idem_platform.defs.connector.assets import (
    PLAN_IO_MANAGER,
    asset_keys,
    build_commit_assets,
    group_of,
)
from idem_platform.defs.filedrop.partitions import path_for_partition
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import PostgresResource, SparkResource
from idem_platform.pipeline import check_cluster_reach, plan_batch, prepare_tables


class IngestConfig(dg.Config):
    """Run config of ``<connector>/ingest``."""

    files: list[str] = Field(
        default_factory=list,
        description="Files to ingest in one commit. Empty: the partition's file in the drop directory.",
    )


def build_filedrop_assets(
    idem_config: IdemConfig, connector: ConnectorConfig, partitions: dg.DynamicPartitionsDefinition
) -> list[dg.AssetsDefinition]:
    """The asset factory: three assets per file-drop connector."""
    ingest_key, _, _ = asset_keys(connector)

    @dg.asset(
        key=ingest_key,
        partitions_def=partitions,
        io_manager_key=PLAN_IO_MANAGER,
        group_name=group_of(connector),
        kinds={"spark", "file"},
        tags={"idem/connector": connector.name},
        description=(
            f"Lines of the files dropped into {idem_config.shown(connector.path)} (next to the config "
            "file). Hashes each file once, in chunks "
            "(file key, line count, line-aligned splits) and checks the ledger: files already "
            "committed are replays and are never read again. The lines themselves are read by "
            "Spark executors, split by split, when the batch is committed. Idempotent."
        ),
    )
    def ingest(
        context: dg.AssetExecutionContext, config: IngestConfig, postgres: PostgresResource, spark: SparkResource
    ) -> dg.Output[SourceBatch]:
        check_cluster_reach(spark.master, postgres.resolved_url)  # fail at start, not at commit
        paths = [Path(p) for p in config.files] or [path_for_partition(connector, context.partition_key)]
        prepare_tables(postgres.resolved_url, idem_config, connector)
        batch = plan_batch(postgres.resolved_url, connector, paths)
        context.log.info(
            "%d file(s), %d lines; %d already committed",
            len(batch.units), sum(u.records for u in batch.units), len(batch.replayed),
        )
        return dg.Output(batch, metadata=to_metadata(batch.metadata()))

    return [ingest, *build_commit_assets(idem_config, connector, partitions)]
