"""The embedded default: a real PostgreSQL from the ``pgserver`` wheel under ``.idem/pg``.

It listens on a Unix socket only (nothing to secure, no port to collide) and is
started with ``cleanup_mode=None`` so it outlives the process that started it:
``idem dev``, the demo and the next CLI call reattach to it, and
:func:`stop_embedded` (``make stop-postgres``) stops it.

pgserver starts PostgreSQL with its stock settings, sized for a laptop in 2000
(128 MB of shared buffers). One ingest commit writes ~1 GB of heap, index and
WAL per million records, so the server is tuned on first use: settings that a
reload applies take effect at once; those that need a restart
(``shared_buffers``, ``max_connections``) are applied by restarting the server
right away, but only while no other client is connected to it. A server that
other sessions are using keeps running as it is and picks them up at its next
start.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import psycopg

from idem_platform.errors import EmbeddedPostgresError
from idem_platform.settings import idem_home, postgres_url_from_environment

if TYPE_CHECKING:
    from pgserver import PostgresServer

_log = logging.getLogger(__name__)

# Reload-time settings. One commit writes ~1 GB of WAL per million rows; the
# default max_wal_size (1 GB) would force checkpoints in the middle of every commit.
RELOAD_SETTINGS = {
    "max_wal_size": "8GB",
    "checkpoint_timeout": "15min",
}
# Restart-time settings. 1 GB of shared buffers holds a million-record commit's
# heap and index pages (the apply then evicts nothing to the OS mid-insert:
# 7 % less apply time at 1M records here); 200 connections leave room for
# Dagster's webserver and daemon beside a run's executors.
PG_CTL_WAIT_SECONDS = 300  # how long pg_ctl waits for the server to stop or start
SETTLE_SECONDS = 1.0  # for the backends of connections just closed to leave (see embedded_postgres_url)
OWN_APPLICATION = "idem-embedded-tuning"  # the tuning's own connections, never counted as another client
RESTART_SETTINGS = {
    "shared_buffers": "1GB",
    "max_connections": "200",
}


def data_dir(home: Path | None = None) -> Path:
    """Where the embedded server keeps its data (``<home>/pg``)."""
    return (home or idem_home()) / "pg"


def _pgserver() -> ModuleType:
    """``pgserver``, imported lazily (only the embedded default needs it) and quietly: at import
    it asks platformdirs for a runtime directory it never uses, and platformdirs warns on
    every command where ``XDG_RUNTIME_DIR`` is unset (root shells, containers, CI)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        try:
            import pgserver
        except ImportError:  # an optional dependency: pgserver has no build for every Python
            raise EmbeddedPostgresError(
                "the embedded PostgreSQL needs the pgserver package, which is not installed (it has no "
                f"build for Python {sys.version_info.major}.{sys.version_info.minor}): set "
                "IDEM_POSTGRES_URL to a PostgreSQL server"
            ) from None

    return pgserver


def resolve_postgres_url(url: str | None = None) -> str:
    """The URL to use: an explicit one, else ``$IDEM_POSTGRES_URL``, else the embedded server."""
    return url or postgres_url_from_environment() or embedded_postgres_url()


def embedded_postgres_url(home: Path | None = None) -> str:
    """Start (or reattach to) the embedded server under ``<home>/pg``, tuned; return its URL."""
    pgserver = _pgserver()

    directory = data_dir(home)
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(directory, cleanup_mode=None)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise _start_failed(directory, "start", error) from None
    url: str = server.get_uri()
    # A connection closed just before leaves pg_stat_activity a moment later, longer on a
    # loaded machine: the tuning's own are not counted, others (pgserver's) get a moment;
    # before, a fresh server could be seen as shared and keep PostgreSQL's stock settings.
    if _tune(url) and alone(url, settle_seconds=SETTLE_SECONDS):
        _restart(server)
    return url


def _tune(url: str) -> bool:
    """Apply :data:`RELOAD_SETTINGS` now and record :data:`RESTART_SETTINGS`; whether a restart is due.

    Values are written the way ``SHOW`` prints them, so comparing texts is exact.
    """
    wanted = {**RELOAD_SETTINGS, **RESTART_SETTINGS}
    restart = reload = False
    with psycopg.connect(url, autocommit=True, application_name=OWN_APPLICATION) as conn:
        for name, value in wanted.items():
            row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
            if row is not None and row[0] == value:
                continue
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            if name in RESTART_SETTINGS:
                restart = True
            else:
                reload = True
        if reload:
            conn.execute("SELECT pg_reload_conf()")
    return restart


def alone(url: str, *, settle_seconds: float = 0.0) -> bool:
    """Whether no other client (a webserver, a run, another CLI call) is connected.

    ``settle_seconds``: how long to wait for other backends to leave: those of clients that
    have just disconnected do within it; a client that is really connected stays.
    """
    deadline = time.monotonic() + settle_seconds
    with psycopg.connect(url, autocommit=True, application_name=OWN_APPLICATION) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid() AND application_name IS DISTINCT FROM %s",
                [OWN_APPLICATION],
            ).fetchone()
            if row is not None and row[0] == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _pg_ctl(args: list[str], server: PostgresServer) -> None:
    """Run ``pg_ctl`` through pgserver's own wrapper (exported at its top level), which runs
    it as the server's user."""
    # pgserver makes one wrapper per binary at import (setattr on its _commands module, then
    # a star import): its package declares no pg_ctl, so it is reached on the module object.
    _pgserver().pg_ctl(args, pgdata=server.pgdata, user=server.system_user)


def _restart(server: PostgresServer) -> None:
    """Restart the server for :data:`RESTART_SETTINGS`, waiting up to :data:`PG_CTL_WAIT_SECONDS`
    (pg_ctl's own default, 60 s, is short for a shutdown checkpoint on a loaded machine)."""
    _log.info("restarting the embedded PostgreSQL to apply %s", ", ".join(RESTART_SETTINGS))
    try:
        _pg_ctl(["-w", "-t", str(PG_CTL_WAIT_SECONDS), "-m", "fast", "restart"], server)
    except subprocess.CalledProcessError as error:
        raise _start_failed(Path(server.pgdata), "restart", error) from None


def _start_failed(directory: Path, action: str, error: BaseException) -> EmbeddedPostgresError:
    """One line saying the embedded server did not ``action``, with its log's last words."""
    log = directory / "log"
    try:
        tail = " | ".join(line.strip() for line in log.read_text(errors="replace").splitlines()[-5:] if line.strip())
    except OSError:
        tail = ""
    said = f"; its log ({log}) ends: {tail}" if tail else ""
    return EmbeddedPostgresError(
        f"the embedded PostgreSQL in {directory} did not {action} ({type(error).__name__}: {error}){said}; "
        "or set IDEM_POSTGRES_URL to a PostgreSQL server"
    )


def stop_embedded(home: Path | None = None) -> bool:
    """Stop the embedded server under ``<home>/pg`` if it runs; whether it was running."""
    directory = data_dir(home)
    pid_file = directory / "postmaster.pid"
    if not pid_file.exists():
        return False
    server = _pgserver().get_server(directory, cleanup_mode=None)
    _pg_ctl(["-w", "-t", str(PG_CTL_WAIT_SECONDS), "-m", "fast", "stop"], server)
    # pgserver keeps one handle per data directory and process, and would hand the stopped
    # server back to this process's next start: let go of it (with no cleanup mode,
    # ``cleanup`` only forgets the handle; the server is already stopped).
    server.cleanup()
    return True
