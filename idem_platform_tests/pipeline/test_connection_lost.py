"""PostgreSQL closes a commit's connections (a restart, an administrator's
``pg_terminate_backend``) at a point of the commit: the run fails with one line that says
so, nothing of it is visible, and the rerun leaves the records a clean load leaves, once.

The runs are held at a named fault point (``IDEM_FAULT=<point>:hold:<marker>``) while the
test terminates every session of the database, then let go: no timing decides where the
connection is lost.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from idem_platform import errors
from idem_platform.config import IdemConfig, parse_config
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.faults import (
    act_when_held,
    leftovers,
    stored_records,
    terminate_backends,
)
from idem_platform_tests.helpers.ingest import ingest

pytestmark = pytest.mark.slow


def _sliced(config: IdemConfig) -> IdemConfig:
    """The example's config with the smallest read slices (1 MiB): 11,000 records make several."""
    assert config.source is not None
    data = yaml.safe_load(Path(config.source).read_text())
    data["connectors"][0]["split_bytes"] = 1 << 20  # the smallest slice: 1 MiB
    Path(config.source).write_text(yaml.safe_dump(data))
    return parse_config(Path(config.source).read_text(), Path(config.source))


def _fresh(url: str, config: IdemConfig) -> None:
    reset_database(url)
    with connect(url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)


def test_idem_ingest_says_in_one_line_that_postgresql_closed_the_connection(
    pg_url: str, threatfeed: IdemConfig, spark: Any, tmp_path: Path
) -> None:
    """Dagster's own storage is on the same PostgreSQL (idem's dagster.yaml, as ``idem
    ingest`` sets it up by default) and loses its connections too: it reconnects, records
    the run's failure, and the line is the commit's error, not Dagster's storage error."""
    config = _sliced(threatfeed)
    assert config.connector("threatfeed").path is not None
    lines = list(threatfeed_lines(2000, seed=41, duplicate_ratio=0.1, bad_ratio=0.01))
    path = write_lines(config.connector("threatfeed").path / "lost.ndjson", lines)  # type: ignore[operator]
    marker = tmp_path / "held"
    env = cli_env(pg_url, tmp_path, config, f"during_apply:hold:{marker}")
    env.pop("DAGSTER_HOME")  # idem's own: .idem/dagster under IDEM_HOME, storage on PostgreSQL
    env["IDEM_HOME"] = str(tmp_path / "idem-home")
    process = subprocess.Popen(
        idem_command("ingest", "--connector", "threatfeed", str(path)),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    act_when_held(marker, lambda: terminate_backends(pg_url), process)
    out, err = process.communicate(timeout=300)

    assert process.returncode == 1 and out == "", out
    last = err.strip().splitlines()[-1]
    assert last == (
        "idem: error: threatfeed__committed: TransientError: PostgreSQL: the server closed the connection "
        f"(AdminShutdown: terminating connection due to administrator command) at {pg_url}; "
        "nothing of this run was committed, the next run retries"
    ), err[-3000:]
    for noise in ("Traceback", "OperationalError", "Exception while", "sqlalche.me"):
        assert noise not in err, err[-3000:]
    assert stored_records(pg_url) == {"indicator": [], "malware": [], "threat-actor": [], "rejects": []}

    summary = ingest(pg_url, config, spark, path)
    assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == len(lines)
    assert sum(len(rows) for table, rows in stored_records(pg_url).items() if table != "rejects") == summary["rows_written"]
    assert leftovers(pg_url) == {"staging_tables": 0, "advisory_locks": 0, "unfinished": 0}


def _ingest_losing_connections(url: str, config: IdemConfig, spark: Any, path: Path, point: str) -> dict[str, Any] | BaseException:
    """Ingest ``path`` in this process while a thread terminates its sessions once the run
    is held at ``point``; the summary, or the error the run raised."""
    marker = Path(str(path) + ".held")
    helper = threading.Thread(target=act_when_held, args=(marker, lambda: terminate_backends(url)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IDEM_FAULT", f"{point}:hold:{marker}")
        helper.start()
        try:
            return ingest(url, config, spark, path)
        except errors.IdemError as exc:
            return exc
        finally:
            helper.join()


@pytest.mark.parametrize("point", ["before_apply", "during_apply", "after_apply"])
def test_terminated_backends_at_a_commit_point_leave_what_a_clean_load_leaves(
    pg_url: str, threatfeed: IdemConfig, spark: Any, point: str
) -> None:
    config = _sliced(threatfeed)
    lines = list(threatfeed_lines(11_000, seed=43, duplicate_ratio=0.1, bad_ratio=0.01))
    path = write_lines(config.connector("threatfeed").path / "terminated.ndjson", lines)  # type: ignore[operator]
    clean = ingest(pg_url, config, spark, path)
    assert len(clean["timings"]["stage_task_seconds"]) >= 3  # several slices
    reference = stored_records(pg_url)
    _fresh(pg_url, config)

    outcome = _ingest_losing_connections(pg_url, config, spark, path, point)
    if point == "after_apply":  # COMMIT is done: the lost connection costs nothing
        assert isinstance(outcome, dict) and outcome["rows_written"] == clean["rows_written"], outcome
    else:
        assert isinstance(outcome, errors.TransientError), outcome
        assert "the server closed the connection (AdminShutdown" in str(outcome)
        assert stored_records(pg_url) == {"indicator": [], "malware": [], "threat-actor": [], "rejects": []}
    rerun = ingest(pg_url, config, spark, path)
    assert rerun["replayed"] is (point == "after_apply")
    assert stored_records(pg_url) == reference
    assert leftovers(pg_url) == {"staging_tables": 0, "advisory_locks": 0, "unfinished": 0}
