"""Resources: PostgreSQL (``idem_postgres``) and Spark (``idem_spark``), each owning its I/O.

Every resource key idem uses is named here, once (:class:`ResourceKeys`): they are
idem's own (``idem_*``), so a project's own ``postgres`` or ``spark`` resources load
beside them, and a second database gets keys of its own.

``idem_postgres`` takes ``IDEM_POSTGRES_URL`` or starts the embedded server, and
brings the ``idem`` schema up to date when a run starts (versioned DDL under an
advisory lock, so concurrent runs are safe). ``spark`` is a lazy
session resource with idem's defaults: a run whose files are all replays never
starts a JVM.
"""


import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import dagster as dg
import psycopg
from pydantic import Field, PrivateAttr

from idem_platform.defs.storage import pool_storage_connections
from idem_platform.postgres import connect, ensure_schema, resolve_postgres_url
from idem_platform.redact import remember_url, secrets_kept
from idem_platform.settings import POSTGRES_URL_ENV
from idem_platform.spark.session import build_session, warm_up

POSTGRES_KEY = "idem_postgres"
SPARK_KEY = "idem_spark"
PLAN_IO_MANAGER_KEY = "idem_plan_io_manager"
WAREHOUSE_IO_MANAGER_KEY = "idem_warehouse_io_manager"
TABLE_IO_MANAGER_KEY = "idem_table_io_manager"


@dataclass(frozen=True)
class ResourceKeys:
    """The resource keys of one database's idem resources.

    The database named by ``IDEM_POSTGRES_URL`` (the default) uses the plain keys
    (``idem_postgres``, ``idem_spark``, ``idem_warehouse_io_manager``,
    ``idem_table_io_manager``); a database named by another environment variable gets
    them suffixed with that variable's name (``idem_postgres__team_b_url``), so two
    components on two databases load in one code location: Dagster allows one resource
    object per key. The plan IO manager has no settings and is shared by all.
    """

    suffix: str = ""

    @classmethod
    def for_env(cls, env_name: str) -> "ResourceKeys":
        """The keys of the database whose URL is in ``env_name``."""
        if env_name == POSTGRES_URL_ENV:
            return cls()
        return cls("__" + re.sub(r"[^a-z0-9_]", "_", env_name.lower()))

    @property
    def postgres(self) -> str:
        return POSTGRES_KEY + self.suffix

    @property
    def spark(self) -> str:
        return SPARK_KEY + self.suffix

    @property
    def plan_io_manager(self) -> str:
        return PLAN_IO_MANAGER_KEY

    @property
    def warehouse_io_manager(self) -> str:
        return WAREHOUSE_IO_MANAGER_KEY + self.suffix

    @property
    def table_io_manager(self) -> str:
        return TABLE_IO_MANAGER_KEY + self.suffix

    def named(self, name: str) -> str:
        """A per-database job or schedule name (``ledger_purge_job__team_b_url``)."""
        return name + self.suffix

    def postgres_of(self, context: Any) -> "PostgresResource":
        """This database's ``PostgresResource`` from an op's, asset's, check's or sensor's context
        (declared in its ``required_resource_keys``)."""
        return cast(PostgresResource, getattr(context.resources, self.postgres))

    def spark_of(self, context: Any) -> "SparkResource":
        """This database's ``SparkResource`` from a context (see :meth:`postgres_of`)."""
        return cast(SparkResource, getattr(context.resources, self.spark))


DEFAULT_KEYS = ResourceKeys()


class ConfigsByTable:
    """The configs whose tables live in one database, by record type: what the database's
    ``idem_table_io_manager`` reads a table asset with (its catalog and migrations).

    One object per database and process, filled as components load, so every component on
    that database shares one table IO manager (:mod:`idem_platform.defs.shared`).
    """

    def __init__(self) -> None:
        self._configs: dict[str, Any] = {}
        self._results: dict[str, Any] = {}  # an effect's results table -> the config declaring it

    @staticmethod
    def _results_of(config: Any) -> list[str]:
        return [effect.results_table for effect in config.effects if effect.results_table]

    def conflicts(self, config: Any) -> bool:
        """Whether ``config`` declares a record type or results table another config here declares differently."""
        return any(name in self._configs and self._configs[name] != config for name in config.table_specs) or any(
            name in self._results and self._results[name] != config for name in self._results_of(config)
        )

    def add(self, config: Any) -> None:
        for name in config.table_specs:
            self._configs[name] = config
        for name in self._results_of(config):
            self._results[name] = config

    def results(self, name: str | None) -> Any:
        """The ``IdemConfig`` with an effect whose ``results_table`` is ``name``, else None."""
        return self._results.get(name) if name is not None else None

    def get(self, record_type: str | None) -> Any:
        """The ``IdemConfig`` declaring ``record_type``, else None."""
        return self._configs.get(record_type) if record_type is not None else None

    def names(self) -> list[str]:
        """The record types and results tables known here."""
        return sorted({*self._configs, *self._results})


class PostgresResource(dg.ConfigurableResource):
    """PostgreSQL for the ledger, the catalog and the warehouse tables.

    Leave ``url`` unset to use ``IDEM_POSTGRES_URL`` or, without it, the embedded
    server under ``.idem/`` (started on first use, kept running).
    """

    url: str | None = Field(
        default=None,
        description=(
            "libpq URL; unset = $IDEM_POSTGRES_URL, else the embedded server under .idem/. A URL with "
            "a password belongs in an environment variable ({env: MY_URL}): a value typed here is "
            "stored with the run and shown to whoever opens it."
        ),
    )
    _resolved: str | None = PrivateAttr(default=None)

    @property
    def resolved_url(self) -> str:
        """The URL actually used (starting the embedded server if that is the default).

        Its password is remembered for :func:`~idem_platform.redact.scrub`: libpq
        echoes a URL it cannot parse whole, and Dagster would store that message.
        """
        if self._resolved is None:
            self._resolved = resolve_postgres_url(self.url)
            remember_url(self._resolved)
        return self._resolved

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        if context.instance is not None:
            pool_storage_connections(context.instance)
        with secrets_kept(), connect(self.resolved_url, autocommit=True) as conn:
            applied = ensure_schema(conn)
        if applied and context.log:
            context.log.info("idem schema upgraded to versions %s", applied)

    @contextmanager
    def connection(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection]:
        """A short-lived connection (closed on exit); a failure never shows the password."""
        with secrets_kept(), connect(self.resolved_url, autocommit=autocommit) as conn:
            yield conn


WARM_UP_TAG = "idem/file_key"


class SparkResource(dg.ConfigurableResource):
    """A Spark session with idem's defaults and data sources registered, started lazily.

    A run whose files are all replays never touches ``spark_session`` and so never
    starts a JVM. ``spark_config`` takes any Spark setting; ``spark.master`` defaults
    to the value from ``IDEM_SPARK_MASTER``, ``idem.yaml`` or ``local[*]``.

    Our own resource rather than dagster-pyspark's ``LazyPySparkResource``: that one
    builds its session in a private hook, and idem needs its own builder
    (:func:`~idem_platform.spark.session.build_session`: Spark Connect, data sources).
    """

    spark_config: dict[str, Any] = Field(
        default_factory=dict, description="Spark settings for the run's session (spark.master, spark.remote, …)."
    )
    _session: Any = PrivateAttr(default=None)

    @property
    def spark_session(self) -> Any:
        """The run's ``SparkSession``, built on first use and kept for the process."""
        if self._session is None:
            self._session = build_session({k: str(v) for k, v in self.spark_config.items()})
        return self._session

    @property
    def master(self) -> str:
        return str(self.spark_config.get("spark.master", "local[*]"))

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Runs the sensor launched are for files not committed yet: they will
        # need Spark, so start it now, in the background, while the first steps run.
        run = context.dagster_run
        if run is not None and WARM_UP_TAG in run.tags:
            warm_up({k: str(v) for k, v in self.spark_config.items()})

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        # The session lives as long as the process (code servers reuse it).
        return None

