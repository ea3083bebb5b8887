"""The claim re-check that opens the applying transaction.

The claim (ledger rows ``in_progress``, owned by this commit) was committed before
staging; a run whose advisory locks went (a lost connection) may have lost it to
another run since. Re-reading the rows ``FOR UPDATE`` inside the transaction that
commits is what makes two runs unable to both commit the same units.
"""

from __future__ import annotations

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
