"""What the `idem` command prints (idem_platform.cli.output): a summary for people, URLs without passwords,
the job's own log lines, and an unforeseen error as one line with its traceback in a file (or on
stderr with -v)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idem_platform.config import IdemConfig
from idem_platform_tests.helpers.cli import run


def test_a_terminal_gets_a_summary_for_people() -> None:
    from idem_platform.cli.output import human_summary

    summary = {
        "commit_id": "c-1", "rows_written": 900_473, "rows_skipped": 99_527, "rows_rejected": 12, "replayed": False,
        "seconds": 21.86, "files": [{"file": "/d/feed.ndjson", "lines": 1_000_012}],
        "tables": {"malware": {"written": 300_000, "skipped": 1}, "indicator": {"written": 600_473, "skipped": 99_526}},
    }
    text = human_summary(summary)
    assert text.splitlines()[0] == "committed c-1 in 21.9 s"
    assert "  idem.indicator  600,473   99,526" in text and "  total           900,473   99,527" in text
    assert "12 records rejected: idem rejects --commit c-1" in text and "file /d/feed.ndjson (1,000,012 lines)" in text
    replay = human_summary({"replayed": True, "rows_skipped": 5, "prior": {"commit_id": "c-0"}, "seconds": 2.2})
    assert replay == "replay: already committed by c-0; nothing written, 5 records skipped (2.2 s)"
    assert human_summary({"nothing_to_ingest": True, "seconds": 1}).startswith("nothing to ingest")
    owed = human_summary({**summary, "effects_created": 3, "effects_suppressed": 0})
    assert "3 outbound effects owed: idem effects deliver" in owed and "suppressed" not in owed
    assert "2 outbound effects suppressed (a replay run)" in human_summary({**summary, "effects_suppressed": 2})


def test_an_upsert_tables_current_state_counts_are_shown() -> None:
    from idem_platform.cli.output import human_summary

    counts = {"written": 5, "skipped": 0, "inserted": 2, "updated": 1, "deleted": 1, "stale": 1}
    text = human_summary({"commit_id": "c-2", "rows_written": 5, "seconds": 1.0, "tables": {"customer": counts}})
    assert "  idem.customer_current: 2 inserted, 1 updated, 1 deleted, 1 stale (history only)" in text.splitlines()


def test_urls_are_shown_without_their_password() -> None:
    from idem_platform.redact import masked

    assert masked("postgresql://idem:s3cret@db:5432/idem?sslmode=require") == "postgresql://idem:***@db:5432/idem?sslmode=require"
    assert masked("postgresql://postgres@127.0.0.1:5432/postgres") == "postgresql://postgres@127.0.0.1:5432/postgres"


def test_an_unforeseen_failure_is_one_line_with_the_traceback_in_a_file(
    env: IdemConfig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import idem_platform.cli.offsets as cli

    monkeypatch.setenv("IDEM_HOME", str(tmp_path / "home-idem"))

    def broken(*args: object) -> None:
        raise RuntimeError("something nobody foresaw\nsecond line")

    monkeypatch.setattr(cli, "offsets_report", broken)
    umask = os.umask(0o022)  # the usual one, under which plain writes are world-readable
    try:
        code, _, err = run(capsys, "offsets")
    finally:
        os.umask(umask)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("idem: error: RuntimeError: something nobody foresaw (traceback in ")
    log = Path(err.rsplit("traceback in ", 1)[1].rstrip(")\n"))
    assert "second line" in log.read_text() and "Traceback" in log.read_text()
    # a traceback can hold records: only its owner reads it, whatever the umask
    assert log.stat().st_mode & 0o777 == 0o600
    assert log.parent.stat().st_mode & 0o777 == (tmp_path / "home-idem").stat().st_mode & 0o777 == 0o700


def test_the_terminal_logger_prints_only_the_jobs_own_lines(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from idem_platform.defs.terminal import _OwnMessages

    handler = _OwnMessages()
    own = logging.LogRecord("x", logging.INFO, "f", 1, "m", None, None)
    own.dagster_meta = {"orig_message": "slice 1/2 staged", "step_key": "feed__committed"}  # type: ignore[attr-defined]
    event = logging.LogRecord("x", logging.ERROR, "f", 1, "m", None, None)
    event.dagster_meta = {"orig_message": "Traceback ...", "dagster_event": object()}  # type: ignore[attr-defined]
    debug = logging.LogRecord("x", logging.DEBUG, "f", 1, "m", None, None)
    for record in (own, event, debug):
        handler.emit(record)
    assert capsys.readouterr().err == "feed__committed: slice 1/2 staged\n"


def test_verbose_prints_an_unforeseen_errors_traceback_then_the_same_one_line(
    env: IdemConfig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import idem_platform.cli.offsets as cli

    monkeypatch.setenv("IDEM_HOME", str(tmp_path / "home-idem"))

    def broken(*args: object) -> None:
        try:
            {}["missing"]
        except KeyError as exc:
            raise RuntimeError("something nobody foresaw") from exc

    monkeypatch.setattr(cli, "offsets_report", broken)
    code, _, quiet = run(capsys, "offsets")
    assert code == 1 and quiet.count("\n") == 1 and "Traceback" not in quiet
    for argv in (("-v", "offsets"), ("offsets", "--verbose")):
        code, _, err = run(capsys, *argv)
        *trace, last = err.splitlines()
        assert code == 1 and last.startswith("idem: error: RuntimeError: something nobody foresaw (traceback in ")
        text = "\n".join(trace)
        assert text.startswith("Traceback") and "KeyError: 'missing'" in text and "in broken" in text
        assert "The above exception was the direct cause of the following exception" in text


def test_verbose_prints_the_cause_of_a_foreseen_error_and_nothing_for_a_plain_one(
    env: IdemConfig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import idem_platform.cli.offsets as cli
    from idem_platform.errors import KafkaError

    def unreachable(*args: object) -> None:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise KafkaError("Kafka brokers 127.0.0.1:1 unreachable") from exc

    monkeypatch.setattr(cli, "offsets_report", unreachable)
    code, _, quiet = run(capsys, "offsets")
    assert code == 1 and quiet == "idem: error: Kafka brokers 127.0.0.1:1 unreachable\n"
    code, _, err = run(capsys, "-v", "offsets")
    *trace, last = err.splitlines()
    assert code == 1 and last == "idem: error: Kafka brokers 127.0.0.1:1 unreachable"
    assert "ConnectionRefusedError: [Errno 111] Connection refused" in "\n".join(trace) and "in unreachable" in "\n".join(trace)
    # A mistake the line says all about has no traceback to show, verbose or not.
    code, _, err = run(capsys, "-v", "read", "nope")
    assert code == 1 and err.count("\n") == 1 and err.startswith("idem: error: unknown record type 'nope'")
