"""Killing a run at the right moment (once it stages rows, or at an armed fault point), acting
on one held at a fault point, and what the database holds afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from idem_platform.contract.catalog import table_name
from idem_platform.postgres import connect

RECORD_TABLES = ("indicator", "malware", "threat-actor")  # the example's record types


def wait_until_staging(url: str, process: subprocess.Popen[str], timeout: float = 300) -> int:
    """Wait until a running ingest has staged rows (its executors are writing); return how many."""
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "staging never started"
        time.sleep(0.2)
        with connect(url) as conn:
            tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'idem_staging'")]
            staged = sum(conn.execute(f'SELECT count(*) FROM idem_staging."{t}"').fetchone()[0] for t in tables)
        if staged:
            return int(staged)


def kill_at_fault(command: list[str], env: dict[str, str], marker: Path, timeout: float = 240) -> None:
    """Run ``command`` with a ``pause`` fault armed (writing ``marker``) and, once it pauses there,
    SIGKILL its whole process group: the machine dies with the driver, its JVM and every Python
    worker at once."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert process.poll() is None, process.stderr.read().decode()[-3000:] if process.stderr else ""
        assert time.monotonic() < deadline, "the run never reached the fault point"
        time.sleep(0.2)
    time.sleep(0.3)
    paused = int(marker.read_text())
    os.killpg(process.pid, signal.SIGKILL)
    try:
        os.kill(paused, signal.SIGKILL)  # an executor's Python worker may sit in its own group
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def terminate_backends(url: str) -> int:
    """Terminate every other session on ``url``'s database (what a PostgreSQL restart does
    to a run's connections, the server staying up); return how many."""
    with connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def act_when_held(marker: Path, act: Callable[[], object], process: subprocess.Popen[str] | None = None, timeout: float = 300) -> None:
    """Wait until a run armed with a ``hold`` fault writes ``marker``, do ``act``, then delete
    the marker so the run goes on and meets what ``act`` did. ``process``: the run, when a
    child, so that one that fails first is reported instead of waited for."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process is not None:
            assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never reached the fault point"
        time.sleep(0.1)
    try:
        act()
    finally:
        marker.unlink()


def stored_records(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """What the database holds of the example's records, commit-independent: each table's
    (key, content hash, payload) rows sorted, and the rejects' (line, raw text, reasons)."""
    with connect(url) as conn:
        stored = {
            table: conn.execute(
                f'SELECT _idempotency_key, _content_hash, _payload::text FROM idem.{table_name(table)} ORDER BY 1'
            ).fetchall()
            for table in RECORD_TABLES
        }
        stored["rejects"] = conn.execute("SELECT line, raw, reasons::text FROM idem.rejects ORDER BY 1, 2").fetchall()
    return stored


def leftovers(url: str) -> dict[str, Any]:
    """What a finished run may not leave behind: staging tables, advisory locks, ledger rows
    not committed."""
    with connect(url) as conn:
        return {
            "staging_tables": conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone()[0],  # type: ignore[index]
            "advisory_locks": conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND d.datname = current_database()"
            ).fetchone()[0],  # type: ignore[index]
            "unfinished": conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE status <> 'committed'").fetchone()[0],  # type: ignore[index]
        }
