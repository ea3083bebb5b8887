"""``idem migrate`` itself: per record type, count, prepare, run the job, count what is left.

The entry point the CLI and the Dagster op call. It only sequences the steps the
other modules of :mod:`idem_platform.read.migrate` implement, and starts Spark
only when some table has rows to move.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.errors import ConfigError
from idem_platform.pipeline.ingest import check_cluster_reach
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.postgres.tables import table_ident
from idem_platform.read.migrate.counts import count_entry, selected_types
from idem_platform.read.migrate.job import run_job
from idem_platform.read.migrate.prepare import prepare_table
from idem_platform.read.migrate.report import build_report
from idem_platform.read.migrate.task import MigrateTask
from idem_platform.read.planner import plan_read
from idem_platform.read.upgrade import KEEP, RAISE
from idem_platform.spark.slots import task_slots

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_BATCH_ROWS = 50_000


def migrate(
    spark: SparkSession | Callable[[], SparkSession],
    url: str,
    config: IdemConfig,
    record_types: Sequence[str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    skip_failed: bool = False,
    lock_timeout_seconds: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Upgrade the old rows of the record types (default: all) in place; see :mod:`idem_platform.read.migrate`.

    Args:
        spark: the session (classic or Spark Connect) whose executors upgrade and write, or a
            function returning it: called only when some table has rows to move (a run with
            nothing to do starts no Spark).
        url: PostgreSQL, reachable from every executor.
        config: the config (its catalog and chains are the current shape).
        record_types: the tables to migrate (``None``: every declared one).
        batch_rows: rows per transaction.
        skip_failed: count rows whose migration fails and leave them, instead of failing.
        lock_timeout_seconds: how long one batch (or the DDL) keeps retrying its locks.
        progress: called with a line per table (before and after).

    Returns:
        The report of :func:`plan_migration` with ``dry_run: False`` and the counts moved.

    Raises:
        MigrationFailed: a row's migration failed (without ``skip_failed``): names the key
            and the step. Batches committed before stay.
        MigrateLockTimeout: locks stayed taken past ``lock_timeout_seconds``.
        MigrateError: an executor failed otherwise (the error's one line).
        ConfigError: an unknown record type, a bad ``batch_rows``.
        MigrationChainError: a broken chain.
    """

    if batch_rows < 1:
        raise ConfigError(f"batch rows must be at least 1 (got {batch_rows})")
    started = time.monotonic()
    chains = config.chains()
    session: SparkSession | None = None
    tables: dict[str, dict[str, Any]] = {}
    with connect(url, autocommit=True, application_name="idem-migrate") as conn:
        for record_type in selected_types(config, record_types):
            tables[record_type] = count_entry(conn, chains, record_type, config.tables[record_type].schema_version)
    for record_type, entry in tables.items():
        if not entry["rows_to_move"]:
            entry["rows_left"] = 0
            if progress is not None and entry["exists"]:
                progress(f"{qualified_table_name(record_type)}: nothing below v{entry['current_version']}")
            continue
        table_started = time.monotonic()
        if progress is not None:
            versions = ", ".join(f"v{v}: {n:,}" for v, n in entry["rows_by_version"].items())
            below = f"{entry['rows_to_move']:,} rows below v{entry['current_version']}"
            progress(f"{qualified_table_name(record_type)}: {below} ({versions})")
        if session is None:
            session = spark() if callable(spark) else spark
            check_cluster_reach(_master(session), url)
        with connect(url, autocommit=True, application_name="idem-migrate") as conn:
            prepare_table(conn, config, record_type, lock_timeout_seconds)
        plan, _ = plan_read(url, config, record_type, parallelism=task_slots(session))
        task = MigrateTask.for_plan(plan, KEEP if skip_failed else RAISE, batch_rows, lock_timeout_seconds)
        outcome = run_job(session, task)
        entry.update(outcome.summary(chains, record_type, entry))
        with connect(url, autocommit=True, application_name="idem-migrate") as conn:
            entry["rows_left"] = _rows_below(conn, record_type, entry["current_version"])
        entry["seconds"] = round(time.monotonic() - table_started, 3)
        if progress is not None:
            progress(
                f"{qualified_table_name(record_type)}: {entry['rows_moved']:,} rows moved to v{entry['current_version']} in "
                f"{entry['batches']:,} batch(es), {entry['rows_failed']:,} failed, {entry['rows_left']:,} left "
                f"below v{entry['current_version']} ({entry['seconds']:.1f} s, {plan.partitions} key range(s))"
            )
    return build_report(tables, dry_run=False, started=started)


def _master(spark: SparkSession) -> str:
    try:
        return str(spark.conf.get("spark.master", "local[*]"))
    except Exception:  # noqa: BLE001 - a Spark Connect server keeps its master to itself
        return "local[*]"


def _rows_below(conn: psycopg.Connection, record_type: str, current: int) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE _schema_version < %s").format(table_ident(record_type)), [current]
    ).fetchone()
    return int(row[0]) if row else 0

