"""The driver's side of the Spark job: run the tasks, add up their counts, translate their failures.

One job per table (a task per key range). Separate from :mod:`.task` (what runs on
the executors) and :mod:`.run` (the per-table sequence) because it is where an
executor's error, wrapped by Spark as text, becomes idem's own error again.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idem_platform.migrations import Chains, MigrationFailed
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.read.migrate.counts import step_counts
from idem_platform.read.migrate.errors import MigrateError, MigrateLockTimeout
from idem_platform.read.migrate.task import EXAMPLES, OUTPUT_DDL, MigrateTask
from idem_platform.read.table import migration_errors

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class JobOutcome:
    """What a table's tasks reported, added up on the driver."""

    moved: Counter[int]
    batches: int
    failed: Counter[int | None]
    failed_total: int
    examples: list[dict[str, Any]]

    def summary(self, chains: Chains, record_type: str, entry: dict[str, Any]) -> dict[str, Any]:
        current = int(entry["current_version"])
        to_move = Counter({int(v): int(n) for v, n in entry["rows_by_version"].items()})
        return {
            "steps": step_counts(chains, record_type, current, to_move, self.moved, Counter(
                {step: count for step, count in self.failed.items() if step is not None}
            )),
            "rows_moved": sum(self.moved.values()),
            "rows_moved_by_version": {str(v): n for v, n in sorted(self.moved.items())},
            "rows_failed": self.failed_total,
            "failed_examples": self.examples,
            "batches": self.batches,
        }


def run_job(spark: SparkSession, task: MigrateTask) -> JobOutcome:
    """One Spark job: a task per key range; the driver only adds up what they report."""

    ranges = max(task.read.partitions, 1)
    frame = spark.range(0, ranges, 1, ranges).mapInArrow(task.run, OUTPUT_DDL)
    record_type = task.read.record_type
    try:
        with migration_errors():
            rows = frame.collect()
    except MigrationFailed as exc:
        raise MigrationFailed(
            f"{exc} (idem migrate of {qualified_table_name(record_type)} stopped; batches committed before stay migrated: fix the "
            "migration, or run idem migrate --skip-failed to leave such rows at their version)",
            step=exc.step, function=exc.function, key=exc.key,
        ) from exc
    except Exception as exc:
        found = executor_error(exc)
        if found is None:
            raise
        name, message = found
        if name.endswith("MigrateLockTimeout"):
            raise MigrateLockTimeout(message) from exc  # says what was undone and what to do
        raise MigrateError(
            f"idem migrate of {qualified_table_name(record_type)} failed on an executor: {name.rsplit('.', 1)[-1]}: {message} "
            "(batches committed before stay migrated; run idem migrate again)"
        ) from exc
    outcome = JobOutcome(Counter(), 0, Counter(), 0, [])
    for row in rows:
        kind, version, step, count = row["kind"], row["version"], row["step"], int(row["rows"])
        if kind == "batch":
            outcome.batches += count
        elif kind == "moved":
            outcome.moved[int(version)] += count
        elif kind == "failed":
            outcome.failed[step] += count
            outcome.failed_total += count
        elif kind == "example" and len(outcome.examples) < EXAMPLES:
            outcome.examples.append({"_idempotency_key": row["key"], "version": version, "error": row["error"]})
    return outcome


_EXCEPTION_LINE = re.compile(
    r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Timeout|Fault|Violation)): (?P<message>.*)$", re.M
)


def executor_error(exc: BaseException) -> tuple[str, str] | None:
    """``(exception class, message)`` of the Python error an executor raised, out of Spark's
    wrapping (the worker's traceback as text), or ``None``."""
    text = str(exc)
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return None
    found = _EXCEPTION_LINE.search(text, start)
    if found is None:
        return None
    return found.group("name"), found.group("message").strip()

