"""What every command takes (idem_platform.cli.options): --config before or after the command, and bad
arguments or a bad config reported as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from idem_platform.config import IdemConfig
from idem_platform_tests.helpers.cli import run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("ingest", "--connector", "threatfeed", "/no/such/file.ndjson"), "no such file: /no/such/file.ndjson"),
        (("ingest", "--connector", "nope", "x"), "no connector named 'nope' (known: threatfeed)"),
        (("read", "nope"), "unknown record type 'nope'"),
        (("rejects", "--commit", "notauuid"), "--commit 'notauuid' is not a commit id (a UUID)"),
        (("read", "malware", "--commit", "notauuid"), "--commit 'notauuid' is not a commit id (a UUID)"),
        (("read", "malware", "--limit", "-1"), "--limit must be at least 1 (got -1)"),
        (("rejects", "--limit", "0"), "--limit must be at least 1 (got 0)"),
    ],
)
def test_errors_are_one_line(env: IdemConfig, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    code, lines, err = run(capsys, *argv)
    assert code == 1 and lines == []
    assert err.startswith("idem: error: ") and message in err and err.count("\n") == 1


def test_bad_config_is_reported_with_its_line(env: IdemConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("connectors:\n  - name: x\n    kind: filedrop\n")
    code, _, err = run(capsys, "ingest", "--config", str(broken), "--connector", "x", "f")
    assert code == 1 and "connectors[0] (line 2)" in err and "set exactly one of" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("connectors: 5\n", "connectors (line 1): Input should be a valid list"),
        ("tables: {}\ntables: {}\n", "not valid YAML (line 2, column 1): key 'tables' is given twice in one mapping"),
        ("connectors: [\n", "not valid YAML (line 2, column 1): expected the node content"),
        (
            "connectors:\n  - {name: feed-a, kind: filedrop, path: d, record_type: t}\n"
            "  - {name: feed_a, kind: filedrop, path: d, record_type: t}\ntables:\n  t: {columns: {a: string}}\n",
            "connector names 'feed-a' and 'feed_a' are both 'feed_a' in Dagster (asset keys, group, job, sensor",
        ),
    ],
)
def test_config_mistakes_are_one_line_naming_file_and_line(
    env: IdemConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)
    code, _, err = run(capsys, "read", "malware", "--config", str(broken))
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"idem: error: {broken}: ") and message in err


def test_a_config_that_is_not_utf8_is_one_line(env: IdemConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "latin1.yaml"
    broken.write_bytes("connectors: []\n# caf\xe9\n".encode("latin-1"))
    code, _, err = run(capsys, "read", "malware", "--config", str(broken))
    assert code == 1 and err.count("\n") == 1 and "not UTF-8 text (byte 20 is 0xe9)" in err


def test_shared_options_are_accepted_before_the_command(
    env: IdemConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``idem --config F rejects`` was refused: --config went only after the command."""
    code, _, err = run(capsys, "--config", str(env.source), "rejects", "--connector", "threatfeed")
    assert code == 0, err
    broken = tmp_path / "broken.yaml"
    broken.write_text("connectors: 5\n")
    for argv in (("--config", str(broken), "rejects", "--connector", "x"), ("--config", str(broken), "-v", "offsets")):
        code, _, err = run(capsys, *argv)
        assert code == 1 and err.startswith(f"idem: error: {broken}: connectors (line 1)"), err
    # given on both sides, the one after the command wins
    code, _, err = run(capsys, "--config", str(broken), "rejects", "--config", str(env.source), "--connector", "threatfeed")
    assert code == 0, err
