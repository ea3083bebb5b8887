"""Dagster's PostgreSQL storage with a kept connection, for every process of the instance.

dagster-postgres opens a new PostgreSQL session for every statement outside the
webserver (``NullPool``: no connection held per ``DagsterInstance``). A run of idem
stores a hundred or more events, and a batch run over N files' partitions stores
N planned materializations per asset when the daemon creates it and N
materializations per asset when it ends: at ~15 ms a session on a TCP server, a
500-file batch spent ~17 s of the daemon's time per asset creating its run, and as
much again in the run. :func:`pool_storage_connections`
only reached the events after a run's resources started, and never the daemon's.

These classes are dagster-postgres's own, switched at construction to the pooled
engine Dagster gives its webserver (``optimize_for_webserver``: one connection kept,
up to four more under concurrent use; ``statement_timeout=0`` keeps PostgreSQL's
default of none). ``dagster.yaml`` names them (``run_storage``, ``event_log_storage``)
instead of the combined ``storage: postgres:``; the tables and their migrations are
the same, so an instance can switch between the two forms either way.

The event log also turns on Dagster's batched event writes (``DAGSTER_EVENT_BATCH_SIZE``,
read by the instance at each event, off by default; a value the environment sets wins):
the N materializations a batch run's output reports per asset are then one ``INSERT``
and one update of the asset's row, not N of each.

``optimize_for_webserver`` is the one way dagster-postgres offers to keep a connection
(it has no pool setting in ``dagster.yaml``: dagster-io/dagster#33935); every use of it is
in this module.

A kept connection can die under the process (a PostgreSQL restart, an administrator's
``pg_terminate_backend``): the pooled connections are checked with ``SELECT 1`` as they
leave the pool (:func:`_check_alive`), so a dead one is replaced instead of failing the
next event Dagster stores. Without it the first write after the loss raised Dagster's
storage error in place of the run's own failure (the step's error was never recorded).

The figures this serves: a many-file batch's run (above), and a small ``idem ingest``
(without the pooled storages a 5-line file's median wall time was 12 % longer).

The module imports nothing of idem's core: the daemon and the webserver load it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.run_storage import PostgresRunStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config
from sqlalchemy import event, exc
from sqlalchemy.pool import QueuePool

POOL = {"statement_timeout": 0, "pool_recycle": 3600, "max_overflow": 4}
EVENT_BATCH_SIZE = "1000"


def _check_alive(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """A pool's ``checkout`` event: a connection PostgreSQL closed is replaced (SQLAlchemy's
    ``DisconnectionError`` contract) before Dagster uses it.

    Listened on every ``QueuePool`` of the process, since dagster-postgres makes its
    engines privately; in a process of idem those are Dagster's kept storage connections
    (the one-use ``NullPool`` sessions are fresh anyway).
    """
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        if not dbapi_connection.autocommit:
            dbapi_connection.rollback()
    except Exception as error:  # noqa: BLE001 - any failure of a ping means a dead connection
        raise exc.DisconnectionError(str(error)) from error


if not event.contains(QueuePool, "checkout", _check_alive):
    event.listen(QueuePool, "checkout", _check_alive)


def _settings(config_value: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "postgres_url": pg_url_from_config(config_value),
        "should_autocreate_tables": config_value.get("should_autocreate_tables", True),
        "token_provider": get_token_provider_from_config(config_value),
    }


class PooledPostgresEventLogStorage(PostgresEventLogStorage):
    """dagster-postgres's event log, keeping its connection and writing asset events in
    batches (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.optimize_for_webserver(**POOL)
        os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", EVENT_BATCH_SIZE)

    @classmethod
    def from_config_value(
        cls, inst_data: Any, config_value: Mapping[str, Any]
    ) -> PooledPostgresEventLogStorage:
        return cls(inst_data=inst_data, **_settings(config_value))


class PooledPostgresRunStorage(PostgresRunStorage):
    """dagster-postgres's run storage, keeping its connection (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.optimize_for_webserver(**POOL)

    @classmethod
    def from_config_value(
        cls, inst_data: Any, config_value: Mapping[str, Any]
    ) -> PooledPostgresRunStorage:
        return cls(inst_data=inst_data, **_settings(config_value))


def pool_storage_connections(instance: dg.DagsterInstance) -> None:
    """Have an instance's PostgreSQL storage keep its connection for the rest of this process.

    For an instance configured with dagster-postgres's own storage classes rather than
    idem's ``dagster.yaml``: outside the webserver it opens a new connection for every
    event it stores, and a run of idem stores a hundred or more (steps, logs, checks,
    one materialization per table written): on a TCP server that was ~1–2 s of a
    16-table batch's run. SQLite and in-memory storages ignore it. Once per instance:
    ``idem ingest`` pools before its run's first event; in a run the daemon launches,
    the ``postgres`` resource pools when the run first uses it.
    """
    if instance in _POOLED or isinstance(instance.event_log_storage, PooledPostgresEventLogStorage):
        return  # idem's dagster.yaml: pooled from the start
    instance.optimize_for_webserver(**POOL)
    _POOLED.add(instance)


_POOLED: weakref.WeakSet[dg.DagsterInstance] = weakref.WeakSet()
