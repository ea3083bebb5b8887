"""IO managers: where the ``ingest``/``coerced`` plans live, and how ``committed`` is written.

``idem_plan_io_manager`` stores the *plan* of a lazy Spark frame (units, keys,
slices, catalog), a few kilobytes, not its rows; the frame is rebuilt from the
plan wherever it is loaded, and the records are read once, by the executors, at
commit time. Each plan is kept under its run and, as the latest one, under its
asset and partition: a run that materializes only ``committed`` (the UI's
"Materialize" on one asset) loads the latest ``coerced`` plan of its partition.

``idem_warehouse_io_manager`` gives downstream assets the commit summary that the
``committed`` asset (which commits in its body, DESIGN §5) recorded as metadata.

``idem_table_io_manager`` loads those table assets for downstream assets: a lazy
Spark DataFrame of the table in its current schema version (the read path, §6).
"""


import hashlib
import pickle
import tempfile
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from idem_platform.config import IdemConfig
from idem_platform.defs.resources import ConfigsByTable, PostgresResource, SparkResource
from idem_platform.defs.results import count_results
from idem_platform.defs.summary import summary_from_metadata
from idem_platform.defs.tables import record_type_of
from idem_platform.pipeline.ingest import check_cluster_reach
from idem_platform.postgres import connect
from idem_platform.postgres.schema import SCHEMA, qualified_table_name
from idem_platform.private_files import create_private, private_dir
from idem_platform.read.results import results_frame
from idem_platform.read.table import read_table
from idem_platform.redact import secrets_kept

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
    _instance_root: Path | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Learn the instance's storage directory when a run starts (an ``OutputContext``
        has no public instance; the resource's init context has)."""
        instance = context.instance
        self._instance_root = Path(instance.storage_directory()) / "idem_plans" if instance is not None else None

    def _root(self, context: dg.OutputContext | dg.InputContext) -> Path:
        if self.base_dir:
            return Path(self.base_dir)
        if self._instance_root is not None:
            return self._instance_root
        # Contexts built by hand (tests) come without a run's resource setup.
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
        """Write ``path`` whole or not at all (a temporary file renamed), 0600 in 0700
        directories whatever the umask: a plan holds the batch's file names and slices."""
        private_dir(path.parent)
        temporary = path.with_name(f"{path.name}.{run_id}.tmp")
        temporary.unlink(missing_ok=True)  # left by an earlier try of this step
        with create_private(temporary) as handle:
            handle.write(data)
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
    """Loads ``committed`` for downstream assets: the commit summary of the upstream partition.

    The commit itself runs in the ``committed`` asset's body, which returns a
    ``MaterializeResult``: Dagster stores no value, so :meth:`handle_output` has
    nothing to do. The rows are in ``idem.<record_type>`` (read those through the
    table assets).
    """

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Nothing to store: the commit's figures are the materialization's metadata."""

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
    the read; default: this manager's setting), ``commit_id`` (only one commit's rows),
    ``limit`` and ``history`` (of a ``mode: upsert`` table, every version instead of its
    current state, one row per identity, which it reads by default). What was read (rows per stored schema version, the current version,
    rows skipped) is recorded as the input's metadata, an observation of the table.

    An effect's results table (``idem/<results_table>``) is loaded too: a lazy frame of its
    rows (:func:`~idem_platform.read.results.results_frame`; input metadata: ``limit``).

    ``handle_output`` refuses: the tables are written only by the connectors' commits (and the
    results tables by the delivery that records each answer).
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
        record_type = record_type_of(context.asset_key) if context.has_asset_key else None
        if self.configs.results(record_type) is not None:
            assert record_type is not None  # a results table was found by this name
            return self._load_results(context, record_type)
        idem_config: IdemConfig | None = self.configs.get(record_type)
        if record_type is None or idem_config is None:
            known = ", ".join(self.configs.names()) or "none"
            raise dg.DagsterInvariantViolationError(
                f"input {context.name!r}: idem_table_io_manager loads idem/<table> assets "
                f"(tables: {known}), not {context.asset_key.to_user_string() if context.has_asset_key else 'a non-asset input'}"
            )
        options = dict(context.definition_metadata or {})
        skip = bool(options.get(SKIP_FAILED_METADATA, self.skip_failed_migrations))
        limit = options.get("limit")
        commit_id = options.get("commit_id")

        url = self.postgres.resolved_url
        check_cluster_reach(self.spark.master, url)
        with secrets_kept():
            read = read_table(
                self.spark.spark_session, url, idem_config, record_type,
                commit_id=str(commit_id) if commit_id else None,
                limit=int(limit) if limit is not None else None,
                skip_failed=skip,
                current=not bool(options.get("history", False)),  # an upsert table's current state
            )
        metadata: dict[str, Any] = {
            "table": dg.MetadataValue.text(qualified_table_name(record_type)),
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
        context.add_input_metadata(metadata, description=f"read {qualified_table_name(record_type)} as a Spark DataFrame")
        context.log.info(
            "%s: %s rows by stored schema version, read as version %d",
            qualified_table_name(record_type), dict(sorted(read.rows_by_version.items())), read.current_version,
        )
        return read.frame

    def _load_results(self, context: dg.InputContext, name: str) -> Any:
        """An effect's results table ``idem.<name>`` as a lazy Spark DataFrame, oldest delivery first
        (``limit``: at most that many rows); its row count recorded as the input's metadata."""
        options = dict(context.definition_metadata or {})
        unknown = sorted(set(options) - {"limit"})
        if unknown:
            raise dg.DagsterInvariantViolationError(
                f"input {context.name!r}: idem/{name} is an effect's results table; of the input metadata "
                f"only 'limit' applies to it, not {', '.join(map(repr, unknown))}"
            )
        limit = int(options["limit"]) if options.get("limit") is not None else None
        url = self.postgres.resolved_url
        check_cluster_reach(self.spark.master, url)
        with secrets_kept(), connect(url, autocommit=True) as conn:
            rows = count_results(conn, name)
        context.add_input_metadata(
            {"table": dg.MetadataValue.text(f"{SCHEMA}.{name}"), "rows": dg.MetadataValue.int(rows)},
            description=f"read {SCHEMA}.{name} as a Spark DataFrame",
        )
        with secrets_kept():
            return results_frame(self.spark.spark_session, url, name, limit=limit)
