"""The test database: emptied between tests, queried for what a test checks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.postgres import connect, ensure_schema
from idem_platform.postgres.tables import sync_tables
from idem_platform_tests.helpers.config import write_config


@contextmanager
def scratch_database(server_url: str, database: str) -> Iterator[str]:
    """A new database ``database`` on the server of ``server_url``, with the idem schema: its
    URL (URL form: Dagster needs URLs), dropped on the way out (``WITH (FORCE)``: a child
    process still connected does not keep it)."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    parts = urlsplit(server_url)
    url = urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))
    with connect(url, autocommit=True) as conn:
        ensure_schema(conn)
    try:
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


def reset_database(url: str) -> None:
    """Drop the record tables and empty idem's own tables: each test starts from nothing."""
    with connect(url, autocommit=True) as conn:
        # Views first (an upsert table's idem.<type>_current): they depend on the tables.
        for (name,) in conn.execute("SELECT viewname FROM pg_views WHERE schemaname = 'idem'").fetchall():
            conn.execute(sql.SQL("DROP VIEW idem.{}").format(sql.Identifier(name)))
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'idem' AND tablename <> 'schema_migrations'"
        ).fetchall()
        own = {"ingest_ledger", "commits", "source_offsets", "rejects", "execution_log", "catalog", "outbox"}
        for (name,) in tables:
            ident = sql.SQL("idem.{}").format(sql.Identifier(name))
            if name in own:
                conn.execute(sql.SQL("TRUNCATE {}").format(ident))
            else:
                conn.execute(sql.SQL("DROP TABLE {}").format(ident))
        for (name,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'idem_staging'").fetchall():
            conn.execute(sql.SQL("DROP TABLE idem_staging.{}").format(sql.Identifier(name)))


def rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Every row ``query`` returns (a fresh connection: what another client would see)."""
    with connect(url) as conn:
        return conn.execute(query, list(params)).fetchall()


def fresh_config(directory: Path, url: str, text: str | None = None) -> IdemConfig:
    """``text`` (default: the example's file drop) as ``directory``'s idem.yaml, on an emptied
    database with its tables synced: where each test of the write path starts, so that no
    test sees another's rows or tables."""
    reset_database(url)
    config = write_config(directory, text)
    with connect(url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    return config
