"""Where PostgreSQL is: ``IDEM_POSTGRES_URL``, else the embedded server under ``.idem/``
(:mod:`idem_platform.postgres.embedded`)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psycopg

POSTGRES_URL_ENV = "IDEM_POSTGRES_URL"
HOME_ENV = "IDEM_HOME"


def idem_home() -> Path:
    """``$IDEM_HOME`` or ``./.idem``: the embedded server, Dagster home and sample drops."""
    return Path(os.environ.get(HOME_ENV) or ".idem").resolve()


def embedded_postgres_url(home: Path | None = None) -> str:
    """Start (or reattach to) the embedded server (:mod:`idem_platform.postgres.embedded`)."""
    from idem_platform.postgres.embedded import embedded_postgres_url as start

    return start(home)


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
