"""``idem serve``'s HTTP API: NDJSON pushes with idempotency keys, and OTLP log exports.

Every accepted body is landed as a file in its connector's drop directory
(:mod:`idem_platform.sources.push.landing`) and goes through the same ingest → coerce →
commit path as a dropped file. What this layer adds is the request's own
exactly-once answer, Stripe-style, kept in the ledger under ``http:<connector>``:

* fresh key → the body is landed, its ledger row committed, ``202`` with
  ``{file_key, path, lines, bytes}``;
* same key and body → the recorded answer with ``replayed: true``;
* same key, other body → ``422`` with both request hashes;
* same key while the first request is still landing → ``409`` with ``Retry-After``
  (the first request holds the key's ledger row; we wait at most ``lock_wait``);
* no key → the body's file key is the key (a retry of the same bytes replays).

The ledger row and the file are made in one transaction's life: the file is
published (fsync, rename, fsync) before the row commits, so an acknowledged body is
on disk, and a crash in between leaves a file the retry finds already there.
"""

from __future__ import annotations

import hmac
import sys
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.concurrency import run_in_threadpool

from idem_platform.config import ConnectorConfig, IdemConfig
from idem_platform.contract.keys import FILE_KEY_PREFIX, parse_caller_key
from idem_platform.errors import KeyValidationError
from idem_platform.ledger import (
    DEFAULT_REPLAY_WINDOW,
    Fresh,
    InFlight,
    Ledger,
    Mismatch,
    PriorError,
    PriorResult,
)
from idem_platform.postgres.connection import KEEPALIVES
from idem_platform.sources.push import otlp
from idem_platform.sources.push.landing import BodyTooLarge, Spool, remove_stale_spools
from idem_platform.sources.push.status import body_status, request_namespace

NDJSON_TYPES = (
    "application/x-ndjson",
    "application/ndjson",
    "application/jsonl",
    "application/x-jsonlines",
    "application/jsonlines",
    "application/json-lines",
)
KEY_HEADERS = ("idempotency-key", "x-idempotency-key")
RETRY_AFTER_SECONDS = 1
_CHUNK = 1 << 16


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


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


class Gunzip:
    """Inflates a gzip body as RFC 1952 defines it: one or more members, back to back.

    ``zlib`` stops at the end of the first member (the rest waits in ``unused_data``)
    and says nothing when the input just ends inside a member: used alone, it lands
    the first member of a multi-member body, or the readable part of a cut one, and
    the client hears ``202`` for records that were lost. Here every member is
    inflated in turn, whatever follows a member must be another valid member, and
    :meth:`finish` refuses a stream that ends inside one; each problem is a
    :class:`Refusal` ``400`` raised before anything is landed.
    """

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._member = 1
        self._started = False  # whether the current member has had any byte

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``data``, at most :data:`_CHUNK` at a time (a bomb stays bounded)."""
        while data:
            self._started = True
            try:
                out = self._inflate.decompress(data, _CHUNK)
            except zlib.error as exc:
                raise Refusal(400, self._undecodable(exc)) from None
            if out:
                yield out
            if self._inflate.eof:  # what follows a member must be the next member
                data = self._inflate.unused_data + self._inflate.unconsumed_tail
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._member += 1
                self._started = False
            else:
                data = self._inflate.unconsumed_tail

    def finish(self) -> bytes:
        """The last decoded bytes; a stream that ends inside a member is refused."""
        if not self._started:
            return b""
        try:
            tail = self._inflate.flush()
        except zlib.error as exc:
            raise Refusal(400, self._undecodable(exc)) from None
        if not self._inflate.eof:
            raise Refusal(
                400,
                f"the gzip body is truncated: it ends inside gzip member {self._member} "
                "(no end-of-member trailer); nothing was landed, send the whole body",
            )
        return tail

    def _undecodable(self, exc: zlib.error) -> str:
        if self._member == 1:
            return f"the gzip body does not decompress ({exc}); nothing was landed"
        return (
            f"the gzip body has trailing bytes after gzip member {self._member - 1} that are not a "
            f"valid gzip member ({exc}); nothing was landed"
        )


async def read_body(request: Request, sink: Callable[[bytes], None], limit: int) -> None:
    """Stream the body into ``sink``, gunzipping ``Content-Encoding: gzip`` (:class:`Gunzip`:
    every member, nothing after them); the limit applies to the decoded bytes and is
    checked before reading when the length is known."""
    declared = request.headers.get("content-length")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if declared is not None and declared.isdigit() and int(declared) > limit and encoding == "identity":
        raise BodyTooLarge(limit)
    if encoding not in ("identity", "gzip"):
        raise Refusal(415, f"Content-Encoding {encoding!r} is not supported (identity or gzip)")
    gunzip = Gunzip() if encoding == "gzip" else None
    async for chunk in request.stream():
        if gunzip is None:
            sink(chunk)
            continue
        for decoded in gunzip.feed(chunk):
            sink(decoded)
    if gunzip is not None:
        sink(gunzip.finish())


def _find(settings: ServeSettings, name: str, kinds: tuple[str, ...]) -> ConnectorConfig:
    served = [c for c in settings.config.connectors if c.kind in kinds]
    for connector in served:
        if connector.name == name:
            return connector
    raise Refusal(
        404,
        f"no {' or '.join(kinds)} connector named {name!r}",
        connectors=[c.name for c in served],
    )


def land(settings: ServeSettings, connector: ConnectorConfig, key: str, spool: Spool) -> tuple[int, dict[str, Any]]:
    """The ledger's answer for ``key``; a fresh key publishes the spooled body first.

    Runs in a worker thread (blocking I/O: fsync, PostgreSQL).
    """
    request = {"connector": connector.name, "sha256": spool.sha256, "bytes": spool.size}
    if settings.pool is None:
        raise RuntimeError("the app's connection pool is not open (use it inside its lifespan)")
    with settings.pool.connection() as conn:
        try:
            with conn.transaction():
                wait_ms = max(1, int(settings.lock_wait.total_seconds() * 1000))
                conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{wait_ms}ms"])
                ledger = Ledger(conn, request_namespace(connector), replay_window=settings.replay_window)
                outcome = ledger.begin(key, request, owner="idem-serve")
                if isinstance(outcome, Fresh):
                    landed = spool.publish()
                    result = {
                        "connector": connector.name,
                        "idempotency_key": key,
                        "file_key": landed.file_key,
                        "path": settings.config.shown(landed.path),
                        "lines": landed.lines,
                        "bytes": landed.bytes,
                        "status_url": f"/v1/commits/{landed.file_key}",
                    }
                    ledger.commit(key, result, owner="idem-serve")
                    return 202, {**result, "replayed": False}
        except psycopg.errors.LockNotAvailable:
            raise Refusal(
                409,
                f"a request with Idempotency-Key {key!r} is still being processed; retry after "
                f"{RETRY_AFTER_SECONDS} s",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
    spool.discard()
    if isinstance(outcome, PriorResult):
        return 202, {**outcome.result, "replayed": True}
    if isinstance(outcome, Mismatch):
        raise Refusal(
            422,
            f"Idempotency-Key {key!r} was used before for another body",
            recorded_request_hash=outcome.recorded_hash,
            submitted_request_hash=outcome.submitted_hash,
        )
    if isinstance(outcome, InFlight):  # only a row someone committed in progress: not ours
        raise Refusal(
            409, f"Idempotency-Key {key!r} is in progress", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    if isinstance(outcome, PriorError):
        raise Refusal(422, f"Idempotency-Key {key!r} failed before: {outcome.error.get('message')}")
    raise RuntimeError(f"unknown ledger outcome {outcome!r}")


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


def create_app(settings: ServeSettings) -> FastAPI:
    """The ASGI app; its lifespan removes stale spools and opens and closes the PostgreSQL pool."""

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

    guarded = [Depends(authenticate)]
    app = FastAPI(
        title="idem serve",
        version="1",
        description="Push NDJSON records and OTLP logs into idem_platform's connectors, exactly once. "
        "Send `Authorization: Bearer <IDEM_HTTP_TOKEN>` when the server has a token.",
        lifespan=lifespan,
    )

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

    @app.get("/healthz", summary="Liveness and PostgreSQL reachability")
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

    @app.post(
        "/v1/connectors/{name}/records",
        status_code=202,
        dependencies=guarded,
        summary="Push NDJSON records to an http connector",
        openapi_extra={
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
        },
    )
    async def push_records(name: str, request: Request) -> JSONResponse:
        connector = _find(settings, name, ("http",))
        media = _media_type(request)
        if media not in NDJSON_TYPES:
            raise Refusal(
                415,
                f"Content-Type {media or '(none)'!r} is not NDJSON; send one JSON object per line as "
                f"{NDJSON_TYPES[0]}",
                accepted=list(NDJSON_TYPES),
            )
        key = _caller_key(request)
        with Spool(_landing_dir(connector), limit=connector.max_body_bytes) as spool:
            await read_body(request, spool.write, connector.max_body_bytes)
            if spool.size == 0:
                raise Refusal(400, "the body is empty; send one JSON object per line")
            status, body = await run_in_threadpool(land, settings, connector, key or spool.file_key, spool)
        return JSONResponse(body, status_code=status)

    async def export_logs(connector: ConnectorConfig, request: Request) -> Response:
        media = _media_type(request)
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
            with Spool(_landing_dir(connector), limit=1 << 62) as spool:
                spool.write(decoded.ndjson())
                try:
                    await run_in_threadpool(land, settings, connector, spool.file_key, spool)
                except Refusal as exc:
                    if exc.status == 409:  # OTLP exporters retry 503 with Retry-After, not 409
                        raise Refusal(503, str(exc), headers=exc.headers) from None
                    raise
        return Response(otlp.encode_response(decoded.rejected, message, media), media_type=media)

    @app.post("/v1/logs", summary="OTLP/HTTP logs (the only otlp connector)", dependencies=guarded)
    async def otlp_logs(request: Request) -> Response:
        served = [c for c in settings.config.connectors if c.kind == "otlp"]
        if len(served) != 1:
            raise Refusal(
                404,
                "POST /v1/logs needs exactly one otlp connector; with several, post to "
                "/v1/connectors/{name}/logs",
                connectors=[c.name for c in served],
            )
        return await export_logs(served[0], request)

    @app.post("/v1/connectors/{name}/logs", summary="OTLP/HTTP logs for one otlp connector", dependencies=guarded)
    async def otlp_connector_logs(name: str, request: Request) -> Response:
        return await export_logs(_find(settings, name, ("otlp",)), request)

    @app.get("/v1/commits/{file_key}", summary="Whether and how a landed body was committed", dependencies=guarded)
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

    return app


def _landing_dir(connector: ConnectorConfig) -> Path:
    if connector.path is None:  # the config refuses http/otlp connectors without one
        raise RuntimeError(f"connector {connector.name!r} has no path to land bodies in")
    return connector.path


def _caller_key(request: Request) -> str | None:
    for header in KEY_HEADERS:
        if header in request.headers:
            try:
                return parse_caller_key(request.headers[header])
            except KeyValidationError as exc:
                raise Refusal(400, str(exc)) from None
    return None
