"""What the file-drop sensor does about each settled file: the ledger-driven rules, as pure
functions over ledger rows and the cursor's memory (tested case by case, no Dagster needed).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from idem_platform.config import FileConnector
from idem_platform.contract.keys import file_key_from_digest
from idem_platform.defs.filedrop.partitions import partition_key_for
from idem_platform.ledger import LedgerEntry, next_attempt


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


def copies_of_committed(directory: Path, decisions: list[Decision], entries: dict[str, LedgerEntry]) -> list[str]:
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
class Choice:
    """What a tick does about its settled files."""

    decisions: list[Decision]
    wanted: list[Wanted]  # files that get a new request
    again: dict[str, list[Wanted]]  # earlier requests whose run does not exist yet, by run key
    held: list[str]  # why files that need a run get none this tick


def choose(
    directory: Path,
    connector: FileConnector,
    ready: Mapping[str, str],
    sizes: Mapping[str, int],
    ledger: tuple[dict[str, LedgerEntry], set[str], set[str]],
    memory: Mapping[str, Asked],
    states: Mapping[str, str],
) -> Choice:
    """Per settled file: the ledger's decision, then what the request that last covered it says
    (its run queued or running: wait; no run yet: ask again; ended without the ledger hearing
    of the file: one more run, alone)."""
    entries, alive, shared = ledger
    choice = Choice([], [], {}, [])
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

