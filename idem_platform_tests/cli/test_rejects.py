"""`idem rejects` (idem_platform.cli.rejects): rejects of a removed connector, and each subcommand's own help."""

from __future__ import annotations

import json
import os

import pytest

from idem_platform.config import IdemConfig
from idem_platform.postgres import connect
from idem_platform_tests.helpers.cli import run


def test_rejects_of_a_connector_removed_from_the_config_are_still_listed(
    env: IdemConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    with connect(os.environ["IDEM_POSTGRES_URL"]) as conn, conn.transaction():
        conn.execute(
            "INSERT INTO idem.rejects (commit_id, connector, source, position, raw, raw_length, reasons) "
            "VALUES (gen_random_uuid(), 'retired', 'old.ndjson', 'old.ndjson#L1', '{x', 2, '[]')"
        )
    code, lines, err = run(capsys, "rejects", "--connector", "retired")
    assert code == 0, err
    assert [json.loads(line)["connector"] for line in lines] == ["retired"]


@pytest.mark.parametrize(
    ("argv", "usage", "has", "lacks"),
    [
        (("rejects", "retry", "--help"), "Usage: idem rejects retry [OPTIONS]", "--dry-run", "--limit"),
        (("rejects", "list", "--help"), "Usage: idem rejects list [OPTIONS]", "--limit", "--dry-run"),
        (("rejects", "--help"), "Usage: idem rejects [OPTIONS] [COMMAND] [ARGS]...", "retry", "--no-such"),
    ],
)
def test_rejects_list_and_retry_have_their_own_help(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], usage: str, has: str, lacks: str
) -> None:
    """``idem rejects retry --help`` used to print the listing's help."""
    code, lines, _ = run(capsys, *argv)
    assert code == 0 and lines[0] == usage
    assert has in "\n".join(lines) and lacks not in "\n".join(lines)
