"""The body of ``<connector>/committed``: the exactly-once commit and what each partition reports.

The commit runs in the asset itself (not in an IO manager), so it reads the run's
tags and records metadata through the asset's public context. A run over one
partition (or an unpartitioned Kafka run) reports the commit's summary. A run over
many file partitions (the sensor's batch, a backfill) commits them in one
transaction and gives each file's partition that file's own figures, read back
from PostgreSQL (:mod:`idem_platform.sources.filedrop.figures`); the batch's totals
are logged and shared by every partition under ``batch_*`` names.
"""

from __future__ import annotations

import time
from typing import Any

import dagster as dg
import psycopg

from idem_platform.config import ConnectorConfig
from idem_platform.defs.effects import bounds_by_table, owed_evaluations
from idem_platform.defs.filedrop.partitions import files_by_partition
from idem_platform.defs.resources import PostgresResource, SparkResource
from idem_platform.defs.summary import REJECT_SAMPLE, batch_metadata, summary_metadata
from idem_platform.defs.tables import record_type_of, table_materializations
from idem_platform.pipeline.commit import CommitRequest, commit_batch
from idem_platform.pipeline.ingest import CoercedBatch, check_cluster_reach
from idem_platform.redact import secrets_kept
from idem_platform.sources.filedrop.figures import (
    file_figures,
    file_summary,
    held_results,
    reject_samples,
)
from idem_platform.sources.rejects.listing import list_rejects

REPLAY_TAG = "idem/replay"


def run_commit(
    context: dg.AssetExecutionContext, coerced: CoercedBatch, postgres: PostgresResource, spark: SparkResource
) -> dict[str, Any]:
    """Commit the batch exactly once (DESIGN §5) and return its summary."""
    started = time.monotonic()
    url = postgres.resolved_url
    request = CommitRequest(
        url=url,
        connector=coerced.connector,
        run_id=context.run.run_id,
        replay=context.run.tags.get(REPLAY_TAG, "").lower() == "true",
        progress=context.log.info,
        # A run over many files' partitions shows each file's own figures.
        count_per_unit=_many_partitions(context),
    )

    def session() -> Any:
        check_cluster_reach(spark.master, url)
        return spark.spark_session

    with secrets_kept():  # Dagster stores what escapes here in the run's event log
        summary = commit_batch(request, coerced, session, started=started)
    context.log.info(
        "commit %s: %d written, %d skipped, %d rejected%s",
        summary["commit_id"],
        summary["rows_written"],
        summary["rows_skipped"],
        summary["rows_rejected"],
        " (replay)" if summary.get("replayed") else "",
    )
    return summary


def _many_partitions(context: dg.AssetExecutionContext) -> bool:
    """Whether the run covers several partitions (the sensor's batch of files, a backfill's range)."""
    if context.has_partition_key or not context.has_partition_key_range:
        return False
    return len(context.partition_keys) > 1


def committed_result(
    context: dg.AssetExecutionContext, coerced: CoercedBatch, summary: dict[str, Any], postgres: PostgresResource
) -> dg.MaterializeResult:
    """The materialization(s) of ``committed`` and of each ``idem/<record_type>`` table written."""
    partitions = list(context.partition_keys) if context.has_partition_key_range else []
    with postgres.connection(autocommit=True) as conn:
        if len(partitions) > 1 and summary.get("commit_id"):
            metadata = _per_file_metadata(context, conn, coerced, summary, partitions)
        else:
            metadata = summary_metadata(
                summary, rejects=_rejects(conn, summary.get("commit_id")), drop_dir=getattr(coerced.connector, "path", None)
            )
    materializations = _table_events(context, coerced, summary, postgres)
    for event in materializations:
        context.log_event(event)
    for evaluation in _owed_events(context, coerced, materializations, postgres):
        # The check is on the table asset, which this step reports but does not materialize: its
        # evaluation is logged like the table's materialization (log_event takes AssetCheckEvaluation).
        context.log_event(evaluation)
    return dg.MaterializeResult(metadata=metadata)


def _owed_events(
    context: dg.AssetExecutionContext,
    coerced: CoercedBatch,
    materializations: list[dg.AssetMaterialization],
    postgres: PostgresResource,
) -> list[dg.AssetCheckEvaluation]:
    """``effects_owed`` of each table the commit wrote that has effects (after the commit that
    added to what they owe). Like the materializations, a failure to read is logged, never fatal."""
    bounds = bounds_by_table(coerced.connector.effects)
    written = {record_type_of(event.asset_key) for event in materializations}
    wanted = {rt: b for rt, b in bounds.items() if rt in written}
    if not wanted:
        return []
    try:
        with postgres.connection(autocommit=True) as conn:
            return owed_evaluations(conn, wanted)
    except psycopg.Error as exc:
        context.log.warning("what the effects owe could not be read (%s)", exc)
        return []


def _per_file_metadata(
    context: dg.AssetExecutionContext,
    conn: psycopg.Connection,
    coerced: CoercedBatch,
    summary: dict[str, Any],
    partitions: list[str],
) -> dict[str, Any]:
    """Give each file's partition its own figures; return what the partitions share."""
    connector: ConnectorConfig = coerced.connector
    sources = [unit.source for unit in coerced.batch.units if "file" in unit.source]
    keys = [str(source["key"]) for source in sources]
    held = held_results(conn, connector.name, keys)
    figures = file_figures(conn, sources, summary, held, coerced.tables)
    rejected = {key: f.commit_id for key, f in figures.items() if f.rejected}
    samples: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    for commit_id in set(rejected.values()):
        samples.update(reject_samples(conn, commit_id, [k for k, c in rejected.items() if c == commit_id], REJECT_SAMPLE))
    for partition, entries in files_by_partition(connector, sources, partitions).items():
        # One file per partition (a partition key is the file's path); two paths of one
        # partition key cannot both be in a batch.
        source = entries[0]
        key = str(source["key"])
        own = file_summary(source, figures.get(key), summary)
        context.add_asset_metadata(
            summary_metadata(own, rejects=samples.get(key), drop_dir=getattr(connector, "path", None)),
            asset_key=context.asset_key,
            partition_key=partition,
        )
    context.log.info(
        "batch commit %s of %d files: %d written, %d skipped, %d rejected in all; each file's partition "
        "carries its own figures", summary["commit_id"], len(sources),
        summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"],
    )
    return batch_metadata(summary, len(sources))


def _rejects(conn: psycopg.Connection, commit_id: str | None) -> list[tuple[str, list[dict[str, Any]]]]:
    """The commit's first rejects (position and reasons), for the materialization's sample."""
    if not commit_id:
        return []
    rejects = list_rejects(conn, commit_id=commit_id, limit=REJECT_SAMPLE)
    return [(r["position"], list(r["reasons"])) for r in rejects]


def _table_events(
    context: dg.AssetExecutionContext, coerced: CoercedBatch, summary: dict[str, Any], postgres: PostgresResource
) -> list[dg.AssetMaterialization]:
    """A materialization of each ``idem/<record_type>`` table asset the commit wrote rows to.

    The commit is durable by now: a failure to measure the tables is logged, and
    must not fail the step (a retry would only replay the commit).
    """
    if not summary.get("commit_id") or summary.get("replayed"):
        return []
    partition = None
    if context.has_partition_key:
        partition = context.partition_key
    elif context.has_partition_key_range:  # one run over a range of partitions (a backfill)
        keys = context.partition_key_range
        partition = keys.start if keys.start == keys.end else f"{keys.start}...{keys.end}"
    try:
        with postgres.connection(autocommit=True) as conn:
            return table_materializations(conn, coerced.tables, summary, partition=partition)
    except psycopg.Error as exc:
        context.log.warning("commit %s: the tables' row counts could not be read (%s)", summary["commit_id"], exc)
        return []
