"""The ``idem`` command in this process (:func:`run`), or as a child process: its command line and
its environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from idem_platform.cli import main
from idem_platform.config import IdemConfig


def cli_env(pg_url: str, tmp_path: Path, config: IdemConfig, fault: str | None = None) -> dict[str, str]:
    """The environment of an ``idem`` child process: this test's database, config and Dagster
    home, ``local[2]``, and the fault point to arm (``IDEM_FAULT``), if any."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "IDEM_POSTGRES_URL": pg_url,
        "IDEM_CONFIG": str(config.source),
        "IDEM_SPARK_MASTER": "local[2]",
        "DAGSTER_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
    }
    env.pop("IDEM_FAULT", None)
    if fault:
        env["IDEM_FAULT"] = fault
    return env


def idem_command(*args: str) -> list[str]:
    """``idem ARGS…`` run by this interpreter."""
    return [sys.executable, "-m", "idem_platform.cli", *args]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    """``idem ARGV…`` in this process: its exit code, its non-blank stdout lines and its stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.strip()], err
