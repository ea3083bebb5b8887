"""The one applying transaction of a commit (DESIGN §5): see :mod:`idem_platform.write.apply`."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from idem_platform.effects.outbox import write_outbox
from idem_platform.faults import checkpoint
from idem_platform.postgres.current import CurrentCounts, fold_commit
from idem_platform.postgres.schema import SCHEMA, qualified_table_name
from idem_platform.postgres.tables import effective_spec, existing_columns, record_catalog
from idem_platform.write.apply.attempts import StagedAttempt, accepted_attempts, accepted_tables
from idem_platform.write.apply.claim import recheck_claim
from idem_platform.write.apply.evolution import Evolution, evolution_without_columns, extra_fields
from idem_platform.write.apply.locks import STREAM_CONFLICTS, lock_wait, set_lock_timeout
from idem_platform.write.apply.rejects import record_rejects, too_many_rejects
from idem_platform.write.apply.result import applied_result, record_applied
from idem_platform.write.apply.rows import TableInserts
from idem_platform.write.apply.units import rejected_by_unit, unit_counts
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import attempt_table, drop_staging, drop_tables, staged_ident


class ApplyTransaction:
    """The one applying transaction of a commit, fed each slice's accepted attempt.

    **Streaming.** As slices are staged, their rows are inserted into the target
    tables inside the one open transaction, so PostgreSQL's insert work overlaps
    the executors' work. No table lock is taken for it beyond the ``ROW
    EXCLUSIVE`` every ``INSERT`` holds, which blocks neither readers nor other
    writers: two connectors routing to one table stream side by side. Nothing is
    visible before :meth:`finish` commits.

    **Finishing** (:meth:`finish`) re-checks the claim (ledger rows ``FOR
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
    out). The transaction is rolled back and :meth:`finish` inserts every slice
    again from the staging tables (they live until COMMIT) with ``ON CONFLICT
    DO NOTHING``, which waits for the other writer and skips its keys.

    Use::

        with ApplyTransaction(conn, plan) as applying:
            for message in messages:
                applying.add(message)
            result = applying.finish()
    """

    def __init__(self, conn: psycopg.Connection, plan: CommitPlan) -> None:
        self.conn = conn
        self.plan = plan
        self.accepted: dict[int, StagedAttempt] = {}
        self.max_timestamps: dict[str, int] = {}  # unit id -> newest source timestamp read (ms)
        self.streaming = True  # until a conflict: then everything is inserted by finish
        self.conflict: str | None = None  # what ended streaming, for the result's timings
        self.insert_seconds = 0.0
        self.lock_seconds = 0.0
        self.fold_seconds: float | None = None  # upsert tables' current state, when the batch has any
        self._transaction: Any = None
        self.inserts = TableInserts(conn, plan)
        self.leftovers = False  # committed, but its staging tables could not be dropped on conn

    def __enter__(self) -> ApplyTransaction:
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
        """Open the transaction, tuned for one big anti-joined insert per staged table."""
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
            if not message.rows.get(record_type, 0) or record_type in self.inserts.deferred:
                continue
            stage = self._stage(record_type, message)
            evolution = Evolution()
            if self.plan.evolve and message.with_extra.get(record_type, 0):
                known = evolution_without_columns(self.conn, record_type, extra_fields(self.conn, stage))
                if known is None:
                    self.inserts.deferred.add(record_type)  # finish adds the columns, then inserts
                    continue
                evolution = known
            self.inserts.insert(record_type, stage, message, evolution, streaming=self.streaming)

    def _stop_streaming(self, exc: BaseException) -> None:
        """Roll back what streaming inserted; finish inserts it all again, conflict-safe."""
        self.streaming = False
        self.conflict = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        transaction, self._transaction = self._transaction, None
        if transaction is not None:
            transaction.__exit__(type(exc), exc, exc.__traceback__)
        self.inserts = TableInserts(self.conn, self.plan)  # what the rolled-back transaction inserted is gone

    def _apply_rest(self, chosen: list[StagedAttempt]) -> None:
        """Inside finish: re-check the claim, then per record type (in name order)
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
                if m.rows.get(record_type, 0) and (record_type, m.partition) not in self.inserts.inserted
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
            evolution = self.inserts.evolve(record_type, extra_keys) if extra_keys else Evolution()
            for stage, message in stages:
                self.inserts.insert(record_type, stage, message, evolution, streaming=self.streaming)
        for record_type in sorted(self.inserts.filled):
            spec = self.plan.tables[record_type]
            record_catalog(self.conn, effective_spec(spec, existing_columns(self.conn, record_type)))
        self.insert_seconds += time.monotonic() - started

    def _apply_rest_conflict_safe(self, chosen: list[StagedAttempt]) -> None:
        """:meth:`_apply_rest`; if streaming's inserts meet another writer's keys there,
        roll everything back and insert every slice again with ``ON CONFLICT DO NOTHING``."""
        try:
            self._apply_rest(chosen)
        except STREAM_CONFLICTS as exc:
            if not self.streaming:
                raise
            self._stop_streaming(exc)
            self._apply_rest(chosen)

    def finish(self) -> dict[str, Any]:
        """Apply what streaming left, check the batch, record everything, commit. Returns the commit's result.

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
            raise too_many_rejects(self.conn, plan, chosen, rejected, total)
        self._apply_rest_conflict_safe(chosen)
        current = self._fold_current(staged)
        checkpoint("before_apply")
        with lock_wait(plan, "the source's committed offsets"):
            moved = plan.step.apply(self.conn, plan.commit_id, self.max_timestamps) if plan.step is not None else {}
        rows_rejected = record_rejects(self.conn, plan, chosen, rejected)
        rows_written = sum(self.inserts.written.values())
        idempotent_skips = sum(staged.values()) - rows_written
        tables = self.inserts.tables(chosen, staged)
        for record_type, counts in current.items():
            tables.setdefault(record_type, {}).update(counts.as_dict())
        result = applied_result(
            plan,
            rows_written=rows_written,
            idempotent_skips=idempotent_skips,
            rows_rejected=rows_rejected,
            tables=tables,
            timings=self._timings(),
            units=self._unit_counts(chosen, (rows_written, idempotent_skips, rows_rejected)),
        )
        if tombstones := sum(a.tombstones for a in chosen):  # of rows_skipped: a Debezium feed's
            result["tombstones_skipped"] = tombstones
        valid_through = moved.pop("valid_through", None)
        result.update(moved)
        # The effects its written rows owe, and an upsert table's the changes of its current state owe.
        result.update(write_outbox(self.conn, plan, current))
        record_applied(
            self.conn, plan, result, counts=(rows_written, idempotent_skips, rows_rejected), valid_through=valid_through
        )
        return self._commit(chosen, result)

    def _fold_current(self, staged: dict[str, int]) -> dict[str, CurrentCounts]:
        """Fold the versions this commit wrote into each upsert table's current state, in
        this transaction (after every history insert: the batch's greatest version per
        identity is known), by record type in name order (the one lock order: a history
        table, then its state). Upsert tables this batch staged rows of only."""
        folded = {}
        started = time.monotonic()
        for record_type in sorted(self.plan.tables):
            spec = self.plan.tables[record_type]
            if spec.upsert is None or not staged.get(record_type):
                continue
            written = self.inserts.written[record_type]
            keep = any(rule.record_type == record_type for rule in self.plan.effects)  # inserted vs updated
            with lock_wait(self.plan, f"the current state of {qualified_table_name(record_type)}"):
                folded[record_type] = (
                    fold_commit(self.conn, spec, self.plan.commit_id, written, keep) if written else CurrentCounts()
                )
        if folded:
            self.fold_seconds = time.monotonic() - started
        return folded

    def _unit_counts(self, chosen: list[StagedAttempt], totals: tuple[int, int, int]) -> list[dict[str, Any]] | None:
        """Each unit's rows written, skipped and rejected (see :mod:`~idem_platform.write.apply.units`),
        or ``None`` when they were not counted or do not add up to ``totals`` (written,
        idempotent skips, rejected): a unit never shows a figure its batch contradicts."""
        counts = unit_counts(
            self.plan, chosen, self.inserts.written, self.inserts.written_by_prefix,
            rejected_by_unit(self.conn, self.plan, chosen),
        )
        if counts is None:
            return None
        added = tuple(sum(c[name] for c in counts) for name in ("rows_written", "rows_skipped", "rows_rejected"))
        return counts if added == totals else None

    def _timings(self) -> dict[str, Any]:
        """The result's ``timings`` so far (the caller adds its own)."""
        timings: dict[str, Any] = {
            "lock_wait_seconds": round(self.lock_seconds, 3),
            "insert_seconds": round(self.insert_seconds, 3),
        }
        if self.fold_seconds is not None:
            timings["current_state_seconds"] = round(self.fold_seconds, 3)
        if self.conflict:
            timings["streaming_stopped"] = self.conflict
        return timings

    def _commit(self, chosen: list[StagedAttempt], result: dict[str, Any]) -> dict[str, Any]:
        """Drop the accepted attempts' tables, COMMIT, then drop what is left of the
        commit's staging; ``result`` gains ``commit_seconds``. The crash points around
        COMMIT are where the tests kill the process."""
        # The accepted attempts' tables are finished (their writers closed before
        # reporting), so dropping them here cannot wait on anyone.
        drop_tables(self.conn, accepted_tables(self.plan, chosen))
        checkpoint("during_apply")
        finishing = time.monotonic()
        transaction, self._transaction = self._transaction, None
        transaction.__exit__(None, None, None)
        result["timings"]["commit_seconds"] = round(time.monotonic() - finishing, 3)
        checkpoint("after_apply")
        self.leftovers = not _drop_leftovers(self.conn, self.plan)
        return result


def _drop_leftovers(conn: psycopg.Connection, plan: CommitPlan) -> bool:
    """After COMMIT: drop the templates and the tables of attempts that were not applied;
    whether that went through.

    Best effort and never blocking: a zombie attempt may still be copying into
    its table (a lost executor's task, a speculative copy Spark has not killed
    yet), so the drop gives up after a short lock wait and the purge schedule
    drops whatever is left (tables of a committed commit go on its next run).
    A connection lost right after COMMIT fails it too: the caller then tries once
    more on a connection of its own (:attr:`ApplyTransaction.leftovers`).
    """
    try:
        drop_staging(conn, plan)
    except psycopg.Error:
        return False  # the commit is durable already: a leftover must not turn it into a failure
    return True


def apply_staged(conn: psycopg.Connection, plan: CommitPlan, messages: list[StagedAttempt | None]) -> dict[str, Any]:
    """Apply every accepted attempt at once (all messages already collected).

    Raises:
        RejectRatioExceeded: the batch is over ``max_reject_ratio``; nothing committed.
        ClaimLost: another run owns or committed the units; nothing committed.
        TransientError: a partition has no message; nothing committed.
    """
    chosen = accepted_attempts(plan, messages)
    with ApplyTransaction(conn, plan) as applying:
        for message in chosen:
            applying.add(message)
        return applying.finish()
