"""Each unit's own rows written, skipped and rejected in a commit, counted with the batch's totals.

A batch of many units (the file-drop sensor's batch of files) reports its totals; each
unit's partition must report the unit's own share, and the shares must add up to the
totals under the same definitions. So they come from the same counting, never
re-derived afterwards:

* written: the applying inserts count their rows per unit (the position prefix of each
  inserted row, :func:`~idem_platform.write.apply.rows.insert_rows`);
* rejected: the accepted attempts' staged rejects per unit (``_pos`` holds the unit's index);
* records: each staging task counts its records per unit, a file's blank lines left
  out as the coercion leaves them out (:func:`~idem_platform.spark.stage.count_records`);
* skipped: a unit's records neither written nor rejected (a key the table held, a
  repeat, a row another unit of the batch wrote first), which is how the batch's
  ``rows_skipped`` counts them too (staged and repeated records less rows written).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from idem_platform.coercion.records import LINE_BITS
from idem_platform.write.apply.attempts import StagedAttempt, rejects_tables
from idem_platform.write.plan import CommitPlan


def rejected_by_unit(conn: psycopg.Connection, plan: CommitPlan, chosen: list[StagedAttempt]) -> dict[int, int]:
    """``{unit index: rejects}`` the accepted attempts staged (read before their tables go)."""
    tables = rejects_tables(plan, chosen)
    if not tables:
        return {}
    union = sql.SQL(" UNION ALL ").join(sql.SQL("SELECT _pos FROM {}").format(t) for t in tables)
    rows = conn.execute(
        sql.SQL("SELECT (_pos >> {bits})::int, count(*) FROM ({union}) r GROUP BY 1").format(
            bits=sql.Literal(LINE_BITS), union=union
        )
    ).fetchall()
    return {int(unit): int(count) for unit, count in rows}


def unit_counts(
    plan: CommitPlan,
    chosen: list[StagedAttempt],
    written: dict[str, int],
    written_by_prefix: dict[str, dict[str, int]] | None,
    rejected: dict[int, int],
) -> list[dict[str, Any]] | None:
    """Per unit, in plan order: ``rows_written``, ``rows_skipped``, ``rows_rejected`` and
    ``written`` per record type; ``None`` when an attempt did not count its records.

    ``written``: rows inserted per record type; ``written_by_prefix``: the same per
    position prefix, ``None`` for a one-unit plan (its unit wrote them all). Units with
    the same prefix (files with the same bytes) have the same records: the first one
    wrote whatever they wrote, the others only skip.
    """
    if any(attempt.records is None for attempt in chosen):
        return None
    if written_by_prefix is None and len(plan.units) > 1:
        return None  # the inserts did not count per unit (the plan did not ask)
    records: dict[int, int] = {}
    for attempt in chosen:
        for index, count in (attempt.records or {}).items():
            records[index] = records.get(index, 0) + count
    claimed: set[str] = set()
    counts = []
    for index, unit in enumerate(plan.units):
        if written_by_prefix is None:
            tables = {rt: n for rt, n in sorted(written.items()) if n}
        elif unit.position_prefix in claimed:
            tables = {}
        else:
            claimed.add(unit.position_prefix)
            tables = {rt: n for rt, by in sorted(written_by_prefix.items()) if (n := by.get(unit.position_prefix, 0))}
        rows_written, rows_rejected = sum(tables.values()), rejected.get(index, 0)
        counts.append({
            "rows_written": rows_written,
            "rows_skipped": records.get(index, 0) - rows_written - rows_rejected,
            "rows_rejected": rows_rejected,
            "written": tables,
        })
    return counts
