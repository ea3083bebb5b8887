"""``idem dev``: the embedded PostgreSQL if needed, a Spark Connect server for the runs, then
``dagster dev`` on idem's code location.

Without ``--workspace``, ``./workspace.yaml`` is used if there is one, else idem's own
(``idem_platform/workspace.yaml``: the code location ``idem_platform`` from
``idem_platform.definitions``, what the checkout's file says too). A ``--workspace`` that
does not exist is one clear line before anything starts, not ``dagster dev``'s usage text.

PySpark (through :mod:`idem_platform.spark.reuse`) is imported when the Spark server
starts, so ``idem --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import click

from idem_platform.cli.common import prepare_environment
from idem_platform.cli.options import IdemCommand, invocation
from idem_platform.cli.output import CommandError
from idem_platform.cli.spark import server_dir
from idem_platform.config import IdemConfig, load_config
from idem_platform.redact import masked
from idem_platform.settings import CONFIG_ENV, SPARK_REMOTE_ENV, spark_remote_from_environment
from idem_platform.spark import connect_server

DEFAULT_WORKSPACE = "workspace.yaml"


def workspace_file(given: str | None) -> Path:
    """The workspace ``dagster dev`` loads: ``--workspace``, else ``./workspace.yaml``, else idem's own.

    Raises:
        CommandError: ``--workspace`` names no file.
    """
    if given is not None:
        path = Path(given).resolve()
        if not path.is_file():
            raise CommandError(
                f"no workspace file {path}: name an existing one with --workspace, or leave --workspace out "
                "to load idem's own code location (idem_platform.definitions)"
            )
        return path
    if Path(DEFAULT_WORKSPACE).is_file():
        return Path(DEFAULT_WORKSPACE).resolve()
    return Path(str(resources.files("idem_platform") / "workspace.yaml"))


@click.command("dev", cls=IdemCommand)
@click.option("--workspace", metavar="FILE", help="dagster's workspace (default: ./workspace.yaml, else idem's own)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=3000, show_default=True)
@click.option(
    "--no-spark-server", is_flag=True,
    help="runs start their own Spark (local JVM) instead of sharing the Spark Connect server idem dev starts",
)
def dev(workspace: str | None, host: str, port: int, no_spark_server: bool) -> dict[str, Any]:
    """Start the embedded PostgreSQL if needed, then dagster dev."""
    command = [dagster_executable(), "dev", "-w", str(workspace_file(workspace)), "--host", host, "--port", str(port)]
    url = prepare_environment()
    config = load_config(invocation().config)  # fail here, with a clear line, rather than in the UI
    if config.source is not None:
        os.environ[CONFIG_ENV] = str(config.source)  # absolute: dagster dev runs from DAGSTER_HOME
    if no_spark_server or spark_remote_from_environment() or "spark.remote" in config.spark.conf:
        return dagster_dev(command, url)
    return with_spark_server(config, command, url)


def with_spark_server(config: IdemConfig, command: list[str], url: str) -> dict[str, Any]:
    """``dagster dev`` with a Spark Connect server for its runs (stopped after, if started here).

    Every run the sensors launch is a new process: with a Spark Connect server they
    connect to a warm JVM and warm Python workers instead of starting both.
    """
    # Late import (pulls in PySpark): kept off idem --help's imports.
    from idem_platform.spark.reuse import server_conf

    directory = server_dir(None)
    started_here = connect_server.running(directory) is None
    sys.stderr.write(f"starting the Spark Connect server ({config.spark_master()}) for the runs...\n")
    state = connect_server.ensure(directory, master=config.spark_master(), conf=server_conf(config), wait=True)
    if state is not None:  # None: a stale server other runs still use; these runs start their own Spark
        os.environ[SPARK_REMOTE_ENV] = state.url
    try:
        return dagster_dev(command, url)
    finally:
        if started_here:
            connect_server.stop(directory)


def dagster_executable() -> str:
    """The ``dagster`` command of this environment."""
    return shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))


def dagster_dev(command: list[str], url: str) -> dict[str, Any]:
    """Run ``dagster dev`` from ``DAGSTER_HOME`` until it ends or is signalled."""
    sys.stderr.write(json.dumps({"dagster_home": os.environ["DAGSTER_HOME"], "postgres": masked(url), "command": command}) + "\n")
    # From DAGSTER_HOME, the dagster.yaml of the working directory is the one in use (no
    # warning that a checkout's copy is ignored); `dagster dev` still works, so its notice
    # that `dg dev` supersedes it is noise here.
    env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning"}
    return {"exit_code": run_until_signalled(command, cwd=os.environ["DAGSTER_HOME"], env=env)}


def run_until_signalled(
    command: list[str], grace_seconds: float = 10.0, *, cwd: str | None = None, env: dict[str, str] | None = None
) -> int:
    """Run ``command`` in its own process group; on SIGINT or SIGTERM, pass the signal to the
    whole group (dagster dev, its webserver, daemon, code server and run workers) and kill
    whatever of the group is still there ``grace_seconds`` later."""
    process = subprocess.Popen(command, start_new_session=True, cwd=cwd, env=env)
    received: list[tuple[int, float]] = []  # (signal, when)

    def forward(signum: int, _frame: object) -> None:
        received.append((signum, time.monotonic()))
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = process.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if received and time.monotonic() - received[0][1] > grace_seconds:
                    os.killpg(process.pid, signal.SIGKILL)
        if not received:
            return code
        try:  # what the group left behind (a code server, a run worker) goes too
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return 130 if received[0][0] == signal.SIGINT else 143
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
