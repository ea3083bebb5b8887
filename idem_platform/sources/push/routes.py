"""The routes of ``idem serve``, one :class:`~fastapi.APIRouter` per concern: health, NDJSON
records, OTLP logs, commit status.

Each builder takes the server's settings and the auth dependency, so a route reads
as what it answers; the app (:mod:`~idem_platform.sources.push.app`) adds the
lifespan, the bearer token and how refusals and outages are answered.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.params import Depends
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from idem_platform.config import PushConnector
from idem_platform.contract.keys import FILE_KEY_PREFIX
from idem_platform.sources.push import otlp
from idem_platform.sources.push.body import read_body
from idem_platform.sources.push.context import (
    Refusal,
    ServeSettings,
    find_connector,
    landing_dir,
    media_type,
)
from idem_platform.sources.push.idempotency import caller_key, land
from idem_platform.sources.push.landing import BodyTooLarge, Spool
from idem_platform.sources.push.status import body_status

NDJSON_TYPES = (
    "application/x-ndjson",
    "application/ndjson",
    "application/jsonl",
    "application/x-jsonlines",
    "application/jsonlines",
    "application/json-lines",
)

_RECORDS_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in NDJSON_TYPES[:1]},
    },
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "maxLength": 255},
            "description": "Also accepted as X-Idempotency-Key. Without one, the body's file key is the key.",
        }
    ],
    "responses": {
        "202": {"description": "Landed (or replayed: `replayed: true`)"},
        "400": {"description": "Invalid Idempotency-Key or empty body"},
        "404": {"description": "Unknown connector"},
        "409": {"description": "The same key is in flight; retry after Retry-After"},
        "413": {"description": "Body over max_body_bytes"},
        "415": {"description": "Not NDJSON"},
        "422": {"description": "The key was used for another body"},
    },
}
"""What FastAPI cannot infer for ``POST /v1/connectors/{name}/records``: the body is read raw
(streamed, not parsed), and the key is a header the route reads itself."""


def health_router(settings: ServeSettings) -> APIRouter:
    """``GET /healthz``: liveness and PostgreSQL reachability, without a token, so a probe
    needs no secret and a ``503`` says PostgreSQL, not the server, is down."""
    router = APIRouter()

    @router.get("/healthz", summary="Liveness and PostgreSQL reachability")
    async def healthz() -> JSONResponse:
        def probe() -> dict[str, Any]:
            if settings.pool is None:
                raise RuntimeError("pool closed")
            with settings.pool.connection(timeout=5) as conn:
                conn.execute("SELECT 1")
            return {"status": "ok", "postgres": "reachable"}

        try:
            return JSONResponse(await run_in_threadpool(probe))
        except Exception as exc:  # noqa: BLE001 - health reports, never raises
            return JSONResponse({"status": "unavailable", "postgres": type(exc).__name__}, status_code=503)

    return router


def records_router(settings: ServeSettings, guarded: list[Depends]) -> APIRouter:
    """``POST /v1/connectors/{name}/records``: an NDJSON body streamed into a spool, then landed
    under the request's idempotency key (:func:`~idem_platform.sources.push.idempotency.land`)."""
    router = APIRouter()

    @router.post(
        "/v1/connectors/{name}/records",
        status_code=202,
        dependencies=guarded,
        summary="Push NDJSON records to an http connector",
        openapi_extra=_RECORDS_OPENAPI,
    )
    async def push_records(name: str, request: Request) -> JSONResponse:
        connector = find_connector(settings, name, ("http",))
        media = media_type(request)
        if media not in NDJSON_TYPES:
            raise Refusal(
                415,
                f"Content-Type {media or '(none)'!r} is not NDJSON; send one JSON object per line as "
                f"{NDJSON_TYPES[0]}",
                accepted=list(NDJSON_TYPES),
            )
        key = caller_key(request)
        with Spool(landing_dir(connector), limit=connector.max_body_bytes) as spool:
            await read_body(request, spool.write, connector.max_body_bytes)
            if spool.size == 0:
                raise Refusal(400, "the body is empty; send one JSON object per line")
            status, body = await run_in_threadpool(land, settings, connector, key or spool.file_key, spool)
        return JSONResponse(body, status_code=status)

    return router


async def export_logs(settings: ServeSettings, connector: PushConnector, request: Request) -> Response:
    """One OTLP/HTTP logs export: decoded whole (bounded by ``max_body_bytes``), its records
    landed as NDJSON under their file key, answered in the OTLP encoding it came in.

    An in-flight ``409`` becomes ``503``: OTLP exporters retry 503 with Retry-After, not 409.
    """
    media = media_type(request)
    if media not in (otlp.PROTOBUF, otlp.JSON):
        raise Refusal(415, f"Content-Type {media or '(none)'!r}: OTLP/HTTP takes {otlp.PROTOBUF} or {otlp.JSON}")
    chunks: list[bytes] = []
    size = 0

    def collect(chunk: bytes) -> None:
        nonlocal size
        size += len(chunk)
        if size > connector.max_body_bytes:
            raise BodyTooLarge(connector.max_body_bytes)
        chunks.append(chunk)

    await read_body(request, collect, connector.max_body_bytes)
    try:
        decoded = otlp.decode_export(b"".join(chunks), media, max_record_bytes=connector.max_line_bytes)
    except otlp.MalformedExport as exc:
        raise Refusal(400, str(exc)) from None
    message = decoded.message
    if decoded.records:
        with Spool(landing_dir(connector), limit=1 << 62) as spool:
            spool.write(decoded.ndjson())
            try:
                await run_in_threadpool(land, settings, connector, spool.file_key, spool)
            except Refusal as exc:
                if exc.status == 409:  # OTLP exporters retry 503 with Retry-After, not 409
                    raise Refusal(503, str(exc), headers=exc.headers) from None
                raise
    return Response(otlp.encode_response(decoded.rejected, message, media), media_type=media)


def logs_router(settings: ServeSettings, guarded: list[Depends]) -> APIRouter:
    """The OTLP/HTTP logs endpoints: ``/v1/logs`` (the standard path, for the only otlp
    connector) and ``/v1/connectors/{name}/logs`` (when there are several)."""
    router = APIRouter()

    @router.post("/v1/logs", summary="OTLP/HTTP logs (the only otlp connector)", dependencies=guarded)
    async def otlp_logs(request: Request) -> Response:
        served = [c for c in settings.config.connectors if c.kind == "otlp"]
        if len(served) != 1:
            raise Refusal(
                404,
                "POST /v1/logs needs exactly one otlp connector; with several, post to "
                "/v1/connectors/{name}/logs",
                connectors=[c.name for c in served],
            )
        return await export_logs(settings, served[0], request)

    @router.post("/v1/connectors/{name}/logs", summary="OTLP/HTTP logs for one otlp connector", dependencies=guarded)
    async def otlp_connector_logs(name: str, request: Request) -> Response:
        return await export_logs(settings, find_connector(settings, name, ("otlp",)), request)

    return router


def status_router(settings: ServeSettings, guarded: list[Depends]) -> APIRouter:
    """``GET /v1/commits/{file_key}``: what became of a landed body (a push is acknowledged when
    landed, so this is how a client learns it was committed)."""
    router = APIRouter()

    @router.get("/v1/commits/{file_key}", summary="Whether and how a landed body was committed", dependencies=guarded)
    async def commit_status(file_key: str) -> JSONResponse:
        if not file_key.startswith(FILE_KEY_PREFIX):
            raise Refusal(400, f"{file_key!r} is not a file key ({FILE_KEY_PREFIX}<sha256>)")
        served = [c for c in settings.config.connectors if c.kind in ("http", "otlp")]

        def look() -> dict[str, Any] | None:
            if settings.pool is None:
                raise RuntimeError("pool closed")
            with settings.pool.connection() as conn:
                return body_status(conn, served, file_key)

        answer = await run_in_threadpool(look)
        if answer is None:
            raise Refusal(404, f"no connector landed a body with file key {file_key}")
        return JSONResponse(answer)

    return router
