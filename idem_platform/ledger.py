"""The idempotency ledger (DESIGN §4): begin / commit / fail, bound to the caller's transaction.

``begin(key, request)`` answers with one of five outcomes and the caller acts on
it; the row it may insert, and every later update, only becomes visible when the
*caller* commits. The ledger never opens, commits or rolls back a transaction
itself, so a ledger entry and the rows it vouches for always land together.

Rows expire ``replay_window`` after their last change but keep replaying until
:func:`purge_expired` deletes them (an hourly Dagster schedule, with a grace).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from idem_platform.contract.canonical import canonical_bytes
from idem_platform.postgres.schema import SCHEMA

DEFAULT_REPLAY_WINDOW = timedelta(hours=24)
# Connector names ([a-z0-9_-]) are the file-drop and Kafka namespaces; ':' and '.' let
# other users of the ledger keep apart from them (``http:<connector>`` for request
# keys, ``payments.refunds`` for a user's own handlers).
NAMESPACE_PATTERN = re.compile(r"[a-z0-9_.:-]{1,128}")
_TABLE = f"{SCHEMA}.ingest_ledger"


@dataclass(frozen=True)
class Fresh:
    """No row existed: one was inserted ``in_progress`` (attempt 1)."""


@dataclass(frozen=True)
class InFlight:
    """Another caller holds the key ``in_progress``."""

    owner: str | None
    attempts: int


@dataclass(frozen=True)
class PriorResult:
    """The key was committed: replay its result."""

    result: dict[str, Any]


@dataclass(frozen=True)
class PriorError:
    """The key failed permanently: replay its error."""

    error: dict[str, Any]
    attempts: int


@dataclass(frozen=True)
class Mismatch:
    """The key was used before for a different request."""

    recorded_hash: str
    submitted_hash: str


Outcome = Fresh | InFlight | PriorResult | PriorError | Mismatch


@dataclass(frozen=True)
class LedgerEntry:
    """A ledger row as read (no lock taken)."""

    key: str
    status: str
    attempts: int
    owner: str | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    request_hash: str


def request_hash(request: Any) -> str:
    """SHA-256 hex of the request's canonical JSON (keys sorted, array order kept)."""
    return hashlib.sha256(canonical_bytes(request)).hexdigest()


class LedgerUsageError(RuntimeError):
    """The ledger was used outside a transaction or for a row it does not own."""


class Ledger:
    """The ledger of one namespace, bound to a caller-owned connection.

    Args:
        conn: a psycopg connection; every call must happen inside a transaction
            the caller opened (``with conn.transaction():``).
        namespace: ``[a-z0-9_.:-]{1,128}``; the file-drop and Kafka paths use the
            connector's name, ``idem serve`` uses ``http:<connector>`` for request keys.
        replay_window: how long committed/failed answers are kept before purge.
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        namespace: str,
        *,
        replay_window: timedelta = DEFAULT_REPLAY_WINDOW,
    ) -> None:
        if not NAMESPACE_PATTERN.fullmatch(namespace or ""):
            raise ValueError(f"ledger namespace {namespace!r} must match [a-z0-9_.:-]{{1,128}}")
        self.conn = conn
        self.namespace = namespace
        self.replay_window = replay_window

    def _require_transaction(self) -> None:
        if self.conn.info.transaction_status != TransactionStatus.INTRANS:
            raise LedgerUsageError(
                "the ledger runs inside the caller's transaction: open one first "
                "(with conn.transaction(): ...); it never commits on its own"
            )

    def begin(self, key: str, request: Any, *, owner: str | None = None) -> Outcome:
        """Claim ``key`` for ``request`` or report why not."""
        self._require_transaction()
        submitted = request_hash(request)
        inserted = self.conn.execute(
            f"""
            INSERT INTO {_TABLE} (namespace, key, request_hash, status, owner, expires_at)
            VALUES (%s, %s, %s, 'in_progress', %s, now() + %s)
            ON CONFLICT (namespace, key) DO NOTHING
            RETURNING 1
            """,
            [self.namespace, key, submitted, owner, self.replay_window],
        ).fetchone()
        if inserted:
            return Fresh()
        # A committed answer is final: replay it without a row lock, so replays of one key
        # neither queue behind each other nor write WAL (a lock is a write). Only rows that
        # may still change (in progress, failed) are read under FOR UPDATE.
        row = self.conn.execute(
            f"SELECT request_hash, status, result, error, attempts, owner FROM {_TABLE} "
            "WHERE namespace = %s AND key = %s",
            [self.namespace, key],
        ).fetchone()
        if row is not None and row[1] == "committed":
            return Mismatch(row[0], submitted) if row[0] != submitted else PriorResult(row[2] or {})
        row = self.conn.execute(
            f"SELECT request_hash, status, result, error, attempts, owner FROM {_TABLE} "
            "WHERE namespace = %s AND key = %s FOR UPDATE",
            [self.namespace, key],
        ).fetchone()
        if row is None:  # deleted (purged, released) between our INSERT and SELECT: ask again
            return self.begin(key, request, owner=owner)
        recorded, status, result, error, attempts, current_owner = row
        if recorded != submitted:
            return Mismatch(recorded, submitted)
        if status == "committed":
            return PriorResult(result or {})
        if status == "failed":
            return PriorError(error or {}, attempts)
        return InFlight(current_owner, attempts)

    def take_over(self, key: str, owner: str) -> int:
        """Re-claim an ``in_progress`` row whose owner is dead, or a failed row, for a retry.

        Returns:
            The attempt number now running (previous attempts + 1).
        """
        self._require_transaction()
        row = self.conn.execute(
            f"""
            UPDATE {_TABLE} SET status = 'in_progress', owner = %s, error = NULL,
                   attempts = attempts + 1, updated_at = now()
            WHERE namespace = %s AND key = %s AND status <> 'committed'
            RETURNING attempts
            """,
            [owner, self.namespace, key],
        ).fetchone()
        if row is None:
            raise LedgerUsageError(f"cannot take over {key!r}: it is committed or absent")
        return int(row[0])

    def commit(self, key: str, result: dict[str, Any], *, owner: str | None = None) -> None:
        """Record the result; the caller's transaction makes it durable with the data."""
        self._require_transaction()
        self._finish(key, "committed", result=result, error=None, owner=owner)

    def fail_permanent(self, key: str, error: dict[str, Any], *, owner: str | None = None) -> None:
        """Record an error that later begins replay (a retry may still take the row over)."""
        self._require_transaction()
        self._finish(key, "failed", result=None, error=error, owner=owner)

    def fail_transient(self, key: str, *, owner: str | None = None) -> None:
        """Forget the attempt: the row is deleted so the next begin is fresh."""
        self._require_transaction()
        condition, params = self._owned(owner)
        self.conn.execute(
            f"DELETE FROM {_TABLE} WHERE namespace = %s AND key = %s AND status = 'in_progress'{condition}",
            [self.namespace, key, *params],
        )

    def _owned(self, owner: str | None) -> tuple[str, list[Any]]:
        return (" AND owner = %s", [owner]) if owner is not None else ("", [])

    def _finish(
        self,
        key: str,
        status: str,
        *,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
        owner: str | None,
    ) -> None:
        condition, params = self._owned(owner)
        updated = self.conn.execute(
            f"""
            UPDATE {_TABLE} SET status = %s, result = %s, error = %s, updated_at = now(),
                   expires_at = now() + %s
            WHERE namespace = %s AND key = %s AND status = 'in_progress'{condition}
            """,
            [
                status,
                Jsonb(result) if result is not None else None,
                Jsonb(error) if error is not None else None,
                self.replay_window,
                self.namespace,
                key,
                *params,
            ],
        ).rowcount
        if updated != 1:
            raise LedgerUsageError(
                f"ledger row {self.namespace}/{key} is not in progress"
                + (f" for owner {owner}" if owner else "")
            )

    def entries(self, keys: list[str]) -> dict[str, LedgerEntry]:
        """Read rows for ``keys`` without locking (planning and sensors)."""
        rows = self.conn.execute(
            f"SELECT key, status, attempts, owner, result, error, request_hash FROM {_TABLE} "
            "WHERE namespace = %s AND key = ANY(%s)",
            [self.namespace, keys],
        ).fetchall()
        return {row[0]: LedgerEntry(*row) for row in rows}


def next_attempt(entry: LedgerEntry | None, *, alive: bool, max_attempts: int, new: str = "new") -> tuple[int | None, str]:
    """Whether a sensor should run a key (again), as ``(attempt or None, reason)``.

    A key is run when it has no row, when its run died (``in_progress`` with
    nobody holding its advisory lock: ``alive`` is false) or when it failed with
    a retryable error, while attempts are left; never when it is committed, a
    live run holds it, or it failed permanently.
    """
    if entry is None:
        return 1, new
    if entry.status == "committed":
        return None, "committed"
    if entry.status == "in_progress":
        if alive:
            return None, "a live run is ingesting it"
        if entry.attempts >= max_attempts:
            return None, f"its run died after {entry.attempts} attempts"
        return entry.attempts + 1, "its previous run died"
    error = entry.error or {}
    message = str(error.get("message", ""))[:200]
    if not error.get("retryable", False):
        return None, f"failed permanently: {message}"
    if entry.attempts >= max_attempts:
        return None, f"failed {entry.attempts} times: {message}"
    return entry.attempts + 1, "retrying a failed attempt"


def purge_expired(
    conn: psycopg.Connection, *, now: datetime | None = None, grace: timedelta = timedelta(0)
) -> int:
    """Delete rows that expired more than ``grace`` ago (any namespace, never in progress).

    Runs in the caller's transaction like every ledger operation.
    """
    if conn.info.transaction_status != TransactionStatus.INTRANS:
        raise LedgerUsageError("purge_expired runs inside the caller's transaction")
    cutoff_sql = "%s::timestamptz" if now is not None else "now()"
    params: list[Any] = [now] if now is not None else []
    return conn.execute(
        f"DELETE FROM {_TABLE} WHERE status <> 'in_progress' AND expires_at < {cutoff_sql} - %s",
        [*params, grace],
    ).rowcount

