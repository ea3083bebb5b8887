"""The idem schema's versioned DDL (concurrent start-up) and the widen-only record tables."""

from __future__ import annotations

import multiprocessing

import pytest

from idem_platform.contract.catalog import Column, ColumnType, TableSpec
from idem_platform.errors import ConfigError
from idem_platform.postgres import connect, ensure_schema
from idem_platform.postgres.schema import migrations
from idem_platform.postgres.tables import existing_columns, sync_tables
from idem_platform_tests.helpers.database import reset_database


def _ensure(url: str) -> list[int]:
    with connect(url, autocommit=True) as conn:
        return ensure_schema(conn)


def test_schema_is_versioned_and_safe_from_two_processes_at_once(pg_url: str) -> None:
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA idem CASCADE")
        conn.execute("DROP SCHEMA IF EXISTS idem_staging CASCADE")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        applied = pool.map(_ensure, [pg_url, pg_url])
    versions = [v for v, _, _ in migrations()]
    assert sorted(applied, key=len) == [[], versions]  # exactly one process applied them
    with connect(pg_url) as conn:
        assert [r[0] for r in conn.execute("SELECT version FROM idem.schema_migrations")] == versions
    assert _ensure(pg_url) == []


def _spec(*columns: Column) -> dict[str, TableSpec]:
    return {"thing": TableSpec("thing", 1, columns)}


def test_tables_are_created_and_widened_never_narrowed(pg_url: str) -> None:
    reset_database(pg_url)
    name = Column("name", ColumnType.parse("string"), required=True)
    emb = Column("emb", ColumnType.parse("vector(4)"))
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, _spec(name))
        sync_tables(conn, _spec(name, emb))
        columns = existing_columns(conn, "thing")
        assert columns["emb"] == "real[]" and columns["_idempotency_key"] == "text"
        effective = sync_tables(conn, _spec(emb))  # 'name' left the config: kept in PostgreSQL
        assert "name" in existing_columns(conn, "thing")
        assert [c.name for c in effective["thing"].columns] == ["emb", "name"]  # still filled (text)
        with pytest.raises(ConfigError, match="column 'emb' of table idem.thing is real\\[\\] in PostgreSQL but int"):
            sync_tables(conn, _spec(Column("emb", ColumnType.parse("int"))))
        (catalog,) = conn.execute("SELECT columns FROM idem.catalog WHERE record_type = 'thing'").fetchone()
        assert {c["name"] for c in catalog} == {"emb", "name"}
