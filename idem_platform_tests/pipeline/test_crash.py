"""A process killed between staging and the applying transaction (or inside it) leaves nothing
visible; the next run takes the file over and commits every record exactly once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.faults import kill_at_fault
from idem_platform_tests.helpers.ingest import ingest

pytestmark = pytest.mark.slow


def _counts(pg_url: str) -> dict[str, int]:
    with connect(pg_url) as conn:
        return {
            table: conn.execute(f'SELECT count(*) FROM idem.{table_name(table)}').fetchone()[0]
            for table in ("indicator", "malware", "threat-actor", "rejects", "commits")
        }


# "during_promote" is the point's former name, an alias until the next release: this proves it still arms.
@pytest.mark.parametrize("point", ["before_apply", "during_promote"])
def test_killed_run_leaves_nothing_and_a_rerun_commits_once(
    pg_url: str, threatfeed: IdemConfig, tmp_path: Path, point: str
) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    lines = list(threatfeed_lines(4000, seed=11, duplicate_ratio=0.1, bad_ratio=0.01))
    path = write_lines(connector.path / "crash.ndjson", lines)
    marker = tmp_path / "paused.pid"
    kill_at_fault(idem_command("ingest", "--connector", "threatfeed", str(path)), cli_env(pg_url, tmp_path, threatfeed, f"{point}:pause:{marker}"), marker)

    assert _counts(pg_url) == {"indicator": 0, "malware": 0, "threat-actor": 0, "rejects": 0, "commits": 0}
    with connect(pg_url) as conn:
        assert conn.execute("SELECT status, attempts FROM idem.ingest_ledger").fetchall() == [("in_progress", 1)]

    rerun = subprocess.run(
        idem_command("ingest", "--connector", "threatfeed", str(path)),
        env=cli_env(pg_url, tmp_path, threatfeed, None),
        capture_output=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]
    summary = json.loads(rerun.stdout.decode().strip().splitlines()[-1])
    assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == len(lines)
    counts = _counts(pg_url)
    assert counts["indicator"] + counts["malware"] + counts["threat-actor"] == summary["rows_written"]
    assert counts["rejects"] == summary["rows_rejected"] and counts["commits"] == 1
    with connect(pg_url) as conn:
        assert conn.execute("SELECT status, attempts FROM idem.ingest_ledger").fetchall() == [("committed", 2)]
        # The dead attempt's staging tables were dropped when its file was taken over.
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)

    # The replay in process (no third interpreter and JVM to start); it must not need Spark at all.
    replay = ingest(pg_url, threatfeed, None, path, use_spark=False)
    assert replay["replayed"] is True and replay["rows_written"] == 0
    assert _counts(pg_url)["indicator"] == counts["indicator"]
