"""IO managers: where the ``ingest``/``coerced`` plans live, and how ``committed`` is written.

``idem_plan_io_manager`` stores the *plan* of a lazy Spark frame (units, keys,
slices, catalog), a few kilobytes, not its rows; the frame is rebuilt from the
plan wherever it is loaded, and the records are read once, by the executors, at
commit time. Each plan is kept under its run and, as the latest one, under its
asset and partition: a run that materializes only ``committed`` (the UI's
"Materialize" on one asset) loads the latest ``coerced`` plan of its partition.

``idem_warehouse_io_manager`` commits the ``coerced`` frame exactly once (DESIGN §5)
and reports what happened as materialization metadata, and a materialization of
each ``idem/<record_type>`` table asset the commit wrote to.

``idem_table_io_manager`` loads those table assets for downstream assets: a lazy
Spark DataFrame of the table in its current schema version (the read path, §6).
"""


import hashlib
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
from pydantic import Field

from idem_platform.config import IdemConfig
from idem_platform.defs.filedrop.partitions import files_by_partition
from idem_platform.defs.resources import ConfigsByTable, PostgresResource, SparkResource
from idem_platform.defs.summary import REJECT_SAMPLE, summary_from_metadata, summary_metadata
from idem_platform.pipeline.commit import CommitRequest, commit_batch
from idem_platform.pipeline.ingest import CoercedBatch, check_cluster_reach
from idem_platform.redact import secrets_kept
from idem_platform.sources.rejects.listing import list_rejects

REPLAY_TAG = "idem/replay"
LATEST = "latest"  # the plans directory that keeps each asset partition's latest plan


class SparkPlanIOManager(dg.ConfigurableIOManager):
    """Pickles small plan objects under the instance's storage directory.

    A plan is written once, under its run: ``<run_id>/<asset>/<digest>.pkl``, the
    digest naming what the run covered (its partition, its partition range, or
    ``__all__``). Each partition it covered then points at it from ``latest/``
    (``<asset>/<digest of the partition>.ref``, the plan's path): a run over a range
    of 500 dropped files writes one plan and 500 small pointers, not 500 copies.
    A run that materializes only ``committed`` loads the latest ``coerced`` plan of
    its partition, which for a file committed in a batch is the batch's plan (every
    file of it replays); over a range, the partitions' latest plans must be one plan.
    """

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

    @staticmethod
    def _digest(scope: str) -> str:
        return hashlib.sha1(scope.encode("utf-8", "surrogateescape")).hexdigest()[:16]

    @staticmethod
    def _scope(context: dg.OutputContext | dg.InputContext) -> str:
        """What a run's plan covers: its partition, ``start\\0end`` of its range (NUL is in no
        partition key), or ``__all__``."""
        if context.has_partition_key:
            return context.partition_key
        if context.has_asset_partitions:
            keys = context.asset_partition_key_range
            return f"{keys.start}\0{keys.end}"
        return "__all__"

    @staticmethod
    def _partitions(context: dg.OutputContext | dg.InputContext) -> list[str]:
        """Every partition the context covers (``["__all__"]`` when unpartitioned)."""
        if context.has_partition_key:
            return [context.partition_key]
        if context.has_asset_partitions:
            return list(context.asset_partition_keys)
        return ["__all__"]

    def _plan_path(self, context: dg.OutputContext | dg.InputContext, run_id: str) -> Path:
        asset = "__".join(context.asset_key.path)
        return self._root(context) / run_id / asset / f"{self._digest(self._scope(context))}.pkl"

    def _latest(self, context: dg.OutputContext | dg.InputContext, partition: str) -> Path:
        """The pointer to ``partition``'s latest plan (``.ref``; a ``.pkl`` there is the older layout)."""
        asset = "__".join(context.asset_key.path)
        return self._root(context) / LATEST / asset / f"{self._digest(partition)}.ref"

    @staticmethod
    def _write(path: Path, data: bytes, run_id: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{run_id}.tmp")
        temporary.write_bytes(data)
        temporary.replace(path)

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        plan = self._plan_path(context, context.run_id)
        self._write(plan, pickle.dumps(obj), context.run_id)
        pointer = plan.relative_to(self._root(context)).as_posix().encode()
        for partition in self._partitions(context):
            latest = self._latest(context, partition)
            self._write(latest, pointer, context.run_id)
            latest.with_suffix(".pkl").unlink(missing_ok=True)  # the older layout's copy, now stale

    def _latest_plan(self, context: dg.InputContext, partition: str) -> Path | None:
        latest = self._latest(context, partition)
        try:
            return self._root(context) / latest.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            legacy = latest.with_suffix(".pkl")
            return legacy if legacy.exists() else None

    def load_input(self, context: dg.InputContext) -> Any:
        upstream = context.upstream_output
        run_id = upstream.run_id if upstream is not None else None
        own = self._plan_path(context, run_id) if run_id else None
        if own is not None and own.exists():
            return pickle.loads(own.read_bytes())
        partitions = self._partitions(context)
        plans = {partition: self._latest_plan(context, partition) for partition in partitions}
        missing = [p for p, path in plans.items() if path is None or not path.exists()]
        if missing:
            if missing == ["__all__"]:
                shown = ""
            elif len(missing) == 1:
                shown = f" partition {missing[0]!r}"
            else:
                shown = f" partitions {', '.join(repr(p) for p in missing[:5])}" + (
                    f" and {len(missing) - 5} more" if len(missing) > 5 else ""
                )
            raise dg.DagsterInvariantViolationError(
                f"{context.asset_key.to_user_string()}{shown} has never been materialized: "
                "materialize it (or its ingest and it together) first"
            )
        distinct = {path for path in plans.values() if path is not None}
        if len(distinct) > 1:
            raise dg.DagsterInvariantViolationError(
                f"the latest plans of {context.asset_key.to_user_string()} for these {len(partitions)} "
                f"partitions come from {len(distinct)} different runs: materialize "
                f"{context.asset_key.to_user_string()} (and the assets before it) together with this one"
            )
        (path,) = distinct
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
        metadata = summary_metadata(summary, rejects=self._rejects(summary.get("commit_id")))
        partitions = context.asset_partition_keys if context.has_asset_partitions else []
        if len(partitions) > 1 and summary.get("files"):
            # One commit, a materialization per file's partition: each gets its own files'
            # entries, not the batch's list (500 partitions x 500 entries was ~30 s of a run).
            metadata.pop("files", None)
            metadata["batch_files"] = dg.MetadataValue.int(len(summary["files"]))
            for partition, files in files_by_partition(obj.connector, summary["files"], partitions).items():
                context.step_context.add_asset_metadata(
                    {"files": dg.MetadataValue.json(files)}, asset_key=context.asset_key, partition_key=partition
                )
        context.add_output_metadata(metadata)
        for event in self._table_events(context, obj, summary):
            context.log_event(event)

    def _table_events(
        self, context: dg.OutputContext, obj: CoercedBatch, summary: dict[str, Any]
    ) -> list[dg.AssetMaterialization]:
        """A materialization of each ``idem/<record_type>`` table asset the commit wrote rows to.

        The commit is durable by now: a failure to measure the tables is logged, and
        must not fail the step (a retry would only replay the commit).
        """
        if not summary.get("commit_id") or summary.get("replayed"):
            return []
        from idem_platform.defs.tables import table_materializations

        partition = None
        if context.has_partition_key:
            partition = context.partition_key
        elif context.has_asset_partitions:  # one run over a range of partitions (a backfill)
            keys = context.asset_partition_key_range
            partition = keys.start if keys.start == keys.end else f"{keys.start}...{keys.end}"
        try:
            with self.postgres.connection(autocommit=True) as conn:
                return table_materializations(conn, obj.tables, summary, partition=partition)
        except psycopg.Error as exc:
            context.log.warning("commit %s: the tables' row counts could not be read (%s)", summary["commit_id"], exc)
            return []

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


SKIP_FAILED_METADATA = "skip_failed_migrations"


class TableIOManager(dg.ConfigurableIOManager):
    """Loads an ``idem/<record_type>`` table asset as a lazy Spark DataFrame (read-only).

    ``load_input`` reads ``idem.<record_type>`` through
    :func:`idem_platform.read.table.read_table`: current rows pass through, older rows
    are upgraded through the migration chain in Spark, and every row comes in the
    current shape. Per input, ``dg.AssetIn(key, metadata={...})`` may set
    ``skip_failed_migrations`` (count rows whose migration raises instead of failing
    the read; default: this manager's setting), ``commit_id`` (only one commit's rows)
    and ``limit``. What was read (rows per stored schema version, the current version,
    rows skipped) is recorded as the input's metadata, an observation of the table.

    ``handle_output`` refuses: the tables are written only by the connectors' commits.
    """

    postgres: dg.ResourceDependency[PostgresResource]
    spark: dg.ResourceDependency[SparkResource]
    # The parsed idem.yaml files of this database by record type (catalog, migrations), handed
    # over as a hard-coded resource: it is no run config a Launchpad could edit.
    configs: dg.ResourceDependency[ConfigsByTable]
    skip_failed_migrations: bool = Field(
        default=False,
        description="Default for inputs that do not say: skip (and count) rows whose migration raises "
        "instead of failing the read naming the row's key and the step.",
    )

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        where = context.asset_key.to_user_string() if context.has_asset_key else context.name
        raise dg.DagsterInvariantViolationError(
            f"{where}: idem_table_io_manager only reads tables. The idem.<record_type> tables are written "
            "by the connectors' exactly-once commits (<connector>/committed) and nothing else; give this "
            "output another io_manager_key."
        )

    def load_input(self, context: dg.InputContext) -> Any:
        from idem_platform.defs.tables import record_type_of, table_name

        record_type = record_type_of(context.asset_key) if context.has_asset_key else None
        idem_config: IdemConfig | None = self.configs.get(record_type)
        if record_type is None or idem_config is None:
            known = ", ".join(self.configs.names()) or "none"
            raise dg.DagsterInvariantViolationError(
                f"input {context.name!r}: idem_table_io_manager loads idem/<record_type> table assets "
                f"(record types: {known}), not {context.asset_key.to_user_string() if context.has_asset_key else 'a non-asset input'}"
            )
        options = dict(context.definition_metadata or {})
        skip = bool(options.get(SKIP_FAILED_METADATA, self.skip_failed_migrations))
        limit = options.get("limit")
        commit_id = options.get("commit_id")
        from idem_platform.read.table import read_table

        url = self.postgres.resolved_url
        check_cluster_reach(self.spark.master, url)
        with secrets_kept():
            read = read_table(
                self.spark.spark_session, url, idem_config, record_type,
                commit_id=str(commit_id) if commit_id else None,
                limit=int(limit) if limit is not None else None,
                skip_failed=skip,
            )
        metadata: dict[str, Any] = {
            "table": dg.MetadataValue.text(table_name(record_type)),
            "current_version": dg.MetadataValue.int(read.current_version),
            "rows": dg.MetadataValue.int(sum(read.rows_by_version.values())),
            "rows_by_version": dg.MetadataValue.json({str(v): n for v, n in sorted(read.rows_by_version.items())}),
            SKIP_FAILED_METADATA: dg.MetadataValue.bool(skip),
        }
        if skip and read.skipped is None:
            # Opted into skipping: count the failures now (a Spark job over the old rows only),
            # so the observation says how many rows the frame leaves out.
            read.count_skipped()
        if read.skipped is not None:
            metadata["skipped"] = dg.MetadataValue.int(read.skipped)
        if commit_id:
            metadata["commit_id"] = dg.MetadataValue.text(str(commit_id))
        context.add_input_metadata(metadata, description=f"read {table_name(record_type)} as a Spark DataFrame")
        context.log.info(
            "%s: %s rows by stored schema version, read as version %d",
            table_name(record_type), dict(sorted(read.rows_by_version.items())), read.current_version,
        )
        return read.frame
