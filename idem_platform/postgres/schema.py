"""Versioned DDL for the ``idem`` schema, applied at start-up under an advisory lock.

Each file in ``sql/`` is one version (``NNN_name.sql``), applied once, in order,
inside one transaction that first takes a transaction-level advisory lock: two
processes starting at once (the webserver's code server and a CLI call, say)
serialise here, and the second finds the versions already applied.
"""

from __future__ import annotations

from importlib import resources

import psycopg

from idem_platform.contract.catalog import table_name

SCHEMA = "idem"
STAGING_SCHEMA = "idem_staging"
DDL_LOCK_ID = 0x1DE_5C4E  # pg_advisory_xact_lock key for all idem DDL


def migrations() -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` of every packaged DDL file, in version order."""
    folder = resources.files("idem_platform.postgres") / "sql"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version, _, name = entry.name.removesuffix(".sql").partition("_")
            found.append((int(version), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def ensure_schema(conn: psycopg.Connection) -> list[int]:
    """Create or upgrade the ``idem`` schema; return the versions applied now.

    Runs in its own transaction on ``conn`` (which must not be inside one).
    """
    applied_now: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_ID])
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute(f"SELECT version FROM {SCHEMA}.schema_migrations")}
        for version, name, sql in migrations():
            if version in done:
                continue
            conn.execute(sql)
            conn.execute(
                f"INSERT INTO {SCHEMA}.schema_migrations (version, name) VALUES (%s, %s)",
                [version, name],
            )
            applied_now.append(version)
    return applied_now


def qualified_table_name(record_type: str) -> str:
    """``idem.<table>`` of a record type (``idem.threat_actor`` for ``threat-actor``): the
    table's real name, which needs no quoting (Dagster's ``dagster/table_name``, messages)."""
    return f"{SCHEMA}.{table_name(record_type)}"
