"""Nothing idem creates under its home, Dagster's home or the plans directory is readable by
anyone but its owner, whatever the umask of whoever starts it (022, the usual, here)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import dagster as dg

from idem_platform.config import IdemConfig
from idem_platform.defs.io_managers import SparkPlanIOManager
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform_tests.helpers.cli import cli_env, idem_command


def _readable_by_others(root: Path) -> list[str]:
    """Every file or directory under ``root`` (itself included) with a group or other bit."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if not path.is_symlink() and mode & 0o077:
            found.append(f"{oct(mode)} {path.relative_to(root.parent)}")
    return found


def test_an_ingest_under_umask_022_leaves_only_owner_only_files(pg_url: str, threatfeed: IdemConfig, tmp_path: Path) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    path = write_lines(connector.path / "private.ndjson", list(threatfeed_lines(50, seed=59)))
    home = tmp_path / "idem-home"
    env = cli_env(pg_url, tmp_path, threatfeed)
    env.pop("DAGSTER_HOME")  # idem's own instance under the idem home: its storage, its compute logs
    env["IDEM_HOME"] = str(home)
    done = subprocess.run(
        idem_command("ingest", "--json", str(path)), env=env, capture_output=True, text=True, timeout=600, umask=0o022
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["rows_written"] > 0
    created = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.suffix == ".pkl" for p in created), created  # the run's plans are among them
    assert _readable_by_others(home) == []


@dg.asset(io_manager_key="plans")
def plan() -> dict[str, list[str]]:
    """A plan-sized object, as the ingest asset hands its plan on."""
    return {"files": ["/drop/a.ndjson"]}


@dg.asset(io_manager_key="plans")
def planned(plan: dict[str, list[str]]) -> int:
    return len(plan["files"])


def test_the_plan_io_manager_writes_owner_only_files_under_any_umask(tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    previous = os.umask(0o022)  # this process's, as a Dagster daemon's run worker may have it
    try:
        result = dg.materialize(
            [plan, planned], resources={"plans": SparkPlanIOManager(base_dir=str(plans))}, instance=dg.DagsterInstance.ephemeral()
        )
    finally:
        os.umask(previous)
    assert result.success and result.output_for_node("planned") == 1
    assert len(list(plans.rglob("*.pkl"))) == 2 and list(plans.rglob("*.ref"))
    assert _readable_by_others(plans) == []
