"""The Kafka ``ingest`` asset; ``coerced`` and ``committed`` come from :mod:`idem_platform.defs.connector`.

Not partitioned: a topic is a stream, and each materialization commits the
offset ranges it read (its metadata names them). Run in one process
(``in_process_executor``) so the Spark session is shared by the steps of a run.
"""

import dagster as dg
from pydantic import Field

from idem_platform.config import IdemConfig, KafkaConnector
from idem_platform.defs.connector.assets import build_commit_assets
from idem_platform.defs.connector.names import asset_keys, group_of
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.pipeline.ingest import check_cluster_reach, plan_batch, prepare_tables
from idem_platform.redact import secrets_kept
from idem_platform.sources.kafka.ranges import RangeRequest
from idem_platform.write.batch import SourceBatch


class KafkaRange(dg.Config):
    """Offsets ``[start, end)`` of one partition."""

    topic: str = Field(description="The topic.")
    partition: int = Field(ge=0, description="The partition.")
    start: int = Field(ge=0, description="First offset read: the partition's committed offset.")
    end: int = Field(ge=0, description="First offset not read.")


class KafkaIngestConfig(dg.Config):
    """Run config of ``<connector>/ingest`` for a Kafka connector."""

    ranges: list[KafkaRange] = Field(
        default_factory=list,
        description="Offset ranges to read (what the sensor requests). Empty: every partition from "
        "its committed offset to the end the brokers report now.",
    )


def build_kafka_assets(
    idem_config: IdemConfig, connector: KafkaConnector, resource_keys: ResourceKeys = DEFAULT_KEYS
) -> list[dg.AssetsDefinition]:
    """The asset factory: three assets per Kafka connector (``resource_keys``: its database's resources)."""
    ingest_key, _, _ = asset_keys(connector)
    topics = ", ".join(connector.topics or [])

    @dg.asset(
        key=ingest_key,
        io_manager_key=resource_keys.plan_io_manager,
        required_resource_keys={resource_keys.postgres, resource_keys.spark},
        group_name=group_of(connector),
        kinds={"spark", "kafka"},
        tags={"idem/connector": connector.name},
        description=(
            f"Messages of the Kafka topics {topics}: per partition, the offsets from the one committed "
            "in idem.source_offsets to the end a read_committed reader can reach. Ranges already "
            "committed are replays and are never read again. The messages are read by Spark "
            "executors, each assigned its own offsets (no consumer group join), when the batch is "
            "committed. Idempotent."
        ),
    )
    def ingest(context: dg.AssetExecutionContext, config: KafkaIngestConfig) -> dg.Output[SourceBatch]:
        postgres, spark = resource_keys.postgres_of(context), resource_keys.spark_of(context)
        requests = [RangeRequest(r.topic, r.partition, r.start, r.end) for r in config.ranges] or None
        with secrets_kept():  # neither the URL's password nor client_config's secrets in the run log
            check_cluster_reach(spark.master, postgres.resolved_url)  # fail at start, not at commit
            prepare_tables(postgres.resolved_url, idem_config, connector)
            batch = plan_batch(postgres.resolved_url, connector, ranges=requests)
        context.log.info(
            "%d range(s), %d offsets; %d already committed%s",
            len(batch.units), sum(u.records for u in batch.units), len(batch.replayed),
            "".join(f"; {note}" for note in batch.notes),
        )
        return dg.Output(batch, metadata=to_metadata(batch.metadata()))

    return [ingest, *build_commit_assets(idem_config, connector, None, resource_keys)]
