"""What the benchmarks share: seeded data files, a fresh database, running `idem ingest` and watching it.

Every phase runs the real CLI (`idem ingest`, the same Dagster job the sensor
launches, in process) as a child process, so the figures include everything a
user pays: interpreter start, Dagster, the Spark session and the commit. A
watcher samples the resident memory of the driver (the Python process) and of
the Spark driver JVM every 50 ms.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

from idem_platform.postgres.tables import table_ident
from idem_platform.samples import write_threatfeed

REPO = Path(__file__).resolve().parents[1]
CONFIG = """
connectors:
  - name: threatfeed
    kind: filedrop
    path: drop
    record_type_field: type
    id_field: id
tables:
  indicator:
    columns:
      name: {type: string, required: true}
      confidence: int
      score: real
      created: timestamp
      embedding: vector(8)
      tags: dynamic
      active: bool
      source: string
  malware:
    columns:
      name: {type: string, required: true}
      family: string
      first_seen: timestamp
      sample_size: long
      is_packed: bool
      labels: dynamic
      score: real
      platform: string
  threat-actor:
    columns:
      name: {type: string, required: true}
      aliases: dynamic
      sophistication: int
      score: real
      last_seen: timestamp
      observed_count: long
      motivation: string
      country: string
spark:
  conf:
    spark.ui.enabled: "false"
"""
TABLES = ("indicator", "malware", "threat-actor")


def data_file(directory: Path, records: int, *, seed: int = 42) -> Path:
    """The seeded feed of ``records`` lines (10 % duplicates), generated once and reused."""
    path = directory / f"threatfeed-{records}-s{seed}.ndjson"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        write_threatfeed(path, records, seed=seed, duplicate_ratio=0.10)
    return path


def copy_of(path: Path, target: Path) -> Path:
    """The same records in a new file (one extra newline: other bytes, other file key)."""
    shutil.copyfile(path, target)
    with target.open("ab") as handle:
        handle.write(b"\n")
    return target


def fresh_database(server_url: str, name: str) -> str:
    """Drop and create ``name`` on the server; return its URL."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return _database_url(server_url, name)


def _database_url(server_url: str, name: str) -> str:
    """``server_url`` with its database replaced by ``name``: a URL stays a URL (Dagster's
    storage parses it with SQLAlchemy, which takes no ``key=value`` conninfo), keeping its
    query (``?host=<socket dir>`` for the embedded server)."""
    if not server_url.startswith(("postgresql://", "postgres://")):
        info = psycopg.conninfo.conninfo_to_dict(server_url)
        info["dbname"] = name
        return psycopg.conninfo.make_conninfo(**info)
    head, _, query = server_url.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{name}" + (f"?{query}" if query else "")


@dataclass
class Watch:
    """Peak resident memory of a process tree, sampled in a thread."""

    pid: int
    driver_peak: int = 0
    jvm_peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                self.driver_peak = max(self.driver_peak, root.memory_info().rss)
                for child in root.children(recursive=True):
                    if child.name() == "java":
                        self.jvm_peak = max(self.jvm_peak, child.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Phase:
    """One measured `idem ingest`."""

    name: str
    records: int
    wall: float
    summary: dict[str, Any]
    driver_peak_mib: float
    jvm_peak_mib: float

    @property
    def rows_per_second(self) -> float:
        return self.records / self.wall if self.wall else 0.0


def run_idem(name: str, args: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any], float, float]:
    """Run ``idem ARGS`` in a child process, watching its memory: wall seconds, its JSON
    summary (the last line of stdout), and the peak MiB of the driver and the Spark JVM."""
    command = [sys.executable, "-m", "idem_platform.cli", *args]
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = Watch(process.pid)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    stdout, stderr = process.communicate()
    wall = time.monotonic() - started
    watch.stop()
    thread.join()
    if process.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{stderr[-4000:]}")
    return wall, json.loads(stdout.strip().splitlines()[-1]), watch.driver_peak / 2**20, watch.jvm_peak / 2**20


def run_ingest(
    name: str, path: Path | None, records: int, env: dict[str, str], config: Path, *, connector: str = "threatfeed"
) -> Phase:
    """Run `idem ingest` (of ``path``, or of a Kafka connector's lag) in a child process and measure it."""
    args = ["ingest", "--config", str(config), "--connector", connector, *([str(path)] if path is not None else [])]
    wall, summary, driver, jvm = run_idem(name, args, env)
    return Phase(name, records, wall, summary, driver, jvm)


DAGSTER_DATABASE = "idem_bench_dagster"


def environment(url: str, home: Path, master: str, spark_server: str = "off") -> dict[str, str]:
    """The child's environment: idem's tables in ``url``, Dagster's instance as the product has it.

    The instance is idem's own ``dagster.yaml`` (storage on PostgreSQL, as ``idem ingest``
    and ``idem dev`` set it up), in a database of the same server that outlives the
    rounds (:data:`DAGSTER_DATABASE`), as a deployment's instance does: a fresh database
    per round would time Dagster creating its schema in every first ingest. Before
    2026-11-23 the benchmarks left ``dagster.yaml`` out, so Dagster fell back to SQLite
    files under ``home``.

    ``spark_server``: ``auto`` runs as ``idem ingest`` does by default, on the long-lived
    Spark Connect server of ``<home>/../idem_home/spark`` when one is up (started by
    :func:`start_spark_server_for`, stopped by :func:`stop_spark_server`: no run starts
    one); ``off`` starts a JVM in every run.
    """
    env = {
        **os.environ, "IDEM_POSTGRES_URL": url, "IDEM_SPARK_MASTER": master, "DAGSTER_HOME": str(home),
        "IDEM_SPARK_SERVER": spark_server, "IDEM_HOME": str(idem_home_for(home)),
    }
    env.pop("IDEM_FAULT", None)
    env.pop("IDEM_SPARK_REMOTE", None)
    home.mkdir(parents=True, exist_ok=True)
    instance_url = _database_url(url, DAGSTER_DATABASE)
    with psycopg.connect(url, autocommit=True) as admin:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DAGSTER_DATABASE]).fetchone() is None:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DAGSTER_DATABASE)))
    template = (REPO / "idem_platform" / "dagster.yaml").read_text(encoding="utf-8")
    (home / "dagster.yaml").write_text(template.replace("env: IDEM_POSTGRES_URL", "env: IDEM_BENCH_DAGSTER_URL"), encoding="utf-8")
    env["IDEM_BENCH_DAGSTER_URL"] = instance_url
    return env


def idem_home_for(home: Path) -> Path:
    """The benchmark's idem home (the Spark server's state), beside its Dagster home."""
    return home.parent / "idem_home"


def start_spark_server_for(home: Path, master: str, config: Path, env: dict[str, str]) -> float:
    """Start the Spark Connect server that runs of ``spark_server="auto"`` use (``idem spark
    start``, as a person does: no run starts one); ``time.monotonic()`` once it answers.

    Raises:
        SetupError: it did not start.
    """
    directory = idem_home_for(home) / "spark"
    command = [sys.executable, "-m", "idem_platform.cli", "spark", "start", "--dir", str(directory),
               "--master", master, "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)
    if done.returncode != 0:
        raise SetupError(f"the Spark Connect server in {directory} did not start: {done.stderr.strip()[-1000:]}")
    return time.monotonic()


def stop_spark_server(home: Path) -> None:
    """Stop the Spark Connect server :func:`start_spark_server_for` started (if any)."""
    directory = idem_home_for(home) / "spark"
    if (directory / "connect.json").exists():
        subprocess.run([sys.executable, "-m", "idem_platform.cli", "spark", "stop", "--dir", str(directory)],
                       capture_output=True, timeout=120, check=False)


def copy_baseline(url: str, records: int) -> float:
    """Seconds to COPY the committed rows (as CSV, prepared beforehand) into plain tables.

    The same rows the ingest wrote, with the same column types, into tables
    without a primary key or index: PostgreSQL's own bulk-load floor.
    """
    seconds = 0.0
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            source = table_ident(table)
            target = sql.Identifier(f"copy_baseline_{table}".replace("-", "_"))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
            conn.execute(sql.SQL("CREATE TABLE {} (LIKE {})").format(target, source))
            buffer = bytearray()
            with conn.cursor().copy(sql.SQL("COPY {} TO STDOUT WITH (FORMAT csv)").format(source)) as copy:
                for chunk in copy:
                    buffer += chunk
            started = time.monotonic()
            with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN WITH (FORMAT csv)").format(target)) as copy:
                view = memoryview(buffer)
                for offset in range(0, len(view), 8 << 20):
                    copy.write(view[offset : offset + (8 << 20)])
            seconds += time.monotonic() - started
            conn.execute(sql.SQL("DROP TABLE {}").format(target))
    return seconds


def embedded_server(home: Path) -> str:
    """The embedded PostgreSQL (pgserver) under ``home`` — the product's default."""
    from idem_platform.postgres.embedded import embedded_postgres_url

    return embedded_postgres_url(home)


# --- The shared benchmark (../shared/bench): its PostgreSQL server, found or started --------
#
# ../shared/bench is not part of this repository (CI and other machines may not have it):
# the benchmarks that use it name what they need and stop with one clear line when it is
# missing. Its scripts are called, never copied.

SHARED_BENCH_ENV = "IDEM_SHARED_BENCH"
SHARED_BENCH_FILES = ("gen.py", "bench_copy.py", "bench_dlt.py", "common.py", "pg_up.sh")


class SetupError(RuntimeError):
    """Something the benchmark needs is missing (the shared benchmark, PostgreSQL's binaries...)."""


def shared_bench_dir(given: str | None = None) -> Path:
    """The shared benchmark's directory: ``given`` (``--shared``), else ``$IDEM_SHARED_BENCH``,
    else ``../shared/bench`` beside the repository.

    Raises:
        SetupError: it is not there, or lacks one of the scripts the benchmarks call.
    """
    raw = given or os.environ.get(SHARED_BENCH_ENV) or str(REPO.parent / "shared" / "bench")
    path = Path(raw).expanduser().resolve()
    missing = [name for name in SHARED_BENCH_FILES if not (path / name).is_file()]
    if missing:
        where = "does not exist" if not path.is_dir() else f"lacks {', '.join(missing)}"
        raise SetupError(
            f"the shared benchmark directory {path} {where}. It is not part of this repository: "
            f"pass --shared DIR or set {SHARED_BENCH_ENV} to the directory holding {', '.join(SHARED_BENCH_FILES)}"
        )
    return path


def peer_bench_home() -> Path:
    """Where the shared benchmark writes (its server, venv, data): ``$IDEM_PEER_BENCH_HOME``."""
    return Path(os.environ.get("IDEM_PEER_BENCH_HOME", "/tmp/idem-peer-bench"))


def debian_postgres_bin() -> Path:
    """The PostgreSQL binaries pg_up.sh will use (``$PGBIN``, else the newest
    ``/usr/lib/postgresql/<version>/bin``), checked before pg_up.sh fails less clearly.

    Raises:
        SetupError: no initdb and pg_ctl there.
    """
    given = os.environ.get("PGBIN")
    if given:
        candidate: Path | None = Path(given)
    else:
        found = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: [int(part) if part.isdigit() else 0 for part in p.parent.name.split(".")],
        )
        candidate = found[-1] if found else None
    if candidate is None or not all((candidate / tool).is_file() for tool in ("initdb", "pg_ctl", "psql")):
        raise SetupError(
            "pg_up.sh needs Debian's PostgreSQL binaries (initdb, pg_ctl, psql in "
            f"{candidate or '/usr/lib/postgresql/<version>/bin'}: apt-get install postgresql-15, or set PGBIN=DIR); "
            "or pass --postgres URL to use a server that is already running"
        )
    return candidate


def server_answers(url: str, timeout: int = 3) -> bool:
    """Whether a PostgreSQL server accepts a connection at ``url`` now."""
    try:
        with psycopg.connect(url, connect_timeout=timeout, autocommit=True):
            return True
    except psycopg.OperationalError:
        return False


@dataclass
class BenchServer:
    """The server a benchmark runs on: its URL, and whether this process started it."""

    url: str
    started: bool
    via: str  # "pg_up.sh" or "--postgres"


@contextmanager
def bench_server(postgres: str | None, shared: str | None) -> Iterator[BenchServer]:
    """The server of the shared benchmark: ``--postgres URL`` as given; else pg_up.sh's private
    server (127.0.0.1:$PGPORT, default 55432, user bench), started if it is not running and
    stopped on the way out (``pg_up.sh stop``) only if this process started it.

    Raises:
        SetupError: no server at ``postgres``; the shared benchmark or PostgreSQL's binaries missing.
    """
    if postgres:
        if not server_answers(postgres):
            raise SetupError(f"no PostgreSQL server answers at --postgres {masked_url(postgres)}")
        yield BenchServer(postgres, started=False, via="--postgres")
        return
    pg_up = shared_bench_dir(shared) / "pg_up.sh"
    port = os.environ.get("PGPORT", "55432")
    running = server_answers(f"postgresql://bench@127.0.0.1:{port}/postgres")
    if not running:
        debian_postgres_bin()
    done = subprocess.run([str(pg_up)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not done.stdout.strip():
        raise SetupError(f"{pg_up} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    try:
        yield BenchServer(done.stdout.strip().splitlines()[-1], started=not running, via="pg_up.sh")
    finally:
        if not running:
            subprocess.run([str(pg_up), "stop"], capture_output=True, text=True, timeout=120)


@contextmanager
def spark_on_bench_server(postgres: str | None, shared: str | None, home: Path) -> Iterator[tuple[BenchServer, dict[str, Any]]]:
    """:func:`bench_server` with its :func:`server_facts` (read before any run, for the
    results), and on the way out the Spark Connect server a run under ``home`` may have
    started (:func:`start_spark_server_for`) stopped before the PostgreSQL server is: the
    frame every benchmark that runs ``idem ingest`` on the shared server's runs in.

    Raises:
        SetupError: as :func:`bench_server`.
    """
    with bench_server(postgres, shared) as server:
        try:
            yield server, server_facts(server.url)
        finally:
            stop_spark_server(home)


def server_record(server: BenchServer, facts: dict[str, Any]) -> dict[str, Any]:
    """The server as the results JSON names it: its URL with the password hidden, how it was
    found, whether this run started it, and its :func:`server_facts`."""
    return {"url": masked_url(server.url), "via": server.via, "started_here": server.started, **facts}


def begin_run(workdir: str, out: str | None) -> tuple[Path, Path, dict[str, Any]]:
    """What a benchmark does before anything else: SIGTERM made an exit that runs its cleanups
    (:func:`exit_on_sigterm`); its work directory (made); where its results JSON goes
    (``--out``, else ``<workdir>/results-<time>.json``, so that no run overwrites an earlier
    one's); and the :func:`machine_facts`, read first so that their load average is the
    machine's, not the benchmark's."""
    exit_on_sigterm()
    directory = Path(workdir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    out_path = Path(out) if out else directory / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    return directory, out_path, machine_facts()


def masked_url(url: str) -> str:
    """``url`` with its password hidden, for printed and saved results."""
    from idem_platform.redact import masked

    return masked(url)


def checkpoint(url: str) -> None:
    """CHECKPOINT, as the peers do between timed phases: each phase starts with no dirty buffers."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def quiet_server(url: str) -> float:
    """``VACUUM (ANALYZE)`` of ``url``'s database, then a CHECKPOINT: seconds taken (not timed).

    A tool that has just loaded a million rows leaves its tables to autovacuum, whose
    launcher wakes up to a minute later and then vacuums and analyzes them, several
    CPU-seconds on a two-core machine, inside whatever runs next. Rotating the order
    does not even that out: idem's first ingest followed dlt's load in two rounds of
    three, and those rounds were its slowest. Run between tools, this does that
    maintenance itself, so every tool starts on a quiet server with nothing pending.
    """
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")
    return time.monotonic() - started


def server_facts(url: str) -> dict[str, Any]:
    """The server's version and the settings that move bulk-load figures (for the results)."""
    names = ("shared_buffers", "max_wal_size", "synchronous_commit", "fsync", "work_mem", "maintenance_work_mem")
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        settings = dict(conn.execute("SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name", [list(names)]).fetchall())
    return {"server_version": version[0] if version else None, **settings}


def cpu_speed(loops: int = 5_000_000) -> float:
    """CPU seconds of a fixed pure-Python loop: how fast this machine is right now.

    Shared virtual machines of one kind vary (a neighbour's load on the host): the same
    loop took 0.18 s in one hour and 0.34 s in the next (2026-11-23), and every figure
    moved with it.
    Printed beside results, it tells a slow round from a slow product.
    """
    started = time.process_time()
    total = 0
    for i in range(loops):
        total += i
    return round(time.process_time() - started, 3)


def machine_facts() -> dict[str, Any]:
    """The machine and the commit measured (for the results)."""
    import platform

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True)
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_speed_seconds": cpu_speed(),
        "python": platform.python_version(),
        "commit": commit.stdout.strip() or None,
        "uncommitted_changes": bool(dirty.stdout.strip()),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def exit_on_sigterm() -> None:
    """SIGTERM ends the benchmark like Ctrl-C: cleanups run (idem dev stopped, pg_up.sh stopped if
    started here) rather than leaving a server or a daemon behind."""
    import signal

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
