"""Killing a run at the right moment: once it stages rows, or at an armed fault point."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from idem_platform.postgres import connect


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
