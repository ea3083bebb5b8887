"""A Spark Connect client's bounds: how long it retries a server, and how a lost server reads.

Its own module, below both the session builder (which bounds a new session's retries) and
the staging sink (which turns a lost server into one line).
"""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

import grpc
from pyspark.sql import SparkSession
from pyspark.sql.connect.client.retries import DefaultPolicy

# A server that does not answer is retried this many times, with waits of 0.05, 0.2, 0.8,
# 3.2, 5 and 5 s (~15 s in all): PySpark's default retries for ~10 minutes, and again for
# the cancel after it, so a run whose server died hung ~21 minutes holding its PostgreSQL
# transaction open ("idle in transaction").
CONNECT_RETRIES = 6
CONNECT_MAX_BACKOFF_MS = 5000


def bound_retries(spark: SparkSession, url: str) -> None:
    """Bound how long ``spark`` (a Connect session of ``url``) retries a server that does not
    answer: a server on this machine whose port refuses connections is dead, and fails the
    call at once; any other server is retried for ~15 s (:data:`CONNECT_RETRIES`)."""

    location = urlsplit(url.split(";")[0].replace("sc://", "http://", 1))
    host = location.hostname or "localhost"
    local = host in ("localhost", "127.0.0.1", "::1")
    port = location.port or 15002

    class BoundedRetries(DefaultPolicy):
        def can_retry(self, e: BaseException) -> bool:
            return super().can_retry(e) and (not local or _accepts(host, port))

    spark.client.set_retry_policies([BoundedRetries(max_retries=CONNECT_RETRIES, max_backoff=CONNECT_MAX_BACKOFF_MS)])


def lost_server(exc: BaseException) -> str | None:
    """Why the Connect server did not answer (gRPC's ``UNAVAILABLE`` details, one line), if
    that is how ``exc`` (or an exception it came from) failed; else ``None``."""

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, grpc.RpcError) and current.code() == grpc.StatusCode.UNAVAILABLE:
            details = str(current.details() or "unavailable")
            return (details.strip().splitlines() or ["unavailable"])[0][:300]
        current = current.__cause__ or current.__context__
    found = re.search(r'StatusCode\.UNAVAILABLE.*?details = "([^"\n]*)', str(exc), re.DOTALL)
    return found.group(1)[:300] if found else None


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
