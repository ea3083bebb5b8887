"""The assets every connector shares: ``<connector>/coerced`` and ``<connector>/committed``.

A connector kind contributes only its ``ingest`` asset (what to read: dropped
files, Kafka offset ranges); coercion and the exactly-once commit are the same
code for every source. Only ``committed`` writes: its body runs the one applying
transaction (:mod:`idem_platform.defs.connector.commit`).
"""

import dagster as dg

from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.defs.connector.commit import committed_result, run_commit
from idem_platform.defs.connector.names import asset_keys, group_of
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.defs.summary import METADATA_GLOSSARY
from idem_platform.defs.tables import declared_schema
from idem_platform.pipeline.ingest import CoercedBatch, current_tables
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.write.batch import SourceBatch


def table_definitions(idem_config: IdemConfig, connector: ConnectorConfig) -> dict[str, dg.MetadataValue]:
    """What ``committed`` writes, shown before its first run: the tables and their declared columns."""
    specs = idem_config.tables_for(connector)
    metadata: dict[str, dg.MetadataValue] = {
        "writes": dg.MetadataValue.md("\n".join(f"* `{qualified_table_name(name)}`" for name in sorted(specs))),
    }
    for name, spec in sorted(specs.items()):
        schema = declared_schema(spec, meta_column=connector.meta_column)
        metadata[f"columns/{name}"] = dg.MetadataValue.table_schema(schema)
    return metadata


def single_run_policy(partitions: dg.PartitionsDefinition | None) -> dg.BackfillPolicy | None:
    """One run for many partitions (a file-drop batch, a backfill): ``single_run`` for partitioned assets.

    A run over a range of dropped files commits them in one transaction, each file
    keeping its ledger key; Dagster records a materialization per partition of the
    range. Unpartitioned assets (Kafka) have nothing to group.
    """
    return dg.BackfillPolicy.single_run() if partitions is not None else None


def build_commit_assets(
    idem_config: IdemConfig,
    connector: ConnectorConfig,
    partitions: dg.PartitionsDefinition | None,
    resource_keys: ResourceKeys = DEFAULT_KEYS,
) -> list[dg.AssetsDefinition]:
    """``coerced`` and ``committed`` downstream of the connector's ``ingest``."""
    ingest_key, coerced_key, committed_key = asset_keys(connector)
    group = group_of(connector)
    tags = {"idem/connector": connector.name}
    noun = "messages" if connector.kind == "kafka" else "lines"

    @dg.asset(
        key=coerced_key,
        ins={"ingest": dg.AssetIn(ingest_key)},
        partitions_def=partitions,
        backfill_policy=single_run_policy(partitions),
        io_manager_key=resource_keys.plan_io_manager,
        required_resource_keys={resource_keys.postgres},
        group_name=group,
        kinds={"spark", "python"},
        tags=tags,
        description=(
            f"The {noun} parsed, keyed and coerced to the catalog's column types by per-record Python "
            "running inside Spark tasks over Arrow batches: at commit time each slice's task "
            f"coerces and stages its {noun}; readers of the lazy frame get the same code through "
            f"mapInArrow. Bad {noun} become rejects with every reason; good rows carry their "
            "record key. Lazy, like ingest. Idempotent. Metadata: `dagster/row_count` (the "
            f"{noun} to coerce, one row each, those of files or ranges committed before left out: how many "
            "pass is `committed`'s figures), "
            "`record_types` and, per record type, its catalog `columns`, `schema_versions` and "
            "`schema_contracts`."
        ),
    )
    def coerced(context: dg.AssetExecutionContext, ingest: SourceBatch) -> dg.Output[CoercedBatch]:
        tables = current_tables(resource_keys.postgres_of(context).resolved_url, idem_config, connector)
        value = CoercedBatch(ingest, connector, tables)
        # The frame is lazy: one row per record it reads (good or rejected); units committed
        # before (replays) are never read again.
        rows = {"dagster/row_count": sum(unit.records for unit in ingest.pending)}
        return dg.Output(value, metadata=to_metadata({**rows, **value.metadata()}))

    replay = (
        "Re-materializing a committed range writes nothing and reports the prior commit (replayed=true); "
        "a run whose range another run committed first commits nothing (range already committed)."
        if connector.kind == "kafka"
        else "Re-materializing a committed file writes nothing and reports the prior commit (replayed=true)."
    )
    moves = " moves the Kafka offsets (compare-and-set)," if connector.kind == "kafka" else ""

    @dg.asset(
        key=committed_key,
        ins={"coerced": dg.AssetIn(coerced_key)},
        partitions_def=partitions,
        backfill_policy=single_run_policy(partitions),
        io_manager_key=resource_keys.warehouse_io_manager,
        required_resource_keys={resource_keys.postgres, resource_keys.spark},
        group_name=group,
        kinds={"postgres"},
        tags=tags,
        metadata=table_definitions(idem_config, connector),
        description=(
            "The batch committed to PostgreSQL exactly once: one transaction widens the tables, "
            f"inserts rows new by key,{moves} records rejects, the execution log, the commit "
            f"and the ledger. {replay}\n\n{METADATA_GLOSSARY}"
        ),
    )
    def committed(context: dg.AssetExecutionContext, coerced: CoercedBatch) -> dg.MaterializeResult:
        postgres = resource_keys.postgres_of(context)
        summary = run_commit(context, coerced, postgres, resource_keys.spark_of(context))
        return committed_result(context, coerced, summary, postgres)

    return [coerced, committed]
