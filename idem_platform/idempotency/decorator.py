"""``@idempotent``: :func:`~idem_platform.idempotency.run.run_idempotently` as a decorator.

Apart because it adds only the key choice (an explicit ``idempotency_key``, else
``key(request)``) and the typing of the wrapped function
(:class:`IdempotentFunction`); the ledger work is :mod:`.run`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol, TypeVar, cast

import psycopg
from pydantic import BaseModel

from idem_platform.contract.keys import parse_caller_key
from idem_platform.errors import KeyValidationError
from idem_platform.idempotency.errors import IdempotencyUsageError
from idem_platform.idempotency.run import (
    DEFAULT_TRANSIENT,
    DEFAULT_WAIT_SECONDS,
    run_idempotently_untyped,
)
from idem_platform.ledger import DEFAULT_REPLAY_WINDOW, NAMESPACE_PATTERN

RequestT = TypeVar("RequestT", contravariant=True)
ResultT = TypeVar("ResultT", covariant=True)
ReqT = TypeVar("ReqT")
ResT = TypeVar("ResT")


class IdempotentFunction(Protocol[RequestT, ResultT]):
    """What :func:`idempotent` returns: the function, plus an optional explicit key."""

    def __call__(
        self,
        conn: psycopg.Connection[Any],
        request: RequestT,
        *,
        idempotency_key: str | None = None,
    ) -> ResultT: ...


def idempotent(
    namespace: str,
    *,
    key: Callable[[Any], str] | None = None,
    result_model: type[BaseModel] | None = None,
    transient: tuple[type[BaseException], ...] = DEFAULT_TRANSIENT,
    replay_window: timedelta = DEFAULT_REPLAY_WINDOW,
    wait_seconds: float | None = DEFAULT_WAIT_SECONDS,
) -> Callable[[Callable[[psycopg.Connection[Any], ReqT], ResT]], IdempotentFunction[ReqT, ResT]]:
    """Make ``def f(conn, request)`` idempotent through :func:`run_idempotently`.

    The wrapped function is called as ``f(conn, request, *, idempotency_key=None)``:
    an explicit key (a caller's ``Idempotency-Key``, validated) wins, else
    ``key(request)`` derives it from the request's natural key, else the call
    fails with :class:`KeyValidationError` (a guessed key would defeat the point).

    Args:
        namespace: the ledger namespace, checked here so a typo fails at import.
        key: request → key; must return a string (use :func:`mint_key` to combine parts).
        result_model, transient, replay_window, wait_seconds: as for :func:`run_idempotently`.
    """
    if not NAMESPACE_PATTERN.fullmatch(namespace or ""):
        raise ValueError(f"ledger namespace {namespace!r} must match [a-z0-9_.:-]{{1,128}}")

    def decorate(
        func: Callable[[psycopg.Connection[Any], ReqT], ResT],
    ) -> IdempotentFunction[ReqT, ResT]:
        @functools.wraps(func)
        def wrapper(
            conn: psycopg.Connection[Any], request: ReqT, *, idempotency_key: str | None = None
        ) -> ResT:
            chosen = parse_caller_key(idempotency_key)
            if chosen is None:
                if key is None:
                    raise KeyValidationError(
                        f"{func.__qualname__} needs an idempotency key: pass idempotency_key=… "
                        "or give @idempotent a key= function"
                    )
                chosen = key(request)
                if not isinstance(chosen, str):
                    raise IdempotencyUsageError(
                        f"the key= function of {func.__qualname__} returned "
                        f"{type(chosen).__name__}, not str"
                    )
            result: ResT = run_idempotently_untyped(
                conn,
                namespace,
                chosen,
                request,
                lambda: func(conn, request),
                result_model=result_model,
                transient=transient,
                replay_window=replay_window,
                wait_seconds=wait_seconds,
            )
            return result

        return cast(IdempotentFunction[ReqT, ResT], wrapper)

    return decorate
