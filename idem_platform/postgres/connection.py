"""Connections to PostgreSQL (where the URL comes from: :mod:`idem_platform.postgres.embedded`)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def is_unix_socket_url(url: str) -> bool:
    """Whether a libpq URL reaches its server through a Unix socket (no TCP host)."""
    parsed = urlparse(url)
    hosts = parse_qs(parsed.query).get("host", [])
    host = hosts[0] if hosts else (parsed.hostname or "")
    return host == "" or host.startswith("/")


# TCP keepalives on every connection: a run's advisory locks and its applying
# transaction live on connections that may sit idle while Spark stages, and a
# peer that vanished (a dropped NAT entry, a crashed host) must be noticed in
# about a minute, not after the kernel's two hours. Settings in the URL win.
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}


def connect(url: str, *, autocommit: bool = False, application_name: str = "idem") -> psycopg.Connection:
    """A psycopg 3 connection with a recognisable ``application_name`` in ``pg_stat_activity``
    and TCP keepalives (ignored by libpq on Unix sockets)."""
    given = conninfo_to_dict(url)
    extra = {k: v for k, v in KEEPALIVES.items() if k not in given}
    # Merged into the conninfo first (what psycopg.connect does with extra keywords anyway):
    # connect's named keywords (row_factory, context...) are not strings.
    conninfo = make_conninfo(url, **extra)
    return psycopg.connect(conninfo, autocommit=autocommit, application_name=application_name)
