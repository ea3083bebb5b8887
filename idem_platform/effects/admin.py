"""What is owed, and the two hands-on fixes: the outbox listed, failed rows made due again,
delivered rows purged once the ledger's replay window is past."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

STATUSES = ("pending", "delivered", "failed")

_COLUMNS = (
    "key", "effect", "connector", "record_type", "external_id", "seq", "record_key", "status", "attempts", "next_attempt_at",
    "claimed_by", "claimed_until", "last_status", "reason", "last_response", "created_at", "last_attempt_at",
    "delivered_at", "commit_id", "payload",
)


def list_outbox(
    conn: psycopg.Connection, *, effect: str | None = None, status: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """The outbox rows, oldest first (``effect``/``status``: only those)."""
    rows = conn.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM idem.outbox "
        "WHERE (%(effect)s::text IS NULL OR effect = %(effect)s) AND (%(status)s::text IS NULL OR status = %(status)s) "
        "ORDER BY created_at, key LIMIT %(limit)s",
        {"effect": effect, "status": status, "limit": limit},
    ).fetchall()
    return [dict(zip(_COLUMNS, row, strict=True)) for row in rows]


def outbox_counts(conn: psycopg.Connection, *, effect: str | None = None) -> dict[str, dict[str, Any]]:
    """Per effect: rows pending, delivered and failed, and the age in seconds of the oldest pending one."""
    found: dict[str, dict[str, Any]] = {}
    for name, status, count, oldest in conn.execute(
        "SELECT effect, status, count(*), extract(epoch FROM now() - min(created_at)) FROM idem.outbox "
        "WHERE %(effect)s::text IS NULL OR effect = %(effect)s GROUP BY effect, status ORDER BY effect, status",
        {"effect": effect},
    ).fetchall():
        entry = found.setdefault(name, {"pending": 0, "delivered": 0, "failed": 0, "oldest_pending_seconds": None})
        entry[status] = int(count)
        if status == "pending":
            entry["oldest_pending_seconds"] = round(float(oldest), 1)
    return found


def retry_failed(conn: psycopg.Connection, *, effect: str | None = None) -> int:
    """Make failed rows pending and due now, with their tries counted from zero again; how many."""
    return conn.execute(
        "UPDATE idem.outbox SET status = 'pending', attempts = 0, next_attempt_at = now(), reason = NULL, "
        "claimed_by = NULL, claimed_until = NULL WHERE status = 'failed' AND (%(effect)s::text IS NULL OR effect = %(effect)s)",
        {"effect": effect},
    ).rowcount


def purge_delivered(conn: psycopg.Connection, older_than: timedelta) -> int:
    """Delete rows delivered more than ``older_than`` ago; how many.

    Pending and failed rows stay whatever their age: they are still owed.
    """
    return conn.execute(
        "DELETE FROM idem.outbox WHERE status = 'delivered' AND delivered_at < now() - %s", [older_than]
    ).rowcount


def owed(conn: psycopg.Connection, bounds: dict[str, float]) -> tuple[bool, dict[str, dict[str, Any]], list[str]]:
    """What the effects named in ``bounds`` (effect -> ``warn_pending_after_seconds``) owe, judged.

    Returns:
        ``(fine, counts, problems)``: per effect its pending, delivered and failed rows and the
        age of the oldest pending one (:func:`outbox_counts`; zeros for an effect with no row),
        and one line per effect with failed rows or a pending row older than its bound.
    """
    found = outbox_counts(conn)
    counts: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name, bound in sorted(bounds.items()):
        entry = found.get(name, {"pending": 0, "delivered": 0, "failed": 0, "oldest_pending_seconds": None})
        counts[name] = entry
        if entry["failed"]:
            problems.append(f"{name}: {entry['failed']} failed (idem effects list --status failed)")
        oldest = entry["oldest_pending_seconds"]
        if oldest is not None and oldest > bound:
            problems.append(f"{name}: oldest pending row is {oldest:.0f}s old (bound {bound:g}s)")
    return not problems, counts, problems


def due_rows(conn: psycopg.Connection, effects: list[str]) -> tuple[int, str | None]:
    """How many rows of ``effects`` a dispatcher could claim now (due, and not behind an earlier
    row of their identity: the claim's own test), and a digest of them (their keys and tries:
    the same due set gives the same digest, a row due again after a try a new one)."""
    row = conn.execute(
        "SELECT count(*), md5(string_agg(o.key || ':' || o.attempts, ',' ORDER BY o.key)) FROM idem.outbox o "
        "WHERE o.status = 'pending' AND o.effect = ANY(%s) AND o.next_attempt_at <= now() "
        "AND (o.claimed_until IS NULL OR o.claimed_until < now()) AND NOT EXISTS ("
        "SELECT 1 FROM idem.outbox e WHERE e.effect = o.effect AND e.record_type = o.record_type "
        "AND e.external_id = o.external_id AND e.status = 'pending' AND e.key <> o.key "
        "AND (e.seq < o.seq OR e.claimed_until >= now()))",
        [effects],
    ).fetchone()
    return (int(row[0]), row[1]) if row else (0, None)
