"""`idem retype`: typed companions of evolved text columns, their backfill, new writes and reads.

Real PostgreSQL, the real ingest path on Spark, the CLI in process and the Dagster job.
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from idem_platform.cli import main
from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import (
    MAX_IDENTIFIER_BYTES,
    RETYPE_KINDS,
    is_safe_column_name,
    table_name,
    typed_column_name,
)
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.postgres.retype import (
    RetypeLockTimeout,
    RetypeRefused,
    human_report,
    reference_cast,
    retype_column,
)
from idem_platform.samples import write_lines

MALWARE = [
    # score: clean longs (42, "17" a numeric string, 3.0 an integral float) and unclean ones
    {"type": "malware", "id": "m1", "name": "a", "score": 42, "seen": "2026-01-31T12:00:00.5+01:00", "flagged": True, "weight": 0.5},
    {"type": "malware", "id": "m2", "name": "b", "score": "17", "seen": "not a time", "flagged": "yes", "weight": "1e3"},
    {"type": "malware", "id": "m3", "name": "c", "score": "n/a", "seen": 1700000000000000000, "flagged": False, "weight": "heavy"},
    {"type": "malware", "id": "m4", "name": "d", "score": 3.5, "seen": "2026-02-30T00:00:00Z", "weight": -2},
    {"type": "malware", "id": "m5", "name": "e", "score": 9223372036854775808, "seen": "2026-01-31t12:00:00.1234565z"},
    {"type": "malware", "id": "m6", "name": "f", "score": 3.0},
    {"type": "malware", "id": "m7", "name": "g"},  # no score: its text is null, nothing to retype
]


def ingest(url: str, config: IdemConfig, spark: Any, path: Path, tables: dict[str, Any] | None = None) -> dict[str, Any]:
    """The write path as the job runs it (``tables``: a catalog read earlier, as a run planned then)."""
    connector = config.connector("threatfeed")
    batch = pipeline.plan_batch(url, connector, [path])
    coerced = pipeline.CoercedBatch(batch, connector, tables or pipeline.current_tables(url, config, connector))
    request = run.CommitRequest(url=url, connector=connector, run_id="test", replay=False)
    return run.commit_batch(request, coerced, lambda: spark)


def drop(config: IdemConfig, name: str, records: list[dict[str, Any]]) -> Path:
    directory = config.connector("threatfeed").path
    assert directory is not None
    return write_lines(directory / name, [json.dumps(r) for r in records])


def rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(url) as conn:
        return conn.execute(query, list(params)).fetchall()


def by_id(url: str, column: str, table: str = "malware") -> dict[str, Any]:
    return dict(rows(url, f'SELECT _external_id, "{column}" FROM idem.{table_name(table)} ORDER BY _external_id'))


def key(url: str, ext_id: str) -> str:
    return rows(url, "SELECT _idempotency_key FROM idem.malware WHERE _external_id = %s", ext_id)[0][0]


@pytest.fixture
def evolved(env: IdemConfig, pg_url: str, spark: Any) -> IdemConfig:
    """The malware records ingested: score, seen, flagged and weight evolved as text columns."""
    summary = ingest(pg_url, env, spark, drop(env, "m.ndjson", MALWARE))
    assert (summary["rows_written"], summary["rows_rejected"]) == (7, 0)
    assert set(summary["tables"]["malware"]["new_columns"]) == {"score", "seen", "flagged", "weight"}
    return env


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.strip()], err


# --- the rules


def test_companion_names_are_idems_own_and_fit_postgresql() -> None:
    assert typed_column_name("score", "long") == "_score__long"
    names = set()
    for name in ("score", "a" * 51, "a" * 52, "a" * 63, "b" * 63, "x_" * 31):
        for kind in RETYPE_KINDS:
            typed = typed_column_name(name, kind)
            assert len(typed.encode()) <= MAX_IDENTIFIER_BYTES and typed.startswith("_")
            assert not is_safe_column_name(typed)  # no field can ever evolve into it
            names.add(typed)
    assert len(names) == 6 * len(RETYPE_KINDS)


def test_safe_casts_match_the_ingest_converters(pg_url: str) -> None:
    """idem.promote_<kind> (SQL) against reference_cast (the converters on the text read as JSON)."""
    corpus = [
        "42", "-0", "0", "3.0", "3.5", "1e3", "1E3", "1e-400", "-1e-400", "1e400", "9223372036854775807",
        "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "9.2233720368547758e18",
        "007", "+1", ".5", "5.", " 42", "abc", "", "true", "false", "True", "null", '"42"', "[1]", '{"a":1}',
        "1.7976931348623157e308", "1.7976931348623159e308", "5e-324", "2.4703282292062328e-324", "-0.0",
        "1e9999999", "1e-9999999", "1" * 400, "0." + "0" * 400 + "1", "12345678901234567890123",
        "2026-01-31T12:00:00Z", "2026-01-31T12:00:00.5+01:00", "2026-01-31t12:00:00z", "2026-01-31 12:00:00Z",
        "2026-02-29T00:00:00Z", "2024-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z",
        "2026-01-31T24:00:00Z", "2026-01-31T23:59:60Z", "2026-01-31T12:00:00", "2026-01-31T12:00:00+24:00",
        "2026-01-31T12:00:00+23:59", "2026-01-31T12:00:00+15:59", "2026-01-31T12:00:00.1234565Z",
        "2026-01-31T12:00:00.1234564999Z", "1677-09-21T00:12:43.145224192Z", "1677-09-21T00:12:43.145224191Z",
        "2262-04-11T23:47:16.854775807Z", "2262-04-11T23:47:16.854775808Z", "0000-01-01T00:00:00Z",
        "1700000000000000000", "-1500", "-1499", "1.7e18", "2026-01-31", "٢٠٢٦-01-31T12:00:00Z",
        "1969-12-31T23:59:59.9999995Z",
    ]
    generator = random.Random(15)
    for _ in range(400):
        corpus += [
            repr(generator.uniform(-1e6, 1e6)),
            str(generator.randint(-(2**64), 2**64)),
            f"{generator.randint(1, 9)}.{generator.randint(0, 10**17)}e{generator.randint(-330, 330)}",
            f"{generator.randint(1600, 2300):04d}-{generator.randint(1, 12):02d}-{generator.randint(1, 31):02d}"
            f"{generator.choice('Tt ')}{generator.randint(0, 23):02d}:{generator.randint(0, 59):02d}:"
            f"{generator.randint(0, 59):02d}.{generator.randint(0, 10**9 - 1):0{generator.randint(1, 9)}d}"
            f"{generator.choice(['Z', 'z', '+05:30', '-11:59', '+16:00'])}",
        ]
    with connect(pg_url) as conn:
        conn.execute("SET TimeZone = 'America/New_York'")  # the session's zone never matters
        for kind in RETYPE_KINDS:
            got = conn.execute(f"SELECT v, idem.promote_{kind}(v) FROM unnest(%s::text[]) v", [corpus]).fetchall()
            wrong = [(v, g, reference_cast(kind, v)) for v, g in got if repr(g) != repr(reference_cast(kind, v))]
            wrong = [(v, g, want) for v, g, want in wrong if not (isinstance(g, datetime) and g == want)]
            assert wrong == [], kind
    assert reference_cast("long", "17") == 17 and reference_cast("long", "3.0") == 3
    assert reference_cast("long", "3.5") is None and reference_cast("long", "9223372036854775808") is None
    assert reference_cast("real", "1e3") == 1000.0 and reference_cast("real", "heavy") is None
    assert reference_cast("bool", "true") is True and reference_cast("bool", "yes") is None
    assert reference_cast("timestamp", "2026-01-31T12:00:00.5+01:00") == datetime(2026, 1, 31, 11, 0, 0, 500000, UTC)
    assert reference_cast("timestamp", "1700000000000000000") == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


# --- retype, backfill, report, read


def test_retype_to_long_backfills_reports_and_reads_coalesced(
    evolved: IdemConfig, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines, err = cli(capsys, "retype", "malware", "score", "--to", "long")
    assert code == 0, err
    (report,) = [json.loads(line) for line in lines]
    assert report["typed_column"] == "_score__long" and report["added"] is True
    assert (report["rows_retyped"], report["rows_not_cast"], report["batches"]) == (3, 3, 1)
    assert report["rows_promoted"] == 3  # the key's former name, still emitted until the next release
    unclean = {"m3": "n/a", "m4": "3.5", "m5": "9223372036854775808"}
    assert report["not_cast_examples"] == sorted(
        ({"_idempotency_key": key(pg_url, i), "value": v} for i, v in unclean.items()),
        key=lambda e: e["_idempotency_key"],
    )
    # The typed companion holds the clean values; the text column keeps every value.
    assert by_id(pg_url, "_score__long") == {"m1": 42, "m2": 17, "m3": None, "m4": None, "m5": None, "m6": 3, "m7": None}
    assert by_id(pg_url, "score") == {
        "m1": "42", "m2": "17", "m3": "n/a", "m4": "3.5", "m5": "9223372036854775808", "m6": "3.0", "m7": None,
    }
    columns = rows(pg_url, "SELECT columns FROM idem.catalog WHERE record_type = 'malware'")[0][0]
    assert {
        "name": "score", "type": "string", "required": False, "evolved": True,
        "promoted_to": "long", "promoted_column": "_score__long",
    } in columns
    assert not any(c["name"] == "_score__long" for c in columns)

    # idem read: the typed value where there is one, else the text; the companion is not shown twice.
    code, lines, err = cli(capsys, "read", "malware")
    assert code == 0, err
    read = {row["_external_id"]: row for row in map(json.loads, lines)}
    assert {i: row["score"] for i, row in read.items()} == {
        "m1": 42, "m2": 17, "m3": "n/a", "m4": "3.5", "m5": "9223372036854775808", "m6": 3, "m7": None,
    }
    assert all("_score__long" not in row for row in read.values())
    assert read["m1"]["seen"] == "2026-01-31T12:00:00.5+01:00"  # not retyped: its text, as before

    # Again: nothing to add, nothing left to retype (the unclean rows are looked at again).
    code, lines, err = cli(capsys, "retype", "malware", "score", "--to", "long")
    again = json.loads(lines[0])
    assert code == 0 and again["added"] is False
    assert (again["rows_retyped"], again["rows_not_cast"]) == (0, 3)
    assert "already there" in human_report(again) and "0 rows retyped" in human_report(again)


def test_new_writes_fill_the_companion_and_an_unclean_value_is_no_reject(
    evolved: IdemConfig, pg_url: str, spark: Any
) -> None:
    connector = evolved.connector("threatfeed")
    # A run that planned before the retype (its catalog has no companion) and a
    # record type whose column a concurrent run adds, then retyped, before this one commits.
    stale = pipeline.current_tables(pg_url, evolved, connector)
    late = drop(evolved, "late.ndjson", [
        {"type": "malware", "id": "n1", "name": "x", "score": 7},
        {"type": "malware", "id": "n2", "name": "y", "score": "seven"},
        {"type": "threat-actor", "id": "t1", "name": "z", "rank": "5"},
    ])
    first = ingest(pg_url, evolved, spark, drop(evolved, "rank.ndjson", [{"type": "threat-actor", "id": "t0", "name": "r", "rank": 1}]))
    assert first["tables"]["threat-actor"]["new_columns"] == ["rank"]
    retype_column(pg_url, evolved.table_specs["malware"], "score", "long")
    rank = retype_column(pg_url, evolved.table_specs["threat-actor"], "rank", "long")
    assert (rank["typed_column"], rank["rows_retyped"]) == ("_rank__long", 1)

    summary = ingest(pg_url, evolved, spark, late, tables=stale)
    assert (summary["rows_written"], summary["rows_rejected"]) == (3, 0)
    assert by_id(pg_url, "_score__long")["n1"] == 7 and by_id(pg_url, "_score__long")["n2"] is None
    assert by_id(pg_url, "score")["n2"] == "seven"
    # rank reached this commit through _extra (its plan had no such column): filled all the same.
    assert by_id(pg_url, "_rank__long", "threat-actor") == {"t0": 1, "t1": 5}

    fresh = ingest(pg_url, evolved, spark, drop(evolved, "fresh.ndjson", [
        {"type": "malware", "id": "n3", "name": "w", "score": "-12"},
        {"type": "malware", "id": "n4", "name": "v", "score": [1]},
    ]))
    assert (fresh["rows_written"], fresh["rows_rejected"]) == (2, 0)
    assert {k: v for k, v in by_id(pg_url, "_score__long").items() if k in ("n3", "n4")} == {"n3": -12, "n4": None}
    assert by_id(pg_url, "score")["n4"] == "[1]"
    # Nothing left for a backfill: new rows came in typed.
    again = retype_column(pg_url, evolved.table_specs["malware"], "score", "long")
    assert again["rows_retyped"] == 0 and again["rows_not_cast"] == 5


def test_timestamp_bool_and_real_retypes(evolved: IdemConfig, pg_url: str) -> None:
    spec = evolved.table_specs["malware"]
    seen = retype_column(pg_url, spec, "seen", "timestamp")
    assert (seen["typed_column"], seen["rows_retyped"], seen["rows_not_cast"]) == ("_seen__timestamp", 3, 2)
    assert {e["value"] for e in seen["not_cast_examples"]} == {"not a time", "2026-02-30T00:00:00Z"}
    assert by_id(pg_url, "_seen__timestamp") == {
        "m1": datetime(2026, 1, 31, 11, 0, 0, 500000, UTC),
        "m2": None,
        "m3": datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
        "m4": None,
        "m5": datetime(2026, 1, 31, 12, 0, 0, 123457, UTC),  # nanoseconds rounded half up, as ingest does
        "m6": None,
        "m7": None,
    }
    flagged = retype_column(pg_url, spec, "flagged", "bool")
    assert (flagged["rows_retyped"], flagged["rows_not_cast"]) == (2, 1)
    assert flagged["not_cast_examples"][0]["value"] == "yes"
    assert {k: v for k, v in by_id(pg_url, "_flagged__bool").items() if v is not None} == {"m1": True, "m3": False}
    weight = retype_column(pg_url, spec, "weight", "real")
    assert (weight["rows_retyped"], weight["rows_not_cast"]) == (3, 1)
    assert {k: v for k, v in by_id(pg_url, "_weight__real").items() if v is not None} == {"m1": 0.5, "m2": 1000.0, "m4": -2.0}
    columns = {c["name"]: c for c in rows(pg_url, "SELECT columns FROM idem.catalog WHERE record_type = 'malware'")[0][0]}
    assert {n: columns[n].get("promoted_to") for n in ("seen", "flagged", "weight", "score")} == {
        "seen": "timestamp", "flagged": "bool", "weight": "real", "score": None,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("retype", "malware", "family", "--to", "long"),
         "column 'family' of idem.malware is declared in idem.yaml (string), not evolved: declared columns change in "
         "idem.yaml, only evolved text columns are retyped"),
        (("retype", "malware", "nope", "--to", "long"),
         "idem.malware has no column 'nope' (its evolved text columns: flagged, score, seen, weight)"),
        (("retype", "malware", "_payload", "--to", "long"),
         "column '_payload' of idem.malware is one of idem's own (jsonb), not an evolved text column"),
        (("retype", "nope", "score", "--to", "long"), "unknown record type 'nope' (known: indicator, malware, threat-actor)"),
        (("retype", "indicator", "score", "--to", "long"),
         "column 'score' of idem.indicator is declared in idem.yaml (real), not evolved"),
        (("retype", "malware", "score", "--to", "long", "--batch-rows", "0"), "--batch-rows must be at least 1 (got 0)"),
    ],
)
def test_refusals_are_one_line(
    evolved: IdemConfig, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, lines, err = cli(capsys, *argv)
    assert code == 1 and lines == []
    assert len(err.strip().splitlines()) == 1 and err.strip().startswith(f"idem: error: {message}")


def test_a_retyped_column_is_not_retyped_to_another_type(evolved: IdemConfig, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "retype", "malware", "score", "--to", "long")[0] == 0
    code, _, err = cli(capsys, "promote", "malware", "score", "--to", "real")  # the former name, an alias
    assert code == 1 and err.strip() == (
        "idem: error: column 'score' of idem.malware is already retyped to long (column _score__long); "
        "a column is retyped once, not to real"
    )
    assert "_score__real" not in {r[0] for r in rows(pg_url, "SELECT attname FROM pg_attribute WHERE attrelid = 'idem.malware'::regclass")}


def test_backfill_runs_in_batches_and_resumes_after_an_interruption(evolved: IdemConfig, pg_url: str) -> None:
    spec = evolved.table_specs["malware"]
    seen: list[str] = []

    def interrupt(line: str) -> None:  # the process dies after its first batch committed
        seen.append(line)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        retype_column(pg_url, spec, "score", "long", batch_rows=2, progress=interrupt)
    assert len(seen) == 1 and "batch 1: 2 retyped, 0 did not cast" in seen[0]
    assert sum(v is not None for v in by_id(pg_url, "_score__long").values()) == 2  # batch 1 is committed

    lines: list[str] = []
    rest = retype_column(pg_url, spec, "score", "long", batch_rows=2, progress=lines.append)
    # 4 rows were left (1 clean, 3 unclean): two batches of 2, then an empty look.
    assert (rest["added"], rest["rows_retyped"], rest["rows_not_cast"], rest["batches"]) == (False, 1, 3, 2)
    assert len(lines) == 2
    assert by_id(pg_url, "_score__long") == {"m1": 42, "m2": 17, "m3": None, "m4": None, "m5": None, "m6": 3, "m7": None}
    # A row whose companion was lost (or never filled) is found again by the next run.
    rows_ = rows(pg_url, "UPDATE idem.malware SET _score__long = NULL WHERE _external_id = 'm1' RETURNING 1")
    assert rows_ == [(1,)]
    assert retype_column(pg_url, spec, "score", "long", batch_rows=2)["rows_retyped"] == 1


def test_the_column_is_added_in_short_tries_and_gives_up_cleanly(evolved: IdemConfig, pg_url: str) -> None:
    """A long reader holding the table: each ALTER try waits 2 s at most (new readers wait
    no longer behind it), the retype gives up after its lock timeout having changed
    nothing, and, tried again, succeeds once the reader is gone."""
    spec = evolved.table_specs["malware"]
    holding = threading.Event()
    release = threading.Event()

    def reader() -> None:
        with connect(pg_url) as conn, conn.transaction():
            conn.execute("SELECT count(*) FROM idem.malware")  # ACCESS SHARE until COMMIT
            holding.set()
            release.wait(60)

    thread = threading.Thread(target=reader)
    thread.start()
    outcome: list[Any] = []
    retyper = threading.Thread(target=lambda: outcome.append(retype_column(pg_url, spec, "score", "long")))
    try:
        assert holding.wait(30)
        started = time.monotonic()
        with pytest.raises(RetypeLockTimeout, match="waited 1 s for the locks on the catalog row and table of idem.malware"):
            retype_column(pg_url, spec, "score", "long", lock_timeout_seconds=1)
        assert time.monotonic() - started < 10
        assert rows(
            pg_url, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'idem.malware'::regclass AND attname = '_score__long'"
        ) == [(0,)]

        retyper.start()
        time.sleep(0.5)
        waits = []
        for _ in range(3):  # readers arriving while the retype keeps trying
            began = time.monotonic()
            with connect(pg_url) as conn:
                assert conn.execute("SELECT count(*) FROM idem.malware").fetchone() == (7,)
            waits.append(time.monotonic() - began)
        assert max(waits) < 2 + 1.5, waits  # one try (2 s) at most, with room for a loaded machine
        assert outcome == []  # still trying: the long reader holds on
    finally:
        release.set()
        thread.join()
    if retyper.is_alive():
        retyper.join(60)
    assert outcome and outcome[0]["rows_retyped"] == 3 and outcome[0]["added"] is True


def test_refusals_from_the_core_name_their_reason(evolved: IdemConfig, pg_url: str) -> None:
    spec = evolved.table_specs["malware"]
    with pytest.raises(RetypeRefused, match="cannot retype to 'int'"):
        retype_column(pg_url, spec, "score", "int")
    with pytest.raises(RetypeRefused, match="batch rows must be at least 1"):
        retype_column(pg_url, spec, "score", "long", batch_rows=0)
    other = evolved.table_specs["threat-actor"]
    with pytest.raises(RetypeRefused, match=r"^idem.threat_actor has no column 'zone' \(its evolved text columns: none\)$"):
        retype_column(pg_url, other, "zone", "long")
    with connect(pg_url, autocommit=True) as conn:
        conn.execute('DROP TABLE idem.threat_actor')
    with pytest.raises(RetypeRefused, match="table idem.threat_actor does not exist yet: nothing was ingested into it"):
        retype_column(pg_url, other, "zone", "long")


# --- Dagster


def test_the_dagster_job_retypes_and_reports(evolved: IdemConfig, pg_url: str) -> None:
    from idem_platform.defs.definitions import build_definitions

    defs = build_definitions(evolved, postgres_url=pg_url)
    job = defs.resolve_job_def("idem_retype")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(
            instance=instance,
            run_config={"ops": {"retype": {"config": {
                "record_type": "malware", "column": "score", "to": "long", "batch_rows": 2,
            }}}},
        )
        assert result.success
        report = result.output_for_node("retype")
        assert (report["rows_retyped"], report["rows_not_cast"], report["batches"]) == (3, 3, 3)
        (output,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
        metadata = {k: v.value for k, v in output.event_specific_data.metadata.items()}
        assert metadata["rows_retyped"] == 3 and metadata["rows_not_cast"] == 3
        assert metadata["typed_column"] == "_score__long" and "n/a" in metadata["not_cast_examples"]
        logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
        assert any("did not cast: " in message for message in logs)
        assert any("batch 2: 0 retyped, 2 did not cast" in message for message in logs)

        refused = job.execute_in_process(
            instance=instance,
            run_config={"ops": {"retype": {"config": {"record_type": "malware", "column": "family", "to": "long"}}}},
            raise_on_error=False,
        )
        assert not refused.success
        failure = refused.failure_data_for_node("retype")
        assert failure is not None and "declared in idem.yaml" in str(failure.user_failure_data.description)
    assert by_id(pg_url, "_score__long")["m1"] == 42
