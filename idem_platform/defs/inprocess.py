"""A connector's Dagster jobs run in this process, against the instance, as ``idem`` runs them.

``idem ingest`` and ``idem rejects retry`` execute the very jobs the sensor and the UI
launch (same definitions, same instance: the runs show up in ``dagster dev`` like any
other), with the terminal logger so a person reads the job's own progress lines, not
Dagster's events. A failed run becomes one :class:`RunFailed` line; ``details`` keeps the
error Dagster recorded (traceback and causes) for ``--verbose``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import dagster as dg

from idem_platform.config import ConnectorConfig, FileConnector, IdemConfig, KafkaConnector
from idem_platform.defs.connector.names import asset_keys, job_name
from idem_platform.defs.definitions import build_definitions
from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for
from idem_platform.defs.rejects import retry_job_name, retry_op_name
from idem_platform.defs.storage import pool_storage_connections
from idem_platform.defs.summary import summary_from_metadata
from idem_platform.defs.terminal import terminal_logger
from idem_platform.errors import TerminalError
from idem_platform.settings import environment_items

# Dagster's documented tag of a run's partition (what ``execute_in_process(partition_key=)`` sets).
PARTITION_TAG = "dagster/partition"


class RunFailed(TerminalError):
    """A run in process failed: the message is its first error in one line.

    ``details``: that error as Dagster recorded it, with traceback and causes.
    """

    def __init__(self, message: str, *, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


def cli_ingest_job(config_path: str, connector_name: str, fingerprint: str = "") -> dg.JobDefinition:
    """The connector's ingest job as ``idem ingest`` runs it, rebuilt from the config file.

    The reconstructor of :func:`run_ingest_job`'s job: the run records this function and
    its arguments as its job code origin (module, function, config path, connector), so
    the run names the code that defines its job and can be rebuilt from it, as a run the
    UI launches can. The person at the terminal may ingest any file of their own; the
    code location's definitions (runs launched from the UI) read only the drop directory.

    ``fingerprint`` (:func:`config_fingerprint`) names the config as the run read it.
    """
    return _ingest_job(config_path, connector_name, fingerprint or config_fingerprint(config_path))


def config_fingerprint(config_path: str) -> str:
    """The config file's bytes and the environment its ``${VAR}`` values and the
    definitions read, as one key: what a built job depends on.

    It is one of the origin's arguments, so Dagster's own cache of reconstructed
    definitions (per origin, for the life of the process) cannot hand a run the job of
    an earlier run whose config or environment differed.
    """
    digest = hashlib.sha256(Path(config_path).read_bytes())
    for name, value in environment_items():
        digest.update(f"\0{name}={value}".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


@functools.lru_cache(maxsize=8)
def _ingest_job(config_path: str, connector_name: str, fingerprint: str) -> dg.JobDefinition:
    """:func:`cli_ingest_job`'s job, built once per config and environment.

    Dagster resolves a reconstructable job several times in one run (planning, the
    run's snapshot, the executor, each step): four builds of every definition per
    ``idem ingest`` (~0.1 s each) before this cache.
    """
    from idem_platform.config import load_config

    config = load_config(config_path)
    defs = build_definitions(config, files_outside_drop_dir=True)
    return defs.resolve_job_def(job_name(config.connector(connector_name))).with_logger_defs(
        {"console": terminal_logger}
    )


def run_ingest_job(
    config: IdemConfig, connector: ConnectorConfig, ingest_config: dict[str, Any], partition: str | None,
    *, replay: bool,
) -> dict[str, Any]:
    """Execute the connector's ingest job and return its commit summary.

    The run is a Dagster run with a job origin (``dg.execute_job`` of a reconstructable
    job: :func:`cli_ingest_job` on the config's file), executed here, in this process,
    by the job's own in-process executor.

    Raises:
        RunFailed: the run failed, or recorded no commit summary.
    """
    ingest_key, _, committed_key = asset_keys(connector)
    instance = dg.DagsterInstance.get()
    pool_storage_connections(instance)  # before the run's first event
    tags = {"idem/replay": "true"} if replay else {}
    if partition is not None:
        assert not isinstance(connector, KafkaConnector), "a Kafka connector's runs have no partition"
        partitions = partitions_for(connector)
        if not instance.has_dynamic_partition(partitions.name or "", partition):
            instance.add_dynamic_partitions(partitions.name or "", [partition])
        tags[PARTITION_TAG] = partition
    if config.source is None:
        raise RunFailed("idem ingest runs a config read from a file (its runs name that file as their origin)")
    job = dg.build_reconstructable_job(
        __name__,
        cli_ingest_job.__name__,
        reconstructable_kwargs={
            "config_path": str(config.source),
            "connector_name": connector.name,
            "fingerprint": config_fingerprint(str(config.source)),
        },
    )
    result = dg.execute_job(
        job,
        instance=instance,
        run_config={
            "ops": {ingest_key.to_python_identifier(): {"config": ingest_config}},
            "loggers": {"console": {}},  # the terminal logger, not Dagster's default one
        },
        tags=tags,
        raise_on_error=False,
    )
    if not result.success:
        message, details = failure_message(result)
        raise RunFailed(message, details=details)
    for materialization in result.asset_materializations_for_node(committed_key.to_python_identifier()):
        if materialization.asset_key == committed_key:  # the step also reports the tables it wrote
            return summary_from_metadata(materialization.metadata, getattr(connector, "path", None))
    raise RunFailed("the run succeeded but recorded no commit summary")


def partition_for(connector: FileConnector, paths: list[str]) -> str:
    """The run's dynamic partition: the file's own, or one named by the batch's files."""
    if len(paths) == 1:
        return partition_key_for(connector, paths[0])
    return "batch-" + hashlib.sha256("\n".join(sorted(paths)).encode()).hexdigest()[:16]


def cli_retry_job(config_path: str, connector_name: str, fingerprint: str = "") -> dg.JobDefinition:
    """The connector's ``<connector>_retry_rejects`` job as ``idem rejects retry`` runs it,
    rebuilt from the config file: the reconstructor its runs record as their job code origin
    (as :func:`cli_ingest_job` is for ingest runs)."""
    return _retry_job(config_path, connector_name, fingerprint or config_fingerprint(config_path))


@functools.lru_cache(maxsize=8)
def _retry_job(config_path: str, connector_name: str, fingerprint: str) -> dg.JobDefinition:
    """:func:`cli_retry_job`'s job, built once per config and environment (as :func:`_ingest_job`)."""
    from idem_platform.config import load_config

    config = load_config(config_path)
    connector = config.connector(connector_name)
    return build_definitions(config).resolve_job_def(retry_job_name(connector)).with_logger_defs(
        {"console": terminal_logger}
    )


def run_retry_job(
    config: IdemConfig, connector: ConnectorConfig, *, commit: str | None = None, dry_run: bool = False
) -> dict[str, Any]:
    """Execute the connector's ``<connector>_retry_rejects`` job (one commit, or none) and
    return its summary: the run is a Dagster run with a job origin, as an ingest's is.

    Raises:
        RunFailed: the run failed.
    """
    if config.source is None:
        raise RunFailed("idem rejects retry runs a config read from a file (its runs name that file as their origin)")
    job = dg.build_reconstructable_job(
        __name__,
        cli_retry_job.__name__,
        reconstructable_kwargs={
            "config_path": str(config.source),
            "connector_name": connector.name,
            "fingerprint": config_fingerprint(str(config.source)),
        },
    )
    result = dg.execute_job(
        job,
        instance=dg.DagsterInstance.get(),
        run_config={
            "ops": {retry_op_name(connector): {"config": {"commit_id": commit, "dry_run": dry_run}}},
            "loggers": {"console": {}},
        },
        raise_on_error=False,
    )
    if not result.success:
        message, details = failure_message(result)
        raise RunFailed(message, details=details)
    for event in result.all_events:
        summary = event.step_output_data.metadata.get("summary") if event.is_successful_output else None
        if summary is not None and isinstance(summary.value, dict):
            return dict(summary.value)
    raise RunFailed("the run succeeded but recorded no retry summary")


def failure_message(result: Any) -> tuple[str, str | None]:
    """A failed run in one line, and the error Dagster recorded, traceback and causes, for ``--verbose``.

    A failed blocking check is named with its metadata; else the first failed step's
    innermost error that is not Dagster's own wrapper.
    """
    for event in result.all_events:
        evaluation = event.event_specific_data if event.event_type_value == "ASSET_CHECK_EVALUATION" else None
        if evaluation is not None and not evaluation.passed:
            details = {k: v.value for k, v in evaluation.metadata.items()}
            return f"blocking check {evaluation.check_name} on {evaluation.asset_key.to_user_string()} failed: {json.dumps(details, default=str)[:2000]}", None
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            recorded = error.to_string()
            while error.cause is not None and "DagsterExecutionStepExecutionError" in error.cls_name:
                error = error.cause
            if error.cause is not None and error.cls_name.startswith("Dagster"):
                error = error.cause
            message = error.message.strip().splitlines()[0] if error.message.strip() else error.cls_name
            # "idem_platform.errors.RejectRatioExceeded: 7 of 10 ..." -> "RejectRatioExceeded: 7 of 10 ..."
            message = re.sub(r"^(?:[a-z_][\w]*\.)+(?=[A-Z]\w*: )", "", message)
            return f"{event.step_key}: {message}", recorded
    return "the run failed (see the Dagster run logs)", None
