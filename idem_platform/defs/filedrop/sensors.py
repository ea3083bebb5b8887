"""The file-drop sensor: settled files in, one run request per *batch* of files that still need committing.

Per tick it looks at the drop directory, hashes (in chunks) each file that is
settled (same size and mtime as on the previous tick) and not hashed before, asks
the ledger about all of them in one query, and decides per file: a file is run
when it is new, when its previous run died (``in_progress`` with no live lock
holder), or when it failed with a retryable error and has attempts left.

**Batches.** New files are grouped into runs of at most ``max_files_per_run``
files and ``max_bytes_per_run`` bytes (a larger file runs alone): one run, one
commit (one PostgreSQL transaction), each file keeping its ledger key
``filedrop:<sha256>`` and its own dynamic partition. A batch is requested as a
*partition-key range run*: ``RunRequest(partition_key=None)`` with the tags
``dagster/asset_partition_range_start``/``_end`` and the exact files in the run
config. Checked in Dagster 1.13's sources: a sensor's request without a
partition key is passed through unresolved; the daemon applies the tick's
dynamic-partition requests before it creates the tick's runs; ``create_run``
records the range as a ``KeyRangesPartitionsSubset`` for dynamic partitions; and
a step over a range records one ``AssetMaterialization`` per partition of the
range (``execute_step``), so every file's partition shows materialized by the
batch's run, with the commit's metadata. The assets carry
``BackfillPolicy.single_run()``, so one step sees all of the range's partitions
(and a UI backfill of many files is one run too).

A range of dynamic partitions is everything between its ends in the partitions'
insertion order, so a batch only groups files whose partitions are *consecutive*
in that order and all need a run (new partitions are added in sorted order in the
same tick, right after the existing ones): no other file's partition is ever
reported by a batch's run, and the run config's ``files`` keep the run to exactly
its files whatever happens to the partitions meanwhile.

What is decided per file, and how run keys and retries are made, is
:mod:`~idem_platform.defs.filedrop.decisions`; which files are settled, and the cursor,
:mod:`~idem_platform.defs.filedrop.settling`.
"""


from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg

from idem_platform.config import FileConnector
from idem_platform.contract.keys import file_key_from_digest
from idem_platform.defs.connector.names import sensor_name
from idem_platform.defs.filedrop.decisions import (
    Asked,
    Choice,
    Decision,
    Wanted,
    batch_run_key,
    batches,
    choose,
    copies_of_committed,
    solo_run_key,
)
from idem_platform.defs.filedrop.settling import Cursor, settled_files
from idem_platform.defs.metadata import human_bytes
from idem_platform.defs.resources import DEFAULT_KEYS, PostgresResource, ResourceKeys
from idem_platform.ledger import Ledger, LedgerEntry
from idem_platform.pipeline.commit import owner_alive
from idem_platform.postgres.schema import SCHEMA
from idem_platform.sources.filedrop.committed import committed_files
from idem_platform.sources.filedrop.scan import Seen, look

FILE_KEY_TAG = "idem/file_key"  # a batch: its first file's key (resources.py warms Spark up on it)
ATTEMPT_TAG = "idem/attempt"
FILES_TAG = "idem/files"  # how many files the run commits
BYTES_TAG = "idem/bytes"
# Dagster's own tags (dagster._core.storage.tags): a range run, and the key the daemon gives a sensor's run.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
RUN_KEY_TAG = "dagster/run_key"


def _request(
    run_key: str, group: Sequence[Wanted], ingest_op: str, span: tuple[str, str] | None
) -> dg.RunRequest:
    """One run for ``group``: a partition run for one file, a range run (``span``) for a batch."""
    tags = {
        FILE_KEY_TAG: group[0].key,
        ATTEMPT_TAG: str(group[0].attempt),
        FILES_TAG: str(len(group)),
        BYTES_TAG: str(sum(f.size for f in group)),
    }
    run_config = {"ops": {ingest_op: {"config": {"files": [str(f.path) for f in group]}}}}
    if span is None:
        return dg.RunRequest(run_key=run_key, partition_key=group[0].partition, run_config=run_config, tags=tags)
    return dg.RunRequest(
        run_key=run_key,
        partition_key=None,
        run_config=run_config,
        tags={**tags, RANGE_START_TAG: span[0], RANGE_END_TAG: span[1]},
    )


def _run_states(instance: dg.DagsterInstance, job_name: str, run_keys: set[str]) -> dict[str, str]:
    """``{run key: "active" | "ended"}`` of the keys some run of ``job_name`` carries (absent:
    no run yet). One query per key, as Dagster's sensor daemon does: an ``IN`` over the
    run tags plans badly on big run tables."""
    states: dict[str, str] = {}
    for key in sorted(run_keys):
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=job_name, tags={RUN_KEY_TAG: key}))
        if runs:
            states[key] = "ended" if all(run.is_finished for run in runs) else "active"
    return states


def _shared_owners(conn: psycopg.Connection, namespace: str, owners: list[str]) -> set[str]:
    """The owners (one commit attempt each) whose claim covered more than one ledger row."""
    if not owners:
        return set()
    rows = conn.execute(
        f"SELECT owner FROM {SCHEMA}.ingest_ledger WHERE namespace = %s AND owner = ANY(%s) "
        "GROUP BY owner HAVING count(*) > 1",
        [namespace, owners],
    ).fetchall()
    return {row[0] for row in rows}


def _read_ledger(
    postgres: PostgresResource, connector: FileConnector, keys: list[str]
) -> tuple[dict[str, LedgerEntry], set[str], set[str]]:
    """The files' ledger rows, the keys a live run holds, and the owners of failed rows whose
    commit claimed several files (only where that changes the decision)."""
    with postgres.connection() as conn, conn.transaction():
        entries = Ledger(conn, connector.name).entries(keys)
        in_progress = [k for k, e in entries.items() if e.status == "in_progress"]
        alive = owner_alive(conn, connector.name, in_progress)
        owners = {
            e.owner for e in entries.values()
            if e.status == "failed" and e.owner and e.attempts < connector.max_attempts
            and not (e.error or {}).get("retryable", False)
        }
        shared = _shared_owners(conn, connector.name, sorted(owners))
    return entries, alive, shared


def build_filedrop_sensor(
    connector: FileConnector,
    job: dg.JobDefinition | Any,
    partitions: dg.DynamicPartitionsDefinition,
    ingest_op: str,
    shown_path: str | None = None,
    resource_keys: ResourceKeys = DEFAULT_KEYS,
) -> dg.SensorDefinition:
    """The sensor of one file-drop connector (``shown_path``: its directory as the config names it;
    ``resource_keys``: whose ``idem_postgres`` holds its ledger)."""
    if connector.path is None:
        raise ValueError(f"connector {connector.name!r} has no drop directory")
    directory = Path(connector.path)
    job_name = str(job.name)

    @dg.sensor(
        name=sensor_name(connector),
        job=job,
        minimum_interval_seconds=connector.sensor_interval,
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={resource_keys.postgres},
        description=(
            f"Watches {shown_path or directory} for settled files (unchanged across two looks, or landed whole "
            "by idem serve; dotfiles and "
            "`*.tmp`, `*.part`, `*.partial` are ignored) and requests runs for the files the ledger has not "
            f"committed: new files in batches of up to {connector.max_files_per_run} files and "
            f"{human_bytes(connector.max_bytes_per_run)} (one commit, a partition per file), every retry one "
            "file per run. Run keys carry the attempt number, so failed files are retried."
        ),
    )
    def filedrop_sensor(context: dg.SensorEvaluationContext, **_resources: Any) -> dg.SensorResult:
        # A sensor called directly (a test's build_sensor_context) is handed its required
        # resources as keyword arguments; the daemon hands none. Both read the context's.
        postgres = resource_keys.postgres_of(context)
        try:
            directory.mkdir(parents=True, exist_ok=True)  # a new connector's drop directory exists from its first tick
        except OSError as exc:
            return dg.SensorResult(skip_reason=f"drop directory {directory} is missing and cannot be created: {exc}")
        scan = _scan(directory, connector, postgres, context.cursor)
        choice, entries = _decide(context.instance, job_name, directory, connector, postgres, scan)
        existing = list(context.instance.get_dynamic_partitions(partitions.name or ""))
        requests, new_partitions = _request_runs(existing, ingest_op, connector, choice, scan)
        skip_reason = None
        if not requests:
            skip_reason = _skip_reason(directory, scan, choice, entries)
        elif choice.held:
            context.log.info("held back: %s", "; ".join(choice.held[:20]))
        return dg.SensorResult(
            run_requests=requests,
            cursor=scan.cursor.dump(),
            dynamic_partitions_requests=[partitions.build_add_request(new_partitions)] if new_partitions else [],
            skip_reason=skip_reason,
        )

    return filedrop_sensor


def _span(
    remembered: list[str] | None, group: Sequence[Wanted], position: Mapping[str, int]
) -> tuple[str, str] | None:
    """The range of a request made again: as first asked (its partitions exist), else its files' ends."""
    if remembered is not None and len(remembered) == 2 and all(p in position for p in remembered):
        return remembered[0], remembered[1]
    ordered = sorted(group, key=lambda f: position[f.partition])
    return (ordered[0].partition, ordered[-1].partition) if len(ordered) > 1 else None


@dataclass
class _Scan:
    """What a tick's look at the drop directory found, and the cursor it starts to make: every
    later step of the tick reads it, and only ``cursor`` changes."""

    seen: dict[str, Seen]
    refused: dict[str, str]  # files look() will not read, with why
    done: set[str]  # committed as they are now
    previous: Cursor
    cursor: Cursor
    ready: dict[str, str]  # settled and hashed: their sha256
    memory: dict[str, Asked]  # what was asked for them before


def _scan(directory: Path, connector: FileConnector, postgres: PostgresResource, text: str | None) -> _Scan:
    """Step 1, scan: the drop directory's files, the ones committed as they are now (never hashed
    again), and the settled rest with their sha256 (:func:`settled_files`)."""
    previous = Cursor.load(text)
    refused: dict[str, str] = {}
    seen = look(directory, refused)
    absolute = {str((directory / relative).resolve()): relative for relative in seen}
    with postgres.connection() as conn:
        committed = committed_files(conn, connector.name, absolute)
    done = {
        absolute[path] for path, stamp in committed.items()
        if seen[absolute[path]].stamp == stamp
    }
    cursor, ready, memory = settled_files(directory, connector, seen, done, previous)
    return _Scan(seen, refused, done, previous, cursor, ready, memory)


def _decide(
    instance: dg.DagsterInstance,
    job_name: str,
    directory: Path,
    connector: FileConnector,
    postgres: PostgresResource,
    scan: _Scan,
) -> tuple[Choice, dict[str, LedgerEntry]]:
    """Step 2, decide: per settled file, what the ledger and the runs of earlier requests say
    (:func:`choose`); also returns the ledger rows, which the skip reason quotes."""
    # The runs of earlier requests are read before the ledger: a run seen ended has
    # written everything it ever will, so the ledger read next is its last word.
    states = _run_states(instance, job_name, {asked.run_key for asked in scan.memory.values()})
    ledger = _read_ledger(postgres, connector, sorted({file_key_from_digest(sha) for sha in scan.ready.values()}))
    sizes = {relative: scan.seen[relative].size for relative in scan.ready}
    choice = choose(directory, connector, scan.ready, sizes, ledger, scan.memory, states)
    _forget_committed(scan.cursor, choice.decisions)
    return choice, ledger[0]


def _request_runs(
    existing: list[str], ingest_op: str, connector: FileConnector, choice: Choice, scan: _Scan
) -> tuple[list[dg.RunRequest], list[str]]:
    """Step 3, request runs: earlier requests whose run does not exist yet, again; new files in
    batches of consecutive partitions; every retry alone. Returns the requests and the
    partitions to add (sorted, after ``existing``: a batch's range relies on that order)."""
    requested = {f.partition for f in choice.wanted} | {f.partition for g in choice.again.values() for f in g}
    new_partitions = sorted(requested - set(existing))  # added in this order, after the existing ones
    position = {p: i for i, p in enumerate([*existing, *new_partitions])}
    requests = [
        _request(run_key, group, ingest_op, _span(scan.previous.ranges.get(run_key), group, position))
        for run_key, group in sorted(choice.again.items())
    ]  # the same request again (the cursor's memory of it stays as it was)
    groups = batches(
        [f for f in choice.wanted if f.batchable], position, connector.max_files_per_run, connector.max_bytes_per_run
    )
    for group in [*groups, *([f] for f in choice.wanted if not f.batchable)]:
        span = (group[0].partition, group[-1].partition) if len(group) > 1 else None
        run_key = batch_run_key(group) if span else solo_run_key(group[0])
        _remember(scan.cursor, run_key, group, span)
        requests.append(_request(run_key, group, ingest_op, span))
    return requests, new_partitions


def _forget_committed(cursor: Cursor, decisions: Sequence[Decision]) -> None:
    """Step 4, cursor: a committed file will never be asked for again, so its request is
    dropped from the cursor (its stamp and sha256 stay)."""
    for decision in decisions:
        if decision.reason == "committed":  # nothing more will be asked for it: forget the request
            cursor.files[decision.relative] = cursor.files[decision.relative][:5]


def _remember(cursor: Cursor, run_key: str, group: Sequence[Wanted], span: tuple[str, str] | None) -> None:
    """Step 4, cursor: each file keeps the request that covered it (and a batch its range), so the
    next tick neither asks twice while the run is queued nor loses a request whose run is not
    there yet."""
    if span:
        cursor.ranges[run_key] = list(span)
    for file in group:
        cursor.files[file.relative] = [*cursor.files[file.relative][:5], run_key, file.attempt, file.misses]


def _skip_reason(directory: Path, scan: _Scan, choice: Choice, entries: dict[str, LedgerEntry]) -> str:
    """Why a tick requested nothing, in the one line Dagster shows: the counts, then the first
    reasons (files that will not run, held requests, copies of committed files, refused files)."""
    decisions = choice.decisions
    waiting = len(scan.seen) - len(scan.done) - len(scan.ready)
    notes = [f"{d.relative}: {d.reason}" for d in decisions if d.attempt is None and d.reason != "committed"]
    notes += choice.held
    notes += copies_of_committed(directory, decisions, entries)
    notes += [f"{relative}: {reason}" for relative, reason in sorted(scan.refused.items())]
    return (
        f"{len(scan.seen)} file(s): {len(scan.done)} committed, {len(scan.ready)} settled, {waiting} waiting to settle"
        + (f"; {'; '.join(notes[:5])}" if notes else "")
    )
