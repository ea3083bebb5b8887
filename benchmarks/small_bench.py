"""Fixed cost and small batches (issue 18): a 1-line file, a 1,000-line file, a STIX-like batch.

    python benchmarks/small_bench.py [--rounds 3] [--postgres URL | --shared DIR] [--stix-count 24772]

Why apart from the 1M-record figures: a run pays a fixed cost (interpreter, Dagster, a
Spark session, the commit's transaction) whatever its size, and most real drops are
small. Per round, each `idem ingest` a child process as in ``ingest_bench.py``:

1. a 1-line file into a fresh database (the first run there also creates the tables);
2. another 1-line file (a new record): the run's **fixed cost**, tables already there;
3. a 1,000-line file (new records);
4. the STIX-like batch of ``stix_gen.py`` (24,772 objects of 16 types, one table each)
   into another fresh database, as one batch: rows/s.

Each row shows the wall time (process start to exit), the time inside the command (the
CLI's JSON summary ``seconds``: after the interpreter's start and the CLI's imports; Dagster's
and PySpark's imports are in it) and the run's own duration as Dagster records it (its
start to its end, as the UI shows it: what a run costs in a process that is already up). The server is the
shared benchmark's (pg_up.sh, 127.0.0.1:55432, started and stopped if it was not
running) unless ``--postgres URL`` names another; ``shared_bench.py`` runs these same
cases in each of its rounds, on its server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from benchmarks import stix_gen  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    CONFIG,
    SetupError,
    checkpoint,
    environment,
    exit_on_sigterm,
    fresh_database,
    machine_facts,
    masked_url,
    run_idem,
    server_record,
    spark_on_bench_server,
    start_spark_server_for,
)
from idem_platform.samples import threatfeed_lines, write_lines  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass
class Timed:
    """One measured phase of one round (an idem run or a peer's phase)."""

    tool: str
    phase: str
    round: int
    wall: float
    records: int
    inside: float | None = None  # idem: the summary's ``seconds``
    counts: dict[str, Any] = field(default_factory=dict)  # written / skipped / rejected ...
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # failed outcome checks


@dataclass
class SmallData:
    """The small cases' inputs, generated once (seeded) under the work directory."""

    config: Path
    warm: Path
    one_line: Path
    thousand: Path
    stix_config: Path
    stix: Path
    stix_shape: dict[str, Any]


def prepare_small(workdir: Path, stix_count: int = stix_gen.COUNT, thousand_lines: int = 1000) -> SmallData:
    """Write the threat-feed config and files, and the STIX batch with its config (reused when present)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "drop").mkdir(exist_ok=True)
    config = workdir / "idem.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    # ids ioc-/mw-/ta-<index>: each file starts its index past the previous one, so every line is a new record
    warm = write_lines(workdir / "warm-1.ndjson", threatfeed_lines(1, seed=101, duplicate_ratio=0.0, start=0))
    one = write_lines(workdir / "one-1.ndjson", threatfeed_lines(1, seed=102, duplicate_ratio=0.0, start=1))
    thousand = write_lines(
        workdir / f"lines-{thousand_lines}.ndjson",
        threatfeed_lines(thousand_lines, seed=103, duplicate_ratio=0.0, start=2),
    )
    stix_dir = workdir / "stix"
    (stix_dir / "drop").mkdir(parents=True, exist_ok=True)
    stix_config = stix_dir / "idem.yaml"
    stix_config.write_text(yaml.safe_dump(stix_gen.config(), sort_keys=False), encoding="utf-8")
    stix = stix_dir / f"stix-{stix_count}-s{stix_gen.SEED}.ndjson"
    shape_file = stix.with_suffix(".json")
    if stix.exists() and shape_file.exists():
        shape = json.loads(shape_file.read_text(encoding="utf-8"))
    else:
        shape = stix_gen.write_stix(stix, stix_count)
        shape_file.write_text(json.dumps(shape), encoding="utf-8")
    return SmallData(config, warm, one, thousand, stix_config, stix, shape)


def ingest(
    tool: str, phase: str, round_: int, files: list[Path], records: int, env: dict[str, str], config: Path,
    connector: str, server_url: str,
) -> Timed:
    """CHECKPOINT, then one `idem ingest` of ``files`` as a child process, measured."""
    checkpoint(server_url)
    args = ["ingest", "--config", str(config), "--connector", connector, *map(str, files)]
    wall, summary, driver, jvm = run_idem(f"{phase} (round {round_})", args, env)
    counts = {k: summary.get(k) for k in ("rows_written", "rows_skipped", "rows_rejected", "replayed")}
    details = {
        "driver_mib": round(driver), "jvm_mib": round(jvm), "timings": summary.get("timings") or {},
        "dagster_run_s": dagster_run_seconds(env),
    }
    return Timed(tool, phase, round_, wall, records, summary.get("seconds"), counts, details)


def dagster_run_seconds(env: dict[str, str]) -> float | None:
    """The newest run's own duration as Dagster records it and its UI shows it (from the run's
    start to its end), read from the instance the child used: what a run costs inside a
    process that is already up, without the interpreter's start and imports."""
    import dagster as dg

    names = ("DAGSTER_HOME", "IDEM_BENCH_DAGSTER_URL")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: env[name] for name in names if name in env})
    try:
        with dg.DagsterInstance.get() as instance:
            records = instance.get_run_records(limit=1)
            if not records or records[0].start_time is None or records[0].end_time is None:
                return None
            return round(records[0].end_time - records[0].start_time, 3)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def expect(timed: Timed, **wanted: Any) -> Timed:
    """Record each count that differs from what this phase must have done."""
    for key, value in wanted.items():
        if timed.counts.get(key) != value:
            timed.problems.append(f"{key} = {timed.counts.get(key)!r}, expected {value!r}")
    return timed


SERVER_START = "first run, after starting the Spark server (once)"


def start_spark_server(server_url: str, data: SmallData, master: str, home: Path, spark_server: str) -> list[Timed]:
    """With ``spark_server="auto"``: start the long-lived Spark Connect server that every
    later run uses (``idem spark start``), then a first run on it (a 1-line file, fresh
    database), timed apart from the rounds; nothing with ``off``."""
    if spark_server != "auto":
        return []
    url = fresh_database(server_url, "idem_small_first")
    env = environment(url, home, master, spark_server)
    started = time.monotonic()
    ready = start_spark_server_for(home, master, data.config, env)
    done = expect(ingest("idem", SERVER_START, 0, [data.warm], 1, env, data.config, "threatfeed", server_url), rows_written=1)
    drop_database(server_url, url)
    done.details["server_ready_after_s"] = round(ready - started, 2)
    print(f"{SERVER_START}: {done.wall:.2f} s; the server took {done.details['server_ready_after_s']:.2f} s to start", flush=True)
    return [done]


def run_small(
    server_url: str, data: SmallData, master: str, home: Path, round_: int, *, stix: bool = True, prefix: str = "idem_small",
    spark_server: str = "off",
) -> list[Timed]:
    """One round of the small cases, each database fresh."""
    url = fresh_database(server_url, f"{prefix}_{round_}")
    env = environment(url, home, master, spark_server)
    lines = sum(1 for _ in data.thousand.open("rb"))
    out = [
        expect(ingest("idem", "1-line file, fresh database", round_, [data.warm], 1, env, data.config, "threatfeed", server_url), rows_written=1),
        expect(ingest("idem", "1-line file (fixed cost)", round_, [data.one_line], 1, env, data.config, "threatfeed", server_url), rows_written=1),
        expect(ingest("idem", f"{lines:,}-line file", round_, [data.thousand], lines, env, data.config, "threatfeed", server_url), rows_written=lines),
    ]
    drop_database(server_url, url)
    if stix:
        url = fresh_database(server_url, f"{prefix}_stix_{round_}")
        env = environment(url, home, master, spark_server)
        objects = int(data.stix_shape["objects"])
        phase = f"STIX batch ({objects:,} objects, {len(data.stix_shape['types'])} types)"
        out.append(expect(ingest("idem", phase, round_, [data.stix], objects, env, data.stix_config, "stix", server_url), rows_written=objects, rows_rejected=0))
        drop_database(server_url, url)
    return out


def drop_database(server_url: str, url: str) -> None:
    """Drop a benchmark's database once measured (the server is shared; rounds would pile up)."""
    import psycopg
    from psycopg import sql

    name = psycopg.conninfo.conninfo_to_dict(url).get("dbname")
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name))))


def summarize(results: list[Timed]) -> list[dict[str, Any]]:
    """Per (tool, phase), in first-seen order: median / min / max seconds over the rounds, rows/s
    of the median, the median time inside the run, and the spread ((max - min) / min)."""
    groups: dict[tuple[str, str], list[Timed]] = {}
    for timed in results:
        groups.setdefault((timed.tool, timed.phase), []).append(timed)
    rows = []
    for (tool, phase), runs in groups.items():
        walls = [t.wall for t in runs]
        median = statistics.median(walls)
        insides = [t.inside for t in runs if t.inside is not None]
        dagster_runs = [t.details["dagster_run_s"] for t in runs if t.details.get("dagster_run_s") is not None]
        rows.append({
            "tool": tool,
            "phase": phase,
            "rounds": len(runs),
            "records": runs[0].records,
            "median_s": round(median, 3),
            "min_s": round(min(walls), 3),
            "max_s": round(max(walls), 3),
            "spread": round((max(walls) - min(walls)) / min(walls), 3) if min(walls) else None,
            "rows_per_s": round(runs[0].records / median) if median else None,
            "inside_median_s": round(statistics.median(insides), 3) if insides else None,
            "dagster_run_median_s": round(statistics.median(dagster_runs), 3) if dagster_runs else None,
            "counts": runs[0].counts,
            "problems": sorted({p for t in runs for p in t.problems}),
        })
    return rows


def print_rows(rows: list[dict[str, Any]], ratio_columns: tuple[str, ...] = ()) -> None:
    """The table: tool, phase, median seconds, min–max, rows/s, inside the command (the CLI's
    ``seconds``), the Dagster run's own duration, then ratios."""
    head = f"{'tool':5} {'phase':42} {'median s':>9} {'min–max s':>15} {'rows/s':>9} {'inside s':>8} {'run s':>6}"
    print(head + "".join(f" {name:>11}" for name in ratio_columns))
    for row in rows:
        span = f"{row['min_s']:.2f}–{row['max_s']:.2f}"
        inside = f"{row['inside_median_s']:.2f}" if row["inside_median_s"] is not None else "—"
        run = f"{row['dagster_run_median_s']:.2f}" if row.get("dagster_run_median_s") is not None else "—"
        line = f"{row['tool']:5} {row['phase'][:42]:42} {row['median_s']:9.2f} {span:>15} {row['rows_per_s'] or 0:9,} {inside:>8} {run:>6}"
        for name in ratio_columns:
            value = row.get("ratios", {}).get(name)
            line += f" {value:11.2f}" if value is not None else f" {'—':>11}"
        print(line + ("  CHECK FAILED: " + "; ".join(row["problems"]) if row["problems"] else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", help="a running server's URL (default: pg_up.sh's private server of the shared benchmark)")
    parser.add_argument("--shared", help="the shared benchmark directory, for pg_up.sh (default: $IDEM_SHARED_BENCH, else ../shared/bench)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--stix-count", type=int, default=stix_gen.COUNT, help="objects in the STIX-like batch")
    parser.add_argument("--workdir", default=str(HERE / "data" / "small"))
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--spark-server", choices=("auto", "off"), default="auto",
                        help="auto (idem ingest's default): runs share a long-lived Spark Connect server; off: a JVM per run")
    args = parser.parse_args()
    exit_on_sigterm()
    workdir = Path(args.workdir).resolve()
    try:
        data = prepare_small(workdir, args.stix_count)
        home = workdir / "dagster_home"
        with spark_on_bench_server(args.postgres, args.shared, home) as (server, facts):
            print(f"server: {masked_url(server.url)} ({server.via}{', started here' if server.started else ''})", flush=True)
            print(f"Spark: {args.master}, {'a long-lived Spark Connect server' if args.spark_server == 'auto' else 'a JVM per run'}", flush=True)
            results: list[Timed] = start_spark_server(server.url, data, args.master, home, args.spark_server)
            for round_ in range(1, args.rounds + 1):
                done = run_small(server.url, data, args.master, home, round_, spark_server=args.spark_server)
                results += done
                print(f"round {round_}: " + ", ".join(f"{t.phase} {t.wall:.2f}s" for t in done), flush=True)
    except SetupError as exc:
        print(f"small_bench: {exc}", file=sys.stderr)
        return 2
    rows = summarize(results)
    print(f"\nSTIX batch: {data.stix_shape['objects']:,} objects, {len(data.stix_shape['types'])} types, {data.stix_shape['bytes']:,} bytes")
    print_rows(rows)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "benchmark": "small_bench", "machine": machine_facts(), "server": server_record(server, facts),
            "stix": data.stix_shape, "summary": rows, "results": [asdict(t) for t in results],
        }, indent=1), encoding="utf-8")
    return 1 if any(row["problems"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
