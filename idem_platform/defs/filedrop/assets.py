"""The file-drop ``ingest`` asset; ``coerced`` and ``committed`` come from :mod:`idem_platform.defs.connector`.

Partitioned by dropped file; run in one process (``in_process_executor``) so the
Spark session is shared by the steps of a run. A run may cover one partition (the
UI's "Materialize") or a range of them (the sensor's batches, backfills: the assets'
``BackfillPolicy.single_run``): either way its files are one batch, one commit.
"""

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import dagster as dg
from dagster import BetaWarning
from pydantic import Field

from idem_platform.config import FileConnector, IdemConfig
from idem_platform.defs.connector.assets import build_commit_assets, single_run_policy
from idem_platform.defs.connector.names import asset_keys, group_of
from idem_platform.defs.filedrop.partitions import path_for_partition
from idem_platform.defs.metadata import to_metadata
from idem_platform.defs.resources import DEFAULT_KEYS, ResourceKeys
from idem_platform.defs.summary import shown_file
from idem_platform.pipeline.ingest import check_cluster_reach, plan_batch, prepare_tables
from idem_platform.redact import secrets_kept
from idem_platform.sources.filedrop.scan import named_file_refusal, refused_text
from idem_platform.write.batch import SourceBatch


class IngestConfig(dg.Config):
    """Run config of ``<connector>/ingest``."""

    files: list[str] = Field(
        default_factory=list,
        description=(
            "Files to ingest in one commit, each relative to the drop directory or absolute (what the "
            "sensor passes). Every one must be a regular file inside the drop directory: a path "
            "elsewhere, a '..' that climbs out, a symlink that leads out, a FIFO, a socket or a device "
            "is refused and the run fails naming it, before anything is read. "
            "Empty: the files of the run's partition, or of every partition of its range."
        ),
    )


def files_to_read(
    connector: FileConnector,
    entries: list[str],
    partition_keys: Sequence[str],
    shown: str,
    *,
    files_outside_drop_dir: bool,
) -> list[Path]:
    """The files a run reads: its config's ``files``, else its partitions' files (one partition,
    or every partition of a range run).

    The sensor always names the files of a batch in ``files``: a range of dynamic
    partitions is everything between its ends in the partitions' order, and the
    config keeps the run to exactly the files it was asked for.

    Confined to the drop directory (see :class:`IngestConfig`): whoever can launch a
    run in the UI could otherwise have any file the code server can read ingested,
    its lines shown back as rejects. ``files_outside_drop_dir`` is for the definitions
    ``idem ingest`` builds in process, whose user may read any file of their own; no
    run config can grant it.

    Raises:
        dg.Failure: naming the first entry refused (not retried: it would fail again).
    """
    if connector.path is None:
        raise ValueError(f"connector {connector.name!r} has no drop directory")
    if entries:
        named = [(f"files[{i}] {entry!r}", entry) for i, entry in enumerate(entries)]
    elif partition_keys:
        named = [(f"partition {key!r}", str(path_for_partition(connector, key))) for key in partition_keys]
    else:
        raise dg.Failure(description="nothing to ingest: set the run config's files, or run a partition", allow_retries=False)
    outside = None if files_outside_drop_dir else f"outside the drop directory ({shown})"
    return [_checked(connector.path, label, entry, outside, shown) for label, entry in named]


def _checked(directory: Path, label: str, entry: str, outside: str | None, shown: str) -> Path:
    """``entry`` as an absolute path (a relative one is inside ``directory``), or a failure naming it."""
    path = Path(os.path.abspath(directory / entry))  # an absolute entry replaces the directory
    try:
        reason = named_file_refusal(path, directory, outside=outside)
    except FileNotFoundError:
        raise _refused(label, entry, shown, "no such file", f"no such file in the drop directory ({shown})") from None
    if reason is not None:
        raise _refused(label, entry, shown, reason, refused_text(reason))
    return path


def _refused(label: str, entry: str, shown: str, reason: str, text: str) -> dg.Failure:
    """The run's failure for one entry: one line in the UI, the entry and reason as metadata."""
    return dg.Failure(
        description=f"{label}: {text}",
        metadata={"entry": entry, "reason": reason, "drop_directory": shown},
        allow_retries=False,
    )


def build_filedrop_assets(
    idem_config: IdemConfig,
    connector: FileConnector,
    partitions: dg.DynamicPartitionsDefinition,
    *,
    files_outside_drop_dir: bool = False,
    resource_keys: ResourceKeys = DEFAULT_KEYS,
) -> list[dg.AssetsDefinition]:
    """The asset factory: three assets per file-drop connector (``files_outside_drop_dir``: see :func:`files_to_read`;
    ``resource_keys``: the resources of the connector's database).

    Dagster 1.13 marks ``backfill_policy`` as beta (a ``BetaWarning`` at definition); the
    warning is silenced here, where the choice (one run for a range of files) was made.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=BetaWarning)
        return _build_filedrop_assets(
            idem_config, connector, partitions, files_outside_drop_dir=files_outside_drop_dir, resource_keys=resource_keys
        )


def _build_filedrop_assets(
    idem_config: IdemConfig,
    connector: FileConnector,
    partitions: dg.DynamicPartitionsDefinition,
    *,
    files_outside_drop_dir: bool,
    resource_keys: ResourceKeys,
) -> list[dg.AssetsDefinition]:
    ingest_key, _, _ = asset_keys(connector)
    shown = idem_config.shown(connector.path)

    @dg.asset(
        key=ingest_key,
        partitions_def=partitions,
        backfill_policy=single_run_policy(partitions),
        io_manager_key=resource_keys.plan_io_manager,
        required_resource_keys={resource_keys.postgres, resource_keys.spark},
        group_name=group_of(connector),
        kinds={"spark", "file"},
        tags={"idem/connector": connector.name},
        description=(
            f"Lines of the files dropped into {shown} (next to the config "
            "file). Hashes each file once, in chunks "
            "(file key, line count, line-aligned splits) and checks the ledger: files already "
            "committed are replays and are never read again. The lines themselves are read by "
            "Spark executors, split by split, when the batch is committed. Idempotent."
        ),
    )
    def ingest(context: dg.AssetExecutionContext, config: IngestConfig) -> dg.Output[SourceBatch]:
        postgres, spark = resource_keys.postgres_of(context), resource_keys.spark_of(context)
        keys = context.partition_keys if context.has_partition_key or context.has_partition_key_range else []
        paths = files_to_read(connector, config.files, keys, shown, files_outside_drop_dir=files_outside_drop_dir)
        with secrets_kept():
            check_cluster_reach(spark.master, postgres.resolved_url)  # fail at start, not at commit
            prepare_tables(postgres.resolved_url, idem_config, connector)
            batch = plan_batch(postgres.resolved_url, connector, paths)
        context.log.info(
            "%d file(s), %d lines; %d already committed",
            len(batch.units), sum(u.records for u in batch.units), len(batch.replayed),
        )
        metadata = batch.metadata()
        for key in ("files", "already_committed"):  # paths as the partitions name them
            metadata[key] = [shown_file(path, connector.path) for path in metadata.get(key) or []]
        return dg.Output(batch, metadata=to_metadata(metadata))

    return [ingest, *build_commit_assets(idem_config, connector, partitions, resource_keys)]
