"""The read path's decoding: every catalog type comes back as PostgreSQL holds it, and a
read that PostgreSQL refuses or loses fails as a PostgreSQL error, on the driver or in an
executor (the read is a binary ``COPY`` decoded by the ADBC driver, not psycopg)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC
from typing import Any

import psycopg
import pytest

from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.pipeline.commit import as_idem_error
from idem_platform.postgres import connect
from idem_platform.read import read_table
from idem_platform.read.decode import read_rows
from idem_platform.read.planner import plan_read
from idem_platform.read.source import source_frame
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.ingest import ingest_records

HOSTILE = 'a "quoted", comma\nnew line \\ back slash \t tab ✓ ünïcödé 𝄞'
INDICATORS = [
    {
        "type": "indicator", "id": "i1", "name": HOSTILE, "confidence": -2147483648, "score": 1e-300,
        "created": "2026-01-02T03:04:05.123456Z", "embedding": [1, -2.5, 3.4e38, -3.4e38, 0, 1e-30, 0.1, 7],
        "tags": {"nested": [1, "x", None, {"k": "ü"}]}, "active": True,
    },
    {"type": "indicator", "id": "i2", "name": "", "confidence": 2147483647, "score": -0.0, "active": False, "tags": []},
    {"type": "indicator", "id": "i3", "name": "nulls", "embedding": None, "created": None, "tags": None},
    {"type": "indicator", "id": "i4", "name": "extra", "unknown_field": {"goes": "to an evolved column"}, "score": 12345678.875},
]
MALWARE = [
    {"type": "malware", "id": "m1", "name": "long max", "sample_size": 9223372036854775807, "is_packed": True},
    {"type": "malware", "id": "m2", "name": "long min", "sample_size": -9223372036854775808, "first_seen": "1970-01-01T00:00:00Z"},
]


@pytest.fixture(scope="module")
def config(pg_url: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> IdemConfig:
    config = write_config(tmp_path_factory.mktemp("read_types"))
    ingest_records(pg_url, config, spark, "threatfeed", "types.ndjson", INDICATORS + MALWARE)
    return config


def _same(stored: Any, read: Any, kind: str) -> bool:
    if stored is None or read is None:
        return stored is None and read is None
    if kind == "json":
        return json.loads(read) == stored
    if kind == "vector":
        return len(read) == len(stored) and all(math.isclose(a, b, rel_tol=1e-7) for a, b in zip(read, stored, strict=True))
    if kind == "timestamp":  # Spark hands back naive datetimes in the session's time zone, UTC
        return bool(stored == (read if read.tzinfo else read.replace(tzinfo=UTC)))
    if kind == "text" and not isinstance(stored, str):
        return str(stored) == read  # the commit id: a uuid, read as its text
    return bool(stored == read)


@pytest.mark.parametrize("record_type", ["indicator", "malware"])
def test_every_type_reads_back_as_postgresql_holds_it(config: IdemConfig, pg_url: str, spark: Any, record_type: str) -> None:
    read = read_table(spark, pg_url, config, record_type)
    frame_rows = {row["_external_id"]: row.asDict() for row in read.frame.collect()}
    assert read.plan is not None
    columns = [c for c in read.plan.columns if c.present]
    names = ", ".join(f'"{c.name}"' for c in columns)
    with connect(pg_url) as conn:
        stored = conn.execute(f'SELECT {names} FROM idem.{table_name(record_type)}').fetchall()
    assert len(stored) == len(frame_rows) == (4 if record_type == "indicator" else 2)
    for values in stored:
        row = frame_rows[values[columns.index(next(c for c in columns if c.name == "_external_id"))]]
        for column, value in zip(columns, values, strict=True):
            assert _same(value, row[column.name], column.kind), (column.name, value, row[column.name])
    if record_type == "indicator":
        assert frame_rows["i1"]["name"] == HOSTILE and frame_rows["i2"]["name"] == ""  # empty is not null
        assert frame_rows["i1"]["confidence"] == -2147483648 and frame_rows["i1"]["active"] is True
        assert json.loads(frame_rows["i4"]["unknown_field"]) == {"goes": "to an evolved column"}  # evolved: a dynamic column
        assert frame_rows["i1"]["created"].isoformat() == "2026-01-02T03:04:05.123456"
    else:
        assert {r["sample_size"] for r in frame_rows.values()} == {9223372036854775807, -9223372036854775808}


def test_a_read_postgresql_refuses_or_cannot_serve_fails_as_a_postgresql_error(
    config: IdemConfig, pg_url: str, spark: Any
) -> None:
    plan, _ = plan_read(pg_url, config, "indicator")
    gone = replace(plan, record_type="no_such_type")  # as if the table was dropped after planning
    with pytest.raises(psycopg.errors.UndefinedTable, match='relation "idem.no_such_type" does not exist'):
        list(read_rows(gone, 0, plan.arrow_schema()))
    with pytest.raises(psycopg.OperationalError, match="127.0.0.1"):
        list(read_rows(replace(plan, url="postgresql://postgres@127.0.0.1:1/none"), 0, plan.arrow_schema()))
    with pytest.raises(Exception) as raised:  # the same, inside a Spark task
        source_frame(spark, gone).collect()
    error = as_idem_error(raised.value)
    assert str(error).startswith("PostgreSQL: UndefinedTable:") and "no_such_type" in str(error)

