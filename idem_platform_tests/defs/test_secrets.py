"""No credential is printed, logged or stored: the PostgreSQL URL's password and a Kafka
connector's ``client_config`` secrets stay out of summaries, error lines, tracebacks, log
files, Dagster's run records (event log, run config, job snapshot) and idem's own tables.

The server may trust every client: what matters is that the URL *carries* a password,
as production URLs do. A role with that password is created (or reset) for these tests.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import psycopg
import pytest
from psycopg import sql

from idem_platform.cli import main
from idem_platform.config import IdemConfig
from idem_platform.defs.definitions import build_definitions
from idem_platform.defs.filedrop.partitions import partitions_for
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.filedrop import drop_dir, run_file_partition
from idem_platform_tests.helpers.kafka import kafka_config

ROLE = "idem_secret_test"
PASSWORD = "s3cr3t-pw"
KAFKA_PASSWORD = "k4fka-s3cr3t"
RECORDS = ['{"type":"malware","id":"m1","name":"x"}', "{not json"]


def with_credentials(url: str, user: str, password: str, host: str | None = None) -> str:
    """``url`` logging in as ``user`` with ``password`` (same database, same query)."""
    parts = urlsplit(url)
    where = host if host is not None else (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, f"{user}:{password}@{where}", parts.path, parts.query, parts.fragment))


@pytest.fixture(scope="module")
def secret_url(pg_url: str, postgres_server: str) -> str:
    """This module's database, reached as a role whose URL carries a password."""
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [ROLE]).fetchone()
        admin.execute(
            sql.SQL("{} ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                sql.SQL("ALTER" if exists else "CREATE"), sql.Identifier(ROLE), sql.Literal(PASSWORD)
            )
        )
    url = with_credentials(pg_url, ROLE, PASSWORD)
    with psycopg.connect(url) as conn:  # the role really logs in with this URL
        assert conn.execute("SELECT current_user").fetchone() == (ROLE,)
    return url


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def database_leaks(url: str) -> list[str]:
    """idem's tables (commits, ledger, rejects, execution log, catalog, the record tables)
    with a row that holds the password anywhere."""
    with connect(url) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'idem'")]
        return [
            table for table in tables
            if conn.execute(
                sql.SQL("SELECT count(*) FROM idem.{} t WHERE to_jsonb(t)::text LIKE {}").format(
                    sql.Identifier(table), sql.Literal(f"%{PASSWORD}%")
                )
            ).fetchone()[0]
        ]


def dagster_leaks(instance: dg.DagsterInstance) -> list[str]:
    """Where Dagster keeps the password, for every run of ``instance``: its event log (messages,
    metadata, errors), its run config and tags, its job and execution plan snapshots."""
    found = []
    for run in instance.get_runs():
        if any(PASSWORD in repr(entry) for entry in instance.all_logs(run.run_id)):
            found.append(f"event log of {run.run_id}")
        if PASSWORD in repr(run):
            found.append(f"run {run.run_id}")
        if run.job_snapshot_id and PASSWORD in repr(instance.get_job_snapshot(run.job_snapshot_id)):
            found.append(f"job snapshot of {run.run_id}")
        if run.execution_plan_snapshot_id and PASSWORD in repr(instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)):
            found.append(f"execution plan snapshot of {run.run_id}")
    return found


def files_holding(directory: Path, secret: str = PASSWORD) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_masking_and_scrubbing() -> None:
    from idem_platform.redact import masked, masked_settings, remember_url, scrub, url_secrets

    assert masked("postgresql://idem:pw@db:5432/idem?sslmode=require") == "postgresql://idem:***@db:5432/idem?sslmode=require"
    assert masked("postgresql://db/idem?user=idem&password=pw") == "postgresql://db/idem?user=idem&password=***"
    assert masked("host=db user=idem password='p w'") == "host=db user=idem password=***"
    assert masked("postgresql://idem:pw@[::1/idem") == "postgresql://idem:***@[::1/idem"  # too broken for urlsplit
    assert url_secrets("postgresql://u:a%40b@h/d") == {"a%40b", "a@b"}
    assert masked_settings({"sasl.password": "x", "ssl.key.password": "y", "sasl.username": "u"}) == {
        "sasl.password": "***", "ssl.key.password": "***", "sasl.username": "u",
    }
    remember_url("postgresql://u:unique-pw-123@h/d")
    assert scrub('missing "=" after "u:unique-pw-123@h/d"') == 'missing "=" after "u:***@h/d"'


@pytest.mark.slow
def test_an_ingest_by_the_cli_shows_the_password_nowhere(
    secret_url: str, threatfeed: IdemConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert threatfeed.connector("threatfeed").path is not None
    path = write_lines(threatfeed.connector("threatfeed").path / "s.ndjson", RECORDS)
    env = {**cli_env(secret_url, tmp_path, threatfeed), "IDEM_HOME": str(tmp_path / ".idem")}
    done = subprocess.run(
        idem_command("ingest", "--connector", "threatfeed", str(path)), env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["rows_written"], summary["rows_rejected"]) == (1, 1)
    assert PASSWORD not in done.stdout and PASSWORD not in done.stderr
    assert "log4j profile" not in done.stderr and "NativeCodeLoader" not in done.stderr  # idem's JVM log settings
    assert database_leaks(secret_url) == []
    home = Path(env["DAGSTER_HOME"])
    assert files_holding(home) == [] and files_holding(tmp_path / ".idem") == []
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        assert len(instance.get_runs()) == 1 and dagster_leaks(instance) == []


@pytest.mark.parametrize("explicit", [True, False], ids=["postgres_url-argument", "IDEM_POSTGRES_URL"])
def test_a_dagster_run_shows_the_password_nowhere(
    secret_url: str, threatfeed: IdemConfig, instance: dg.DagsterInstance, spark: Any,
    monkeypatch: pytest.MonkeyPatch, explicit: bool,
) -> None:
    """An explicit URL was a config default: stored in the job snapshot, shown in the Launchpad."""
    path = write_lines(drop_dir(threatfeed) / "d.ndjson", RECORDS)
    if explicit:
        monkeypatch.delenv("IDEM_POSTGRES_URL", raising=False)
        defs = build_definitions(threatfeed, postgres_url=secret_url)
    else:
        monkeypatch.setenv("IDEM_POSTGRES_URL", secret_url)
        defs = build_definitions(threatfeed)
    result = run_file_partition(defs, instance, threatfeed, path, raise_on_error=False)
    assert result.success
    (event,) = [m for m in result.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"]
    assert event.metadata["rows_written"].value == 1 and event.metadata["rows_rejected"].value == 1
    assert dagster_leaks(instance) == []
    assert database_leaks(secret_url) == []
    with connect(secret_url) as conn:
        assert conn.execute("SELECT count(*) FROM idem.commits").fetchone() == (1,)


def test_a_dagster_run_that_cannot_parse_the_url_does_not_log_it(
    pg_url: str, threatfeed: IdemConfig, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq echoes a URL it cannot parse whole; Dagster would store that message."""
    monkeypatch.delenv("IDEM_POSTGRES_URL", raising=False)
    broken = with_credentials(pg_url, ROLE, PASSWORD, host="[::1")
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    path = write_lines(connector.path / "b.ndjson", RECORDS)
    instance.add_dynamic_partitions(partitions_for(connector).name or "", ["b.ndjson"])
    result = build_definitions(threatfeed, postgres_url=broken).resolve_job_def("threatfeed_ingest").execute_in_process(
        instance=instance, partition_key="b.ndjson", raise_on_error=False,
        run_config={"ops": {"threatfeed__ingest": {"config": {"files": [str(path)]}}}},
    )
    assert not result.success
    messages = " ".join(repr(entry) for entry in instance.all_logs(result.run_id))
    assert f"{ROLE}:***@[::1" in messages  # the error is still there, with the password masked
    assert dagster_leaks(instance) == []


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
@pytest.mark.parametrize("where", ["nothing-listens", "unparsable"])
def test_a_failing_connection_names_no_password(
    threatfeed: IdemConfig, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], where: str, verbose: bool,
) -> None:
    host = f"127.0.0.1:{free_port()}" if where == "nothing-listens" else "[::1"
    monkeypatch.setenv("IDEM_POSTGRES_URL", with_credentials(pg_url, ROLE, PASSWORD, host=host))
    monkeypatch.setenv("IDEM_CONFIG", str(threatfeed.source))
    monkeypatch.setenv("IDEM_HOME", str(tmp_path / ".idem"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert threatfeed.connector("threatfeed").path is not None
    path = write_lines(threatfeed.connector("threatfeed").path / "f.ndjson", RECORDS)
    code = main([*(["--verbose"] if verbose else []), "ingest", "--connector", "threatfeed", str(path)])
    out, err = capsys.readouterr()
    last = err.splitlines()[-1]
    assert code == 1 and out == "" and last.startswith("idem: error: ")
    assert PASSWORD not in err and files_holding(tmp_path / ".idem") == []
    assert ("Traceback" in err) is verbose and (err.count("\n") == 1) is not verbose
    if where == "unparsable":  # libpq quoted the whole URL: it is there, masked
        assert f"{ROLE}:***@[::1" in last
    else:  # a server down is no bug: no traceback file, one line saying so
        assert last.startswith("idem: error: PostgreSQL unreachable: ") and "traceback in" not in last


def test_kafka_client_secrets_are_in_no_error_and_no_repr(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = (
        "client_config:\n      security.protocol: SASL_PLAINTEXT\n      sasl.mechanism: PLAIN\n"
        f"      sasl.username: idem\n      sasl.password: {KAFKA_PASSWORD}\n    read_timeout_seconds: 5"
    )
    config = kafka_config(tmp_path, f"127.0.0.1:{free_port()}", ["events-topic"], extra)
    assert config.connector("events").client_config["sasl.password"] == KAFKA_PASSWORD
    assert KAFKA_PASSWORD not in repr(config) and KAFKA_PASSWORD not in str(config.connector("events"))
    for name, value in cli_env(pg_url, tmp_path, config).items():
        monkeypatch.setenv(name, value)
    code = main(["--verbose", "ingest", "--connector", "events"])
    _, err = capsys.readouterr()
    assert code == 1 and "Kafka brokers 127.0.0.1:" in err.splitlines()[-1]
    assert KAFKA_PASSWORD not in err
