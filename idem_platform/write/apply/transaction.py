"""The one applying transaction of a commit (DESIGN §5): see :mod:`idem_platform.write.apply`."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from idem_platform.contract.catalog import STRING, Column
from idem_platform.errors import RejectRatioExceeded, TransientError
from idem_platform.faults import checkpoint
from idem_platform.ledger import Ledger
from idem_platform.postgres.schema import SCHEMA
from idem_platform.postgres.tables import (
    effective_spec,
    existing_columns,
    record_catalog,
    table_ident,
)
from idem_platform.write.apply.attempts import (
    StagedAttempt,
    accepted_attempts,
    accepted_tables,
    rejects_tables,
)
from idem_platform.write.apply.claim import recheck_claim
from idem_platform.write.apply.evolution import (
    MAX_NEW_COLUMNS,
    Evolution,
    extra_fields,
    props_reasons,
)
from idem_platform.write.apply.locks import (
    STREAM_CONFLICTS,
    add_column_politely,
    lock_wait,
    set_lock_timeout,
)
from idem_platform.write.apply.rejects import insert_rejects, reject_reasons
from idem_platform.write.apply.result import ledger_result, log_counts, record_commit, sources_of
from idem_platform.write.apply.rows import insert_rows
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import attempt_table, drop_staging, drop_tables, staged_ident


class Promotion:
    """The one promoting transaction of a commit, fed each slice's accepted attempt.

    **Streaming.** As slices are staged, their rows are inserted into the target
    tables inside the one open transaction, so PostgreSQL's insert work overlaps
    the executors' work. No table lock is taken for it beyond the ``ROW
    EXCLUSIVE`` every ``INSERT`` holds, which blocks neither readers nor other
    writers: two connectors routing to one table stream side by side. Nothing is
    visible before :meth:`finish` commits.

    **The promote** (:meth:`finish`) re-checks the claim (ledger rows ``FOR
    UPDATE``), adds the columns new fields need (``ALTER TABLE`` in short tries:
    the only lock that makes readers wait, held from there to COMMIT), inserts
    what streaming left (a record type stops streaming at the first slice that
    needs a new column, so the earliest slice still wins a repeated key), records
    everything and commits. Strong locks are taken in one order everywhere
    (:mod:`idem_platform.postgres.tables` follows it too): ledger rows by key,
    catalog rows by record type, tables by name, then the source's rows (Kafka
    offsets). Every
    wait is bounded by ``plan.lock_timeout_seconds`` and ends in a
    :class:`LockTimeout` (transient: the sensor retries).

    **Conflicts.** Another writer may hold or commit one of our keys meanwhile:
    streaming then gets a unique violation (or a deadlock, or a lock wait runs
    out). The transaction is rolled back and the promote inserts every slice
    again from the staging tables (they live until COMMIT) with ``ON CONFLICT
    DO NOTHING``, which waits for the other writer and skips its keys.

    Use::

        with Promotion(conn, plan) as promotion:
            for message in messages:
                promotion.add(message)
            result = promotion.finish()
    """

    def __init__(self, conn: psycopg.Connection, plan: CommitPlan) -> None:
        self.conn = conn
        self.plan = plan
        self.accepted: dict[int, StagedAttempt] = {}
        self.max_timestamps: dict[str, int] = {}  # unit id -> newest source timestamp read (ms)
        self.streaming = True  # until a conflict: then everything is inserted at the promote
        self.conflict: str | None = None  # what ended streaming, for the result's timings
        self.insert_seconds = 0.0
        self.lock_seconds = 0.0
        self._transaction: Any = None
        self._reset()

    def _reset(self) -> None:
        """Forget what was inserted (the transaction that held it rolled back)."""
        self.written = dict.fromkeys(self.plan.tables, 0)
        self.added: dict[str, list[str]] = {rt: [] for rt in self.plan.tables}
        self.to_props: dict[str, list[str]] = {rt: [] for rt in self.plan.tables}
        self.props_reasons: dict[str, dict[str, str]] = {rt: {} for rt in self.plan.tables}
        self.budget = MAX_NEW_COLUMNS
        self.inserted: set[tuple[str, int]] = set()  # (record type, partition) already inserted
        self.deferred: set[str] = set()  # record types left to the promote (a new column is needed)
        self.filled: set[str] = set()  # record types whose evolved columns got values
        # Per record type, its promoted text columns, read once its table is locked in
        # this transaction (an ``idem promote`` cannot add a companion column after that).
        self.promotions: dict[str, dict[str, Column]] = {}

    def __enter__(self) -> Promotion:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._transaction is not None:
            transaction, self._transaction = self._transaction, None
            transaction.__exit__(*exc)

    def add(self, message: StagedAttempt) -> None:
        """Take one slice's accepted attempt (the first report of each slice wins) and
        stream its rows into the target tables."""
        if message.partition in self.accepted:
            return  # a second report of a partition (speculation): its rows are not ours
        self.accepted[message.partition] = message
        for index, stamp in message.max_timestamps.items():
            unit = self.plan.units[index].id
            self.max_timestamps[unit] = max(stamp, self.max_timestamps.get(unit, stamp))
        if not self.streaming:
            return
        started = time.monotonic()
        try:
            self._stream(message)
        except STREAM_CONFLICTS as exc:
            self._stop_streaming(exc)
        self.insert_seconds += time.monotonic() - started

    @property
    def records_staged(self) -> int:
        """Records the accepted attempts staged so far (for progress lines)."""
        return sum(sum(m.rows.values()) + sum(m.repeats.values()) + sum(m.known.values()) for m in self.accepted.values())

    def _begin(self) -> None:
        self._transaction = self.conn.transaction()
        self._transaction.__enter__()
        # The first-occurrence sort of a slice's wide rows fits in memory at this size.
        self.conn.execute("SET LOCAL work_mem = '256MB'")
        # Probe the primary key for each staged key (a nested-loop anti-join):
        # cost grows with the batch, never with the size of the table.
        self.conn.execute("SET LOCAL enable_hashjoin = off")
        self.conn.execute("SET LOCAL enable_mergejoin = off")
        set_lock_timeout(self.conn, self.plan.lock_timeout_seconds)

    def _stage(self, record_type: str, message: StagedAttempt) -> sql.Composed:
        return staged_ident(attempt_table(self.plan.staging_table(record_type), message.attempt))

    def _stream(self, message: StagedAttempt) -> None:
        if self._transaction is None:
            self._begin()
        for record_type in sorted(self.plan.tables):
            if not message.rows.get(record_type, 0) or record_type in self.deferred:
                continue
            stage = self._stage(record_type, message)
            evolution = Evolution()
            if self.plan.evolve and message.with_extra.get(record_type, 0):
                known = self._evolution_without_columns(record_type, extra_fields(self.conn, stage))
                if known is None:
                    self.deferred.add(record_type)  # the promote adds the columns, then inserts
                    continue
                evolution = known
            self._insert(record_type, stage, message, evolution)

    def _stop_streaming(self, exc: BaseException) -> None:
        """Roll back what streaming inserted; the promote inserts it all again, conflict-safe."""
        self.streaming = False
        self.conflict = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        transaction, self._transaction = self._transaction, None
        if transaction is not None:
            transaction.__exit__(type(exc), exc, exc.__traceback__)
        self._reset()

    def _promoted(self, record_type: str) -> dict[str, Column]:
        """The table's promoted text columns (``idem promote``), read under its lock.

        The first insert of a transaction into a table takes the ``ROW EXCLUSIVE``
        lock its INSERT would take anyway, then reads the columns: a promotion's
        ``ALTER TABLE`` committed before is seen, and none can commit after it until
        this transaction ends. So no row of this commit misses its typed value, and
        the promotion's backfill sees every row committed before its column was.
        """
        found = self.promotions.get(record_type)
        if found is None:
            self.conn.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(table_ident(record_type)))
            spec = effective_spec(self.plan.tables[record_type], existing_columns(self.conn, record_type))
            found = self.promotions[record_type] = {c.name: c for c in spec.promoted_columns()}
        return found

    def _insert(self, record_type: str, stage: sql.Composed, message: StagedAttempt, evolution: Evolution) -> None:
        with lock_wait(self.plan, f"table idem.{record_type}", streaming=self.streaming):
            promoted = self._promoted(record_type)
            self.written[record_type] += insert_rows(
                self.conn,
                self.plan,
                record_type,
                self.plan.tables[record_type],
                stage,
                evolution,
                unique_keys=message.unique_keys,
                on_conflict=not self.streaming,
                promoted=promoted,
            )
        self.inserted.add((record_type, message.partition))
        if evolution.fill:
            self.filled.add(record_type)
        for key in evolution.to_props:
            if key not in self.to_props[record_type]:
                self.to_props[record_type].append(key)
        self.props_reasons[record_type].update(evolution.reasons)

    def _evolution_without_columns(self, record_type: str, keys: list[str]) -> Evolution | None:
        """Where unknown fields go when no column has to be added; ``None`` if one has."""
        result = Evolution()
        columns = existing_columns(self.conn, record_type)
        for key in keys:
            type_ = columns.get(key)
            if type_ is None:
                return None
            if type_ == STRING.postgres:
                result.fill.append(key)
            else:
                result.to_props.append(key)
                result.reasons[key] = f"idem.{record_type} has a {type_} column of that name, not text"
        return result

    def _evolve(self, record_type: str, keys: list[str]) -> Evolution:
        """What each unknown field becomes: a text column (added now, within the budget) or ``props``."""
        result = Evolution()
        columns = existing_columns(self.conn, record_type)
        for key in keys:
            type_ = columns.get(key)
            if type_ == STRING.postgres:
                result.fill.append(key)
            elif type_ is None and self.budget > 0:
                add_column_politely(self.conn, self.plan, record_type, Column(key, STRING, evolved=True))
                self.budget -= 1
                self.added[record_type].append(key)
                result.fill.append(key)
            else:
                result.to_props.append(key)
                result.reasons[key] = (
                    f"idem.{record_type} has a {type_} column of that name, not text"
                    if type_ is not None
                    else f"over the {MAX_NEW_COLUMNS} new columns one batch may add"
                )
        return result

    def _promote_rest(self, chosen: list[StagedAttempt]) -> None:
        """Inside the promote: re-check the claim, then per record type (in name order)
        add the columns its remaining slices need and insert them in slice order."""
        if self._transaction is None:
            self._begin()
        waited = time.monotonic()
        with lock_wait(self.plan, "the batch's ledger rows"):
            recheck_claim(self.conn, self.plan)
        self.lock_seconds = time.monotonic() - waited
        started = time.monotonic()
        work: dict[str, tuple[list[tuple[sql.Composed, StagedAttempt]], list[str]]] = {}
        for record_type in sorted(self.plan.tables):
            stages = [
                (self._stage(record_type, m), m)
                for m in chosen
                if m.rows.get(record_type, 0) and (record_type, m.partition) not in self.inserted
            ]
            keys: dict[str, None] = {}
            if self.plan.evolve:
                for stage, message in stages:
                    if message.with_extra.get(record_type, 0):
                        keys.update(dict.fromkeys(extra_fields(self.conn, stage)))
            if stages:
                work[record_type] = (stages, list(keys))
        # The one lock order: catalog rows, then tables, each by name. The catalog rows
        # of the record types that may change are locked before any ALTER TABLE.
        evolving = sorted(rt for rt, (_, keys) in work.items() if keys)
        if evolving:
            with lock_wait(self.plan, "the catalog rows of " + ", ".join(evolving)):
                self.conn.execute(
                    f"SELECT 1 FROM {SCHEMA}.catalog WHERE record_type = ANY(%s) ORDER BY record_type FOR UPDATE",
                    [evolving],
                )
        for record_type, (stages, extra_keys) in work.items():
            evolution = self._evolve(record_type, extra_keys) if extra_keys else Evolution()
            for stage, message in stages:
                self._insert(record_type, stage, message, evolution)
        for record_type in sorted(self.filled):
            spec = self.plan.tables[record_type]
            record_catalog(self.conn, effective_spec(spec, existing_columns(self.conn, record_type)))
        self.insert_seconds += time.monotonic() - started

    def finish(self) -> dict[str, Any]:
        """Promote, check the batch, record everything, commit. Returns the commit's result.

        Raises:
            TransientError: a partition never reported (nothing is committed).
            ClaimLost: another run owns or committed the units (nothing is committed).
            LockTimeout: a lock stayed held by another session past ``lock_timeout_seconds``.
            RejectRatioExceeded: the batch is over ``max_reject_ratio``.
        """
        plan = self.plan
        chosen = accepted_attempts(plan, list(self.accepted.values()))
        rejected = sum(a.rejected for a in chosen)
        staged = {rt: sum(a.rows.get(rt, 0) + a.repeats.get(rt, 0) + a.known.get(rt, 0) for a in chosen) for rt in plan.tables}
        total = sum(staged.values()) + rejected
        if total and rejected / total > plan.max_reject_ratio:
            if self._transaction is None:
                self._begin()
            reasons = reject_reasons(self.conn, plan, chosen)
            raise RejectRatioExceeded(
                f"{rejected} of {total} records rejected ({rejected / total:.1%}), above "
                f"max_reject_ratio {plan.max_reject_ratio}; nothing was committed. First reasons: "
                + " | ".join(reasons),
                rejected=rejected,
                total=total,
                reasons=reasons,
            )
        try:
            self._promote_rest(chosen)
        except STREAM_CONFLICTS as exc:
            if not self.streaming:
                raise
            self._stop_streaming(exc)
            self._promote_rest(chosen)
        checkpoint("before_promote")
        with lock_wait(plan, "the source's committed offsets"):
            moved = plan.step.apply(self.conn, plan.commit_id, self.max_timestamps) if plan.step is not None else {}
        # A step that keeps the rejects itself (the quarantine's retry updates the rejects it
        # read instead of adding rows) is handed the accepted attempts' reject tables.
        record_rejects = getattr(plan.step, "record_rejects", None)
        if record_rejects is not None:
            rows_rejected = record_rejects(self.conn, plan, rejects_tables(plan, chosen))
        else:
            rows_rejected = insert_rejects(self.conn, plan, chosen) if rejected else 0
        if rows_rejected != rejected:
            raise TransientError(f"staged {rejected} rejects but promoted {rows_rejected}; nothing was committed")
        tables = {
            rt: {
                "written": self.written[rt],
                "skipped": staged[rt] - self.written[rt],
                "new_columns": self.added[rt],
                "to_props": self.to_props[rt],
                "props_fields": props_reasons(rt, chosen, self.props_reasons[rt]),
            }
            for rt in sorted(plan.tables)
            if staged[rt]
        }
        rows_written = sum(self.written.values())
        idempotent_skips = sum(staged.values()) - rows_written
        timings: dict[str, Any] = {
            "lock_wait_seconds": round(self.lock_seconds, 3),
            "insert_seconds": round(self.insert_seconds, 3),
        }
        if self.conflict:
            timings["streaming_stopped"] = self.conflict
        result = {
            "commit_id": plan.commit_id,
            "connector": plan.connector,
            "run_id": plan.run_id,
            "rows_written": rows_written,
            "rows_skipped": idempotent_skips + plan.replayed_records,
            "rows_rejected": rows_rejected,
            "replayed": False,
            **({"replay_skipped": plan.replayed_records} if plan.replayed_records else {}),
            **sources_of(plan.sources()),
            "tables": tables,
            "schema_versions": {rt: plan.tables[rt].schema_version for rt in sorted(plan.tables)},
            "timings": timings,
        }
        valid_through = moved.pop("valid_through", None)
        result.update(moved)
        record_commit(self.conn, plan, result, replay=False, valid_through=valid_through)
        log_counts(self.conn, plan.commit_id, rows_written, idempotent_skips, rows_rejected, replay=plan.replay,
             replay_skipped=plan.replayed_records)
        ledger = Ledger(self.conn, plan.connector, replay_window=timedelta(seconds=plan.replay_window_seconds))
        keys = plan.ledger_keys()
        for key in keys:
            ledger.commit(key, ledger_result(result, key, len(keys)), owner=plan.owner)
        # The accepted attempts' tables are finished (their writers closed before
        # reporting), so dropping them here cannot wait on anyone.
        drop_tables(self.conn, accepted_tables(plan, chosen))
        checkpoint("during_promote")
        finishing = time.monotonic()
        transaction, self._transaction = self._transaction, None
        transaction.__exit__(None, None, None)
        result["timings"]["commit_seconds"] = round(time.monotonic() - finishing, 3)
        checkpoint("after_promote")
        _drop_leftovers(self.conn, plan)
        return result


def _drop_leftovers(conn: psycopg.Connection, plan: CommitPlan) -> None:
    """After COMMIT: drop the templates and the tables of attempts that were not promoted.

    Best effort and never blocking: a zombie attempt may still be copying into
    its table (a lost executor's task, a speculative copy Spark has not killed
    yet), so the drop gives up after a short lock wait and the purge schedule
    drops whatever is left (tables of a committed commit go on its next run).
    """
    try:
        drop_staging(conn, plan)
    except psycopg.Error:
        pass  # the commit is durable already: a leftover must not turn it into a failure


def promote(conn: psycopg.Connection, plan: CommitPlan, messages: list[StagedAttempt | None]) -> dict[str, Any]:
    """Promote every accepted attempt at once (all messages already collected).

    Raises:
        RejectRatioExceeded: the batch is over ``max_reject_ratio``; nothing committed.
        ClaimLost: another run owns or committed the units; nothing committed.
        TransientError: a partition has no message; nothing committed.
    """
    chosen = accepted_attempts(plan, messages)
    with Promotion(conn, plan) as promotion:
        for message in chosen:
            promotion.add(message)
        return promotion.finish()
