"""Where a first ingest's time goes: per phase and per process, cold and warm, on the shared benchmark.

    python benchmarks/phases_bench.py [--records 1000000] [--shared DIR] [--postgres URL]
                                      [--cases cold,warm] [--no-promote] [--out results.json]

The data is the shared benchmark's (``gen.py``: N records in 10 files, 10 % duplicate
lines, seed 42, under ``$IDEM_PEER_BENCH_HOME/data/n<N>`` as ``run.sh`` and
``shared_bench.py`` make it; generated when missing) on its server (``pg_up.sh``: a
private PostgreSQL on 127.0.0.1:55432, started if not running and then stopped)
unless ``--postgres URL`` names another.

Two cases, each one ``idem ingest`` of the 10 files as a child process into a fresh
database, after a CHECKPOINT:

* **cold**: nothing running (``IDEM_SPARK_SERVER=off``): the run starts its own local
  Spark JVM;
* **warm**: a Spark Connect server started beforehand (``idem spark start``), which has
  already run the same ingest once into another database (its JIT warm-up, reported
  apart), as a server that has been up a while finds it.

While a run lasts, a thread samples every ``--interval`` seconds the CPU seconds of each
process taking part: the idem driver (the ``idem ingest`` process), the Spark JVM (the
run's own, or the Connect server), Spark's Python workers (the executors' per-record
work: coercion in C and the binary COPY's client side), and each PostgreSQL process of
the server, told apart by ``pg_stat_activity`` (the promote's ``idem-commit`` backend,
the executors' ``idem-stage-*`` COPY backends, idem's other sessions, Dagster's
instance, the server's background processes), plus ``pg_current_wal_lsn()``.

The phases are laid out from the run's own clocks: the Dagster event log of the run
(its steps' start and end) and the commit's ``timings`` (Spark session, staging with
the streamed promote, finish, COMMIT). Each phase shows its wall seconds and the CPU
seconds each process spent inside it (interpolated between samples), and the WAL bytes
written. A process's last sample before it exits is its last CPU figure: at most one
interval of a short-lived process is missed.

Then, unless ``--no-promote``, what PostgreSQL spends per row in the promote: the
promote's ``INSERT … SELECT`` (the shape of ``idem_platform.write.apply.rows.
insert_rows``: ``DISTINCT ON`` the key, anti-joined on the primary key, ``_payload``
copied, dynamic columns taken from it) re-run from an equivalent staged table (the
committed rows, plus a tenth of them again as duplicates) into empty tables in variants:
as the product makes them, without the secondary index, without the primary key (and
so without the anti-join), with ``_payload`` as ``text`` or absent. Per variant: µs per
row (the statement's execution time and its backend's CPU), WAL bytes per row
(``EXPLAIN (ANALYZE, WAL)`` and the ``pg_current_wal_lsn()`` difference, COMMIT
included), heap and index bytes per row. And what the staging COPY's server side
spends per row on ``_payload`` as ``jsonb`` (parsed) vs ``text``.

``--out`` writes everything as JSON (default ``benchmarks/data/phases/results-<time>.json``).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    SetupError,
    begin_run,
    checkpoint,
    environment,
    fresh_database,
    idem_home_for,
    masked_url,
    peer_bench_home,
    server_record,
    shared_bench_dir,
    spark_on_bench_server,
    start_spark_server_for,
)
from benchmarks.shared_bench import config_for_peer_data, data_shape, peer_python  # noqa: E402
from benchmarks.small_bench import drop_database  # noqa: E402
from idem_platform.postgres.tables import table_ident  # noqa: E402

HERE = Path(__file__).resolve().parent
TYPES = ("indicator", "malware", "threat-actor")
# Process groups, in the tables' column order.
GROUPS = {
    "driver": "idem driver",
    "jvm": "Spark JVM",
    "workers": "Spark Python workers",
    "pg_promote": "PG promote (idem-commit)",
    "pg_stage": "PG staging COPY",
    "pg_idem": "PG idem, other",
    "pg_dagster": "PG Dagster",
    "pg_background": "PG background",
}
SHORT = {
    "driver": "driver",
    "jvm": "JVM",
    "workers": "py wrk",
    "pg_promote": "PG prom",
    "pg_stage": "PG COPY",
    "pg_idem": "PG idem",
    "pg_dagster": "PG dag",
    "pg_background": "PG bg",
}


# --- The data -------------------------------------------------------------------------------


def shared_data(shared: Path, records: int) -> Path:
    """gen.py's data for ``records`` (10 files, 10 % duplicates, seed 42) where run.sh keeps it,
    generated when missing, with this interpreter when it has gen.py's one dependency (orjson),
    else with the peers' venv."""
    data = peer_bench_home() / "data" / f"n{records}"
    if (data / "manifest.json").is_file():
        return data
    python = Path(sys.executable)
    if subprocess.run([str(python), "-c", "import orjson"], capture_output=True).returncode != 0:
        python = peer_python(peer_bench_home())
    print(f"generating the shared data: {records:,} records in 10 files -> {data}", flush=True)
    command = [
        str(python),
        str(shared / "gen.py"),
        "-n",
        str(records),
        "--dup-rate",
        "0.1",
        "--files",
        "10",
        "--out",
        str(data),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"gen.py failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return data


# --- Sampling the processes -----------------------------------------------------------------


@dataclass
class Sampler:
    """CPU seconds per process group and the server's WAL position, sampled in a thread.

    ``series`` holds ``(time.time(), {group: cumulative CPU s}, wal_lsn_bytes)``; a process
    keeps its last sampled CPU once gone, so every group's figure only grows.
    """

    root: int
    server_url: str
    spark_server_pid: int | None
    interval: float
    series: list[tuple[float, dict[str, float], int]] = field(default_factory=list)
    _last: dict[int, tuple[str, float]] = field(default_factory=dict)
    _pg_groups: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    own_cpu: float = 0.0

    def run(self) -> None:
        started = time.thread_time()
        with psycopg.connect(
            self.server_url, autocommit=True, application_name="phases-bench"
        ) as conn:
            own = conn.info.backend_pid
            postmaster = psutil.Process(own).ppid()
            while not self._stop.is_set():
                self._sample(conn, own, postmaster)
                self._stop.wait(self.interval)
            self._sample(conn, own, postmaster)
        self.own_cpu = time.thread_time() - started

    def stop(self) -> None:
        self._stop.set()

    def _sample(self, conn: psycopg.Connection, own: int, postmaster: int) -> None:
        now = time.time()
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        lsn = int(row[0]) if row else 0
        for pid, group in self._spark_processes():
            self._record(pid, group)
        backends = [c.pid for c in _children(postmaster) if c.pid != own]
        unknown = [pid for pid in backends if pid not in self._pg_groups]
        if unknown:
            self._classify(conn, unknown)
        for pid in backends:
            self._record(pid, self._pg_groups.get(pid, "pg_background"))
        totals = dict.fromkeys(GROUPS, 0.0)
        for group, cpu in self._last.values():
            totals[group] += cpu
        self.series.append((now, totals, lsn))

    def _spark_processes(self) -> list[tuple[int, str]]:
        """The driver, the JVM(s) of the run or the Connect server, and their Python workers."""
        out = [(self.root, "driver")]
        roots = [self.root] + ([self.spark_server_pid] if self.spark_server_pid else [])
        for top in roots:
            for child in _children(top, recursive=True):
                try:
                    name = child.name()
                except psutil.Error:
                    continue
                if name == "java":
                    out.append((child.pid, "jvm"))
                elif name.startswith("python"):  # pyspark.daemon and its workers
                    out.append((child.pid, "workers"))
        if self.spark_server_pid:
            out.append((self.spark_server_pid, "jvm"))
        return out

    def _classify(self, conn: psycopg.Connection, pids: list[int]) -> None:
        rows = conn.execute(
            "SELECT pid, coalesce(application_name, ''), backend_type, coalesce(datname, '') "
            "FROM pg_stat_activity WHERE pid = ANY(%s)",
            [pids],
        ).fetchall()
        for pid, app, backend_type, database in rows:
            if backend_type != "client backend":
                self._pg_groups[pid] = "pg_background"
            elif app == "idem-commit":
                self._pg_groups[pid] = "pg_promote"
            elif app.startswith("idem-stage"):
                self._pg_groups[pid] = "pg_stage"
            elif database == "idem_bench_dagster":
                self._pg_groups[pid] = "pg_dagster"
            elif app.startswith("idem"):
                self._pg_groups[pid] = "pg_idem"
            # else: not classified yet (a connection still authenticating): asked again next sample

    def _record(self, pid: int, group: str) -> None:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return
        self._last[pid] = (group, times.user + times.system)

    def at(self, moment: float) -> tuple[dict[str, float], float]:
        """Each group's cumulative CPU seconds and the WAL position at ``moment`` (interpolated)."""
        times = [s[0] for s in self.series]
        i = bisect.bisect_left(times, moment)
        if i <= 0:
            return dict(self.series[0][1]), float(self.series[0][2])
        if i >= len(self.series):
            return dict(self.series[-1][1]), float(self.series[-1][2])
        (t0, a, w0), (t1, b, w1) = self.series[i - 1], self.series[i]
        share = (moment - t0) / (t1 - t0) if t1 > t0 else 1.0
        return {g: a[g] + (b[g] - a[g]) * share for g in GROUPS}, w0 + (w1 - w0) * share


def _children(pid: int, *, recursive: bool = False) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=recursive)
    except psutil.Error:
        return []


# --- One run, its phases --------------------------------------------------------------------


@dataclass
class Run:
    """One measured `idem ingest`: its wall clock marks, summary and samples."""

    case: str
    started: float
    ended: float
    summary: dict[str, Any]
    events: list[tuple[str, str, float]]
    sampler: Sampler


def run_ingest(
    case: str,
    files: list[Path],
    env: dict[str, str],
    config: Path,
    server_url: str,
    spark_server_pid: int | None,
    interval: float,
) -> Run:
    """CHECKPOINT, then ``idem ingest`` of ``files`` as a child process, sampled; its run's Dagster events."""
    checkpoint(server_url)
    command = [
        sys.executable,
        "-m",
        "idem_platform.cli",
        "ingest",
        "--config",
        str(config),
        "--connector",
        "feed",
        *map(str, files),
    ]
    started = time.time()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    sampler = Sampler(process.pid, server_url, spark_server_pid, interval)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    stdout, stderr = process.communicate()
    ended = time.time()
    sampler.stop()
    thread.join()
    if process.returncode != 0:
        raise RuntimeError(f"{case}: idem ingest failed:\n{stderr[-4000:]}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    return Run(
        case,
        started,
        ended,
        summary,
        dagster_events(env["IDEM_BENCH_DAGSTER_URL"], summary["commit_id"]),
        sampler,
    )


def dagster_events(url: str, commit_id: str) -> list[tuple[str, str, float]]:
    """The step and run events of the Dagster run that made commit ``commit_id`` (its
    materialization's metadata names it): (event type, step key, epoch seconds)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT dagster_event_type, coalesce(step_key, ''), timestamp FROM event_logs WHERE run_id = "
            "(SELECT run_id FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION' "
            "AND event LIKE %s ORDER BY id DESC LIMIT 1) AND dagster_event_type IS NOT NULL ORDER BY id",
            [f"%{commit_id}%"],
        ).fetchall()
    return [(kind, step, stamp.replace(tzinfo=UTC).timestamp()) for kind, step, stamp in rows]


def _event(events: list[tuple[str, str, float]], kind: str, step_suffix: str = "") -> float:
    for event_kind, step, stamp in events:
        if event_kind == kind and step.endswith(step_suffix):
            return stamp
    raise RuntimeError(f"the run's event log has no {kind} {step_suffix}".strip())


def phases(run: Run) -> list[tuple[str, float, float]]:
    """The run's phases as (name, start, end) epoch seconds, in order, end to end."""
    timings = run.summary.get("timings") or {}
    events = run.events
    planning, planned = (
        _event(events, "STEP_START", "__ingest"),
        _event(events, "STEP_SUCCESS", "__ingest"),
    )
    commit_step = _event(events, "STEP_INPUT", "__committed")
    spark = commit_step + float(timings.get("spark_session_seconds", 0.0))
    staging = commit_step + float(timings["prepare_seconds"])
    staged = staging + float(timings["stage_and_insert_seconds"])
    committing = staged + float(timings["finish_seconds"]) - float(timings["commit_seconds"])
    committed = committing + float(timings["commit_seconds"])
    marks = [
        ("interpreter, imports, Dagster start", run.started),
        ("planning and hashing (ingest step)", planning),
        ("Dagster: coerced step, contract check", planned),
        ("Spark start or connect", commit_step),
        ("claim, staging tables", spark),
        ("staging: executors + COPY, promote streamed", staging),
        ("finish: last INSERTs, checks, ledger", staged),
        ("COMMIT", committing),
        ("Dagster: materializations, checks, run end", committed),
        ("exit: Spark stop, teardown", _event(events, "PIPELINE_SUCCESS")),
    ]
    ends = [mark for _, mark in marks[1:]] + [run.ended]
    return [(name, start, end) for (name, start), end in zip(marks, ends, strict=True)]


def phase_rows(run: Run) -> list[dict[str, Any]]:
    """Per phase (and the whole run): wall seconds, CPU seconds per process group, WAL bytes."""
    rows = []
    spans = phases(run)
    for name, start, end in [*spans, ("whole run", run.started, run.ended)]:
        (cpu0, wal0), (cpu1, wal1) = run.sampler.at(start), run.sampler.at(end)
        cpu = {g: round(max(0.0, cpu1[g] - cpu0[g]), 3) for g in GROUPS}
        rows.append(
            {
                "phase": name,
                "wall_s": round(end - start, 3),
                "cpu_s": cpu,
                "cpu_total_s": round(sum(cpu.values()), 3),
                "wal_bytes": int(wal1 - wal0),
            }
        )
    return rows


def per_record(run: Run, rows: list[dict[str, Any]], records: int) -> dict[str, Any]:
    """The run's per-record figures: each process group's CPU µs per input line and the
    promote's per-row cost (its backend's CPU and the insert seconds per row written)."""
    whole = rows[-1]
    written = int(run.summary["rows_written"])
    timings = run.summary.get("timings") or {}
    return {
        "cpu_us_per_input_line": {g: round(whole["cpu_s"][g] / records * 1e6, 2) for g in GROUPS},
        "promote_backend_cpu_us_per_row_written": round(
            whole["cpu_s"]["pg_promote"] / written * 1e6, 2
        )
        if written
        else None,
        "insert_seconds": timings.get("insert_seconds"),
        "insert_us_per_row_written": round(
            float(timings.get("insert_seconds", 0)) / written * 1e6, 2
        )
        if written
        else None,
        "stage_task_seconds_sum": round(sum(timings.get("stage_task_seconds") or []), 2),
        "wal_bytes_per_row_written": round(whole["wal_bytes"] / written, 1) if written else None,
        "sampler_own_cpu_s": round(run.sampler.own_cpu, 3),
        "samples": len(run.sampler.series),
    }


def print_phases(
    case: str, rows: list[dict[str, Any]], figures: dict[str, Any], load: list[float]
) -> None:
    """One table: a row per phase, wall seconds and each process group's CPU seconds."""
    print(f"\n{case}: wall and CPU seconds per phase and process (load average before: {load})")
    head = (
        f"  {'phase':46} {'wall':>7} "
        + " ".join(f"{SHORT[g]:>7}" for g in GROUPS)
        + f" {'CPU':>7} {'cores':>5} {'WAL MB':>7}"
    )
    print(head)
    for row in rows:
        cores = row["cpu_total_s"] / row["wall_s"] if row["wall_s"] > 0 else 0.0
        print(
            f"  {row['phase']:46} {row['wall_s']:7.2f} "
            + " ".join(f"{row['cpu_s'][g]:7.2f}" for g in GROUPS)
            + f" {row['cpu_total_s']:7.2f} {cores:5.2f} {row['wal_bytes'] / 2**20:7.1f}"
        )
    per_line = figures["cpu_us_per_input_line"]
    print("  CPU µs per input line: " + ", ".join(f"{GROUPS[g]} {per_line[g]:.1f}" for g in GROUPS))
    print(
        f"  promote: insert_seconds {figures['insert_seconds']} ({figures['insert_us_per_row_written']} µs/row written), "
        f"its backend's CPU {figures['promote_backend_cpu_us_per_row_written']} µs/row; "
        f"WAL {figures['wal_bytes_per_row_written']} B/row written; executors' tasks {figures['stage_task_seconds_sum']} s "
        f"summed; sampler's own CPU {figures['sampler_own_cpu_s']} s over {figures['samples']} samples"
    )


# --- What PostgreSQL spends per row in the promote ------------------------------------------

STAGE = "phases_stage_{}"
TARGET = "phases_target"
# (name, primary key, secondary index, _payload as: jsonb / text / None)
VARIANTS = (
    ("as the product (key, _commit_id index, _payload jsonb)", True, True, "jsonb"),
    ("no secondary index", True, False, "jsonb"),
    ("no primary key, no index (no anti-join)", False, False, "jsonb"),
    ("_payload text", True, True, "text"),
    ("no _payload", True, True, None),
    ("heap only: no key, no index, no _payload", False, False, None),
)


def stage_equivalents(conn: psycopg.Connection) -> dict[str, int]:
    """Per record type, an UNLOGGED table shaped as the commit's staging (the system columns,
    the typed non-dynamic columns, ``_payload`` also as text) holding the committed rows plus
    a tenth of them again (the data's duplicate share); its row count."""
    counts = {}
    for record_type in TYPES:
        stage = sql.Identifier(STAGE.format(record_type.replace("-", "_")))
        typed = [
            c
            for (c,) in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
                "AND attname NOT LIKE '\\_%%' AND attname <> 'props' AND atttypid <> 'jsonb'::regtype ORDER BY attnum",
                [table_ident(record_type).as_string(conn)],
            ).fetchall()
        ]
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in typed)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stage))
        conn.execute(
            sql.SQL(
                "CREATE UNLOGGED TABLE {stage} AS SELECT row_number() OVER () AS _pos, * FROM ("
                "SELECT _idempotency_key, _external_id, _content_hash, _source, _payload, _payload::text AS _payload_text, "
                "NULL::jsonb AS _extra, props AS _props, NULL::jsonb AS _meta, NULL::int AS _version, "
                "NULL::jsonb AS _upgraded, {columns} FROM {source} "
                "UNION ALL SELECT _idempotency_key, _external_id, _content_hash, _source, _payload, _payload::text, "
                "NULL, props, NULL, NULL, NULL, {columns} FROM {source} WHERE abs(hashtext(_idempotency_key)) % 10 = 0) s"
            ).format(stage=stage, columns=columns, source=table_ident(record_type))
        )
        conn.execute(sql.SQL("ANALYZE {}").format(stage))
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(stage)).fetchone()
        counts[record_type] = int(row[0]) if row else 0
    return counts


def promote_statement(
    conn: psycopg.Connection, record_type: str, key: bool, payload: str | None
) -> sql.Composed:
    """The promote's INSERT … SELECT (rows.insert_rows' shape) from the staged equivalent into TARGET."""
    dynamic = {
        n
        for (n,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND atttypid = 'jsonb'::regtype "
            "AND attname NOT LIKE '\\_%%' AND attname <> 'props'",
            [table_ident(record_type).as_string(conn)],
        ).fetchall()
    }
    typed = [
        n
        for (n,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attname NOT LIKE '\\_%%' AND attname <> 'props' ORDER BY attnum",
            [table_ident(record_type).as_string(conn)],
        ).fetchall()
    ]
    system = [
        "_idempotency_key",
        "_connector",
        "_record_type",
        "_external_id",
        "_content_hash",
        "_schema_version",
        "_commit_id",
        "_ingested_at",
        "_source",
    ] + (["_payload"] if payload else [])
    select = [
        sql.SQL(
            "s._idempotency_key, 'feed', {}, s._external_id, s._content_hash, coalesce(s._version, 1), "
            "{}::uuid, now(), s._source"
        ).format(sql.Literal(record_type), sql.Literal(str(uuid.uuid4())))
    ]
    if payload:
        select.append(sql.SQL("s._payload" if payload == "jsonb" else "s._payload_text"))
    select += [
        sql.SQL("NULLIF(coalesce(s._upgraded, s._payload) -> {}, 'null'::jsonb)").format(
            sql.Literal(c)
        )
        if c in dynamic
        else sql.SQL("s.{}").format(sql.Identifier(c))
        for c in typed
    ]
    select.append(sql.SQL("s._props"))
    anti_join = (
        sql.SQL(
            " WHERE NOT EXISTS (SELECT 1 FROM {t} t WHERE t._idempotency_key = s._idempotency_key)"
        ).format(t=sql.Identifier(TARGET))
        if key
        else sql.SQL("")
    )
    return sql.SQL(
        "INSERT INTO {t} ({columns}) SELECT DISTINCT ON (s._idempotency_key) {select} FROM {stage} s{anti_join} "
        "ORDER BY s._idempotency_key, s._pos"
    ).format(
        t=sql.Identifier(TARGET),
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in [*system, *typed, "props"]),
        select=sql.SQL(", ").join(select),
        stage=sql.Identifier(STAGE.format(record_type.replace("-", "_"))),
        anti_join=anti_join,
    )


def make_target(
    conn: psycopg.Connection, record_type: str, key: bool, index: bool, payload: str | None
) -> None:
    """TARGET: the record type's table's columns, with the variant's key, index and ``_payload``."""
    target = sql.Identifier(TARGET)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
    conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
            target, table_ident(record_type)
        )
    )
    if key:
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (_idempotency_key)").format(target))
    if index:
        conn.execute(sql.SQL("CREATE INDEX ON {} (_commit_id)").format(target))
    if payload is None:
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN _payload").format(target))
    elif payload == "text":
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN _payload TYPE text").format(target))


def promote_once(
    conn: psycopg.Connection, record_type: str, variant: tuple[str, bool, bool, str | None]
) -> dict[str, float]:
    """One variant's promote of one record type into an empty TARGET, in a transaction set up
    as the product's apply sets it: execution ms, WAL bytes (EXPLAIN and LSN), backend CPU, sizes."""
    _, key, index, payload = variant
    make_target(conn, record_type, key, index, payload)
    statement = promote_statement(conn, record_type, key, payload)
    conn.execute("CHECKPOINT")
    backend = psutil.Process(conn.info.backend_pid)
    cpu0, lsn0 = sum(backend.cpu_times()[:2]), _lsn(conn)
    started = time.monotonic()
    conn.execute("BEGIN")
    conn.execute("SET LOCAL work_mem = '256MB'")
    conn.execute("SET LOCAL enable_hashjoin = off")
    conn.execute("SET LOCAL enable_mergejoin = off")
    row = conn.execute(
        sql.SQL("EXPLAIN (ANALYZE, WAL, TIMING OFF, FORMAT JSON) {}").format(statement)
    ).fetchone()
    conn.execute("COMMIT")
    seconds = time.monotonic() - started
    cpu1, lsn1 = sum(backend.cpu_times()[:2]), _lsn(conn)
    plan = (row[0] if row else [{}])[0]
    top = plan.get("Plan", {})
    sizes = conn.execute(
        "SELECT pg_table_size(%(t)s), pg_indexes_size(%(t)s), (SELECT count(*) FROM "
        + TARGET
        + ")",
        {"t": TARGET},
    ).fetchone()
    assert sizes is not None
    return {
        "rows": int(sizes[2]),
        "seconds": seconds,
        "execution_ms": float(plan.get("Execution Time", 0.0)),
        "backend_cpu_s": cpu1 - cpu0,
        "wal_bytes_explain": float(top.get("WAL Bytes", 0)),
        "wal_bytes_lsn": float(lsn1 - lsn0),
        "table_bytes": float(sizes[0]),
        "index_bytes": float(sizes[1]),
    }


def _lsn(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def _stage_name(record_type: str) -> sql.Identifier:
    return sql.Identifier(STAGE.format(record_type.replace("-", "_")))


def per_row(variant: str, runs: list[dict[str, float]]) -> dict[str, Any]:
    """One variant's round: its record types' figures summed, per row."""
    total = {k: sum(r[k] for r in runs) for k in runs[0]}
    rows = total["rows"]
    return {
        "variant": variant,
        "rows": int(rows),
        "us_per_row": round(total["seconds"] / rows * 1e6, 2),
        "execution_us_per_row": round(total["execution_ms"] / rows * 1e3, 2),
        "backend_cpu_us_per_row": round(total["backend_cpu_s"] / rows * 1e6, 2),
        "wal_bytes_per_row_explain": round(total["wal_bytes_explain"] / rows, 1),
        "wal_bytes_per_row_lsn": round(total["wal_bytes_lsn"] / rows, 1),
        "table_bytes_per_row": round(total["table_bytes"] / rows, 1),
        "index_bytes_per_row": round(total["index_bytes"] / rows, 1),
    }


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds of one variant (its name and rows kept)."""
    out = dict(rounds[0])
    for key, value in rounds[0].items():
        if isinstance(value, float):
            out[key] = round(statistics.median(r[key] for r in rounds), 2)
    out["rounds"] = len(rounds)
    return out


def promote_costs(url: str, rounds: int) -> dict[str, Any]:
    """Each variant's promote of every record type from the staged equivalents, per row:
    the median of ``rounds`` rounds, the variants in the same order each round."""
    with psycopg.connect(url, autocommit=True, application_name="phases-bench-promote") as conn:
        staged = stage_equivalents(conn)
        stage_bytes = 0
        for record_type in TYPES:
            row = conn.execute(
                "SELECT pg_table_size(%s)", [_stage_name(record_type).as_string(conn)]
            ).fetchone()
            stage_bytes += int(row[0]) if row else 0
        measured: dict[str, list[dict[str, Any]]] = {v[0]: [] for v in VARIANTS}
        for _ in range(rounds):
            for variant in VARIANTS:
                runs = [promote_once(conn, record_type, variant) for record_type in TYPES]
                measured[variant[0]].append(per_row(variant[0], runs))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TARGET)))
        copy = copy_payload_costs(conn, rounds)
        for record_type in TYPES:
            conn.execute(sql.SQL("DROP TABLE {}").format(_stage_name(record_type)))
    staged_rows = sum(staged.values())
    return {
        "staged_rows": staged_rows,
        "staged_bytes_per_row": round(stage_bytes / staged_rows, 1),
        "rounds": rounds,
        "variants": [medians(measured[v[0]]) for v in VARIANTS],
        "variant_rounds": measured,
        "staging_copy": copy,
    }


def copy_payload_costs(conn: psycopg.Connection, rounds: int) -> list[dict[str, Any]]:
    """The staging COPY's server side for ``_payload`` alone: the staged payloads (as text)
    COPYed into an UNLOGGED table whose column is ``jsonb`` (parsed, as staging does) or
    ``text``; the median of ``rounds``."""
    texts = bytearray()
    for record_type in TYPES:
        query = sql.SQL("COPY (SELECT _payload_text FROM {}) TO STDOUT").format(
            _stage_name(record_type)
        )
        with conn.cursor().copy(query) as copy:
            for chunk in copy:
                texts += chunk
    rows = texts.count(b"\n")
    backend = psutil.Process(conn.info.backend_pid)
    measured: dict[str, list[dict[str, Any]]] = {"jsonb": [], "text": []}
    for _ in range(rounds):
        for kind in measured:
            conn.execute("DROP TABLE IF EXISTS phases_copy")
            conn.execute(
                f"CREATE UNLOGGED TABLE phases_copy (_payload {kind}) WITH (autovacuum_enabled = off)"
            )
            cpu0, started = sum(backend.cpu_times()[:2]), time.monotonic()
            with conn.cursor().copy("COPY phases_copy FROM STDIN") as copy:
                view = memoryview(texts)
                for offset in range(0, len(view), 8 << 20):
                    copy.write(view[offset : offset + (8 << 20)])
            seconds, cpu = time.monotonic() - started, sum(backend.cpu_times()[:2]) - cpu0
            measured[kind].append(
                {
                    "payload": kind,
                    "rows": rows,
                    "us_per_row": round(seconds / rows * 1e6, 2),
                    "backend_cpu_us_per_row": round(cpu / rows * 1e6, 2),
                    "bytes_per_row": round(len(texts) / rows, 1),
                }
            )
    conn.execute("DROP TABLE phases_copy")
    return [medians(runs) for runs in measured.values()]


def print_promote(costs: dict[str, Any]) -> None:
    print(
        f"\nthe promote per row: {costs['staged_rows']:,} staged rows ({costs['staged_bytes_per_row']} B/row staged) "
        "into empty tables, INSERT … SELECT as the product's (DISTINCT ON key, anti-join on the key)"
    )
    print(
        f"  {'variant':48} {'µs/row':>7} {'exec':>7} {'CPU':>7} {'WAL B':>7} {'WAL B*':>7} {'heap B':>7} {'index B':>7}"
    )
    for v in costs["variants"]:
        print(
            f"  {v['variant']:48} {v['us_per_row']:7.2f} {v['execution_us_per_row']:7.2f} {v['backend_cpu_us_per_row']:7.2f} "
            f"{v['wal_bytes_per_row_explain']:7.0f} {v['wal_bytes_per_row_lsn']:7.0f} {v['table_bytes_per_row']:7.0f} "
            f"{v['index_bytes_per_row']:7.0f}"
        )
    print(
        "  (µs/row: statement + COMMIT wall; exec: EXPLAIN ANALYZE's execution time; CPU: the backend's; "
        "WAL B: EXPLAIN's WAL bytes; WAL B*: pg_current_wal_lsn() difference, COMMIT and the server's other writers included)"
    )
    for c in costs["staging_copy"]:
        print(
            f"  staging COPY of _payload as {c['payload']:5}: {c['us_per_row']:.2f} µs/row wall, "
            f"{c['backend_cpu_us_per_row']:.2f} µs/row backend CPU ({c['bytes_per_row']} B/row)"
        )


# --- The cases ------------------------------------------------------------------------------


def spark_server_pid(home: Path) -> int | None:
    """The pid of the Spark Connect server ``idem spark start`` left under the benchmark's idem home."""
    state = idem_home_for(home) / "spark" / "connect.json"
    if not state.is_file():
        return None
    pid = json.loads(state.read_text(encoding="utf-8")).get("pid")
    return int(pid) if pid else None


def measure_case(
    case: str,
    server_url: str,
    config: Path,
    files: list[Path],
    home: Path,
    args: argparse.Namespace,
    shape: dict[str, Any],
) -> dict[str, Any]:
    """One case: (warm) the Spark server started and warmed up, then the measured run into a fresh
    database; its phases, per-record figures and, for the last case, the promote's per-row costs."""
    load = [round(x, 2) for x in os.getloadavg()]
    pid, warm_up = None, None
    if case == "warm":
        env = environment(
            fresh_database(server_url, "idem_phases_warmup"), home, args.master, "auto"
        )
        started = time.monotonic()
        start_spark_server_for(home, args.master, config, env)
        server_start = time.monotonic() - started
        pid = spark_server_pid(home)
        first = run_ingest("warm-up", files, env, config, server_url, pid, args.interval)
        drop_database(server_url, env["IDEM_POSTGRES_URL"])
        warm_up = {
            "server_start_s": round(server_start, 2),
            "first_run_wall_s": round(first.ended - first.started, 2),
        }
        print(
            f"warm: the Spark Connect server started in {server_start:.2f} s; its first run (JIT warm-up, not "
            f"measured below) took {warm_up['first_run_wall_s']:.2f} s",
            flush=True,
        )
        load = [round(x, 2) for x in os.getloadavg()]
    url = fresh_database(server_url, f"idem_phases_{case}")
    env = environment(url, home, args.master, "auto" if case == "warm" else "off")
    run = run_ingest(case, files, env, config, server_url, pid, args.interval)
    if run.summary["rows_written"] != shape["unique_records"]:
        raise RuntimeError(
            f"{case}: wrote {run.summary['rows_written']} rows, expected {shape['unique_records']}"
        )
    rows = phase_rows(run)
    figures = per_record(run, rows, shape["records"])
    print_phases(
        f"{case} ({'a local Spark JVM started by the run' if case == 'cold' else 'the Spark Connect server'})",
        rows,
        figures,
        load,
    )
    promote = None
    if not args.no_promote and case == args.cases[-1]:
        promote = promote_costs(url, args.promote_rounds)
        print_promote(promote)
    drop_database(server_url, url)
    return {
        "case": case,
        "load_average_before": load,
        "wall_s": round(run.ended - run.started, 3),
        "warm_up": warm_up,
        "summary_timings": run.summary.get("timings"),
        "phases": rows,
        "per_record": figures,
        "promote": promote,
        "dagster_events": run.events,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--records", type=int, default=1_000_000, help="gen.py's N (10 files, 10 %% duplicates)"
    )
    parser.add_argument(
        "--shared",
        help="the shared benchmark directory (default: $IDEM_SHARED_BENCH, else ../shared/bench)",
    )
    parser.add_argument("--postgres", help="a running local server's URL instead of pg_up.sh's")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--cases",
        default="cold,warm",
        type=lambda s: [c for c in s.split(",") if c],
        help="which cases, in this order: cold, warm (the promote's per-row costs follow the last)",
    )
    parser.add_argument(
        "--no-promote", action="store_true", help="leave out the promote's per-row variants"
    )
    parser.add_argument(
        "--promote-rounds", type=int, default=3, help="rounds of the promote's variants (median)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.2, help="seconds between process samples"
    )
    parser.add_argument("--workdir", default=str(HERE / "data" / "phases"))
    parser.add_argument("--out", help="results as JSON (default: <workdir>/results-<time>.json)")
    args = parser.parse_args()
    if not set(args.cases) <= {"cold", "warm"}:
        parser.error("--cases takes cold and/or warm")
    return args


def main() -> int:
    args = parse_args()
    workdir, out_path, machine = begin_run(args.workdir, args.out)
    home = workdir / "dagster_home"
    try:
        shared = shared_bench_dir(args.shared)
        with spark_on_bench_server(args.postgres, args.shared, home) as (server, facts):
            shape = data_shape(shared_data(shared, args.records))
            files = [
                Path(shape["directory"]) / name
                for name in sorted(os.listdir(shape["directory"]))
                if name.endswith(".ndjson")
            ]
            config = config_for_peer_data(workdir)
            print(
                f"server: {masked_url(server.url)} ({server.via}; PostgreSQL {facts['server_version']}), machine: "
                f"{machine['cpus']} CPUs, load {machine['load_average']}\ndata: {shape['files']} files, "
                f"{shape['bytes']:,} bytes, {shape['records']:,} records ({shape['unique_records']:,} unique)",
                flush=True,
            )
            cases = [
                measure_case(case, server.url, config, files, home, args, shape)
                for case in args.cases
            ]
    except SetupError as exc:
        print(f"phases_bench: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"phases_bench: {exc}", file=sys.stderr)
        return 1
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(
        json.dumps(
            {
                "benchmark": "phases_bench",
                "args": vars(args),
                "machine": machine,
                "server": server_record(server, facts),
                "data": shape,
                "groups": GROUPS,
                "cases": cases,
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            },
            indent=1,
            default=str,
        ),
        encoding="utf-8",
    )
    print(f"\nresults: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
