"""idem.yaml files for tests: the example's file drop (the configuration most tests run on)."""

from __future__ import annotations

from pathlib import Path

import yaml

from idem_platform.config import IdemConfig, parse_config
from idem_platform_tests.helpers.paths import EXAMPLE_CONFIG


def example_text() -> str:
    """The example idem.yaml with its file-drop connector only: what the file-drop tests were
    written against (one connector, three record types). The push tests add their own."""
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    data["connectors"] = [c for c in data["connectors"] if c["kind"] == "filedrop"]
    data.pop("assets", None)  # the example's own asset: defs/test_table_assets adds it where it is tested
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def write_config(directory: Path, text: str | None = None) -> IdemConfig:
    """An idem.yaml in ``directory`` (default: the example's file drop, its drop dir under ``directory``)."""
    body = text if text is not None else example_text()
    path = directory / "idem.yaml"
    path.write_text(body, encoding="utf-8")
    return parse_config(body, path)


# One file-drop connector and one table with one required column: the idem.yaml the config
# tests edit one key of to see each mistake reported.
BASE = """
connectors:
  - name: feed
    kind: filedrop
    path: drop
    record_type: thing
tables:
  thing:
    columns:
      name: {type: string, required: true}
"""
