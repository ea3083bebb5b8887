"""`idem dev` (idem_platform.cli.dev): a missing workspace file is one line before anything starts; none
given loads idem's own code location."""

from __future__ import annotations

from pathlib import Path

import pytest

from idem_platform_tests.helpers.cli import run
from idem_platform_tests.helpers.paths import REPO


def test_dev_with_a_missing_workspace_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    """``idem dev`` with no workspace file used to start PostgreSQL, then print dagster's usage."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("IDEM_HOME", str(tmp_path / "idem-home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster-home"))
    missing = tmp_path / "workspace.yaml"
    code, lines, err = run(capsys, "dev", "--workspace", str(missing), "--no-spark-server")
    assert code == 1 and lines == [] and err.count("\n") == 1
    assert err.startswith(f"idem: error: no workspace file {missing}: name an existing one with --workspace")
    assert not (tmp_path / "dagster-home").exists() and not (tmp_path / "idem-home").exists()


def test_dev_without_a_workspace_file_loads_idems_own_code_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from idem_platform.cli.dev import workspace_file

    monkeypatch.chdir(tmp_path)
    builtin = yaml.safe_load(workspace_file(None).read_text(encoding="utf-8"))
    assert builtin == yaml.safe_load((REPO / "workspace.yaml").read_text(encoding="utf-8"))
    assert builtin["load_from"][0]["python_module"]["module_name"] == "idem_platform.definitions"
    (tmp_path / "workspace.yaml").write_text("load_from: []\n")
    assert workspace_file(None) == tmp_path / "workspace.yaml"
