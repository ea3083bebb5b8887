"""Runs on a long-lived Spark Connect server (``idem spark start``): same rows, exactly once, no JVM per run.

The server is a real ``SparkConnectServer`` (PySpark's own, through ``spark-submit``)
started by the CLI; the runs are ``idem ingest`` child processes with
``IDEM_SPARK_REMOTE`` set, as ``idem dev`` sets it for the runs its sensors launch.
Child processes, because a Connect client flips PySpark into Connect mode for its
whole process, which the rest of this test session must not be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idem_platform.config import IdemConfig
from idem_platform.contract.catalog import table_name
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines, write_lines
from idem_platform.spark.session import DRIVER_JIT_OPTION, driver_java_options
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.faults import wait_until_staging

pytestmark = pytest.mark.slow


# Credentials in the environment of whoever starts the server: its workers must not see them.
SECRET_PASSWORD = "pw-the-workers-must-not-see"
STARTERS_SECRETS = {
    "IDEM_POSTGRES_URL": f"postgresql://idem:{SECRET_PASSWORD}@127.0.0.1:5432/idem",
    "PGPASSWORD": SECRET_PASSWORD,
    "SOME_DATABASE": f"postgresql://app:{SECRET_PASSWORD}@db.example/app",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    directory = tmp_path_factory.mktemp("spark-connect")
    started = subprocess.run(
        idem_command("spark", "start", "--dir", str(directory), "--master", "local[2]"),
        capture_output=True, text=True, timeout=300, env={**os.environ, **STARTERS_SECRETS},
    )
    assert started.returncode == 0, started.stderr[-3000:]
    state = json.loads(started.stdout.strip().splitlines()[-1])
    yield {**state, "dir": str(directory)}
    stopped = subprocess.run(idem_command("spark", "stop", "--dir", str(directory)), capture_output=True, text=True, timeout=120)
    assert json.loads(stopped.stdout.strip().splitlines()[-1])["stopped"] is True


def _ingest(env: dict[str, str], *paths: Path) -> dict[str, object]:
    done = subprocess.run(idem_command("ingest", "--json", *map(str, paths)), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rows(url: str) -> int:
    with connect(url) as conn:
        return sum(
            conn.execute(f'SELECT count(*) FROM idem.{table_name(t)}').fetchone()[0]  # type: ignore[index]
            for t in ("indicator", "malware", "threat-actor")
        )


def test_status_reports_the_running_server(server: dict[str, object]) -> None:
    status = subprocess.run(idem_command("spark", "status", "--dir", str(server["dir"])), capture_output=True, text=True, timeout=60)
    report = json.loads(status.stdout.strip().splitlines()[-1])
    assert report["running"] is True and report["url"] == server["url"]
    assert str(server["url"]).startswith("sc://localhost:") and ";session_id=" in str(server["url"])
    # A long-lived server keeps the full JIT (C2): its JVM turns every row of the runs' Arrow
    # batches into Spark rows; a run's own short-lived session starts with C1 only.
    command_line = Path(f"/proc/{server['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "SparkConnectServer" in command_line and DRIVER_JIT_OPTION not in command_line


def _listening(pids: list[int]) -> dict[int, str]:
    """The TCP ports ``pids`` listen on, each with its local address (an IPv4-mapped IPv6
    address as its IPv4 one)."""
    import ipaddress

    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue  # a Python worker that ended meanwhile
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = {}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order.
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            ip = ipaddress.ip_address(packed)
            found[int(port, 16)] = str(getattr(ip, "ipv4_mapped", None) or ip)
    return found


def test_the_server_listens_on_loopback_only_and_keeps_its_token_private(server: dict[str, object]) -> None:
    """Whoever reaches the server runs code as its user: its gRPC port, the driver's RPC and
    block-manager ports and its Python daemon listen on 127.0.0.1 only; its URL (with the
    token) is in a 0600 file of a 0700 directory, and the token is on no command line."""
    pid = int(server["pid"])  # type: ignore[arg-type]
    ports = _listening([pid, *_children(pid)])
    assert int(server["port"]) in ports and len(ports) >= 3, ports  # type: ignore[arg-type]
    assert all(a in ("127.0.0.1", "::1") for a in ports.values()), ports
    directory = Path(str(server["dir"]))
    assert directory.stat().st_mode & 0o777 == 0o700
    for name in ("connect.json", "connect.log", "secret.conf"):
        assert (directory / name).stat().st_mode & 0o777 == 0o600, name
    token = str(server["url"]).split(";token=")[1].split(";")[0]
    assert len(token) >= 32
    for process in [pid, *_children(pid)]:
        assert token.encode() not in _command(process)
        try:
            environ = Path(f"/proc/{process}/environ").read_bytes()
        except OSError:
            continue  # a Python worker that ended meanwhile
        assert token.encode() not in environ


WORKER_PROBE = """
import json, os, sys
from pyspark.sql import SparkSession

def refused(url):
    session = SparkSession.builder.remote(url).create()  # a session of its own, not the default one
    try:
        session.range(1).count()
    except Exception as exc:
        return "UNAUTHENTICATED" in str(exc)
    finally:
        try:
            session.stop()
        except Exception:
            pass
    return False

port = sys.argv[2]
without = refused(f"sc://127.0.0.1:{port}/")
wrong = refused(f"sc://localhost:{port}/;token=not-the-token")
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()

def environ(batches):
    import os
    import pyarrow as pa
    for _ in batches:
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps(dict(os.environ))])], names=["env"])

seen = spark.range(0, 2, 1, 2).mapInArrow(environ, "env string").collect()
timeout = spark.conf.get("spark.connect.session.manager.defaultSessionTimeout")
print(json.dumps({"without": without, "wrong": wrong, "envs": [json.loads(r.env) for r in seen], "timeout": timeout}))
"""


def test_a_client_needs_the_token_and_workers_see_no_credentials(server: dict[str, object]) -> None:
    """A client without the server's token (or with another) is refused; one with it runs a
    job whose workers' environment holds none of the starter's credentials, nor the token."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_AUTHENTICATE_TOKEN", "IDEM_SPARK_REMOTE")}
    done = subprocess.run(
        [sys.executable, "-c", WORKER_PROBE, str(server["url"]), str(server["port"])],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["without"] is True and report["wrong"] is True
    # Runs share the server's one session: it must outlive Spark Connect's 60-minute idle default.
    assert report["timeout"] == "3650d"
    token = str(server["url"]).split(";token=")[1].split(";")[0]
    assert report["envs"] and all("PYTHONPATH" in e or "PATH" in e for e in report["envs"])
    for worker_env in report["envs"]:
        assert "IDEM_POSTGRES_URL" not in worker_env and "PGPASSWORD" not in worker_env
        text = json.dumps(worker_env)
        assert SECRET_PASSWORD not in text and token not in text


def test_the_servers_python_workers_fork_from_a_daemon_that_imported_the_staging_path(server: dict[str, object]) -> None:
    """Spark kills a Python worker idle for a minute; the server's daemon (spark/daemon.py)
    has the staging modules imported, so the workers it forks for the next run start with them."""
    from idem_platform.spark.connect_server import DAEMON_MODULE

    daemons = [pid for pid in _children(int(server["pid"])) if DAEMON_MODULE.encode() in _command(pid)]  # type: ignore[arg-type]
    assert daemons, "the server's Python workers do not come from idem's daemon"
    maps = Path(f"/proc/{daemons[0]}/maps").read_text()
    assert "pgpq" in maps and "_native" in maps  # the staging path's extensions, loaded before any fork


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _command(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_the_daemon_preloads_every_module_here() -> None:
    from idem_platform.spark.daemon import preload

    assert preload() == []


def test_the_jit_default_is_c1_for_runs_and_full_for_long_lived_sessions() -> None:
    assert DRIVER_JIT_OPTION in (driver_java_options(None) or "")
    assert DRIVER_JIT_OPTION not in (driver_java_options(None, long_lived=True) or "")
    assert DRIVER_JIT_OPTION in (driver_java_options("-Dx=1") or "") and "-Dx=1" in (driver_java_options("-Dx=1") or "")
    chosen = "-XX:+TieredCompilation"  # the user's choice wins either way
    assert DRIVER_JIT_OPTION not in (driver_java_options(chosen) or chosen)


def test_runs_on_the_server_commit_exactly_once(server: dict[str, object], pg_url: str, tmp_path: Path, threatfeed: IdemConfig) -> None:
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    lines = list(threatfeed_lines(3000, seed=21, duplicate_ratio=0.1, bad_ratio=0.01))
    # Three files in one batch: their pieces share the batch's slices.
    paths = [write_lines(connector.path / f"connect-{i}.ndjson", lines[i::3]) for i in range(3)]
    env = {**cli_env(pg_url, tmp_path, threatfeed), "IDEM_SPARK_REMOTE": str(server["url"])}
    env.pop("IDEM_SPARK_MASTER")
    first = _ingest(env, *paths)
    assert first["rows_written"] + first["rows_skipped"] + first["rows_rejected"] == len(lines)  # type: ignore[operator]
    assert first["rows_written"] == _rows(pg_url) > 0
    again = _ingest(env, *paths)
    assert again["replayed"] is True and again["rows_written"] == 0 and _rows(pg_url) == first["rows_written"]
    # The same rows in a new file (new file key): every row is an idempotent skip.
    shuffled = write_lines(connector.path / "connect-again.ndjson", list(reversed(lines)))
    third = _ingest(env, shuffled)
    assert third["rows_written"] == 0 and _rows(pg_url) == first["rows_written"]
    with connect(pg_url) as conn:
        ledger = conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE status = 'committed'").fetchone()
    assert ledger is not None and ledger[0] == 4  # one row per file key


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _spark_start(directory: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, object]:
    started = subprocess.run(
        idem_command("spark", "start", "--dir", str(directory), *extra), capture_output=True, text=True, timeout=300, env=env,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    return json.loads(started.stdout.strip().splitlines()[-1])


def test_ingest_leaves_no_server_behind_and_uses_the_one_a_person_started(
    pg_url: str, tmp_path: Path, threatfeed: IdemConfig
) -> None:
    """``spark.server: auto`` (the default outside tests): a one-off ``idem ingest`` runs Spark
    in its own process and leaves nothing running (before, each one from a new directory
    started a server in the background that ran on for good); once ``idem spark start`` has
    started the server under ``<idem home>/spark``, runs connect to it; a server started for
    other code (its fingerprint differs) is not used, and left to the person who started it."""
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    home = tmp_path / "idem-home"
    directory = home / "spark"
    env = {**cli_env(pg_url, tmp_path, threatfeed), "IDEM_SPARK_SERVER": "auto", "IDEM_HOME": str(home)}
    env.pop("IDEM_SPARK_REMOTE", None)
    lines = list(threatfeed_lines(300, seed=31, duplicate_ratio=0.0))
    paths = [write_lines(connector.path / f"auto-{i}.ndjson", lines[i::3]) for i in range(3)]
    state: dict[str, object] = {"pid": 0}
    try:
        first = _ingest(env, paths[0])
        assert first["spark"] == "local[2]"
        time.sleep(5)  # a background start would have its JVM by now
        assert not (directory / "connect.json").exists() and _java_processes_in(directory) == []
        state = _spark_start(directory, "--master", "local[2]", env=env)
        second = _ingest(env, paths[1])
        assert second["spark"] == str(state["url"]).split(";")[0]  # on the server, its token not shown
        # Started for other code: not used, and not stopped either (a person started it).
        recorded = json.loads((directory / "connect.json").read_text())
        (directory / "connect.json").write_text(json.dumps({**recorded, "fingerprint": "other-code"}))
        third = _ingest(env, paths[2])
        assert third["spark"] == "local[2]" and _alive(int(state["pid"]))  # type: ignore[arg-type]
        written = [s["rows_written"] for s in (first, second, third)]
        assert sum(written) == _rows(pg_url) == len(lines) and all(w > 0 for w in written)  # type: ignore[operator]
    finally:
        subprocess.run(idem_command("spark", "stop", "--dir", str(directory)), capture_output=True, timeout=120)
    assert not _alive(int(state["pid"]))  # type: ignore[arg-type]


def test_a_stop_during_a_start_stops_the_server_being_started(tmp_path: Path) -> None:
    """``idem spark stop`` while ``idem spark start`` is under way stops the server being
    started (the start then fails, saying so). Before, the stop found no server, said
    ``stopped: false``, and the server came up after it and stayed."""
    directory = tmp_path / "spark"
    env = {k: v for k, v in os.environ.items() if k not in ("IDEM_CONFIG", "IDEM_SPARK_REMOTE")}
    starting = subprocess.Popen(
        idem_command("spark", "start", "--dir", str(directory), "--master", "local[1]"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while not _java_processes_in(directory) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _java_processes_in(directory), "the start never got as far as its JVM"
        stopped = subprocess.run(idem_command("spark", "stop", "--dir", str(directory)), capture_output=True, text=True, timeout=150)
        assert json.loads(stopped.stdout.strip().splitlines()[-1])["stopped"] is True, stopped.stderr[-2000:]
        _, err = starting.communicate(timeout=150)
        assert starting.returncode != 0
        assert err.strip().splitlines()[-1].startswith("idem: error: the Spark Connect server was stopped while it started"), err[-2000:]
        time.sleep(3)
        assert _java_processes_in(directory) == [] and not (directory / "connect.json").exists()
    finally:
        if starting.poll() is None:
            starting.kill()
        subprocess.run(idem_command("spark", "stop", "--dir", str(directory)), capture_output=True, timeout=150)


def test_a_process_that_started_spark_itself_stays_on_it_when_the_server_comes_up(
    tmp_path: Path, threatfeed: IdemConfig
) -> None:
    """``idem demo`` runs several ingests in one process: the first finds no server, so that
    process keeps its own Spark even once a server answers (PySpark cannot mix a classic
    session and a Connect one in a process)."""
    home = tmp_path / "idem-home"
    code = (
        "import sys\n"
        "from idem_platform.spark.reuse import use_spark_server\n"
        "from idem_platform.config import load_config\n"
        "config = load_config(sys.argv[1])\n"
        "first = use_spark_server(config)\n"
        "print('asked', flush=True)\n"
        "sys.stdin.readline()\n"  # the server is up now
        "print(first, use_spark_server(config), flush=True)\n"
    )
    env = {**os.environ, "IDEM_SPARK_SERVER": "auto", "IDEM_HOME": str(home), "IDEM_SPARK_MASTER": "local[2]"}
    env.pop("IDEM_SPARK_REMOTE", None)
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(threatfeed.source)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "asked"
        _spark_start(home / "spark", "--config", str(threatfeed.source), env=env)
        out, err = process.communicate("go\n", timeout=120)
        assert process.returncode == 0, err[-3000:]
        assert out.strip().splitlines()[-1] == "None None"
    finally:
        if process.poll() is None:
            process.kill()
        subprocess.run(idem_command("spark", "stop", "--dir", str(home / "spark")), capture_output=True, timeout=120)


def _java_processes_in(directory: Path) -> list[int]:
    """Processes whose working directory is ``directory`` (a server's JVM runs there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == directory.resolve():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_server_whose_python_workers_cannot_start_is_stopped(tmp_path: Path) -> None:
    """A server whose Python workers cannot start (here a worker Python that exits at once) is
    stopped by the start that found out, and nothing records it as running. Before, the JVM
    stayed up with nothing recording it."""
    directory = tmp_path / "spark"
    env = {**os.environ, "PYSPARK_PYTHON": "/bin/false"}
    for name in ("IDEM_CONFIG", "IDEM_SPARK_REMOTE"):
        env.pop(name, None)
    started = subprocess.run(
        idem_command("spark", "start", "--dir", str(directory), "--master", "local[1]"),
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert started.returncode != 0, started.stdout[-2000:]
    assert "its Python workers did not" in started.stderr, started.stderr[-3000:]
    assert _java_processes_in(directory) == []
    assert not (directory / "connect.json").exists()


def test_a_connect_urls_token_is_masked_and_scrubbed() -> None:
    from idem_platform.redact import masked, url_secrets

    url = "sc://localhost:15002/;token=s3cr3t-token;session_id=abc"
    assert masked(url) == "sc://localhost:15002/;token=***;session_id=abc"
    assert url_secrets(url) == {"s3cr3t-token"}


def test_an_ingest_whose_server_is_killed_fails_in_seconds_and_commits_nothing(
    pg_url: str, tmp_path: Path, threatfeed: IdemConfig
) -> None:
    """``kill -9`` of the Spark Connect server while a run stages: the run fails within
    seconds with one line and rolls back (no ``idle in transaction`` session left, no rows).
    Before, PySpark's client retried the dead server for ~10 minutes, then again to cancel
    the jobs: the run hung ~21 minutes holding its PostgreSQL transaction open."""
    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    directory = tmp_path / "spark"
    env = cli_env(pg_url, tmp_path, threatfeed)
    state = _spark_start(directory, "--master", "local[2]", env=env)
    env["IDEM_SPARK_REMOTE"] = str(state["url"])
    path = write_lines(connector.path / "big.ndjson", list(threatfeed_lines(300_000, seed=41, duplicate_ratio=0.0)))
    ingest = subprocess.Popen(
        idem_command("ingest", "--json", str(path)), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_until_staging(pg_url, ingest)
        os.kill(int(state["pid"]), signal.SIGKILL)  # type: ignore[arg-type]
        killed = time.monotonic()
        _, err = ingest.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        if ingest.poll() is None:
            ingest.kill()
        try:
            os.killpg(int(state["pid"]), signal.SIGKILL)  # type: ignore[arg-type]  # its Python workers, if any are left
        except ProcessLookupError:
            pass
        subprocess.run(idem_command("spark", "stop", "--dir", str(directory)), capture_output=True, timeout=120)
    assert ingest.returncode != 0
    assert took < 30, f"the run took {took:.0f} s to fail after its server was killed"
    last = err.strip().splitlines()[-1]
    print(f"failed {took:.1f} s after the kill: {last}")
    assert last.startswith("idem: error:") and "the Spark Connect server stopped answering" in last, err[-3000:]
    with connect(pg_url) as conn:
        sessions = conn.execute(
            "SELECT application_name, state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        committed = conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE status = 'committed'").fetchone()
    assert not [s for s in sessions if s[1] and s[1].startswith("idle in transaction")], sessions
    assert committed is not None and committed[0] == 0 and _rows(pg_url) == 0


def test_an_ingest_whose_server_is_absent_fails_with_one_line_and_no_grpc_log(
    pg_url: str, tmp_path: Path, threatfeed: IdemConfig
) -> None:
    """No server on the Connect URL's port: stderr holds the run's progress and the one
    error line, not PySpark's ``GRPC Error received`` log records (multi-kB each, one per
    failed call), which Dagster's logging setup used to let through."""
    import socket

    connector = threatfeed.connector("threatfeed")
    assert connector.path is not None
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = cli_env(pg_url, tmp_path, threatfeed)
    env.pop("DAGSTER_HOME")  # idem's own instance (storage on PostgreSQL), as people run it
    env.pop("SPARK_CONNECT_LOG_LEVEL", None)
    env.update({"IDEM_HOME": str(tmp_path / "idem-home"), "IDEM_SPARK_REMOTE": f"sc://localhost:{port}"})
    path = write_lines(connector.path / "nowhere.ndjson", list(threatfeed_lines(20, seed=53)))
    done = subprocess.run(idem_command("ingest", "--json", str(path)), env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 1
    assert "GRPC Error" not in done.stderr and "_InactiveRpcError" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("idem: error: threatfeed__committed: TransientError: the Spark Connect server did not answer ("), lines
    assert f":{port}: Failed to connect to remote host: Connection refused)" in lines[-1], lines[-1]
    assert [line for line in lines[:-1] if not line.startswith("threatfeed__")] == [], lines
    assert _rows(pg_url) == 0


def test_a_runs_warm_up_brings_back_the_workers_spark_killed_after_a_minute_idle(server: dict[str, object]) -> None:
    """Spark kills a Python worker idle for a minute; a run's warm-up (started while its driver
    imports Dagster) runs a trivial job on the server, so its staging jobs find workers up.

    Last in this module on purpose: the tests above that do not use the module's server
    take longer than Spark's minute, so its workers are usually gone already instead of
    this test waiting that minute out on its own."""
    (daemon,) = [pid for pid in _children(int(server["pid"])) if b"daemon" in _command(pid)]  # type: ignore[arg-type]
    deadline = time.monotonic() + 150
    while _children(daemon) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _children(daemon), "Spark kept its idle Python workers for over two minutes"
    code = "import sys\nfrom idem_platform.spark.session import warm_up\nwarm_up({'spark.remote': sys.argv[1]}).join(120)\n"
    done = subprocess.run([sys.executable, "-c", code, str(server["url"])], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _children(daemon), "the warm-up left the server without Python workers"
