"""A long-lived Spark Connect server that runs reuse (``idem spark start``).

Every run of a connector's job is a new process; on ``local[*]`` each one pays
a Spark JVM start (~5-7 s here) and the first job's Python workers (~2-3 s)
before it reads a line: most of a small file's time. A Spark Connect server
(``spark.remote``, shipped with PySpark 4) keeps the JVM and its Python workers
warm between runs; a run connects in well under a second.

The server is PySpark's own (``SparkConnectServer`` through ``spark-submit``),
started with idem's session defaults and the Python of this environment, so its
Python workers import ``idem_platform`` like the local session's do. Its state
(URL, pid, master, log) lives in a directory, by default ``.idem/spark`` beside the
embedded PostgreSQL.

Whoever can talk to the server runs code as its user in its Python workers, so:
it listens on 127.0.0.1 only (gRPC, and with a local master the driver's RPC and
block-manager ports too, with ``spark.authenticate`` on); it refuses any client
without its token (``spark.connect.authenticate.token``, handed to the JVM in a
properties file only its owner can read: never on a command line or in an
environment its workers inherit); its URL, which carries the token
(``sc://localhost:PORT/;token=...``), is kept in a 0600 file of a 0700 directory;
and it starts without idem's credentials in its environment (``IDEM_POSTGRES_URL``
with its password...): the staging jobs carry the URL they need in their closures. ``idem dev`` starts it for the
code location's runs; any run uses it when ``IDEM_SPARK_REMOTE`` (or
``spark.conf: {spark.remote: sc://...}`` in ``idem.yaml``) names it. The server's
own master may be any master (``--master spark://...``): executors then run on
the cluster and the runs still skip the JVM start.

Runs share one server session (the URL carries its ``session_id``): Spark
Connect keys its Python workers by session, so with a session per run every run
would start and import fresh workers (~3-5 s); with one, the workers the server
warmed at start serve every run (a first job in ~0.2 s). Runs never stop the
session; each tags its jobs, so cancelling one run's jobs leaves the others'.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from idem_platform.errors import ConfigError
from idem_platform.redact import url_secrets

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DAEMON_MODULE = "idem_platform.spark.daemon"  # the server's Python worker daemon (local masters)
STATE_FILE = "connect.json"
SECRET_CONF_FILE = "secret.conf"  # the server's token, as a spark-submit properties file
TOKEN_CONF = "spark.connect.authenticate.token"
LOOPBACK = "127.0.0.1"
DEFAULT_DIR = Path(".idem") / "spark"
START_TIMEOUT_SECONDS = 90.0
# Runs share one server session (its id is in the URL). Spark Connect closes a session
# idle for spark.connect.session.manager.defaultSessionTimeout (60 min) and then refuses
# its id for good (INVALID_HANDLE.SESSION_CLOSED): a server left idle over lunch would
# fail every later run. A long-lived server keeps its one session.
SESSION_TIMEOUT = "3650d"


@dataclass(frozen=True)
class ServerState:
    """What ``idem spark start`` leaves in its directory."""

    url: str
    pid: int
    port: int
    master: str
    log: str
    started_at: float
    fingerprint: str = ""  # what it was started with (master, settings, idem's code): see :func:`fingerprint`
    auto: bool = False  # started by `idem dev` (which may replace it), not by `idem spark start`
    ready: bool = True  # False while it starts: recorded then so that `idem spark stop` finds it

    @property
    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _accepts(self.port)


def spark_home() -> Path:
    """The installed ``pyspark`` package (it carries ``bin/`` and ``jars/``)."""
    # Late import (PySpark): off idem --help's imports (idem spark stop/status need none).
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def read_state(directory: Path) -> ServerState | None:
    """The server recorded in ``directory`` (alive or not), or ``None``."""
    try:
        data = json.loads((directory / STATE_FILE).read_text())
        return ServerState(**data)
    except (OSError, ValueError, TypeError):
        return None


def running(directory: Path = DEFAULT_DIR) -> ServerState | None:
    """The server of ``directory`` if it is up and answering, else ``None``."""
    state = read_state(directory)
    return state if state is not None and state.ready and state.alive else None


def start(
    directory: Path = DEFAULT_DIR,
    *,
    master: str = "local[*]",
    port: int | None = None,
    conf: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT_SECONDS,
    auto: bool = False,
) -> ServerState:
    """Start the server (or return the one already running there) and wait until it answers.

    Call it under ``start.lock`` (:func:`start_locked`): a server recorded as starting
    whose start is not under way any more (its starter was killed) is stopped here.
    The new server is recorded as starting (``ready: false``) as soon as it has a pid,
    so ``idem spark stop`` finds and stops it while it starts.

    Raises:
        ConfigError: it exited, did not answer within ``timeout`` or was stopped while it
            started (the message carries the end of its log).
    """
    directory = private_directory(directory)
    existing = read_state(directory)
    if existing is not None and existing.ready and existing.alive:
        return existing
    if existing is not None:  # dead, or left starting by a starter that is gone
        stop(directory, wait_for_start=False)
    port = port or _free_port()
    token = secrets.token_urlsafe(32)
    secret_conf = directory / SECRET_CONF_FILE
    write_private(secret_conf, f"{TOKEN_CONF} {token}\n")
    home = spark_home()
    command = [
        str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master, "--name", "idem Spark Connect",
        "--properties-file", str(secret_conf),
    ]
    for key, value in sorted(server_settings(master, port, conf or {}).items()):
        command += ["--conf", f"{key}={value}"]
    command.append("spark-internal")
    env = {
        **server_environment(os.environ),
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
    }
    log = directory / "connect.log"
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=directory, start_new_session=True,  # outlives the command that started it
        )
    state = ServerState(
        # "localhost", not 127.0.0.1: PySpark sends a token without TLS only to a host of that name.
        url=f"sc://localhost:{port}/;token={token};session_id={uuid.uuid4()}", pid=process.pid, port=port, master=master, log=str(log),
        started_at=time.time(), fingerprint=fingerprint(master, conf or {}), auto=auto, ready=False,
    )
    try:
        write_private(directory / STATE_FILE, json.dumps(asdict(state)))
        _wait_until_ready(process, state, log, timeout)
    except BaseException as exc:
        # A server that is not ready is of no use and would run on unnoticed: a server whose
        # Python workers cannot start (a broken PYSPARK_PYTHON, a module the workers cannot
        # import) was left running by every run that tried, one JVM each.
        _kill_group(process.pid)
        stopped = _recorded_pid(directory) != process.pid
        if not stopped:
            (directory / STATE_FILE).unlink(missing_ok=True)
        if stopped and isinstance(exc, Exception):
            raise ConfigError(f"the Spark Connect server was stopped while it started (idem spark stop); its log: {log}") from None
        raise
    if _recorded_pid(directory) != process.pid:  # stopped just as it became ready
        _kill_group(process.pid)
        raise ConfigError(f"the Spark Connect server was stopped while it started (idem spark stop); its log: {log}")
    state = replace(state, ready=True)
    write_private(directory / STATE_FILE, json.dumps(asdict(state)))
    return state


def server_settings(master: str, port: int, conf: dict[str, str]) -> dict[str, str]:
    """The ``--conf`` settings of a server on ``port``: idem's session defaults, ``conf``,
    and what keeps it private (loopback addresses; its token is not among them)."""
    # Late import (pulls in PySpark): off idem --help's imports (idem spark stop/status need none).
    from idem_platform.spark.session import DEFAULT_CONF, driver_java_options, is_local_master

    settings = {k: v for k, v in DEFAULT_CONF.items() if k != "spark.master"}
    settings.update(conf)
    settings.pop(TOKEN_CONF, None)  # the token goes in the private properties file, not on the command line
    settings["spark.connect.grpc.binding.address"] = LOOPBACK
    settings.setdefault("spark.sql.artifact.isolation.enabled", "false")  # no per-session worker environments
    settings["spark.connect.grpc.binding.port"] = str(port)
    settings.setdefault("spark.connect.session.manager.defaultSessionTimeout", SESSION_TIMEOUT)
    settings.setdefault("spark.ui.enabled", "false")
    if is_local_master(master):  # workers on this machine, in this environment: see spark/daemon.py
        settings.setdefault("spark.python.daemon.module", DAEMON_MODULE)
        # Executors live in the driver's JVM: nothing needs its RPC or block-manager ports
        # from outside this machine (a cluster master's executors do, so those stay as set).
        settings.update({"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK, "spark.authenticate": "true"})
    options = driver_java_options(settings.get("spark.driver.extraJavaOptions"), long_lived=True)
    if options:
        settings["spark.driver.extraJavaOptions"] = options
    return settings


def _recorded_pid(directory: Path) -> int | None:
    state = read_state(directory)
    return None if state is None else state.pid


def private_directory(directory: Path) -> Path:
    """``directory`` resolved, created if need be, and made 0700: it holds the server's token."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    return directory


def write_private(path: Path, text: str) -> None:
    """Write ``path`` as a 0600 file, atomically (a reader never sees half of it, nor a
    moment where it is readable by others)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(partial, path)


# Environment variables the server's JVM and Python workers must not inherit: idem's and
# libpq's credentials, any variable named like a secret, and any whose value is a URL
# with a password. The staging jobs carry the PostgreSQL URL they need in their closures.
_SECRET_NAME = re.compile(r"^(IDEM_POSTGRES_URL|IDEM_SPARK_REMOTE|PGPASSWORD|PGPASSFILE|DATABASE_URL)|PASSWORD|SECRET|TOKEN|CREDENTIAL")


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less what the server's workers (any client's code) must not read."""

    return {
        name: value for name, value in environ.items()
        if not _SECRET_NAME.search(name.upper()) and not url_secrets(value)
    }


def _wait_until_ready(process: subprocess.Popen[bytes], state: ServerState, log: Path, timeout: float) -> None:
    """Until the server answers and its Python workers are warm.

    Raises:
        ConfigError: it exited, did not answer within ``timeout``, or its workers failed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError(f"the Spark Connect server exited with status {process.returncode}:\n{_tail(log)}")
        if _accepts(state.port):
            try:
                warm(state.url)
            except Exception as exc:  # noqa: BLE001 - whatever the workers hit, the server is no use
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                raise ConfigError(
                    f"the Spark Connect server started but its Python workers did not ({first}); it was "
                    f"stopped. Its log: {log}\n{_tail(log)}"
                ) from exc
            return
        time.sleep(0.25)
    raise ConfigError(f"the Spark Connect server did not answer on port {state.port} within {timeout:.0f} s:\n{_tail(log)}")


def _kill_group(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM the process group of ``pid`` (the server's JVM and its Python workers), then
    SIGKILL after ``timeout``; ``False`` if there was no such process."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def fingerprint(master: str, conf: dict[str, str]) -> str:
    """What a server must have been started with to serve a run: its master, its settings,
    PySpark's version and idem's code (every module's size and mtime: the server's Python
    workers imported the code as it was when they started)."""
    # Late import (PySpark): off idem --help's imports (idem spark stop/status need none).
    import pyspark

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(json.dumps([master, sorted(conf.items()), pyspark.__version__]).encode())
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


_held: dict[Path, int] = {}  # directory -> the open use.lock this process holds shared


def ensure(
    directory: Path = DEFAULT_DIR,
    *,
    master: str,
    conf: dict[str, str] | None = None,
    wait: bool = False,
) -> ServerState | None:
    """The server of ``directory`` for a run of this process, if one started with the same
    master, settings and code is up (``spark.server: auto``); else ``None``.

    Without ``wait`` (``idem ingest``) nothing is started or stopped: a server runs only
    when someone asked for one (``idem spark start``, ``idem dev``), so a one-off command
    leaves no JVM behind. With ``wait`` (``idem dev``) a missing server is started here and
    now, and one started by ``idem dev`` for other code or settings is replaced when no
    process holds it (never one a person started with ``idem spark start``).

    While this process lives it holds ``use.lock`` shared. Starts are serialised by
    ``start.lock``: a start under way is not started twice, and a run that finds one under
    way goes without.

    Raises:
        ConfigError: the server did not start (``wait`` only; its log's end is in the message).
    """
    directory = directory.resolve()
    wanted = fingerprint(master, conf or {})
    if not wait and not (directory / STATE_FILE).exists():
        return None  # no server was ever started here: create nothing
    directory = private_directory(directory)
    with open(directory / "start.lock", "a") as start_lock:
        try:
            fcntl.flock(start_lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None  # another process is starting it: this run goes without
        state = running(directory)
        if state is not None and state.fingerprint == wanted:
            _hold(directory)
            return state
        if not wait:
            return None
        if state is not None:
            if directory in _held or not state.auto:
                return None  # this process uses it already, or a person started it: leave it be
            use = os.open(directory / "use.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(use)
                return None  # stale, but other runs are on it
            stop(directory, wait_for_start=False)
            os.close(use)
        state = start(directory, master=master, conf=conf, auto=True)
        _hold(directory)
        return state


def start_locked(
    directory: Path, *, master: str, conf: dict[str, str] | None = None, port: int | None = None, auto: bool = False
) -> ServerState:
    """:func:`start` under ``start.lock`` (``idem spark start``): the server running there
    already, if any, else a new one."""
    directory = private_directory(directory)
    with open(directory / "start.lock", "a") as start_lock:
        fcntl.flock(start_lock, fcntl.LOCK_EX)
        return start(directory, master=master, conf=conf, port=port, auto=auto)


def _hold(directory: Path) -> None:
    if directory not in _held:
        use = os.open(directory / "use.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(use, fcntl.LOCK_SH)
        _held[directory] = use


def warm(url: str) -> None:
    """Start the server's Python workers (one per slot) with idem's staging modules imported,
    so the first run's first job does not pay for them."""
    # Late import (pulls in PySpark): off idem --help's imports (idem spark stop/status need none).
    from idem_platform.spark.session import build_session, touch_workers

    touch_workers(build_session({"spark.remote": url}))


def stop(directory: Path = DEFAULT_DIR, *, timeout: float = 30.0, wait_for_start: bool = True) -> bool:
    """Stop the server of ``directory``, ready or still starting; ``False`` if there was none.

    With ``wait_for_start``, a start under way (``start.lock`` held) that has not recorded
    its server yet (it has no pid for the first moments) is waited for, up to
    :data:`START_TIMEOUT_SECONDS`, and its server stopped: before, a stop during a start
    found nothing and the server came up after it and stayed.
    """
    directory = directory.resolve()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        state = read_state(directory)
        if state is not None:
            (directory / STATE_FILE).unlink(missing_ok=True)
            return _kill_group(state.pid, timeout)
        if not wait_for_start or not _start_under_way(directory) or time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _start_under_way(directory: Path) -> bool:
    """Whether a process holds ``start.lock`` (starting a server, or checking for one)."""
    try:
        handle = open(directory / "start.lock")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
