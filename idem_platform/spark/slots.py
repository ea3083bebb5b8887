"""What a Spark session is: local or Spark Connect, and how many tasks it runs at once.

Its own module, below both the session builder and the staging sink, which each ask.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDD API)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def task_slots(spark: SparkSession) -> int:
    """How many tasks run at once: the context's default parallelism, or for a Connect
    session the server's ``local[N]`` (``local[*]``: this machine's cores, the server
    being local); any other master counts as 2 until it says otherwise."""
    if not is_remote(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    try:
        master = str(spark.conf.get("spark.master"))
    except Exception:  # noqa: BLE001 - an older server: assume a small machine
        return 2
    if master.startswith("local["):
        count = master[len("local[") :].split(",")[0].rstrip("]")
        return os.cpu_count() or 2 if count == "*" else max(1, int(count)) if count.isdigit() else 2
    return 1 if master == "local" else 2
