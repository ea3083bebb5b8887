"""Schema versions (issue 13): reading a table half at v1, then ``idem migrate``, then reading again.

    python benchmarks/migrate_bench.py [--records 1000000] [--postgres URL] [--master local[2]]

1. ``idem.reading`` is filled by SQL (``generate_series``, no ingest: the ingest has its
   own benchmark) with ``--records`` rows, every other one stored at v1 (its
   ``_payload`` in the v1 shape: ``temp`` in °F, ``meta``), the others at the current v3;
   the chain v1 -> v2 -> v3 is the tests' ``reading`` one (:mod:`idem_platform_tests.helpers.migrations_fixture`,
   copied beside the config: rename, then °F -> °C);
2. **read, mixed**: ``read_table`` of the whole table in this process (Spark session
   and its Python workers started beforehand, not timed), materialized by Spark's ``noop`` sink: every row in
   the current shape, the v1 half upgraded on the executors: rows/s overall;
3. **read, old rows only**: the v1 half alone (the read plan's ``only_old``): rows/s of
   upgraded rows;
4. ``idem migrate --dry-run``, ``idem migrate``, ``idem migrate`` again: the real CLI in
   child processes (interpreter, a cold Spark session and the writes included), as in
   ``ingest_bench.py``;
5. **read, all current**: the same read after the migrate: rows/s of current rows.

The issue's target: reading 1,000,000 rows of which half are v1 at >= 100,000 rows/s
overall on ``local[2]``. Default PostgreSQL is the embedded one; ``--postgres`` takes a
server URL (a fresh database is made on it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from benchmarks.harness import cpu_speed, embedded_server, environment, fresh_database, run_idem  # noqa: E402
from idem_platform_tests.helpers import migrations_fixture  # noqa: E402

CONFIG = migrations_fixture.reading_config(
    3,
    {"sensor": migrations_fixture.REQUIRED_SENSOR, "temperature": "real", "taken": "timestamp", "labels": "dynamic",
     "site": "string", "seq": "long"},
    connectors="  - name: bench\n    kind: filedrop\n    path: drop\n    record_type: reading\n    id_field: id\n",
    migrations="bench_reading_migrations",
) + 'spark:\n  conf:\n    spark.ui.enabled: "false"\n'


# Even rows at v1 (payload as a v1 producer sent it; typed columns as the v1 table had
# none of the v3 ones), odd rows at v3 (payload and typed columns in the current shape).
FILL = """
INSERT INTO idem.reading (_idempotency_key, _connector, _record_type, _external_id, _content_hash,
    _schema_version, _commit_id, _ingested_at, _source, _payload, sensor, temperature, taken, labels, site, seq)
SELECT 'bench:reading:r' || lpad(i::text, 9, '0') || ':' || substr(md5(i::text), 1, 12), 'bench', 'reading',
    'r' || lpad(i::text, 9, '0'), md5(i::text), CASE WHEN i %% 2 = 0 THEN 1 ELSE 3 END, %(commit)s::uuid,
    now(), 'bench#L' || i,
    CASE WHEN i %% 2 = 0 THEN jsonb_build_object(
        'id', 'r' || lpad(i::text, 9, '0'), 'sensor', 's' || (i %% 1000), 'temp', 32 + (i %% 90) + 0.5,
        'taken', to_char(timestamptz '2026-01-01' + i * interval '1 second', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        'meta', jsonb_build_object('site', 'site-' || (i %% 50), 'rack', i %% 7), 'site', 'site-' || (i %% 50), 'seq', i)
    ELSE jsonb_build_object(
        'id', 'r' || lpad(i::text, 9, '0'), 'sensor', 's' || (i %% 1000), 'temperature', (i %% 40) + 0.25,
        'taken', to_char(timestamptz '2026-01-01' + i * interval '1 second', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        'labels', jsonb_build_object('site', 'site-' || (i %% 50), 'rack', i %% 7), 'site', 'site-' || (i %% 50), 'seq', i)
    END,
    's' || (i %% 1000),
    CASE WHEN i %% 2 = 1 THEN (i %% 40) + 0.25 END,
    timestamptz '2026-01-01' + i * interval '1 second',
    CASE WHEN i %% 2 = 1 THEN jsonb_build_object('site', 'site-' || (i %% 50), 'rack', i %% 7) END,
    'site-' || (i %% 50),
    i
FROM generate_series(1, %(records)s) i
"""


def build(url: str, config: Any, records: int) -> float:
    """Create ``idem.reading`` (the config's catalog) and fill it; returns seconds."""
    import uuid

    from idem_platform.postgres.connection import connect
    from idem_platform.postgres.schema import ensure_schema
    from idem_platform.postgres.tables import sync_tables

    started = time.monotonic()
    with connect(url, autocommit=True) as conn:
        ensure_schema(conn)
        sync_tables(conn, config.table_specs)
        conn.execute(FILL, {"commit": str(uuid.uuid4()), "records": records})
        conn.execute("VACUUM ANALYZE idem.reading")
    return time.monotonic() - started


def timed_read(spark: Any, frame: Any, rounds: int = 1) -> tuple[float, str]:
    """Median seconds of ``rounds`` reads of every row of ``frame``, upgraded (Spark's ``noop``
    sink: nothing kept), and the rounds' range."""
    times = []
    for _ in range(rounds):
        started = time.monotonic()
        frame.write.format("noop").mode("overwrite").save()
        times.append(time.monotonic() - started)
    spread = f"rounds {', '.join(f'{t:.2f}' for t in times)} s" if rounds > 1 else ""
    return statistics.median(times), spread


def versions(url: str) -> dict[int, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT _schema_version, count(*) FROM idem.reading GROUP BY 1").fetchall())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--postgres", help="server URL (default: the embedded pgserver)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batch-rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3, help="reads per phase (the median is reported)")
    parser.add_argument(
        "--quick-jit", action="store_true",
        help="read in a run's session (C1 JIT only) instead of a long-lived one's (the full JIT, as the "
        "Spark Connect server and `idem migrate` use)",
    )
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parent / "data" / "migrate"))
    args = parser.parse_args()

    from idem_platform.config import load_config
    from idem_platform.read import migration_errors, read_table
    from idem_platform.read.source import source_frame
    from idem_platform.spark.session import build_session, spark_config_for

    workdir = Path(args.workdir).resolve()
    (workdir / "drop").mkdir(parents=True, exist_ok=True)
    shutil.copy(migrations_fixture.__file__, workdir / "bench_reading_migrations.py")  # the tests' chain
    config_path = workdir / "idem.yaml"
    config_path.write_text(CONFIG, encoding="utf-8")
    config = load_config(str(config_path))
    server = args.postgres or embedded_server(workdir / ".idem")
    url = fresh_database(server, "idem_bench_migrate")
    env = environment(url, workdir / "dagster_home", args.master)
    old = args.records // 2

    speed_before = cpu_speed()
    built = build(url, config, args.records)
    spark = build_session(spark_config_for(args.master, {"spark.ui.enabled": "false"}), long_lived=not args.quick_jit)
    results: list[tuple[str, float, int, str]] = [("build (SQL)", built, args.records, "")]

    read = read_table(spark, url, config, "reading")
    with migration_errors():
        read_table(spark, url, config, "reading", limit=10).frame.collect()  # Python workers started, not timed
        seconds, note = timed_read(spark, read.frame, args.rounds)
        results.append(("read, mixed (half v1)", seconds, args.records, note))
        assert read.plan is not None
        only_old = source_frame(spark, replace(read.plan, only_old=True))
        seconds, note = timed_read(spark, only_old, args.rounds)
        results.append(("read, v1 rows only", seconds, old, f"upgraded; {note}" if note else "upgraded"))

    reports: dict[str, dict[str, Any]] = {}
    for name, extra in (("migrate --dry-run", ["--dry-run"]), ("migrate", []), ("migrate again", [])):
        wall, report, driver, jvm = run_idem(
            name, ["migrate", "--json", "--batch-rows", str(args.batch_rows), "--config", str(config_path), *extra], env
        )
        reports[name] = report
        moved = report["rows_to_move"] if extra else report["rows_moved"]
        results.append((f"idem {name}", wall, moved, f"in run {report['seconds']:.2f} s, driver {driver:.0f} MiB, JVM {jvm:.0f} MiB"))

    after = read_table(spark, url, config, "reading")
    with migration_errors():
        seconds, note = timed_read(spark, after.frame, args.rounds)
        results.append(("read, all current", seconds, args.records, note))

    checks = {
        "dry run counts the v1 half": reports["migrate --dry-run"]["rows_to_move"] == old,
        "migrate moves the v1 half": reports["migrate"]["rows_moved"] == old and reports["migrate"]["rows_failed"] == 0,
        "a second migrate moves nothing": reports["migrate again"]["rows_moved"] == 0,
        "every row at v3 once": versions(url) == {3: args.records},
    }
    jit = "C1 only (a run's session)" if args.quick_jit else "full (a long-lived session's)"
    print(f"records: {args.records:,} (half at v1)  master: {args.master}  postgres: {'server' if args.postgres else 'embedded'}  JIT: {jit}")
    print(f"machine: cpu_speed {speed_before:.2f} s before, {cpu_speed():.2f} s after (harness.cpu_speed: lower is faster)")
    print(f"{'phase':24} {'seconds':>8} {'rows':>10} {'rows/s':>9}")
    for name, seconds, rows, note in results:
        rate = f"{rows / seconds:9,.0f}" if seconds else "-"
        print(f"{name:24} {seconds:8.2f} {rows:10,} {rate}  {note}")
    for check, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {check}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
