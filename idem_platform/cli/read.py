"""``idem read``: a record type's rows as NDJSON, in the current shape.

The read runs in Spark (rows stored at an older ``schema_version`` go through the
migrations, the read path the IO manager uses): PySpark is imported when the command
runs, so ``idem --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
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
    "--skip-failed-migrations", is_flag=True,
    help="leave out (and count) rows whose migration to the current schema_version fails, instead of failing",
)
def read(record_type: str, commit: str | None, limit: int | None, skip_failed_migrations: bool) -> None:
    """Print a record type's rows as NDJSON.

    Rows stored at an older schema_version are upgraded through the migrations on the
    way. Last, on stderr, one JSON line: the rows printed, and, when some rows were
    stored at an older version or skipped, the rows per stored version.
    """
    from idem_platform.read.table import read_lines, read_table, rows_summary
    from idem_platform.spark.session import build_session, spark_config_for

    config = load_config(invocation().config)
    known_record_type(config, record_type)
    config.chains()  # a broken chain is a one-line error before Spark starts
    url = prepare_environment()
    check_cluster_reach(config.spark_master(), url)
    spark = build_session(spark_config_for(config.spark_master(), dict(config.spark.conf)))
    skip = skip_failed_migrations
    rows = read_table(spark, url, config, record_type, commit_id=commit, limit=limit, skip_failed=skip, ordered=True)
    count = skipped = 0
    for line in read_lines(rows, skip_failed=skip):
        if line is None:
            skipped += 1
            continue
        sys.stdout.write(line + "\n")
        count += 1
    summary: dict[str, Any] = {"record_type": record_type, "rows": count}
    if rows.old_rows or skip:
        summary |= rows_summary(rows) | ({"skipped": skipped} if skip else {})
    sys.stderr.write(json.dumps(summary) + "\n")
