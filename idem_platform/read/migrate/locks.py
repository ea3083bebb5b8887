"""Short lock tries: how every ``idem migrate`` transaction waits for locks.

The DDL (:mod:`.prepare`) and each batch's ``UPDATE`` (:mod:`.writer`) take row or
table locks other sessions may hold; both run the same loop, a transaction whose
lock waits end after :data:`LOCK_TRY_SECONDS`, rolled back and tried again until
the migrate's ``lock_timeout_seconds``. Kept apart so the two share one rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from idem_platform.read.migrate.errors import MigrateLockTimeout

LOCK_TRY_SECONDS = 2.0  # each try of a batch (or of the DDL) waits this long for a lock at most
RETRY_PAUSE_SECONDS = 0.5


def with_lock_tries(
    conn: psycopg.Connection, what: str, timeout: float, work: Callable[[], Any], *, undone: str = "nothing was changed"
) -> Any:
    """``work`` in a transaction whose lock waits end after :data:`LOCK_TRY_SECONDS`; on a
    lock timeout, a lost deadlock or a serialization failure, everything is rolled back
    (what it held is released, so the sessions it made wait go on), and tried again after
    a pause, until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, true)",
                    [f"{max(1, int(min(LOCK_TRY_SECONDS, timeout) * 1000))}ms"],
                )
                return work()
        except (
            psycopg.errors.LockNotAvailable,
            psycopg.errors.DeadlockDetected,
            psycopg.errors.SerializationFailure,
        ) as exc:
            if time.monotonic() >= deadline:
                raise MigrateLockTimeout(
                    f"waited {timeout:g} s for the locks on {what}: other sessions kept them (see pg_locks / "
                    f"pg_stat_activity); {undone}: run idem migrate again"
                ) from exc
            time.sleep(RETRY_PAUSE_SECONDS)
