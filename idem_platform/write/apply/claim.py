"""The claim re-check that opens the applying transaction.

The claim (ledger rows ``in_progress``, owned by this commit) was committed before
staging; a run whose advisory locks went (a lost connection) may have lost it to
another run since. Re-reading the rows ``FOR UPDATE`` inside the transaction that
commits is what makes two runs unable to both commit the same units.

A run that lost its claim can also fail before that re-check: the run that took the
units over dropped its staging tables (a dead owner's leftovers, as it saw them), so
its next write names a relation that no longer exists. :func:`claim_taken` tells such a
failure from a real one, so the run says what happened instead of PostgreSQL's words.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from idem_platform.errors import TransientError
from idem_platform.postgres.schema import SCHEMA
from idem_platform.write.plan import CommitPlan


class ClaimLost(TransientError):
    """The units' ledger rows are no longer this commit's (another run took them)."""


def recheck_claim(conn: psycopg.Connection, plan: CommitPlan) -> None:
    """Lock the batch's ledger rows (in key order, the one lock order) and check they
    are still ``in_progress`` and this commit's.

    Raises:
        ClaimLost: a unit is committed, failed, gone or owned by another run.
    """
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


def claim_taken(conn: psycopg.Connection, plan: CommitPlan) -> ClaimLost | None:
    """If another run owns or committed one of the batch's units now: the one line that
    says so (which commit lost what to whom, and when); else ``None``. Reads without locking.
    """
    rows = conn.execute(
        f"SELECT key, status, owner, updated_at FROM {SCHEMA}.ingest_ledger WHERE namespace = %s AND key = ANY(%s)",
        [plan.connector, plan.ledger_keys()],
    ).fetchall()
    found: dict[str, tuple[str, str | None, datetime]] = {key: (status, owner, at) for key, status, owner, at in rows}
    for unit in {u.key: u for u in plan.units}.values():
        if unit.key not in found:
            continue
        status, owner, at = found[unit.key]
        if owner != plan.owner and status in ("in_progress", "committed"):
            return ClaimLost(
                f"commit {plan.commit_id}: another run ({owner}) took over this batch's claim on {unit.label} "
                f"at {at.isoformat(timespec='seconds')}"
                f"{' and committed it' if status == 'committed' else ''}; nothing of this run was applied"
            )
    return None
