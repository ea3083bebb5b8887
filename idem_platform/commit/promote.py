"""The one promoting transaction of a commit (DESIGN §5).

Runs on the driver, opened before the first slice is staged and fed the
accepted attempt of each slice in slice order. In one PostgreSQL transaction it:

1. re-checks the ledger rows of the batch's units under ``FOR UPDATE`` (still
   ``in_progress`` and owned by this commit, or nothing is promoted);
2. takes ``SHARE ROW EXCLUSIVE`` on the record tables (concurrent commits to the
   same tables serialise; readers are never blocked), then per slice and record
   type widens the table for new fields and inserts the staged rows of the
   *accepted* attempt only, first occurrence per key, skipping keys already present;
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

import sys
import time
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
    """The one promoting transaction, fed one accepted attempt (slice) at a time.

    Feeding slices *in slice order* while later slices are still being staged
    overlaps PostgreSQL's insert work with the executors' work, and keeps the
    first occurrence of a repeated key (the earliest slice wins, and inside a
    slice the earliest record). Nothing is visible before :meth:`finish` commits;
    leaving the ``with`` block on an exception rolls everything back.

    Use::

        with Promotion(conn, plan) as promotion:
            for message in messages_in_slice_order:
                promotion.add(message)
            result = promotion.finish()
    """

    def __init__(self, conn: psycopg.Connection, plan: CommitPlan) -> None:
        self.conn = conn
        self.plan = plan
        self.started = time.monotonic()
        self.accepted: dict[int, StagedAttempt] = {}
        self.staged = dict.fromkeys(plan.tables, 0)
        self.written = dict.fromkeys(plan.tables, 0)
        self.added: dict[str, list[str]] = {rt: [] for rt in plan.tables}
        self.to_props: dict[str, list[str]] = {rt: [] for rt in plan.tables}
        self.budget = MAX_NEW_COLUMNS
        self.max_timestamps: dict[str, int] = {}  # unit id -> newest source timestamp read (ms)
        self.insert_seconds = 0.0
        self._transaction: Any = None

    def __enter__(self) -> Promotion:
        self._transaction = self.conn.transaction()
        self._transaction.__enter__()
        try:
            # The first-occurrence sort of a slice's wide rows fits in memory at this size.
            self.conn.execute("SET LOCAL work_mem = '256MB'")
            # Probe the primary key for each staged key (a nested-loop anti-join):
            # cost grows with the batch, never with the size of the table.
            self.conn.execute("SET LOCAL enable_hashjoin = off")
            self.conn.execute("SET LOCAL enable_mergejoin = off")
            _claim(self.conn, self.plan)
            for record_type in sorted(self.plan.tables):
                self.conn.execute(
                    sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(table_ident(record_type))
                )
        except BaseException:
            self._transaction.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._transaction.__exit__(*exc)

    def add(self, message: StagedAttempt) -> None:
        """Promote one accepted attempt's rows (inside the open transaction)."""
        if message.partition in self.accepted:
            return  # a second report of a partition (speculation): its rows are not ours
        self.accepted[message.partition] = message
        for index, stamp in message.max_timestamps.items():
            unit = self.plan.units[index].id
            self.max_timestamps[unit] = max(stamp, self.max_timestamps.get(unit, stamp))
        started = time.monotonic()
        for record_type in sorted(self.plan.tables):
            self.staged[record_type] += message.repeats.get(record_type, 0)
            count = message.rows.get(record_type, 0)
            if not count:
                continue
            self.staged[record_type] += count
            spec = self.plan.tables[record_type]
            stage = staged_ident(attempt_table(self.plan.staging_table(record_type), message.attempt))
            evolution = _Evolution()
            if self.plan.evolve and message.with_extra.get(record_type, 0):
                evolution = self._evolve(record_type, spec, _extra_keys(self.conn, stage))
            self.written[record_type] += _insert_rows(
                self.conn, self.plan, record_type, spec, stage, evolution, unique_keys=message.unique_keys
            )
        self.insert_seconds += time.monotonic() - started

    def _evolve(self, record_type: str, spec: TableSpec, keys: list[str]) -> _Evolution:
        """What each unknown field becomes: a text column (added now, within the budget) or ``props``."""
        result = _Evolution()
        columns = existing_columns(self.conn, record_type)
        for key in keys:
            type_ = columns.get(key)
            if type_ == STRING.postgres:
                result.fill.append(key)
            elif type_ is None and self.budget > 0:
                add_column(self.conn, record_type, Column(key, STRING, evolved=True))
                self.budget -= 1
                self.added[record_type].append(key)
                result.fill.append(key)
            else:
                result.to_props.append(key)
                if key not in self.to_props[record_type]:
                    self.to_props[record_type].append(key)
        if result.fill:
            record_catalog(self.conn, effective_spec(spec, existing_columns(self.conn, record_type)))
        return result

    def finish(self) -> dict[str, Any]:
        """Check the batch, record everything, commit. Returns the commit's result.

        Raises:
            TransientError: a partition never reported (nothing is committed).
            RejectRatioExceeded: the batch is over ``max_reject_ratio``.
        """
        plan = self.plan
        chosen = accepted_attempts(plan, list(self.accepted.values()))
        rejected = sum(a.rejected for a in chosen)
        total = sum(self.staged.values()) + rejected
        if total and rejected / total > plan.max_reject_ratio:
            reasons = _reject_reasons(self.conn, plan, chosen)
            raise RejectRatioExceeded(
                f"{rejected} of {total} records rejected ({rejected / total:.1%}), above "
                f"max_reject_ratio {plan.max_reject_ratio}; nothing was committed. First reasons: "
                + " | ".join(reasons),
                rejected=rejected,
                total=total,
                reasons=reasons,
            )
        checkpoint("before_promote")
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
        rows_skipped = sum(self.staged.values()) - rows_written
        result = {
            "commit_id": plan.commit_id,
            "connector": plan.connector,
            "run_id": plan.run_id,
            "rows_written": rows_written,
            "rows_skipped": rows_skipped,
            "rows_rejected": rows_rejected,
            "replayed": False,
            **sources_of(plan.sources()),
            "tables": tables,
            "schema_versions": {rt: plan.tables[rt].schema_version for rt in sorted(plan.tables)},
            "timings": {"insert_seconds": round(self.insert_seconds, 3)},
        }
        valid_through = moved.pop("valid_through", None)
        result.update(moved)
        _record_commit(self.conn, plan, result, replay=False, valid_through=valid_through)
        _log(self.conn, plan.commit_id, rows_written, rows_skipped, rows_rejected, replay=plan.replay)
        ledger = Ledger(self.conn, plan.connector, replay_window=timedelta(seconds=plan.replay_window_seconds))
        for key in plan.ledger_keys():
            ledger.commit(key, result, owner=plan.owner)
        # The accepted attempts' tables are finished (their writers closed before
        # reporting), so dropping them here cannot wait on anyone.
        drop_tables(self.conn, _promoted_tables(plan, chosen))
        checkpoint("during_promote")
        finishing = time.monotonic()
        self._transaction.__exit__(None, None, None)
        self._transaction = _Done()
        result["timings"]["commit_seconds"] = round(time.monotonic() - finishing, 3)
        checkpoint("after_promote")
        _drop_leftovers(self.conn, plan)
        return result


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


def _log(conn: psycopg.Connection, commit_id: str, written: int, skipped: int, rejected: int, *, replay: bool) -> None:
    events = {
        "written": written,
        "replay_skip" if replay else "idempotent_skip": skipped,
        "rejected": rejected,
    }
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

