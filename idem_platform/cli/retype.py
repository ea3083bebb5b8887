"""``idem retype TYPE COLUMN --to KIND`` (alias ``idem promote``): a typed companion column for
an evolved text column, then its backfill, one transaction per ``--batch-rows`` rows.

``retype`` was ``promote`` (a word the commit's own step also used): the old name stays
an alias for one release (registered in :mod:`idem_platform.cli`).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import AT_LEAST_ONE, IdemCommand, invocation, json_option
from idem_platform.cli.output import progress_line, terminal
from idem_platform.cli.read import known_record_type
from idem_platform.config import load_config
from idem_platform.postgres.retype import human_report, retype_column


@click.command("retype", cls=IdemCommand, short_help="Type an evolved text column.")
@click.argument("record_type", metavar="TYPE")
@click.argument("column", metavar="COLUMN")
@click.option("--to", "kind", required=True, type=click.Choice(["long", "real", "timestamp", "bool"]), help="the type")
@click.option("--batch-rows", type=AT_LEAST_ONE, default=50_000, help="rows per backfill transaction (default 50,000)")
@json_option()
def retype(record_type: str, column: str, kind: str, batch_rows: int) -> dict[str, Any] | None:
    """Give an evolved text column a typed companion column and backfill it (alias: promote).

    TYPE: the record type (table idem.TYPE); COLUMN: an evolved text column of it.
    """
    config = load_config(invocation().config)
    known_record_type(config, record_type)
    url = prepare_environment()
    for_people = terminal(invocation().json)
    report = retype_column(
        url, config.table_specs[record_type], column, kind, batch_rows=batch_rows,
        progress=progress_line if for_people else None,
    )
    if for_people:
        sys.stdout.write(human_report(report) + "\n")
        return None
    return report
