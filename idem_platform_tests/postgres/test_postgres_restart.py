"""PostgreSQL restarts in the middle of a commit: nothing is visible, the run fails with a
clear error, and the rerun commits every record once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from idem_platform.config import parse_config
from idem_platform.contract.catalog import table_name
from idem_platform.postgres import connect, ensure_schema
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.sources.filedrop.files import hash_file
from idem_platform_tests.helpers.config import example_text
from idem_platform_tests.helpers.faults import wait_until_staging
from idem_platform_tests.helpers.ingest import ingest

pytestmark = pytest.mark.slow
TABLES = ("indicator", "malware", "threat-actor")


@pytest.fixture(scope="module")
def restartable() -> Iterator[tuple[object, str]]:
    """An embedded PostgreSQL of this module's own, so it can be restarted without hurting others."""
    import pgserver
    from pgserver import pg_ctl

    data = Path(tempfile.mkdtemp(prefix="idem-restart-pg-"))
    server = pgserver.get_server(data, cleanup_mode=None)
    try:
        yield server, server.get_uri()
    finally:
        # Not server.cleanup(): after a restart it holds the old postmaster's pid,
        # finds it gone and leaves the new server running.
        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def restart(server: object) -> None:
    from pgserver import pg_ctl

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)  # type: ignore[attr-defined]


def test_a_postgres_restart_mid_commit_leaves_nothing_and_a_rerun_commits_once(
    restartable: tuple[object, str], tmp_path: Path, spark: Any
) -> None:
    server, url = restartable
    data = yaml.safe_load(example_text())
    data["connectors"][0]["path"] = str(tmp_path / "drop")
    data["connectors"][0]["split_bytes"] = 4 << 20  # several slices: the restart falls between them
    data["spark"] = {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}}
    config_path = tmp_path / "idem.yaml"
    config_path.write_text(yaml.safe_dump(data))
    config = parse_config(config_path.read_text(), config_path)
    with connect(url, autocommit=True) as conn:
        ensure_schema(conn)
        sync_tables(conn, config.table_specs)
    lines = list(threatfeed_lines(40_000, seed=31, duplicate_ratio=0.1, bad_ratio=0.01))
    file = write_lines(tmp_path / "drop" / "feed.ndjson", lines)
    env = {**os.environ, "IDEM_POSTGRES_URL": url, "DAGSTER_HOME": str(tmp_path / "home"), "PYSPARK_PYTHON": sys.executable}
    env.pop("IDEM_SPARK_MASTER", None)
    (tmp_path / "home").mkdir()
    command = [sys.executable, "-m", "idem_platform.cli", "ingest", "--config", str(config_path), "--connector", "threatfeed", str(file)]

    # Slow every split down after its first batch, so the restart hits the commit in flight.
    process = subprocess.Popen(
        command, env={**env, "IDEM_FAULT": "staging:sleep:2"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_until_staging(url, process)
    restart(server)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 1, out
    assert err.strip().splitlines()[-1].startswith("idem: error: ")
    assert "TransientError: PostgreSQL: " in err.strip().splitlines()[-1]
    with connect(url) as conn:
        for table in TABLES:
            assert conn.execute(f'SELECT count(*) FROM idem.{table_name(table)}').fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM idem.commits").fetchone() == (0,)

    # The restart needs a run of its own process to hit; the rerun runs in this one (the
    # session's Spark, no second interpreter and JVM to start).
    summary = ingest(url, config, spark, file)
    assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == len(lines)
    with connect(url) as conn:
        stored = sum(conn.execute(f'SELECT count(*) FROM idem.{table_name(t)}').fetchone()[0] for t in TABLES)
        assert stored == summary["rows_written"]
        assert conn.execute("SELECT status FROM idem.ingest_ledger WHERE key = %s", [hash_file(file).key]).fetchone() == ("committed",)
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)
