"""Spark's Python worker daemon, with the staging path's modules imported before it forks.

PySpark starts one daemon per executor (``python -m pyspark.daemon``) that forks a
worker per task slot; a fresh worker then imports what its task needs (pyarrow,
numpy, psycopg, pgpq and idem's coercion and staging modules: ~0.65 CPU-seconds)
before it reads a line. Spark kills a worker idle for a minute (a fixed timeout),
so a long-lived Spark Connect server pays that again for every run that comes a
minute or more after the last one, which is how a sensor's runs come: a 1,000-line
file's slice took 0.9–1.0 s to stage after a minute's pause against 0.2 s right
after another run.

The Spark Connect server of a local master names this module in
``spark.python.daemon.module`` (see :mod:`idem_platform.spark.connect_server`). It
imports those modules once, then runs PySpark's own daemon loop, so the workers it
forks inherit them already initialised: the same file after a pause staged in 0.5 s
and its run took 3.96 s instead of 4.23 s (medians of three). The figure this serves:
a sensor's small run on a Spark Connect server after an idle minute. Forking is safe
because nothing imported here holds a lock across the fork in another thread:
OpenBLAS is told to start no thread pool (the workers never multiply matrices), and
the one thread pyarrow starts, jemalloc's background purger, is handled by
jemalloc's own fork handlers, as Arrow's thread pools are by Arrow's. A module that
fails to import here is left to the worker, whose task reports the error as it
would without this daemon.
"""

from __future__ import annotations

import importlib
import os
import runpy

# Read by OpenBLAS when numpy loads it: no BLAS thread pool in the daemon or its forks.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

PRELOAD = (
    "pyspark.worker",
    "numpy",
    "pyarrow",
    "pyarrow.compute",
    "orjson",
    "psycopg",
    "pgpq",
    "idem_platform.coercion.records",
    "idem_platform.write.staging",
    "idem_platform.spark.stage",
)


def preload() -> list[str]:
    """Import :data:`PRELOAD`; return the modules that could not be imported."""
    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and its task reports why
            failed.append(name)
    return failed


if __name__ == "__main__":
    preload()
    # Then PySpark's own daemon, run exactly as Spark runs it by default (``python -m
    # pyspark.daemon``, its command-line entry): no function of it is called. Spark has no
    # public way to preload modules in its workers; ``spark.python.daemon.module`` is the
    # expert setting it offers for such wrappers (SPARK-22959, apache/spark#20151).
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
