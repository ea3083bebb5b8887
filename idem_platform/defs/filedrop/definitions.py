"""Everything one file-drop connector contributes: assets, checks, job, sensor."""

from __future__ import annotations

import dagster as dg

from idem_platform.config import FileConnector, IdemConfig
from idem_platform.defs.connector.checks import build_checks
from idem_platform.defs.connector.names import asset_keys, job_name
from idem_platform.defs.filedrop.assets import build_filedrop_assets
from idem_platform.defs.filedrop.partitions import partitions_for
from idem_platform.defs.filedrop.sensors import build_filedrop_sensor
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys


def filedrop_definitions(
    config: IdemConfig,
    connector: FileConnector,
    *,
    files_outside_drop_dir: bool = False,
    resource_keys: ResourceKeys = DEFAULT_KEYS,
) -> dg.Definitions:
    """Assets, checks, the ingest job and the sensor of ``connector``
    (``files_outside_drop_dir``: see :func:`~idem_platform.defs.filedrop.assets.files_to_read`;
    ``resource_keys``: the resources of its database)."""
    partitions = partitions_for(connector)
    assets = build_filedrop_assets(
        config, connector, partitions, files_outside_drop_dir=files_outside_drop_dir, resource_keys=resource_keys
    )
    ingest_key, coerced_key, committed_key = asset_keys(connector)
    checks = build_checks(connector, coerced_key, committed_key, partitions, resource_keys)
    job = dg.define_asset_job(
        name=job_name(connector),
        selection=dg.AssetSelection.assets(*asset_keys(connector)),
        partitions_def=partitions,
        executor_def=dg.in_process_executor,
        description=(
            f"Ingest, coerce and commit dropped files of {connector.name} exactly once: one file's "
            "partition, or a range of them (the sensor's batches, backfills) in one commit."
        ),
    )
    sensor = build_filedrop_sensor(
        connector, job, partitions, ingest_key.to_python_identifier(), config.shown(connector.path), resource_keys
    )
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=[job], sensors=[sensor])
