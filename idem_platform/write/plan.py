"""What one commit is about to do: the picklable plan shipped to every staging task.

Everything an executor needs travels in this object with each task (plus the
PostgreSQL URL): the units and the slices to read, the catalog, the connector's
rules. Nothing depends on the driver process's memory, so the write behaves the
same on ``local[*]`` and on a cluster. Nothing here knows which source the
units came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from idem_platform.coercion.records import RecordSpec
from idem_platform.contract.catalog import TableSpec
from idem_platform.effects.rule import OutboxRule
from idem_platform.write.batch import CommitStep, Slice, Unit


@dataclass(frozen=True)
class CommitPlan:
    """One commit of one connector's batch of units.

    Attributes:
        units: the pending units, in ``_unit`` index order.
        slices: what each staging task reads (one input partition each).
        step: source state moved inside the applying transaction (Kafka offsets).
        meta_column: the tables' column that receives the records' source
            metadata (``_kafka``), or ``None`` to keep none.
        replayed_records: records of the batch's already-committed units: counted
            as replay skips, so every record of a mixed batch is accounted for.
        lock_timeout_seconds: how long the applying transaction waits for a target table's
            lock (another commit applying rows to it, a user's open ``LOCK``)
            before it gives up with a transient error.
        count_per_unit: count the rows each unit (file) wrote in the inserts
            themselves (``INSERT … RETURNING`` grouped by unit): the figures a run over
            many files' partitions shows per file. About 1 s per 900,000 rows, so only
            runs that show them ask (the sensor's batch runs, not ``idem ingest``).
        probe_known: record types whose table held rows when the commit was
            planned: their staging tasks look up each batch's keys first and
            stage only keys the table does not hold (see
            :class:`~idem_platform.write.staging.StagingWriter`). Empty tables
            (a first load) are not probed.
    """

    commit_id: str
    connector: str
    run_id: str | None
    owner: str
    units: tuple[Unit, ...]
    slices: tuple[Slice, ...]
    tables: dict[str, TableSpec]
    evolve: bool
    max_reject_ratio: float
    replay: bool
    replay_window_seconds: int
    started_at: str
    spec: RecordSpec
    step: CommitStep | None = None
    meta_column: str | None = None
    replayed_records: int = 0  # records of units in the batch that an earlier commit holds
    lock_timeout_seconds: float = 120.0  # wait for the target tables' lock when applying
    probe_known: frozenset[str] = frozenset()
    count_per_unit: bool = False
    effects: tuple[OutboxRule, ...] = ()  # the connector's effects (idem_platform.effects.outbox)

    @cached_property
    def index_of(self) -> dict[str, int]:
        """Unit id -> its index (the records' ``_unit``)."""
        return {unit.id: index for index, unit in enumerate(self.units)}

    @property
    def input_partitions(self) -> int:
        """Slices to stage: 0 for a batch of empty files, which commits 0 rows and its ledger keys."""
        return len(self.slices)

    @property
    def staging_prefix(self) -> str:
        return "c" + self.commit_id.replace("-", "")

    def staging_table(self, record_type: str) -> str:
        """Unquoted name in ``idem_staging`` of a record type's staging template
        (each task attempt stages into its own copy, see :mod:`idem_platform.write.staging`)."""
        return f"{self.staging_prefix}_{sorted(self.tables).index(record_type)}"

    @property
    def rejects_table(self) -> str:
        return f"{self.staging_prefix}_rejects"

    def ledger_keys(self) -> list[str]:
        """The distinct ledger keys (two files with the same bytes share one ledger row)."""
        return sorted({unit.key for unit in self.units})

    def sources(self) -> list[dict[str, Any]]:
        """The ``sources`` of the commits row: every unit's entry."""
        return [unit.source for unit in self.units]
