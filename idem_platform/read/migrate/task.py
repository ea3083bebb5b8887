"""Step 3 of ``idem migrate`` on the executors: read a key range's old rows, upgrade them, batch them.

:class:`MigrateTask` is what Spark pickles to each task (``mapInArrow``): the read
plan restricted to old rows, the columns written back, the failure mode. It reads
with the read path's COPY, upgrades with the read path's own
:func:`~idem_platform.read.upgrade.upgrade_batch`, hands full batches to the
:class:`~idem_platform.read.migrate.writer.BatchWriter`, and reports a few count
rows per batch to the driver (:data:`OUTPUT_DDL`), never a row per record.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from idem_platform.faults import checkpoint
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.read.decode import read_rows
from idem_platform.read.migrate.errors import MigrateError
from idem_platform.read.migrate.writer import FROM_VERSION, BatchWriter
from idem_platform.read.plan import ERROR_COLUMN, ReadColumn, ReadPlan
from idem_platform.read.upgrade import upgrade_batch

EXAMPLES = 5  # failed rows shown per run (skip_failed)
ERROR_CHARS = 500
FAULT_POINT = "migrate_batch"  # idem_platform.faults: fired after each committed batch
# What each task reports to the driver (a few rows per batch, never a row per record).
OUTPUT_DDL = "kind string, version int, step int, rows long, key string, error string"
# The columns a task reads: what the upgrade needs. Everything else is selected as NULL.
_READ = frozenset({"_idempotency_key", "_connector", "_schema_version", "_payload"})
_WRITTEN_ROLES = ("typed", "companion", "props")


@dataclass(frozen=True)
class MigrateTask:
    """What each Spark task needs (picklable): the read of the old rows, the columns
    written back, the failure mode, the batch size.

    Attributes:
        read: the read plan restricted to rows below the current version
            (``only_old``), selecting only what the upgrade needs.
        writes: the columns an upgraded row sets (typed, companions, ``props``).
        mode: ``raise`` (a failing row fails the task) or ``keep`` (counted, left).
    """

    read: ReadPlan
    writes: tuple[ReadColumn, ...]
    mode: str
    batch_rows: int
    lock_timeout_seconds: float

    @classmethod
    def for_plan(cls, plan: ReadPlan, mode: str, batch_rows: int, lock_timeout_seconds: float) -> MigrateTask:
        """The task of a table's read plan.

        Raises:
            MigrateError: a column the upgrade fills is missing from the table.
        """
        writes = tuple(c for c in plan.columns if c.role in _WRITTEN_ROLES)
        missing = [c.name for c in writes if not c.present]
        if missing:
            raise MigrateError(
                f"{qualified_table_name(plan.record_type)} has no column {', '.join(missing)}: the table was not brought to the "
                "current catalog (run idem migrate again)"
            )
        columns = tuple(c if c.name in _READ else replace(c, present=False) for c in plan.columns)
        read = replace(plan, columns=columns, only_old=True)
        return cls(read, writes, mode, batch_rows, lock_timeout_seconds)

    def write_schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field("_idempotency_key", pa.string()), pa.field(FROM_VERSION, pa.int32())]
            + [pa.field(c.name, c.arrow) for c in self.writes]
        )

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``'s function: each input row is the index of a key range to migrate."""
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from self.migrate_range(int(index))

    def migrate_range(self, index: int) -> Iterator[pa.RecordBatch]:
        """Read, upgrade and write back the old rows of key range ``index``; yields the counts."""

        plan = self.read
        current = plan.current_version
        schema = plan.arrow_schema()
        write_schema = self.write_schema()
        failed: Counter[tuple[int, int | None]] = Counter()
        examples: list[tuple[int, int | None, str, str]] = []
        writer: BatchWriter | None = None
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        batches = 0
        try:
            for batch in read_rows(plan, index, schema):
                versions = batch.column("_schema_version")
                ours = pc.fill_null(pc.less(versions, current), False)
                if not pc.all(ours).as_py():  # stored newer than the config: never ours to touch
                    batch = batch.filter(ours)
                    versions = batch.column("_schema_version")
                if not batch.num_rows:
                    continue
                upgraded = upgrade_batch(batch, plan, self.mode)
                rows = pa.RecordBatch.from_arrays(
                    [upgraded.column("_idempotency_key"), versions.cast(pa.int32())]
                    + [upgraded.column(c.name).cast(c.arrow) for c in self.writes],
                    schema=write_schema,
                )
                errors = upgraded.column(ERROR_COLUMN)
                if errors.null_count != len(errors):
                    self._count_failures(upgraded, versions, errors, failed, examples)
                    rows = rows.filter(pc.is_null(errors))
                if rows.num_rows:
                    pending.append(rows)
                    pending_rows += rows.num_rows
                while pending_rows >= self.batch_rows:
                    table = pa.Table.from_batches(pending, schema=write_schema)
                    head, rest = table.slice(0, self.batch_rows), table.slice(self.batch_rows)
                    writer = writer or BatchWriter(self.read, self.writes, self.lock_timeout_seconds, write_schema)
                    batches += 1
                    yield self._commit(writer, head, index, batches)
                    pending, pending_rows = rest.to_batches(), rest.num_rows
            if pending_rows:
                writer = writer or BatchWriter(self.read, self.writes, self.lock_timeout_seconds, write_schema)
                batches += 1
                yield self._commit(writer, pa.Table.from_batches(pending, schema=write_schema), index, batches)
            if failed:
                counts = sorted(failed.items(), key=str)
                yield _output(
                    [("failed", version, step, count, None, None) for (version, step), count in counts]
                    + [("example", version, step, 0, key, error) for version, step, key, error in examples]
                )
        finally:
            if writer is not None:
                writer.close()

    def _commit(self, writer: BatchWriter, rows: pa.Table, index: int, number: int) -> pa.RecordBatch:
        moved = writer.write(rows)
        checkpoint(FAULT_POINT, record_type=self.read.record_type, partition=index, batch=number)
        return _output(
            [("batch", None, None, 1, None, None)] + [("moved", v, None, n, None, None) for v, n in sorted(moved.items())]
        )

    def _count_failures(
        self,
        upgraded: pa.RecordBatch,
        versions: pa.Array,
        errors: pa.Array,
        failed: Counter[tuple[int, int | None]],
        examples: list[tuple[int, int | None, str, str]],
    ) -> None:
        positions = np.flatnonzero(np.asarray(pc.is_valid(errors)))
        keys = upgraded.column("_idempotency_key").take(positions).to_pylist()
        starts = versions.take(positions).to_pylist()
        texts = errors.take(positions).to_pylist()
        current = self.read.current_version
        for key, start, text in zip(keys, starts, texts, strict=True):
            step = failed_step(text, current)
            failed[(start, step)] += 1
            if len(examples) < EXAMPLES:
                examples.append((start, step, key, text[:ERROR_CHARS]))


_STEP = re.compile(r"^migration \S+ v(?P<start>\d+)->v(?P<end>\d+)")


def failed_step(error: str, current: int) -> int | None:
    """The step (its ``from`` version) a failure is counted at: the step a raising
    migration names; a result that does not fit the catalog counts at the last step."""
    found = _STEP.match(error)
    if found is None:
        return None
    start, end = int(found.group("start")), int(found.group("end"))
    if end == start + 1:
        return start
    return current - 1 if end == current else None


def _output(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    kinds, versions, steps, counts, keys, errors = zip(*rows, strict=True) if rows else ((),) * 6
    return pa.RecordBatch.from_arrays(
        [
            pa.array(kinds, pa.string()),
            pa.array(versions, pa.int32()),
            pa.array(steps, pa.int32()),
            pa.array(counts, pa.int64()),
            pa.array(keys, pa.string()),
            pa.array(errors, pa.string()),
        ],
        names=["kind", "version", "step", "rows", "key", "error"],
    )

