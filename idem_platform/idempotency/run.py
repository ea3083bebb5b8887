""":func:`run_idempotently`, the library's entry point: check the key, pick the transaction, run the call.

It owns the defaults users can override (:data:`DEFAULT_TRANSIENT`,
:data:`DEFAULT_WAIT_SECONDS`) and the rule on the connection's state: an idle
connection gets a transaction of its own, an open one is used as is. The work
inside that transaction is :mod:`.call`'s.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, overload

import psycopg
from psycopg.pq import TransactionStatus
from pydantic import BaseModel

from idem_platform.contract.keys import parse_caller_key
from idem_platform.errors import KeyValidationError, TransientError
from idem_platform.idempotency.call import Call, Done, Failed
from idem_platform.ledger import DEFAULT_REPLAY_WINDOW, Ledger, LedgerUsageError

# Failures worth retrying: the next call must run the handler again, so their row is
# deleted rather than recorded. A lost connection, a deadlock or serialization failure
# (psycopg.OperationalError), a timeout, idem's own TransientError (which includes
# IdempotencyKeyInFlight from a nested call).
DEFAULT_TRANSIENT: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    TimeoutError,
    ConnectionError,
    TransientError,
)
# How long ``begin`` waits for another transaction's uncommitted claim of the same key
# before answering "in flight". Waiting a little turns most races into a replay (the
# other run commits); waiting forever would let one stuck run hang every retry.
DEFAULT_WAIT_SECONDS = 5.0

ModelT = TypeVar("ModelT", bound=BaseModel)


@overload
def run_idempotently(
    conn: psycopg.Connection[Any],
    namespace: str,
    key: str,
    request: Any,
    handler: Callable[[], ModelT],
    *,
    result_model: type[ModelT],
    transient: tuple[type[BaseException], ...] = ...,
    replay_window: timedelta = ...,
    wait_seconds: float | None = ...,
    owner: str | None = ...,
) -> ModelT: ...


@overload
def run_idempotently(
    conn: psycopg.Connection[Any],
    namespace: str,
    key: str,
    request: Any,
    handler: Callable[[], dict[str, Any]],
    *,
    result_model: None = None,
    transient: tuple[type[BaseException], ...] = ...,
    replay_window: timedelta = ...,
    wait_seconds: float | None = ...,
    owner: str | None = ...,
) -> dict[str, Any]: ...


def run_idempotently(
    conn: psycopg.Connection[Any],
    namespace: str,
    key: str,
    request: Any,
    handler: Callable[[], Any],
    *,
    result_model: type[BaseModel] | None = None,
    transient: tuple[type[BaseException], ...] = DEFAULT_TRANSIENT,
    replay_window: timedelta = DEFAULT_REPLAY_WINDOW,
    wait_seconds: float | None = DEFAULT_WAIT_SECONDS,
    owner: str | None = None,
) -> Any:
    """Run ``handler`` once per ``(namespace, key)``; replay its answer on every later call.

    Args:
        conn: a psycopg connection, idle (the call opens and commits a transaction)
            or inside the caller's transaction (everything happens in it).
        namespace: ``[a-z0-9_.:-]{1,128}``; prefer a dotted name (``payments.charges``).
        key: the idempotency key (validated like a caller's ``Idempotency-Key``:
            trimmed, not blank, at most 255 characters, no control characters).
        request: a JSON-able value or a pydantic model; its canonical hash tells a
            retry (same request) from a reuse of the key (:class:`IdempotencyKeyMismatch`).
        handler: called with no arguments (close over what it needs); it may use
            ``conn``, its writes commit with the stored result or not at all. It
            returns a dict of JSON values, or an instance of ``result_model``.
        result_model: a pydantic model the result is stored as
            (``model_dump(mode="json")``) and decoded with (``model_validate``).
        transient: exception classes that release the key (row deleted, next call
            runs again) instead of recording a permanent failure.
        replay_window: how long the answer is kept before ``purge_expired`` may drop it.
        wait_seconds: how long to wait for another transaction's uncommitted claim
            of the key before raising :class:`IdempotencyKeyInFlight`; ``None`` waits
            as long as it takes.
        owner: recorded on the claim (default ``host:pid``), shown by ``InFlight``.

    Returns:
        The handler's result as every replay will return it: the JSON round trip
        of the dict, or ``result_model`` validated from its stored JSON.

    Raises:
        IdempotencyKeyMismatch, IdempotencyKeyInFlight, IncompatibleStoredResult,
        ReplayedError, IdempotencyUsageError, KeyValidationError: see their docs.
        The handler's own exception (re-raised after being recorded or released),
        or on a replay a rebuilt one of the same class and message.
    """
    return run_idempotently_untyped(
        conn,
        namespace,
        key,
        request,
        handler,
        result_model=result_model,
        transient=transient,
        replay_window=replay_window,
        wait_seconds=wait_seconds,
        owner=owner,
    )


def run_idempotently_untyped(
    conn: psycopg.Connection[Any],
    namespace: str,
    key: str,
    request: Any,
    handler: Callable[[], Any],
    *,
    result_model: type[BaseModel] | None,
    transient: tuple[type[BaseException], ...],
    replay_window: timedelta,
    wait_seconds: float | None,
    owner: str | None = None,
) -> Any:
    """:func:`run_idempotently` without its overloads (the decorator's result type is its own)."""
    checked = parse_caller_key(key) if isinstance(key, str) else None
    if checked is None:
        raise KeyValidationError(f"an idempotency key must be a non-empty string, not {key!r}")
    ledger = Ledger(conn, namespace, replay_window=replay_window)
    document = request.model_dump(mode="json") if isinstance(request, BaseModel) else request
    call = Call(
        conn=conn,
        ledger=ledger,
        key=checked,
        request=document,
        handler=handler,
        result_model=result_model,
        transient=transient,
        wait_seconds=wait_seconds,
        owner=owner if owner is not None else f"{socket.gethostname()}:{os.getpid()}",
    )
    status = conn.info.transaction_status
    verdict: Done | Failed | None = None
    if status == TransactionStatus.INTRANS:
        verdict = call.run(own_transaction=False)
    elif status == TransactionStatus.IDLE:
        try:
            with conn.transaction():
                verdict = call.run(own_transaction=True)
        except psycopg.OperationalError as exc:
            if not isinstance(verdict, Failed):
                raise
            # The commit that would record the failure failed: it is still the handler's error.
            verdict.error.add_note(f"its failure could not be recorded: {exc!r}")
            raise verdict.error from None
    else:
        raise LedgerUsageError(
            "run_idempotently needs an idle connection or an open transaction, "
            f"not one that is {status.name} (roll back a failed transaction first)"
        )
    if isinstance(verdict, Failed):
        raise verdict.error
    if verdict is None:  # unreachable: both branches above set it or raised
        raise LedgerUsageError("run_idempotently finished without an answer")
    return verdict.value

