"""Resources: PostgreSQL (``postgres``) and Spark (``spark``), each owning its I/O.

``postgres`` takes ``IDEM_POSTGRES_URL`` or starts the embedded server, and
brings the ``idem`` schema up to date when a run starts (versioned DDL under an
advisory lock, so concurrent runs are safe). ``spark`` is dagster-pyspark's lazy
session resource with idem's defaults: a run whose files are all replays never
starts a JVM.
"""


import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import psycopg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr

from idem_platform.postgres import connect, ensure_schema, resolve_postgres_url
from idem_platform.redact import remember_url, secrets_kept


def pool_storage_connections(instance: dg.DagsterInstance) -> None:
    """Have Dagster's PostgreSQL storage keep its connection for the rest of this process.

    Outside the webserver, dagster-postgres opens a new connection for every event it
    stores, and a run of idem stores a hundred or more (steps, logs, checks, one
    materialization per table written): on a TCP server that was ~1–2 s of a 16-table
    batch's run. ``optimize_for_webserver`` is Dagster's own switch to a pooled engine
    (one connection kept, up to four more under concurrent use); ``statement_timeout=0``
    keeps PostgreSQL's default of none. SQLite and in-memory storages ignore it. Once
    per instance: ``idem ingest`` pools before its run's first event; in a run the daemon
    launches, :class:`PostgresResource` pools when the run first uses it (the events
    stored before that still open their own sessions).
    """
    from idem_platform.defs.storage import PooledPostgresEventLogStorage

    if instance in _POOLED or isinstance(instance.event_log_storage, PooledPostgresEventLogStorage):
        return  # idem's dagster.yaml: pooled from the start
    instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=4)
    _POOLED.add(instance)


_POOLED: weakref.WeakSet[dg.DagsterInstance] = weakref.WeakSet()


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


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session with idem's defaults and data sources registered.

    ``spark_config`` takes any Spark setting; ``spark.master`` defaults to the
    value from ``IDEM_SPARK_MASTER``, ``idem.yaml`` or ``local[*]``.
    """

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def _init_session(self) -> None:
        if self._spark_session is None:
            from idem_platform.spark.session import build_session

            self._spark_session = build_session({k: str(v) for k, v in self.spark_config.items()})

    @property
    def master(self) -> str:
        return str(self.spark_config.get("spark.master", "local[*]"))

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Runs the sensor launched are for files not committed yet: they will
        # need Spark, so start it now, in the background, while the first steps run.
        run = context.dagster_run
        if run is not None and WARM_UP_TAG in run.tags:
            from idem_platform.spark.session import warm_up

            warm_up({k: str(v) for k, v in self.spark_config.items()})

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        # The session lives as long as the process (code servers reuse it).
        return None

