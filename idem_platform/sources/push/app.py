"""``idem serve``'s HTTP API: NDJSON pushes with idempotency keys, and OTLP log exports.

Every accepted body is landed as a file in its connector's drop directory
(:mod:`idem_platform.sources.push.landing`) and goes through the same ingest → coerce →
commit path as a dropped file. What this layer adds is the request's own
exactly-once answer (:mod:`idem_platform.sources.push.idempotency`).

This module assembles the app: its lifespan (stale spools swept, the PostgreSQL pool
opened and closed), the bearer token, how refusals and outages are answered, and the
routers of :mod:`idem_platform.sources.push.routes`.
"""

from __future__ import annotations

import hmac
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.concurrency import run_in_threadpool

from idem_platform.config import IdemConfig
from idem_platform.postgres.connection import KEEPALIVES
from idem_platform.sources.push.context import RETRY_AFTER_SECONDS, Refusal, ServeSettings
from idem_platform.sources.push.landing import BodyTooLarge, remove_stale_spools
from idem_platform.sources.push.routes import (
    health_router,
    logs_router,
    records_router,
    status_router,
)


def sweep_spools(config: IdemConfig) -> None:
    """Remove the spools a server killed mid-request left in the landing directories.

    Nothing acknowledged them and nothing else would ever remove them; a spool a
    live server is writing is locked and stays (see :func:`remove_stale_spools`).
    """
    for connector in config.connectors:
        if connector.kind in ("http", "otlp") and connector.path is not None:
            removed = remove_stale_spools(connector.path)
            if removed:
                sys.stderr.write(
                    f"idem serve: removed {len(removed)} unfinished body spool(s) of an earlier server "
                    f"in {config.shown(connector.path)} (no request was answered for them)\n"
                )


def _lifespan(settings: ServeSettings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the pool exists only while the app serves, so a test or ``idem dev``
    that stops the server leaves no PostgreSQL connection behind."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(sweep_spools, settings.config)
        pool = ConnectionPool(
            settings.postgres_url,
            min_size=1,
            max_size=settings.pool_size,
            kwargs={"application_name": "idem-serve", **KEEPALIVES},
            open=False,
        )
        await run_in_threadpool(pool.open, True, 30.0)
        settings.pool = pool
        try:
            yield
        finally:
            settings.pool = None
            await run_in_threadpool(pool.close)

    return lifespan


def _bearer_guard(settings: ServeSettings) -> Callable[[Request], None]:
    """The dependency the guarded routes share: one place decides who may push or ask."""

    def authenticate(request: Request) -> None:
        """The bearer token, when the server has one (``/healthz`` and the docs need none)."""
        if not settings.token:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.token.encode()):
            raise Refusal(
                401,
                "missing or wrong bearer token (Authorization: Bearer <IDEM_HTTP_TOKEN>)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authenticate


def _answer_errors(app: FastAPI) -> None:
    """How the app answers what the routes raise: a :class:`Refusal` as its own status and JSON,
    PostgreSQL down as ``503`` with Retry-After, a body too large as ``413`` (never a bare 500)."""

    @app.exception_handler(Refusal)
    async def _refused(_request: Request, exc: Refusal) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(PoolTimeout)
    async def _postgres_down(_request: Request, exc: Exception) -> JSONResponse:
        # Nothing was acknowledged: the client retries the same key later and gets one answer.
        return JSONResponse(
            {"error": f"PostgreSQL is unavailable ({type(exc).__name__}); nothing was recorded, retry later"},
            status_code=503,
            headers={"Retry-After": str(5 * RETRY_AFTER_SECONDS)},
        )

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_request: Request, exc: BodyTooLarge) -> JSONResponse:
        return JSONResponse({"error": str(exc), "max_body_bytes": exc.limit}, status_code=413)


def create_app(settings: ServeSettings) -> FastAPI:
    """The ASGI app; its lifespan removes stale spools and opens and closes the PostgreSQL pool."""
    guarded = [Depends(_bearer_guard(settings))]
    app = FastAPI(
        title="idem serve",
        version="1",
        description="Push NDJSON records and OTLP logs into idem_platform's connectors, exactly once. "
        "Send `Authorization: Bearer <IDEM_HTTP_TOKEN>` when the server has a token.",
        lifespan=_lifespan(settings),
    )
    _answer_errors(app)
    app.include_router(health_router(settings))
    app.include_router(records_router(settings, guarded))
    app.include_router(logs_router(settings, guarded))
    app.include_router(status_router(settings, guarded))
    return app
