"""`idem ingest` with effects (idem_platform.cli.ingest and .effects): the summary counts the
effects a run created, or suppressed when tagged --replay; then `idem effects deliver`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from idem_platform.samples import write_lines
from idem_platform_tests.helpers.cli import cli_env, run
from idem_platform_tests.helpers.effects import alert, effects_config, outbox
from idem_platform_tests.helpers.receiver import receiving


def test_ingest_counts_effects_a_replay_run_suppresses_them_and_deliver_sends(
    tmp_path: Path, pg_url: str, spark: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with receiving() as receiver:
        config = effects_config(tmp_path, pg_url, [alert(receiver.url)])
        for name, value in cli_env(pg_url, tmp_path, config).items():
            monkeypatch.setenv(name, value)
        drop = config.connector("threatfeed").path
        assert drop is not None
        old = write_lines(drop / "old.ndjson", ['{"type":"indicator","id":"o1","name":"old","confidence":95}'])
        code, lines, err = run(capsys, "ingest", "--replay", str(old))
        assert code == 0, err
        replayed = json.loads(lines[0])
        assert (replayed["rows_written"], replayed["effects_created"], replayed["effects_suppressed"]) == (1, 0, 1)
        assert outbox(pg_url) == []
        new = write_lines(drop / "new.ndjson", [
            '{"type":"indicator","id":"n1","name":"new","confidence":85}',
            '{"type":"indicator","id":"n2","name":"low","confidence":10}',
        ])
        code, lines, err = run(capsys, "ingest", str(new))
        summary = json.loads(lines[0])
        assert (summary["rows_written"], summary["effects_created"], summary["effects_suppressed"]) == (2, 1, 0)
        code, lines, err = run(capsys, "effects", "deliver")
        assert code == 0 and json.loads(lines[0])["delivered"] == 1
    (row,) = outbox(pg_url)
    assert receiver.keys() == [row["key"]] and row["status"] == "delivered"
    assert receiver.requests[0][1] == {"indicator": "new", "confidence": 85, "id": "n1"}
