"""Table names: a record type with ``-`` has a table spelt with ``_`` (``idem.threat_actor``),
and a table an earlier version named after the record type itself (``idem."threat-actor"``)
is renamed when first met (the sync before a commit, a read, a retype), rows, index and key included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import SYSTEM_COLUMNS, TableSpec, commit_index_name, table_name
from idem_platform.errors import ConfigError
from idem_platform.postgres import connect
from idem_platform.postgres.retype import retype_column
from idem_platform.postgres.tables import (
    adopt_legacy_tables,
    existing_columns,
    record_catalog,
    sync_tables,
)
from idem_platform.read.planner import plan_read
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.ingest import ingest, ingest_records

ACTORS = [
    {"type": "threat-actor", "id": "ta-1", "name": "Cozy Bear", "aliases": ["apt29"], "sophistication": 5},
    {"type": "threat-actor", "id": "ta-2", "name": "Fancy Bear", "observed_count": 3},
    {"type": "indicator", "id": "ioc-1", "name": "bad.example", "confidence": 80},
]
LONG = "a-" + "b" * 61  # 63 characters: its _commit_id index name is a head and a digest


def _old_create(conn: psycopg.Connection, spec: TableSpec) -> None:
    """The table as the version before this one created it: named after the record type,
    quoted (``idem."threat-actor"``), with its ``_commit_id`` index named from the record
    type too. The primary key is PostgreSQL's name for it (``threat-actor_pkey``)."""
    table = sql.Identifier("idem", spec.record_type)
    parts: list[sql.Composable] = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(ddl)) for n, ddl in SYSTEM_COLUMNS]
    parts += [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type.postgres)) for c in spec.columns]
    parts.append(sql.SQL("props jsonb"))
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(", ").join(parts)))
    conn.execute(
        sql.SQL("CREATE INDEX {} ON {} (_commit_id)").format(sql.Identifier(commit_index_name(spec.record_type)), table)
    )


def _relations(url: str, record_type: str) -> dict[str, str]:
    """``{name: kind}`` of the relations in schema idem named from ``record_type``'s table, old or new."""
    heads = {record_type[:40], table_name(record_type)[:40]}
    found = rows(
        url,
        "SELECT c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'idem' AND EXISTS (SELECT 1 FROM unnest(%s::text[]) h WHERE starts_with(c.relname, h))",
        sorted(heads),
    )
    return dict(found)  # type: ignore[arg-type]


def _primary_key(url: str, table: str) -> str:
    """The name of the primary key of ``idem.<table>`` (quoted: it may be an old name)."""
    return str(
        rows(url, "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
             f'idem."{table}"')[0][0]
    )


@pytest.fixture
def config(tmp_path: Path, pg_url: str) -> IdemConfig:
    """The example config on an emptied database, no table created yet."""
    reset_database(pg_url)
    return write_config(tmp_path)


def test_a_record_type_with_a_dash_gets_a_table_no_query_quotes(pg_url: str, config: IdemConfig) -> None:
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    assert _relations(pg_url, "threat-actor") == {
        "threat_actor": "r", "threat_actor_commit_id": "i", "threat_actor_pkey": "i",
    }
    assert rows(pg_url, "SELECT count(*) FROM idem.threat_actor") == [(0,)]  # unquoted
    # idem.catalog (and every key) keeps the record type as written.
    assert rows(pg_url, "SELECT record_type FROM idem.catalog WHERE starts_with(record_type, 'threat')") == [("threat-actor",)]


def test_a_read_renames_an_old_table_before_any_commit(pg_url: str, config: IdemConfig) -> None:
    spec = config.table_specs["threat-actor"]
    with connect(pg_url, autocommit=True) as conn:
        _old_create(conn, spec)
        record_catalog(conn, spec)  # the previous version wrote it beside the table
        conn.execute(
            """INSERT INTO idem."threat-actor" (_idempotency_key, _connector, _record_type, _external_id,
               _content_hash, _schema_version, _commit_id, _ingested_at, _payload, name)
               VALUES ('threatfeed:threat-actor:ta-9:0123456789ab', 'threatfeed', 'threat-actor', 'ta-9',
                       '0123456789ab', 1, gen_random_uuid(), now(), '{}', 'old row')"""
        )
    assert set(_relations(pg_url, "threat-actor")) == {"threat-actor", "threat-actor_commit_id", "threat-actor_pkey"}
    # `idem read threat-actor` (and the table assets' IO manager) plan here: the table is found.
    plan, counts = plan_read(pg_url, config, "threat-actor")
    assert plan.exists and counts == {1: 1}
    assert _relations(pg_url, "threat-actor") == {
        "threat_actor": "r", "threat_actor_commit_id": "i", "threat_actor_pkey": "i",
    }
    assert _primary_key(pg_url, "threat_actor") == "threat_actor_pkey"
    assert rows(pg_url, "SELECT _external_id, name FROM idem.threat_actor") == [("ta-9", "old row")]
    with connect(pg_url, autocommit=True) as conn:  # renamed once: nothing left to do
        assert adopt_legacy_tables(conn, ["threat-actor"]) == [] and existing_columns(conn, "threat-actor")["name"] == "text"


def test_a_retype_renames_an_old_table_before_any_commit(pg_url: str, config: IdemConfig) -> None:
    spec = config.table_specs["threat-actor"]
    with connect(pg_url, autocommit=True) as conn:
        _old_create(conn, spec)
        conn.execute('ALTER TABLE idem."threat-actor" ADD COLUMN rank text')  # added by evolution back then
        record_catalog(conn, spec)
        conn.execute(
            """INSERT INTO idem."threat-actor" (_idempotency_key, _connector, _record_type, _external_id,
               _content_hash, _schema_version, _commit_id, _ingested_at, _payload, name, rank)
               VALUES ('k', 'threatfeed', 'threat-actor', 't', 'h', 1, gen_random_uuid(), now(), '{}', 'n', '7')"""
        )
    report = retype_column(pg_url, spec, "rank", "long")
    assert report["rows_retyped"] == 1
    assert rows(pg_url, "SELECT rank, _rank__long FROM idem.threat_actor") == [("7", 7)]
    assert "threat-actor" not in _relations(pg_url, "threat-actor")


def test_a_long_record_types_index_gets_the_digest_of_its_new_name(pg_url: str, config: IdemConfig) -> None:
    long_spec = TableSpec(LONG, 1, config.table_specs["threat-actor"].columns)
    with connect(pg_url, autocommit=True) as conn:
        _old_create(conn, long_spec)
    old_key = _primary_key(pg_url, LONG)  # PostgreSQL's name for it: the table's head and _pkey
    assert set(_relations(pg_url, LONG)) == {LONG, commit_index_name(LONG), old_key}
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, {LONG: long_spec})
    long_table = table_name(LONG)
    assert _primary_key(pg_url, long_table) == old_key.replace("-", "_")
    assert _relations(pg_url, LONG) == {long_table: "r", commit_index_name(long_table): "i", old_key.replace("-", "_"): "i"}
    assert commit_index_name(long_table) != commit_index_name(LONG).replace("-", "_")  # a digest of the new name


def test_rows_committed_into_an_old_table_are_never_written_twice(
    pg_url: str, config: IdemConfig, spark: Any
) -> None:
    first = ingest_records(pg_url, config, spark, "threatfeed", "first.ndjson", ACTORS)
    assert first["tables"]["threat-actor"]["written"] == 2
    # Back to the previous version's layout: the same rows, in the table of the old name.
    spec = config.table_specs["threat-actor"]
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE idem.threat_actor RENAME TO moved_aside")
        conn.execute("ALTER INDEX idem.threat_actor_commit_id RENAME TO moved_aside_commit_id")
        _old_create(conn, spec)
        conn.execute('INSERT INTO idem."threat-actor" SELECT * FROM idem.moved_aside')
        conn.execute("DROP TABLE idem.moved_aside")
    stored = rows(pg_url, 'SELECT _idempotency_key FROM idem."threat-actor" ORDER BY 1')
    assert len(stored) == 2
    # One record sent again as it was, one new: the ingest's reconciliation renames the table first.
    second = ingest_records(
        pg_url, config, spark, "threatfeed", "second.ndjson",
        [ACTORS[0], {"type": "threat-actor", "id": "ta-3", "name": "Lazarus"}],
    )
    assert (second["tables"]["threat-actor"]["written"], second["tables"]["threat-actor"]["skipped"]) == (1, 1)
    assert rows(pg_url, "SELECT to_regclass('idem.\"threat-actor\"')") == [(None,)]
    keys = rows(pg_url, "SELECT _idempotency_key, _external_id FROM idem.threat_actor ORDER BY _external_id")
    assert [k[1] for k in keys] == ["ta-1", "ta-2", "ta-3"] and [(k[0],) for k in keys[:2]] == stored
    assert keys[0][0].startswith("threatfeed:threat-actor:ta-1:")  # the key keeps the record type as received
    # The first file again is a replay: nothing new anywhere.
    again = ingest(pg_url, config, spark, Path(str(config.connector("threatfeed").path)) / "first.ndjson")
    assert again["replayed"] is True and again["rows_written"] == 0
    assert rows(pg_url, "SELECT count(*), count(DISTINCT _external_id) FROM idem.threat_actor") == [(3, 3)]


def test_a_table_under_both_names_is_refused_not_merged(pg_url: str, config: IdemConfig) -> None:
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
        _old_create(conn, config.table_specs["threat-actor"])
        assert adopt_legacy_tables(conn, ["threat-actor"]) == []  # which holds the rows is the operator's call
        with pytest.raises(ConfigError) as caught:
            sync_tables(conn, config.table_specs)
    message = str(caught.value)
    assert "record type 'threat-actor'" in message
    assert 'idem."threat-actor"' in message and "idem.threat_actor exist" in message
    assert set(_relations(pg_url, "threat-actor")) >= {"threat-actor", "threat_actor"}
