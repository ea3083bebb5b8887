"""``idem_platform.IdemComponent`` in a ``dg`` project of a user's own, end to end.

idem is installed from its wheel (non-editable) as a user installs it, so the
``dagster_dg_cli.registry_modules`` entry point is what ``dg`` finds. Two components
(two configs, two database variables) load beside the project's own asset and its own
``postgres``/``spark`` resources; one file of one component is materialized through
Dagster's Python API into a real PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from idem_platform_tests.helpers import dg_project


def test_two_components_beside_a_projects_own_code(tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "proj"
    defs_dir = dg_project.write_project(root)
    env = dg_project.environment(root, dg_project.install_wheel(tmp_path / "site"), pg_url)
    dg = str(dg_project.BIN / "dg")

    listed = dg_project.run([dg, "list", "components", "--json"], root, env)
    assert listed.returncode == 0, listed.stderr
    assert "idem_platform.IdemComponent" in {c["key"] for c in json.loads(listed.stdout)["items"]}

    for name in ("feeds_a", "feeds_b"):
        scaffolded = dg_project.run([dg, "scaffold", "defs", "idem_platform.IdemComponent", name], root, env)
        assert scaffolded.returncode == 0, scaffolded.stderr
        assert (defs_dir / name / "idem.yaml").is_file() and (defs_dir / name / "drop").is_dir()
        assert "config_file: idem.yaml" in (defs_dir / name / "defs.yaml").read_text()
    dg_project.customize(defs_dir)

    checked = dg_project.run([dg, "check", "defs"], root, env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listed = dg_project.run([dg, "list", "defs", "--json"], root, env)
    assert listed.returncode == 0, listed.stderr
    keys = {asset["asset_key"] for asset in json.loads(listed.stdout)["assets"]}
    assert {"feeds_a/ingest", "feeds_a/committed", "idem/feeds_a_event", "feeds_b/committed", "event_count"} <= keys

    materialized = dg_project.run([str(dg_project.BIN / "python"), "-c", dg_project.MATERIALIZE], root, env)
    assert materialized.returncode == 0, materialized.stderr[-3000:]
    report = json.loads(materialized.stdout.strip().splitlines()[-1])
    assert report["success"]
    # The project's own resources beside idem's: feeds_b's database has keys of its own.
    assert {"postgres", "spark", "idem_postgres", "idem_spark", "idem_postgres__idem_team_b_url"} <= set(report["resources"])
    assert report["sensor_job"] == "feeds_a_ingest"
    # idem's jobs run in process; the project's implicit asset job keeps Dagster's default.
    assert report["job_executors"] == ["in_process"] and report["implicit_executor"] == "multi_or_in_process_executor"
    # post_processing reached idem's assets as it reaches any component's (kinds are replaced,
    # tags and metadata merged).
    assert report["spec"] == {
        "group": "team_b", "owners": ["team:b"],
        "tags": {"idem/connector": "feeds_b", "tier": "gold", "dagster/kind/idem": ""},
        "kinds": ["idem"], "metadata": "b", "automation": True, "freshness": True,
    }
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT count(*) FROM idem.feeds_a_event").fetchone()
        rejects = conn.execute("SELECT count(*) FROM idem.rejects").fetchone()
    assert rows == (3,) and rejects == (1,)
