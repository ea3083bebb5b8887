"""Where idem's own environment variables are named and read.

A process reads them when it needs them (never at import), through these functions,
so tests can set them with ``monkeypatch.setenv`` and no module caches a stale value.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "IDEM_HOME"
POSTGRES_URL_ENV = "IDEM_POSTGRES_URL"
CONFIG_ENV = "IDEM_CONFIG"
SPARK_MASTER_ENV = "IDEM_SPARK_MASTER"
SPARK_SERVER_ENV = "IDEM_SPARK_SERVER"  # auto | off: overrides idem.yaml's spark.server
SPARK_REMOTE_ENV = "IDEM_SPARK_REMOTE"  # sc://host:port of a Spark Connect server (idem spark start)
DAGSTER_URL_ENV = "IDEM_DAGSTER_URL"  # a Dagster webserver idem ingest launches its runs through


def idem_home() -> Path:
    """``$IDEM_HOME`` or ``./.idem``: the embedded server, Dagster home and sample drops."""
    return Path(os.environ.get(HOME_ENV) or ".idem").resolve()


def cache_home() -> Path:
    """``$XDG_CACHE_HOME/idem`` or ``~/.cache/idem``: what one installation builds once and
    every idem home reuses (the JVM's class-data archive, :mod:`idem_platform.spark.cds`)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "idem"


def postgres_url_from_environment() -> str | None:
    """``$IDEM_POSTGRES_URL``, when it is set and not blank."""
    return os.environ.get(POSTGRES_URL_ENV) or None


def config_path_from_environment() -> str | None:
    """``$IDEM_CONFIG``: the ``idem.yaml`` to load when no ``--config`` names one."""
    return os.environ.get(CONFIG_ENV) or None


def spark_master_from_environment() -> str | None:
    """``$IDEM_SPARK_MASTER``: the Spark master, over ``spark.master`` in ``idem.yaml``."""
    return os.environ.get(SPARK_MASTER_ENV) or None


def spark_server_from_environment() -> str | None:
    """``$IDEM_SPARK_SERVER`` lower-cased (``auto`` or ``off`` when valid, which the config
    checks): whether runs use the long-lived Spark Connect server, over ``spark.server``."""
    return os.environ.get(SPARK_SERVER_ENV, "").strip().lower() or None


def dagster_url_from_environment() -> str | None:
    """``$IDEM_DAGSTER_URL``: the Dagster webserver (``http://host:3000``) through which
    ``idem ingest`` launches its runs, instead of running them in its own process."""
    return os.environ.get(DAGSTER_URL_ENV) or None


def spark_remote_from_environment() -> str | None:
    """``$IDEM_SPARK_REMOTE``: the Spark Connect server (``sc://host:port/;token=...``) to use."""
    return os.environ.get(SPARK_REMOTE_ENV) or None


NATIVE_ENV = "IDEM_NATIVE"  # 0: the per-record Python path even where the C path is built
FAULT_ENV = "IDEM_FAULT"  # tests only: a crash point to fire (see idem_platform.faults)
HTTP_TOKEN_ENV = "IDEM_HTTP_TOKEN"  # idem serve: the bearer token every request needs


SPARK_CONNECT_LOG_LEVEL_ENV = "SPARK_CONNECT_LOG_LEVEL"  # PySpark's own: its Connect client's log level


def spark_connect_log_level_from_environment() -> str | None:
    """``SPARK_CONNECT_LOG_LEVEL`` (PySpark reads it too): set, a person asked for the Connect
    client's log; unset, ``idem`` keeps it off stderr."""
    return os.environ.get(SPARK_CONNECT_LOG_LEVEL_ENV) or None


def native_allowed() -> bool:
    """Whether ``$IDEM_NATIVE`` allows the C path (anything but ``0``)."""
    return os.environ.get(NATIVE_ENV, "1") != "0"


def fault_from_environment() -> str | None:
    """``$IDEM_FAULT``: the armed crash point, ``name[:filters]`` (tests of the crash paths)."""
    return os.environ.get(FAULT_ENV) or None


def http_token_from_environment() -> str | None:
    """``$IDEM_HTTP_TOKEN`` trimmed; blank means none."""
    return (os.environ.get(HTTP_TOKEN_ENV) or "").strip() or None


def environment_items() -> list[tuple[str, str]]:
    """Every variable of the environment, sorted by name: what a config's ``${VAR}`` values
    and the definitions built from it may read (the input of a run's config fingerprint,
    :func:`idem_platform.defs.inprocess.config_fingerprint`)."""
    return sorted(os.environ.items())
