"""Running the push API: ``idem serve`` in the foreground, or in a thread (the demo, tests).

Without ``IDEM_HTTP_TOKEN`` the API has no authentication, so it only ever listens on
the loopback interface, whatever host was asked for, and says so at start.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import time
from dataclasses import dataclass

import uvicorn

from idem_platform.config import IdemConfig
from idem_platform.settings import HTTP_TOKEN_ENV, http_token_from_environment
from idem_platform.sources.push.app import create_app
from idem_platform.sources.push.context import ServeSettings

TOKEN_ENV = HTTP_TOKEN_ENV
LOOPBACK = "127.0.0.1"
MAX_HEAD_BYTES = 64 << 10
"""Bound on a request's line and headers together; past it the connection gets ``400`` and is closed."""
MAX_CONCURRENT = 1024
"""Connections and requests served at once; past it a request gets ``503`` (clients retry)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_host(host: str, token: str | None) -> tuple[str, str | None]:
    """The host to bind and, when it differs from the one asked for, why."""
    if token or is_loopback(host):
        return host, None
    return LOOPBACK, (
        f"{TOKEN_ENV} is not set: the API has no authentication, so it listens on {LOOPBACK} only, "
        f"not {host}; set {TOKEN_ENV} to serve other machines"
    )


def _config(settings: ServeSettings, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings, with bounds a client cannot push past.

    The HTTP parser is h11, not httptools (uvicorn's pick when it is installed):
    httptools buffers a request line and headers of any size, so one connection
    sending a 150 MB header held ~1 GB and stalled ``/healthz`` for tens of seconds.
    h11 refuses a head past :data:`MAX_HEAD_BYTES` with ``400`` and closes the
    connection; :data:`MAX_CONCURRENT` bounds how many such buffers exist at once.
    """
    return uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        http="h11",
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        limit_concurrency=MAX_CONCURRENT,
        timeout_keep_alive=5,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )


def serve(settings: ServeSettings, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's own handlers finish requests in flight)."""
    chosen, why = bind_host(host, settings.token)
    served = {
        c.name: {"kind": c.kind, "lands_in": settings.config.shown(c.path)}
        for c in settings.config.connectors
        if c.kind in ("http", "otlp")
    }
    sys.stderr.write(
        f"idem serve: http://{chosen}:{port} (OpenAPI at /docs), "
        f"auth: {'bearer token' if settings.token else 'none, loopback only'}\n"
    )
    for name, info in served.items():
        sys.stderr.write(f"  {info['kind']:5} {name} -> {info['lands_in']}\n")
    if why:
        sys.stderr.write(f"idem serve: {why}\n")
    sys.stderr.flush()
    uvicorn.Server(_config(settings, chosen, port)).run()


@dataclass
class BackgroundServer:
    """A server running in a thread of this process; :meth:`stop` ends it."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def serve_in_background(settings: ServeSettings, port: int | None = None, timeout: float = 30.0) -> BackgroundServer:
    """Start the API on the loopback interface in a daemon thread; returns once it accepts."""
    chosen = port or free_port()
    server = uvicorn.Server(_config(settings, LOOPBACK, chosen))
    thread = threading.Thread(target=server.run, name="idem-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"idem serve did not start on {LOOPBACK}:{chosen}")
        time.sleep(0.02)
    return BackgroundServer(f"http://{LOOPBACK}:{chosen}", server, thread)


def settings_from_environment(config: IdemConfig, postgres_url: str) -> ServeSettings:
    """Settings for ``config`` with the token from ``IDEM_HTTP_TOKEN`` (blank = none)."""
    token = http_token_from_environment()
    return ServeSettings(config=config, postgres_url=postgres_url, token=token)
