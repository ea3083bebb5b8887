"""The file-drop write path, stage by stage: plan → lines → coerced → commit.

Each stage is a plain function so the Dagster assets (one stage each), the CLI
and tests drive the very same code. Only :func:`commit_batch` writes; the
``ingest`` and ``coerced`` values are small plans whose frames are lazy, so the
files are read once, by the executors, at commit time.

Exactly-once, from the driver's side:

* planning hashes every file and reads the ledger; files already committed are
  replays and never reach Spark (a fully replayed batch starts no Spark job);
* the commit takes a session-level advisory lock per file key on a connection
  it holds for the whole write. PostgreSQL releases it when the process dies,
  which is how a later run knows an ``in_progress`` row's owner is dead and may
  take it over;
* the claim (ledger ``in_progress``, owner token) is committed before staging;
  the promoting transaction re-checks it, so two runs can never both commit.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from idem_platform import errors
from idem_platform.catalog import TableSpec
from idem_platform.coercion.records import RecordSpec
from idem_platform.commit.plan import CommitPlan
from idem_platform.commit.promote import Promotion, record_replay
from idem_platform.commit.staging import create_staging, drop_staging_quietly
from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.filedrop.files import DroppedFile, hash_file
from idem_platform.ledger import (
    DEFAULT_REPLAY_WINDOW,
    Fresh,
    InFlight,
    Ledger,
    LedgerEntry,
    Mismatch,
    PriorError,
    PriorResult,
)
from idem_platform.postgres.connection import connect, is_unix_socket_url
from idem_platform.postgres.tables import effective_spec, existing_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_RAISED = re.compile(r"idem_platform\.errors\.(\w+): ([^\n]*)")
_PSYCOPG_CAUSE = re.compile(r"^psycopg(?:\.\w+)*\.(\w+): (.*)$")
_EXCEPTION_LINE = re.compile(
    r"^((?:[a-z_]\w*\.)+[A-Z]\w*: [^\n]*|[A-Z]\w*(?:Error|Exception): [^\n]*)$", re.M
)


@dataclass(frozen=True)
class IngestBatch:
    """A planned batch: the files to read and the files already committed (replays)."""

    connector: str
    pending: tuple[DroppedFile, ...]
    replayed: tuple[DroppedFile, ...] = ()
    priors: dict[str, dict[str, Any]] = field(default_factory=dict)
    planned_at: str = ""

    @property
    def files(self) -> tuple[DroppedFile, ...]:
        return self.replayed + self.pending

    @property
    def fully_replayed(self) -> bool:
        return not self.pending

    def metadata(self) -> dict[str, Any]:
        return {
            "files": [f.path for f in self.files],
            "file_keys": [f.key for f in self.files],
            "bytes": sum(f.size for f in self.files),
            "lines": sum(f.lines for f in self.files),
            "splits": sum(len(f.splits) for f in self.pending),
            "already_committed": [f.path for f in self.replayed],
        }


def request_of(connector: str, key: str) -> dict[str, str]:
    """The ledger request of a dropped file: the file key under its connector."""
    return {"connector": connector, "file_key": key}


def read_ledger(url: str, namespace: str, keys: list[str]) -> dict[str, LedgerEntry]:
    """Ledger rows of ``keys`` (no lock)."""
    with connect(url) as conn, conn.transaction():
        return Ledger(conn, namespace).entries(keys)


def plan_batch(url: str, connector: ConnectorConfig, paths: Sequence[str | Path]) -> IngestBatch:
    """Hash every file (chunked) and split the batch into pending files and replays."""
    hashed = [hash_file(p, max_split_bytes=connector.split_bytes) for p in paths]
    entries = read_ledger(url, connector.name, sorted({f.key for f in hashed}))
    pending, replayed, priors = [], [], {}
    for file in hashed:
        entry = entries.get(file.key)
        if entry is not None and entry.status == "committed":
            replayed.append(file)
            priors[file.key] = entry.result or {}
        else:
            pending.append(file)
    return IngestBatch(
        connector.name, tuple(pending), tuple(replayed), priors, datetime.now(UTC).isoformat()
    )


def current_tables(url: str, config: IdemConfig, connector: ConnectorConfig) -> dict[str, TableSpec]:
    """The connector's tables as PostgreSQL has them now (declared + evolved columns)."""
    specs = config.tables_for(connector)
    with connect(url) as conn:
        return {name: effective_spec(spec, existing_columns(conn, name)) for name, spec in specs.items()}


def record_spec(connector: ConnectorConfig, tables: dict[str, TableSpec], files: Sequence[DroppedFile]) -> RecordSpec:
    """What executors need to coerce this batch's lines."""
    return RecordSpec(
        connector=connector.name,
        tables=tables,
        file_sha256=tuple(f.sha256 for f in files),
        record_type=connector.record_type,
        record_type_field=connector.record_type_field,
        id_field=connector.id_field,
        missing_id=connector.missing_id,
        evolve=connector.evolve,
        max_line_bytes=connector.max_line_bytes,
        spark_types=True,
    )


def lines_frame(spark: SparkSession, batch: IngestBatch, connector: ConnectorConfig) -> DataFrame:
    """The ``ingest`` frame: one row per line of the pending files (lazy)."""
    from idem_platform.spark.session import register_sources

    return (
        register_sources(spark).read.format("idem_filedrop_lines")
        .option("files", json.dumps([f.to_json() for f in batch.pending]))
        .option("max_line_bytes", str(connector.max_line_bytes))
        .load()
    )


def coerced_frame(lines: DataFrame, spec: RecordSpec) -> DataFrame:
    """The ``coerced`` frame: ``mapInArrow`` of the coercion over the lines (lazy)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from idem_platform.coercion.records import coerce_batches

    def coerce(batches: Any) -> Any:
        return coerce_batches(batches, spec)

    return lines.mapInArrow(coerce, from_arrow_schema(spec.output_schema()))


def check_cluster_reach(master: str, url: str) -> None:
    """Fail early when executors elsewhere could not reach an embedded (socket-only) PostgreSQL.

    Raises:
        EmbeddedPostgresError: naming ``IDEM_POSTGRES_URL``.
    """
    from idem_platform.spark.session import is_local_master

    if not is_local_master(master) and is_unix_socket_url(url):
        raise errors.EmbeddedPostgresError(
            f"Spark master {master!r} runs executors outside this process, but PostgreSQL is reached "
            "through a Unix socket (the embedded server listens on no TCP port). Set IDEM_POSTGRES_URL "
            "to a TCP URL every executor can reach, e.g. postgresql://user:pass@db-host:5432/idem"
        )


def as_idem_error(exc: BaseException) -> errors.IdemError:
    """The typed error a failed commit reports (and records in the ledger)."""
    if isinstance(exc, errors.IdemError):
        return exc
    if isinstance(exc, psycopg.Error):
        return errors.TransientError(f"PostgreSQL: {type(exc).__name__}: {str(exc).strip()[:1000]}")
    if type(exc).__module__.startswith(("pyspark", "py4j")):
        return error_from_spark(exc)
    return errors.TransientError(f"{type(exc).__name__}: {str(exc)[:1000]}")


def _clean_up_after_failure(request: CommitRequest, keys: list[str], plan: CommitPlan, error: errors.IdemError) -> None:
    """Record the failure and drop the staging tables, best effort.

    When PostgreSQL itself is what failed this may fail too; the original error
    is what the caller must see, and the next run takes the ``in_progress`` row
    over (its owner is dead) and drops the leftovers.
    """
    try:
        _record_failure(request.url, request, keys, plan.owner, error)
    except psycopg.Error:
        pass
    drop_staging_quietly(request.url, [plan.commit_id])


def error_from_spark(exc: BaseException) -> errors.IdemError:
    """The idem error behind a Spark job failure: the class an executor raised, else a transient error."""
    text = str(exc)
    raised = _RAISED.search(text)
    if raised:
        return errors.IdemError.from_json({"class": raised.group(1), "message": raised.group(2)})
    causes = [
        m.group(1)
        for m in _EXCEPTION_LINE.finditer(text)
        if not m.group(1).startswith(("pyspark.", "py4j.", "org.apache.spark."))
    ]
    if causes and (psycopg_cause := _PSYCOPG_CAUSE.match(causes[-1])):
        # An executor lost PostgreSQL: report it as the driver reports its own losses.
        name, message = psycopg_cause.groups()
        return errors.TransientError(f"PostgreSQL: {name}: {message.strip()[:1000]}")
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return errors.TransientError(f"Spark job failed: {(causes[-1] if causes else first)[:1000]}")


@dataclass(frozen=True)
class CoercedBatch:
    """A planned batch plus the catalog its lines are coerced to (the ``coerced`` asset's value).

    Small and picklable: the frame itself is rebuilt lazily from it, so any
    process (a retried step, a cluster driver) can resume from this value.
    """

    batch: IngestBatch
    connector: ConnectorConfig
    tables: dict[str, TableSpec]

    def spec(self) -> RecordSpec:
        return record_spec(self.connector, self.tables, self.batch.pending)

    def frame(self, spark: SparkSession) -> DataFrame:
        """The lazy ``coerced`` frame (lines read and coerced by executors when an action runs)."""
        return coerced_frame(lines_frame(spark, self.batch, self.connector), self.spec())

    def metadata(self) -> dict[str, Any]:
        return {
            "record_types": sorted(self.tables),
            "columns": {
                name: {c.name: str(c.type) + (" required" if c.required else "") for c in spec.columns}
                for name, spec in sorted(self.tables.items())
            },
            "schema_versions": {name: spec.schema_version for name, spec in sorted(self.tables.items())},
        }


@dataclass
class CommitRequest:
    """Everything :func:`commit_batch` needs besides the frames."""

    url: str
    connector: ConnectorConfig
    run_id: str | None = None
    replay: bool = False
    replay_window: timedelta = DEFAULT_REPLAY_WINDOW
    lock_wait_seconds: float = 600.0


def _owner(run_id: str | None, commit_id: str) -> str:
    return f"{run_id or 'cli'}/{commit_id}"


def _lock_keys(lock_conn: psycopg.Connection, namespace: str, keys: list[str], wait_seconds: float) -> None:
    """Take a session advisory lock per key, waiting up to ``wait_seconds`` for live holders.

    Raises:
        InFlightError: a key stayed locked by another live run.
    """
    deadline = time.monotonic() + wait_seconds
    for key in keys:
        while True:
            got = lock_conn.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [f"idem:{namespace}:{key}"]
            ).fetchone()
            if got and got[0]:
                break
            if time.monotonic() >= deadline:
                raise errors.InFlightError(
                    f"another live run has been ingesting {key} for over {wait_seconds:.0f}s; "
                    "this run committed nothing"
                )
            time.sleep(0.5)


def owner_alive(conn: psycopg.Connection, namespace: str, keys: list[str]) -> set[str]:
    """The keys whose advisory lock some live session holds right now (their runs are alive).

    Probes with transaction-level try-locks inside a transaction the caller
    rolls back or commits, which releases the probes.
    """
    alive = set()
    for key in keys:
        got = conn.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [f"idem:{namespace}:{key}"]
        ).fetchone()
        if not (got and got[0]):
            alive.add(key)
    return alive


def _claim(conn: psycopg.Connection, request: CommitRequest, keys: list[str], owner: str) -> list[str]:
    """Make the files' ledger rows ours; return the commit ids of dead owners (their staging is stale)."""
    ledger = Ledger(conn, request.connector.name, replay_window=request.replay_window)
    dead: list[str] = []
    for key in keys:
        outcome = ledger.begin(key, request_of(request.connector.name, key), owner=owner)
        if isinstance(outcome, Fresh):
            continue
        if isinstance(outcome, (InFlight, PriorError)):
            # We hold the key's advisory lock, so an in-progress owner is dead;
            # a failed attempt is retried. Either way the row becomes ours.
            if isinstance(outcome, InFlight) and outcome.owner and "/" in outcome.owner:
                dead.append(outcome.owner.rsplit("/", 1)[1])
            ledger.take_over(key, owner)
            continue
        if isinstance(outcome, PriorResult):
            raise AssertionError(f"{key} was committed under our advisory lock")
        if isinstance(outcome, Mismatch):
            raise errors.TerminalError(f"{key} is recorded for another request ({outcome.recorded_hash[:12]})")
    return dead


def _record_failure(url: str, request: CommitRequest, keys: list[str], owner: str, error: errors.IdemError) -> None:
    with connect(url) as conn, conn.transaction():
        ledger = Ledger(conn, request.connector.name, replay_window=request.replay_window)
        for key in keys:
            try:
                ledger.fail_permanent(key, error.to_json(), owner=owner)
            except Exception:  # noqa: BLE001 - the row is committed or taken over: leave it
                pass


def replay_batch(request: CommitRequest, batch: IngestBatch, *, started: float) -> dict[str, Any]:
    """Record a fully replayed batch (no Spark): a ``replay`` commit with the prior counts."""
    commit_id = str(uuid.uuid4())
    plan = _plan(request, batch.files, commit_id, {})
    with connect(request.url) as conn:
        result = record_replay(conn, plan, [batch.priors[f.key] for f in batch.replayed])
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _plan(
    request: CommitRequest,
    files: Sequence[DroppedFile],
    commit_id: str,
    tables: dict[str, TableSpec],
) -> CommitPlan:
    return CommitPlan(
        commit_id=commit_id,
        connector=request.connector.name,
        run_id=request.run_id,
        owner=_owner(request.run_id, commit_id),
        files=tuple(files),
        tables=tables,
        evolve=request.connector.evolve,
        max_reject_ratio=request.connector.max_reject_ratio,
        replay=request.replay,
        replay_window_seconds=int(request.replay_window.total_seconds()),
        started_at=datetime.now(UTC).isoformat(),
        spec=replace(record_spec(request.connector, tables, files), dynamic_values=False),
    )


def commit_batch(
    request: CommitRequest,
    coerced: CoercedBatch,
    spark: Callable[[], SparkSession],
    *,
    started: float | None = None,
) -> dict[str, Any]:
    """Commit a planned, coerced batch exactly once and return its summary.

    Args:
        request: where and for whom to commit.
        coerced: the batch (pending files are read, replays only counted) and the
            catalog its lines are coerced to.
        spark: gives the session; called only when a file is pending, so a fully
            replayed batch never starts Spark.
        started: ``time.monotonic()`` at the start of the run, for ``seconds``.

    Raises:
        InFlightError: another live run kept one of the files past the wait.
        RejectRatioExceeded, TransientError, TerminalError: nothing was committed.
    """
    from idem_platform.spark.stage import StagingJobs

    started = time.monotonic() if started is None else started
    batch = coerced.batch
    if batch.fully_replayed:
        return replay_batch(request, batch, started=started)
    namespace = request.connector.name
    prepare_started = time.monotonic()
    with connect(request.url, autocommit=True, application_name="idem-locks") as lock_conn:
        _lock_keys(lock_conn, namespace, sorted({f.key for f in batch.pending}), request.lock_wait_seconds)
        batch = _refresh(request.url, batch)  # a run we waited for may have committed some files
        if batch.fully_replayed:
            return replay_batch(request, batch, started=started)
        keys = sorted({f.key for f in batch.pending})
        session = spark()
        plan = _plan(request, batch.pending, str(uuid.uuid4()), coerced.tables)
        with connect(request.url) as conn:
            with conn.transaction():
                dead = _claim(conn, request, keys, plan.owner)
            create_staging(conn, plan)
        drop_staging_quietly(request.url, dead)  # a dead run's leftovers
        stage_started = time.monotonic()
        try:
            with (
                connect(request.url, application_name="idem-commit") as conn,
                Promotion(conn, plan) as promotion,
                StagingJobs(session, request.url, plan) as jobs,
            ):
                for message in jobs.in_order():
                    promotion.add(message)
                staged_seconds = time.monotonic() - stage_started
                result = promotion.finish()
            task_seconds = [jobs.task_seconds[i] for i in sorted(jobs.task_seconds)]
            attempt_numbers = [jobs.attempt_numbers[i] for i in sorted(jobs.attempt_numbers)]
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, then re-raised typed
            error = as_idem_error(exc)
            _clean_up_after_failure(request, keys, plan, error)
            raise error from exc
        result["timings"] = {
            **result.get("timings", {}),
            "prepare_seconds": round(stage_started - prepare_started, 3),
            "stage_and_insert_seconds": round(staged_seconds, 3),
            "stage_task_seconds": [round(t, 2) for t in task_seconds],
            # Spark's attempt number of the accepted attempt of each split (0 = first try).
            "stage_attempt_numbers": attempt_numbers,
        }
    if batch.replayed:
        result["already_committed"] = [f.path for f in batch.replayed]
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _refresh(url: str, batch: IngestBatch) -> IngestBatch:
    entries = read_ledger(url, batch.connector, sorted({f.key for f in batch.pending}))
    done = {k for k, e in entries.items() if e.status == "committed"}
    if not done:
        return batch
    priors = dict(batch.priors)
    priors.update({k: entries[k].result or {} for k in done})
    return IngestBatch(
        batch.connector,
        tuple(f for f in batch.pending if f.key not in done),
        batch.replayed + tuple(f for f in batch.pending if f.key in done),
        priors,
        batch.planned_at,
    )
