"""``idem read``: a record type's rows as NDJSON, in the current shape.

Rows stored at an older ``schema_version`` go through the migrations in Spark (the read
path the IO manager uses; PySpark is imported only then, so ``idem --help`` stays fast).
A read whose rows are all current needs no migration: it is rendered in this process by
the executors' own code, from PostgreSQL straight to stdout, with no Spark to start.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import AT_LEAST_ONE, COMMIT_ID, IdemCommand, invocation
from idem_platform.cli.output import CommandError
from idem_platform.config import IdemConfig, load_config
from idem_platform.pipeline.ingest import check_cluster_reach


def known_record_type(config: IdemConfig, record_type: str) -> str:
    """``record_type`` if the config has a table of it; else a one-line error naming them."""
    if record_type not in config.tables:
        raise CommandError(f"unknown record type {record_type!r} (known: {', '.join(sorted(config.tables))})")
    return record_type


@click.command("read", cls=IdemCommand)
@click.argument("record_type")
@click.option("--commit", type=COMMIT_ID, help="only rows of this commit id")
@click.option("--limit", type=AT_LEAST_ONE, help="the first N rows by (_ingested_at, _idempotency_key)")
@click.option(
    "--history", is_flag=True,
    help="of a mode: upsert table, every version (idem.TYPE) instead of the current state (idem.TYPE_current)",
)
@click.option(
    "--skip-failed-migrations", is_flag=True,
    help="leave out (and count) rows whose migration to the current schema_version fails, instead of failing",
)
def read(record_type: str, commit: str | None, limit: int | None, history: bool, skip_failed_migrations: bool) -> None:
    """Print a record type's rows as NDJSON (of a mode: upsert table, its current state:
    one row per identity; --history: every version; of an effect's results_table, its rows).

    Rows stored at an older schema_version are upgraded through the migrations on the
    way. Last, on stderr, one JSON line: the rows printed, and, when some rows were
    stored at an older version or skipped, the rows per stored version.
    """
    # Late import (pulls in ADBC): kept off idem --help's imports.
    from idem_platform.read.planner import plan_read

    config = load_config(invocation().config)
    if any(effect.results_table == record_type for effect in config.effects):
        if commit is not None or history or skip_failed_migrations:
            raise CommandError(f"{record_type!r} is an effect's results table: only --limit applies to it")
        read_results(record_type, limit)
        return
    known_record_type(config, record_type)
    config.chains()  # a broken chain is a one-line error before Spark starts
    url = prepare_environment()
    skip = skip_failed_migrations
    current = not history
    plan, counts = plan_read(url, config, record_type, commit_id=commit, limit=limit, ordered=True, current=current)
    if all(version == plan.current_version for version in counts):
        from idem_platform.read.render import lines_in_process
        from idem_platform.read.upgrade import KEEP, RAISE

        # Nothing to migrate: rendered here (the executors' own code), no Spark to start.
        lines = lines_in_process(plan, KEEP if skip else RAISE)
        current_version, old_rows = plan.current_version, 0
    else:
        lines, current_version, counts = spark_lines(config, url, record_type, commit, limit, skip, current=current)
        old_rows = sum(n for version, n in counts.items() if version != current_version)
    count = skipped = 0
    for line in lines:
        if line is None:
            skipped += 1
            continue
        sys.stdout.write(line + "\n")
        count += 1
    summary: dict[str, Any] = {"record_type": record_type, "rows": count}
    if old_rows or skip:
        summary |= {
            "current_version": current_version,
            "rows_by_version": {str(version): n for version, n in sorted(counts.items())},
        } | ({"skipped": skipped} if skip else {})
    sys.stderr.write(json.dumps(summary) + "\n")


def read_results(name: str, limit: int | None) -> None:
    """An effect's results table (``results_table:``) as NDJSON: one row per delivered key."""
    from idem_platform.effects.results import results_lines
    from idem_platform.postgres.connection import connect

    with connect(prepare_environment(), autocommit=True) as conn:
        lines = results_lines(conn, name, limit)
    for line in lines:
        sys.stdout.write(line + "\n")
    sys.stderr.write(json.dumps({"results_table": name, "rows": len(lines)}) + "\n")


def spark_lines(
    config: IdemConfig, url: str, record_type: str, commit: str | None, limit: int | None, skip: bool,
    *, current: bool = False,
) -> tuple[Iterator[str | None], int, dict[int, int]]:
    """A read with old rows, in Spark (their migrations run on the executors): its lines, the
    current version and the rows per stored version."""
    # Late import (pulls in PySpark): only a read with rows to migrate needs it.
    from idem_platform.read.table import read_lines, read_table
    from idem_platform.spark.session import build_session, spark_config_for

    check_cluster_reach(config.spark_master(), url)
    spark = build_session(spark_config_for(config.spark_master(), dict(config.spark.conf)))
    rows = read_table(spark, url, config, record_type, commit_id=commit, limit=limit, skip_failed=skip, ordered=True,
                      current=current)
    return read_lines(rows, skip_failed=skip), rows.current_version, rows.rows_by_version
