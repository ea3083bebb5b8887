"""The hourly purge: expired ledger rows (after a one-hour grace) and stale staging tables."""


from datetime import timedelta

import dagster as dg

from idem_platform.defs.resources import PostgresResource
from idem_platform.ledger import purge_expired
from idem_platform.write.staging import drop_stale_staging

PURGE_GRACE = timedelta(hours=1)
STALE_STAGING_SECONDS = 24 * 3600


@dg.op(description="Delete ledger rows expired for over an hour; drop staging tables older than a day.")
def purge_ledger(context: dg.OpExecutionContext, postgres: PostgresResource) -> dg.Output[int]:
    with postgres.connection() as conn:
        with conn.transaction():
            purged = purge_expired(conn, grace=PURGE_GRACE)
            dropped = drop_stale_staging(conn, STALE_STAGING_SECONDS)
    context.log.info("purged %d expired ledger rows, dropped %d stale staging tables", purged, dropped)
    return dg.Output(purged, metadata={"purged": purged, "staging_dropped": dropped})


@dg.job(description="Purge expired idempotency-ledger rows (idem ledger purge does the same).")
def ledger_purge_job() -> None:
    purge_ledger()


ledger_purge_schedule = dg.ScheduleDefinition(
    name="ledger_purge_hourly",
    job=ledger_purge_job,
    cron_schedule="0 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Hourly: deletes ledger rows whose replay window ended more than an hour ago.",
)
