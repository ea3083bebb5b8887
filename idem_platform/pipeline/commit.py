"""Commit a planned batch exactly once, from the driver's side, whatever its source.

* the commit takes a session-level advisory lock per ledger key (a file key, a
  Kafka range's start) on a connection it holds for the whole write.
  PostgreSQL releases it when the process dies, which is how a later run knows
  an ``in_progress`` row's owner is dead and may take it over;
* after the locks, the ledger is read again: units a run we waited for
  committed meanwhile become replays;
* the claim (ledger ``in_progress``, owner token) is committed before staging;
  the applying transaction re-checks it, so two runs can never both commit;
* the source's commit step (Kafka offsets) runs inside that transaction: if
  another run already moved it, nothing commits and the run reports that its
  range was already committed.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from idem_platform import errors
from idem_platform.config import ConnectorConfig
from idem_platform.contract.catalog import TableSpec
from idem_platform.faults import checkpoint
from idem_platform.ledger import (
    DEFAULT_REPLAY_WINDOW,
    Fresh,
    InFlight,
    Ledger,
    Mismatch,
    PriorError,
    PriorResult,
)
from idem_platform.pipeline.ingest import CoercedBatch, read_ledger, record_spec
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.postgres.tables import tables_with_rows
from idem_platform.redact import masked, remember_url, scrub
from idem_platform.write.apply.claim import ClaimLost, claim_taken
from idem_platform.write.apply.result import own_counts, record_replay
from idem_platform.write.apply.transaction import ApplyTransaction
from idem_platform.write.batch import SourceBatch
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import create_staging, drop_staging_quietly

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_RAISED = re.compile(r"idem_platform\.errors\.(\w+): ([^\n]*)")
_PSYCOPG_CAUSE = re.compile(r"^psycopg(?:\.\w+)*\.(\w+): (.*)$")
_EXCEPTION_LINE = re.compile(
    r"^((?:[a-z_]\w*\.)+[A-Z]\w*: [^\n]*|[A-Z]\w*(?:Error|Exception): [^\n]*)$", re.M
)


@dataclass
class CommitRequest:
    """Everything :func:`commit_batch` needs besides the batch."""

    url: str
    connector: ConnectorConfig
    run_id: str | None = None
    replay: bool = False
    replay_window: timedelta = DEFAULT_REPLAY_WINDOW
    lock_wait_seconds: float = 600.0  # for another live run holding one of the batch's units
    table_lock_timeout_seconds: float = 120.0  # for the target tables' lock when applying
    progress: Callable[[str], None] | None = None  # told as each slice is staged and applied
    count_per_unit: bool = False  # each unit's own figures (a run showing many files' partitions)


def as_idem_error(exc: BaseException, url: str | None = None) -> errors.IdemError:
    """The typed error a failed commit reports (and records in the ledger); ``url``: the
    PostgreSQL the commit writes to, named (password masked) when it closed the connection."""
    if isinstance(exc, errors.IdemError):
        return exc
    if isinstance(exc, psycopg.Error):
        return _postgres_error(type(exc).__name__, str(exc), url)
    if type(exc).__module__.startswith(("pyspark", "py4j")):
        return error_from_spark(exc, url)
    return errors.TransientError(f"{type(exc).__name__}: {str(exc)[:1000]}")


# A session PostgreSQL ended (terminated backend, shutdown, restart): the server's own
# SQLSTATE classes, and libpq's words when the socket closed before any message.
_CONNECTION_LOST_CLASSES = ("AdminShutdown", "CrashShutdown", "CannotConnectNow", "IdleSessionTimeout")
_CONNECTION_LOST_TEXT = ("server closed the connection", "connection is closed", "connection is lost", "terminating connection")


def _postgres_error(name: str, message: str, url: str | None = None) -> errors.IdemError:
    """A PostgreSQL failure as an idem error: a data exception (SQLSTATE class 22, psycopg's
    ``DataError``: a value PostgreSQL cannot store or convert) would meet the same data on
    every retry, so it is terminal; anything else (a lost connection, a lock) is transient.

    A lost connection says so in plain words, with the server's URL (password masked):
    the one line a person reads must tell a restart from a bug in the batch."""
    first = (message.strip().splitlines() or [""])[0].strip()
    if name in _CONNECTION_LOST_CLASSES or any(text in message for text in _CONNECTION_LOST_TEXT):
        server = f" at {masked(url)}" if url else ""
        return errors.TransientError(
            f"PostgreSQL: the server closed the connection ({name}: {first[:300]}){server}; "
            "nothing of this run was committed, the next run retries"
        )
    text = f"PostgreSQL: {name}: {message.strip()[:1000]}"
    found = getattr(psycopg.errors, name, None)
    if isinstance(found, type) and issubclass(found, psycopg.errors.DataError):
        return errors.TerminalError(text)
    return errors.TransientError(text)


def error_from_spark(exc: BaseException, url: str | None = None) -> errors.IdemError:
    """The idem error behind a Spark job failure: the class an executor raised, else a transient error."""
    # Late import (pulls in PySpark): off idem --help's imports (the CLI imports this module).
    from idem_platform.spark.remote import lost_server

    text = str(exc)
    unanswered = lost_server(exc)
    if unanswered is not None:  # gRPC's UNAVAILABLE: its details name the address and the reason
        return errors.TransientError(f"the Spark Connect server did not answer ({unanswered})")
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
        return _postgres_error(name, message, url)
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return errors.TransientError(f"Spark job failed: {(causes[-1] if causes else first)[:1000]}")


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


def _claim(conn: psycopg.Connection, request: CommitRequest, batch: SourceBatch, owner: str) -> list[str]:
    """Make the units' ledger rows ours; return the commit ids of dead owners (their staging is stale)."""
    ledger = Ledger(conn, request.connector.name, replay_window=request.replay_window)
    dead: list[str] = []
    for unit in {u.key: u for u in batch.pending}.values():
        outcome = ledger.begin(unit.key, unit.request, owner=owner)
        if isinstance(outcome, Fresh):
            continue
        if isinstance(outcome, (InFlight, PriorError)):
            # We hold the key's advisory lock, so an in-progress owner is dead;
            # a failed attempt is retried. Either way the row becomes ours.
            if isinstance(outcome, InFlight) and outcome.owner and "/" in outcome.owner:
                dead.append(outcome.owner.rsplit("/", 1)[1])
            ledger.take_over(unit.key, owner)
            continue
        if isinstance(outcome, PriorResult):
            raise errors.TransientError(
                f"{unit.label} ({unit.key}) was committed under this run's advisory lock; nothing was committed"
            )
        if isinstance(outcome, Mismatch):
            raise errors.TerminalError(
                f"{unit.key} is recorded for another request ({outcome.recorded_hash[:12]})"
            )
    return dead


def _record_failure(request: CommitRequest, keys: list[str], owner: str, error: errors.IdemError) -> None:
    """Record the failure in the units' ledger rows (its message scrubbed of credentials:
    libpq may echo a URL, and the ledger is read by the sensor and shown in the UI)."""
    remember_url(request.url)
    recorded = error.to_json()
    recorded["message"] = scrub(str(recorded.get("message", "")))
    with connect(request.url) as conn, conn.transaction():
        ledger = Ledger(conn, request.connector.name, replay_window=request.replay_window)
        for key in keys:
            try:
                ledger.fail_permanent(key, recorded, owner=owner)
            except Exception:  # noqa: BLE001 - the row is committed or taken over: leave it
                pass


def _release(request: CommitRequest, keys: list[str], owner: str) -> None:
    """Forget this run's claims (the ledger rows go): what it read is another run's now."""
    with connect(request.url) as conn, conn.transaction():
        ledger = Ledger(conn, request.connector.name, replay_window=request.replay_window)
        for key in keys:
            ledger.fail_transient(key, owner=owner)


def _clean_up_after_failure(request: CommitRequest, keys: list[str], plan: CommitPlan, error: errors.IdemError) -> None:
    """Record the failure and drop the staging tables, best effort.

    When PostgreSQL itself is what failed this may fail too; the original error
    is what the caller must see, and the next run takes the ``in_progress`` row
    over (its owner is dead) and drops the leftovers.
    """
    try:
        if isinstance(error, errors.SourceMoved):
            _release(request, keys, plan.owner)
        else:
            _record_failure(request, keys, plan.owner, error)
    except psycopg.Error:
        pass
    drop_staging_quietly(request.url, [plan.commit_id])


def summary_without_commit(batch: SourceBatch, *, started: float, **details: Any) -> dict[str, Any]:
    """The summary of a run that committed nothing, and no ``commits`` row: nothing was
    waiting at the source, or another run committed the source's range first."""
    return {
        "commit_id": None,
        "connector": batch.connector,
        "rows_written": 0,
        "rows_skipped": 0,
        "rows_rejected": 0,
        "replayed": False,
        "files": [],
        **({"notes": list(batch.notes)} if batch.notes else {}),
        **details,
        "seconds": round(time.monotonic() - started, 3),
    }


def replay_batch(request: CommitRequest, batch: SourceBatch, *, started: float) -> dict[str, Any]:
    """Record a fully replayed batch (no Spark): a ``replay`` commit with the prior counts."""
    plan = _plan(request, replace(batch, pending=batch.replayed, slices=()), str(uuid.uuid4()), {})
    priors = [batch.priors[u.key] for u in batch.replayed]
    with connect(request.url) as conn:
        result = record_replay(conn, plan, priors)
    # A run killed right after its COMMIT left its staging tables: the commit is known now.
    drop_staging_quietly(request.url, sorted({str(p["commit_id"]) for p in priors if p.get("commit_id")}))
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _plan(request: CommitRequest, batch: SourceBatch, commit_id: str, tables: dict[str, TableSpec]) -> CommitPlan:
    connector = request.connector
    return CommitPlan(
        commit_id=commit_id,
        connector=connector.name,
        run_id=request.run_id,
        owner=_owner(request.run_id, commit_id),
        units=batch.pending,
        slices=batch.slices,
        tables=tables,
        evolve=connector.evolve,
        max_reject_ratio=connector.max_reject_ratio,
        replay=request.replay,
        replay_window_seconds=int(request.replay_window.total_seconds()),
        started_at=datetime.now(UTC).isoformat(),
        spec=replace(record_spec(connector, tables, batch.pending), dynamic_values=False),
        step=batch.step,
        meta_column=connector.meta_column,
        replayed_records=replayed_records(batch),
        lock_timeout_seconds=request.table_lock_timeout_seconds,
        count_per_unit=request.count_per_unit,
        effects=connector.effects,
    )


def replayed_records(batch: SourceBatch) -> int:
    """Records of the batch's already-committed units, counted as replay skips.

    A unit whose ledger row keeps its own counts gives them (blank lines excluded, as
    when it ran); else an earlier commit that covered exactly some of these units gives
    its counts; a unit committed together with units outside this batch counts its
    planned records.
    """
    if not batch.replayed or not batch.pending:
        return 0  # a fully replayed batch counts its priors in record_replay
    by_commit: dict[str, list[Any]] = {}
    for unit in batch.replayed:
        prior = batch.priors.get(unit.key) or {}
        by_commit.setdefault(str(prior.get("commit_id")), []).append(unit)
    total = 0
    for units in by_commit.values():
        prior = batch.priors.get(units[0].key) or {}
        keys = {u.key for u in units}
        owns = [own_counts(batch.priors.get(key) or {}, key) for key in sorted(keys)]
        if all(own is not None for own in owns):  # each ledger row keeps its own unit's counts
            total += sum(sum(own) for own in owns if own is not None)
            continue
        if "commit_keys" in prior:  # the ledger keeps its own sources and how many keys the commit had
            exact = len(keys) >= int(prior["commit_keys"])
        else:  # a row written before that: the commit's whole list of sources
            covered = {s.get("key") for s in (prior.get("sources") or prior.get("files") or [])}
            exact = bool(covered) and covered <= keys
        if exact:
            total += sum(int(prior.get(k, 0)) for k in ("rows_written", "rows_skipped", "rows_rejected"))
        else:
            total += sum(u.records for u in {u.key: u for u in units}.values())
    return total


def _progress_line(plan: CommitPlan, applying: ApplyTransaction, done: int, seconds: float) -> str:
    return f"slice {done}/{len(plan.slices)} staged: {applying.records_staged:,} records so far, {seconds:.1f} s"


def _refresh(url: str, batch: SourceBatch) -> SourceBatch:
    """The batch after the ledger's latest word: units committed meanwhile become replays."""
    entries = read_ledger(url, batch.connector, sorted({u.key for u in batch.pending}))
    done = {k: e.result or {} for k, e in entries.items() if e.status == "committed"}
    return batch.with_committed(done) if done else batch


def _claim_and_create_staging(request: CommitRequest, batch: SourceBatch, tables: dict[str, TableSpec]) -> CommitPlan:
    """Plan the commit, make the units' ledger rows ours (committed before staging, so a
    run that dies from here on is recognised as dead) and create the staging tables;
    then drop what dead owners of those rows left staged."""
    plan = _plan(request, batch, str(uuid.uuid4()), tables)
    with connect(request.url) as conn:
        with conn.transaction():
            dead = _claim(conn, request, batch, plan.owner)
        with conn.transaction():
            plan = replace(plan, probe_known=tables_with_rows(conn, sorted(plan.tables)))
        create_staging(conn, plan)
    drop_staging_quietly(request.url, dead)  # a dead run's leftovers
    return plan


def _stage_and_apply(
    request: CommitRequest, plan: CommitPlan, session: SparkSession | None, stage_started: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stage the slices in Spark while the applying transaction streams each one in,
    then finish it. Returns the commit's result and the staging's own timings."""
    # Late import (pulls in PySpark): off idem --help's imports (the CLI imports this module).
    from idem_platform.spark.stage import StagingJobs

    with (
        connect(request.url, application_name="idem-commit") as conn,
        ApplyTransaction(conn, plan) as applying,
        StagingJobs(session, request.url, plan) as jobs,
    ):
        for done, message in enumerate(jobs.in_order(), 1):
            applying.add(message)
            if request.progress is not None:
                request.progress(_progress_line(plan, applying, done, time.monotonic() - stage_started))
        staged_seconds = time.monotonic() - stage_started
        if request.progress is not None:
            request.progress(
                f"applying {applying.records_staged:,} records into "
                + ", ".join(qualified_table_name(t) for t in sorted(plan.tables))
            )
        finishing = time.monotonic()
        result = applying.finish()
        finish_seconds = time.monotonic() - finishing
    if applying.leftovers:  # the connection went after COMMIT: drop them on a new one
        drop_staging_quietly(request.url, [plan.commit_id])
    task_seconds = [jobs.task_seconds[i] for i in sorted(jobs.task_seconds)]
    attempt_numbers = [jobs.attempt_numbers[i] for i in sorted(jobs.attempt_numbers)]
    return result, {
        "stage_and_insert_seconds": round(staged_seconds, 3),
        # After the last slice staged: the remaining inserts, the checks, the ledger and COMMIT.
        "finish_seconds": round(finish_seconds, 3),
        "stage_task_seconds": [round(t, 2) for t in task_seconds],
        # Spark's attempt number of the accepted attempt of each slice (0 = first try).
        "stage_attempt_numbers": attempt_numbers,
    }


def _apply_or_fail(
    request: CommitRequest, batch: SourceBatch, plan: CommitPlan, session: SparkSession | None, stage_started: float,
    started: float,
) -> tuple[dict[str, Any], dict[str, Any]] | dict[str, Any]:
    """:func:`_stage_and_apply`, its result and timings; or, when nothing of this run was
    applied because another run committed the units or the source's range first, the
    summary of a run that committed nothing.

    Raises:
        InFlightError: another run took the claim over and is ingesting the units now.
        IdemError: any other failure, typed (:func:`as_idem_error`) and recorded in the ledger.
    """
    keys = sorted({u.key for u in batch.pending})
    try:
        return _stage_and_apply(request, plan, session, stage_started)
    except ClaimLost as lost:
        return _after_lost_claim(request, batch, plan, lost, started)
    except errors.SourceMoved as moved:
        _clean_up_after_failure(request, keys, plan, moved)
        return summary_without_commit(
            batch, started=started, replayed=True, sources=plan.sources(), already_committed=str(moved)
        )
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, then re-raised typed
        taken = _claim_taken_quietly(request.url, plan)
        if taken is not None:  # the run that took over dropped our staging: that is the failure
            return _after_lost_claim(request, batch, plan, taken, started)
        error = as_idem_error(exc, request.url)
        _clean_up_after_failure(request, keys, plan, error)
        raise error from exc


def _after_lost_claim(
    request: CommitRequest, batch: SourceBatch, plan: CommitPlan, lost: ClaimLost, started: float
) -> dict[str, Any]:
    """Our advisory locks went (a lost connection) and another run took the units over:
    if it committed them, this run is a replay; else it fails with ``lost``'s line."""
    drop_staging_quietly(request.url, [plan.commit_id])
    refreshed = _refresh(request.url, batch)
    if refreshed.fully_replayed:
        return replay_batch(request, refreshed, started=started)
    raise errors.InFlightError(f"{lost}; another run is ingesting it now") from lost


def _claim_taken_quietly(url: str, plan: CommitPlan) -> ClaimLost | None:
    """:func:`claim_taken` on a connection of its own; ``None`` when PostgreSQL cannot say
    (it may be what failed)."""
    try:
        with connect(url) as conn:
            return claim_taken(conn, plan)
    except psycopg.Error:
        return None


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
        coerced: the batch (pending units are read, replays only counted) and the
            catalog its records are coerced to.
        spark: gives the session; called only when a unit is pending, so a fully
            replayed batch never starts Spark.
        started: ``time.monotonic()`` at the start of the run, for ``seconds``.

    Raises:
        InFlightError: another live run kept one of the units past the wait.
        RejectRatioExceeded, TransientError, TerminalError: nothing was committed.
    """
    started = time.monotonic() if started is None else started
    batch = coerced.batch
    if batch.empty:
        return summary_without_commit(batch, started=started, sources=[], nothing_to_ingest=True)
    if batch.fully_replayed:
        return replay_batch(request, batch, started=started)
    namespace = request.connector.name
    prepare_started = time.monotonic()
    with connect(request.url, autocommit=True, application_name="idem-locks") as lock_conn:
        _lock_keys(lock_conn, namespace, sorted({u.key for u in batch.pending}), request.lock_wait_seconds)
        batch = _refresh(request.url, batch)  # a run we waited for may have committed some units
        if batch.fully_replayed:
            return replay_batch(request, batch, started=started)
        session_started = time.monotonic()
        try:
            session = spark() if batch.slices else None  # empty files: nothing to read, no Spark
        except Exception as exc:  # noqa: BLE001 - a server that does not answer is one line too
            raise as_idem_error(exc) from exc
        session_seconds = time.monotonic() - session_started
        plan = _claim_and_create_staging(request, batch, coerced.tables)
        checkpoint("claimed")
        stage_started = time.monotonic()
        applied = _apply_or_fail(request, batch, plan, session, stage_started, started)
        if not isinstance(applied, tuple):
            return applied  # nothing of this run was applied: another run's commit, or the source's
        result, stage_timings = applied
        result["timings"] = {
            **result.get("timings", {}),
            "prepare_seconds": round(stage_started - prepare_started, 3),
            # Of prepare_seconds: starting (cold) or reaching (warm) Spark.
            "spark_session_seconds": round(session_seconds, 3),
            **stage_timings,
        }
    if plan.step is not None:
        result.update(plan.step.after_commit(result))
    if batch.replayed:
        result["already_committed"] = [u.label for u in batch.replayed]
    result["seconds"] = round(time.monotonic() - started, 3)
    return result
