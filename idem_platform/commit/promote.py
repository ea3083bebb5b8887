"""The one promoting transaction of a commit (DESIGN §5).

Runs on the driver once every slice is staged (staging takes no lock on the
target tables). In one PostgreSQL transaction it:

1. re-checks the ledger rows of the batch's units under ``FOR UPDATE`` (still
   ``in_progress`` and owned by this commit, or nothing is promoted);
2. takes ``SHARE ROW EXCLUSIVE`` on the record tables (concurrent commits to the
   same tables serialise their promotes; readers are never blocked), then per
   record type widens the table for new fields and inserts the staged rows of
   the *accepted* attempts only, first occurrence per key, skipping keys
   already present;
3. runs the source's commit step (the Kafka offsets' compare-and-set: if
   another run moved them, nothing commits), then records rejects, the
   execution log, the ``commits`` row and the ledger results;
4. drops the staging tables.

A crash before COMMIT leaves nothing visible; a retry after COMMIT finds the
ledger committed and replays. The insert is a single write into the target:
the anti-join under the table lock already excludes existing keys, so no
``ON CONFLICT`` speculative insertion is paid per row.
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

from idem_platform.catalog import STRING, Column, TableSpec
from idem_platform.coercion.records import LINE_BITS, LINE_MASK
from idem_platform.commit.plan import CommitPlan
from idem_platform.commit.staging import attempt_table, drop_staging, drop_tables, staged_ident
from idem_platform.errors import RejectRatioExceeded, TransientError
from idem_platform.faults import checkpoint
from idem_platform.ledger import Ledger
from idem_platform.postgres.schema import SCHEMA
from idem_platform.postgres.tables import (
    add_column,
    effective_spec,
    existing_columns,
    record_catalog,
    table_ident,
)

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
    unique_keys: bool = False  # the attempt staged no key twice (no DISTINCT ON needed)
    max_timestamps: dict[int, int] = field(default_factory=dict)  # unit index -> newest source timestamp (ms)


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


def _insert_rows(
    conn: psycopg.Connection,
    plan: CommitPlan,
    record_type: str,
    spec: TableSpec,
    stage: sql.Composed,
    evolution: _Evolution,
    *,
    unique_keys: bool = False,
) -> int:
    typed = [c.name for c in spec.columns]
    target = [
        "_idempotency_key", "_connector", "_record_type", "_external_id", "_content_hash",
        "_schema_version", "_commit_id", "_ingested_at", "_source", "_payload",
    ] + typed + evolution.fill + ["props"] + ([plan.meta_column] if plan.meta_column else [])
    props = sql.SQL("s._props")
    if evolution.to_props:
        props = sql.SQL(
            "CASE WHEN s._extra ?| %(overcap)s THEN coalesce(s._props, '{}'::jsonb) || "
            "(SELECT jsonb_object_agg(k, s._payload -> k) FROM jsonb_object_keys(s._extra) k "
            "WHERE k = ANY(%(overcap)s)) ELSE s._props END"
        )
    select = [
        sql.SQL("s._idempotency_key, %(connector)s, %(record_type)s, s._external_id, s._content_hash, "
                "%(version)s, %(commit_id)s::uuid, now(), s._source, s._payload")
    ]
    select += [
        sql.SQL("NULLIF(s._payload -> {}, 'null'::jsonb)").format(sql.Literal(c.name))
        if c.type.kind == "dynamic"
        else sql.SQL("s.{}").format(sql.Identifier(c.name))
        for c in spec.columns
    ]
    select += [sql.SQL("s._extra ->> {}").format(sql.Literal(name)) for name in evolution.fill]
    select.append(props)
    if plan.meta_column:
        select.append(sql.SQL("s._meta"))
    # First occurrence per key wins. An attempt whose executor vouched for distinct
    # keys needs no sort of its wide rows; the anti-join alone skips keys already
    # in the table (committed, or promoted from an earlier slice of this commit).
    first_per_key = sql.SQL("") if unique_keys else sql.SQL(" ORDER BY s._idempotency_key, s._pos")
    statement = sql.SQL(
        "INSERT INTO {target} ({columns}) "
        "SELECT {distinct}{select} FROM {stage} s "
        "WHERE NOT EXISTS "
        "(SELECT 1 FROM {target} t WHERE t._idempotency_key = s._idempotency_key)"
        "{order}"
    ).format(
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


class Promotion:
    """The one promoting transaction, run once every slice is staged.

    Slices are fed as their accepted attempts report (:meth:`add` only notes
    them); :meth:`finish` opens the transaction, so the target tables are locked
    only while rows move from staging into them, never while Spark reads and
    stages. Two connectors routing to one table stage side by side and promote
    one after the other; readers of a table wait at most for the ``ALTER
    TABLE`` of an evolving promote, never for a Spark job.

    Locks are taken in one order everywhere (:mod:`idem_platform.postgres.tables`
    follows it too): the batch's ledger rows (sorted by key), then the target
    tables (sorted by name), then catalog rows, then the source's own rows
    (Kafka offsets). Each wait is bounded by ``plan.lock_timeout_seconds`` and
    ends in a :class:`LockTimeout` (transient: the sensor retries).

    The earliest slice wins a repeated key, and inside a slice the earliest
    record. Leaving the ``with`` block on an exception rolls everything back.

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
        self.staged = dict.fromkeys(plan.tables, 0)
        self.written = dict.fromkeys(plan.tables, 0)
        self.added: dict[str, list[str]] = {rt: [] for rt in plan.tables}
        self.to_props: dict[str, list[str]] = {rt: [] for rt in plan.tables}
        self.budget = MAX_NEW_COLUMNS
        self.max_timestamps: dict[str, int] = {}  # unit id -> newest source timestamp read (ms)
        self.insert_seconds = 0.0
        self.lock_seconds = 0.0
        self._transaction: Any = None

    def __enter__(self) -> Promotion:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._transaction is not None:
            self._transaction.__exit__(*exc)

    def add(self, message: StagedAttempt) -> None:
        """Note one slice's accepted attempt (the first report of each slice wins)."""
        if message.partition in self.accepted:
            return  # a second report of a partition (speculation): its rows are not ours
        self.accepted[message.partition] = message
        for index, stamp in message.max_timestamps.items():
            unit = self.plan.units[index].id
            self.max_timestamps[unit] = max(stamp, self.max_timestamps.get(unit, stamp))

    @property
    def records_staged(self) -> int:
        """Records the accepted attempts staged so far (for progress lines)."""
        return sum(sum(m.rows.values()) + sum(m.repeats.values()) for m in self.accepted.values())

    def _begin(self) -> None:
        """Open the transaction, re-check the claim, lock the target tables in name order."""
        self._transaction = self.conn.transaction()
        self._transaction.__enter__()
        # The first-occurrence sort of a slice's wide rows fits in memory at this size.
        self.conn.execute("SET LOCAL work_mem = '256MB'")
        # Probe the primary key for each staged key (a nested-loop anti-join):
        # cost grows with the batch, never with the size of the table.
        self.conn.execute("SET LOCAL enable_hashjoin = off")
        self.conn.execute("SET LOCAL enable_mergejoin = off")
        _set_lock_timeout(self.conn, self.plan.lock_timeout_seconds)
        waited = time.monotonic()
        with _lock_wait(self.plan, "the batch's ledger rows"):
            _claim(self.conn, self.plan)
        for record_type in sorted(self.plan.tables):
            with _lock_wait(self.plan, f"table idem.{record_type}"):
                self.conn.execute(
                    sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(table_ident(record_type))
                )
        self.lock_seconds = time.monotonic() - waited

    def _promote_rows(self, chosen: list[StagedAttempt]) -> None:
        """Per record type (in name order): widen the table once for the batch's new
        fields, then insert each accepted attempt's rows in slice order."""
        started = time.monotonic()
        catalog: list[tuple[str, TableSpec]] = []
        for record_type in sorted(self.plan.tables):
            spec = self.plan.tables[record_type]
            stages = []
            for message in chosen:
                self.staged[record_type] += message.repeats.get(record_type, 0)
                if message.rows.get(record_type, 0):
                    self.staged[record_type] += message.rows[record_type]
                    stage = staged_ident(attempt_table(self.plan.staging_table(record_type), message.attempt))
                    stages.append((stage, message))
            evolution = _Evolution()
            if self.plan.evolve and any(m.with_extra.get(record_type, 0) for _, m in stages):
                keys: dict[str, None] = {}
                for stage, message in stages:
                    if message.with_extra.get(record_type, 0):
                        keys.update(dict.fromkeys(_extra_keys(self.conn, stage)))
                evolution = self._evolve(record_type, list(keys))
                if evolution.fill:
                    catalog.append((record_type, spec))
            for stage, message in stages:
                self.written[record_type] += _insert_rows(
                    self.conn, self.plan, record_type, spec, stage, evolution, unique_keys=message.unique_keys
                )
        for record_type, spec in catalog:  # catalog rows after every table lock (the one lock order)
            record_catalog(self.conn, effective_spec(spec, existing_columns(self.conn, record_type)))
        self.insert_seconds = time.monotonic() - started

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
                if key not in self.to_props[record_type]:
                    self.to_props[record_type].append(key)
        return result

    def finish(self) -> dict[str, Any]:
        """Promote, check the batch, record everything, commit. Returns the commit's result.

        Raises:
            TransientError: a partition never reported (nothing is committed).
            ClaimLost: another run owns or committed the units (nothing is committed).
            LockTimeout: a target table stayed locked past ``lock_timeout_seconds``.
            RejectRatioExceeded: the batch is over ``max_reject_ratio``.
        """
        plan = self.plan
        chosen = accepted_attempts(plan, list(self.accepted.values()))
        rejected = sum(a.rejected for a in chosen)
        staged = sum(sum(a.rows.values()) + sum(a.repeats.values()) for a in chosen)
        total = staged + rejected
        if total and rejected / total > plan.max_reject_ratio:
            with self.conn.transaction():
                reasons = _reject_reasons(self.conn, plan, chosen)
            raise RejectRatioExceeded(
                f"{rejected} of {total} records rejected ({rejected / total:.1%}), above "
                f"max_reject_ratio {plan.max_reject_ratio}; nothing was committed. First reasons: "
                + " | ".join(reasons),
                rejected=rejected,
                total=total,
                reasons=reasons,
            )
        self._begin()
        self._promote_rows(chosen)
        checkpoint("before_promote")
        with _lock_wait(plan, "the source's committed offsets"):
            moved = plan.step.apply(self.conn, plan.commit_id, self.max_timestamps) if plan.step is not None else {}
        rows_rejected = _insert_rejects(self.conn, plan, chosen) if rejected else 0
        if rows_rejected != rejected:
            raise TransientError(f"staged {rejected} rejects but promoted {rows_rejected}; nothing was committed")
        tables = {
            rt: {
                "written": self.written[rt],
                "skipped": self.staged[rt] - self.written[rt],
                "new_columns": self.added[rt],
                "to_props": self.to_props[rt],
            }
            for rt in sorted(plan.tables)
            if self.staged[rt]
        }
        rows_written = sum(self.written.values())
        idempotent_skips = sum(self.staged.values()) - rows_written
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
            "timings": {"lock_wait_seconds": round(self.lock_seconds, 3), "insert_seconds": round(self.insert_seconds, 3)},
        }
        valid_through = moved.pop("valid_through", None)
        result.update(moved)
        _record_commit(self.conn, plan, result, replay=False, valid_through=valid_through)
        _log(self.conn, plan.commit_id, rows_written, idempotent_skips, rows_rejected, replay=plan.replay,
             replay_skipped=plan.replayed_records)
        ledger = Ledger(self.conn, plan.connector, replay_window=timedelta(seconds=plan.replay_window_seconds))
        for key in plan.ledger_keys():
            ledger.commit(key, result, owner=plan.owner)
        # The accepted attempts' tables are finished (their writers closed before
        # reporting), so dropping them here cannot wait on anyone.
        drop_tables(self.conn, _promoted_tables(plan, chosen))
        checkpoint("during_promote")
        finishing = time.monotonic()
        self._transaction.__exit__(None, None, None)
        self._transaction = None
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
        except psycopg.errors.LockNotAvailable as exc:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"waited {plan.lock_timeout_seconds:g} s to add column {column.name!r} to table "
                    f"idem.{record_type}: its readers never let go (see pg_stat_activity); nothing was "
                    "committed, the next attempt retries"
                ) from exc
            time.sleep(0.5)
    _set_lock_timeout(conn, plan.lock_timeout_seconds)


@contextmanager
def _lock_wait(plan: CommitPlan, what: str) -> Iterator[None]:
    """Turn a lock timeout into a transient error that names what was locked."""
    try:
        yield
    except psycopg.errors.LockNotAvailable as exc:
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

