"""The file-drop sensor: settled files in, one run request per file that still needs committing.

Per tick it looks at the drop directory, hashes (in chunks) each file that is
settled (same size and mtime as on the previous tick) and not hashed before, asks
the ledger about all of them in one query, and requests a run for each file that
is new, whose previous run died (``in_progress`` with no live lock holder), or
that failed with a retryable error and has attempts left.

Dagster never re-launches a ``run_key`` it has seen, so the key carries the
attempt number taken from the ledger: ``<partition>@<sha256[:16]>#<attempt>``.
A failed file therefore gets a fresh key for its next attempt, and a file that is
running or committed gets none.
"""


import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from idem_platform.commit.run import owner_alive
from idem_platform.config import ConnectorConfig
from idem_platform.connectors.filedrop.committed import committed_files
from idem_platform.connectors.filedrop.files import hash_file
from idem_platform.connectors.filedrop.scan import look
from idem_platform.defs.filedrop.partitions import partition_key_for
from idem_platform.defs.resources import PostgresResource
from idem_platform.errors import FileChangedError, RefusedFileError
from idem_platform.keys import file_key_from_digest
from idem_platform.ledger import Ledger, LedgerEntry, next_attempt

HASH_BUDGET_SECONDS = 20.0
FILE_KEY_TAG = "idem/file_key"
ATTEMPT_TAG = "idem/attempt"


@dataclass(frozen=True)
class Decision:
    """What the sensor does about one settled, hashed file."""

    relative: str
    sha256: str
    attempt: int | None  # None: nothing to run
    reason: str


def decide(
    relative: str, sha256: str, entry: LedgerEntry | None, alive: bool, max_attempts: int
) -> Decision:
    """The ledger-driven rule for one file, as a pure function (tested case by case)."""
    attempt, reason = next_attempt(entry, alive=alive, max_attempts=max_attempts, new="new file")
    return Decision(relative, sha256, attempt, reason)


def _copies_of_committed(directory: Path, decisions: list[Decision], entries: dict[str, LedgerEntry]) -> list[str]:
    """``feed-003.ndjson: same content as committed feed-001.ndjson`` for each settled file whose
    bytes were committed under another name (it gets no partition and no run)."""
    notes = []
    for decision in decisions:
        if decision.reason != "committed":
            continue
        entry = entries.get(file_key_from_digest(decision.sha256))
        committed = [f.get("file") for f in ((entry.result or {}).get("files") or []) if entry is not None]
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


def _load_cursor(cursor: str | None) -> dict[str, list[Any]]:
    if not cursor:
        return {}
    try:
        return dict(json.loads(cursor).get("files", {}))
    except (ValueError, AttributeError):
        return {}


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

    @dg.sensor(
        name=f"{connector.name.replace('-', '_')}_filedrop_sensor",
        job=job,
        minimum_interval_seconds=connector.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Watches {shown_path or directory} for settled files (unchanged across two looks; dotfiles and "
            "*.tmp/*.part/*.partial are ignored) and requests one run per file the ledger has not "
            "committed. Run keys carry the attempt number, so failed files are retried."
        ),
    )
    def filedrop_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
        try:
            directory.mkdir(parents=True, exist_ok=True)  # a new connector's drop directory exists from its first tick
        except OSError as exc:
            return dg.SensorResult(skip_reason=f"drop directory {directory} is missing and cannot be created: {exc}")
        previous = _load_cursor(context.cursor)
        refused: dict[str, str] = {}
        seen = look(directory, refused)
        absolute = {str((directory / relative).resolve()): relative for relative in seen}
        with postgres.connection() as conn:
            committed = committed_files(conn, connector.name, absolute)
        done = {
            absolute[path] for path, stamp in committed.items()
            if seen[absolute[path]].stamp == stamp
        }
        files: dict[str, list[Any]] = {}  # the cursor: only files settling or not committed yet
        ready: dict[str, str] = {}
        budget_end = time.monotonic() + HASH_BUDGET_SECONDS
        for relative, now in seen.items():
            if relative in done:
                continue  # committed as it is now: never hashed again, not remembered
            before = previous.get(relative)
            settled = before is not None and tuple(before[:4]) == now.stamp
            sha = before[4] if settled and before is not None and len(before) > 4 else None
            if settled and sha is None and time.monotonic() < budget_end:
                try:
                    sha = hash_file(directory / relative, max_split_bytes=connector.split_bytes).sha256
                except (FileChangedError, FileNotFoundError, RefusedFileError):
                    settled = False  # changed, gone, or swapped for a FIFO since the look: the next look decides
            files[relative] = [*now.stamp, sha]
            if settled and sha is not None:
                ready[relative] = sha
        keys = sorted({file_key_from_digest(sha) for sha in ready.values()})
        with postgres.connection() as conn:
            with conn.transaction():
                entries = Ledger(conn, connector.name).entries(keys)
                in_progress = [k for k, e in entries.items() if e.status == "in_progress"]
                alive = owner_alive(conn, connector.name, in_progress)
        decisions = [
            decide(
                relative,
                sha,
                entries.get(file_key_from_digest(sha)),
                file_key_from_digest(sha) in alive,
                connector.max_attempts,
            )
            for relative, sha in sorted(ready.items())
        ]
        requests = []
        partition_keys = []
        for decision in decisions:
            if decision.attempt is None:
                continue
            path = directory / decision.relative
            partition = partition_key_for(connector, path)
            partition_keys.append(partition)
            requests.append(
                dg.RunRequest(
                    run_key=f"{partition}@{decision.sha256[:16]}#{decision.attempt}",
                    partition_key=partition,
                    run_config={"ops": {ingest_op: {"config": {"files": [str(path)]}}}},
                    tags={
                        FILE_KEY_TAG: file_key_from_digest(decision.sha256),
                        ATTEMPT_TAG: str(decision.attempt),
                    },
                )
            )
        existing = set(context.instance.get_dynamic_partitions(partitions.name or ""))
        new_partitions = sorted(set(partition_keys) - existing)
        waiting = len(seen) - len(done) - len(ready)
        skip_reason = None
        if not requests:
            held = [f"{d.relative}: {d.reason}" for d in decisions if d.reason != "committed"]
            held += _copies_of_committed(directory, decisions, entries)
            held += [f"{relative}: {reason}" for relative, reason in sorted(refused.items())]
            skip_reason = (
                f"{len(seen)} file(s): {len(done)} committed, {len(ready)} settled, {waiting} waiting to settle"
                + (f"; {'; '.join(held[:5])}" if held else "")
            )
        return dg.SensorResult(
            run_requests=requests,
            cursor=json.dumps({"v": 3, "files": files}, separators=(",", ":")),
            dynamic_partitions_requests=[partitions.build_add_request(new_partitions)] if new_partitions else [],
            skip_reason=skip_reason,
        )

    return filedrop_sensor
