"""spark: (idem_platform.config.spark): the master's precedence (IDEM_SPARK_MASTER, the file, local[*]) and conf."""

from __future__ import annotations

import pytest

from idem_platform.config import (
    parse_config,
)
from idem_platform_tests.helpers.config import BASE


def test_spark_master_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config(BASE + "spark:\n  master: spark://h:7077\n  conf: {spark.speculation: true}\n")
    monkeypatch.delenv("IDEM_SPARK_MASTER", raising=False)
    assert config.spark_master() == "spark://h:7077" and config.spark.conf == {"spark.speculation": "true"}
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[3]")
    assert config.spark_master() == "local[3]"
    assert parse_config(BASE).spark_master() in ("local[3]",)
    monkeypatch.delenv("IDEM_SPARK_MASTER")
    assert parse_config(BASE).spark_master() == "local[*]"
