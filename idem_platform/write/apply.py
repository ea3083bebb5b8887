"""The one promoting transaction of a commit (DESIGN §5).

Opened on the driver when the first slice is staged, it streams each slice's
accepted attempt into the target tables while later slices are still being
staged, holding no table lock beyond the ``ROW EXCLUSIVE`` of any ``INSERT``
(readers and other writers go on). The promote, once every slice is staged:

1. re-checks the ledger rows of the batch's units under ``FOR UPDATE`` (still
   ``in_progress`` and owned by this commit, or nothing is promoted);
2. per record type, widens the table for new fields (the only lock readers
   wait for) and inserts what streaming left, first occurrence per key,
   skipping keys already present;
3. runs the source's commit step (the Kafka offsets' compare-and-set: if
   another run moved them, nothing commits), then records rejects, the
   execution log, the ``commits`` row and the ledger results;
4. drops the staging tables.

A crash before COMMIT leaves nothing visible; a retry after COMMIT finds the
ledger committed and replays. The insert is a single write into the target:
an anti-join excludes committed keys, so no ``ON CONFLICT`` speculative
insertion is paid per row, unless another writer's keys collided with ours
(see :class:`Promotion`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from idem_platform.coercion.records import LINE_BITS, LINE_MASK
from idem_platform.contract.catalog import STRING, Column, TableSpec, column_name_problem
from idem_platform.errors import RejectRatioExceeded, TransientError
from idem_platform.faults import checkpoint
from idem_platform.ledger import Ledger
from idem_platform.postgres.retype import promote_cast
from idem_platform.postgres.schema import SCHEMA
from idem_platform.postgres.tables import (
    add_column,
    effective_spec,
    existing_columns,
    record_catalog,
    table_ident,
)
from idem_platform.write.plan import CommitPlan
from idem_platform.write.staging import attempt_table, drop_staging, drop_tables, staged_ident

MAX_NEW_COLUMNS = 32


@dataclass(frozen=True)
class StagedAttempt:
    """What one task attempt staged, as reported by its commit message."""

    partition: int
    attempt: str
    rows: dict[str, int] = field(default_factory=dict)
    with_extra: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    repeats: dict[str, int] = field(default_factory=dict)  # repeats counted, not staged
    known: dict[str, int] = field(default_factory=dict)  # keys the table already held: counted as skips, not staged
    unique_keys: bool = False  # the attempt staged no key twice (no DISTINCT ON needed)
    max_timestamps: dict[int, int] = field(default_factory=dict)  # unit index -> newest source timestamp (ms)
    props_fields: dict[str, list[str]] = field(default_factory=dict)  # record type -> fields coercion put in props


class ClaimLost(TransientError):
    """The units' ledger rows are no longer this commit's (another run took them)."""


def accepted_attempts(plan: CommitPlan, messages: list[StagedAttempt | None]) -> list[StagedAttempt]:
    """One attempt per input partition: the one whose message reached the driver first.

    Raises:
        TransientError: a partition has no message (its rows would be lost).
    """
    chosen: dict[int, StagedAttempt] = {}
    for message in messages:
        if message is not None and message.partition not in chosen:
            chosen[message.partition] = message
    missing = set(range(plan.input_partitions)) - set(chosen)
    if missing:
        raise TransientError(
            f"commit messages cover {len(chosen)} of {plan.input_partitions} partitions "
            f"(missing {sorted(missing)[:5]}); nothing was committed"
        )
    return [chosen[p] for p in sorted(chosen)]


def _rejects_tables(plan: CommitPlan, chosen: list[StagedAttempt]) -> list[sql.Composed]:
    """The accepted attempts' reject tables (an attempt with no reject created none)."""
    return [staged_ident(attempt_table(plan.rejects_table, a.attempt)) for a in chosen if a.rejected]


def _reject_reasons(conn: psycopg.Connection, plan: CommitPlan, chosen: list[StagedAttempt], limit: int = 5) -> list[str]:
    tables = _rejects_tables(plan, chosen)
    if not tables:
        return []
    union = sql.SQL(" UNION ALL ").join(sql.SQL("SELECT _pos, _errors FROM {}").format(t) for t in tables)
    rows = conn.execute(
        sql.SQL("SELECT _pos, _errors FROM ({}) r ORDER BY _pos LIMIT %s").format(union), [limit]
    ).fetchall()
    reasons = []
    for pos, errors in rows:
        unit = plan.units[pos >> LINE_BITS]
        messages = "; ".join(e["message"] for e in errors)
        reasons.append(f"{unit.locate(unit.base + (pos & LINE_MASK))}: {messages}")
    return reasons


def _claim(conn: psycopg.Connection, plan: CommitPlan) -> None:
    rows = conn.execute(
        f"SELECT key, status, owner FROM {SCHEMA}.ingest_ledger "
        "WHERE namespace = %s AND key = ANY(%s) ORDER BY key FOR UPDATE",
        [plan.connector, plan.ledger_keys()],
    ).fetchall()
    found = {key: (status, owner) for key, status, owner in rows}
    for unit in {u.key: u for u in plan.units}.values():
        status, owner = found.get(unit.key, (None, None))
        if status != "in_progress" or owner != plan.owner:
            raise ClaimLost(
                f"{unit.label} ({unit.key}) is {status or 'not in the ledger'}"
                f"{f' (owner {owner})' if owner and owner != plan.owner else ''}; "
                "this commit no longer owns it, nothing was committed"
            )


def _extra_keys(conn: psycopg.Connection, stage: sql.Composed) -> list[str]:
    rows = conn.execute(
        sql.SQL(
            "SELECT k FROM {} s, jsonb_object_keys(s._extra) k "
            "WHERE s._extra IS NOT NULL GROUP BY k ORDER BY min(s._pos), k"
        ).format(stage),
    ).fetchall()
    return [row[0] for row in rows]


@dataclass
class _Evolution:
    fill: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    to_props: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # why each of to_props is not a column


def _insert_rows(
    conn: psycopg.Connection,
    plan: CommitPlan,
    record_type: str,
    spec: TableSpec,
    stage: sql.Composed,
    evolution: _Evolution,
    *,
    unique_keys: bool = False,
    on_conflict: bool = False,
    promoted: dict[str, Column] | None = None,
) -> int:
    typed = [c.name for c in spec.columns]
    # Promoted text columns (idem promote): their typed companions, filled from the
    # same text by the safe cast the backfill uses (NULL when it does not cast).
    promoted = promoted or {}
    companions = [c for c in typed + evolution.fill if c in promoted]
    target = [
        "_idempotency_key", "_connector", "_record_type", "_external_id", "_content_hash",
        "_schema_version", "_commit_id", "_ingested_at", "_source", "_payload",
    ] + typed + evolution.fill + ["props"] + ([plan.meta_column] if plan.meta_column else [])
    target += [str(promoted[c].typed_column) for c in companions]
    props = sql.SQL("s._props")
    if evolution.to_props:
        props = sql.SQL(
            "CASE WHEN s._extra ?| %(overcap)s THEN coalesce(s._props, '{}'::jsonb) || "
            "(SELECT jsonb_object_agg(k, coalesce(s._upgraded, s._payload) -> k) FROM jsonb_object_keys(s._extra) k "
            "WHERE k = ANY(%(overcap)s)) ELSE s._props END"
        )
    select: list[sql.Composable] = [
        # A record older than its table keeps its own version (_version) and its payload as
        # received; its typed values are those of the record upgraded by the migrations.
        sql.SQL("s._idempotency_key, %(connector)s, %(record_type)s, s._external_id, s._content_hash, "
                "coalesce(s._version, %(version)s), %(commit_id)s::uuid, now(), s._source, s._payload")
    ]
    select += [
        sql.SQL("NULLIF(coalesce(s._upgraded, s._payload) -> {}, 'null'::jsonb)").format(sql.Literal(c.name))
        if c.type.kind == "dynamic"
        else sql.SQL("s.{}").format(sql.Identifier(c.name))
        for c in spec.columns
    ]
    select += [sql.SQL("s._extra ->> {}").format(sql.Literal(name)) for name in evolution.fill]
    select.append(props)
    if plan.meta_column:
        select.append(sql.SQL("s._meta"))
    fills = set(evolution.fill) - set(typed)
    select += [
        sql.SQL("{}({})").format(
            promote_cast(promoted[c]),
            sql.SQL("s._extra ->> {}").format(sql.Literal(c)) if c in fills else sql.SQL("s.{}").format(sql.Identifier(c)),
        )
        for c in companions
    ]
    # First occurrence per key wins. An attempt whose executor vouched for distinct
    # keys needs no sort of its wide rows; the anti-join alone skips keys already
    # in the table (committed, or promoted from an earlier slice of this commit).
    first_per_key = sql.SQL("") if unique_keys else sql.SQL(" ORDER BY s._idempotency_key, s._pos")
    statement = sql.SQL(
        "INSERT INTO {target} ({columns}) "
        "SELECT {distinct}{select} FROM {stage} s "
        "WHERE NOT EXISTS "
        "(SELECT 1 FROM {target} t WHERE t._idempotency_key = s._idempotency_key)"
        "{order}{conflict}"
    ).format(
        # Another writer's keys, committed after this statement's snapshot or not yet
        # committed: wait for it and skip them (only after streaming met a conflict).
        conflict=sql.SQL(" ON CONFLICT (_idempotency_key) DO NOTHING") if on_conflict else sql.SQL(""),
        distinct=sql.SQL("") if unique_keys else sql.SQL("DISTINCT ON (s._idempotency_key) "),
        order=first_per_key,
        target=table_ident(record_type),
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in target),
        select=sql.SQL(", ").join(select),
        stage=stage,
    )
    params = {
        "connector": plan.connector,
        "record_type": record_type,
        "version": spec.schema_version,
        "commit_id": plan.commit_id,
        "overcap": evolution.to_props,
    }
    return conn.execute(statement, params).rowcount


def _props_reasons(record_type: str, chosen: list[StagedAttempt], evolution: dict[str, str]) -> dict[str, str]:
    """Every field that went to ``props`` in this commit's rows of ``record_type``, with why:
    a name that cannot be a column (decided by coercion), or one evolution could not add."""
    reasons = {
        name: column_name_problem(name) or "not a column of this record type"
        for message in chosen
        for name in message.props_fields.get(record_type, ())
    }
    reasons.update(evolution)
    return dict(sorted(reasons.items()))


def _insert_rejects(conn: psycopg.Connection, plan: CommitPlan, chosen: list[StagedAttempt]) -> int:
    """Promote the accepted attempts' rejects, in slice order."""
    return sum(_insert_attempt_rejects(conn, plan, table) for table in _rejects_tables(plan, chosen))


def _insert_attempt_rejects(conn: psycopg.Connection, plan: CommitPlan, stage: sql.Composed) -> int:
    # source: the unit's ledger key; position: as staged; line: the record's
    # offset in its unit (a file's line number, a message's offset).
    statement = sql.SQL(
        "INSERT INTO {rejects} (commit_id, connector, source, position, line, raw, raw_length, reasons, context) "
        "SELECT %(commit_id)s::uuid, %(connector)s, f.key, r._source, f.base + (r._pos & {mask}), "
        "r._raw, r._raw_length, r._errors, r._meta "
        "FROM {stage} r JOIN unnest(%(idx)s::int[], %(keys)s::text[], %(bases)s::bigint[]) "
        "AS f(idx, key, base) ON f.idx = (r._pos >> {bits}) "
        "ORDER BY r._pos"
    ).format(
        rejects=sql.SQL(f"{SCHEMA}.rejects"),
        mask=sql.Literal(LINE_MASK),
        bits=sql.Literal(LINE_BITS),
        stage=stage,
    )
    params = {
        "commit_id": plan.commit_id,
        "connector": plan.connector,
        "idx": list(range(len(plan.units))),
        "keys": [unit.key for unit in plan.units],
        "bases": [unit.base for unit in plan.units],
    }
    return conn.execute(statement, params).rowcount


# What ends streaming: another writer committed one of our keys first (unique
# violation), two writers wait on each other's keys, or a lock wait ran out.
_STREAM_CONFLICTS = (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable)


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
        except _STREAM_CONFLICTS as exc:
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
        _set_lock_timeout(self.conn, self.plan.lock_timeout_seconds)

    def _stage(self, record_type: str, message: StagedAttempt) -> sql.Composed:
        return staged_ident(attempt_table(self.plan.staging_table(record_type), message.attempt))

    def _stream(self, message: StagedAttempt) -> None:
        if self._transaction is None:
            self._begin()
        for record_type in sorted(self.plan.tables):
            if not message.rows.get(record_type, 0) or record_type in self.deferred:
                continue
            stage = self._stage(record_type, message)
            evolution = _Evolution()
            if self.plan.evolve and message.with_extra.get(record_type, 0):
                known = self._evolution_without_columns(record_type, _extra_keys(self.conn, stage))
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

    def _insert(self, record_type: str, stage: sql.Composed, message: StagedAttempt, evolution: _Evolution) -> None:
        with _lock_wait(self.plan, f"table idem.{record_type}", streaming=self.streaming):
            promoted = self._promoted(record_type)
            self.written[record_type] += _insert_rows(
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

    def _evolution_without_columns(self, record_type: str, keys: list[str]) -> _Evolution | None:
        """Where unknown fields go when no column has to be added; ``None`` if one has."""
        result = _Evolution()
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

    def _evolve(self, record_type: str, keys: list[str]) -> _Evolution:
        """What each unknown field becomes: a text column (added now, within the budget) or ``props``."""
        result = _Evolution()
        columns = existing_columns(self.conn, record_type)
        for key in keys:
            type_ = columns.get(key)
            if type_ == STRING.postgres:
                result.fill.append(key)
            elif type_ is None and self.budget > 0:
                _add_column_politely(self.conn, self.plan, record_type, Column(key, STRING, evolved=True))
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
        with _lock_wait(self.plan, "the batch's ledger rows"):
            _claim(self.conn, self.plan)
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
                        keys.update(dict.fromkeys(_extra_keys(self.conn, stage)))
            if stages:
                work[record_type] = (stages, list(keys))
        # The one lock order: catalog rows, then tables, each by name. The catalog rows
        # of the record types that may change are locked before any ALTER TABLE.
        evolving = sorted(rt for rt, (_, keys) in work.items() if keys)
        if evolving:
            with _lock_wait(self.plan, "the catalog rows of " + ", ".join(evolving)):
                self.conn.execute(
                    f"SELECT 1 FROM {SCHEMA}.catalog WHERE record_type = ANY(%s) ORDER BY record_type FOR UPDATE",
                    [evolving],
                )
        for record_type, (stages, extra_keys) in work.items():
            evolution = self._evolve(record_type, extra_keys) if extra_keys else _Evolution()
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
            reasons = _reject_reasons(self.conn, plan, chosen)
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
        except _STREAM_CONFLICTS as exc:
            if not self.streaming:
                raise
            self._stop_streaming(exc)
            self._promote_rest(chosen)
        checkpoint("before_promote")
        with _lock_wait(plan, "the source's committed offsets"):
            moved = plan.step.apply(self.conn, plan.commit_id, self.max_timestamps) if plan.step is not None else {}
        # A step that keeps the rejects itself (the quarantine's retry updates the rejects it
        # read instead of adding rows) is handed the accepted attempts' reject tables.
        record_rejects = getattr(plan.step, "record_rejects", None)
        if record_rejects is not None:
            rows_rejected = record_rejects(self.conn, plan, _rejects_tables(plan, chosen))
        else:
            rows_rejected = _insert_rejects(self.conn, plan, chosen) if rejected else 0
        if rows_rejected != rejected:
            raise TransientError(f"staged {rejected} rejects but promoted {rows_rejected}; nothing was committed")
        tables = {
            rt: {
                "written": self.written[rt],
                "skipped": staged[rt] - self.written[rt],
                "new_columns": self.added[rt],
                "to_props": self.to_props[rt],
                "props_fields": _props_reasons(rt, chosen, self.props_reasons[rt]),
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
        _record_commit(self.conn, plan, result, replay=False, valid_through=valid_through)
        _log(self.conn, plan.commit_id, rows_written, idempotent_skips, rows_rejected, replay=plan.replay,
             replay_skipped=plan.replayed_records)
        ledger = Ledger(self.conn, plan.connector, replay_window=timedelta(seconds=plan.replay_window_seconds))
        keys = plan.ledger_keys()
        for key in keys:
            ledger.commit(key, ledger_result(result, key, len(keys)), owner=plan.owner)
        # The accepted attempts' tables are finished (their writers closed before
        # reporting), so dropping them here cannot wait on anyone.
        drop_tables(self.conn, _promoted_tables(plan, chosen))
        checkpoint("during_promote")
        finishing = time.monotonic()
        transaction, self._transaction = self._transaction, None
        transaction.__exit__(None, None, None)
        result["timings"]["commit_seconds"] = round(time.monotonic() - finishing, 3)
        checkpoint("after_promote")
        _drop_leftovers(self.conn, plan)
        return result


class LockTimeout(TransientError):
    """A lock the promote needs stayed held by another session past the lock timeout."""


def _set_lock_timeout(conn: psycopg.Connection, seconds: float) -> None:
    conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{max(1, int(seconds * 1000))}ms"])


ALTER_TRY_SECONDS = 2.0


def _add_column_politely(conn: psycopg.Connection, plan: CommitPlan, record_type: str, column: Column) -> None:
    """``ALTER TABLE … ADD COLUMN`` in short tries, until the promote's lock timeout.

    The ALTER needs ``ACCESS EXCLUSIVE``, so it waits for the table's current
    readers, and every reader that arrives meanwhile queues behind it. Each try
    gives up after :data:`ALTER_TRY_SECONDS` (rolled back to a savepoint), so a
    long report on the table delays new readers by at most that much per try.
    """
    deadline = time.monotonic() + plan.lock_timeout_seconds
    while True:
        try:
            with conn.transaction():  # a savepoint
                _set_lock_timeout(conn, min(ALTER_TRY_SECONDS, plan.lock_timeout_seconds))
                add_column(conn, record_type, column)
            break
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"waited {plan.lock_timeout_seconds:g} s to add column {column.name!r} to table "
                    f"idem.{record_type}: its readers never let go (see pg_stat_activity); nothing was "
                    "committed, the next attempt retries"
                ) from exc
            time.sleep(0.5)
    _set_lock_timeout(conn, plan.lock_timeout_seconds)


@contextmanager
def _lock_wait(plan: CommitPlan, what: str, *, streaming: bool = False) -> Iterator[None]:
    """Turn a lock timeout into a transient error that names what was locked
    (while streaming, the timeout only ends streaming: the promote tries again)."""
    try:
        yield
    except psycopg.errors.LockNotAvailable as exc:
        if streaming:
            raise
        raise LockTimeout(
            f"waited {plan.lock_timeout_seconds:g} s for the lock on {what}: another session holds it "
            "(see pg_locks / pg_stat_activity); nothing was committed, the next attempt retries"
        ) from exc


def _promoted_tables(plan: CommitPlan, chosen: list[StagedAttempt]) -> list[str]:
    names = []
    for message in chosen:
        names += [attempt_table(plan.staging_table(rt), message.attempt) for rt, n in message.rows.items() if n]
        if message.rejected:
            names.append(attempt_table(plan.rejects_table, message.attempt))
    return names


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


class _Done:
    """The transaction already committed by :meth:`Promotion.finish`."""

    def __exit__(self, *exc: Any) -> None:
        return None


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


def sources_of(sources: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A result's ``files`` (the units that are files, the summary's contract key) and,
    when other sources took part, all of them under ``sources``."""
    files = [source for source in sources if "file" in source]
    return {"files": files} if len(files) == len(sources) else {"files": files, "sources": sources}


def ledger_result(result: dict[str, Any], key: str, commit_keys: int) -> dict[str, Any]:
    """What one ledger row keeps of its commit's result: the counts and tables of the
    commit, but of its sources only this key's own, plus how many keys the commit had.

    A batch of N files writes N ledger rows in its promoting transaction; with every
    source in each, that was N² entries (500 files: 250,000, ~40 MB of jsonb). The whole
    list stays once in ``idem.commits.sources``; ``commit_keys`` is enough to tell
    whether a replay covers all of a prior commit (:func:`~idem_platform.pipeline.commit.replayed_records`).
    """
    own = {name: [s for s in entries if s.get("key") == key] for name in ("files", "sources") if (entries := result.get(name)) is not None}
    return {**result, **own, "commit_keys": commit_keys}


def _record_commit(
    conn: psycopg.Connection,
    plan: CommitPlan,
    result: dict[str, Any],
    *,
    replay: bool,
    valid_through: datetime | None = None,
) -> None:
    """The ``commits`` row. ``valid_through``: the source's own clock when it has one
    (the Kafka messages' timestamps), else the end of the replay window."""
    conn.execute(
        f"""
        INSERT INTO {SCHEMA}.commits (commit_id, run_id, connector, started_at, rows_written,
            rows_skipped, rows_rejected, replay, sources, valid_through, schema_versions, tables)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, coalesce(%s, now() + %s), %s, %s)
        """,
        [
            result["commit_id"], plan.run_id, plan.connector, plan.started_at,
            result["rows_written"], result["rows_skipped"], result["rows_rejected"], replay,
            Jsonb(plan.sources()), valid_through, timedelta(seconds=plan.replay_window_seconds),
            Jsonb(result.get("schema_versions", {})), Jsonb(result.get("tables", {})),
        ],
    )


def _log(
    conn: psycopg.Connection,
    commit_id: str,
    written: int,
    skipped: int,
    rejected: int,
    *,
    replay: bool,
    replay_skipped: int = 0,
) -> None:
    """The commit's ``execution_log`` counts. ``replay_skipped``: records of units an
    earlier commit holds (a mixed batch's already-committed files)."""
    events = {
        "written": written,
        "replay_skip" if replay else "idempotent_skip": skipped,
        "rejected": rejected,
    }
    if replay_skipped:
        events["replay_skip"] = events.get("replay_skip", 0) + replay_skipped
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {SCHEMA}.execution_log (commit_id, event_type, count) VALUES (%s, %s, %s)",
            [(commit_id, event, count) for event, count in events.items() if count],
        )


def record_replay(conn: psycopg.Connection, plan: CommitPlan, priors: list[dict[str, Any]]) -> dict[str, Any]:
    """Record a run whose units were all committed before: a ``replay`` commit, nothing else.

    Every record of the units counts as ``replay_skip``; ``prior`` carries the
    original commits' counts. Runs in its own transaction.
    """
    skipped = sum(p.get("rows_written", 0) + p.get("rows_skipped", 0) + p.get("rows_rejected", 0) for p in _unique(priors))
    result = {
        "commit_id": plan.commit_id,
        "connector": plan.connector,
        "run_id": plan.run_id,
        "rows_written": 0,
        "rows_skipped": skipped,
        "rows_rejected": 0,
        "replayed": True,
        **sources_of(plan.sources()),
        "prior": _prior(priors),
    }
    with conn.transaction():
        _record_commit(conn, plan, result, replay=True)
        _log(conn, plan.commit_id, 0, skipped, 0, replay=True)
    return result


def _unique(priors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for prior in priors:
        seen.setdefault(str(prior.get("commit_id")), prior)
    return list(seen.values())


def _prior(priors: list[dict[str, Any]]) -> dict[str, Any]:
    unique = _unique(priors)
    if len(unique) == 1:
        p = unique[0]
        return {k: p.get(k) for k in ("commit_id", "rows_written", "rows_skipped", "rows_rejected")}
    return {
        "commit_ids": [p.get("commit_id") for p in unique],
        **{k: sum(p.get(k, 0) for p in unique) for k in ("rows_written", "rows_skipped", "rows_rejected")},
    }

