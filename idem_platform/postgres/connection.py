"""Where PostgreSQL is: ``IDEM_POSTGRES_URL``, else an embedded server under ``.idem/``.

The embedded server comes from the ``pgserver`` wheel: a real PostgreSQL 16 that
listens on a Unix socket only (nothing to secure, no port to collide). It is
started with ``cleanup_mode=None`` so it outlives the process that started it
(``idem dev``, the demo and the next CLI call reattach to it).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psycopg

POSTGRES_URL_ENV = "IDEM_POSTGRES_URL"
HOME_ENV = "IDEM_HOME"
_EMBEDDED_SETTINGS = {
    # One ingest commit writes ~1 GB of WAL per million rows; the default
    # max_wal_size (1 GB) would force checkpoints in the middle of every commit.
    "max_wal_size": "8GB",
    "checkpoint_timeout": "15min",
    "max_connections": "200",
}


def idem_home() -> Path:
    """``$IDEM_HOME`` or ``./.idem``: the embedded server, Dagster home and sample drops."""
    return Path(os.environ.get(HOME_ENV) or ".idem").resolve()


def embedded_postgres_url(home: Path | None = None) -> str:
    """Start (or reattach to) the embedded server under ``<home>/pg`` and return its URL."""
    import pgserver  # imported lazily: only the embedded default needs it

    data_dir = (home or idem_home()) / "pg"
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data_dir, cleanup_mode=None)
    url: str = server.get_uri()
    _tune_embedded(url)
    return url


def _tune_embedded(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        current = dict(
            conn.execute(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s)",
                [list(_EMBEDDED_SETTINGS)],
            ).fetchall()
        )
        changed = False
        for name, value in _EMBEDDED_SETTINGS.items():
            if name == "max_connections":
                continue  # needs a restart; applied by ALTER SYSTEM for the next start
            if current.get(name) != value:
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                changed = True
        if int(str(current.get("max_connections", "0"))) < int(_EMBEDDED_SETTINGS["max_connections"]):
            conn.execute(f"ALTER SYSTEM SET max_connections = {_EMBEDDED_SETTINGS['max_connections']}")
        if changed:
            conn.execute("SELECT pg_reload_conf()")


def resolve_postgres_url(url: str | None = None) -> str:
    """The URL to use: an explicit one, else ``$IDEM_POSTGRES_URL``, else the embedded server."""
    return url or os.environ.get(POSTGRES_URL_ENV) or embedded_postgres_url()


def is_unix_socket_url(url: str) -> bool:
    """Whether a libpq URL reaches its server through a Unix socket (no TCP host)."""
    parsed = urlparse(url)
    hosts = parse_qs(parsed.query).get("host", [])
    host = hosts[0] if hosts else (parsed.hostname or "")
    return host == "" or host.startswith("/")


def connect(url: str, *, autocommit: bool = False, application_name: str = "idem") -> psycopg.Connection:
    """A psycopg 3 connection with a recognisable ``application_name`` in ``pg_stat_activity``."""
    return psycopg.connect(url, autocommit=autocommit, application_name=application_name)
