"""The quarantine loop in Dagster: ``<connector>_retry_rejects``, one job per connector.

Launched from the Launchpad (run config ``ops: {<connector>__retry_rejects: {config:
{commit_id: ..., dry_run: ...}}}``, both optional) or by ``idem rejects retry`` in
process, it runs :func:`idem_platform.pipeline.retry.retry_rejects`: the connector's
quarantined rejects through the current catalog, those that pass committed exactly
once through the same write path as an ingest.
"""


import uuid
from typing import Any

import dagster as dg
from pydantic import Field

from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.errors import ConfigError
from idem_platform.pipeline.ingest import check_cluster_reach
from idem_platform.pipeline.retry import retry_rejects
from idem_platform.redact import secrets_kept


class RetryRejectsConfig(dg.Config):
    """Run config of ``<connector>_retry_rejects``."""

    commit_id: str | None = Field(
        default=None, description="Only the rejects of this commit (a UUID); unset: every quarantined reject."
    )
    dry_run: bool = Field(
        default=False, description="Count how many rejects would pass now (in Spark) and commit nothing."
    )


def retry_job_name(connector: ConnectorConfig) -> str:
    """``<connector>_retry_rejects`` (``<connector>``: its :attr:`identifier`, as every Dagster name of it)."""
    return f"{connector.identifier}_retry_rejects"


def retry_op_name(connector: ConnectorConfig) -> str:
    """The job's one op: ``<connector>__retry_rejects`` (op names are unique per code location)."""
    return f"{connector.identifier}__retry_rejects"


def retry_metadata(summary: dict[str, Any]) -> dict[str, dg.MetadataValue]:
    """The summary as metadata: flat counts to plot, the rest as JSON."""
    retry = summary.get("retry") or {}
    flat: dict[str, Any] = {
        "commit_id": summary.get("commit_id"),
        "rows_written": summary.get("rows_written", 0),
        "rows_skipped": summary.get("rows_skipped", 0),
        "rows_rejected": summary.get("rows_rejected", 0),
        "seconds": float(summary.get("seconds") or 0.0),
    }
    for key in ("selected", "passed", "still_failing", "would_pass", "would_fail", "unchanged", "already_retried", "dry_run", "message"):
        if retry.get(key) is not None:
            flat[f"retry/{key}"] = retry[key]
    for reason, info in (retry.get("not_retryable") or {}).items():
        flat[f"not_retryable/{reason}"] = info["count"]
    flat["summary"] = summary
    return to_metadata(flat)


def build_retry_job(
    idem_config: IdemConfig, connector: ConnectorConfig, resource_keys: ResourceKeys = DEFAULT_KEYS
) -> dg.JobDefinition:
    """The connector's ``<connector>_retry_rejects`` job (on ``resource_keys``' database)."""

    @dg.op(
        name=retry_op_name(connector),
        tags={"idem/connector": connector.name},
        required_resource_keys={resource_keys.postgres, resource_keys.spark},
        description=(
            f"Re-run {connector.name}'s quarantined rejects (idem.rejects not retried yet) through the "
            "current catalog in Spark and commit those that pass, exactly once: their keys are the ones a "
            "first ingest would have given them, the rejects are marked retried in the same transaction, "
            "and those that still fail stay quarantined with their new reasons."
        ),
    )
    def retry(context: dg.OpExecutionContext, config: RetryRejectsConfig) -> dg.Output[dict[str, Any]]:
        postgres, spark = resource_keys.postgres_of(context), resource_keys.spark_of(context)

        try:
            commit_id = str(uuid.UUID(config.commit_id)) if config.commit_id else None
        except ValueError:
            raise ConfigError(f"commit_id {config.commit_id!r} is not a commit id (a UUID)") from None
        url = postgres.resolved_url

        def session() -> Any:
            check_cluster_reach(spark.master, url)
            return spark.spark_session

        with secrets_kept():
            summary = retry_rejects(
                url, idem_config, connector, session,
                commit_id=commit_id, dry_run=config.dry_run, run_id=context.run_id, progress=context.log.info,
            )
        retried = summary["retry"]
        if summary.get("nothing_to_retry"):
            context.log.info("nothing retried: %s", retried.get("message"))
        elif not config.dry_run:
            context.log.info(
                "commit %s: %d rejects now pass (%d written, %d skipped), %d still fail",
                summary["commit_id"], retried.get("passed", 0), summary["rows_written"],
                summary["rows_skipped"], retried.get("still_failing", 0),
            )
        return dg.Output(summary, metadata=retry_metadata(summary))

    @dg.job(
        name=retry_job_name(connector),
        executor_def=dg.in_process_executor,
        tags={"idem/connector": connector.name},
        description=(
            f"Retry {connector.name}'s rejects against the current catalog (idem rejects retry does the "
            "same); run config: commit_id (only one commit's), dry_run."
        ),
    )
    def retry_job() -> None:
        retry()

    return retry_job


def rejects_definitions(
    idem_config: IdemConfig, connector: ConnectorConfig, resource_keys: ResourceKeys = DEFAULT_KEYS
) -> dg.Definitions:
    """What the quarantine loop adds per connector: its retry job."""
    return dg.Definitions(jobs=[build_retry_job(idem_config, connector, resource_keys)])
