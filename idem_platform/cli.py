"""``idem``: the command line. On a terminal a short summary for people; piped (or with
``--json``) one JSON line on success; one error line otherwise.

``idem ingest`` runs the very same Dagster job the sensor launches, in process,
against the same instance (``$DAGSTER_HOME``, default ``.idem/dagster`` on the
same PostgreSQL), so CLI runs show up in ``dagster dev`` like any other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg

from idem_platform.config import (
    FileConnectorBase,
    IdemConfig,
    KafkaConnector,
    PushConnectorBase,
    load_config,
)
from idem_platform.errors import IdemError
from idem_platform.postgres.embedded import resolve_postgres_url
from idem_platform.private_files import private_dir, write_private_text
from idem_platform.redact import masked, remember_url, scrub
from idem_platform.settings import (
    CONFIG_ENV,
    POSTGRES_URL_ENV,
    SPARK_REMOTE_ENV,
    config_path_from_environment,
    idem_home,
    spark_master_from_environment,
    spark_remote_from_environment,
)

SUMMARY_KEYS = ("commit_id", "rows_written", "rows_skipped", "rows_rejected", "replayed", "files", "seconds")


class CommandError(Exception):
    """A failure worth one clear line (exit status 1).

    ``details``: what ``--verbose`` shows under it (a failed run's error with its
    traceback, as Dagster recorded it), when there is more to see.
    """

    def __init__(self, message: str, *, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


def prepare_environment() -> str:
    """Resolve PostgreSQL (embedded if needed) and point Dagster's instance at it.

    Returns:
        The PostgreSQL URL, also exported as ``IDEM_POSTGRES_URL`` for dagster.yaml.
    """
    from idem_platform.postgres import connect, ensure_schema

    url = resolve_postgres_url()
    os.environ[POSTGRES_URL_ENV] = url
    with connect(url, autocommit=True) as conn:
        ensure_schema(conn)
    template = (resources.files("idem_platform") / "dagster.yaml").read_text(encoding="utf-8")
    chosen = os.environ.get("DAGSTER_HOME")
    if not chosen:
        home = private_dir(idem_home() / "dagster")
        target = home / "dagster.yaml"
        if not target.exists() or target.read_text(encoding="utf-8") != template:
            write_private_text(target, template)
        os.environ["DAGSTER_HOME"] = str(home)
    elif not Path(chosen).exists():
        # Dagster refuses a DAGSTER_HOME that does not exist: make it, with idem's
        # instance settings (storage on the same PostgreSQL), as the default one has.
        Path(chosen).mkdir(parents=True)
        (Path(chosen) / "dagster.yaml").write_text(template, encoding="utf-8")
    return url


def public_summary(summary: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The summary's contract keys first, then the details."""
    out = {key: summary.get(key) for key in SUMMARY_KEYS}
    out["seconds"] = round(seconds, 3)
    if summary.get("prior") is not None:
        out["prior"] = summary["prior"]
    for key in ("tables", "schema_versions", "offsets", "sources", "consumer_group", "timings", "already_committed", "nothing_to_ingest", "notes", "connector", "spark"):
        if summary.get(key):
            out[key] = summary[key]
    return out


def ingest_connector(
    config: IdemConfig, connector_name: str, files: Sequence[str] = (), *, replay: bool = False
) -> dict[str, Any]:
    """Run the connector's ingest job in process (one commit) and return its summary.

    A file-drop connector ingests ``files``; a Kafka connector reads every
    partition from its committed offset up to the end the brokers report now.

    Raises:
        CommandError: bad arguments, or the run failed (the message is the underlying error).
        IdemError: the source cannot be planned (brokers unreachable, offsets behind retention).
    """
    from idem_platform.pipeline.ingest import check_cluster_reach, plan_batch
    from idem_platform.spark.session import spark_config_for, warm_up

    connector = config.connector(connector_name)
    url = resolve_postgres_url()
    check_cluster_reach(config.spark_master(), url)
    partition: str | None = None
    if connector.kind == "kafka":
        if files:
            raise CommandError(
                f"connector {connector_name!r} reads the Kafka topics {', '.join(connector.topics or [])}; "
                "it takes no files"
            )
        batch = plan_batch(url, connector)
        ranges = [
            {"topic": u.source["topic"], "partition": u.source["partition"], "start": u.source["start"], "end": u.source["end"]}
            for u in batch.units
        ]
        ingest_config: dict[str, Any] = {"ranges": ranges}
    elif connector.lands_files:
        if not files:
            raise CommandError(
                f"connector {connector_name!r} is a{'' if connector.kind == 'filedrop' else 'n'} "
                f"{connector.kind if connector.kind != 'filedrop' else 'file-drop'} connector: name the files to ingest"
            )
        paths = [checked_file(connector, f) for f in files]
        with hashing_in_background(paths):
            _import_run_modules()
        batch = plan_batch(url, connector, paths)
        partition = _partition_for(connector, paths)
        ingest_config = {"files": paths}
    else:
        raise CommandError(f"connector {connector_name!r} is a {connector.kind} connector; idem ingest cannot run it")
    spark_used: str | None = None
    if not batch.fully_replayed:
        use_spark_server(config)
        remote = spark_remote_from_environment() or config.spark.conf.get("spark.remote")
        spark_used = remote.split(";")[0] if remote else config.spark_master()  # no session id in the summary
        # Something to commit: start Spark now, in the background, while Dagster
        # sets the run up (the hashes computed here are reused by the run).
        warm_up({k: str(v) for k, v in spark_config_for(config.spark_master(), dict(config.spark.conf)).items()})
    summary = _run_job(config, connector, ingest_config, partition, replay=replay)
    if spark_used is not None:
        summary["spark"] = spark_used  # where the run's Spark was: a master, or a Connect server's sc:// URL
    return summary


@contextmanager
def hashing_in_background(paths: list[str]) -> Iterator[None]:
    """Hash ``paths`` in a thread while the body runs; the plan then finds them hashed.

    hashlib releases the GIL on large buffers, so the files' SHA-256 (~0.5 s for
    387 MB) overlaps the body's imports instead of following them. A file that fails
    here is hashed again by the plan, which reports the error.
    """
    from idem_platform.sources.filedrop import hash_file

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


def _import_run_modules() -> None:
    """Import what the run needs (Dagster, its PostgreSQL storage, the definitions): ~1 s
    of the interpreter's time that can overlap the files' hashing."""
    import idem_platform.defs.definitions  # noqa: F401
    import idem_platform.defs.storage  # noqa: F401


def use_spark_server(config: IdemConfig) -> str | None:
    """With ``spark.server: auto`` (the default) and no server named, run on the long-lived
    Spark Connect server under ``<idem home>/spark`` if one is up for this code and these
    settings (its URL goes to ``IDEM_SPARK_REMOTE`` for this process). ``None``: Spark
    starts in this process.

    No run starts a server: one is up only when someone asked for it (``idem spark
    start``, ``idem dev``), and stays up until ``idem spark stop`` (or the end of ``idem
    dev``). Before, every run that found none started one in the background, and a
    one-off ``idem ingest`` from a new directory left a JVM (~400 MB) running for good.
    """
    from idem_platform.spark import connect_server
    from idem_platform.spark.session import remote_url

    if config.spark_server() == "off" or remote_url(dict(config.spark.conf)) is not None:
        return None
    if _spark_choice:  # decided by this process's first run (`idem demo` runs three): a
        return _spark_choice[0]  # process that started Spark itself cannot switch to Connect
    _spark_choice.append(None)
    state = connect_server.ensure(idem_home() / "spark", master=config.spark_master(), conf=server_conf(config))
    if state is None:
        return None
    os.environ[SPARK_REMOTE_ENV] = state.url
    remember_url(state.url)  # its token: no message may show it
    _spark_choice[0] = state.url
    return state.url


_spark_choice: list[str | None] = []  # this process's use_spark_server answer, once given


def server_conf(config: IdemConfig) -> dict[str, str]:
    """The Spark settings a Connect server is started with: the config's, less ``spark.remote``."""
    return {k: v for k, v in config.spark.conf.items() if k != "spark.remote"}


def checked_file(connector: Any, name: str) -> str:
    """``name`` resolved, if ``idem ingest`` may read it; else a one-line error.

    The sensor's rules, in the sensor's words (:mod:`idem_platform.sources.filedrop.scan`):
    a name inside the drop directory must lead to a regular file inside it; a file named
    elsewhere must be a regular file. Only ``stat`` is used: opening a FIFO would block.

    Raises:
        CommandError: ``<path>: a FIFO, not a regular file: refused``, ``no such file: <path>``...
    """
    from idem_platform.sources.filedrop.scan import named_file_refusal, refused_text

    path = Path(os.path.abspath(name))
    try:
        reason = named_file_refusal(path, connector.path, outside=None)
    except FileNotFoundError:
        raise CommandError(f"no such file: {path}") from None
    except OSError as exc:
        raise CommandError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if reason is not None:
        raise CommandError(f"{path}: {refused_text(reason)}")
    return str(path.resolve())


def _partition_for(connector: Any, paths: list[str]) -> str:
    from idem_platform.defs.filedrop.partitions import partition_key_for

    if len(paths) == 1:
        return partition_key_for(connector, paths[0])
    return "batch-" + hashlib.sha256("\n".join(sorted(paths)).encode()).hexdigest()[:16]


def _run_job(
    config: IdemConfig, connector: Any, ingest_config: dict[str, Any], partition: str | None, *, replay: bool
) -> dict[str, Any]:
    """Execute the connector's Dagster job in process against the instance; return the commit summary."""
    import dagster as dg

    from idem_platform.defs.connector.names import asset_keys, job_name
    from idem_platform.defs.definitions import build_definitions
    from idem_platform.defs.filedrop.partitions import partitions_for
    from idem_platform.defs.storage import pool_storage_connections
    from idem_platform.defs.terminal import terminal_logger

    # The person at the terminal may ingest any file of their own; the code location's
    # definitions (runs launched from the UI) read only the drop directory.
    defs = build_definitions(config, files_outside_drop_dir=True)
    # A person at a terminal reads the job's own progress lines, not Dagster's events.
    job = defs.resolve_job_def(job_name(connector)).with_logger_defs({"console": terminal_logger})
    ingest_key, _, committed_key = asset_keys(connector)
    instance = dg.DagsterInstance.get()
    pool_storage_connections(instance)  # before the run's first event
    if partition is not None:
        partitions = partitions_for(connector)
        if not instance.has_dynamic_partition(partitions.name or "", partition):
            instance.add_dynamic_partitions(partitions.name or "", [partition])
    result = job.execute_in_process(
        run_config={
            "ops": {ingest_key.to_python_identifier(): {"config": ingest_config}},
            "loggers": {"console": {}},  # the terminal logger, not Dagster's default one
        },
        instance=instance,
        partition_key=partition,
        tags={"idem/replay": "true"} if replay else {},
        raise_on_error=False,
    )
    if not result.success:
        message, details = _failure_message(result)
        raise CommandError(message, details=details)
    from idem_platform.defs.summary import summary_from_metadata

    for materialization in result.asset_materializations_for_node(committed_key.to_python_identifier()):
        if materialization.asset_key == committed_key:  # the step also reports the tables it wrote
            return summary_from_metadata(materialization.metadata)
    raise CommandError("the run succeeded but recorded no commit summary")


def _failure_message(result: Any) -> tuple[str, str | None]:
    """A failed run in one line, and the error Dagster recorded, traceback and causes, for ``--verbose``."""
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


def _connector_name(config: IdemConfig, given: str | None, files: Sequence[str] = ()) -> str:
    """``--connector``; else the connector whose directory holds every file named; else the
    config's only connector, or its only file-drop connector when files are named."""
    if given:
        return given
    if len(config.connectors) == 1:
        return config.connectors[0].name
    if files:
        paths = [Path(f).resolve() for f in files]
        holders = [
            c for c in config.connectors
            if isinstance(c, FileConnectorBase) and c.path is not None and all(p.is_relative_to(c.path.resolve()) for p in paths)
        ]
        if len(holders) == 1:
            return holders[0].name
        filedrops = [c for c in config.connectors if c.kind == "filedrop"]
        if not holders and len(filedrops) == 1:
            return filedrops[0].name
    names = ", ".join(c.name for c in config.connectors) or "none"
    raise CommandError(f"{config.source or 'the config'} has several connectors: pick one with --connector ({names})")


def cmd_ingest(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    config = load_config(args.config)
    # A usage error is said before PostgreSQL is reached (or the embedded one started).
    name = config.connector(_connector_name(config, args.connector, args.files)).name
    prepare_environment()
    summary = ingest_connector(config, name, args.files, replay=args.replay)
    return public_summary(summary, time.monotonic() - started)


def cmd_demo(args: argparse.Namespace) -> dict[str, Any]:
    from idem_platform.samples import threatfeed_lines, write_lines

    started = time.monotonic()
    prepare_environment()
    config = load_config(args.config)
    connector = next((c for c in config.connectors if c.kind == "filedrop"), None)
    if connector is None or connector.path is None:
        raise CommandError("the demo needs a filedrop connector in the config")
    day = time.strftime("%Y-%m-%d")
    lines = list(threatfeed_lines(args.records, seed=1, bad_ratio=0.01))
    first = write_lines(connector.path / f"threatfeed-{day}-a.ndjson", lines)
    # The second drop re-sends the second half of the first (same records, same
    # keys: skipped) followed by as many new records (written).
    fresh = threatfeed_lines(args.records // 2, seed=2, start=10 * args.records)
    second = write_lines(connector.path / f"threatfeed-{day}-b.ndjson", [*lines[len(lines) // 2 :], *fresh])
    runs = [
        ingest_connector(config, connector.name, [str(first)]),
        ingest_connector(config, connector.name, [str(second)]),
        ingest_connector(config, connector.name, [str(first)]),
    ]
    totals = {k: sum(int(r[k]) for r in runs) for k in ("rows_written", "rows_skipped", "rows_rejected")}
    summary = {
        "commit_id": runs[-1]["commit_id"],
        **totals,
        "replayed": bool(runs[-1]["replayed"]),
        "files": [str(first), str(second)],
        "seconds": round(time.monotonic() - started, 3),
        "runs": [public_summary(r, float(r.get("seconds", 0))) for r in runs],
        "postgres": masked(os.environ[POSTGRES_URL_ENV]),
    }
    pusher = next((c for c in config.connectors if c.kind == "http"), None)
    if pusher is not None:
        summary["push"] = demo_push(config, pusher, [*lines[:2], *threatfeed_lines(2, seed=3, start=20 * args.records)])
        summary["seconds"] = round(time.monotonic() - started, 3)
    return summary


def demo_push(config: IdemConfig, connector: Any, lines: list[str]) -> dict[str, Any]:
    """One push through ``idem serve``'s API and its replay, then the landed file's ingest.

    The server runs in this process on a free loopback port; the requests are real HTTP.
    """
    import urllib.request

    from idem_platform.sources.push.server import serve_in_background, settings_from_environment

    body = "".join(line + "\n" for line in lines).encode()
    key = f"demo-push-{time.strftime('%Y-%m-%d')}"
    server = serve_in_background(settings_from_environment(config, os.environ[POSTGRES_URL_ENV]))
    answers = []
    try:
        for _ in range(2):
            request = urllib.request.Request(
                f"{server.url}/v1/connectors/{connector.name}/records",
                data=body,
                method="POST",
                headers={"Content-Type": "application/x-ndjson", "Idempotency-Key": key},
            )
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our own loopback server
                answers.append({"status": response.status, **json.loads(response.read())})
    finally:
        server.stop()
    landed = connector.path / Path(answers[0]["path"]).name
    run = ingest_connector(config, connector.name, [str(landed)])
    return {
        "request": f"POST /v1/connectors/{connector.name}/records",
        "idempotency_key": key,
        "answers": answers,
        "run": public_summary(run, float(run.get("seconds", 0))),
    }


def cmd_read(args: argparse.Namespace) -> dict[str, Any] | None:
    """Print a record type's rows as NDJSON, in the current shape: rows stored at an older
    ``schema_version`` are upgraded through the migrations on the way (the read path the IO
    manager uses). Last on stderr, one JSON line: the rows printed, and, when some rows were
    stored at an older version or skipped, the rows per stored version."""
    from idem_platform.pipeline.ingest import check_cluster_reach
    from idem_platform.read.table import read_lines, read_table, rows_summary
    from idem_platform.spark.session import build_session, spark_config_for

    config = load_config(args.config)
    if args.record_type not in config.tables:
        raise CommandError(f"unknown record type {args.record_type!r} (known: {', '.join(sorted(config.tables))})")
    args.commit = commit_id_argument(args.commit)
    if args.limit is not None and args.limit < 1:
        raise CommandError(f"--limit must be at least 1 (got {args.limit})")
    config.chains()  # a broken chain is a one-line error before Spark starts
    url = prepare_environment()
    check_cluster_reach(config.spark_master(), url)
    spark = build_session(spark_config_for(config.spark_master(), dict(config.spark.conf)))
    skip = bool(args.skip_failed_migrations)
    read = read_table(
        spark, url, config, args.record_type, commit_id=args.commit, limit=args.limit, skip_failed=skip, ordered=True
    )
    count = skipped = 0
    for line in read_lines(read, skip_failed=skip):
        if line is None:
            skipped += 1
            continue
        sys.stdout.write(line + "\n")
        count += 1
    summary: dict[str, Any] = {"record_type": args.record_type, "rows": count}
    if read.old_rows or skip:
        summary |= rows_summary(read) | ({"skipped": skipped} if skip else {})
    sys.stderr.write(json.dumps(summary) + "\n")
    return None


def list_rejects(
    url: str, *, connector: str | None = None, commit: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Rejected records, newest commit first, each with its position and every reason."""

    from idem_platform.postgres import connect

    commit = commit_id_argument(commit)
    if limit < 1:
        raise CommandError(f"--limit must be at least 1 (got {limit})")
    from idem_platform.sources.rejects.listing import list_rejects as read_rejects

    with connect(url) as conn:
        return read_rejects(conn, connector=connector, commit_id=commit, limit=limit)


def commit_id_argument(commit: str | None) -> str | None:
    """``--commit`` as a commit id (a UUID), or a one-line error."""
    import uuid

    if commit is None:
        return None
    try:
        return str(uuid.UUID(commit))
    except ValueError:
        raise CommandError(f"--commit {commit!r} is not a commit id (a UUID)") from None


def cmd_rejects(args: argparse.Namespace) -> dict[str, Any] | None:
    if getattr(args, "action", "list") == "retry":
        return cmd_rejects_retry(args)
    if getattr(args, "dry_run", False):
        raise CommandError("--dry-run goes with idem rejects retry")
    url = prepare_environment()
    rejects = list_rejects(url, connector=args.connector, commit=args.commit, limit=args.limit)
    if args.json or not sys.stdout.isatty():
        for reject in rejects:
            sys.stdout.write(json.dumps(reject, ensure_ascii=False, default=str) + "\n")
        return None
    for reject in rejects:
        reasons = "; ".join(
            f"{r.get('field') + ': ' if r.get('field') else ''}{r['message']} [{r['rule']}]" for r in reject["reasons"]
        )
        sys.stdout.write(f"{reject['connector']}  {reject['position']}  {reasons}{_retry_note(reject)}\n    {reject['raw'][:160]}\n")
    sys.stdout.write(f"{len(rejects)} reject(s) shown\n")
    return None


def _retry_note(reject: dict[str, Any]) -> str:
    """What the quarantine loop did with a reject, for the listing on a terminal."""
    if reject.get("retried_commit_id"):
        return f"  [retried: committed by {reject['retried_commit_id']}]"
    if reject.get("last_retry_reasons"):
        now = "; ".join(str(r.get("message")) for r in reject["last_retry_reasons"])
        return f"  [still failing after {reject.get('retries') or 0} retr{'y' if reject.get('retries') == 1 else 'ies'}: {now}]"
    return ""


def cmd_rejects_retry(args: argparse.Namespace) -> dict[str, Any]:
    """``idem rejects retry``: the connector's ``<connector>_retry_rejects`` job, in process."""
    started = time.monotonic()
    commit = commit_id_argument(args.commit)
    url = prepare_environment()
    config = load_config(args.config)
    name = args.connector
    if name is None and commit is not None and len(config.connectors) > 1:
        name = _connector_of_commit(url, commit)
    summary = retry_connector(config, _connector_name(config, name), commit=commit, dry_run=args.dry_run)
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary


def _connector_of_commit(url: str, commit: str) -> str | None:
    """The connector whose rejects ``commit`` recorded (or, a retry's, left quarantined), if any."""
    from idem_platform.postgres import connect

    with connect(url) as conn:
        row = conn.execute(
            "SELECT connector FROM idem.rejects WHERE commit_id = %s::uuid OR last_retry_commit_id = %s::uuid LIMIT 1",
            [commit, commit],
        ).fetchone()
    return None if row is None else str(row[0])


def retry_connector(config: IdemConfig, connector_name: str, *, commit: str | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Run the connector's ``<connector>_retry_rejects`` job in process (one commit, or none) and
    return its summary.

    Raises:
        CommandError: the run failed (the message is the underlying error).
    """
    import dagster as dg

    from idem_platform.defs.definitions import build_definitions
    from idem_platform.defs.rejects import retry_job_name, retry_op_name
    from idem_platform.defs.terminal import terminal_logger

    connector = config.connector(connector_name)
    job = build_definitions(config).resolve_job_def(retry_job_name(connector)).with_logger_defs({"console": terminal_logger})
    result = job.execute_in_process(
        run_config={
            "ops": {retry_op_name(connector): {"config": {"commit_id": commit, "dry_run": dry_run}}},
            "loggers": {"console": {}},
        },
        instance=dg.DagsterInstance.get(),
        raise_on_error=False,
    )
    if not result.success:
        message, details = _failure_message(result)
        raise CommandError(message, details=details)
    return dict(result.output_for_node(retry_op_name(connector)))


def cmd_ledger_purge(args: argparse.Namespace) -> dict[str, Any]:
    from datetime import timedelta

    from idem_platform.ledger import purge_expired
    from idem_platform.postgres import connect, ensure_schema
    from idem_platform.write.staging import drop_stale_staging

    url = prepare_environment()
    with connect(url, autocommit=True) as conn:
        ensure_schema(conn)
    with connect(url) as conn, conn.transaction():
        purged = purge_expired(conn, grace=timedelta(seconds=args.grace_seconds))
        dropped = drop_stale_staging(conn, 24 * 3600)
    return {"purged": purged, "staging_dropped": dropped}


def _progress_line(line: str) -> None:
    """A long command's progress on a terminal: on stderr, so stdout keeps only the report."""
    sys.stderr.write(line + "\n")


def cmd_promote(args: argparse.Namespace) -> dict[str, Any] | None:
    """``idem retype TYPE COLUMN --to KIND`` (alias ``idem promote``): a typed companion for an evolved text column, then the backfill."""
    from idem_platform.postgres.retype import human_report, promote_column

    config = load_config(args.config)
    if args.record_type not in config.tables:
        raise CommandError(f"unknown record type {args.record_type!r} (known: {', '.join(sorted(config.tables))})")
    if args.batch_rows < 1:
        raise CommandError(f"--batch-rows must be at least 1 (got {args.batch_rows})")
    url = prepare_environment()
    terminal = not args.json and sys.stdout.isatty()
    progress = _progress_line if terminal else None
    report = promote_column(
        url, config.table_specs[args.record_type], args.column, args.to, batch_rows=args.batch_rows, progress=progress
    )
    if terminal:
        sys.stdout.write(human_report(report) + "\n")
        return None
    return report


def cmd_migrate(args: argparse.Namespace) -> dict[str, Any] | None:
    """``idem migrate [--type T] [--dry-run]``: rows below their table's ``schema_version`` upgraded
    in place, in Spark, in batches of one transaction each; ``--dry-run`` counts per type and step."""
    from idem_platform.read.migrate.counts import plan_migration, selected_types
    from idem_platform.read.migrate.report import human_report
    from idem_platform.read.migrate.run import migrate

    config = load_config(args.config)
    if args.batch_rows < 1:
        raise CommandError(f"--batch-rows must be at least 1 (got {args.batch_rows})")
    types = selected_types(config, args.types)
    config.chains()  # a broken chain is a one-line error before Spark starts
    url = prepare_environment()
    terminal = not args.json and sys.stdout.isatty()
    if args.dry_run:
        report = plan_migration(url, config, types)
    else:
        from idem_platform.pipeline.ingest import check_cluster_reach
        from idem_platform.spark.session import build_session, spark_config_for

        check_cluster_reach(config.spark_master(), url)

        def spark() -> Any:  # started only when some table has rows to move; a bulk job: the full JIT
            return build_session(spark_config_for(config.spark_master(), dict(config.spark.conf)), long_lived=True)

        progress = _progress_line if terminal else None
        report = migrate(
            spark, url, config, types, batch_rows=args.batch_rows, skip_failed=args.skip_failed, progress=progress
        )
    if terminal:
        sys.stdout.write(human_report(report) + "\n")
        return None
    return report


def offsets_report(config: IdemConfig, url: str, connector_name: str | None = None) -> list[dict[str, Any]]:
    """Per Kafka partition: the committed offset, the log's start and end, the lag.

    A connector whose brokers cannot be reached still lists its committed
    offsets, with ``error`` saying why the rest is missing.
    """
    from idem_platform.errors import KafkaError
    from idem_platform.postgres import connect
    from idem_platform.sources.kafka.client import describe_partitions
    from idem_platform.sources.kafka.lag import partition_lags
    from idem_platform.sources.kafka.offsets import offset_rows

    if connector_name is not None:
        chosen = config.connector(connector_name)
        if not isinstance(chosen, KafkaConnector):
            raise CommandError(f"connector {connector_name!r} is a {chosen.kind} connector; it has no offsets")
        connectors = [chosen]
    else:
        connectors = [c for c in config.connectors if isinstance(c, KafkaConnector)]
        if not connectors:
            raise CommandError("no kafka connector in the config")
    report: list[dict[str, Any]] = []
    with connect(url) as conn:
        stored = {(r["connector"], r["topic"], r["partition"]): r for r in offset_rows(conn, connector_name)}
    for connector in connectors:
        mine = {(t, p): r for (c, t, p), r in stored.items() if c == connector.name}
        try:
            states = describe_partitions(connector).partitions
        except KafkaError as exc:
            for (topic, partition), row in sorted(mine.items()):
                report.append({"connector": connector.name, "topic": topic, "partition": partition,
                               "committed": row["next_offset"], "low": None, "high": None, "lag": None,
                               "commit_id": row["commit_id"], "error": str(exc)})
            continue
        committed = {key: row["next_offset"] for key, row in mine.items()}
        for lag in partition_lags(states, committed):
            row = mine.get((lag.topic, lag.partition), {})
            report.append({"connector": connector.name, "topic": lag.topic, "partition": lag.partition,
                           "committed": lag.committed, "low": lag.low, "high": lag.high, "lag": lag.lag,
                           "commit_id": row.get("commit_id")})
    return report


def cmd_offsets(args: argparse.Namespace) -> dict[str, Any] | None:
    url = prepare_environment()
    config = load_config(args.config)
    report = offsets_report(config, url, args.connector)
    if args.json or not sys.stdout.isatty():
        return {"offsets": report}
    columns = ("connector", "topic", "partition", "committed", "high", "lag")
    table = [[str(row.get(c) if row.get(c) is not None else "-") for c in columns] for row in report]
    widths = [max(len(c), *(len(r[i]) for r in table)) if table else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in table]
    errors = sorted({row["error"] for row in report if row.get("error")})
    sys.stdout.write("\n".join(lines + [f"error: {e}" for e in errors]) + "\n")
    return None


def cmd_serve(args: argparse.Namespace) -> dict[str, Any] | None:
    config = load_config(args.config)
    if not any(c.kind in ("http", "otlp") for c in config.connectors):
        raise CommandError(
            "idem serve needs an http or otlp connector in the config (kind: http | otlp, with the "
            "path its bodies land in)"
        )
    url = prepare_environment()
    from idem_platform.sources.push.server import serve, settings_from_environment

    settings = settings_from_environment(config, url)
    if args.max_body_bytes is not None:
        config = config.model_copy(
            update={
                "connectors": [
                    c.model_copy(update={"max_body_bytes": args.max_body_bytes}) if isinstance(c, PushConnectorBase) else c
                    for c in config.connectors
                ]
            }
        )
        settings.config = config
    serve(settings, args.host, args.port)
    return None


def spark_server_dir(args: argparse.Namespace) -> Path:
    """Where ``idem spark`` keeps its server's state: ``--dir``, else ``<idem home>/spark``."""
    return Path(args.dir).resolve() if getattr(args, "dir", None) else idem_home() / "spark"


def cmd_spark(args: argparse.Namespace) -> dict[str, Any] | None:
    """``idem spark start|stop|status``: the long-lived Spark Connect server runs reuse."""
    from idem_platform.spark import connect_server

    directory = spark_server_dir(args)
    if args.spark_command == "stop":
        return {"stopped": connect_server.stop(directory), "dir": str(directory)}
    if args.spark_command == "status":
        state = connect_server.read_state(directory)
        if state is None:
            return {"running": False, "dir": str(directory)}
        return {"running": state.alive, **asdict_of(state)}
    master = args.master or spark_master_from_environment() or "local[*]"
    if args.config or config_path_from_environment() or Path("idem.yaml").exists():
        config = load_config(args.config)
        master = args.master or config.spark_master()
        conf = server_conf(config)
    else:
        conf = {}
    state = connect_server.start_locked(directory, master=master, conf=conf, port=args.port)
    return {
        "running": True, **asdict_of(state),
        "use": f"export {SPARK_REMOTE_ENV}='{state.url}'  # runs and idem ingest then use this server",
    }


def asdict_of(state: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(state)


def cmd_dev(args: argparse.Namespace) -> dict[str, Any] | None:
    url = prepare_environment()
    config = load_config(args.config)  # fail here, with a clear line, rather than in the UI
    if config.source is not None:
        os.environ[CONFIG_ENV] = str(config.source)  # absolute: dagster dev runs from DAGSTER_HOME
    if not args.no_spark_server and not spark_remote_from_environment() and "spark.remote" not in config.spark.conf:
        # Every run the sensors launch is a new process: with a Spark Connect server
        # they connect to a warm JVM and warm Python workers instead of starting both.
        from idem_platform.spark import connect_server

        directory = spark_server_dir(args)
        started_here = connect_server.running(directory) is None
        sys.stderr.write(f"starting the Spark Connect server ({config.spark_master()}) for the runs...\n")
        state = connect_server.ensure(directory, master=config.spark_master(), conf=server_conf(config), wait=True)
        if state is not None:  # None: a stale server other runs still use; these runs start their own Spark
            os.environ[SPARK_REMOTE_ENV] = state.url
        try:
            return _dagster_dev(args, url)
        finally:
            if started_here:
                connect_server.stop(directory)
    return _dagster_dev(args, url)


def _dagster_dev(args: argparse.Namespace, url: str) -> dict[str, Any]:
    dagster = shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))
    workspace = Path(args.workspace).resolve()
    command = [dagster, "dev", "-w", str(workspace), "--host", args.host, "--port", str(args.port)]
    sys.stderr.write(json.dumps({"dagster_home": os.environ["DAGSTER_HOME"], "postgres": masked(url), "command": command}) + "\n")
    # From DAGSTER_HOME, the dagster.yaml of the working directory is the one in use (no
    # warning that a checkout's copy is ignored); `dagster dev` still works, so its notice
    # that `dg dev` supersedes it is noise here.
    env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning"}
    return {"exit_code": run_until_signalled(command, cwd=os.environ["DAGSTER_HOME"], env=env)}


def run_until_signalled(
    command: list[str], grace_seconds: float = 10.0, *, cwd: str | None = None, env: dict[str, str] | None = None
) -> int:
    """Run ``command`` in its own process group; on SIGINT or SIGTERM, pass the signal to the
    whole group (dagster dev, its webserver, daemon, code server and run workers) and kill
    whatever of the group is still there ``grace_seconds`` later."""
    import signal

    process = subprocess.Popen(command, start_new_session=True, cwd=cwd, env=env)
    received: list[tuple[int, float]] = []  # (signal, when)

    def forward(signum: int, _frame: object) -> None:
        received.append((signum, time.monotonic()))
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = process.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if received and time.monotonic() - received[0][1] > grace_seconds:
                    os.killpg(process.pid, signal.SIGKILL)
        if not received:
            return code
        try:  # what the group left behind (a code server, a run worker) goes too
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return 130 if received[0][0] == signal.SIGINT else 143
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="idem", description="Exactly-once JSON ingestion into PostgreSQL.")
    _add_verbose(top, default=False)
    commands = top.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str, aliases: Sequence[str] = ()) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, aliases=list(aliases))
        sub.add_argument("--config", help=f"idem.yaml (default: ${CONFIG_ENV}, else ./idem.yaml)")
        _add_verbose(sub)
        return sub

    ingest = add("ingest", "ingest a connector's files, or its Kafka lag, in process, exactly once")
    ingest.add_argument(
        "--connector", help="which connector (default: the one whose directory holds the files, else the only one)"
    )
    ingest.add_argument("--replay", action="store_true", help="tag the run as a replay (skips count as replay_skip)")
    ingest.add_argument("files", nargs="*", help="a file-drop connector's files (none for a Kafka connector)")
    ingest.add_argument("--json", action="store_true", help="one JSON line even on a terminal")
    ingest.set_defaults(func=cmd_ingest)
    demo = add("demo", "write sample drops and ingest them (then replay one)")
    demo.add_argument("--records", type=int, default=5000)
    demo.add_argument("--json", action="store_true", help="one JSON line even on a terminal")
    demo.set_defaults(func=cmd_demo)
    read = add("read", "print a record type's rows as NDJSON")
    read.add_argument("record_type")
    read.add_argument("--commit", help="only rows of this commit id")
    read.add_argument("--limit", type=int, help="the first N rows by (_ingested_at, _idempotency_key)")
    read.add_argument(
        "--skip-failed-migrations", action="store_true",
        help="leave out (and count) rows whose migration to the current schema_version fails, instead of failing",
    )
    read.set_defaults(func=cmd_read)
    ledger = add("ledger", "ledger maintenance")
    ledger_commands = ledger.add_subparsers(dest="ledger_command", required=True)
    purge = ledger_commands.add_parser("purge", help="delete expired ledger rows")
    purge.add_argument("--config")
    _add_verbose(purge)
    purge.add_argument("--grace-seconds", type=int, default=3600)
    purge.set_defaults(func=cmd_ledger_purge)
    rejects = add("rejects", "list rejected records with their positions and reasons; `retry` commits those the current catalog accepts")
    rejects.add_argument(
        "action", nargs="?", choices=("list", "retry"), default="list",
        help="list (default) | retry: re-run the quarantined rejects through the current catalog, commit those that pass",
    )
    rejects.add_argument("--connector", help="only this connector's rejects")
    rejects.add_argument("--commit", help="only the rejects of this commit id")
    rejects.add_argument("--dry-run", action="store_true", help="retry: count what would pass now, commit nothing")
    rejects.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    rejects.add_argument("--json", action="store_true", help="JSON lines even on a terminal")
    rejects.set_defaults(func=cmd_rejects)
    # `retype` was `promote` (a word the commit's own step also used): the old name stays an
    # alias for one release.
    promote = add(
        "retype", "give an evolved text column a typed companion column and backfill it (alias: promote)",
        aliases=["promote"],
    )
    promote.add_argument("record_type", metavar="TYPE", help="the record type (table idem.TYPE)")
    promote.add_argument("column", metavar="COLUMN", help="an evolved text column of it")
    promote.add_argument("--to", required=True, choices=["long", "real", "timestamp", "bool"], help="the type")
    promote.add_argument(
        "--batch-rows", type=int, default=50_000, help="rows per backfill transaction (default 50,000)"
    )
    promote.add_argument("--json", action="store_true", help="one JSON line even on a terminal")
    promote.set_defaults(func=cmd_promote)
    migrate = add("migrate", "upgrade rows stored at an older schema_version in place (in Spark, batched, resumable)")
    migrate.add_argument(
        "--type", dest="types", action="append", metavar="TYPE", help="only this record type (repeatable; default: all)"
    )
    migrate.add_argument("--dry-run", action="store_true", help="count the rows per type and step, write nothing")
    migrate.add_argument(
        "--batch-rows", type=int, default=50_000, help="rows per transaction (default 50,000)"
    )
    migrate.add_argument(
        "--skip-failed", action="store_true",
        help="count rows whose migration fails and leave them at their version, instead of failing",
    )
    migrate.add_argument("--json", action="store_true", help="one JSON line even on a terminal")
    migrate.set_defaults(func=cmd_migrate)
    offsets = add("offsets", "per Kafka partition: committed offset, log end and lag")
    offsets.add_argument("--connector", help="one Kafka connector (default: all)")
    offsets.add_argument("--json", action="store_true", help="one JSON line even on a terminal")
    offsets.set_defaults(func=cmd_offsets)
    serve = add("serve", "HTTP push API for http/otlp connectors: NDJSON with idempotency keys, OTLP logs")
    serve.add_argument("--host", default="127.0.0.1", help="without IDEM_HTTP_TOKEN: loopback only")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-body-bytes", type=int, help="override every connector's max_body_bytes")
    serve.set_defaults(func=cmd_serve)
    dev = add("dev", "start the embedded PostgreSQL if needed, then dagster dev")
    dev.add_argument("--workspace", default="workspace.yaml")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=3000)
    dev.add_argument(
        "--no-spark-server", action="store_true",
        help="runs start their own Spark (local JVM) instead of sharing the Spark Connect server idem dev starts",
    )
    dev.set_defaults(func=cmd_dev)
    spark = add("spark", "the long-lived Spark Connect server that runs reuse (no JVM start per run)")
    spark_commands = spark.add_subparsers(dest="spark_command", required=True)
    for name, text in (("start", "start it (or report the one running)"), ("stop", "stop it"), ("status", "is it running?")):
        sub = spark_commands.add_parser(name, help=text)
        sub.add_argument("--config")
        sub.add_argument("--dir", help="its state directory (default: .idem/spark, or $IDEM_HOME/spark)")
        _add_verbose(sub)
        if name == "start":
            sub.add_argument("--master", help="its Spark master (default: IDEM_SPARK_MASTER, idem.yaml, local[*])")
            sub.add_argument("--port", type=int, help="its port on 127.0.0.1 (default: a free one)")
        sub.set_defaults(func=cmd_spark)
    return top


def _add_verbose(parser: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    """``-v/--verbose`` before or after the command (``idem -v ingest``, ``idem ingest -v``).

    Subcommands default to ``SUPPRESS``: argparse would otherwise let a subcommand's
    default ``False`` overwrite the ``True`` given before the command name.
    """
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default,
        help="on failure, print the traceback to stderr too (the last line is still the one-line error)",
    )


def human_summary(summary: dict[str, Any]) -> str:
    """A commit's summary for a person at a terminal: what was written where, in how long."""
    if summary.get("runs"):  # the demo: each of its runs
        shown = "\n\n".join(f"run {i}: {human_summary(run)}" for i, run in enumerate(summary["runs"], 1))
        push = summary.get("push")
        if push:
            first, again = push["answers"]
            shown += (
                f"\n\npush: {push['request']} with Idempotency-Key {push['idempotency_key']}\n"
                f"  -> {first['status']}, replayed: {str(first['replayed']).lower()}, landed {first['path']} "
                f"({first['lines']} lines, {first['file_key'][:25]}...)\n"
                f"  same key and body again -> {again['status']}, replayed: {str(again['replayed']).lower()}, "
                f"same file key: {str(again['file_key'] == first['file_key']).lower()}\n"
                f"push run: {human_summary(push['run'])}"
            )
        return shown
    if summary.get("retry") is not None:  # idem rejects retry
        from idem_platform.pipeline.retry import human_retry_summary

        return human_retry_summary(summary)
    seconds = float(summary.get("seconds") or 0)
    if summary.get("nothing_to_ingest"):
        return f"nothing to ingest: every partition is committed up to its end ({seconds:.1f} s)"
    if summary.get("already_committed") and not summary.get("commit_id"):
        return f"nothing committed: {summary['already_committed']} ({seconds:.1f} s)"
    if summary.get("replayed"):
        prior = summary.get("prior") or {}
        return (
            f"replay: already committed by {prior.get('commit_id') or prior.get('commit_ids')}; nothing written, "
            f"{summary.get('rows_skipped', 0):,} records skipped ({seconds:.1f} s)"
        )
    rows = [("table", "written", "skipped")]
    for record_type, counts in sorted((summary.get("tables") or {}).items()):
        rows.append((f"idem.{record_type}", f"{counts.get('written', 0):,}", f"{counts.get('skipped', 0):,}"))
    rows.append(("total", f"{summary.get('rows_written', 0):,}", f"{summary.get('rows_skipped', 0):,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    table = [f"  {r[0].ljust(widths[0])}  {r[1].rjust(widths[1])}  {r[2].rjust(widths[2])}" for r in rows]
    lines = [f"committed {summary.get('commit_id')} in {seconds:.1f} s", *table]
    if summary.get("replay_skipped"):
        committed = ", ".join(str(u) for u in summary.get("already_committed") or [])
        lines.append(f"  {summary['replay_skipped']:,} of the skipped are records of files committed before: {committed}")
    if summary.get("rows_rejected"):
        lines.append(f"  {summary['rows_rejected']:,} records rejected: idem rejects --commit {summary.get('commit_id')}")
    for file in summary.get("files") or []:
        lines.append(f"  file {file.get('file')} ({file.get('lines', 0):,} lines)")
    for offsets in summary.get("offsets") or []:
        lines.append(f"  {offsets['topic']}-{offsets['partition']} offsets [{offsets['from']}, {offsets['to']})")
    return "\n".join(lines)


def _traceback(exc: BaseException) -> str:
    """``exc``'s traceback with its whole cause chain, credentials scrubbed."""
    import traceback

    return scrub("".join(traceback.format_exception(exc)))


def _unexpected(exc: Exception) -> str:
    """One line for an error nobody foresaw; its traceback goes to a log file the line names."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    try:
        path = idem_home() / "logs" / f"idem-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        write_private_text(path, _traceback(exc))  # 0600: a traceback can hold records
        return f"{text} (traceback in {path})"
    except OSError:
        return text


def _worth_tracing(exc: BaseException) -> str | None:
    """What ``--verbose`` prints above a foreseen error's line: the failed run's recorded
    error, or the traceback when the error was raised from another; else ``None`` (a config
    mistake's line says it all)."""
    details = getattr(exc, "details", None)
    if details:
        return scrub(details.rstrip("\n") + "\n")
    if exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        return _traceback(exc)
    return None


def _fail(line: str, trace: str | None) -> int:
    """Write the traceback (if any), then the one ``idem: error:`` line, last, so that
    ``stderr``'s last line is the error with or without ``--verbose``. Both scrubbed."""
    if trace:
        sys.stderr.write(trace if trace.endswith("\n") else trace + "\n")
    sys.stderr.write(f"idem: error: {scrub(line)}\n")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    remember_url(os.environ.get(POSTGRES_URL_ENV))  # no message below may show its password
    remember_url(spark_remote_from_environment())  # nor a Spark Connect server's token
    args = parser().parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    try:
        output = args.func(args)
    except (IdemError, CommandError) as exc:
        return _fail(str(exc), _worth_tracing(exc) if verbose else None)
    except KeyboardInterrupt:
        return 130
    except psycopg.OperationalError as exc:  # PostgreSQL down or unreachable: no bug, one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return _fail(f"PostgreSQL unreachable: {first}", _traceback(exc) if verbose else None)
    except Exception as exc:  # noqa: BLE001 - anything unforeseen: one line, the traceback in a file
        return _fail(_unexpected(exc), _traceback(exc) if verbose else None)
    if output is not None:
        human = not getattr(args, "json", True) and sys.stdout.isatty() and "rows_written" in output
        text = human_summary(output) if human else json.dumps(output, ensure_ascii=False, default=str)
        sys.stdout.write(text + "\n")
        if "exit_code" in output:
            return int(output["exit_code"])
    return 0


def exit_process(code: int) -> None:
    """Leave the process once everything is written.

    With a Spark gateway open, interpreter teardown finalises thousands of py4j
    proxies, one JVM round trip each (~1 s after a 1M-record ingest) although
    the JVM exits by itself when our stdin closes. The commit and the Dagster
    run are already durable in PostgreSQL here, so skip the teardown then.
    """
    pyspark = sys.modules.get("pyspark")
    remote = "pyspark.sql.connect.session" in sys.modules  # a Connect client's gRPC threads
    if pyspark is None or (pyspark.SparkContext._gateway is None and not remote):
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run() -> None:
    """The ``idem`` console script."""
    exit_process(main())


if __name__ == "__main__":
    run()
