"""Build the whole code location from an :class:`IdemConfig` (the asset factory's entry point)."""

from __future__ import annotations

import hashlib
import os
from typing import assert_never

import dagster as dg

from idem_platform.config import FileConnectorBase, IdemConfig, KafkaConnector
from idem_platform.defs.filedrop.definitions import filedrop_definitions
from idem_platform.defs.io_managers import SparkPlanIOManager, TableIOManager, WarehouseIOManager
from idem_platform.defs.kafka.definitions import kafka_definitions
from idem_platform.defs.maintenance import ledger_purge_job, ledger_purge_schedule
from idem_platform.defs.migrate import migrate_job
from idem_platform.defs.rejects import rejects_definitions
from idem_platform.defs.resources import PostgresResource, SparkResource
from idem_platform.defs.retype import promote_column_job
from idem_platform.defs.tables import TABLE_IO_MANAGER, table_asset_specs
from idem_platform.redact import remember_url, url_secrets
from idem_platform.settings import POSTGRES_URL_ENV, postgres_url_from_environment
from idem_platform.spark.session import spark_config_for


def resources_for(config: IdemConfig, *, postgres_url: str | None = None) -> dict[str, object]:
    """``postgres``, ``spark`` and the IO managers, configured from ``config``.

    ``postgres`` and ``spark`` are bound with ``configure_at_launch``: their
    values from idem.yaml are the defaults a run's config (the Launchpad) may
    replace, and the IO manager's nested references then resolve to these
    top-level resources. A fully bound nested resource would be a separate copy
    that keeps the bound values, so a run pointed at a cluster through the
    ``spark`` resource's config would still commit on ``local[*]``.

    Args:
        config: the parsed idem.yaml.
        postgres_url: an explicit URL (tests, embedding); default ``IDEM_POSTGRES_URL``
            as a Dagster ``EnvVar`` (read at launch, hidden in the UI), else embedded.
            An explicit URL with a password is handed over as an ``EnvVar`` too (see
            :func:`_hidden_url`).
    """
    url: str | dg.EnvVar | None = postgres_url
    if url is None and postgres_url_from_environment():
        url = dg.EnvVar(POSTGRES_URL_ENV)
    elif url is not None and url_secrets(url):
        url = _hidden_url(url)
    postgres = PostgresResource.configure_at_launch(url=url)
    spark = SparkResource.configure_at_launch(
        spark_config=spark_config_for(config.spark_master(), dict(config.spark.conf))
    )
    return {
        "postgres": postgres,
        "spark": spark,
        "spark_plan_io_manager": SparkPlanIOManager(),
        "warehouse_io_manager": WarehouseIOManager(),
        # Loads the idem/<record_type> table assets for downstream assets (read-only).
        TABLE_IO_MANAGER: TableIOManager(
            postgres=postgres, spark=spark, idem_config=dg.ResourceDefinition.hardcoded_resource(config)
        ),
    }


def _hidden_url(url: str) -> dg.EnvVar:
    """An explicit URL with a password, as an environment variable Dagster reads at launch.

    A plain value would be the resource's config default: Dagster stores it in the
    job snapshot and the Launchpad shows it to everyone. An ``EnvVar`` shows only its
    name. The variable is this process's own (``IDEM_POSTGRES_URL_<digest>``), so
    two URLs in one process never overwrite each other.
    """
    name = f"{POSTGRES_URL_ENV}_{hashlib.sha256(url.encode()).hexdigest()[:12].upper()}"
    if postgres_url_from_environment() == url:
        name = POSTGRES_URL_ENV
    os.environ[name] = url
    remember_url(url)
    return dg.EnvVar(name)


def user_definitions(config: IdemConfig) -> dg.Definitions:
    """The assets and asset checks of the modules ``idem.yaml`` lists under ``assets:``.

    Your own assets join the one code location the config generates (``idem dev``,
    ``make dev``, ``workspace.yaml``): typically assets that read idem's table assets.

    Raises:
        ConfigError: a module cannot be imported (naming it).
    """
    if not config.assets:
        return dg.Definitions()
    import sys

    from idem_platform.migrations import load_modules

    load_modules(config.assets, config.source.parent if config.source else None, what="assets")
    modules = [sys.modules[name] for name in config.assets]
    return dg.Definitions(
        assets=dg.load_assets_from_modules(modules), asset_checks=dg.load_asset_checks_from_modules(modules)
    )


def build_definitions(
    config: IdemConfig, *, postgres_url: str | None = None, files_outside_drop_dir: bool = False
) -> dg.Definitions:
    """Definitions for every connector in ``config`` plus the shared resources and schedules.

    ``files_outside_drop_dir`` lets a file-drop ``ingest`` read files named anywhere:
    only for ``idem ingest``, which builds its definitions in process for a user who
    may read any file of their own. The code location (``dagster dev``, the daemon)
    never sets it, so a run launched from the UI reads only its drop directory.

    Raises:
        ConfigError: a ``migrations:`` module cannot be imported (:meth:`IdemConfig.chains`).
    """
    config.chains()  # a broken migration chain fails the code location's load, naming the type and the step
    parts = []
    for connector in config.connectors:
        if isinstance(connector, FileConnectorBase):  # filedrop, and http/otlp whose bodies idem serve lands as files
            parts.append(filedrop_definitions(config, connector, files_outside_drop_dir=files_outside_drop_dir))
        elif isinstance(connector, KafkaConnector):
            parts.append(kafka_definitions(config, connector))
        else:  # every kind is one of the two: mypy holds ConnectorConfig to that
            assert_never(connector)
        parts.append(rejects_definitions(config, connector))  # <connector>_retry_rejects
    # idem/<record_type>: one asset per table, downstream of the connectors that write it.
    parts.append(dg.Definitions(assets=table_asset_specs(config)))
    parts.append(user_definitions(config))
    base = dg.Definitions(
        # Every job runs its steps in one process, the implicit asset job of the UI's
        # "Materialize" and backfills included: the steps share one Spark session, and
        # a replay costs seconds, not a process per step.
        executor=dg.in_process_executor,
        jobs=[ledger_purge_job, promote_column_job(config), migrate_job(config)],
        schedules=[ledger_purge_schedule],
        resources=resources_for(config, postgres_url=postgres_url),
    )
    return dg.Definitions.merge(base, *parts)
