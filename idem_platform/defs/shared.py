"""One resource object per key and settings per process: what lets several idem components load together.

``Definitions.merge`` (and ``dg``'s loading of a project's components) refuses two
*different objects* under one resource key, even equal ones: it checks identity. So
the resources of a database are built once per process and handed to every component
that uses that database: the same PostgreSQL settings give the same ``idem_postgres``
object, the same Spark settings the same ``idem_spark``, and their IO managers follow.

Different settings under one key are a real conflict (two Spark configurations for one
database's runs): they get different objects, and loading both in one code location
fails, which :class:`~idem_platform.defs.component.IdemComponent` reports naming both
components. A database named by another environment variable has keys of its own
(:class:`~idem_platform.defs.resources.ResourceKeys`), so it never conflicts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import dagster as dg

from idem_platform.config import IdemConfig
from idem_platform.defs.io_managers import SparkPlanIOManager, TableIOManager, WarehouseIOManager
from idem_platform.defs.resources import (
    ConfigsByTable,
    PostgresResource,
    ResourceKeys,
    SparkResource,
)

T = TypeVar("T")

_objects: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def shared(identity: tuple[Any, ...], build: Callable[[], T]) -> T:
    """The one object for ``identity`` in this process, built on first use."""
    with _lock:
        if identity not in _objects:
            _objects[identity] = build()
        built: T = _objects[identity]
        return built


def spark_settings(spark_config: dict[str, Any]) -> str:
    """Spark settings as one comparable text (what two components on one database must agree on)."""
    return json.dumps(spark_config, sort_keys=True, default=str)


def database_resources(
    keys: ResourceKeys, url: str | dg.EnvVar | None, spark_config: dict[str, Any], config: IdemConfig
) -> dict[str, object]:
    """The resources of one database under ``keys``: PostgreSQL, Spark and the three IO managers.

    ``idem_postgres`` and ``idem_spark`` are bound with ``configure_at_launch``: their
    values are the defaults a run's config (the Launchpad) may replace, and the IO
    managers' nested references then resolve to these top-level resources. A fully bound
    nested resource would be a separate copy that keeps the bound values, so a run
    pointed at a cluster through the ``idem_spark`` resource's config would still commit
    on ``local[*]``.
    """
    # An EnvVar refuses str(): it is its name that identifies it.
    setting = ("env", url.env_var_name) if isinstance(url, dg.EnvVar) else ("value", url)
    postgres = shared(("postgres", keys.postgres, setting), lambda: PostgresResource.configure_at_launch(url=url))
    spark = shared(
        ("spark", keys.spark, spark_settings(spark_config)),
        lambda: SparkResource.configure_at_launch(spark_config=spark_config),
    )
    return {
        keys.postgres: postgres,
        keys.spark: spark,
        keys.plan_io_manager: shared(("plan",), SparkPlanIOManager),
        keys.warehouse_io_manager: shared(
            ("warehouse", keys.warehouse_io_manager, id(postgres), id(spark)),
            lambda: WarehouseIOManager(),
        ),
        # Loads the idem/<record_type> table assets for downstream assets (read-only).
        keys.table_io_manager: _table_io_manager(keys, postgres, spark, config),
    }


def _table_io_manager(keys: ResourceKeys, postgres: Any, spark: Any, config: IdemConfig) -> TableIOManager:
    """The database's table IO manager, knowing ``config``'s record types.

    Configs that agree on every record type they share get one manager. A config that
    declares a type differently from one already registered (a test building another
    catalog against the same database, or a real conflict) gets a manager of its own.
    """
    generation = 0
    while True:
        catalog, manager = shared(
            ("table", keys.table_io_manager, id(postgres), id(spark), generation),
            lambda: _new_table_io_manager(postgres, spark),
        )
        with _lock:
            if not catalog.conflicts(config):
                catalog.add(config)
                return manager
        generation += 1


def _new_table_io_manager(postgres: Any, spark: Any) -> tuple[ConfigsByTable, TableIOManager]:
    catalog = ConfigsByTable()
    manager = TableIOManager(
        postgres=postgres, spark=spark, configs=dg.ResourceDefinition.hardcoded_resource(catalog)
    )
    return catalog, manager
