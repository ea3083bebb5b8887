"""The write path end to end on real PostgreSQL and Spark: typed rows, replays, skips, rejects, evolution."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.errors import FileChangedError, RejectRatioExceeded
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.ingest import ingest

LINES = [
    '{"type":"indicator","id":"ioc-1","name":"bad.example","confidence":80,"score":0.5,'
    '"created":"2026-01-31T12:00:00.5+01:00","embedding":[1,2,3,4,5,6,7,8.5],"tags":{"b":1,"a":[1]},"active":true}',
    '{"type":"malware","id":7,"name":"emotet","sample_size":12345678901,"first_seen":1700000000000000000,'
    '"is_packed":false,"labels":["x"],"family":"loader"}',
    '{"type":"threat-actor","id":"ta-1","name":"Cozy Bear é","aliases":["apt29"],"sophistication":5,'
    '"score":9.5,"last_seen":"2026-01-01T00:00:00Z","observed_count":3}',
    "",
    "not json at all",
    '{"type":"indicator","id":"ioc-2","name":"x","confidence":3000000000}',
    '{"type":"indicator","id":"ioc-1","name":"bad.example","confidence":80,"score":0.5,'
    '"created":"2026-01-31T12:00:00.5+01:00","embedding":[1,2,3,4,5,6,7,8.5],"tags":{"b":1,"a":[1]},"active":true}',
]


@pytest.fixture
def drop(threatfeed: IdemConfig) -> Path:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    return write_lines(connector.path / "first.ndjson", LINES)


def test_first_ingest_writes_typed_rows(pg_url: str, threatfeed: IdemConfig, spark: Any, drop: Path) -> None:
    summary = ingest(pg_url, threatfeed, spark, drop)
    # 6 non-blank lines: 3 distinct good records + 1 repeat (skipped) + 2 rejects.
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (3, 1, 2)
    assert summary["replayed"] is False
    indicator = rows(
        pg_url,
        "SELECT name, confidence, score, created, embedding, tags, active, _source, _schema_version, "
        "_commit_id::text, _payload FROM idem.indicator",
    )
    assert len(indicator) == 1
    name, confidence, score, created, embedding, tags, active, source, version, commit_id, payload = indicator[0]
    assert (name, confidence, score, active, version) == ("bad.example", 80, 0.5, True, 1)
    assert created.isoformat() == "2026-01-31T11:00:00.500000+00:00"
    assert embedding == [1, 2, 3, 4, 5, 6, 7, 8.5]
    assert tags == {"a": [1], "b": 1}
    assert source.endswith("#L1") and commit_id == summary["commit_id"]
    assert payload["embedding"][-1] == 8.5
    malware = rows(pg_url, "SELECT _external_id, sample_size, first_seen, is_packed, labels FROM idem.malware")
    assert malware[0][0] == "7" and malware[0][1] == 12345678901
    assert malware[0][2].isoformat() == "2023-11-14T22:13:20+00:00" and malware[0][4] == ["x"]
    actor = rows(pg_url, 'SELECT name, aliases, sophistication, observed_count FROM idem.threat_actor')
    assert actor == [("Cozy Bear é", ["apt29"], 5, 3)]
    rejects = rows(pg_url, "SELECT source, position, line, raw, reasons FROM idem.rejects ORDER BY line")
    assert [r[2] for r in rejects] == [5, 6]
    assert rejects[0][0] == summary["files"][0]["key"] and rejects[0][1].endswith("#L5")
    assert rejects[1][4] == [
        {"field": "confidence", "rule": "range", "message": "field 'confidence': 3000000000 out of int32 range"}
    ]
    log = dict(rows(pg_url, "SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s", summary["commit_id"]))
    assert log == {"written": 3, "idempotent_skip": 1, "rejected": 2}
    ledger = rows(pg_url, "SELECT status, result->>'commit_id' FROM idem.ingest_ledger")
    assert ledger == [("committed", summary["commit_id"])]
    assert rows(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'") == [(0,)]


def test_replay_of_a_committed_file_writes_nothing_and_needs_no_spark(
    pg_url: str, threatfeed: IdemConfig, spark: Any, drop: Path
) -> None:
    first = ingest(pg_url, threatfeed, spark, drop)
    again = ingest(pg_url, threatfeed, spark, drop, use_spark=False)
    assert again["replayed"] is True and again["rows_written"] == 0
    assert again["rows_skipped"] == 6
    assert again["prior"] == {
        "commit_id": first["commit_id"], "rows_written": 3, "rows_skipped": 1, "rows_rejected": 2,
    }
    log = dict(rows(pg_url, "SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s", again["commit_id"]))
    assert log == {"replay_skip": 6}
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator") == [(1,)]
    assert rows(pg_url, "SELECT replay FROM idem.commits ORDER BY committed_at") == [(False,), (True,)]


def test_same_records_in_a_new_file_are_all_skipped(pg_url: str, threatfeed: IdemConfig, spark: Any, drop: Path) -> None:
    ingest(pg_url, threatfeed, spark, drop)
    copy = drop.with_name("copy.ndjson")
    copy.write_bytes(drop.read_bytes() + b"\n")  # other bytes, other file key, same records
    summary = ingest(pg_url, threatfeed, spark, copy)
    assert summary["replayed"] is False
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (0, 4, 2)
    log = dict(rows(pg_url, "SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s", summary["commit_id"]))
    assert log == {"idempotent_skip": 4, "rejected": 2}
    replay_tagged = ingest(pg_url, threatfeed, spark, drop.with_name("copy2.ndjson") if write_lines(drop.with_name("copy2.ndjson"), LINES[:3]) else drop, replay=True)
    log = dict(rows(pg_url, "SELECT event_type, count FROM idem.execution_log WHERE commit_id = %s", replay_tagged["commit_id"]))
    assert log == {"replay_skip": 3}


def test_every_record_counted_once_on_a_generated_feed(pg_url: str, threatfeed: IdemConfig, spark: Any) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    lines = list(threatfeed_lines(3000, seed=5, duplicate_ratio=0.1, bad_ratio=0.02))
    path = write_lines(connector.path / "feed.ndjson", lines)
    summary = ingest(pg_url, threatfeed, spark, path)
    assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == len(lines)
    distinct_good = {
        line for line in lines if line.startswith('{"type": "') and '"unknown-type"' not in line and "bad-" not in line
    }
    assert summary["rows_written"] == len(distinct_good)
    stored = sum(rows(pg_url, f'SELECT count(*) FROM idem.{table_name(t)}')[0][0] for t in ("indicator", "malware", "threat-actor"))
    assert stored == summary["rows_written"]


def test_schema_evolution_adds_text_columns_and_keeps_the_rest_in_props(
    pg_url: str, threatfeed: IdemConfig, spark: Any
) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    many = {f"extra_{i:02d}": i for i in range(40)}
    first = {"type": "threat-actor", "id": "ta-8", "name": "n", "zone": "emea"}
    second = {"type": "threat-actor", "id": "ta-9", "name": "n", "Bad-Name": 1, **many}
    path = write_lines(connector.path / "evolve.ndjson", [json.dumps(first), json.dumps(second)])
    summary = ingest(pg_url, threatfeed, spark, path)
    assert summary["rows_written"] == 2
    # At most 32 new columns per batch, taken in order of first appearance (then by name).
    added = summary["tables"]["threat-actor"]["new_columns"]
    assert added == ["zone"] + [f"extra_{i:02d}" for i in range(31)]
    props = rows(pg_url, """SELECT props FROM idem.threat_actor WHERE _external_id = 'ta-9'""")[0][0]
    assert props == {"Bad-Name": 1, **{f"extra_{i:02d}": i for i in range(31, 40)}}
    assert rows(pg_url, """SELECT zone, extra_00 FROM idem.threat_actor ORDER BY _external_id""") == [
        ("emea", None),
        (None, "0"),
    ]
    columns = rows(pg_url, "SELECT columns FROM idem.catalog WHERE record_type = 'threat-actor'")[0][0]
    assert {"name": "zone", "type": "string", "required": False, "evolved": True} in columns
    # The next batch sees region as a column already and fills it directly.
    later = write_lines(
        connector.path / "evolve2.ndjson", [json.dumps({"type": "threat-actor", "id": "ta-10", "name": "m", "zone": "apac"})]
    )
    assert ingest(pg_url, threatfeed, spark, later)["tables"]["threat-actor"]["new_columns"] == []
    assert rows(pg_url, """SELECT zone FROM idem.threat_actor WHERE _external_id = 'ta-10'""") == [("apac",)]


def test_reject_ratio_above_the_limit_commits_nothing(pg_url: str, tmp_path: Path, spark: Any) -> None:
    from idem_platform.postgres.tables import sync_tables
    from idem_platform_tests.helpers.config import example_text, write_config
    from idem_platform_tests.helpers.database import reset_database

    reset_database(pg_url)
    text = example_text().replace("max_reject_ratio: 1.0", "max_reject_ratio: 0.2")
    config = write_config(tmp_path, text)
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    connector = config.connector("threatfeed")
    assert connector.path is not None
    path = write_lines(connector.path / "bad.ndjson", LINES)
    with pytest.raises(RejectRatioExceeded, match=r"2 of 6 records rejected .* line is not valid JSON"):
        ingest(pg_url, config, spark, path)
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator") == [(0,)]
    assert rows(pg_url, "SELECT count(*) FROM idem.commits") == [(0,)]
    (status, error) = rows(pg_url, "SELECT status, error FROM idem.ingest_ledger")[0]
    assert status == "failed" and error["class"] == "RejectRatioExceeded" and error["retryable"] is False
    assert rows(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'") == [(0,)]


def test_a_file_changed_after_hashing_commits_nothing(pg_url: str, threatfeed: IdemConfig, spark: Any, drop: Path) -> None:
    connector = threatfeed.connector("threatfeed")
    batch = pipeline.plan_batch(pg_url, connector, [drop])
    data = drop.read_bytes()
    drop.write_bytes(data.replace(b"bad.example", b"bad.exampl3"))  # same size, other bytes

    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, threatfeed, connector))
    request = run.CommitRequest(url=pg_url, connector=connector, run_id="test")
    with pytest.raises(FileChangedError, match="changed since it was hashed"):
        run.commit_batch(request, coerced, lambda: spark)
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator") == [(0,)]
    (status, error) = rows(pg_url, "SELECT status, error FROM idem.ingest_ledger")[0]
    assert status == "failed" and error["retryable"] is True


def test_the_lazy_frames_show_exactly_what_was_committed(
    pg_url: str, threatfeed: IdemConfig, spark: Any, drop: Path
) -> None:
    """The ``ingest`` and ``coerced`` assets' frames (read by the Python data source, coerced
    by mapInArrow) hold the same keys and rejects as the committed tables."""
    from idem_platform.sources.filedrop import batch_of_files, hash_file

    summary = ingest(pg_url, threatfeed, spark, drop)
    connector = threatfeed.connector("threatfeed")
    batch = batch_of_files("threatfeed", [hash_file(drop)], {})
    lines = pipeline.records_frame(spark, batch, connector)
    assert lines.count() == len(LINES)
    frame = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, threatfeed, connector)).frame(spark)
    coerced = frame.select("_idempotency_key", "_errors").toArrow().to_pylist()
    assert len(coerced) == 6  # the blank line is not a record
    assert sum(1 for r in coerced if r["_errors"]) == summary["rows_rejected"]
    stored = {
        key
        for table in ("indicator", "malware", "threat-actor")
        for (key,) in rows(pg_url, f'SELECT _idempotency_key FROM idem.{table_name(table)}')
    }
    assert {r["_idempotency_key"] for r in coerced if r["_idempotency_key"]} == stored



@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["0 bytes", "blank lines"])
def test_an_empty_file_commits_nothing_and_is_recorded(
    pg_url: str, threatfeed: IdemConfig, spark: Any, content: bytes
) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    connector.path.mkdir(parents=True, exist_ok=True)
    path = connector.path / "empty.ndjson"
    path.write_bytes(content)
    # A 0-byte file has no split to read: no Spark at all.
    summary = ingest(pg_url, threatfeed, spark, path, use_spark=bool(content))
    assert (summary["rows_written"], summary["rows_skipped"], summary["rows_rejected"]) == (0, 0, 0)
    assert summary["commit_id"] and summary["replayed"] is False
    assert rows(pg_url, "SELECT status FROM idem.ingest_ledger") == [("committed",)]
    again = ingest(pg_url, threatfeed, spark, path, use_spark=False)
    assert again["replayed"] is True


def test_a_lone_surrogate_is_a_reject_wherever_it_stands(pg_url: str, threatfeed: IdemConfig, spark: Any) -> None:
    """JSON allows "\\ud800"; Unicode text does not. Such a record is a reject, at line 1 as at line
    5,000, and the file's other records commit."""
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    good = list(threatfeed_lines(5_000, seed=44, duplicate_ratio=0.0))
    hostile = [
        '{"type":"malware","id":"s-value","name":"bad \\ud800 name"}',
        '{"type":"malware","id":"s-\\udfff","name":"bad id"}',
        '{"type":"indicator","id":"s-key","name":"x","tags":{"\\ud800":1}}',
    ]
    path = write_lines(connector.path / "surrogates.ndjson", [hostile[0], *good[:4_997], *hostile[1:], good[4_997]])
    summary = ingest(pg_url, threatfeed, spark, path)
    assert (summary["rows_written"], summary["rows_rejected"]) == (4_998, 3)
    rejected = rows(pg_url, "SELECT line, reasons FROM idem.rejects ORDER BY line")
    assert [line for line, _ in rejected] == [1, 4_999, 5_000]
    assert all(r[0]["rule"] == "surrogate" and "lone surrogate" in r[0]["message"] for _, r in rejected)


def test_names_postgresql_keeps_for_itself_never_reach_ddl(pg_url: str, threatfeed: IdemConfig, spark: Any) -> None:
    """A field named like a PostgreSQL system column (``ALTER TABLE … ADD COLUMN xmin``
    fails) goes to ``props``; the reserved names are PostgreSQL's own list and idem's own tables."""
    from idem_platform.contract.catalog import POSTGRES_SYSTEM_COLUMNS, RESERVED_TABLE_NAMES

    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    # Hostile names besides: SQL, spaces, system and reserved names in any case, names a
    # column has in another case, 63 (the limit), 64 and 300 characters, non-ASCII.
    hostile = {
        "xmin": 1, "ctid": "x", "tableoid": 2, "Robert'); DROP TABLE x;--": 3, "a b": 4,
        "_idempotency_key": "forged", "PROPS": 5, "props": 6, "b" * 64: 7, "c" * 300: 8,
        "Score": 9.5, "Zone": "Z", "naïve": "é",
    }
    safe = {"fresh": "y", "a" * 63: "sixty-three", "zone": "z", "select": "s", "user": "u"}
    record = {"type": "indicator", "id": "sys-1", "name": "n", "score": 0.5, **hostile, **safe}
    summary = ingest(
        pg_url, threatfeed, spark, write_lines(connector.path / "sys.ndjson", [json.dumps(record, ensure_ascii=False)])
    )
    # Evolution adds the safe names only (in name order: they come from one row).
    assert summary["rows_written"] == 1 and summary["tables"]["indicator"]["new_columns"] == sorted(safe)
    wanted = sql.SQL(", ").join(sql.Identifier(name) for name in ["props", "score", "_idempotency_key", *safe])
    with connect(pg_url) as conn:
        props, score, key, *values = conn.execute(
            sql.SQL("SELECT {} FROM idem.indicator WHERE _external_id = 'sys-1'").format(wanted)
        ).fetchone()
    assert props == hostile and score == 0.5 and key.startswith("threatfeed:indicator:sys-1:")
    assert dict(zip(safe, values, strict=True)) == safe
    # Each field that went to props is in the commit's table stats with why.
    reasons = summary["tables"]["indicator"]["props_fields"]
    assert set(reasons) == set(hostile)
    assert reasons["xmin"] == "a PostgreSQL system column name"
    assert reasons["_idempotency_key"] == "starts with '_', kept for idem's own columns"
    assert reasons["props"] == "idem's own column"
    assert reasons["PROPS"] == "has capitals: PostgreSQL folds names, it would meet 'props'"
    assert reasons["c" * 300] == "longer than PostgreSQL's 63-byte names"
    assert all(reasons.values())
    system = {r[0] for r in rows(pg_url, "SELECT attname FROM pg_attribute WHERE attrelid = 'idem.indicator'::regclass AND attnum < 0")}
    assert system and system <= POSTGRES_SYSTEM_COLUMNS
    own = {
        r[0]
        for r in rows(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'idem'")
        if r[0] not in {table_name(t) for t in threatfeed.table_specs}
    }
    assert own == RESERVED_TABLE_NAMES


def test_reserved_names_are_postgresqls_own(pg_url: str) -> None:
    """The catalog's list of PostgreSQL's system columns and its identifier limit are the
    server's own: ``pg_attribute`` (attnum < 0) and ``max_identifier_length`` (NAMEDATALEN - 1)."""
    from idem_platform.contract.catalog import (
        MAX_IDENTIFIER_BYTES,
        POSTGRES_SYSTEM_COLUMNS,
        is_safe_column_name,
    )

    system = {r[0] for r in rows(pg_url, "SELECT attname FROM pg_attribute WHERE attrelid = 'pg_class'::regclass AND attnum < 0")}
    assert system and system <= POSTGRES_SYSTEM_COLUMNS
    assert POSTGRES_SYSTEM_COLUMNS - system <= {"oid"}  # a system column before PostgreSQL 12
    assert not any(is_safe_column_name(name) for name in POSTGRES_SYSTEM_COLUMNS)
    assert rows(pg_url, "SHOW max_identifier_length") == [(str(MAX_IDENTIFIER_BYTES),)]
    assert is_safe_column_name("a" * MAX_IDENTIFIER_BYTES) and not is_safe_column_name("a" * (MAX_IDENTIFIER_BYTES + 1))


def test_nul_in_a_line_or_a_value_is_that_records_reject(pg_url: str, threatfeed: IdemConfig, spark: Any) -> None:
    """PostgreSQL's text and jsonb refuse U+0000. A line with a literal 0x00 byte, or a string
    "\\u0000" in a typed text column, a ``dynamic`` value or a key, is that record's reject
    with its reason (its raw text storable), never a failed batch; the rest commit."""
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    good = list(threatfeed_lines(3, seed=46, duplicate_ratio=0.0))
    hostile = [  # (line, its rule)
        ('{"type":"indicator","id":"n-byte","name":"a\x00b"}', "json"),
        ("\x00", "json"),
        ('{"type":"malware","id":"n-text","name":"a\\u0000b","family":"f"}', "nul"),
        ('{"type":"indicator","id":"n-dyn","name":"x","tags":{"k":["\\u0000"]}}', "nul"),
        ('{"type":"indicator","id":"n-key","name":"x","\\u0000":1}', "nul"),
    ]
    path = connector.path / "nul.ndjson"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("\n".join([good[0], *(line for line, _ in hostile), *good[1:]]).encode() + b"\n")
    summary = ingest(pg_url, threatfeed, spark, path)
    assert (summary["rows_written"], summary["rows_rejected"]) == (3, len(hostile))
    rejected = rows(pg_url, "SELECT line, raw, reasons FROM idem.rejects ORDER BY line")
    assert [line for line, _, _ in rejected] == list(range(2, 2 + len(hostile)))
    assert [reasons[0]["rule"] for _, _, reasons in rejected] == [rule for _, rule in hostile]
    assert rejected[0][1] == '{"type":"indicator","id":"n-byte","name":"a\\x00b"}'  # the byte, shown escaped
    assert rejected[2][1] == hostile[2][0]  # the JSON escape is plain text
    assert "NUL" in rejected[2][2][0]["message"]
