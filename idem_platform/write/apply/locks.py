"""Every lock the applying transaction waits for is bounded, and named when it times out.

A commit must never hang behind another session: each wait ends after
``plan.lock_timeout_seconds`` in a :class:`LockTimeout` (transient: the sensor
retries) that says what was locked, and the one ``ALTER TABLE`` (which makes readers
queue) is tried in short goes so a long report delays new readers little.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from idem_platform.contract.catalog import Column
from idem_platform.errors import TransientError
from idem_platform.postgres.schema import qualified_table_name
from idem_platform.postgres.tables import add_column
from idem_platform.write.plan import CommitPlan

# What ends streaming: another writer committed one of our keys first (unique
# violation), two writers wait on each other's keys, or a lock wait ran out.
STREAM_CONFLICTS = (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable)


class LockTimeout(TransientError):
    """A lock the applying transaction needs stayed held by another session past the lock timeout."""


def set_lock_timeout(conn: psycopg.Connection, seconds: float) -> None:
    """``SET LOCAL lock_timeout``: for the rest of the transaction (or savepoint)."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{max(1, int(seconds * 1000))}ms"])


ALTER_TRY_SECONDS = 2.0


def add_column_politely(conn: psycopg.Connection, plan: CommitPlan, record_type: str, column: Column) -> None:
    """``ALTER TABLE … ADD COLUMN`` in short tries, until the applying transaction's lock timeout.

    The ALTER needs ``ACCESS EXCLUSIVE``, so it waits for the table's current
    readers, and every reader that arrives meanwhile queues behind it. Each try
    gives up after :data:`ALTER_TRY_SECONDS` (rolled back to a savepoint), so a
    long report on the table delays new readers by at most that much per try.
    """
    deadline = time.monotonic() + plan.lock_timeout_seconds
    while True:
        try:
            with conn.transaction():  # a savepoint
                set_lock_timeout(conn, min(ALTER_TRY_SECONDS, plan.lock_timeout_seconds))
                add_column(conn, record_type, column)
            break
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"waited {plan.lock_timeout_seconds:g} s to add column {column.name!r} to table "
                    f"{qualified_table_name(record_type)}: its readers never let go (see pg_stat_activity); nothing was "
                    "committed, the next attempt retries"
                ) from exc
            time.sleep(0.5)
    set_lock_timeout(conn, plan.lock_timeout_seconds)


@contextmanager
def lock_wait(plan: CommitPlan, what: str, *, streaming: bool = False) -> Iterator[None]:
    """Turn a lock timeout into a transient error that names what was locked
    (while streaming, the timeout only ends streaming: :meth:`~idem_platform.write.apply.transaction.ApplyTransaction.finish` tries again)."""
    try:
        yield
    except psycopg.errors.LockNotAvailable as exc:
        if streaming:
            raise
        raise LockTimeout(
            f"waited {plan.lock_timeout_seconds:g} s for the lock on {what}: another session holds it "
            "(see pg_locks / pg_stat_activity); nothing was committed, the next attempt retries"
        ) from exc
