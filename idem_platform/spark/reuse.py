"""Whether this process's runs share the long-lived Spark Connect server, or start Spark here.

With ``spark.server: auto`` (the default) and no server named, a run uses the server under
``<idem home>/spark`` if one is up for this code and these settings. No run starts a
server: one is up only when someone asked for it (``idem spark start``, ``idem dev``), and
stays up until ``idem spark stop`` (or the end of ``idem dev``). Before, every run that
found none started one in the background, and a one-off ``idem ingest`` from a new
directory left a JVM (~400 MB) running for good.
"""

from __future__ import annotations

import os

from idem_platform.config import IdemConfig
from idem_platform.redact import remember_url
from idem_platform.settings import SPARK_REMOTE_ENV, idem_home, spark_remote_from_environment
from idem_platform.spark import connect_server
from idem_platform.spark.session import remote_url, spark_config_for, warm_up

_spark_choice: list[str | None] = []  # this process's use_spark_server answer, once given


def server_conf(config: IdemConfig) -> dict[str, str]:
    """The Spark settings a Connect server is started with: the config's, less ``spark.remote``."""
    return {k: v for k, v in config.spark.conf.items() if k != "spark.remote"}


def use_spark_server(config: IdemConfig) -> str | None:
    """The up server's URL, also put in ``IDEM_SPARK_REMOTE`` for this process; ``None``:
    Spark starts in this process.

    The first answer holds for the process (``idem demo`` runs three ingests): PySpark
    cannot switch a process that started Spark itself over to a Connect session.
    """
    if config.spark_server() == "off" or remote_url(dict(config.spark.conf)) is not None:
        return None
    if _spark_choice:
        return _spark_choice[0]
    _spark_choice.append(None)
    state = connect_server.ensure(idem_home() / "spark", master=config.spark_master(), conf=server_conf(config))
    if state is None:
        return None
    os.environ[SPARK_REMOTE_ENV] = state.url
    remember_url(state.url)  # its token: no message may show it
    _spark_choice[0] = state.url
    return state.url


def start_spark(config: IdemConfig) -> str:
    """Start a run's Spark now, in the background (the server's, if one is up), while Dagster
    sets the run up. Returns where it is, for the summary: the master, or the Connect
    server's ``sc://`` URL without its session id."""
    use_spark_server(config)
    remote = spark_remote_from_environment() or config.spark.conf.get("spark.remote")
    warm_up({k: str(v) for k, v in spark_config_for(config.spark_master(), dict(config.spark.conf)).items()})
    return remote.split(";")[0] if remote else config.spark_master()
