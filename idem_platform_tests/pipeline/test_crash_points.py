"""The crash-point loop: ``kill -9`` of a whole ``idem ingest`` (driver, JVM, Python workers)
at each named point of a commit of several slices, then a clean rerun: the database holds
what a clean load holds, every record once, and nothing is left in staging, locks or the
ledger. The kill waits for the run to reach its point (``pause``), never for a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from idem_platform.config import IdemConfig, parse_config
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.faults import kill_at_fault, leftovers, stored_records
from idem_platform_tests.helpers.ingest import ingest

pytestmark = pytest.mark.slow

# Each point once (test_crash.py kills at before_apply and during_apply with a CLI rerun):
# right after the claim, inside the second slice's staging, just before COMMIT, just after it.
POINTS = ("claimed", "staging:split=1", "before_apply", "after_apply")


def test_a_kill_at_every_point_then_a_rerun_leaves_what_a_clean_load_leaves(
    pg_url: str, threatfeed: IdemConfig, spark: Any, tmp_path: Path
) -> None:
    assert threatfeed.source is not None
    data = yaml.safe_load(Path(threatfeed.source).read_text())
    data["connectors"][0]["split_bytes"] = 1 << 20  # the smallest slice: 11,000 records make several
    Path(threatfeed.source).write_text(yaml.safe_dump(data))
    config = parse_config(Path(threatfeed.source).read_text(), Path(threatfeed.source))
    lines = list(threatfeed_lines(11_000, seed=61, duplicate_ratio=0.1, bad_ratio=0.01))
    path = write_lines(config.connector("threatfeed").path / "crash.ndjson", lines)  # type: ignore[operator]
    clean = ingest(pg_url, config, spark, path)
    assert len(clean["timings"]["stage_task_seconds"]) >= 3
    reference = stored_records(pg_url)

    for point in POINTS:
        reset_database(pg_url)
        with connect(pg_url, autocommit=True) as conn:
            sync_tables(conn, config.table_specs)
        name, _, filters = point.partition(":")
        marker = tmp_path / f"{name}.pid"
        fault = f"{name}:pause:{marker}" + (f":{filters}" if filters else "")
        kill_at_fault(idem_command("ingest", "--connector", "threatfeed", str(path)), cli_env(pg_url, tmp_path, config, fault), marker)
        committed = point == "after_apply"
        assert rows(pg_url, "SELECT count(*) FROM idem.commits") == [(int(committed),)], point

        rerun = ingest(pg_url, config, spark, path)
        assert rerun["replayed"] is committed, (point, rerun)
        assert stored_records(pg_url) == reference, point
        assert leftovers(pg_url) == {"staging_tables": 0, "advisory_locks": 0, "unfinished": 0}, point
        assert rows(pg_url, "SELECT count(*) FROM idem.commits WHERE NOT replay") == [(1,)], point
