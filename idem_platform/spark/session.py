"""Build (or reuse) the SparkSession every path runs on.

``PYSPARK_PYTHON`` is pinned to the running interpreter before the JVM starts:
otherwise workers may start another Python without our package. The Python data
source ``idem_source_records`` is registered on first use (:func:`register_sources`):
registering starts a Python planner process (~1.2 s here) that the commit path,
which never reads through it, should not wait for.

With ``spark.remote`` in the settings (or ``IDEM_SPARK_REMOTE`` set), the session
is a Spark Connect client of a long-lived server
(:mod:`idem_platform.spark.connect_server`): no JVM starts in this process, and
the server's master is whatever it was started with.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from idem_platform.errors import ConfigError
from idem_platform.settings import spark_remote_from_environment
from idem_platform.spark.cds import java_options
from idem_platform.spark.records_source import SourceRecordsSource
from idem_platform.spark.remote import bound_retries
from idem_platform.spark.slots import is_remote, task_slots

DEFAULT_CONF: dict[str, str] = {
    "spark.app.name": "idem_platform",
    "spark.master": "local[*]",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.sql.execution.pythonUDF.arrow.enabled": "true",
    # Python workers buffer a whole Arrow batch; keep them lean on small machines.
    "spark.executor.memory": "1g",
}


# A run's driver JVM mostly schedules (executors' Python does the work), so C2's
# optimising compiler would cost ~6 CPU-seconds at start for little: C1 only starts
# the session ~2.5 s sooner. A long-lived or bulk session (the Spark Connect server,
# `idem migrate`) keeps the full JIT instead: table reads and migrations turn every
# row of the Arrow batches into Spark rows in the JVM, and C2 halves that (a 1M-row
# read: 8.1 -> 3.8 JVM CPU-seconds). Staging moves no rows through the JVM, so a
# server that only ingests pays C2 for nothing: 5.5 CPU-s of compiling in its first
# large run, ~0.75 per run once warm, ~0.2 with C1 (README, "Rerun on a slower
# machine"). Any user-set TieredStopAtLevel/TieredCompilation wins.
DRIVER_JIT_OPTION = "-XX:TieredStopAtLevel=1"


LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
"""The driver JVM's log configuration (its comments say why), unless the user names one."""


def driver_java_options(existing: str | None, *, long_lived: bool = False) -> str | None:
    """``spark.driver.extraJavaOptions`` with idem's JIT default (C1 only, unless
    ``long_lived``), its log configuration (:data:`LOG4J_CONFIG`) and the CDS archive added.

    Returns ``None`` when nothing needs to change.
    """

    options = existing
    if not long_lived and (not options or "Tiered" not in options):
        options = " ".join(part for part in (options, DRIVER_JIT_OPTION) if part)
    if not options or "log4j" not in options:
        options = " ".join(part for part in (options, f"-Dlog4j.configurationFile={LOG4J_CONFIG}") if part)
    with_archive = java_options(options)
    options = with_archive or options
    return options if options != existing else None


def spark_config_for(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """Session settings from idem.yaml's ``spark`` block (``master`` resolved by the caller)."""
    return {"spark.master": master, **conf}


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs executors inside this machine's driver JVM."""
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


# What a Connect client may set on its session (runtime SQL settings); the rest
# (master, memory, JVM options) belongs to the server.
REMOTE_SESSION_CONF = ("spark.sql.session.timeZone", "spark.sql.execution.arrow.maxRecordsPerBatch")


def remote_url(conf: Mapping[str, str] | None = None) -> str | None:
    """The Spark Connect server to use: ``spark.remote`` of the settings, else ``IDEM_SPARK_REMOTE``."""
    return (conf or {}).get("spark.remote") or spark_remote_from_environment()


def pin_python() -> None:
    """Make Spark's workers run this interpreter (unless the user chose one)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()
_register_lock = threading.Lock()


def register_sources(spark: SparkSession) -> SparkSession:
    """Register idem's Python data source on ``spark``, once per session."""

    with _register_lock:
        if spark not in _registered:
            spark.dataSource.register(SourceRecordsSource)
            _registered.add(spark)
    return spark


_built: list[SparkSession] = []  # whether this process built a session (see :func:`session_built`)


def session_built() -> bool:
    """Whether this process built a Spark session (local or Spark Connect): then its
    interpreter teardown may be skipped (:func:`idem_platform.cli.output.exit_process`)."""
    return bool(_built)


def stop_built_session(timeout: float = 30.0) -> None:
    """Stop the session this process built (nothing when it built none), waiting at most
    ``timeout`` seconds.

    For a command that failed, in its own process: a local JVM goes on running the failed
    job's other tasks and logs their errors on the stderr it shares with ``idem``; stopped
    first, it says its last words before the command's one error line, not after it.
    """
    if not _built:
        return

    def stop() -> None:
        try:
            _built[0].stop()
        except Exception:  # noqa: BLE001 - a session that cannot stop is left to the process's exit
            return

    thread = threading.Thread(target=stop, name="idem-spark-stop", daemon=True)
    thread.start()
    thread.join(timeout)


def build_session(conf: Mapping[str, str] | None = None, *, long_lived: bool = False) -> SparkSession:
    """The process's SparkSession with idem's defaults under ``conf``.

    ``long_lived``: a session that moves many rows through its JVM (``idem migrate``,
    a benchmark's reads) starts with the full JIT (:data:`DRIVER_JIT_OPTION`).

    ``getOrCreate`` semantics: a session that already exists in this process is
    reused (its static settings cannot change), which is what tests and
    long-lived code servers want.
    """
    session = _build(conf, long_lived=long_lived)
    if not _built:
        _built.append(session)
    return session


def _build(conf: Mapping[str, str] | None = None, *, long_lived: bool = False) -> SparkSession:
    """:func:`build_session` itself."""
    pin_python()
    remote = remote_url(conf)
    if remote is not None:
        session = SparkSession.builder.remote(remote).getOrCreate()  # no RPC yet: the retries are bounded first
        bound_retries(session, remote)
        for key in REMOTE_SESSION_CONF:
            session.conf.set(key, (conf or {}).get(key, DEFAULT_CONF[key]))
        return session
    settings = {**DEFAULT_CONF, **(conf or {})}
    if SparkSession.getActiveSession() is None:
        options = driver_java_options(settings.get("spark.driver.extraJavaOptions"), long_lived=long_lived)
        if options:
            settings["spark.driver.extraJavaOptions"] = options
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise

        raise ConfigError(
            f"Spark did not start with spark.master {settings.get('spark.master')!r}: its JVM exited. Check the "
            "master URL (local[*], spark://host:7077, yarn, k8s://...; IDEM_SPARK_MASTER overrides idem.yaml) "
            "and that Java 17+ is installed"
        ) from None


_warm_up_lock = threading.Lock()
_warm_up_thread: threading.Thread | None = None


def _warm(conf: dict[str, str]) -> None:
    """Start the JVM (or connect to the server) and one Python worker per slot with idem's
    modules imported.

    A session that cannot start is left for the run to report: the run starts it
    again and fails with the error, in one line.
    """
    try:
        spark = build_session(conf)
    except Exception:  # noqa: BLE001 - reported by the run itself
        return
    try:
        touch_workers(spark)
    except Exception:  # noqa: BLE001 - the staging jobs meet it again and report it
        return


def touch_workers(spark: SparkSession) -> None:
    """Run one trivial task per slot that imports the staging path, so the Python workers
    the staging jobs will use are up and warm.

    On a Spark Connect server too: Spark kills a Python worker idle for a minute, and a
    run after such a pause staged as if on a cold server (the 1M batch: 22.5–25.6 s
    against ~21 s back to back). This job, in the background while the driver imports
    Dagster and sets the run up, brings it back to ~21 s (20.90 s after a 75 s pause);
    when the workers are warm it is one more trivial job, off the run's critical path.
    The figures this serves: a run on an idle Connect server, and a small ``idem ingest``
    with Spark in its own process (without it, a 5-line file's median wall time was 24 %
    longer, the workers then starting on the staging job's critical path).
    """
    slots = task_slots(spark)
    if is_remote(spark):
        def touch_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            import idem_platform.spark.stage  # noqa: F401 - the import is the warm-up

            for batch in batches:
                yield pa.RecordBatch.from_arrays([batch.column(0)], names=["id"])

        # A Connect session has no RDD API: the same Arrow-mapped job as the staging jobs.
        spark.range(0, slots, 1, slots).mapInArrow(touch_batches, "id long").collect()
        return

    def touch(indexes: Iterable[int]) -> Iterator[int]:
        import idem_platform.spark.stage  # noqa: F401 - the import is the warm-up

        yield from indexes

    # The same kind of job as the staging jobs (a plain RDD job), so it warms their workers.
    spark.sparkContext.parallelize(range(slots), slots).mapPartitions(touch).collect()


def warm_up(conf: Mapping[str, str] | None = None) -> threading.Thread:
    """Start (once per process) the JVM and the Python workers in the background.

    On this kind of machine a cold Spark costs ~7 s of JVM start and ~3.5 s for
    the first Arrow job; starting both while the driver hashes files and Dagster
    runs its first steps takes that off the critical path. Later
    ``build_session`` calls simply wait for the same session.
    """
    global _warm_up_thread
    with _warm_up_lock:
        if _warm_up_thread is None:
            _warm_up_thread = threading.Thread(
                target=_warm, args=(dict(conf or {}),), name="idem-spark-warm-up", daemon=True
            )
            _warm_up_thread.start()
        return _warm_up_thread
