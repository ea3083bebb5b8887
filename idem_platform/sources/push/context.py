"""What every route of ``idem serve`` shares: the server's settings, how a request is refused,
and which connector a request names.

It lives apart from :mod:`~idem_platform.sources.push.app` so the route modules can
use it without importing the app that includes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi import Request
from psycopg_pool import ConnectionPool

from idem_platform.config import IdemConfig, PushConnector, PushConnectorBase
from idem_platform.ledger import DEFAULT_REPLAY_WINDOW

RETRY_AFTER_SECONDS = 1


@dataclass
class ServeSettings:
    """What the app needs: the config, where PostgreSQL is, and the bearer token (if any)."""

    config: IdemConfig
    postgres_url: str
    token: str | None = None
    lock_wait: timedelta = timedelta(milliseconds=500)
    replay_window: timedelta = DEFAULT_REPLAY_WINDOW
    pool_size: int = 8
    pool: ConnectionPool | None = field(default=None, repr=False)


class Refusal(Exception):
    """A request refused with a status and a JSON body (never a 5xx)."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": message, **extra}
        self.headers = headers or {}


def media_type(request: Request) -> str:
    """The request's Content-Type without parameters, lower-cased: what the routes compare
    against the types they accept (``charset=`` and the like never change the answer)."""
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def find_connector(settings: ServeSettings, name: str, kinds: tuple[str, ...]) -> PushConnector:
    """The connector of one of ``kinds`` (http, otlp) that a path names; a ``404`` that lists
    the served names otherwise, so a typo is answered with what would have worked."""
    served = [c for c in settings.config.connectors if isinstance(c, PushConnectorBase) and c.kind in kinds]
    for connector in served:
        if connector.name == name:
            return connector
    raise Refusal(
        404,
        f"no {' or '.join(kinds)} connector named {name!r}",
        connectors=[c.name for c in served],
    )


def landing_dir(connector: PushConnector) -> Path:
    """Where a connector's bodies land (its drop directory, which the sensor watches)."""
    if connector.path is None:  # the config refuses http/otlp connectors without one
        raise RuntimeError(f"connector {connector.name!r} has no path to land bodies in")
    return connector.path
