"""What several commands share (idem_platform.cli.common): the connector a command acts on, named or refused."""

from __future__ import annotations

import pytest

from idem_platform.config import IdemConfig
from idem_platform_tests.helpers.cli import run


@pytest.mark.parametrize(
    "argv",
    [
        ("rejects", "--connector", "typo"),
        ("rejects", "list", "--connector", "typo"),
        ("rejects", "--connector", "typo", "list"),
        ("rejects", "retry", "--connector", "typo", "--dry-run"),
        ("offsets", "--connector", "typo"),
        ("ingest", "--connector", "typo"),
    ],
)
def test_an_unknown_connector_is_one_line_naming_the_known_ones(
    env: IdemConfig, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    """A typo in --connector used to list nothing and exit 0 (``idem rejects``)."""
    code, lines, err = run(capsys, *argv)
    assert code == 1 and lines == []
    assert err == f"idem: error: {env.source}: no connector named 'typo' (known: threatfeed)\n"
