"""The read path (DESIGN §6): a record type's table as a Spark frame, every row in the current shape.

Used by the warehouse tables' IO manager (``load_input``) and by ``idem read``::

    read = read_table(spark, url, config, "indicator", skip_failed=False)
    read.frame            # lazy; system columns (_schema_version = current), typed columns, props
    read.rows_by_version  # {1: 500_000, 3: 500_000}: rows per stored version
    with migration_errors():
        read.frame.count()  # a raising migration: MigrationFailed naming the row's key and the step

Rows keep the version they were written with; a read upgrades the old ones on
the executors (:mod:`idem_platform.read.upgrade`), never in a driver loop.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from idem_platform.config import IdemConfig
from idem_platform.migrations import MigrationFailed
from idem_platform.pipeline.ingest import check_cluster_reach
from idem_platform.read.plan import ERROR_COLUMN, ORDER, ReadPlan
from idem_platform.read.planner import plan_read
from idem_platform.read.source import register, source_frame
from idem_platform.read.upgrade import KEEP, RAISE, SKIP

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class TableRead:
    """A planned read of ``idem.<record_type>``.

    Attributes:
        frame: lazy; its columns are idem's system columns (``_schema_version`` is the
            current version on every row), ``_kafka`` when the table has it, the typed
            catalog columns (``dynamic`` ones as JSON text), each retyped column's typed
            companion, and ``props`` (JSON text).
        record_type: the table's record type.
        current_version: its ``schema_version`` in ``idem.yaml``.
        rows_by_version: rows per stored ``_schema_version``, of the rows read (one SQL
            count on the driver, when the read was planned).
        skipped: rows whose migration failed (``skip_failed`` reads): ``0`` when no row
            is older than the current version, else ``None`` until counted
            (:meth:`count_skipped`).
    """

    frame: DataFrame
    record_type: str
    current_version: int
    rows_by_version: dict[int, int]
    skipped: int | None = None
    plan: ReadPlan | None = field(default=None, repr=False)
    spark: SparkSession | None = field(default=None, repr=False)

    @property
    def old_rows(self) -> int:
        """Rows stored at an older version than the current one (upgraded by the read)."""
        return sum(count for version, count in self.rows_by_version.items() if version != self.current_version)

    def count_skipped(self) -> int:
        """Count the rows whose migration fails (a Spark job over the old rows only); sets
        :attr:`skipped`."""
        if self.old_rows == 0:
            self.skipped = 0
            return 0
        if self.plan is None or self.spark is None:
            raise ValueError("count_skipped needs the plan and session of read_table()")

        # Only old rows can fail: read just those, unless a limit decides which rows are read.
        plan = replace(self.plan, only_old=True) if self.plan.limit is None else self.plan
        failing = source_frame(self.spark, plan, KEEP)
        with migration_errors():
            self.skipped = int(failing.filter(F.col(ERROR_COLUMN).isNotNull()).count())
        return self.skipped


def read_table(
    spark: SparkSession,
    url: str,
    config: IdemConfig,
    record_type: str,
    *,
    commit_id: str | None = None,
    limit: int | None = None,
    skip_failed: bool = False,
    ordered: bool = False,
    current: bool = False,
) -> TableRead:
    """Plan a read of ``idem.<record_type>`` in its current shape.

    The migration chains are validated first (:meth:`IdemConfig.chains`). The frame
    is lazy: rows are read, and old ones upgraded, by the executors when an action
    runs. A table that does not exist yet reads as an empty frame.

    Args:
        spark: the session.
        url: PostgreSQL, reachable from every executor.
        config: the config (its catalog is the current shape).
        record_type: the table.
        commit_id: only the rows of this commit.
        limit: only the first ``limit`` rows by ``(_ingested_at, _idempotency_key)``.
        skip_failed: leave out rows whose migration fails instead of failing the read.
        ordered: partition by ranges of ``(_ingested_at, _idempotency_key)``, each sorted
            by PostgreSQL, so the frame's partitions, in order, hold the rows in that
            order (``idem read``); costs a sort per partition in PostgreSQL.
        current: of an upsert table, its current state only (one version per identity);
            else every version (the history).

    Raises:
        ConfigError: unknown record type, migration modules that cannot be imported.
        MigrationChainError: a broken chain.
    """

    config.chains()
    check_cluster_reach(_master(spark), url)
    plan, counts = plan_read(
        url, config, record_type, commit_id=commit_id, limit=limit, parallelism=_slots(spark), ordered=ordered,
        current=current,
    )
    frame = source_frame(spark, plan, SKIP if skip_failed else RAISE).drop(ERROR_COLUMN)
    read = TableRead(frame, record_type, plan.current_version, counts, None, plan, spark)
    if skip_failed and read.old_rows == 0:
        read.skipped = 0
    return read


def _master(spark: SparkSession) -> str:
    try:
        return str(spark.conf.get("spark.master", "local[*]"))
    except Exception:  # noqa: BLE001 - a Spark Connect server keeps its master to itself
        return "local[*]"


def _slots(spark: SparkSession) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        return 2


_FAILED = re.compile(r"MigrationFailed: (?P<message>[^\n]*)")
_STEP = re.compile(r"^migration (?P<step>\S+ v\d+->v\d+) (?:\((?P<function>[^)]*)\) )?")
_KEY = re.compile(r" on row (?P<key>.+?:[0-9a-f]{12})(?=:|\s|$)")  # a record key ends in :<12 hex>


def migration_failure(exc: BaseException) -> MigrationFailed | None:
    """The :class:`MigrationFailed` an executor raised, out of Spark's wrapping of it
    (``PythonException``, ``Py4JJavaError``: the worker's traceback as text), or ``None``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, MigrationFailed):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    found = _FAILED.search(str(exc))
    if found is None:
        return None
    message = found.group("message").strip()
    step = _STEP.match(message)
    key = _KEY.search(message)
    return MigrationFailed(
        message,
        step=step.group("step") if step else "",
        function=(step.group("function") or "") if step else "",
        key=key.group("key") if key else None,
    )


@contextmanager
def migration_errors() -> Iterator[None]:
    """Around a Spark action on a read's frame: a failed migration surfaces as the
    :class:`MigrationFailed` it is (one clear line), not as Spark's wrapped traceback."""
    try:
        yield
    except MigrationFailed:
        raise
    except Exception as exc:
        failure = migration_failure(exc)
        if failure is None:
            raise
        raise failure from exc


def read_lines(read: TableRead, *, skip_failed: bool = False) -> Iterator[str | None]:
    """``idem read``'s output: each row as one JSON text, in ``(_ingested_at, _idempotency_key)``
    order; ``None`` for a row whose migration failed (``skip_failed``: counted, not shown).

    Rows are rendered by the executors as they are read (:mod:`idem_platform.read.render`).
    An ``ordered`` read's partitions come to the driver one by one, in order, as Arrow
    (one Spark job each, as many running ahead as there are slots): the driver only
    writes lines and never holds more than a few partitions. Any other read is sorted
    by Spark first.

    Raises:
        MigrationFailed: a row's migration failed (without ``skip_failed``).
    """

    plan, spark = read.plan, read.spark
    assert plan is not None and spark is not None
    mode = KEEP if skip_failed else RAISE
    with migration_errors():
        if plan.ordered or plan.limit is not None or plan.partitions <= 1:
            for table in _partitions_in_order(spark, plan, mode):
                for line, error in zip(table.column("line").to_pylist(), table.column("error").to_pylist(), strict=True):
                    yield None if error is not None else line
            return
        rendered = source_frame(spark, plan, mode, render=True).orderBy(*ORDER).select("line", "error")
        for line, error in rendered.toLocalIterator(prefetchPartitions=True):
            yield None if error is not None else line


def _partitions_in_order(spark: SparkSession, plan: ReadPlan, mode: str) -> Iterator[Any]:
    """Each partition's rendered lines as an Arrow table, in partition order, with up to one
    Spark job per slot running ahead."""

    register(spark)  # once, before the threads

    def fetch(index: int) -> Any:
        return source_frame(spark, replace(plan, part=index), mode, render=True).select("line", "error").toArrow()

    ahead = _slots(spark)
    with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="idem-read") as pool:
        pending: list[Future[Any]] = []
        indexes = iter(range(plan.partitions))
        try:
            for index in indexes:
                pending.append(pool.submit(fetch, index))
                if len(pending) >= ahead:
                    break
            while pending:
                table = pending.pop(0).result()
                following = next(indexes, None)
                if following is not None:
                    pending.append(pool.submit(fetch, following))
                yield table
        finally:
            for future in pending:
                future.cancel()

