"""The job ``idem_retype``: ``idem retype`` from Dagster (Launchpad, schedules, sensors).

Run config::

    ops:
      retype:
        config: {record_type: malware, column: score, to: long, batch_rows: 50000}

The op runs :func:`idem_platform.postgres.retype.retype_column` (typed companion
column under the commit path's lock order, then the batched backfill), logs each
batch and the report, and attaches the report as the output's metadata.
"""

from typing import Any, Literal

import dagster as dg
from pydantic import Field

from idem_platform.config import IdemConfig
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.errors import IdemError
from idem_platform.postgres.retype import DEFAULT_BATCH_ROWS, human_report, retype_column

JOB_NAME = "idem_retype"  # was idem_promote_column (CHANGELOG)
OP_NAME = "retype"


class RetypeConfig(dg.Config):
    """Which evolved text column to retype, to what."""

    record_type: str = Field(description="the record type (table idem.<record_type>)")
    column: str = Field(description="an evolved text column of it")
    to: Literal["long", "real", "timestamp", "bool"] = Field(description="the type of its typed companion column")
    batch_rows: int = Field(default=DEFAULT_BATCH_ROWS, ge=1, description="rows per backfill transaction")


def retype_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """The report as materialization-style metadata."""
    examples = report["not_cast_examples"]
    rows = [(str(e["_idempotency_key"]), str(e["value"]).replace("|", r"\|")) for e in examples]
    table = "\n".join(["| _idempotency_key | text |", "|---|---|"] + [f"| `{key}` | `{value}` |" for key, value in rows])
    return {
        "record_type": report["record_type"],
        "column": report["column"],
        "to": report["to"],
        "typed_column": report["typed_column"],
        "added": report["added"],
        "rows_retyped": dg.MetadataValue.int(report["rows_retyped"]),
        "rows_not_cast": dg.MetadataValue.int(report["rows_not_cast"]),
        "not_cast_examples": dg.MetadataValue.md(table if examples else "every text cast"),
        "batches": dg.MetadataValue.int(report["batches"]),
        "batch_rows": dg.MetadataValue.int(report["batch_rows"]),
        "seconds": dg.MetadataValue.float(float(report["seconds"])),
        "report": dg.MetadataValue.json(report),
    }


def retype_job(
    config: IdemConfig, resource_keys: ResourceKeys = DEFAULT_KEYS, name: str = JOB_NAME
) -> dg.JobDefinition:
    """The job for ``config``'s record types (their declared columns come from it; ``name``: a
    component's own, see :func:`~idem_platform.defs.definitions.build_definitions`)."""
    specs = config.table_specs

    @dg.op(
        name=OP_NAME + name.removeprefix(JOB_NAME),  # op names are unique in a code location too
        required_resource_keys={resource_keys.postgres},
        description=(
            "Give an evolved text column a typed companion column (long, real, timestamp, bool) that new commits "
            "fill, and backfill existing rows in batches; values that do not cast stay text (typed null)."
        ),
    )
    def retype_op(context: dg.OpExecutionContext, config: RetypeConfig) -> dg.Output[dict[str, Any]]:
        postgres = resource_keys.postgres_of(context)
        spec = specs.get(config.record_type)
        if spec is None:
            raise dg.Failure(
                description=f"unknown record type {config.record_type!r} (known: {', '.join(sorted(specs))})"
            )
        try:
            report = retype_column(
                postgres.resolved_url,
                spec,
                config.column,
                config.to,
                batch_rows=config.batch_rows,
                progress=context.log.info,
            )
        except IdemError as exc:
            raise dg.Failure(description=str(exc), allow_retries=exc.retryable) from exc
        context.log.info(human_report(report))
        return dg.Output(report, metadata=retype_metadata(report))

    @dg.job(
        name=name,
        executor_def=dg.in_process_executor,
        description=(
            "idem retype from Dagster: run config ops.retype.config = "
            "{record_type, column, to, batch_rows}."
        ),
    )
    def job() -> None:
        retype_op()

    return job
