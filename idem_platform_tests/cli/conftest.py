"""The CLI tests' fixture: the example config on this module's database, set in the environment
`idem` reads (PostgreSQL URL, Dagster home, config, Spark master)."""

from __future__ import annotations

from pathlib import Path

import pytest

from idem_platform.config import IdemConfig


@pytest.fixture
def env(pg_url: str, tmp_path: Path, threatfeed: IdemConfig, monkeypatch: pytest.MonkeyPatch) -> IdemConfig:
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("IDEM_CONFIG", str(threatfeed.source))
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[2]")
    return threatfeed
