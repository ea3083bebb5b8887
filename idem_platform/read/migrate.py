"""``idem migrate``: rows of ``idem.<record_type>`` older than its ``schema_version``, upgraded in place.

The read path (:mod:`idem_platform.read.table`) already returns every row in the
current shape; ``idem migrate`` makes that shape durable, so reads stop paying for
the upgrade and SQL users see current values. Per record type:

1. **Count** (driver, one ``GROUP BY`` statement): the rows below the current
   version, by the version their upgrade starts from, and the steps they go through
   (a v1 row at current v3 moves through v1->v2 and v2->v3: step counts are
   cumulative). ``--dry-run`` stops here and writes nothing (no DDL either).
2. **Prepare** (driver, short DDL under the commit path's lock order: the DDL advisory
   lock, the catalog row, then the table, in 2 s ``lock_timeout`` tries): the table gets
   the current catalog's columns (:func:`~idem_platform.postgres.tables.sync_tables`)
   and the nullable column ``_payload_version``.
3. **Upgrade and write** (executors, never a driver loop over rows): one Spark task
   per key range of the read plan (:func:`~idem_platform.read.planner.plan_read`), over
   ``mapInArrow``. Each task reads its range's old rows with the read path's COPY
   (:func:`~idem_platform.read.decode.read_rows`, only ``_idempotency_key``,
   ``_connector``, ``_schema_version`` and ``_payload``), upgrades them with the read
   path's own :func:`~idem_platform.read.upgrade.upgrade_batch` (so a migrated row
   holds exactly what a read returned for it before), and writes them back
   ``batch_rows`` at a time, **one transaction per batch**: a binary COPY into a
   temporary table, then one ``UPDATE … FROM`` the temporary table guarded by the
   version (below). Row locks only; each try waits 2 s at most for a lock, and a lock
   timeout, a lost deadlock or a serialization failure rolls the batch back and tries
   it again (up to ``lock_timeout_seconds``).

**What changes in a row**: its typed columns (declared and evolved), each promoted
column's typed companion (``<column>__<kind>``, cast from the upgraded text the way
``idem promote`` casts it), ``props``, ``_schema_version`` (to the current version) and
``_payload_version``. Never ``_idempotency_key``, ``_commit_id``, ``_ingested_at``,
``_source``, ``_content_hash`` or ``_payload``; columns the current catalog no longer
has (``temp`` after its rename) keep their old values.

**Why ``_payload`` stays as received.** ``_payload`` is the record as it arrived
(DESIGN §4): the key's content hash is computed from it, ``idem rejects retry`` and
audits rely on it, and every upgrade starts from it (typed columns lose fields that
``props`` or a dropped contract left out). Rewriting it to the upgraded record would
lose the original, or need a second copy of every payload. Instead the row records
the version its payload is in: ``_payload_version`` is set, once, to the version the
row had before its first migration (null means "same as ``_schema_version``"). A
migrated row is read as it is stored (it is at the current version); when
``schema_version`` is bumped again, the read path upgrades it from its payload's own
version (:meth:`~idem_platform.read.plan.ReadPlan.query` selects
``coalesce(_payload_version, _schema_version)`` for rows below the current version),
and so does the next ``idem migrate``: the upgrade always runs the whole chain from
the payload, exactly as for a row never migrated.

**The version guard** makes a rerun, a crash and a second ``idem migrate`` running at
the same time harmless: the ``UPDATE`` only touches a row still below the current
version whose payload version is the one the upgrade started from (``t._schema_version
< current AND coalesce(t._payload_version, t._schema_version) = b._from_version``). A
row moved already (by an earlier batch, a killed run, the other migrate) is skipped
and not counted; a row is never moved backwards (a migrate with an older config finds
nothing below its version). Killed midway, the committed batches stay; a rerun reads
the rows still below the current version and moves those: every row ends at the
current version exactly once, and a second run reports 0 rows moved and writes
nothing.

**A row whose migration fails** (the function raises, or its result does not fit the
catalog) fails the migrate with :class:`~idem_platform.migrations.MigrationFailed`
naming the row's key and the step; batches committed before stay migrated. With
``skip_failed`` it is counted (per step, with the first examples) and left at its
version, where reads still upgrade (and fail) it. Rows stored at a version *newer*
than the config's are counted (``rows_newer``) and never touched.

**Counts.** Each task reports the rows its committed batches moved (per start version,
from the ``UPDATE``'s own result); ``rows_left``, counted after the job, is the number of
rows still below the current version. A task Spark runs again (an executor lost) reads
its range's rows still below the version and moves them: batches its failed attempt
committed stay, but only the successful attempt's counts reach the report.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.errors import ConfigError, TerminalError, TransientError
from idem_platform.faults import checkpoint
from idem_platform.migrations import Chains, MigrationFailed
from idem_platform.postgres.connection import connect
from idem_platform.postgres.schema import DDL_LOCK_ID, SCHEMA
from idem_platform.postgres.tables import existing_columns, sync_tables, table_ident
from idem_platform.read.plan import ERROR_COLUMN, PAYLOAD_VERSION, ReadColumn, ReadPlan
from idem_platform.read.planner import plan_read
from idem_platform.read.upgrade import KEEP, RAISE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_BATCH_ROWS = 50_000
LOCK_TRY_SECONDS = 2.0  # each try of a batch (or of the DDL) waits this long for a lock at most
RETRY_PAUSE_SECONDS = 0.5
EXAMPLES = 5  # failed rows shown per run (skip_failed)
ERROR_CHARS = 500
FAULT_POINT = "migrate_batch"  # idem_platform.faults: fired after each committed batch
TEMP_TABLE = "idem_migrate_rows"
FROM_VERSION = "_from_version"
# What each task reports to the driver (a few rows per batch, never a row per record).
OUTPUT_DDL = "kind string, version int, step int, rows long, key string, error string"
# The columns a task reads: what the upgrade needs. Everything else is selected as NULL.
_READ = frozenset({"_idempotency_key", "_connector", "_schema_version", "_payload"})
# The PostgreSQL type of each frame kind (the temporary table's columns: the binary COPY
# must match the types the Arrow encoders write, and the target's columns have them too).
_PG_TYPES = {
    "text": "text",
    "json": "jsonb",
    "bool": "boolean",
    "int": "integer",
    "long": "bigint",
    "real": "double precision",
    "timestamp": "timestamp with time zone",
    "vector": "real[]",
}
_WRITTEN_ROLES = ("typed", "companion", "props")


class MigrateLockTimeout(TransientError):
    """A batch (or the migrate's DDL) kept meeting other sessions' locks past the timeout."""


class MigrateError(TerminalError):
    """An executor's part of the migrate failed for another reason than a migration."""


# ---------------------------------------------------------------- counting (the dry run)


def plan_migration(url: str, config: IdemConfig, record_types: Sequence[str] | None = None) -> dict[str, Any]:
    """What ``idem migrate`` would move, per record type and step; writes nothing.

    Returns:
        ``{"dry_run": True, "tables": {record_type: entry}, "rows_to_move", "rows_moved": 0,
        "rows_failed": 0, "seconds"}``; each entry: ``exists``, ``current_version``,
        ``rows_current``, ``rows_to_move``, ``rows_by_version`` (rows below the current
        version by the version their upgrade starts from), ``rows_newer`` (stored at a
        version past the config's: never touched), ``steps`` (per step: ``step``,
        ``function``, ``rows_to_move``, ``rows_moved``, ``rows_failed``), ``rows_moved``,
        ``rows_failed``, ``failed_examples``, ``batches``, ``seconds``.

    Raises:
        ConfigError: an unknown record type, migration modules that cannot be imported.
        MigrationChainError: a broken chain.
    """
    started = time.monotonic()
    chains = config.chains()
    tables: dict[str, dict[str, Any]] = {}
    with connect(url, autocommit=True, application_name="idem-migrate-plan") as conn:
        for record_type in selected_types(config, record_types):
            tables[record_type] = _count_entry(conn, chains, record_type, config.tables[record_type].schema_version)
    return _report(tables, dry_run=True, started=started)


def selected_types(config: IdemConfig, record_types: Sequence[str] | None) -> list[str]:
    """The record types to migrate, sorted (``None`` or empty: every declared one).

    Raises:
        ConfigError: a record type the config does not declare.
    """
    if not record_types:
        return sorted(config.tables)
    unknown = sorted(set(record_types) - set(config.tables))
    if unknown:
        known = ", ".join(sorted(config.tables)) or "none declared"
        raise ConfigError(f"unknown record type {', '.join(map(repr, unknown))} (known: {known})")
    return sorted(set(record_types))


def _count_entry(conn: psycopg.Connection, chains: Chains, record_type: str, current: int) -> dict[str, Any]:
    """One statement: rows per (stored version, payload version)."""
    started = time.monotonic()
    columns = existing_columns(conn, record_type)
    entry: dict[str, Any] = {
        "exists": bool(columns),
        "current_version": current,
        "rows_current": 0,
        "rows_to_move": 0,
        "rows_by_version": {},
        "rows_newer": 0,
        "steps": [],
        "rows_moved": 0,
        "rows_failed": 0,
        "failed_examples": [],
        "batches": 0,
        "seconds": 0.0,
    }
    if not columns:
        return entry
    source = (
        sql.SQL("coalesce({}, _schema_version)").format(sql.Identifier(PAYLOAD_VERSION))
        if PAYLOAD_VERSION in columns
        else sql.SQL("_schema_version")
    )
    counted = conn.execute(
        sql.SQL("SELECT _schema_version, {}, count(*) FROM {} GROUP BY 1, 2").format(source, table_ident(record_type))
    ).fetchall()
    by_version: Counter[int] = Counter()
    for stored, start, count in counted:
        if stored == current:
            entry["rows_current"] += int(count)
        elif stored > current:
            entry["rows_newer"] += int(count)
        else:
            by_version[int(start)] += int(count)
    entry["rows_by_version"] = {str(v): n for v, n in sorted(by_version.items())}
    entry["rows_to_move"] = sum(by_version.values())
    entry["steps"] = _steps(chains, record_type, current, by_version, Counter(), Counter())
    entry["seconds"] = round(time.monotonic() - started, 3)
    return entry


def _steps(
    chains: Chains,
    record_type: str,
    current: int,
    to_move: Counter[int],
    moved: Counter[int],
    failed: Counter[int],
) -> list[dict[str, Any]]:
    """Per step ``v -> v+1`` from the oldest version found: the rows that go through it
    (every row starting at ``v`` or before), moved, and failed at it."""
    if not to_move:
        return []
    chain = chains.steps.get(record_type, {})
    steps = []
    for start in range(min(to_move), current):
        migration = chain.get(start)
        steps.append({
            "step": f"{record_type} v{start}->v{start + 1}",
            "function": migration.name if migration is not None else None,
            "rows_to_move": sum(n for v, n in to_move.items() if v <= start),
            "rows_moved": sum(n for v, n in moved.items() if v <= start),
            "rows_failed": failed.get(start, 0),
        })
    return steps


def _report(tables: dict[str, dict[str, Any]], *, dry_run: bool, started: float) -> dict[str, Any]:
    return {
        "dry_run": dry_run,
        "tables": tables,
        "rows_to_move": sum(t["rows_to_move"] for t in tables.values()),
        "rows_moved": sum(t["rows_moved"] for t in tables.values()),
        "rows_failed": sum(t["rows_failed"] for t in tables.values()),
        "seconds": round(time.monotonic() - started, 3),
    }


# ---------------------------------------------------------------- migrating


def migrate(
    spark: SparkSession | Callable[[], SparkSession],
    url: str,
    config: IdemConfig,
    record_types: Sequence[str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    skip_failed: bool = False,
    lock_timeout_seconds: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Upgrade the old rows of the record types (default: all) in place; see the module doc.

    Args:
        spark: the session (classic or Spark Connect) whose executors upgrade and write, or a
            function returning it: called only when some table has rows to move (a run with
            nothing to do starts no Spark).
        url: PostgreSQL, reachable from every executor.
        config: the config (its catalog and chains are the current shape).
        record_types: the tables to migrate (``None``: every declared one).
        batch_rows: rows per transaction.
        skip_failed: count rows whose migration fails and leave them, instead of failing.
        lock_timeout_seconds: how long one batch (or the DDL) keeps retrying its locks.
        progress: called with a line per table (before and after).

    Returns:
        The report of :func:`plan_migration` with ``dry_run: False`` and the counts moved.

    Raises:
        MigrationFailed: a row's migration failed (without ``skip_failed``): names the key
            and the step. Batches committed before stay.
        MigrateLockTimeout: locks stayed taken past ``lock_timeout_seconds``.
        MigrateError: an executor failed otherwise (the error's one line).
        ConfigError: an unknown record type, a bad ``batch_rows``.
        MigrationChainError: a broken chain.
    """
    from idem_platform.pipeline.ingest import check_cluster_reach
    from idem_platform.spark.slots import task_slots

    if batch_rows < 1:
        raise ConfigError(f"batch rows must be at least 1 (got {batch_rows})")
    started = time.monotonic()
    chains = config.chains()
    session: SparkSession | None = None
    tables: dict[str, dict[str, Any]] = {}
    with connect(url, autocommit=True, application_name="idem-migrate") as conn:
        for record_type in selected_types(config, record_types):
            tables[record_type] = _count_entry(conn, chains, record_type, config.tables[record_type].schema_version)
    for record_type, entry in tables.items():
        if not entry["rows_to_move"]:
            entry["rows_left"] = 0
            if progress is not None and entry["exists"]:
                progress(f"idem.{record_type}: nothing below v{entry['current_version']}")
            continue
        table_started = time.monotonic()
        if progress is not None:
            versions = ", ".join(f"v{v}: {n:,}" for v, n in entry["rows_by_version"].items())
            below = f"{entry['rows_to_move']:,} rows below v{entry['current_version']}"
            progress(f"idem.{record_type}: {below} ({versions})")
        if session is None:
            session = spark() if callable(spark) else spark
            check_cluster_reach(_master(session), url)
        with connect(url, autocommit=True, application_name="idem-migrate") as conn:
            prepare_table(conn, config, record_type, lock_timeout_seconds)
        plan, _ = plan_read(url, config, record_type, parallelism=task_slots(session))
        task = MigrateTask.for_plan(plan, KEEP if skip_failed else RAISE, batch_rows, lock_timeout_seconds)
        outcome = _run(session, task)
        entry.update(outcome.summary(chains, record_type, entry))
        with connect(url, autocommit=True, application_name="idem-migrate") as conn:
            entry["rows_left"] = _rows_below(conn, record_type, entry["current_version"])
        entry["seconds"] = round(time.monotonic() - table_started, 3)
        if progress is not None:
            progress(
                f"idem.{record_type}: {entry['rows_moved']:,} rows moved to v{entry['current_version']} in "
                f"{entry['batches']:,} batch(es), {entry['rows_failed']:,} failed, {entry['rows_left']:,} left "
                f"below v{entry['current_version']} ({entry['seconds']:.1f} s, {plan.partitions} key range(s))"
            )
    return _report(tables, dry_run=False, started=started)


def _master(spark: SparkSession) -> str:
    try:
        return str(spark.conf.get("spark.master", "local[*]"))
    except Exception:  # noqa: BLE001 - a Spark Connect server keeps its master to itself
        return "local[*]"


def _rows_below(conn: psycopg.Connection, record_type: str, current: int) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE _schema_version < %s").format(table_ident(record_type)), [current]
    ).fetchone()
    return int(row[0]) if row else 0


def prepare_table(conn: psycopg.Connection, config: IdemConfig, record_type: str, timeout: float) -> None:
    """The table in the current catalog's shape, plus ``_payload_version``.

    Columns declared since the last ingest are added (an upgraded row fills them), in
    :func:`~idem_platform.postgres.tables.sync_tables`' lock order; ``_payload_version``
    (``integer``, nullable: no rewrite of the table) under the same order, the DDL
    advisory lock, the catalog row, then the table, in short tries: ``ALTER TABLE``
    waits for the table's readers, and readers arriving meanwhile wait behind it.
    """
    sync_tables(conn, {record_type: config.table_specs[record_type]})
    if PAYLOAD_VERSION in existing_columns(conn, record_type):
        return

    def add() -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        conn.execute(f"SELECT 1 FROM {SCHEMA}.catalog WHERE record_type = %s FOR UPDATE", [record_type])
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} integer").format(
                table_ident(record_type), sql.Identifier(PAYLOAD_VERSION)
            )
        )
        conn.execute(
            sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(
                table_ident(record_type),
                sql.Identifier(PAYLOAD_VERSION),
                sql.Literal(
                    "idem: the schema_version of _payload, when idem migrate moved the row past it "
                    "(null: _schema_version)"
                ),
            )
        )

    _with_lock_tries(conn, f"the catalog row and table of idem.{record_type}", timeout, add)


def _with_lock_tries(
    conn: psycopg.Connection, what: str, timeout: float, work: Callable[[], Any], *, undone: str = "nothing was changed"
) -> Any:
    """``work`` in a transaction whose lock waits end after :data:`LOCK_TRY_SECONDS`; on a
    lock timeout, a lost deadlock or a serialization failure, everything is rolled back
    (what it held is released, so the sessions it made wait go on), and tried again after
    a pause, until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, true)",
                    [f"{max(1, int(min(LOCK_TRY_SECONDS, timeout) * 1000))}ms"],
                )
                return work()
        except (
            psycopg.errors.LockNotAvailable,
            psycopg.errors.DeadlockDetected,
            psycopg.errors.SerializationFailure,
        ) as exc:
            if time.monotonic() >= deadline:
                raise MigrateLockTimeout(
                    f"waited {timeout:g} s for the locks on {what}: other sessions kept them (see pg_locks / "
                    f"pg_stat_activity); {undone}: run idem migrate again"
                ) from exc
            time.sleep(RETRY_PAUSE_SECONDS)


# ---------------------------------------------------------------- the executors' part


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
                f"idem.{plan.record_type} has no column {', '.join(missing)}: the table was not brought to the "
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
        from idem_platform.read.decode import read_rows
        from idem_platform.read.upgrade import upgrade_batch

        plan = self.read
        current = plan.current_version
        schema = plan.arrow_schema()
        write_schema = self.write_schema()
        failed: Counter[tuple[int, int | None]] = Counter()
        examples: list[tuple[int, int | None, str, str]] = []
        writer: _Writer | None = None
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
                    writer = writer or _Writer(self, write_schema)
                    batches += 1
                    yield self._commit(writer, head, index, batches)
                    pending, pending_rows = rest.to_batches(), rest.num_rows
            if pending_rows:
                writer = writer or _Writer(self, write_schema)
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

    def _commit(self, writer: _Writer, rows: pa.Table, index: int, number: int) -> pa.RecordBatch:
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


class _Writer:
    """One task's connection: batches COPYed into a temporary table, then moved by one
    guarded ``UPDATE``, one transaction per batch."""

    def __init__(self, task: MigrateTask, schema: pa.Schema) -> None:
        import pgpq
        import pgpq.encoders
        import pgpq.schema

        self.task = task
        self.schema = schema
        plan = task.read
        json_columns = {c.name for c in task.writes if c.kind == "json"}
        self.encoders = {
            field.name: pgpq.encoders.StringEncoderBuilder.new_with_output(field, pgpq.schema.Jsonb())
            if field.name in json_columns
            else pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(field)
            for field in schema
        }
        self._pgpq = pgpq
        temp = sql.Identifier(TEMP_TABLE)
        definitions = [
            sql.SQL('_idempotency_key text COLLATE "C" NOT NULL'),
            sql.SQL("{} integer NOT NULL").format(sql.Identifier(FROM_VERSION)),
        ] + [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(_PG_TYPES[c.kind])) for c in task.writes]
        self.conn = connect(plan.url, autocommit=True, application_name="idem-migrate")
        self.conn.execute(
            sql.SQL("CREATE TEMPORARY TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
                temp, sql.SQL(", ").join(definitions)
            )
        )
        self.copy = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(
            temp, sql.SQL(", ").join(sql.Identifier(name) for name in schema.names)
        )
        sets = [sql.SQL("{} = b.{}").format(sql.Identifier(c.name), sql.Identifier(c.name)) for c in task.writes]
        sets.append(sql.SQL("_schema_version = {}").format(sql.Literal(plan.current_version)))
        payload = sql.Identifier(PAYLOAD_VERSION)
        sets.append(sql.SQL("{} = coalesce(t.{}, t._schema_version)").format(payload, payload))
        self.update = sql.SQL(
            "WITH moved AS ("
            "UPDATE {table} AS t SET {sets} FROM {temp} AS b "
            "WHERE t._idempotency_key = b._idempotency_key AND t._schema_version < {current} "
            "AND coalesce(t.{payload}, t._schema_version) = b.{start} "
            "RETURNING b.{start}"
            ") SELECT {start}, count(*) FROM moved GROUP BY 1"
        ).format(
            table=table_ident(plan.record_type),
            sets=sql.SQL(", ").join(sets),
            temp=temp,
            current=sql.Literal(plan.current_version),
            payload=sql.Identifier(PAYLOAD_VERSION),
            start=sql.Identifier(FROM_VERSION),
        )

    def write(self, rows: pa.Table) -> dict[int, int]:
        """Move ``rows`` in one transaction (tried again on lock trouble); the rows moved per
        start version (rows moved already by someone else are not counted)."""
        pgpq = self._pgpq
        batches = rows.to_batches()
        plan = self.task.read

        def work() -> dict[int, int]:
            encoder = pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(self.schema, self.encoders)
            with self.conn.cursor() as cursor:
                with cursor.copy(self.copy) as copy:
                    copy.write(encoder.write_header())
                    for batch in batches:
                        copy.write(encoder.write_batch(batch))
                    copy.write(encoder.finish())
                return {int(v): int(n) for v, n in cursor.execute(self.update).fetchall()}

        try:
            return _with_lock_tries(
                self.conn, f"rows of idem.{plan.record_type}", self.task.lock_timeout_seconds, work,
                undone="that batch was rolled back, batches committed before stay",
            )
        except psycopg.DataError as exc:
            keys = rows.column("_idempotency_key")
            raise MigrateError(
                f"idem.{plan.record_type}: PostgreSQL refused the upgraded rows of the batch from key "
                f"{keys[0].as_py()} to {keys[len(keys) - 1].as_py()}: {str(exc).strip().splitlines()[0]}"
            ) from exc

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------- the driver's part


@dataclass
class _Outcome:
    moved: Counter[int]
    batches: int
    failed: Counter[int | None]
    failed_total: int
    examples: list[dict[str, Any]]

    def summary(self, chains: Chains, record_type: str, entry: dict[str, Any]) -> dict[str, Any]:
        current = int(entry["current_version"])
        to_move = Counter({int(v): int(n) for v, n in entry["rows_by_version"].items()})
        return {
            "steps": _steps(chains, record_type, current, to_move, self.moved, Counter(
                {step: count for step, count in self.failed.items() if step is not None}
            )),
            "rows_moved": sum(self.moved.values()),
            "rows_moved_by_version": {str(v): n for v, n in sorted(self.moved.items())},
            "rows_failed": self.failed_total,
            "failed_examples": self.examples,
            "batches": self.batches,
        }


def _run(spark: SparkSession, task: MigrateTask) -> _Outcome:
    """One Spark job: a task per key range; the driver only adds up what they report."""
    from idem_platform.read.table import migration_errors

    ranges = max(task.read.partitions, 1)
    frame = spark.range(0, ranges, 1, ranges).mapInArrow(task.run, OUTPUT_DDL)
    record_type = task.read.record_type
    try:
        with migration_errors():
            rows = frame.collect()
    except MigrationFailed as exc:
        raise MigrationFailed(
            f"{exc} (idem migrate of idem.{record_type} stopped; batches committed before stay migrated: fix the "
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
            f"idem migrate of idem.{record_type} failed on an executor: {name.rsplit('.', 1)[-1]}: {message} "
            "(batches committed before stay migrated; run idem migrate again)"
        ) from exc
    outcome = _Outcome(Counter(), 0, Counter(), 0, [])
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


# ---------------------------------------------------------------- for people


def human_report(report: dict[str, Any]) -> str:
    """A migrate's (or a dry run's) report for a person at a terminal."""
    dry = bool(report.get("dry_run"))
    verb = "would move" if dry else "moved"
    if dry:
        head = (
            f"idem migrate --dry-run: {report['rows_to_move']:,} rows would move to their current version "
            "(nothing written)"
        )
    else:
        head = (
            f"idem migrate: {report['rows_moved']:,} rows moved to their current version, "
            f"{report['rows_failed']:,} failed, in {float(report.get('seconds') or 0):.1f} s"
        )
    lines = [head]
    for record_type, entry in report["tables"].items():
        current = entry["current_version"]
        if not entry["exists"]:
            lines.append(f"  idem.{record_type}: no table yet")
            continue
        if not entry["rows_to_move"]:
            lines.append(f"  idem.{record_type}: nothing to migrate ({entry['rows_current']:,} rows at v{current})")
        else:
            versions = ", ".join(f"{n:,} at v{v}" for v, n in entry["rows_by_version"].items())
            done = "" if dry else (
                f"; {entry['rows_moved']:,} moved in {entry['batches']:,} batch(es), {entry['rows_failed']:,} failed, "
                f"{entry.get('rows_left', 0):,} left below v{current} ({float(entry['seconds']):.1f} s)"
            )
            lines.append(f"  idem.{record_type} (v{current}): {entry['rows_current']:,} current, {versions}{done}")
        for step in entry["steps"]:
            count = step["rows_to_move"] if dry else step["rows_moved"]
            failed = f", {step['rows_failed']:,} failed" if step["rows_failed"] else ""
            lines.append(f"    {step['step']} ({step['function']}): {count:,} {verb}{failed}")
        if entry["rows_newer"]:
            newer = f"{entry['rows_newer']:,} rows stored at a version newer than v{current}"
            lines.append(f"    {newer}: left as they are")
        for example in entry["failed_examples"]:
            lines.append(f"    failed: {example['_idempotency_key']}  {example['error']}")
    return "\n".join(lines)
