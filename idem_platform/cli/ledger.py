"""``idem ledger purge``: the ledger's expired rows deleted, and staging tables a crashed run
left behind dropped (what the ``ledger_purge_hourly`` schedule does in Dagster)."""

from __future__ import annotations

from datetime import timedelta

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import IdemGroup
from idem_platform.ledger import purge_expired
from idem_platform.postgres import connect
from idem_platform.write.staging import drop_stale_staging

STALE_STAGING_SECONDS = 24 * 3600


@click.group("ledger", cls=IdemGroup)
def ledger() -> None:
    """Ledger maintenance."""


@ledger.command("purge")
@click.option("--grace-seconds", type=int, default=3600, show_default=True, help="how long after its replay window a row is kept")
def purge(grace_seconds: int) -> dict[str, int]:
    """Delete expired ledger rows."""
    url = prepare_environment()  # the schema is there
    with connect(url) as conn, conn.transaction():
        purged = purge_expired(conn, grace=timedelta(seconds=grace_seconds))
        dropped = drop_stale_staging(conn, STALE_STAGING_SECONDS)
    return {"purged": purged, "staging_dropped": dropped}
