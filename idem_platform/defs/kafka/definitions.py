"""Everything one Kafka connector contributes: assets, checks, job, sensor."""

from __future__ import annotations

import dagster as dg

from idem_platform.config import IdemConfig, KafkaConnector
from idem_platform.defs.connector.checks import build_checks
from idem_platform.defs.connector.names import asset_keys, job_name
from idem_platform.defs.kafka.assets import build_kafka_assets
from idem_platform.defs.kafka.sensors import build_kafka_sensor
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys


def kafka_definitions(
    config: IdemConfig, connector: KafkaConnector, resource_keys: ResourceKeys = DEFAULT_KEYS
) -> dg.Definitions:
    """Assets, checks, the ingest job and the sensor of ``connector`` (``resource_keys``: its database's)."""
    assets = build_kafka_assets(config, connector, resource_keys)
    ingest_key, coerced_key, committed_key = asset_keys(connector)
    job = dg.define_asset_job(
        name=job_name(connector),
        selection=dg.AssetSelection.assets(*asset_keys(connector)),
        executor_def=dg.in_process_executor,
        description=f"Read, coerce and commit {connector.name}'s Kafka offset ranges exactly once.",
    )
    sensor = build_kafka_sensor(connector, job, ingest_key.to_python_identifier(), resource_keys)
    checks = build_checks(connector, coerced_key, committed_key, None, resource_keys)
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=[job], sensors=[sensor])
