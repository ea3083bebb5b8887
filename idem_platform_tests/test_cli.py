"""The `idem` command: one JSON line on success, one error line and a non-zero exit otherwise."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from idem_platform.cli import main
from idem_platform.cli.common import SUMMARY_KEYS
from idem_platform.config import IdemConfig
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.config import example_text
from idem_platform_tests.helpers.paths import EXAMPLE_CONFIG


@pytest.fixture
def env(pg_url: str, tmp_path: Path, threatfeed: IdemConfig, monkeypatch: pytest.MonkeyPatch) -> IdemConfig:
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("IDEM_CONFIG", str(threatfeed.source))
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[2]")
    return threatfeed


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.strip()], err


def test_ingest_prints_one_summary_line_then_replays(env: IdemConfig, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert env.connector("threatfeed").path is not None
    path = write_lines(env.connector("threatfeed").path / "c1.ndjson", ['{"type":"malware","id":"m","name":"x"}', "{bad"])
    code, lines, _ = run(capsys, "ingest", "--connector", "threatfeed", str(path))
    assert code == 0 and len(lines) == 1
    summary = json.loads(lines[0])
    assert list(summary)[: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert (summary["rows_written"], summary["rows_rejected"], summary["replayed"]) == (1, 1, False)
    assert summary["files"][0]["file"] == str(path)
    code, lines, _ = run(capsys, "ingest", str(path))  # the config's only connector
    replay = json.loads(lines[0])
    assert code == 0 and replay["replayed"] is True and replay["prior"]["commit_id"] == summary["commit_id"]

    code, lines, err = run(capsys, "read", "malware")
    assert code == 0 and json.loads(err.strip().splitlines()[-1]) == {"record_type": "malware", "rows": 1}
    row = json.loads(lines[0])
    assert row["_external_id"] == "m" and row["name"] == "x" and row["_commit_id"] == summary["commit_id"]

    code, lines, _ = run(capsys, "rejects", "--commit", summary["commit_id"])
    (reject,) = [json.loads(line) for line in lines]
    assert code == 0 and reject["line"] == 2 and reject["raw"] == "{bad" and reject["connector"] == "threatfeed"
    assert reject["position"].endswith("#L2") and reject["reasons"][0]["rule"] == "json"
    code, lines, _ = run(capsys, "rejects", "--connector", "threatfeed", "--commit", summary["commit_id"])
    assert code == 0 and len(lines) == 1


def test_multiple_files_commit_together(env: IdemConfig, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    directory = env.connector("threatfeed").path
    assert directory is not None
    a = write_lines(directory / "a.ndjson", ['{"type":"malware","id":"a","name":"x"}'])
    b = write_lines(directory / "b.ndjson", ['{"type":"malware","id":"b","name":"y"}'])
    code, lines, err = run(capsys, "ingest", "--connector", "threatfeed", str(a), str(b))
    assert code == 0, err
    summary = json.loads(lines[0])
    assert summary["rows_written"] == 2 and len(summary["files"]) == 2


RUNS_OF_JOB = """
query ($job: String!) {
  runsOrError(filter: {pipelineName: $job}) {
    ... on Runs { results { runId pipelineName status tags { key value } } }
  }
}
"""


def test_an_ingest_run_is_a_dagster_run_of_its_job_with_its_origin(
    env: IdemConfig, spark: Any, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``idem ingest``'s run names the code that defines its job (a job code origin: the
    reconstructor and the config file), and a real webserver on the same instance lists it
    among the job's runs."""
    import dagster as dg

    from idem_platform_tests.helpers.webserver import webserver

    assert env.source is not None and env.connector("threatfeed").path is not None
    path = write_lines(env.connector("threatfeed").path / "origin.ndjson", ['{"type":"malware","id":"o","name":"x"}'])
    code, lines, err = run(capsys, "ingest", "--connector", "threatfeed", str(path))
    assert code == 0, err
    instance = dg.DagsterInstance.get()
    (record,) = instance.get_run_records(dg.RunsFilter(job_name="threatfeed_ingest"))
    run_ = record.dagster_run
    assert run_.status == dg.DagsterRunStatus.SUCCESS and run_.tags["dagster/partition"] == "origin.ndjson"
    origin = run_.job_code_origin
    assert origin is not None and origin.job_name == "threatfeed_ingest"
    assert origin.repository_origin.executable_path == sys.executable
    summary = json.loads(lines[0])
    with webserver(Path(os.environ["DAGSTER_HOME"]), tmp_path, env.source, pg_url) as api:
        (shown,) = api.query(RUNS_OF_JOB, {"job": "threatfeed_ingest"})["runsOrError"]["results"]
    assert (shown["runId"], shown["pipelineName"], shown["status"]) == (run_.run_id, "threatfeed_ingest", "SUCCESS")
    assert {"key": "dagster/partition", "value": "origin.ndjson"} in shown["tags"]
    assert summary["rows_written"] == 1


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


def test_ledger_purge(env: IdemConfig, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(capsys, "ledger", "purge")
    assert code == 0 and json.loads(lines[0]) == {"purged": 0, "staging_dropped": 0}


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


def test_urls_are_shown_without_their_password() -> None:
    from idem_platform.redact import masked

    assert masked("postgresql://idem:s3cret@db:5432/idem?sslmode=require") == "postgresql://idem:***@db:5432/idem?sslmode=require"
    assert masked("postgresql://postgres@127.0.0.1:5432/postgres") == "postgresql://postgres@127.0.0.1:5432/postgres"


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


@pytest.mark.slow
def test_a_bad_spark_master_is_one_line_naming_it(pg_url: str, threatfeed: IdemConfig, tmp_path: Path) -> None:
    import subprocess

    from idem_platform_tests.helpers.cli import cli_env, idem_command

    assert threatfeed.connector("threatfeed").path is not None
    path = write_lines(threatfeed.connector("threatfeed").path / "m.ndjson", ['{"type":"malware","id":"m","name":"x"}'])
    env = {**cli_env(pg_url, tmp_path, threatfeed), "IDEM_SPARK_MASTER": "bogus://nowhere:1"}
    done = subprocess.run(
        idem_command("ingest", "--connector", "threatfeed", str(path)), env=env, capture_output=True, text=True, timeout=300
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1
    assert last.startswith("idem: error: ") and "spark.master 'bogus://nowhere:1'" in last


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


def _socket_at(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Unix socket at ``path`` (bound from its directory: socket paths are limited to 108 bytes)."""
    import socket

    monkeypatch.chdir(path.parent)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path.name)
    server.close()  # the socket file stays


def _device_at(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stat as stat_module

    try:
        os.mknod(path, stat_module.S_IFCHR | 0o600, os.makedev(1, 3))  # like /dev/null
    except PermissionError:
        pytest.skip("creating a device node needs root")


@pytest.mark.timeout(60)  # opening the FIFO would block for ever: the test fails instead of hanging
@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda path, _: os.mkfifo(path), "a FIFO, not a regular file: refused"),
        (_socket_at, "a socket, not a regular file: refused"),
        (_device_at, "a character device, not a regular file: refused"),
        (lambda path, _: path.mkdir(), "a directory, not a regular file: refused"),
    ],
    ids=["fifo", "socket", "device", "directory"],
)
def test_ingest_refuses_what_is_not_a_regular_file_in_one_line(
    env: IdemConfig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, make: Any, reason: str
) -> None:
    """The sensor's reason, as one line naming the path: never "no such file", never a hang."""
    directory = env.connector("threatfeed").path
    assert directory is not None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "odd.ndjson"
    make(path, monkeypatch)
    code, lines, err = run(capsys, "ingest", "--connector", "threatfeed", str(path))
    assert code == 1 and lines == []
    assert err == f"idem: error: {path}: {reason}\n"


def test_ingest_refuses_a_symlink_out_of_the_drop_directory_in_the_sensors_words(
    env: IdemConfig, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from idem_platform.sources.filedrop.scan import refusal

    directory = env.connector("threatfeed").path
    assert directory is not None
    secret = write_lines(tmp_path / "outside" / "secret.ndjson", ['{"type":"malware","id":"s","name":"not yours"}'])
    link = directory / "link.ndjson"
    directory.mkdir(parents=True, exist_ok=True)
    link.symlink_to(secret)
    code, lines, err = run(capsys, "ingest", "--connector", "threatfeed", str(link))
    assert code == 1 and lines == []
    assert err == f"idem: error: {link}: a symlink out of the drop directory (to {secret.resolve()}): refused\n"
    # The sensor skips it for the same reason, in the same words.
    assert refusal(link, directory.resolve()) == f"a symlink out of the drop directory (to {secret.resolve()}), not read"
    # A device named directly (not in the drop directory) is refused too, and never opened.
    code, _, err = run(capsys, "ingest", "--connector", "threatfeed", "/dev/null")
    assert code == 1 and err == "idem: error: /dev/null: a character device, not a regular file: refused\n"


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


def test_verbose_shows_a_failed_runs_recorded_error(
    env: IdemConfig, spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import idem_platform.defs.filedrop.assets as assets

    assert env.connector("threatfeed").path is not None
    path = write_lines(env.connector("threatfeed").path / "v.ndjson", ['{"type":"malware","id":"v","name":"x"}'])

    def failing_plan(*args: object, **kwargs: object) -> None:
        raise ValueError("the planner broke")

    monkeypatch.setattr(assets, "plan_batch", failing_plan)
    code, _, quiet = run(capsys, "ingest", "--connector", "threatfeed", str(path))
    # (before it, only what Dagster itself prints on a fresh DAGSTER_HOME: its telemetry notice)
    assert code == 1 and quiet.splitlines()[-1] == "idem: error: threatfeed__ingest: ValueError: the planner broke"
    assert "Traceback" not in quiet and "failing_plan" not in quiet and "Not executing" not in quiet
    code, _, err = run(capsys, "ingest", "-v", "--connector", "threatfeed", str(path))
    *trace, last = err.splitlines()
    assert code == 1 and last == "idem: error: threatfeed__ingest: ValueError: the planner broke"
    assert "in failing_plan" in "\n".join(trace) and 'raise ValueError("the planner broke")' in "\n".join(trace)


def test_ingest_needs_connector_only_when_the_config_has_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No PostgreSQL named: a usage error must not start the embedded one to say so.
    monkeypatch.delenv("IDEM_POSTGRES_URL", raising=False)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("IDEM_HOME", str(tmp_path / "idem-home"))
    two = example_text().replace(
        "connectors:\n", "connectors:\n- {name: other, kind: filedrop, path: drop/other, record_type: indicator, id_field: id}\n", 1
    )
    config = tmp_path / "idem.yaml"
    config.write_text(two, encoding="utf-8")
    assert main(["ingest", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has several connectors: pick one with --connector (other, threatfeed)" in err
    assert not (tmp_path / "idem-home").exists()


def test_ingest_picks_the_connector_whose_directory_holds_the_files(
    env: IdemConfig, spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from idem_platform_tests.helpers.config import write_config

    full = write_config(Path(str(env.source)).parent, EXAMPLE_CONFIG.read_text(encoding="utf-8"))  # + http, otlp
    monkeypatch.setenv("IDEM_CONFIG", str(full.source))
    pushed = write_lines(full.connector("threatfeed-push").path / "p.ndjson", ['{"type":"malware","id":"p","name":"x"}'])
    code, lines, _ = run(capsys, "ingest", str(pushed))
    assert code == 0 and json.loads(lines[0])["rows_written"] == 1
    with connect(os.environ["IDEM_POSTGRES_URL"]) as conn:
        connector, key = conn.execute(
            "SELECT c.connector, m._idempotency_key FROM idem.malware m JOIN idem.commits c "
            "ON c.commit_id = m._commit_id WHERE m._external_id = 'p'"
        ).fetchone()
    # its own commit, under the key namespace it shares with the file drop
    assert connector == "threatfeed-push" and key.startswith("threatfeed:malware:p:")
    outside = write_lines(Path(str(env.source)).parent / "elsewhere.ndjson", ['{"type":"malware","id":"q","name":"y"}'])
    code, lines, _ = run(capsys, "ingest", str(outside))  # no connector's directory: the only file-drop one
    assert code == 0 and json.loads(lines[0])["rows_written"] == 1


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


def test_dev_with_a_missing_workspace_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    """``idem dev`` with no workspace file used to start PostgreSQL, then print dagster's usage."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IDEM_POSTGRES_URL", pg_url)
    monkeypatch.setenv("IDEM_HOME", str(tmp_path / "idem-home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster-home"))
    missing = tmp_path / "workspace.yaml"
    code, lines, err = run(capsys, "dev", "--workspace", str(missing), "--no-spark-server")
    assert code == 1 and lines == [] and err.count("\n") == 1
    assert err.startswith(f"idem: error: no workspace file {missing}: name an existing one with --workspace")
    assert not (tmp_path / "dagster-home").exists() and not (tmp_path / "idem-home").exists()


def test_dev_without_a_workspace_file_loads_idems_own_code_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from idem_platform.cli.dev import workspace_file

    monkeypatch.chdir(tmp_path)
    builtin = yaml.safe_load(workspace_file(None).read_text(encoding="utf-8"))
    assert builtin == yaml.safe_load((Path(__file__).parents[1] / "workspace.yaml").read_text(encoding="utf-8"))
    assert builtin["load_from"][0]["python_module"]["module_name"] == "idem_platform.definitions"
    (tmp_path / "workspace.yaml").write_text("load_from: []\n")
    assert workspace_file(None) == tmp_path / "workspace.yaml"
