"""The file-drop benchmark (issue 2): first ingest, replay, same rows in a new file, COPY baseline.

    python benchmarks/ingest_bench.py [--records 1000000] [--postgres URL] [--master local[2]]

Default PostgreSQL is the product's embedded default (pgserver under
benchmarks/data/.idem); ``--postgres`` takes a server URL (a fresh database is
created on it). Prints one row per phase: seconds, rows/s, ratio to the COPY
baseline, and the peak resident memory of the driver process and the Spark JVM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import (  # noqa: E402
    CONFIG,
    Phase,
    copy_baseline,
    copy_of,
    data_file,
    embedded_server,
    environment,
    fresh_database,
    run_ingest,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--postgres", help="server URL (default: the embedded pgserver)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parent / "data"))
    parser.add_argument("--repeat", type=int, default=1, help="rounds (fresh database each); the median is shown")
    args = parser.parse_args()

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    server = args.postgres or embedded_server(workdir / ".idem")
    config = workdir / "idem.yaml"
    config.write_text(CONFIG)
    (workdir / "drop").mkdir(exist_ok=True)
    feed = data_file(workdir, args.records)
    copy = copy_of(feed, workdir / "copy.ndjson")

    rounds: list[list[Phase]] = []
    copy_rates: list[float] = []
    for round_ in range(args.repeat):
        url = fresh_database(server, "idem_bench")
        env = environment(url, workdir / "dagster_home", args.master)
        phases = [
            run_ingest("first ingest", feed, args.records, env, config),
            run_ingest("replay (same file)", feed, args.records, env, config),
            run_ingest("same rows, new file", copy, args.records, env, config),
        ]
        written = phases[0].summary["rows_written"]
        copy_rates.append(written / copy_baseline(url, args.records))
        rounds.append(phases)
        if args.repeat > 1:
            print(f"round {round_ + 1}: " + ", ".join(f"{p.name} {p.wall:.2f}s" for p in phases), flush=True)
    phases = [sorted(column, key=lambda p: p.wall)[(len(column) - 1) // 2] for column in zip(*rounds, strict=True)]
    copy_rate = statistics.median(copy_rates)
    copy_seconds = written / copy_rate

    print(
        f"records: {args.records:,}  bytes: {feed.stat().st_size:,}  master: {args.master}  "
        f"postgres: {'server' if args.postgres else 'embedded'}  rounds: {args.repeat} (median shown)"
    )
    print(f"{'phase':24} {'seconds':>8} {'rows/s':>9} {'vs COPY':>8} {'driver MiB':>10} {'JVM MiB':>8}  written/skipped/rejected  (inside the run)")
    for phase in phases:
        s = phase.summary
        print(
            f"{phase.name:24} {phase.wall:8.2f} {phase.rows_per_second:9,.0f} {phase.rows_per_second / copy_rate:8.2f} "
            f"{phase.driver_peak_mib:10.0f} {phase.jvm_peak_mib:8.0f}  "
            f"{s['rows_written']}/{s['rows_skipped']}/{s['rows_rejected']}  ({s.get('seconds')} s; {json.dumps(s.get('timings') or {})})"
        )
    print(f"{'COPY baseline':24} {copy_seconds:8.2f} {copy_rate:9,.0f} {1.0:8.2f}  ({written:,} rows into plain tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
