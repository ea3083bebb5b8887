"""``idem ingest``'s run: check the files, plan the connector's batch, choose and warm up
Spark, then execute its Dagster job in this process (:mod:`idem_platform.defs.inprocess`).

Dagster and PySpark (~1.5 s of imports) are imported inside :func:`ingest_connector`,
while the files hash: ``idem --help`` never loads them, and an ingest's imports overlap
its hashing instead of preceding it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from idem_platform.cli.output import CommandError
from idem_platform.config import ConnectorConfig, IdemConfig, KafkaConnector
from idem_platform.pipeline.ingest import check_cluster_reach, plan_batch
from idem_platform.postgres.embedded import resolve_postgres_url
from idem_platform.sources.filedrop import hash_file
from idem_platform.sources.filedrop.scan import named_file_refusal, refused_text


def ingest_connector(
    config: IdemConfig, connector_name: str, files: Sequence[str] = (), *, replay: bool = False,
    dagster_url: str | None = None,
) -> dict[str, Any]:
    """Run the connector's ingest job (one commit) and return its summary.

    A file-drop connector ingests ``files``; a Kafka connector reads every
    partition from its committed offset up to the end the brokers report now.
    The job runs in this process, or, given ``dagster_url``, is launched through that
    Dagster webserver in the code location that defines it (:mod:`idem_platform.defs.remote`).

    Raises:
        CommandError: bad arguments.
        IdemError: the source cannot be planned (brokers unreachable, offsets behind
            retention), or the run failed (``RunFailed``: the message is the underlying error).
    """
    connector = config.connector(connector_name)
    url = resolve_postgres_url()
    if dagster_url is None:  # else the run's Spark is the code location's
        check_cluster_reach(config.spark_master(), url)
    paths = checked_files(connector, files)
    with hashing_in_background(paths):
        # Late import: Dagster and PySpark import while the files hash in the background.
        from idem_platform.defs.inprocess import partition_for, run_ingest_job
        from idem_platform.defs.remote import launch_ingest_job
        from idem_platform.spark.reuse import start_spark
    batch = plan_batch(url, connector, paths)
    partition: str | None = None
    if isinstance(connector, KafkaConnector):
        ranges = [
            {"topic": u.source["topic"], "partition": u.source["partition"], "start": u.source["start"], "end": u.source["end"]}
            for u in batch.units
        ]
        ingest_config: dict[str, Any] = {"ranges": ranges}
    else:
        partition = partition_for(connector, paths)
        ingest_config = {"files": paths}
    if dagster_url is not None:
        if not isinstance(connector, KafkaConnector) and not _all_inside(connector.path, paths):
            raise CommandError(
                f"with --dagster, connector {connector.name!r} reads only files inside its drop directory "
                f"{connector.path} (the code location's definitions read nothing else)"
            )
        return launch_ingest_job(dagster_url, config, connector, ingest_config, partition, replay=replay)
    spark_used = None if batch.fully_replayed else start_spark(config)
    summary = run_ingest_job(config, connector, ingest_config, partition, replay=replay)
    if spark_used is not None:
        summary["spark"] = spark_used  # where the run's Spark was: a master, or a Connect server's sc:// URL
    return summary


def _all_inside(directory: Path | None, paths: list[str]) -> bool:
    """Whether every path is inside ``directory`` (a connector's drop directory)."""
    return directory is not None and all(Path(p).is_relative_to(directory.resolve()) for p in paths)


def checked_files(connector: ConnectorConfig, files: Sequence[str]) -> list[str]:
    """The files named, resolved and checked (:func:`checked_file`); none for a Kafka connector.

    Raises:
        CommandError: files for a Kafka connector, none for one that lands files, a
            connector ``idem ingest`` cannot run, or a file it may not read.
    """
    name = connector.name
    if connector.kind == "kafka":
        if files:
            raise CommandError(
                f"connector {name!r} reads the Kafka topics {', '.join(connector.topics or [])}; it takes no files"
            )
        return []
    if not connector.lands_files:
        raise CommandError(f"connector {name!r} is a {connector.kind} connector; idem ingest cannot run it")
    if not files:
        kind = "a file-drop" if connector.kind == "filedrop" else f"an {connector.kind}"
        raise CommandError(f"connector {name!r} is {kind} connector: name the files to ingest")
    if connector.path is None:  # the config's validation gives every connector that lands files one
        raise CommandError(f"connector {name!r} has no path")
    return [checked_file(connector.path, f) for f in files]


@contextmanager
def hashing_in_background(paths: list[str]) -> Iterator[None]:
    """Hash ``paths`` in a thread while the body runs; the plan then finds them hashed.

    hashlib releases the GIL on large buffers, so the files' SHA-256 (~0.5 s for
    387 MB) runs beside the body. A file that fails here is hashed again by the plan,
    which reports the error.
    """

    def run() -> None:
        for path in paths:
            try:
                hash_file(path)
            except Exception:  # noqa: BLE001 - the plan hashes it again and says what is wrong
                return

    thread = threading.Thread(target=run, name="idem-hash", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def checked_file(directory: Path, name: str) -> str:
    """``name`` resolved, if ``idem ingest`` may read it for a connector that lands files in
    ``directory``; else a one-line error.

    The sensor's rules, in the sensor's words (:mod:`idem_platform.sources.filedrop.scan`):
    a name inside the drop directory must lead to a regular file inside it; a file named
    elsewhere must be a regular file. Only ``stat`` is used: opening a FIFO would block.

    Raises:
        CommandError: ``<path>: a FIFO, not a regular file: refused``, ``no such file: <path>``...
    """
    path = Path(os.path.abspath(name))
    try:
        reason = named_file_refusal(path, directory, outside=None)
    except FileNotFoundError:
        raise CommandError(f"no such file: {path}") from None
    except OSError as exc:
        raise CommandError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if reason is not None:
        raise CommandError(f"{path}: {refused_text(reason)}")
    return str(path.resolve())
