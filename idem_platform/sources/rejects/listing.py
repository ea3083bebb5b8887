"""Reading ``idem.rejects``: the quarantined records, newest first, with every reason.

One query serves the CLI (``idem rejects``), the ``committed`` materialization's
sample and the ``reject_ratio`` check, so they can never disagree on what a
reject looks like.
"""

from __future__ import annotations

from typing import Any

import psycopg

from idem_platform.postgres.schema import SCHEMA

COLUMNS = (
    "commit_id", "connector", "source", "position", "line", "reasons", "raw", "raw_length", "context", "created_at",
    # The quarantine loop (idem rejects retry): committed by a retry, or still failing after one.
    "retried_commit_id", "retried_at", "retries", "last_retry_commit_id", "last_retried_at", "last_retry_reasons",
)


def list_rejects(
    conn: psycopg.Connection, *, connector: str | None = None, commit_id: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Rejects of a connector and/or a commit (``None``: any), at most ``limit``, in the order
    they were recorded (newest commit first, and by position inside a commit).

    A commit's rejects are those it recorded and, for a retry's commit, those it tried
    that still fail (``last_retry_commit_id``)."""
    rows = conn.execute(
        f"SELECT commit_id::text, connector, source, position, line, reasons, raw, raw_length, context, created_at, "
        "retried_commit_id::text, retried_at, retries, last_retry_commit_id::text, last_retried_at, last_retry_reasons "
        f"FROM {SCHEMA}.rejects WHERE (%(connector)s::text IS NULL OR connector = %(connector)s) "
        "AND (%(commit)s::uuid IS NULL OR commit_id = %(commit)s::uuid "
        "OR (last_retry_commit_id = %(commit)s::uuid AND retried_commit_id IS NULL)) "
        "ORDER BY created_at DESC, reject_id LIMIT %(limit)s",
        {"connector": connector, "commit": commit_id, "limit": limit},
    ).fetchall()
    return [dict(zip(COLUMNS, row, strict=True)) for row in rows]
