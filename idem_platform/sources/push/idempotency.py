"""A push request's exactly-once answer, Stripe-style, kept in the ledger under ``http:<connector>``.

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

from typing import Any

import psycopg
from fastapi import Request

from idem_platform.config import ConnectorConfig
from idem_platform.contract.keys import parse_caller_key
from idem_platform.errors import KeyValidationError
from idem_platform.ledger import Fresh, InFlight, Ledger, Mismatch, PriorError, PriorResult
from idem_platform.sources.push.context import RETRY_AFTER_SECONDS, Refusal, ServeSettings
from idem_platform.sources.push.landing import Spool
from idem_platform.sources.push.status import request_namespace

KEY_HEADERS = ("idempotency-key", "x-idempotency-key")


def caller_key(request: Request) -> str | None:
    """The request's Idempotency-Key (or X-Idempotency-Key), validated; ``None`` without one."""
    for header in KEY_HEADERS:
        if header in request.headers:
            try:
                return parse_caller_key(request.headers[header])
            except KeyValidationError as exc:
                raise Refusal(400, str(exc)) from None
    return None


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
