"""``idem migrate``: rows stored below their table's ``schema_version`` upgraded in place, in
Spark, one transaction per ``--batch-rows`` rows; ``--dry-run`` counts per type and step.

The migration modules run in Spark: PySpark is imported when the command runs, so
``idem --help`` stays fast.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import AT_LEAST_ONE, IdemCommand, invocation, json_option
from idem_platform.cli.output import progress_line, terminal
from idem_platform.config import load_config
from idem_platform.pipeline.ingest import check_cluster_reach


@click.command("migrate", cls=IdemCommand, short_help="Upgrade old rows in place.")
@click.option("--type", "types", multiple=True, metavar="TYPE", help="only this record type (repeatable; default: all)")
@click.option("--dry-run", is_flag=True, help="count the rows per type and step, write nothing")
@click.option("--batch-rows", type=AT_LEAST_ONE, default=50_000, help="rows per transaction (default 50,000)")
@click.option(
    "--skip-failed", is_flag=True,
    help="count rows whose migration fails and leave them at their version, instead of failing",
)
@json_option()
def migrate(types: tuple[str, ...], dry_run: bool, batch_rows: int, skip_failed: bool) -> dict[str, Any] | None:
    """Upgrade rows stored at an older schema_version in place (in Spark, batched, resumable)."""
    # Late import (pulls in PySpark and ADBC): kept off idem --help's imports.
    from idem_platform.read.migrate.counts import plan_migration, selected_types
    from idem_platform.read.migrate.report import human_report
    from idem_platform.read.migrate.run import migrate as migrate_rows
    from idem_platform.spark.session import build_session, spark_config_for

    config = load_config(invocation().config)
    chosen = selected_types(config, list(types) or None)
    config.chains()  # a broken chain is a one-line error before Spark starts
    url = prepare_environment()
    for_people = terminal(invocation().json)
    if dry_run:
        report = plan_migration(url, config, chosen)
    else:
        check_cluster_reach(config.spark_master(), url)

        def spark() -> Any:  # started only when some table has rows to move; a bulk job: the full JIT
            return build_session(spark_config_for(config.spark_master(), dict(config.spark.conf)), long_lived=True)

        report = migrate_rows(
            spark, url, config, chosen, batch_rows=batch_rows, skip_failed=skip_failed,
            progress=progress_line if for_people else None,
        )
    if for_people:
        sys.stdout.write(human_report(report) + "\n")
        return None
    return report
