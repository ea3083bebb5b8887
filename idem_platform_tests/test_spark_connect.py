"""Runs on a long-lived Spark Connect server (``idem spark start``): same rows, exactly once, no JVM per run.

The server is a real ``SparkConnectServer`` (PySpark's own, through ``spark-submit``)
started by the CLI; the runs are ``idem ingest`` child processes with
``IDEM_SPARK_REMOTE`` set, as ``idem dev`` sets it for the runs its sensors launch.
Child processes, because a Connect client flips PySpark into Connect mode for its
whole process, which the rest of this test session must not be.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from idem_platform.config import IdemConfig
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.spark.session import DRIVER_JIT_OPTION, driver_java_options
from idem_platform_tests.conftest import cli_env, idem_command

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    directory = tmp_path_factory.mktemp("spark-connect")
    started = subprocess.run(
        idem_command("spark", "start", "--dir", str(directory), "--master", "local[2]"),
        capture_output=True, text=True, timeout=300,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    state = json.loads(started.stdout.strip().splitlines()[-1])
    yield {**state, "dir": str(directory)}
    stopped = subprocess.run(idem_command("spark", "stop", "--dir", str(directory)), capture_output=True, text=True, timeout=120)
    assert json.loads(stopped.stdout.strip().splitlines()[-1])["stopped"] is True


def _ingest(env: dict[str, str], *paths: Path) -> dict[str, object]:
    done = subprocess.run(idem_command("ingest", "--json", *map(str, paths)), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rows(url: str) -> int:
    with connect(url) as conn:
        return sum(
            conn.execute(f'SELECT count(*) FROM idem."{t}"').fetchone()[0]  # type: ignore[index]
            for t in ("indicator", "malware", "threat-actor")
        )


def test_status_reports_the_running_server(server: dict[str, object]) -> None:
    status = subprocess.run(idem_command("spark", "status", "--dir", str(server["dir"])), capture_output=True, text=True, timeout=60)
    report = json.loads(status.stdout.strip().splitlines()[-1])
    assert report["running"] is True and report["url"] == server["url"]
    assert str(server["url"]).startswith("sc://127.0.0.1:") and ";session_id=" in str(server["url"])
    # A long-lived server keeps the full JIT (C2): its JVM turns every row of the runs' Arrow
    # batches into Spark rows; a run's own short-lived session starts with C1 only.
    command_line = Path(f"/proc/{server['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "SparkConnectServer" in command_line and DRIVER_JIT_OPTION not in command_line


def test_the_jit_default_is_c1_for_runs_and_full_for_long_lived_sessions() -> None:
    assert DRIVER_JIT_OPTION in (driver_java_options(None) or "")
    assert DRIVER_JIT_OPTION not in (driver_java_options(None, long_lived=True) or "")
    assert DRIVER_JIT_OPTION in (driver_java_options("-Dx=1") or "") and "-Dx=1" in (driver_java_options("-Dx=1") or "")
    chosen = "-XX:+TieredCompilation"  # the user's choice wins either way
    assert DRIVER_JIT_OPTION not in (driver_java_options(chosen) or chosen)


def test_runs_on_the_server_commit_exactly_once(server: dict[str, object], pg_url: str, tmp_path: Path, threatfeed: IdemConfig) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    lines = list(threatfeed_lines(3000, seed=21, duplicate_ratio=0.1, bad_ratio=0.01))
    # Three files in one batch: their pieces share the batch's slices.
    paths = [write_lines(connector.path / f"connect-{i}.ndjson", lines[i::3]) for i in range(3)]
    env = {**cli_env(pg_url, tmp_path, threatfeed), "IDEM_SPARK_REMOTE": str(server["url"])}
    env.pop("IDEM_SPARK_MASTER")
    first = _ingest(env, *paths)
    assert first["rows_written"] + first["rows_skipped"] + first["rows_rejected"] == len(lines)  # type: ignore[operator]
    assert first["rows_written"] == _rows(pg_url) > 0
    again = _ingest(env, *paths)
    assert again["replayed"] is True and again["rows_written"] == 0 and _rows(pg_url) == first["rows_written"]
    # The same rows in a new file (new file key): every row is an idempotent skip.
    shuffled = write_lines(connector.path / "connect-again.ndjson", list(reversed(lines)))
    third = _ingest(env, shuffled)
    assert third["rows_written"] == 0 and _rows(pg_url) == first["rows_written"]
    with connect(pg_url) as conn:
        ledger = conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE status = 'committed'").fetchone()
    assert ledger is not None and ledger[0] == 4  # one row per file key
