"""``idem spark start|stop|status``: the long-lived Spark Connect server that runs reuse (no JVM
start per run); ``idem spark cds``: the JVM class-data archive that makes every Spark start faster.

``start`` imports PySpark (through :mod:`idem_platform.spark.reuse`) when it runs, so
``idem --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from idem_platform.cli.options import IdemGroup, invocation
from idem_platform.config import load_config
from idem_platform.settings import (
    SPARK_REMOTE_ENV,
    config_path_from_environment,
    idem_home,
    spark_master_from_environment,
)
from idem_platform.spark import connect_server

_dir = click.option("--dir", "directory", help="its state directory (default: .idem/spark, or $IDEM_HOME/spark)")


def server_dir(directory: str | None) -> Path:
    """Where ``idem spark`` keeps its server's state: ``--dir``, else ``<idem home>/spark``."""
    return Path(directory).resolve() if directory else idem_home() / "spark"


@click.group("spark", cls=IdemGroup, short_help="Start, stop or check the Spark Connect server.")
def spark() -> None:
    """The long-lived Spark Connect server that runs reuse (no JVM start per run)."""


@spark.command("start")
@_dir
@click.option("--master", help="its Spark master (default: IDEM_SPARK_MASTER, idem.yaml, local[*])")
@click.option("--port", type=int, help="its port on 127.0.0.1 (default: a free one)")
def start(directory: str | None, master: str | None, port: int | None) -> dict[str, Any]:
    """Start it (or report the one running)."""
    # Late import (pulls in PySpark): kept off idem --help's imports.
    from idem_platform.spark.reuse import server_conf

    config_path = invocation().config
    chosen = master or spark_master_from_environment() or "local[*]"
    conf: dict[str, str] = {}
    if config_path or config_path_from_environment() or Path("idem.yaml").exists():
        config = load_config(config_path)
        chosen = master or config.spark_master()
        conf = server_conf(config)
    state = connect_server.start_locked(server_dir(directory), master=chosen, conf=conf, port=port)
    return {
        "running": True, **asdict(state),
        "use": f"export {SPARK_REMOTE_ENV}='{state.url}'  # runs and idem ingest then use this server",
    }


@spark.command("stop")
@_dir
def stop(directory: str | None) -> dict[str, Any]:
    """Stop it."""
    where = server_dir(directory)
    return {"stopped": connect_server.stop(where), "dir": str(where)}


@spark.command("status")
@_dir
def status(directory: str | None) -> dict[str, Any]:
    """Is it running?"""
    where = server_dir(directory)
    state = connect_server.read_state(where)
    if state is None:
        return {"running": False, "dir": str(where)}
    return {"running": state.alive, **asdict(state)}


@spark.command("cds")
def cds() -> dict[str, Any]:
    """Build the JVM class-data archive (once per installation; make install does)."""
    from idem_platform.spark.cds import (  # imports PySpark: kept off idem --help
        archive_path,
        ensure,
    )

    built = ensure()
    return {"archive": str(built or archive_path()), "built": built is not None}
