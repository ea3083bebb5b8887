"""``idem read``'s lines rendered in process (rows that need no migration, no Spark) are byte
for byte those of the Spark read: every catalog type, nulls, ``props``, evolved and retyped
columns, unicode, ``--commit``, ``--limit`` and a read cut into several partitions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from idem_platform.config import IdemConfig
from idem_platform.postgres.retype import retype_column
from idem_platform.read.planner import plan_read
from idem_platform.read.render import lines_in_process
from idem_platform.read.source import source_frame
from idem_platform.read.table import TableRead, read_lines
from idem_platform.read.upgrade import KEEP, RAISE
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.ingest import ingest_records

HOSTILE = 'a "quoted", comma\nnew line \\ back slash \t tab ✓ ünïcödé 𝄞 \u2028 \u00a0'
RECORDS: list[Any] = [
    {
        "type": "indicator", "id": "i1", "name": HOSTILE, "confidence": -2147483648, "score": 1e-300,
        "created": "2026-01-02T03:04:05.123456Z", "embedding": [1, -2.5, 3.4e38, -3.4e38, 0, 1e-30, 0.1, 7],
        "tags": {"nested": [1, "x", None, {"k": "ü"}], "big": 123456789012345678901234567890}, "active": True,
        "level": "7", "seen": "2026-03-04T05:06:07Z",
    },
    {"type": "indicator", "id": "i2", "name": "", "confidence": 2147483647, "score": -0.0, "active": False, "tags": []},
    {"type": "indicator", "id": "i3", "name": "nulls", "embedding": None, "created": "2026-01-31T11:00:00.500Z", "tags": None},
    {"type": "indicator", "id": "i4", "name": "props", "xmin": 1, "PROPS": {"a": [1.5, "é"]}, "_own": None, "level": "high"},
    {"type": "indicator", "id": "i5", "name": "zero fraction", "created": "2026-01-31T11:00:00Z", "score": 12345678.875},
    {"type": "malware", "id": "m1", "name": "long max", "sample_size": 9223372036854775807, "is_packed": True},
    {"type": "malware", "id": "m2", "name": "long min", "sample_size": -9223372036854775808, "first_seen": "1970-01-01T00:00:00Z"},
    '{"type": "malware", "id": "m3", "name": "numbers as sent", "extra": 1.000000000000000005, "tiny": 1e-999}',
]


@pytest.fixture(scope="module")
def config(pg_url: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> IdemConfig:
    config = write_config(tmp_path_factory.mktemp("read_lines"))
    ingest_records(pg_url, config, spark, "threatfeed", "lines-1.ndjson", RECORDS[:5])
    ingest_records(pg_url, config, spark, "threatfeed", "lines-2.ndjson", RECORDS[5:])
    # A retyped column: its typed value where it casts ("7"), else its text ("high").
    retype_column(pg_url, config.table_specs["indicator"], "level", "long")
    return config


def spark_lines(spark: Any, plan: Any, mode: str) -> list[str | None]:
    """The Spark read's lines of ``plan`` (one Spark job per partition, as ``idem read`` runs it)."""
    read = TableRead(source_frame(spark, plan, mode), plan.record_type, plan.current_version, {}, None, plan, spark)
    return list(read_lines(read, skip_failed=mode == KEEP))


@pytest.mark.parametrize("record_type", ["indicator", "malware"])
def test_lines_in_process_are_the_spark_reads_byte_for_byte(
    config: IdemConfig, pg_url: str, spark: Any, record_type: str
) -> None:
    plan, counts = plan_read(pg_url, config, record_type, ordered=True)
    assert set(counts) == {plan.current_version}  # nothing to migrate: the in-process case
    here = list(lines_in_process(plan, RAISE))
    assert here == spark_lines(spark, plan, RAISE)
    assert len(here) == (5 if record_type == "indicator" else 3) and all(here)
    rows = {row["_external_id"]: row for row in map(json.loads, here)}
    if record_type == "indicator":
        assert rows["i1"]["name"] == HOSTILE and rows["i2"]["name"] == ""
        assert rows["i1"]["level"] == 7 and rows["i4"]["level"] == "high"  # retyped: typed, else text
        assert set(rows["i4"]["props"]) == {"xmin", "PROPS", "_own"}
        assert rows["i3"]["created"] == "2026-01-31T11:00:00.5+00:00"
        assert rows["i5"]["created"] == "2026-01-31T11:00:00+00:00"
        assert rows["i1"]["tags"]["big"] == 123456789012345678901234567890
    else:
        assert {r["sample_size"] for r in rows.values()} >= {9223372036854775807, -9223372036854775808}


def test_commit_limit_keep_mode_and_several_partitions_read_the_same_lines(
    config: IdemConfig, pg_url: str, spark: Any
) -> None:
    plan, _ = plan_read(pg_url, config, "indicator", ordered=True)
    everything = list(lines_in_process(plan))
    commit = json.loads(everything[0])["_commit_id"]
    middle = json.loads(everything[2])
    cut = replace(plan, bounds=((middle["_ingested_at"], middle["_idempotency_key"]),))  # two ranges
    limited, _ = plan_read(pg_url, config, "indicator", ordered=True, limit=2)
    one_commit, _ = plan_read(pg_url, config, "indicator", ordered=True, commit_id=commit)
    for case in (cut, limited, one_commit):
        assert list(lines_in_process(case, KEEP)) == spark_lines(spark, case, KEEP)
    assert list(lines_in_process(cut)) == everything and cut.partitions == 2
    assert list(lines_in_process(limited)) == everything[:2]
    missing = replace(plan, exists=False, bounds=())  # a table not created yet: no lines either way
    assert list(lines_in_process(missing)) == spark_lines(spark, missing, RAISE) == []


def test_idem_read_prints_the_same_lines_without_spark(
    config: IdemConfig, pg_url: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from idem_platform.cli import main

    assert config.source is not None
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("IDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    plan, _ = plan_read(pg_url, config, "indicator", ordered=True)
    assert main(["--config", str(config.source), "read", "indicator"]) == 0
    out, err = capsys.readouterr()
    assert out.split("\n") == [*spark_lines(spark, plan, RAISE), ""]  # not splitlines: a line may hold U+2028
    assert json.loads(err.splitlines()[-1]) == {"record_type": "indicator", "rows": 5}
    assert main(["--config", str(config.source), "read", "indicator", "--skip-failed-migrations"]) == 0
    summary = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert summary == {"record_type": "indicator", "rows": 5, "current_version": 1, "rows_by_version": {"1": 5}, "skipped": 0}
