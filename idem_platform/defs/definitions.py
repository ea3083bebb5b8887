"""Build the whole code location from an :class:`IdemConfig` (the asset factory's entry point)."""

from __future__ import annotations

import hashlib
import os
import sys
from typing import assert_never

import dagster as dg

from idem_platform.config import FileConnectorBase, IdemConfig, KafkaConnector
from idem_platform.defs.effects import effects_definitions
from idem_platform.defs.filedrop.definitions import filedrop_definitions
from idem_platform.defs.kafka.definitions import kafka_definitions
from idem_platform.defs.maintenance import ledger_purge
from idem_platform.defs.migrate import JOB_NAME as MIGRATE_JOB
from idem_platform.defs.migrate import migrate_job
from idem_platform.defs.rejects import rejects_definitions
from idem_platform.defs.resources import ResourceKeys
from idem_platform.defs.retype import JOB_NAME as RETYPE_JOB
from idem_platform.defs.retype import retype_job
from idem_platform.defs.shared import database_resources
from idem_platform.defs.tables import table_asset_specs
from idem_platform.migrations import load_modules
from idem_platform.redact import remember_url, url_secrets
from idem_platform.settings import POSTGRES_URL_ENV, postgres_url_from_environment
from idem_platform.spark.session import spark_config_for


def resources_for(
    config: IdemConfig, *, postgres_url: str | None = None, postgres_url_env: str = POSTGRES_URL_ENV
) -> dict[str, object]:
    """``idem_postgres``, ``idem_spark`` and the IO managers, configured from ``config``.

    Built once per database and settings in a process (:mod:`idem_platform.defs.shared`),
    under the keys of :class:`~idem_platform.defs.resources.ResourceKeys`.

    Args:
        config: the parsed idem.yaml.
        postgres_url: an explicit URL (tests, embedding); default the variable
            ``postgres_url_env`` as a Dagster ``EnvVar`` (read at launch, hidden in the UI);
            ``IDEM_POSTGRES_URL`` unset means the embedded server. An explicit URL with a
            password is handed over as an ``EnvVar`` too (see :func:`_hidden_url`).
        postgres_url_env: the environment variable holding the database's URL; another
            than ``IDEM_POSTGRES_URL`` gives the database keys of its own.
    """
    url: str | dg.EnvVar | None = postgres_url
    if url is not None and url_secrets(url):
        url = _hidden_url(url)
    elif url is None and (postgres_url_env != POSTGRES_URL_ENV or postgres_url_from_environment()):
        url = dg.EnvVar(postgres_url_env)
    spark_config = spark_config_for(config.spark_master(), dict(config.spark.conf))
    return database_resources(ResourceKeys.for_env(postgres_url_env), url, spark_config, config)


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

    load_modules(config.assets, config.source.parent if config.source else None, what="assets")
    modules = [sys.modules[name] for name in config.assets]
    return dg.Definitions(
        assets=dg.load_assets_from_modules(modules), asset_checks=dg.load_asset_checks_from_modules(modules)
    )


def build_definitions(
    config: IdemConfig,
    *,
    postgres_url: str | None = None,
    files_outside_drop_dir: bool = False,
    postgres_url_env: str = POSTGRES_URL_ENV,
    job_suffix: str = "",
    purge: bool = True,
) -> dg.Definitions:
    """Definitions for every connector in ``config`` plus the shared resources and schedules.

    The one builder of both ways to run idem: the standalone code location
    (``idem_platform.definitions``, ``workspace.yaml``, ``idem dev``) and each
    :class:`~idem_platform.defs.component.IdemComponent` of a ``dg`` project.
    No executor is set on the definitions: idem's jobs run in process by their own
    ``executor_def`` (the steps share one Spark session), and a project's own assets keep
    the project's executor.

    ``files_outside_drop_dir`` lets a file-drop ``ingest`` read files named anywhere:
    only for ``idem ingest``, which builds its definitions in process for a user who
    may read any file of their own. The code location (``dagster dev``, the daemon)
    never sets it, so a run launched from the UI reads only its drop directory.

    ``postgres_url_env`` names the database (see :func:`resources_for`); ``job_suffix``
    is appended to the jobs made from the whole config (``idem_migrate``,
    ``idem_retype``, ``idem_effects_deliver`` and its sensor), so two components' jobs never share a name.
    ``purge=False`` leaves out the database's ``ledger_purge_job`` and its hourly schedule
    (Dagster takes one job and schedule of a name: of the components on one database, one
    brings them).

    Raises:
        ConfigError: a ``migrations:`` module cannot be imported (:meth:`IdemConfig.chains`).
    """
    config.chains()  # a broken migration chain fails the code location's load, naming the type and the step
    keys = ResourceKeys.for_env(postgres_url_env)
    parts = []
    for connector in config.connectors:
        if isinstance(connector, FileConnectorBase):  # filedrop, and http/otlp whose bodies idem serve lands as files
            parts.append(
                filedrop_definitions(
                    config, connector, files_outside_drop_dir=files_outside_drop_dir, resource_keys=keys
                )
            )
        elif isinstance(connector, KafkaConnector):
            parts.append(kafka_definitions(config, connector, keys))
        else:  # every kind is one of the two: mypy holds ConnectorConfig to that
            assert_never(connector)
        parts.append(rejects_definitions(config, connector, keys))  # <connector>_retry_rejects
    # idem/<record_type>: one asset per table, downstream of the connectors that write it.
    parts.append(dg.Definitions(assets=table_asset_specs(config, keys)))
    parts.append(effects_definitions(config, keys, job_suffix))  # idem_effects_deliver, its sensor, effects_owed
    parts.append(user_definitions(config))
    purge_job, schedule = ledger_purge(keys)
    base = dg.Definitions(
        jobs=[
            *([purge_job] if purge else []),
            retype_job(config, keys, name=RETYPE_JOB + job_suffix),
            migrate_job(config, keys, name=MIGRATE_JOB + job_suffix),
        ],
        schedules=[schedule] if purge else [],
        resources=resources_for(config, postgres_url=postgres_url, postgres_url_env=postgres_url_env),
    )
    return dg.Definitions.merge(base, *parts)
