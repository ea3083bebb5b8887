"""Shared fixtures: real PostgreSQL (one database per test module), one Spark session, configs.

Only fixtures live here; the plain code tests share is in :mod:`idem_platform_tests.helpers`.

PostgreSQL: ``IDEM_TEST_POSTGRES_URL``, else the server on 127.0.0.1:5432, else an
embedded ``pgserver`` started for the session. Every test module gets its own
database, so modules never see each other's rows.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from idem_platform.config import IdemConfig

# Runs in tests start Spark in their own process (or use the session fixture's): no
# long-lived Spark Connect server is left behind by a test's `idem ingest`. The tests of
# spark.server: auto set it back for their own child processes.
os.environ["IDEM_SPARK_SERVER"] = "off"
from idem_platform_tests.helpers.database import fresh_config, scratch_database

if TYPE_CHECKING:
    import dagster as dg

    from idem_platform_tests.helpers.kafka_broker import Broker

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


@pytest.fixture(scope="module")
def pg_url(postgres_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for this test module, with the idem schema; dropped afterwards."""
    module = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.rsplit(".", 1)[-1].lower())[:30]
    with scratch_database(postgres_server, f"idem_{module}_{uuid.uuid4().hex[:8]}") as url:
        yield url


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


@pytest.fixture
def threatfeed(tmp_path: Path, pg_url: str) -> IdemConfig:
    """The example config with its own drop dir, on an emptied database with its tables synced."""
    return fresh_config(tmp_path, pg_url)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """An ephemeral Dagster instance for one test (its own runs, partitions and cursors); a
    module that needs the deployed instance defines its own ``instance``."""
    import dagster as dg

    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def env(pg_url: str, tmp_path: Path, threatfeed: IdemConfig, monkeypatch: pytest.MonkeyPatch) -> IdemConfig:
    """The example config on this module's database, set in the environment ``idem`` reads
    (PostgreSQL URL, Dagster home, config, Spark master): for tests that call the CLI."""
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("IDEM_CONFIG", str(threatfeed.source))
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[2]")
    return threatfeed


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Broker]:
    """A Kafka-protocol broker: ``KAFKA_BOOTSTRAP_SERVERS`` if set, else Tansu on a free port."""
    from idem_platform_tests.helpers.kafka_broker import BOOTSTRAP_ENV, Broker

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
