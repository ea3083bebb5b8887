"""The job ``idem_migrate``: ``idem migrate`` from Dagster (Launchpad, schedules, sensors).

Run config (every field optional)::

    ops:
      migrate:
        config: {types: [reading], dry_run: false, skip_failed: false, batch_rows: 50000}

The op runs :func:`idem_platform.read.migrate.run.migrate` (old rows upgraded in Spark
on the executors, written back in batches of one transaction each, resumable) or,
with ``dry_run``, :func:`~idem_platform.read.migrate.counts.plan_migration` (counts per type
and step, no Spark, nothing written). It logs the report, attaches it as the
output's metadata, and reports a materialization of each table asset
(``idem/<record_type>``) whose rows it moved: the table changed.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from idem_platform.config import IdemConfig
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.defs.tables import table_key
from idem_platform.errors import IdemError
from idem_platform.migrations import MigrationFailed
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.read.migrate.counts import plan_migration, selected_types
from idem_platform.read.migrate.report import human_report
from idem_platform.read.migrate.run import DEFAULT_BATCH_ROWS, migrate
from idem_platform.redact import secrets_kept

JOB_NAME = "idem_migrate"
OP_NAME = "migrate"


class MigrateConfig(dg.Config):
    """Which tables, and whether to write."""

    types: list[str] = Field(default_factory=list, description="record types to migrate (empty: every declared one)")
    dry_run: bool = Field(default=False, description="count the rows per type and step that would move; write nothing")
    skip_failed: bool = Field(
        default=False, description="count rows whose migration fails and leave them at their version, instead of failing"
    )
    batch_rows: int = Field(default=DEFAULT_BATCH_ROWS, ge=1, description="rows per transaction")


def migrate_metadata(report: dict[str, Any]) -> dict[str, dg.MetadataValue]:
    """Flat counts to plot (in total and per record type), and the whole report as JSON."""
    flat: dict[str, Any] = {
        "dry_run": report["dry_run"],
        "rows_to_move": report["rows_to_move"],
        "rows_moved": report["rows_moved"],
        "rows_failed": report["rows_failed"],
        "seconds": float(report["seconds"]),
    }
    for record_type, entry in report["tables"].items():
        for key in ("rows_to_move", "rows_moved", "rows_failed"):
            flat[f"{record_type}/{key}"] = entry[key]
    flat["report"] = report
    return to_metadata(flat)


def migrate_job(config: IdemConfig, resource_keys: ResourceKeys = DEFAULT_KEYS, name: str = JOB_NAME) -> dg.JobDefinition:
    """The ``idem_migrate`` job of ``config``'s tables (``name``: a component's own, see
    :func:`~idem_platform.defs.definitions.build_definitions`)."""
    idem_config = config  # the op's own `config` parameter is its run config

    @dg.op(
        name=OP_NAME + name.removeprefix(JOB_NAME),  # op names are unique in a code location too
        required_resource_keys={resource_keys.postgres, resource_keys.spark},
        description=(
            "Upgrade rows stored at an older schema_version through the migrations, in place: in Spark on the "
            "executors, in batches of one transaction each (resumable, a no-op when run again); dry_run counts "
            "per record type and step."
        ),
    )
    def migrate_op(context: dg.OpExecutionContext, config: MigrateConfig) -> dg.Output[dict[str, Any]]:
        postgres, spark = resource_keys.postgres_of(context), resource_keys.spark_of(context)
        url = postgres.resolved_url
        try:
            with secrets_kept():
                types = selected_types(idem_config, config.types)
                if config.dry_run:
                    report = plan_migration(url, idem_config, types)
                else:
                    report = migrate(
                        lambda: spark.spark_session, url, idem_config, types,
                        batch_rows=config.batch_rows, skip_failed=config.skip_failed, progress=context.log.info,
                    )
        except MigrationFailed as exc:
            raise dg.Failure(
                description=str(exc),
                metadata={"_idempotency_key": exc.key or "", "step": exc.step, "function": exc.function},
                allow_retries=False,
            ) from exc
        except IdemError as exc:
            raise dg.Failure(description=str(exc), allow_retries=exc.retryable) from exc
        context.log.info(human_report(report))
        for record_type, entry in report["tables"].items():
            if entry["rows_moved"]:
                context.log_event(
                    dg.AssetMaterialization(
                        asset_key=table_key(record_type),
                        description=f"idem migrate: {entry['rows_moved']:,} rows moved to v{entry['current_version']}",
                        metadata={
                            "dagster/table_name": dg.MetadataValue.text(qualified_table_name(record_type)),
                            "schema_version": dg.MetadataValue.int(int(entry["current_version"])),
                            "rows_moved": dg.MetadataValue.int(int(entry["rows_moved"])),
                            "rows_failed": dg.MetadataValue.int(int(entry["rows_failed"])),
                        },
                    )
                )
        return dg.Output(report, metadata=migrate_metadata(report))

    @dg.job(
        name=name,
        executor_def=dg.in_process_executor,
        description=(
            "idem migrate from Dagster: run config ops.migrate.config = {types, dry_run, skip_failed, batch_rows}."
        ),
    )
    def job() -> None:
        migrate_op()

    return job
