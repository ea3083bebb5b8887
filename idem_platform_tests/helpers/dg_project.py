"""A throw-away ``dg`` project that uses idem as a user would: idem installed from its wheel
(non-editable, with its entry point), two ``IdemComponent``s, and code of the project's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

PYPROJECT = """\
[project]
name = "proj"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["idem_platform"]

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "proj"
"""

DEFINITIONS = """\
from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""

# The project's own code: an asset reading idem's table, and resources named like idem's were.
OWN = """\
import dagster as dg


@dg.asset(ins={"events": dg.AssetIn(["idem", "feeds_a_event"])})
def event_count(events) -> int:
    return events.count()


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(
        assets=[event_count],
        resources={"postgres": dg.ResourceDefinition.hardcoded_resource("mine"),
                   "spark": dg.ResourceDefinition.hardcoded_resource("mine too")}
    )
"""

TEMPLATE_VARS = """\
from datetime import timedelta

import dagster as dg


@dg.template_var
def daily() -> dg.FreshnessPolicy:
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=25))
"""

# feeds_b: its own database variable, a subset of its connectors, and post_processing.
FEEDS_B = """\
type: idem_platform.IdemComponent

template_vars_module: .template_vars

attributes:
  config_file: idem.yaml
  connectors: [feeds_b]
  postgres_url_env: IDEM_TEAM_B_URL

post_processing:
  assets:
    - target: "*"
      attributes:
        group_name: team_b
        owners: ["team:b"]
        tags: {tier: gold}
        kinds: [idem]
        metadata: {team: b}
        automation_condition: "{{ automation_condition.eager() }}"
        freshness_policy: "{{ daily }}"
"""

SPARK = """\
spark:
  master: local[2]
  conf: {spark.ui.enabled: "false", spark.sql.shuffle.partitions: "2"}
"""

# Run by the project's Python: load the project's Definitions and materialize one file of feeds_a.
MATERIALIZE = """\
import json, sys
import dagster as dg
from proj.definitions import defs

d = defs()
instance = dg.DagsterInstance.get()
instance.add_dynamic_partitions("feeds_a_files", ["a.ndjson"])
result = d.resolve_job_def("feeds_a_ingest").execute_in_process(instance=instance, partition_key="a.ndjson")
spec = {s.key.to_user_string(): s for s in d.resolve_all_asset_specs()}["feeds_b/committed"]
json.dump({
    "success": result.success,
    "resources": sorted(d.resources or {}),
    "sensor_job": d.resolve_sensor_def("feeds_a_filedrop_sensor").job_name,
    "implicit_executor": d.resolve_implicit_global_asset_job_def().executor_def.name,
    "job_executors": sorted({j.executor_def.name for j in d.resolve_all_job_defs() if not j.name.startswith("__")}),
    "spec": {"group": spec.group_name, "owners": list(spec.owners), "tags": dict(spec.tags),
             "kinds": sorted(spec.kinds), "metadata": str(spec.metadata.get("team")),
             "automation": spec.automation_condition is not None,
             "freshness": spec.freshness_policy is not None},
}, sys.stdout)
"""


def install_wheel(target: Path) -> Path:
    """idem built and installed (non-editable) into ``target``: its code and its entry points."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(REPO)],
        check=True, capture_output=True,
    )
    return target


def write_project(root: Path) -> Path:
    """The project's own files (what ``create-dagster project`` would write, plus its code)."""
    package = root / "src" / "proj"
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS)
    (package / "defs" / "own.py").write_text(OWN)
    return package / "defs"


def customize(defs_dir: Path) -> None:
    """After ``dg scaffold defs``: Spark settings in both configs, feeds_b's defs.yaml, a drop file."""
    for name in ("feeds_a", "feeds_b"):
        config = defs_dir / name / "idem.yaml"
        config.write_text(config.read_text() + SPARK)
    (defs_dir / "feeds_b" / "defs.yaml").write_text(FEEDS_B)
    (defs_dir / "feeds_b" / "template_vars.py").write_text(TEMPLATE_VARS)
    lines = [f'{{"id": "e{i}", "value": {i}.5, "at": "2026-01-01T00:00:0{i}Z"}}' for i in range(3)]
    (defs_dir / "feeds_a" / "drop" / "a.ndjson").write_text("\n".join(lines) + '\n{"value": 1}\n')


def environment(root: Path, site: Path, pg_url: str) -> dict[str, str]:
    """The project's shell: idem from the wheel first on the path, both database variables set."""
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(BIN.parent),
        PYTHONPATH=f"{site}{os.pathsep}{root / 'src'}",
        IDEM_POSTGRES_URL=pg_url,
        IDEM_TEAM_B_URL=pg_url,
        DAGSTER_HOME=str(root / "dagster_home"),
        NO_COLOR="1",
        COLUMNS="250",
    )
    (root / "dagster_home").mkdir(exist_ok=True)
    return env


def run(argv: list[str], root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
