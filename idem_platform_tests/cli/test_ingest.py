"""`idem ingest` (idem_platform.cli.ingest): one summary line, then a replay; a Dagster run of its job; the
connector it picks; what it refuses to read, in one line."""

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
from idem_platform.defs import inprocess
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.cli import run
from idem_platform_tests.helpers.config import example_text
from idem_platform_tests.helpers.paths import EXAMPLE_CONFIG


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
    before = inprocess._ingest_job.cache_info()
    code, lines, err = run(capsys, "ingest", "--connector", "threatfeed", str(a), str(b))
    assert code == 0, err
    summary = json.loads(lines[0])
    assert summary["rows_written"] == 2 and len(summary["files"]) == 2
    # Dagster resolved the run's job several times; its definitions were built once.
    built = inprocess._ingest_job.cache_info()
    assert built.misses - before.misses == 1 and built.hits > before.hits


def test_each_run_builds_its_job_from_the_config_as_it_is_then(
    env: IdemConfig, spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config's ``${VAR}`` read again by the next run of the same process: no job built for
    an earlier run is reused."""
    assert env.source is not None and env.connector("threatfeed").path is not None
    text = env.source.read_text(encoding="utf-8")
    env.source.write_text(text.replace("max_reject_ratio: 1.0", "max_reject_ratio: ${IDEM_TEST_RATIO}"), encoding="utf-8")
    path = write_lines(env.connector("threatfeed").path / "ratio.ndjson", ['{"type":"malware","id":"r","name":"x"}', "{bad"])
    monkeypatch.setenv("IDEM_TEST_RATIO", "0.1")
    code, _, err = run(capsys, "ingest", "--connector", "threatfeed", str(path))
    assert code != 0 and "1 of 2" in err, err  # over the ratio: nothing committed
    monkeypatch.setenv("IDEM_TEST_RATIO", "1.0")
    code, lines, err = run(capsys, "ingest", "--connector", "threatfeed", str(path))
    assert code == 0, err
    assert (json.loads(lines[0])["rows_written"], json.loads(lines[0])["rows_rejected"]) == (1, 1)


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


RUNS_IN_JOB_HISTORY = """
query ($job: String!, $repository: String!) {
  runsOrError(filter: {pipelineName: $job, tags: [{key: ".dagster/repository", value: $repository}]}) {
    ... on Runs { results { runId status repositoryOrigin { repositoryLocationName } tags { key value } } }
  }
}
"""
REEXECUTE = """
mutation ($parent: String!) {
  launchPipelineReexecution(reexecutionParams: {parentRunId: $parent, strategy: ALL_STEPS}) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  }
}
"""
RUN_STATUS = "query ($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"


@pytest.mark.slow
def test_ingest_through_a_webserver_is_a_run_of_its_code_location(
    env: IdemConfig, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``idem ingest --dagster URL``: the run is launched in the code location that defines
    the connector (the webserver queues it, the daemon runs it), so the job's history, which
    the UI filters by code location, lists it; the UI can re-execute it (a replay, nothing
    written twice); a file outside the drop directory is refused in one line."""
    import time
    from importlib import resources

    from idem_platform_tests.helpers.webserver import LOCATION, webserver

    # The instance idem dev runs: Dagster's storage on PostgreSQL (four processes write to
    # it here: this one, the webserver, the daemon and the run).
    home = Path(os.environ["DAGSTER_HOME"])
    (home / "dagster.yaml").write_text((resources.files("idem_platform") / "dagster.yaml").read_text())
    drop = env.connector("threatfeed").path
    assert env.source is not None and drop is not None
    path = write_lines(drop / "via-web.ndjson", ['{"type":"malware","id":"w","name":"x"}', "{bad"])
    outside = write_lines(tmp_path / "elsewhere.ndjson", ['{"type":"malware","id":"e","name":"x"}'])
    with webserver(home, tmp_path, env.source, pg_url, daemon=True) as api:
        code, lines, err = run(capsys, "ingest", "--dagster", api.base, str(path))
        assert code == 0, err
        summary = json.loads(lines[0])
        assert (summary["rows_written"], summary["rows_rejected"], summary["replayed"]) == (1, 1, False)
        assert summary["dagster"] == f"{api.base}/runs/{summary['run_id']}"
        history = api.query(RUNS_IN_JOB_HISTORY, {"job": "threatfeed_ingest", "repository": f"__repository__@{LOCATION}"})
        (shown,) = history["runsOrError"]["results"]
        assert (shown["runId"], shown["status"]) == (summary["run_id"], "SUCCESS")
        assert shown["repositoryOrigin"] == {"repositoryLocationName": LOCATION}
        assert {"key": "dagster/partition", "value": "via-web.ndjson"} in shown["tags"]

        again = api.query(REEXECUTE, {"parent": summary["run_id"]})["launchPipelineReexecution"]
        assert again["__typename"] == "LaunchRunSuccess", again
        deadline = time.monotonic() + 240
        while (status := api.query(RUN_STATUS, {"id": again["run"]["runId"]})["runOrError"]["status"]) not in (
            "SUCCESS", "FAILURE", "CANCELED",
        ):
            assert time.monotonic() < deadline, f"the re-execution is still {status}"
            time.sleep(0.5)
        assert status == "SUCCESS"

        code, lines, err = run(capsys, "rejects", "retry", "--dagster", api.base, "--dry-run")
        assert code == 0, err
        retried = json.loads(lines[0])
        assert retried["retry"]["dry_run"] is True and retried["dagster"] == f"{api.base}/runs/{retried['run_id']}"
        history = api.query(RUNS_IN_JOB_HISTORY, {"job": "threatfeed_retry_rejects", "repository": f"__repository__@{LOCATION}"})
        assert [r["runId"] for r in history["runsOrError"]["results"]] == [retried["run_id"]]

        code, _, err = run(capsys, "ingest", "--dagster", api.base, "--connector", "threatfeed", str(outside))
        assert code != 0 and "reads only files inside its drop directory" in err
    with connect(pg_url) as conn:
        held = conn.execute("SELECT count(*) FROM idem.malware WHERE _external_id = 'w'").fetchone()
    assert held == (1,)
