"""IO managers: where the ``ingest``/``coerced`` plans live, and how ``committed`` is written.

``spark_plan_io_manager`` stores the *plan* of a lazy Spark frame (units, keys,
slices, catalog), a few kilobytes, not its rows; the frame is rebuilt from the
plan wherever it is loaded, and the records are read once, by the executors, at
commit time. Each plan is kept under its run and, as the latest one, under its
asset and partition: a run that materializes only ``committed`` (the UI's
"Materialize" on one asset) loads the latest ``coerced`` plan of its partition.

``warehouse_io_manager`` commits the ``coerced`` frame exactly once (DESIGN §5)
and reports what happened as materialization metadata.
"""


import hashlib
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from idem_platform.commit.run import CommitRequest, commit_batch
from idem_platform.defs.resources import PostgresResource, SparkResource
from idem_platform.defs.summary import REJECT_SAMPLE, summary_from_metadata, summary_metadata
from idem_platform.pipeline import CoercedBatch, check_cluster_reach
from idem_platform.redact import secrets_kept
from idem_platform.rejects import list_rejects

REPLAY_TAG = "idem/replay"
LATEST = "latest"  # the plans directory that keeps each asset partition's latest plan


class SparkPlanIOManager(dg.ConfigurableIOManager):
    """Pickles small plan objects under the instance's storage directory."""

    base_dir: str | None = Field(
        default=None, description="Where plans are kept; unset = the Dagster instance's storage dir."
    )

    def _root(self, context: dg.OutputContext | dg.InputContext) -> Path:
        if self.base_dir:
            return Path(self.base_dir)
        try:
            instance = context.instance if isinstance(context, dg.InputContext) else context.step_context.instance
            return Path(instance.storage_directory()) / "idem_plans"
        except Exception:  # noqa: BLE001 - contexts built by hand in tests have no instance
            return Path(tempfile.gettempdir()) / "idem_plans"

    def _path(self, context: dg.OutputContext | dg.InputContext, run_id: str) -> Path:
        partition = context.partition_key if context.has_partition_key else "__all__"
        digest = hashlib.sha1(partition.encode()).hexdigest()[:16]
        return self._root(context) / run_id / "__".join(context.asset_key.path) / f"{digest}.pkl"

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        data = pickle.dumps(obj)
        for path in (self._path(context, context.run_id), self._path(context, LATEST)):
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f"{path.name}.{context.run_id}.tmp")
            temporary.write_bytes(data)
            temporary.replace(path)

    def load_input(self, context: dg.InputContext) -> Any:
        upstream = context.upstream_output
        run_id = upstream.run_id if upstream is not None else None
        own = self._path(context, run_id) if run_id else None
        path = own if own is not None and own.exists() else self._path(context, LATEST)
        if not path.exists():
            partition = f" partition {context.partition_key!r}" if context.has_partition_key else ""
            raise dg.DagsterInvariantViolationError(
                f"{context.asset_key.to_user_string()}{partition} has never been materialized: "
                "materialize it (or its ingest and it together) first"
            )
        return pickle.loads(path.read_bytes())


class WarehouseIOManager(dg.ConfigurableIOManager):
    """Commits a ``coerced`` batch to PostgreSQL exactly once (one transaction)."""

    postgres: dg.ResourceDependency[PostgresResource]
    spark: dg.ResourceDependency[SparkResource]

    def handle_output(self, context: dg.OutputContext, obj: CoercedBatch) -> None:
        started = time.monotonic()
        tags = context.step_context.run_tags
        url = self.postgres.resolved_url
        request = CommitRequest(
            url=url,
            connector=obj.connector,
            run_id=context.run_id,
            replay=tags.get(REPLAY_TAG, "").lower() == "true",
            progress=context.log.info,
        )

        def spark() -> Any:
            check_cluster_reach(self.spark.master, url)
            return self.spark.spark_session

        with secrets_kept():  # Dagster stores what escapes here in the run's event log
            summary = commit_batch(request, obj, spark, started=started)
        context.log.info(
            "commit %s: %d written, %d skipped, %d rejected%s",
            summary["commit_id"],
            summary["rows_written"],
            summary["rows_skipped"],
            summary["rows_rejected"],
            " (replay)" if summary.get("replayed") else "",
        )
        context.add_output_metadata(summary_metadata(summary, rejects=self._rejects(summary.get("commit_id"))))

    def _rejects(self, commit_id: str | None) -> list[tuple[str, list[dict[str, Any]]]]:
        """The commit's first rejects (position and reasons), for the materialization's sample."""
        if not commit_id:
            return []
        with self.postgres.connection() as conn:
            rejects = list_rejects(conn, commit_id=commit_id, limit=REJECT_SAMPLE)
        return [(r["position"], list(r["reasons"])) for r in rejects]

    def load_input(self, context: dg.InputContext) -> dict[str, Any]:
        """The commit summary of the upstream partition (rows are in ``idem.<record_type>``)."""
        upstream = context.upstream_output
        if upstream is None:  # Dagster gives every asset input its upstream output
            raise dg.DagsterInvariantViolationError(f"input {context.name!r} has no upstream output")
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=context.asset_key,
                asset_partitions=[context.partition_key] if context.has_partition_key else None,
            ),
            limit=1,
        ).records
        if not records or records[0].asset_materialization is None:
            raise dg.DagsterInvariantViolationError(
                f"{context.asset_key.to_user_string()} has no committed materialization"
            )
        return summary_from_metadata(records[0].asset_materialization.metadata)
