"""The hourly purge: expired ledger rows (after a one-hour grace) and stale staging tables."""


import functools
from datetime import timedelta

import dagster as dg

from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.ledger import purge_expired
from idem_platform.write.staging import drop_stale_staging

PURGE_GRACE = timedelta(hours=1)
STALE_STAGING_SECONDS = 24 * 3600


def ledger_purge(resource_keys: ResourceKeys = DEFAULT_KEYS) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The purge job and its hourly schedule for one database (``ledger_purge_job``,
    ``ledger_purge_hourly``; suffixed for a database other than ``IDEM_POSTGRES_URL``'s).

    One pair per database and process (cached): every component on that database hands
    Dagster the same objects, so they load once however many components share it.
    """
    return _ledger_purge(resource_keys)


@functools.cache
def _ledger_purge(resource_keys: ResourceKeys) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    @dg.op(
        name=resource_keys.named("purge_ledger"),
        required_resource_keys={resource_keys.postgres},
        description="Delete ledger rows expired for over an hour; drop staging tables older than a day.",
    )
    def purge_ledger(context: dg.OpExecutionContext) -> dg.Output[int]:
        with resource_keys.postgres_of(context).connection() as conn:
            with conn.transaction():
                purged = purge_expired(conn, grace=PURGE_GRACE)
                dropped = drop_stale_staging(conn, STALE_STAGING_SECONDS)
        context.log.info("purged %d expired ledger rows, dropped %d stale staging tables", purged, dropped)
        return dg.Output(purged, metadata={"purged": purged, "staging_dropped": dropped})

    @dg.job(
        name=resource_keys.named("ledger_purge_job"),
        executor_def=dg.in_process_executor,
        description="Purge expired idempotency-ledger rows (idem ledger purge does the same).",
    )
    def ledger_purge_job() -> None:
        purge_ledger()

    schedule = dg.ScheduleDefinition(
        name=resource_keys.named("ledger_purge_hourly"),
        job=ledger_purge_job,
        cron_schedule="0 * * * *",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Hourly: deletes ledger rows whose replay window ended more than an hour ago.",
    )
    return ledger_purge_job, schedule
