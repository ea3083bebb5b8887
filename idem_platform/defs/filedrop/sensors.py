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

**Failure isolation.** Only new files (no ledger row yet) are batched. A batch's
commit claims every file's ledger row under one owner (``<run>/<commit>``); if it
fails, each row records the same error, and if its process dies each row stays
``in_progress`` with a dead owner. Every later attempt of such a file runs alone,
so a poison file fails by itself and the others commit. A *permanent* error
(the batch's reject ratio, a terminal error) recorded for a commit that claimed
several files may be another file's fault: the file is retried alone once more
before its failure counts as its own (the ledger tells by the owner shared by
several rows). A batch run that ends without the ledger ever hearing of its files
(it failed before its commit claimed them: a file of it vanished or was swapped,
PostgreSQL was down at start, the run was canceled) has its files requested one
per run, up to ``max_attempts`` such runs.

**Run keys.** Dagster never re-launches a ``run_key`` it has seen, so keys carry
the ledger attempt: ``<partition>@<sha256[:16]>#<attempt>`` for a run of one
file (``.<n>`` appended for its n-th run at that attempt whose run ended without
the ledger hearing of it), ``<first partition>+<n-1>@<digest of the file keys>#1``
for a batch. The cursor remembers, per pending file, the request that covered it;
while that run is queued or running the file gets no other request, and a request
whose run does not exist yet is made again with the same key.
"""


import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg

from idem_platform.config import ConnectorConfig
from idem_platform.contract.keys import file_key_from_digest
from idem_platform.defs.filedrop.partitions import partition_key_for
from idem_platform.defs.resources import PostgresResource
from idem_platform.errors import FileChangedError, RefusedFileError
from idem_platform.ledger import Ledger, LedgerEntry, next_attempt
from idem_platform.pipeline.commit import owner_alive
from idem_platform.postgres.schema import SCHEMA
from idem_platform.sources.filedrop.committed import committed_files
from idem_platform.sources.filedrop.files import hash_file
from idem_platform.sources.filedrop.scan import look
from idem_platform.sources.push.landing import LANDED_SUFFIX

HASH_BUDGET_SECONDS = 20.0
_LANDED_NAME = re.compile(r"([0-9a-f]{64})" + re.escape(LANDED_SUFFIX))
FILE_KEY_TAG = "idem/file_key"  # a batch: its first file's key (resources.py warms Spark up on it)
ATTEMPT_TAG = "idem/attempt"
FILES_TAG = "idem/files"  # how many files the run commits
BYTES_TAG = "idem/bytes"
# Dagster's own tags (dagster._core.storage.tags): a range run, and the key the daemon gives a sensor's run.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
RUN_KEY_TAG = "dagster/run_key"
CURSOR_VERSION = 4


@dataclass(frozen=True)
class Decision:
    """What the sensor does about one settled, hashed file."""

    relative: str
    sha256: str
    attempt: int | None  # None: nothing to run
    reason: str


def decide(
    relative: str,
    sha256: str,
    entry: LedgerEntry | None,
    alive: bool,
    max_attempts: int,
    *,
    shared: bool = False,
) -> Decision:
    """The ledger-driven rule for one file, as a pure function (tested case by case).

    ``shared``: the row's failure was recorded by a commit that claimed other files
    too (a batch). A permanent error there may be another file's, so the file gets
    one more attempt, alone, before the failure counts as its own.
    """
    if (
        shared
        and entry is not None
        and entry.status == "failed"
        and not (entry.error or {}).get("retryable", False)
        and entry.attempts < max_attempts
    ):
        message = str((entry.error or {}).get("message", ""))[:200]
        return Decision(relative, sha256, entry.attempts + 1, f"its batch failed ({message}): retried alone")
    attempt, reason = next_attempt(entry, alive=alive, max_attempts=max_attempts, new="new file")
    return Decision(relative, sha256, attempt, reason)


@dataclass(frozen=True)
class Asked:
    """The cursor's memory of the request that last covered a file: its run key, the ledger
    attempt it was made for, and how many runs before it at that attempt ended without
    the ledger hearing of the file."""

    run_key: str
    attempt: int
    misses: int = 0


@dataclass(frozen=True)
class Wanted:
    """A file that gets a run request this tick."""

    relative: str
    sha256: str
    partition: str
    path: Path
    size: int
    attempt: int
    misses: int = 0  # runs at this attempt that ended without the ledger hearing of the file

    @property
    def key(self) -> str:
        return file_key_from_digest(self.sha256)

    @property
    def batchable(self) -> bool:
        """Only new files share a run: every later attempt runs alone (failure isolation)."""
        return self.attempt == 1 and self.misses == 0


def batches(
    files: Sequence[Wanted], position: Mapping[str, int], max_files: int, max_bytes: int
) -> list[list[Wanted]]:
    """Group files into runs: consecutive partitions in the partitions' order, each group at
    most ``max_files`` files and ``max_bytes`` bytes (a file larger than that runs alone).

    ``position``: each partition's index in the dynamic partitions' order (as it will be
    once this tick's new partitions are added). A gap (a partition that needs no run, or
    two files of one partition) ends a group: a range run covers every partition between
    its ends.
    """
    groups: list[list[Wanted]] = []
    current: list[Wanted] = []
    size = 0
    for file in sorted(files, key=lambda f: (position[f.partition], f.relative)):
        adjacent = bool(current) and position[file.partition] == position[current[-1].partition] + 1
        if adjacent and len(current) < max_files and size + file.size <= max_bytes:
            current.append(file)
            size += file.size
            continue
        if current:
            groups.append(current)
        current, size = [file], file.size
    if current:
        groups.append(current)
    return groups


def solo_run_key(file: Wanted) -> str:
    """``<partition>@<sha256[:16]>#<attempt>`` (``.<misses>`` after runs that never reached the ledger)."""
    return f"{file.partition}@{file.sha256[:16]}#{file.attempt}" + (f".{file.misses}" if file.misses else "")


def batch_run_key(group: Sequence[Wanted]) -> str:
    """``<first partition>+<n-1>@<digest of the files' partitions and keys>#1``: the same batch,
    the same key (Dagster launches it once)."""
    digest = hashlib.sha256("\n".join(f"{f.partition}\0{f.key}" for f in group).encode("utf-8", "surrogateescape"))
    return f"{group[0].partition}+{len(group) - 1}@{digest.hexdigest()[:16]}#1"


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


def _copies_of_committed(directory: Path, decisions: list[Decision], entries: dict[str, LedgerEntry]) -> list[str]:
    """``feed-003.ndjson: same content as committed feed-001.ndjson`` for each settled file whose
    bytes were committed under another name (it gets no partition and no run)."""
    notes = []
    for decision in decisions:
        if decision.reason != "committed":
            continue
        entry = entries.get(file_key_from_digest(decision.sha256))
        if entry is None:  # "committed" came from this row; without it there is nothing to name
            continue
        committed = [f.get("file") for f in ((entry.result or {}).get("files") or [])]
        path = str((directory / decision.relative).resolve())
        if committed and path not in committed:
            names = []
            for other in committed:
                try:
                    names.append(Path(other).relative_to(directory.resolve()).as_posix())
                except ValueError:
                    names.append(str(other))
            notes.append(f"{decision.relative}: same content as committed {', '.join(names)}")
    return notes


@dataclass
class _Cursor:
    """Per file still settling or not committed: ``[size, mtime_ns, ctime_ns, inode, sha256 or
    null]``, plus ``run_key, attempt, misses`` of the request that last covered it; per batch
    run key still remembered, its range ``[start, end]``."""

    files: dict[str, list[Any]]
    ranges: dict[str, list[str]]

    @classmethod
    def load(cls, cursor: str | None) -> "_Cursor":
        if not cursor:
            return cls({}, {})
        try:
            data = json.loads(cursor)
            return cls(dict(data.get("files", {})), dict(data.get("ranges", {})))
        except (ValueError, AttributeError, TypeError):
            return cls({}, {})

    @staticmethod
    def asked(entry: list[Any]) -> Asked | None:
        if len(entry) >= 8 and isinstance(entry[5], str):
            return Asked(entry[5], int(entry[6]), int(entry[7]))
        return None

    def dump(self) -> str:
        remembered = {entry[5] for entry in self.files.values() if len(entry) >= 8}
        ranges = {key: span for key, span in self.ranges.items() if key in remembered}
        return json.dumps({"v": CURSOR_VERSION, "files": self.files, "ranges": ranges}, separators=(",", ":"))


def _settled(
    directory: Path, connector: ConnectorConfig, seen: Mapping[str, Any], done: set[str], previous: _Cursor
) -> tuple[_Cursor, dict[str, str], dict[str, Asked]]:
    """The next cursor, the settled files with their sha256, and what was asked for them before.

    A file is hashed (in chunks) once it is settled and not hashed before, within the
    tick's hashing budget; a file that changed forgets its sha256 and its request.
    A body ``idem serve`` landed settles on its first look (:func:`_landed_whole`).
    """
    cursor = _Cursor({}, dict(previous.ranges))  # only files settling or not committed yet
    ready: dict[str, str] = {}
    memory: dict[str, Asked] = {}
    budget_end = time.monotonic() + HASH_BUDGET_SECONDS
    for relative, now in seen.items():
        if relative in done:
            continue  # committed as it is now: never hashed again, not remembered
        before = previous.files.get(relative)
        settled = before is not None and tuple(before[:4]) == now.stamp
        sha = before[4] if settled and before is not None and len(before) > 4 else None
        named = None if settled else _landed_name(connector, relative)
        if (settled or named) and sha is None and time.monotonic() < budget_end:
            try:
                sha = hash_file(directory / relative, max_split_bytes=connector.split_bytes).sha256
            except (FileChangedError, FileNotFoundError, RefusedFileError):
                settled, named = False, None  # changed, gone, or swapped for a FIFO since the look: the next look decides
            if named:
                settled = _landed_whole(named, sha)
                sha = sha if settled else None
        cursor.files[relative] = [*now.stamp, sha]
        if settled and sha is not None:
            ready[relative] = sha
            asked = _Cursor.asked(before) if before is not None else None
            if asked is not None:
                memory[relative] = asked
                cursor.files[relative] += [asked.run_key, asked.attempt, asked.misses]
    return cursor, ready, memory


def _landed_name(connector: ConnectorConfig, relative: str) -> str | None:
    """The sha256 a file of an http/otlp connector's landing directory is named by
    (``<sha256>.ndjson``, as ``idem serve`` lands bodies), else ``None``."""
    if connector.kind not in ("http", "otlp"):
        return None
    match = _LANDED_NAME.fullmatch(relative)
    return match.group(1) if match else None


def _landed_whole(named: str, sha: str | None) -> bool:
    """Whether a file named by a sha256 holds exactly the bytes that hash to it.

    ``idem serve`` writes a body to a dotfile, fsyncs it and renames it to its
    content's hash, so such a file is complete the moment it appears: waiting for a
    second look (a tick ``sensor_interval_seconds`` later) would only delay its run.
    Anything else under that name (a copy still being written, a file put there by
    hand) does not hash to it and settles the usual way, unchanged across two looks.
    """
    return sha is not None and sha == named


@dataclass
class _Choice:
    """What a tick does about its settled files."""

    decisions: list[Decision]
    wanted: list[Wanted]  # files that get a new request
    again: dict[str, list[Wanted]]  # earlier requests whose run does not exist yet, by run key
    held: list[str]  # why files that need a run get none this tick


def _choose(
    directory: Path,
    connector: ConnectorConfig,
    ready: Mapping[str, str],
    sizes: Mapping[str, int],
    ledger: tuple[dict[str, LedgerEntry], set[str], set[str]],
    memory: Mapping[str, Asked],
    states: Mapping[str, str],
) -> _Choice:
    """Per settled file: the ledger's decision, then what the request that last covered it says
    (its run queued or running: wait; no run yet: ask again; ended without the ledger hearing
    of the file: one more run, alone)."""
    entries, alive, shared = ledger
    choice = _Choice([], [], {}, [])
    for relative, sha in sorted(ready.items()):
        key = file_key_from_digest(sha)
        entry = entries.get(key)
        decision = decide(
            relative, sha, entry, key in alive, connector.max_attempts,
            shared=entry is not None and entry.owner in shared,
        )
        choice.decisions.append(decision)
        if decision.attempt is None:
            continue
        path = directory / relative
        file = Wanted(relative, sha, partition_key_for(connector, path), path, sizes[relative], decision.attempt)
        asked = memory.get(relative)
        if asked is not None and asked.attempt == decision.attempt:
            state = states.get(asked.run_key)
            if state == "active":
                choice.held.append(f"{relative}: its run {asked.run_key} is queued or running")
                continue
            if state is None:
                choice.again.setdefault(asked.run_key, []).append(file)
                continue
            misses = asked.misses + 1  # its run ended and the ledger never heard of the file
            if misses >= connector.max_attempts:
                choice.held.append(f"{relative}: {misses} runs ended without committing it (last {asked.run_key})")
                continue
            file = Wanted(relative, sha, file.partition, path, file.size, decision.attempt, misses)
        choice.wanted.append(file)
    return choice


def _read_ledger(
    postgres: PostgresResource, connector: ConnectorConfig, keys: list[str]
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
    connector: ConnectorConfig,
    job: dg.JobDefinition | Any,
    partitions: dg.DynamicPartitionsDefinition,
    ingest_op: str,
    shown_path: str | None = None,
) -> dg.SensorDefinition:
    """The sensor of one file-drop connector (``shown_path``: its directory as the config names it)."""
    if connector.path is None:
        raise ValueError(f"connector {connector.name!r} has no drop directory")
    directory = Path(connector.path)
    job_name = str(job.name)

    @dg.sensor(
        name=f"{connector.name.replace('-', '_')}_filedrop_sensor",
        job=job,
        minimum_interval_seconds=connector.sensor_interval,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Watches {shown_path or directory} for settled files (unchanged across two looks, or landed whole "
            "by idem serve; dotfiles and "
            "*.tmp/*.part/*.partial are ignored) and requests runs for the files the ledger has not "
            f"committed: new files in batches of up to {connector.max_files_per_run} files and "
            f"{connector.max_bytes_per_run} bytes (one commit, a partition per file), every retry one "
            "file per run. Run keys carry the attempt number, so failed files are retried."
        ),
    )
    def filedrop_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
        try:
            directory.mkdir(parents=True, exist_ok=True)  # a new connector's drop directory exists from its first tick
        except OSError as exc:
            return dg.SensorResult(skip_reason=f"drop directory {directory} is missing and cannot be created: {exc}")
        previous = _Cursor.load(context.cursor)
        refused: dict[str, str] = {}
        seen = look(directory, refused)
        absolute = {str((directory / relative).resolve()): relative for relative in seen}
        with postgres.connection() as conn:
            committed = committed_files(conn, connector.name, absolute)
        done = {
            absolute[path] for path, stamp in committed.items()
            if seen[absolute[path]].stamp == stamp
        }
        cursor, ready, memory = _settled(directory, connector, seen, done, previous)
        # The runs of earlier requests are read before the ledger: a run seen ended has
        # written everything it ever will, so the ledger read next is its last word.
        states = _run_states(context.instance, job_name, {asked.run_key for asked in memory.values()})
        ledger = _read_ledger(postgres, connector, sorted({file_key_from_digest(sha) for sha in ready.values()}))
        sizes = {relative: seen[relative].size for relative in ready}
        choice = _choose(directory, connector, ready, sizes, ledger, memory, states)
        for decision in choice.decisions:
            if decision.reason == "committed":  # nothing more will be asked for it: forget the request
                cursor.files[decision.relative] = cursor.files[decision.relative][:5]

        existing = list(context.instance.get_dynamic_partitions(partitions.name or ""))
        requested = {f.partition for f in choice.wanted} | {f.partition for g in choice.again.values() for f in g}
        new_partitions = sorted(requested - set(existing))  # added in this order, after the existing ones
        position = {p: i for i, p in enumerate([*existing, *new_partitions])}
        requests = [
            _request(run_key, group, ingest_op, _span(previous.ranges.get(run_key), group, position))
            for run_key, group in sorted(choice.again.items())
        ]  # the same request again (the cursor's memory of it stays as it was)
        groups = batches(
            [f for f in choice.wanted if f.batchable], position, connector.max_files_per_run, connector.max_bytes_per_run
        )
        for group in [*groups, *([f] for f in choice.wanted if not f.batchable)]:
            span = (group[0].partition, group[-1].partition) if len(group) > 1 else None
            run_key = batch_run_key(group) if span else solo_run_key(group[0])
            if span:
                cursor.ranges[run_key] = list(span)
            requests.append(_request(run_key, group, ingest_op, span))
            for file in group:
                cursor.files[file.relative] = [*cursor.files[file.relative][:5], run_key, file.attempt, file.misses]

        skip_reason = None
        if not requests:
            decisions = choice.decisions
            waiting = len(seen) - len(done) - len(ready)
            notes = [f"{d.relative}: {d.reason}" for d in decisions if d.attempt is None and d.reason != "committed"]
            notes += choice.held
            notes += _copies_of_committed(directory, decisions, ledger[0])
            notes += [f"{relative}: {reason}" for relative, reason in sorted(refused.items())]
            skip_reason = (
                f"{len(seen)} file(s): {len(done)} committed, {len(ready)} settled, {waiting} waiting to settle"
                + (f"; {'; '.join(notes[:5])}" if notes else "")
            )
        elif choice.held:
            context.log.info("held back: %s", "; ".join(choice.held[:20]))
        return dg.SensorResult(
            run_requests=requests,
            cursor=cursor.dump(),
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
