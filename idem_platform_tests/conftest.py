"""Shared fixtures: real PostgreSQL (one database per test module), one Spark session, configs.

PostgreSQL: ``IDEM_TEST_POSTGRES_URL``, else the server on 127.0.0.1:5432, else an
embedded ``pgserver`` started for the session. Every test module gets its own
database, so modules never see each other's rows.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pyarrow as pa
import pytest
import yaml
from psycopg import sql

from idem_platform.config import IdemConfig, parse_config

# Runs in tests start Spark in their own process (or use the session fixture's): no
# long-lived Spark Connect server is left behind by a test's `idem ingest`. The tests of
# spark.server: auto set it back for their own child processes.
os.environ["IDEM_SPARK_SERVER"] = "off"
from idem_platform.postgres import connect, ensure_schema
from idem_platform.postgres.tables import sync_tables

if TYPE_CHECKING:
    import dagster as dg

    from idem_platform_tests.kafka_broker import Broker

REPO = Path(__file__).resolve().parents[1]


# The key vectors of the design's spec, copied into the project: the tests pass from a
# clone with nothing beside it. test_keys checks the copy against the shared original
# whenever a checkout has one next to it.
SPEC_DIR = REPO / "idem_platform_tests" / "cases" / "spec"


def shared_spec_dir() -> Path | None:
    """The design's ``shared/spec`` next to the checkout (``IDEM_SPEC_DIR`` overrides), if any."""
    explicit = os.environ.get("IDEM_SPEC_DIR")
    if explicit:
        return Path(explicit)
    for ancestor in REPO.parents:
        candidate = ancestor / "shared" / "spec"
        if candidate.is_dir():
            return candidate
    return None
EXAMPLE_CONFIG = REPO / "examples" / "threatfeed" / "idem.yaml"
LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A URL of a server where tests may create databases."""
    explicit = os.environ.get("IDEM_TEST_POSTGRES_URL")
    if explicit:
        yield explicit
        return
    if _reachable(LOCAL_SERVER):
        yield LOCAL_SERVER
        return
    import pgserver

    data = Path(tempfile.mkdtemp(prefix="idem-test-pg-"))
    server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)


def _with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database (URL form: Dagster needs URLs)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


@pytest.fixture(scope="module")
def pg_url(postgres_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for this test module, with the idem schema; dropped afterwards."""
    module = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.rsplit(".", 1)[-1].lower())[:30]
    database = f"idem_{module}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    url = _with_database(postgres_server, database)
    with connect(url, autocommit=True) as conn:
        ensure_schema(conn)
    try:
        yield url
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """The one SparkSession of the test session (local[2], UI off)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from idem_platform.spark.session import build_session

    session = build_session(
        {
            "spark.master": "local[2]",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "1g",
        }
    )
    yield session
    session.stop()


def lines_batch(lines: list[bytes], first_line: int = 1, file_index: int = 0) -> pa.RecordBatch:
    """An ``ingest``-frame batch (``RECORDS_SCHEMA``) of a file's ``lines``, numbered from ``first_line``."""
    from idem_platform.write.batch import RECORDS_SCHEMA

    return pa.RecordBatch.from_arrays(
        [
            pa.array([file_index] * len(lines), pa.int32()),
            pa.array(range(first_line, first_line + len(lines)), pa.int64()),
            pa.array(lines, pa.binary()),
            pa.array([len(line) for line in lines], pa.int64()),
            pa.nulls(len(lines), pa.string()),
            pa.nulls(len(lines), pa.int64()),
        ],
        schema=RECORDS_SCHEMA,
    )


def wait_until_staging(url: str, process: subprocess.Popen[str], timeout: float = 300) -> int:
    """Wait until a running ingest has staged rows (its executors are writing); return how many."""
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "staging never started"
        time.sleep(0.2)
        with connect(url) as conn:
            tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'idem_staging'")]
            staged = sum(conn.execute(f'SELECT count(*) FROM idem_staging."{t}"').fetchone()[0] for t in tables)
        if staged:
            return int(staged)


def example_text() -> str:
    """The example idem.yaml with its file-drop connector only: what the file-drop tests were
    written against (one connector, three record types). The push tests add their own."""
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    data["connectors"] = [c for c in data["connectors"] if c["kind"] == "filedrop"]
    data.pop("assets", None)  # the example's own asset: test_table_assets adds it where it is tested
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def write_config(directory: Path, text: str | None = None) -> IdemConfig:
    """An idem.yaml in ``directory`` (default: the example's file drop, its drop dir under ``directory``)."""
    body = text if text is not None else example_text()
    path = directory / "idem.yaml"
    path.write_text(body, encoding="utf-8")
    return parse_config(body, path)


def reset_database(url: str) -> None:
    """Drop the record tables and empty idem's own tables: each test starts from nothing."""
    with connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'idem' AND tablename <> 'schema_migrations'"
        ).fetchall()
        own = {"ingest_ledger", "commits", "source_offsets", "rejects", "execution_log", "catalog"}
        for (name,) in tables:
            ident = sql.SQL("idem.{}").format(sql.Identifier(name))
            if name in own:
                conn.execute(sql.SQL("TRUNCATE {}").format(ident))
            else:
                conn.execute(sql.SQL("DROP TABLE {}").format(ident))
        for (name,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'idem_staging'").fetchall():
            conn.execute(sql.SQL("DROP TABLE idem_staging.{}").format(sql.Identifier(name)))


@pytest.fixture
def threatfeed(tmp_path: Path, pg_url: str) -> IdemConfig:
    """The example config with its own drop dir, on an emptied database with its tables synced."""
    reset_database(pg_url)
    config = write_config(tmp_path)
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    return config


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Broker]:
    """A Kafka-protocol broker: ``KAFKA_BOOTSTRAP_SERVERS`` if set, else Tansu on a free port."""
    from idem_platform_tests.kafka_broker import BOOTSTRAP_ENV, Broker

    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        yield Broker(bootstrap=external)
        return
    broker = Broker.start_tansu()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def topic(kafka_broker: Broker) -> str:
    """A fresh topic name for one test (tests never read each other's messages)."""
    return f"idem-test-{uuid.uuid4().hex[:10]}"


KAFKA_CONFIG = """
connectors:
  - name: events
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topics}]
    record_type_field: type
    id_field: id
    {extra}
tables:
  indicator:
    columns:
      name: {{type: string, required: true}}
      confidence: int
      score: real
      created: timestamp
      embedding: vector(8)
      tags: dynamic
      active: bool
  malware:
    columns:
      name: {{type: string, required: true}}
      family: string
      first_seen: timestamp
      sample_size: long
      is_packed: bool
      labels: dynamic
  threat-actor:
    columns:
      name: {{type: string, required: true}}
      aliases: dynamic
      sophistication: int
      score: real
      last_seen: timestamp
      observed_count: long
spark:
  master: local[2]
"""


def kafka_config(directory: Path, bootstrap: str, topics: list[str], extra: str = "", *, pg_url: str | None = None) -> IdemConfig:
    """An idem.yaml with one Kafka connector ``events`` routing threat-feed records; tables synced."""
    config = write_config(directory, KAFKA_CONFIG.format(bootstrap=bootstrap, topics=", ".join(topics), extra=extra))
    if pg_url is not None:
        from idem_platform.pipeline.ingest import prepare_tables

        prepare_tables(pg_url, config, config.connector("events"))
    return config


def cli_env(pg_url: str, tmp_path: Path, config: IdemConfig, fault: str | None = None) -> dict[str, str]:
    """The environment of an ``idem`` child process: this test's database, config and Dagster
    home, ``local[2]``, and the fault point to arm (``IDEM_FAULT``), if any."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "IDEM_POSTGRES_URL": pg_url,
        "IDEM_CONFIG": str(config.source),
        "IDEM_SPARK_MASTER": "local[2]",
        "DAGSTER_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
    }
    env.pop("IDEM_FAULT", None)
    if fault:
        env["IDEM_FAULT"] = fault
    return env


def idem_command(*args: str) -> list[str]:
    """``idem ARGS…`` run by this interpreter."""
    return [sys.executable, "-m", "idem_platform.cli", *args]


class SensorTicker:
    """Evaluates a sensor tick after tick on a real instance, carrying the cursor and the
    dynamic partitions it asks for like the daemon does, and runs what it requests."""

    def __init__(self, config: IdemConfig, instance: dg.DagsterInstance, pg_url: str, sensor: str) -> None:
        import dagster as dg

        from idem_platform.defs.definitions import build_definitions

        self.defs = build_definitions(config, postgres_url=pg_url)
        self.sensor = self.defs.resolve_sensor_def(sensor)
        self.instance = instance
        self.pg_url = pg_url
        self.cursor: str | None = None
        self._dg = dg

    def tick(self) -> dg.SensorResult:
        dg = self._dg
        from idem_platform.defs.resources import PostgresResource

        context = dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources={"postgres": PostgresResource(url=self.pg_url)},
            definitions=self.defs,
        )
        result = self.sensor(context)
        if isinstance(result, dg.SkipReason):
            return dg.SensorResult(skip_reason=result, cursor=self.cursor)
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor or self.cursor
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    def run(self, request: dg.RunRequest, job: str) -> dg.ExecuteInProcessResult:
        """Execute a requested run as the daemon would (same job, run config and tags)."""
        return self.defs.resolve_job_def(job).execute_in_process(
            instance=self.instance,
            run_config=request.run_config,
            tags=request.tags,
            partition_key=request.partition_key,
            raise_on_error=False,
        )


def kill_at_fault(command: list[str], env: dict[str, str], marker: Path, timeout: float = 240) -> None:
    """Run ``command`` with a ``pause`` fault armed (writing ``marker``) and, once it pauses there,
    SIGKILL its whole process group: the machine dies with the driver, its JVM and every Python
    worker at once."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert process.poll() is None, process.stderr.read().decode()[-3000:] if process.stderr else ""
        assert time.monotonic() < deadline, "the run never reached the fault point"
        time.sleep(0.2)
    time.sleep(0.3)
    paused = int(marker.read_text())
    os.killpg(process.pid, signal.SIGKILL)
    try:
        os.kill(paused, signal.SIGKILL)  # an executor's Python worker may sit in its own group
    except ProcessLookupError:
        pass
    process.wait(timeout=60)
