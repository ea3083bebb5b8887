"""``idem_platform.IdemComponent`` in a ``dg`` project of a user's own, end to end.

idem is installed from its wheel (non-editable) as a user installs it, so the
``dagster_dg_cli.registry_modules`` entry point is what ``dg`` finds. Two components
(two configs, two database variables) load beside the project's own asset and its own
``postgres``/``spark`` resources; one file of one component is materialized through
Dagster's Python API into a real PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import dagster as dg
import psycopg
from dagster.components.testing import create_defs_folder_sandbox

from idem_platform import IdemComponent
from idem_platform.defs.tables import TABLE_GROUP, table_key
from idem_platform_tests.helpers import dg_project
from idem_platform_tests.helpers.config import write_config


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


def test_post_processing_sets_freshness_and_automation_on_the_table_assets() -> None:
    """``post_processing`` targeting idem's table group reaches the ``idem/<record_type>``
    specs (Dagster's own component sandbox: no project install, no database)."""
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.defs_folder_path / "feeds"
        defs_path.mkdir()
        write_config(defs_path)
        (defs_path / "template_vars.py").write_text(dg_project.TEMPLATE_VARS)
        sandbox.scaffold_component(
            IdemComponent,
            defs_path="feeds",
            defs_yaml_contents={
                "type": "idem_platform.IdemComponent",
                "template_vars_module": ".template_vars",
                "attributes": {"config_file": "idem.yaml"},
                "post_processing": {
                    "assets": [
                        {
                            "target": f"group:{TABLE_GROUP}",
                            "attributes": {
                                "freshness_policy": "{{ daily }}",
                                "automation_condition": "{{ automation_condition.eager() }}",
                            },
                        }
                    ]
                },
            },
        )
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (component, defs):
            assert isinstance(component, IdemComponent)
            specs = {s.key: s for s in defs.resolve_all_asset_specs()}
    table = specs[table_key("indicator")]
    assert table.freshness_policy == dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=25))
    assert table.automation_condition == dg.AutomationCondition.eager()
    # The table keeps its own metadata (lineage, schema) beside what post_processing set.
    assert "dagster/column_lineage" in table.metadata and table.group_name == TABLE_GROUP
    # Only the targeted group: the connector's assets keep no freshness policy.
    assert specs[dg.AssetKey(["threatfeed", "committed"])].freshness_policy is None
