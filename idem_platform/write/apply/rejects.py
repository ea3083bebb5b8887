"""The accepted attempts' rejects: their first reasons, and their rows in ``idem.rejects``."""

from __future__ import annotations

import psycopg
from psycopg import sql

from idem_platform.coercion.records import LINE_BITS, LINE_MASK
from idem_platform.errors import RejectRatioExceeded, TransientError
from idem_platform.postgres.schema import SCHEMA
from idem_platform.write.apply.attempts import StagedAttempt, rejects_tables
from idem_platform.write.plan import CommitPlan


def reject_reasons(conn: psycopg.Connection, plan: CommitPlan, chosen: list[StagedAttempt], limit: int = 5) -> list[str]:
    """The first ``limit`` rejects' reasons, each located in its unit (``file:line``),
    for the error of a batch over its reject ratio: enough to see what went wrong."""
    tables = rejects_tables(plan, chosen)
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


def insert_rejects(conn: psycopg.Connection, plan: CommitPlan, chosen: list[StagedAttempt]) -> int:
    """Insert the accepted attempts' rejects into ``idem.rejects``, in slice order."""
    return sum(_insert_attempt_rejects(conn, plan, table) for table in rejects_tables(plan, chosen))


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


def too_many_rejects(
    conn: psycopg.Connection, plan: CommitPlan, chosen: list[StagedAttempt], rejected: int, total: int
) -> RejectRatioExceeded:
    """The error of a batch over its ``max_reject_ratio``, with its first reasons (read
    from the reject tables in the open transaction: nothing is committed)."""
    reasons = reject_reasons(conn, plan, chosen)
    return RejectRatioExceeded(
        f"{rejected} of {total} records rejected ({rejected / total:.1%}), above "
        f"max_reject_ratio {plan.max_reject_ratio}; nothing was committed. First reasons: "
        + " | ".join(reasons),
        rejected=rejected,
        total=total,
        reasons=reasons,
    )


def record_rejects(conn: psycopg.Connection, plan: CommitPlan, chosen: list[StagedAttempt], rejected: int) -> int:
    """Record the accepted attempts' ``rejected`` rejects; return how many were recorded.

    Raises:
        TransientError: the count is not what the attempts reported staging (a reject
            table incomplete or gone): nothing is committed rather than rejects lost.
    """
    # A step that keeps the rejects itself (the quarantine's retry updates the rejects it
    # read instead of adding rows) is handed the accepted attempts' reject tables.
    step_records = getattr(plan.step, "record_rejects", None)
    if step_records is not None:
        rows_rejected = step_records(conn, plan, rejects_tables(plan, chosen))
    else:
        rows_rejected = insert_rejects(conn, plan, chosen) if rejected else 0
    if rows_rejected != rejected:
        raise TransientError(f"staged {rejected} rejects but recorded {rows_rejected}; nothing was committed")
    return rows_rejected
