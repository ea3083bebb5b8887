"""What one commit is about to do: the picklable plan shipped to every staging task.

Everything an executor needs travels in this object with each task (plus the
PostgreSQL URL): the files and their splits, the catalog, the connector's rules.
Nothing depends on the driver process's memory, so the write behaves the same on
``local[*]`` and on a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from idem_platform.catalog import TableSpec
from idem_platform.coercion.records import RecordSpec
from idem_platform.filedrop.files import DroppedFile, Split


@dataclass(frozen=True)
class CommitPlan:
    """One commit of one connector's batch of files."""

    commit_id: str
    connector: str
    run_id: str | None
    owner: str
    files: tuple[DroppedFile, ...]
    tables: dict[str, TableSpec]
    evolve: bool
    max_reject_ratio: float
    replay: bool
    replay_window_seconds: int
    started_at: str
    spec: RecordSpec

    @property
    def splits(self) -> list[tuple[int, Split]]:
        """``(file index, split)`` of every input partition, in partition order."""
        return [(index, split) for index, file in enumerate(self.files) for split in file.splits]

    @property
    def input_partitions(self) -> int:
        return max(1, len(self.splits))

    @property
    def staging_prefix(self) -> str:
        return "c" + self.commit_id.replace("-", "")

    def staging_table(self, record_type: str) -> str:
        """Unquoted name in ``idem_staging`` of a record type's staging template
        (each task attempt stages into its own copy, see :mod:`idem_platform.commit.staging`)."""
        return f"{self.staging_prefix}_{sorted(self.tables).index(record_type)}"

    @property
    def rejects_table(self) -> str:
        return f"{self.staging_prefix}_rejects"

    def ledger_keys(self) -> list[str]:
        """The distinct file keys (two paths with the same bytes share one ledger row)."""
        return sorted({f.key for f in self.files})

    def sources(self) -> list[dict[str, Any]]:
        """The ``sources`` of the commits row: every file with its key, size and lines."""
        return [{"file": f.path, "key": f.key, "bytes": f.size, "lines": f.lines} for f in self.files]
