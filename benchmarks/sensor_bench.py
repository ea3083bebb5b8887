"""The sensor path (issue 18): files dropped into a watched directory, `idem dev` running.

    python benchmarks/sensor_bench.py [--files 1000] [--lines 1000] [--single-lines 1000]
                                      [--interval SECONDS] [--postgres URL | --shared DIR] [--out results.json]

What a user runs: ``idem dev`` (``make dev``: ``dagster dev`` with its daemon, which
evaluates the file-drop sensors and launches the runs they request through the run
queue of ``dagster.yaml``) on a fresh database, as a child process. Then, each case
after the previous one has committed:

1. ONE file of ``--single-lines`` lines (default 1,000) dropped: drop → committed;
2. the same lines as the next case in ONE file, into a second connector's directory
   (``onefile``; other keys, so every row is new): the baseline of case 3 (it runs first,
   so case 3 inserts into tables that already hold its rows: the ratio errs against us);
3. ``--files`` files of ``--lines`` lines each (default 1,000 × 1,000) dropped at once
   (renamed in from a directory beside, as droppers should): drop → last commit.

A case is done when the connector's commits (``idem.commits``) have counted every
dropped line (written, skipped or rejected): so it measures whatever the sensor does,
one run per file or many files per run. It reports the runs launched (by status, and
files per run when the run says), the sensor's settle time (a file is requested on the
first look that finds it unchanged since the previous look: 1–2 sensor intervals after
it lands), drop → the tick that requested its run, → first run started, → last commit.
At the end every line must be committed exactly once: per connector, rows and distinct
record ids equal the lines dropped, and every file key is committed in the ledger.

The server is the shared benchmark's (pg_up.sh: 127.0.0.1:55432, user bench; started and
then stopped if it was not running) unless ``--postgres URL`` names another. Exit status
1 if a check failed, 2 if something it needs is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
import psycopg  # noqa: E402
import yaml  # noqa: E402
from psycopg import sql  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    CONFIG,
    REPO,
    TABLES,
    SetupError,
    begin_run,
    bench_server,
    fresh_database,
    masked_url,
    server_facts,
    server_record,
)
from benchmarks.small_bench import drop_database  # noqa: E402
from idem_platform.config import FileDropConnector  # noqa: E402
from idem_platform.contract.keys import file_key_from_digest  # noqa: E402
from idem_platform.postgres.tables import table_ident  # noqa: E402
from idem_platform.samples import threatfeed_lines  # noqa: E402

HERE = Path(__file__).resolve().parent
MANY, ONE = "threatfeed", "onefile"  # the connectors: the N files and the single file / the one-file baseline
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}  # Dagster's terminal run statuses
DEFAULT_INTERVAL = int(FileDropConnector.model_fields["sensor_interval_seconds"].default)  # when --interval is not given


class BenchFailure(RuntimeError):
    """The path under measurement failed (idem dev died, a case never completed)."""


@dataclass
class Case:
    """One drop and what it took to commit."""

    kind: str  # single | one | many
    name: str
    connector: str
    files: int
    lines: int
    dropped_at: float = 0.0  # epoch seconds
    committed_after: float | None = None  # drop → the poll that saw every line counted
    commits: int = 0
    ledger: dict[str, int] = field(default_factory=dict)  # status → file keys
    runs: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_config(workdir: Path, interval: int | None) -> Path:
    """The benchmark's threat-feed catalog with two file-drop connectors (sensor interval as given)."""
    data = yaml.safe_load(CONFIG)
    base = data["connectors"][0]
    data["connectors"] = [
        {**base, "name": MANY, "path": f"drop/{MANY}"},
        {**base, "name": ONE, "path": f"drop/{ONE}"},
    ]
    if interval is not None:
        for connector in data["connectors"]:
            connector["sensor_interval_seconds"] = interval
    path = workdir / "idem.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def write_file(path: Path, lines: int, *, seed: int, start: int) -> str:
    """``lines`` new records (ids from ``start``: no two files share one) in a dotfile renamed into
    place; returns the file's sha256."""
    digest = hashlib.sha256()
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("wb") as handle:
        for line in threatfeed_lines(lines, seed=seed, duplicate_ratio=0.0, start=start):
            data = (line + "\n").encode()
            digest.update(data)
            handle.write(data)
    temporary.replace(path)
    return digest.hexdigest()


def prepare(workdir: Path, files: int, lines: int, single_lines: int) -> dict[str, Any]:
    """The staged inputs (renamed into the drop directories later): N files, their concatenation, one file."""
    stage = workdir / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(workdir / "drop", ignore_errors=True)
    for directory in (stage / "many", stage / "one", stage / "single", workdir / "drop" / MANY, workdir / "drop" / ONE):
        directory.mkdir(parents=True)
    many = []
    for index in range(files):
        path = stage / "many" / f"part-{index:05d}.ndjson"
        many.append((path, write_file(path, lines, seed=10_000 + index, start=index * lines)))
    joined = stage / "one" / f"all-{files}x{lines}.ndjson"
    digest = hashlib.sha256()
    with joined.open("wb") as out:
        for path, _ in many:
            content = path.read_bytes()
            digest.update(content)
            out.write(content)
    single = stage / "single" / f"single-{single_lines}.ndjson"
    single_sha = write_file(single, single_lines, seed=9_999, start=files * lines)
    return {
        "many": [p for p, _ in many],
        "many_keys": [file_key_from_digest(sha) for _, sha in many],
        "one": joined,
        "one_key": file_key_from_digest(digest.hexdigest()),
        "single": single,
        "single_key": file_key_from_digest(single_sha),
        "bytes": {"many": sum(p.stat().st_size for p, _ in many), "one": joined.stat().st_size, "single": single.stat().st_size},
    }


class Dev:
    """``idem dev`` as a child process: started, watched, stopped with everything it started."""

    def __init__(self, config: Path, url: str, home: Path, master: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        env = {**os.environ, "IDEM_POSTGRES_URL": url, "DAGSTER_HOME": str(home), "IDEM_SPARK_MASTER": master}
        env.pop("IDEM_FAULT", None)
        command = [
            sys.executable, "-m", "idem_platform.cli", "dev", "--config", str(config),
            "--port", str(self.port), "--workspace", str(REPO / "workspace.yaml"),
        ]
        self.process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )

    def check(self) -> None:
        if self.process.poll() is not None:
            raise BenchFailure(f"idem dev exited ({self.process.returncode}); its log {self.log}:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def webserver_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/server_info", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM (idem dev passes it to dagster dev's group, then kills what is left); then
        whatever of the family it started is still there is killed."""
        if self.process.poll() is not None:
            return
        try:
            family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            family = []
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _, alive = psutil.wait_procs(family, timeout=10)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                pass


def sensor_ticks(conn: psycopg.Connection[Any], names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Dagster's completed sensor ticks (its ``job_ticks`` table, in the same database: idem's
    dagster.yaml keeps Dagster's storage there), per sensor name, oldest first."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    rows = conn.execute("SELECT status, tick_body FROM job_ticks WHERE type = 'SENSOR' AND status <> 'STARTED' ORDER BY id").fetchall()
    for status, body in rows:
        tick = json.loads(body)  # Dagster's TickData, serialized
        name = tick.get("job_name") or tick.get("instigator_name")
        if name in out:
            out[name].append({"status": status, "timestamp": tick.get("timestamp"), "run_ids": tick.get("run_ids") or [], "error": tick.get("error")})
    return out


def wait_ready(dev: Dev, url: str, sensors: list[str], timeout: float) -> float:
    """Until the webserver answers and the daemon has finished a tick of every sensor; seconds taken."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            dev.check()
            if time.monotonic() - started > timeout:
                raise BenchFailure(f"no tick of {', '.join(sensors)} within {timeout:.0f} s; idem dev's log:\n{dev.tail()}")
            if dev.webserver_up():
                try:
                    ticks = sensor_ticks(conn, sensors)
                except psycopg.errors.UndefinedTable:
                    ticks = {}
                failed = [t for name in sensors for t in ticks.get(name, []) if t["status"] == "FAILURE"]
                if failed:
                    raise BenchFailure(f"a sensor tick failed: {json.dumps(failed[-1]['error'])[:3000]}")
                if ticks and all(ticks[name] for name in sensors):
                    return time.monotonic() - started
            time.sleep(1)


def counted_lines(conn: psycopg.Connection[Any], connector: str) -> tuple[int, int]:
    """Lines the connector's commits counted (written + skipped + rejected), and its commits."""
    row = conn.execute(
        "SELECT coalesce(sum(rows_written + rows_skipped + rows_rejected), 0), count(*) FROM idem.commits WHERE connector = %s",
        [connector],
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def ledger_states(conn: psycopg.Connection[Any], connector: str, keys: list[str]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT status, count(*) FROM idem.ingest_ledger WHERE namespace = %s AND key = ANY(%s) GROUP BY status",
        [connector, keys],
    ).fetchall()
    states = {status: int(n) for status, n in rows}
    missing = len(keys) - sum(states.values())
    if missing:
        states["not in the ledger"] = missing
    return states


def runs_since(conn: psycopg.Connection[Any], after_id: int) -> list[dict[str, Any]]:
    """Dagster runs created after run row ``after_id``: status, start/end, and idem's tags."""
    rows = conn.execute(
        "SELECT r.id, r.run_id, r.status, r.start_time, r.end_time, "
        "(SELECT value FROM run_tags t WHERE t.run_id = r.run_id AND t.key = 'idem/files') "
        "FROM runs r WHERE r.id > %s ORDER BY r.id",
        [after_id],
    ).fetchall()
    return [
        {"id": i, "run_id": run_id, "status": status, "start": start, "end": end, "files": int(files) if files else None}
        for i, run_id, status, start, end, files in rows
    ]


def last_run_id(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT coalesce(max(id), 0) FROM runs").fetchone()
    return int(row[0]) if row else 0


def drop_and_wait(
    dev: Dev, url: str, case: Case, staged: list[Path], directory: Path, keys: list[str], sensor: str, timeout: float
) -> Case:
    """Rename the staged files into ``directory`` at once; poll until the connector's commits have
    counted every line (``case.lines`` more than before); then what it took."""
    with psycopg.connect(url, autocommit=True) as conn:
        before_lines, before_commits = counted_lines(conn, case.connector)
        before_run = last_run_id(conn)
        ticks_before = len(sensor_ticks(conn, [sensor])[sensor])
        case.dropped_at = time.time()
        started = time.monotonic()
        for path in staged:
            os.replace(path, directory / path.name)
        print(f"{case.name}: dropped {len(staged)} file(s), {case.lines:,} lines", flush=True)
        last_note = started
        while True:
            dev.check()
            lines, commits = counted_lines(conn, case.connector)
            now = time.monotonic()
            if lines - before_lines >= case.lines:
                case.committed_after = round(now - started, 3)
                case.commits = commits - before_commits
                break
            if now - started > timeout:
                raise BenchFailure(
                    f"{case.name}: {lines - before_lines:,} of {case.lines:,} lines committed after {timeout:.0f} s; "
                    f"ledger {ledger_states(conn, case.connector, keys)}; runs {run_statuses(runs_since(conn, before_run))}"
                )
            if now - last_note >= 30:
                last_note = now
                print(
                    f"  {now - started:6.0f} s: {lines - before_lines:,}/{case.lines:,} lines, {commits - before_commits} commits, "
                    f"runs {run_statuses(runs_since(conn, before_run))}, ledger {ledger_states(conn, case.connector, keys)}",
                    flush=True,
                )
            time.sleep(0.25)
        case.ledger = ledger_states(conn, case.connector, keys)
        # The commit is what is measured; the runs' ends (and any run still queued) are only
        # described, once every run of the case has finished (at most a minute more).
        settle_by = time.monotonic() + 60
        runs = runs_since(conn, before_run)
        while any(run["status"] not in FINISHED for run in runs) and time.monotonic() < settle_by:
            time.sleep(1)
            runs = runs_since(conn, before_run)
        ticks = sensor_ticks(conn, [sensor])[sensor][ticks_before:]
    case.runs = describe_runs(runs, ticks, case.dropped_at)
    return case


def run_statuses(runs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for run in runs:
        out[run["status"]] = out.get(run["status"], 0) + 1
    return out


def describe_runs(runs: list[dict[str, Any]], ticks: list[dict[str, Any]], dropped_at: float) -> dict[str, Any]:
    """Runs launched for a case: count by status, files per run, when the sensor asked (its tick),
    when they started, how long they took, and how many ran at once."""
    requesting = [t for t in ticks if t["run_ids"]]
    starts = [r["start"] for r in runs if r["start"]]
    durations = [r["end"] - r["start"] for r in runs if r["start"] and r["end"]]
    events = sorted([(r["start"], 1) for r in runs if r["start"]] + [(r["end"], -1) for r in runs if r["start"] and r["end"]])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    files = [r["files"] for r in runs if r["files"] is not None]
    return {
        "launched": len(runs),
        "by_status": run_statuses(runs),
        "files_per_run": {"min": min(files), "median": statistics.median(files), "max": max(files)} if files else None,
        "requesting_ticks": len(requesting),
        "drop_to_first_request_s": round(requesting[0]["timestamp"] - dropped_at, 3) if requesting else None,
        "drop_to_first_start_s": round(min(starts) - dropped_at, 3) if starts else None,
        "run_seconds_median": round(statistics.median(durations), 3) if durations else None,
        "run_seconds_max": round(max(durations), 3) if durations else None,
        "most_at_once": peak,
    }


def verify(url: str, expected: dict[str, int]) -> dict[str, Any]:
    """Every line committed exactly once, per connector: rows == distinct record ids == lines dropped."""
    out: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for connector, lines in expected.items():
            rows = ids = 0
            for table in TABLES:
                row = conn.execute(
                    sql.SQL("SELECT count(*), count(DISTINCT _external_id) FROM {} WHERE _connector = %s").format(
                        table_ident(table)
                    ),
                    [connector],
                ).fetchone()
                rows += int(row[0]) if row else 0
                ids += int(row[1]) if row else 0
            written = conn.execute(
                "SELECT coalesce(sum(rows_written), 0), coalesce(sum(rows_skipped), 0), coalesce(sum(rows_rejected), 0) "
                "FROM idem.commits WHERE connector = %s",
                [connector],
            ).fetchone()
            problems = []
            if rows != lines or ids != lines:
                problems.append(f"{rows:,} rows and {ids:,} distinct ids for {lines:,} lines dropped")
            if written and int(written[2]):
                problems.append(f"{int(written[2]):,} lines rejected")
            out[connector] = {
                "lines": lines, "rows": rows, "distinct_ids": ids,
                "written": int(written[0]) if written else None, "skipped": int(written[1]) if written else None,
                "rejected": int(written[2]) if written else None, "problems": problems,
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="files dropped at once (case 3)")
    parser.add_argument("--lines", type=int, default=1000, help="lines per file (case 3)")
    parser.add_argument("--single-lines", type=int, default=1000, help="lines of the single file (case 1)")
    parser.add_argument("--interval", type=int, help=f"the sensors' sensor_interval_seconds (default: the connector default, {DEFAULT_INTERVAL})")
    parser.add_argument("--skip-one-file", action="store_true", help="leave out case 2 (the one-file baseline)")
    parser.add_argument("--postgres", help="a running server's URL (default: pg_up.sh's private server of the shared benchmark)")
    parser.add_argument("--shared", help="the shared benchmark directory, for pg_up.sh (default: $IDEM_SHARED_BENCH, else ../shared/bench)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds a case may take before the benchmark gives up")
    parser.add_argument("--keep-database", action="store_true", help="keep idem_sensor_bench (default: dropped once checked)")
    parser.add_argument("--workdir", default=str(HERE / "data" / "sensor"))
    parser.add_argument("--out", help="results as JSON (default: <workdir>/results-<time>.json)")
    args = parser.parse_args()
    workdir, out_path, machine = begin_run(args.workdir, args.out)
    interval = args.interval or DEFAULT_INTERVAL
    total = args.files * args.lines
    sensors = [f"{name}_filedrop_sensor" for name in (MANY, ONE)]
    cases: list[Case] = []
    try:
        with bench_server(args.postgres, args.shared) as server:
            facts = server_facts(server.url)
            print(f"server: {masked_url(server.url)} ({server.via}{', started here' if server.started else ''})", flush=True)
            print(f"staging {args.files:,} files × {args.lines:,} lines, their concatenation, and one file of {args.single_lines:,} lines ...", flush=True)
            staged = prepare(workdir, args.files, args.lines, args.single_lines)
            config = write_config(workdir, args.interval)
            url = fresh_database(server.url, "idem_sensor_bench")
            home = workdir / "dagster_home"
            shutil.rmtree(home, ignore_errors=True)  # idem dev makes it with idem's dagster.yaml (storage in PostgreSQL)
            dev = Dev(config, url, home, args.master, workdir / "idem-dev.log")
            try:
                ready = wait_ready(dev, url, sensors, timeout=600)
                print(f"idem dev is up and its sensors tick ({ready:.1f} s); sensor interval {interval} s", flush=True)
                drops = workdir / "drop"
                single = Case("single", "one file", MANY, 1, args.single_lines)
                cases.append(drop_and_wait(dev, url, single, [staged["single"]], drops / MANY, [staged["single_key"]], sensors[0], args.timeout))
                if not args.skip_one_file:
                    one = Case("one", "the same lines as one file", ONE, 1, total)
                    cases.append(drop_and_wait(dev, url, one, [staged["one"]], drops / ONE, [staged["one_key"]], sensors[1], args.timeout))
                many = Case("many", f"{args.files:,} files at once", MANY, args.files, total)
                cases.append(drop_and_wait(dev, url, many, staged["many"], drops / MANY, staged["many_keys"], sensors[0], args.timeout))
            finally:
                dev.stop()
            expected = {MANY: args.single_lines + total}
            if not args.skip_one_file:
                expected[ONE] = total
            checks = verify(url, expected)
            if not args.keep_database:
                drop_database(server.url, url)
    except SetupError as exc:
        print(f"sensor_bench: {exc}", file=sys.stderr)
        return 2
    except BenchFailure as exc:
        print(f"sensor_bench: {exc}", file=sys.stderr)
        return 1
    problems = [p for check in checks.values() for p in check["problems"]]
    for case in cases:
        if case.ledger.get("committed") != case.files:
            problems.append(f"{case.name}: ledger {case.ledger} for {case.files} file key(s)")
    print_report(cases, interval, checks, problems)
    out_path.write_text(json.dumps({
        "benchmark": "sensor_bench",
        "args": vars(args),
        "machine": machine,
        "server": server_record(server, facts),
        "sensor_interval_s": interval,
        "settle_implied_s": [interval, 2 * interval],
        "bytes": staged["bytes"],
        "cases": [asdict(case) for case in cases],
        "checks": checks,
        "problems": problems,
    }, indent=1, default=str), encoding="utf-8")
    print(f"results: {out_path}")
    return 1 if problems else 0


def print_report(cases: list[Case], interval: int, checks: dict[str, Any], problems: list[str]) -> None:
    print(
        f"\nsensor interval {interval} s: a file is requested on the first look that finds it unchanged since the "
        f"previous one, {interval}–{2 * interval} s after it lands (the settle time), then queued, launched, run, committed."
    )
    print(f"{'case':28} {'lines':>10} {'drop→commit s':>13} {'lines/s':>9} {'→request s':>10} {'→start s':>9} "
          f"{'runs':>6} {'files/run':>9} {'run s (med)':>11} {'at once':>7} {'commits':>7}")
    for case in cases:
        runs = case.runs
        per_run = runs.get("files_per_run") or {}
        seconds = case.committed_after or 0.0
        print(
            f"{case.name[:28]:28} {case.lines:>10,} {seconds:13.2f} {case.lines / seconds if seconds else 0:9,.0f} "
            f"{_num(runs.get('drop_to_first_request_s')):>10} {_num(runs.get('drop_to_first_start_s')):>9} "
            f"{runs.get('launched', 0):>6} {_num(per_run.get('median')):>9} {_num(runs.get('run_seconds_median')):>11} "
            f"{runs.get('most_at_once', 0):>7} {case.commits:>7}"
        )
    kinds = {case.kind: case for case in cases}
    many, one, single = kinds.get("many"), kinds.get("one"), kinds.get("single")
    if many and one and many.committed_after and one.committed_after:
        ratio = many.committed_after / one.committed_after
        print(f"{many.name} / the same lines as one file: {ratio:.2f} (goal ≤ 3)")
    if single and single.committed_after:
        requested = single.runs.get("drop_to_first_request_s")
        after = single.committed_after - requested if requested is not None else None
        print(
            f"one file of {single.lines:,} lines: drop → committed {single.committed_after:.2f} s"
            + (f", of which {requested:.2f} s until the sensor asked (settle) and {after:.2f} s after (goal ≤ 10 s)" if after is not None else "")
        )
    for connector, check in checks.items():
        print(f"{connector}: {check['lines']:,} lines dropped, {check['rows']:,} rows, {check['distinct_ids']:,} distinct ids, "
              f"commits counted {check['written']:,} written / {check['skipped']:,} skipped / {check['rejected']:,} rejected")
    for problem in problems:
        print(f"CHECK FAILED: {problem}")


def _num(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
