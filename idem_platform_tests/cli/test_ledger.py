"""`idem ledger` (idem_platform.cli.ledger)."""

from __future__ import annotations

import json

import pytest

from idem_platform.config import IdemConfig
from idem_platform_tests.helpers.cli import run


def test_ledger_purge(env: IdemConfig, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(capsys, "ledger", "purge")
    assert code == 0 and json.loads(lines[0]) == {"purged": 0, "staging_dropped": 0}
