"""The idempotency ledger as a library for the user's own idempotent handlers.

idem keeps one ledger (``idem.ingest_ledger``, DESIGN §4) for its own file-drop,
Kafka and HTTP paths. This module lends it to your code: wrap a function that
does something once per request (charge a card, create an order) and a retry
with the same key returns the first answer instead of doing it again::

    from pydantic import BaseModel
    from idem_platform.idempotency import idempotent

    class Charge(BaseModel):
        order_id: str
        cents: int

    class Receipt(BaseModel):
        charge_id: str

    @idempotent("payments.charges", key=lambda req: f"order:{req.order_id}", result_model=Receipt)
    def charge(conn, request: Charge) -> Receipt:
        conn.execute("INSERT INTO charges ...")
        return Receipt(charge_id=...)

    receipt = charge(conn, Charge(order_id="o-1", cents=500))       # runs
    receipt = charge(conn, Charge(order_id="o-1", cents=500))       # replays, does not run

What a call does depends on what the ledger holds for ``(namespace, key)``:

* nothing: the handler runs inside the caller's transaction, in a savepoint, and
  its result is stored with its writes (both commit or neither does);
* a result: it is returned (decoded through ``result_model``), the handler does not run;
* a permanent error: the same exception class is raised again with the same
  message (:class:`ReplayedError` when the class cannot be rebuilt);
* the key for a different request: :class:`IdempotencyKeyMismatch`;
* the key held by a run that has not finished: :class:`IdempotencyKeyInFlight`.

**Transactions.** On an idle connection the call opens and commits its own
transaction, so a permanent failure is durably recorded before its exception
reaches you. Inside a transaction you opened, everything happens in yours: a
result or a failure only counts once *you* commit, and if you roll back on the
exception the failure is forgotten too (the next call runs the handler again,
as after a transient failure).

**Namespaces.** Connector names (``[a-z0-9_-]``) are the file-drop and Kafka
namespaces and ``http:<connector>`` is ``idem serve``'s: give your handlers a
dotted namespace such as ``payments.charges`` so they never share keys with them.

Keys: :func:`parse_caller_key` validates a caller's ``Idempotency-Key``;
:func:`minted_key` / :func:`mint_key` derive the key of an *outbound* call from
its natural parts, so a retried handler sends the provider the same key again.
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import socket
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar, cast, overload

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from pydantic import BaseModel, ValidationError

from idem_platform.contract.keys import (
    MAX_KEY_LENGTH,
    content_hash,
    minted_key,
    parse_caller_key,
    record_key,
    record_key_of,
)
from idem_platform.errors import IdemError, KeyValidationError, TerminalError, TransientError
from idem_platform.ledger import (
    DEFAULT_REPLAY_WINDOW,
    NAMESPACE_PATTERN,
    Fresh,
    InFlight,
    Ledger,
    LedgerUsageError,
    Mismatch,
    Outcome,
    PriorError,
    PriorResult,
    purge_expired,
    request_hash,
)

__all__ = [
    "DEFAULT_REPLAY_WINDOW",
    "DEFAULT_TRANSIENT",
    "DEFAULT_WAIT_SECONDS",
    "MAX_KEY_LENGTH",
    "NAMESPACE_PATTERN",
    "Fresh",
    "IdempotencyError",
    "IdempotencyKeyInFlight",
    "IdempotencyKeyMismatch",
    "IdempotencyUsageError",
    "IdempotentFunction",
    "IncompatibleStoredResult",
    "InFlight",
    "KeyValidationError",
    "Ledger",
    "LedgerUsageError",
    "Mismatch",
    "Outcome",
    "PriorError",
    "PriorResult",
    "ReplayedError",
    "content_hash",
    "idempotent",
    "mint_key",
    "minted_key",
    "parse_caller_key",
    "purge_expired",
    "record_key",
    "record_key_of",
    "request_hash",
    "run_idempotently",
]

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
RequestT = TypeVar("RequestT", contravariant=True)
ResultT = TypeVar("ResultT", covariant=True)
ReqT = TypeVar("ReqT")
ResT = TypeVar("ResT")


def mint_key(*parts: str) -> str:
    """:func:`minted_key` of ``parts``: ``mint_key("tenant-1", "job-42", "1")``.

    The key of an outbound call, built from what identifies it (never from a
    clock or a random number), so the retry of a handler sends the same key.
    """
    return minted_key(parts)


# --------------------------------------------------------------------------- errors


class IdempotencyError(IdemError):
    """Base of the errors this module raises on purpose (idem's ``IdemError`` family).

    Each is also a ``TerminalError`` (same answer on every retry) or, for
    :class:`IdempotencyKeyInFlight` only, a ``TransientError`` (retry later).
    """


class IdempotencyUsageError(IdempotencyError, TerminalError, TypeError):
    """The library was misused (a result it cannot store, no key); nothing was recorded.

    The claim is released, so once the code is fixed the same key runs again.
    """


class IdempotencyKeyMismatch(IdempotencyError, TerminalError):
    """The key was used before for a different request; the recorded row is left as is.

    Attributes:
        namespace, key: the ledger row.
        recorded_hash: SHA-256 of the canonical JSON of the first request.
        submitted_hash: the same of this request.
    """

    def __init__(self, namespace: str, key: str, recorded_hash: str, submitted_hash: str) -> None:
        super().__init__(
            f"idempotency key {namespace}/{key} was already used for a different request "
            f"(recorded request hash {recorded_hash[:12]}…, this one {submitted_hash[:12]}…); "
            "use a new key for a new request"
        )
        self.namespace = namespace
        self.key = key
        self.recorded_hash = recorded_hash
        self.submitted_hash = submitted_hash


class IdempotencyKeyInFlight(IdempotencyError, TransientError):
    """Another run holds the key and has not finished: retry later.

    Attributes:
        namespace, key: the ledger row.
        owner: who claimed it (``host:pid`` for this module), when its claim is visible.
        attempts: its attempt number, when visible.
        waited_seconds: set when the other claim is still uncommitted and did not
            finish within the wait (its owner is then unknown).
    """

    def __init__(
        self,
        namespace: str,
        key: str,
        *,
        owner: str | None = None,
        attempts: int | None = None,
        waited_seconds: float | None = None,
    ) -> None:
        if waited_seconds is not None:
            detail = (
                f"another transaction has claimed it and not finished within {waited_seconds:g} s"
            )
        else:
            detail = f"it is in progress (owner {owner or 'unknown'}, attempt {attempts})"
        super().__init__(f"idempotency key {namespace}/{key} is in flight: {detail}; retry later")
        self.namespace = namespace
        self.key = key
        self.owner = owner
        self.attempts = attempts
        self.waited_seconds = waited_seconds


class IncompatibleStoredResult(IdempotencyError, TerminalError):
    """A stored result no longer decodes with the result model (the model changed since).

    The handler is not run again: its effects happened, only their answer is
    unreadable. Migrate or delete the row, or keep the model compatible.

    Attributes:
        namespace, key: the ledger row.
        model: the ``result_model`` that refused it.
        stored: the stored JSON.
        validation_error: pydantic's error (also the ``__cause__``).
    """

    def __init__(
        self,
        namespace: str,
        key: str,
        model: type[BaseModel],
        stored: dict[str, Any],
        validation_error: ValidationError,
    ) -> None:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '<root>'}: {error['msg']}"
            for error in validation_error.errors(include_url=False)
        )
        super().__init__(
            f"the stored result of {namespace}/{key} no longer decodes as "
            f"{model.__module__}.{model.__qualname__}: {problems}"
        )
        self.namespace = namespace
        self.key = key
        self.model = model
        self.stored = stored
        self.validation_error = validation_error


class ReplayedError(IdempotencyError, TerminalError):
    """A stored permanent error whose class cannot be rebuilt here; ``str()`` is its message.

    Attributes:
        namespace, key: the ledger row.
        error_class: the original ``module.QualName``.
        message: the original ``str(exc)``.
        attempts: the attempt that failed.
    """

    def __init__(
        self, namespace: str, key: str, error_class: str, message: str, attempts: int
    ) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.key = key
        self.error_class = error_class
        self.message = message
        self.attempts = attempts


# --------------------------------------------------------------------------- the call


class IdempotentFunction(Protocol[RequestT, ResultT]):
    """What :func:`idempotent` returns: the function, plus an optional explicit key."""

    def __call__(
        self,
        conn: psycopg.Connection[Any],
        request: RequestT,
        *,
        idempotency_key: str | None = None,
    ) -> ResultT: ...


@dataclass(frozen=True)
class _Done:
    value: Any


@dataclass(frozen=True)
class _Failed:
    """A permanent failure recorded in the transaction; raised once that transaction commits."""

    error: BaseException


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
    return _run_idempotently(
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


def _run_idempotently(
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
    call = _Call(
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
    verdict: _Done | _Failed | None = None
    if status == TransactionStatus.INTRANS:
        verdict = call.run(own_transaction=False)
    elif status == TransactionStatus.IDLE:
        try:
            with conn.transaction():
                verdict = call.run(own_transaction=True)
        except psycopg.OperationalError as exc:
            if not isinstance(verdict, _Failed):
                raise
            # The commit that would record the failure failed: it is still the handler's error.
            verdict.error.add_note(f"its failure could not be recorded: {exc!r}")
            raise verdict.error from None
    else:
        raise LedgerUsageError(
            "run_idempotently needs an idle connection or an open transaction, "
            f"not one that is {status.name} (roll back a failed transaction first)"
        )
    if isinstance(verdict, _Failed):
        raise verdict.error
    if verdict is None:  # unreachable: both branches above set it or raised
        raise LedgerUsageError("run_idempotently finished without an answer")
    return verdict.value


@dataclass
class _Call:
    conn: psycopg.Connection[Any]
    ledger: Ledger
    key: str
    request: Any
    handler: Callable[[], Any]
    result_model: type[BaseModel] | None
    transient: tuple[type[BaseException], ...]
    wait_seconds: float | None
    owner: str

    @property
    def namespace(self) -> str:
        return self.ledger.namespace

    def run(self, *, own_transaction: bool) -> _Done | _Failed:
        outcome = self._claim(protect=not own_transaction)
        if isinstance(outcome, PriorResult):
            return _Done(self._decode(outcome.result))
        if isinstance(outcome, PriorError):
            raise _rebuild_error(self.namespace, self.key, outcome.error, outcome.attempts)
        if isinstance(outcome, Mismatch):
            raise IdempotencyKeyMismatch(
                self.namespace, self.key, outcome.recorded_hash, outcome.submitted_hash
            )
        if isinstance(outcome, InFlight):
            raise IdempotencyKeyInFlight(
                self.namespace, self.key, owner=outcome.owner, attempts=outcome.attempts
            )
        return self._execute()

    def _claim(self, *, protect: bool) -> Outcome:
        """``begin`` with a bounded wait for a concurrent, uncommitted claim.

        ``begin``'s INSERT blocks on another transaction's uncommitted row for the
        same key until that transaction ends (then it sees the committed row: under
        READ COMMITTED the outcome is a replay). ``lock_timeout`` bounds that wait;
        inside the caller's transaction a savepoint keeps the timeout from aborting
        it, and the previous timeout is restored so the handler's locks are not
        affected.
        """
        if self.wait_seconds is None:
            return self.ledger.begin(self.key, self.request, owner=self.owner)
        timeout = f"{max(1, round(self.wait_seconds * 1000))}ms"  # 0 would mean "no limit"
        try:
            with self.conn.transaction() if protect else nullcontext():
                row = self.conn.execute(_SET_LOCK_TIMEOUT, [timeout]).fetchone()
                outcome = self.ledger.begin(self.key, self.request, owner=self.owner)
                self.conn.execute(_RESTORE_LOCK_TIMEOUT, [row[0] if row else "0"])
        except pg_errors.LockNotAvailable as exc:
            raise IdempotencyKeyInFlight(
                self.namespace, self.key, waited_seconds=self.wait_seconds
            ) from exc
        return outcome

    def _execute(self) -> _Done | _Failed:
        """Run the handler in a savepoint; store its result, or record or release its failure.

        The savepoint is what lets a failing handler's writes roll back while the
        claim survives to record the failure. The result is stored inside it too,
        so a result the database refuses also undoes the handler's writes.
        """
        try:
            with self.conn.transaction():
                produced = self.handler()
                stored, value = _encode(produced, self.result_model, self.namespace, self.key)
                try:
                    self.ledger.commit(self.key, stored, owner=self.owner)
                except psycopg.DataError as exc:  # e.g. "\u0000", which jsonb refuses
                    raise IdempotencyUsageError(
                        f"the result of {self.namespace}/{self.key} cannot be stored: {exc}"
                    ) from exc
        except IdempotencyUsageError:
            self._release()
            raise
        except self.transient:
            self._release()
            raise
        except Exception as exc:
            if self.conn.broken:  # the claim dies with the transaction: nothing to record
                raise
            self.ledger.fail_permanent(self.key, _error_document(exc), owner=self.owner)
            return _Failed(exc)
        return _Done(value)

    def _release(self) -> None:
        """Delete the claim so the next call runs again (a lost connection already lost it)."""
        if not self.conn.broken:
            self.ledger.fail_transient(self.key, owner=self.owner)

    def _decode(self, stored: dict[str, Any]) -> Any:
        if self.result_model is None:
            return stored
        try:
            return self.result_model.model_validate(stored)
        except ValidationError as exc:
            raise IncompatibleStoredResult(
                self.namespace, self.key, self.result_model, stored, exc
            ) from exc


# Read the timeout in force before setting ours, in one round trip; the materialized CTE
# fixes the order (it is evaluated before the set_config of the outer query).
_SET_LOCK_TIMEOUT = (
    "WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value) "
    "SELECT value, set_config('lock_timeout', %s, true) FROM previous"
)
_RESTORE_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"


def _encode(
    produced: Any, result_model: type[BaseModel] | None, namespace: str, key: str
) -> tuple[dict[str, Any], Any]:
    """The JSON to store and the value to return, which is what a replay will return.

    Decoding our own output on the first call means a result model whose dump
    does not validate back fails now, while the claim can still be released,
    rather than on every later replay.
    """
    where = f"{namespace}/{key}"
    if result_model is not None:
        if not isinstance(produced, result_model):
            raise IdempotencyUsageError(
                f"the handler of {where} returned {type(produced).__name__}, "
                f"not the result_model {result_model.__name__}"
            )
        document: Any = produced.model_dump(mode="json")
    elif isinstance(produced, BaseModel):
        raise IdempotencyUsageError(
            f"the handler of {where} returned a {type(produced).__name__} model: "
            "pass result_model so replays can decode it"
        )
    elif isinstance(produced, dict):
        document = produced
    else:
        raise IdempotencyUsageError(
            f"the handler of {where} returned {type(produced).__name__}: return a dict of JSON "
            "values ({} when there is nothing to report) or a result_model instance"
        )
    try:
        stored = json.loads(json.dumps(document, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise IdempotencyUsageError(f"the result of {where} is not JSON: {exc}") from exc
    if result_model is None:
        return stored, stored
    try:
        return stored, result_model.model_validate(stored)
    except ValidationError as exc:
        raise IdempotencyUsageError(
            f"the result of {where} does not decode back as {result_model.__name__} "
            f"from its own JSON dump, so it could never be replayed: {exc}"
        ) from exc


# --------------------------------------------------------------------------- stored errors


def _error_document(exc: BaseException) -> dict[str, Any]:
    """What a permanent failure stores: enough to raise the same class and message again."""
    cls = type(exc)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc),
        "retryable": False,
    }


def _exception_class(name: str) -> type[Exception] | None:
    """The exception class a stored ``module.QualName`` names, if this process has it loaded.

    Only modules already imported are searched: a database row must not make us
    import code. A handler's module normally imports the errors it raises, so
    the class is there whenever the handler could have raised it.
    """
    parts = name.split(".")
    candidates: list[tuple[Any, list[str]]] = [(builtins, parts)] if len(parts) == 1 else []
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if module is not None:
            candidates.append((module, parts[split:]))
    for found, path in candidates:
        for attribute in path:
            found = getattr(found, attribute, None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    return None


def _rebuild_error(namespace: str, key: str, document: dict[str, Any], attempts: int) -> Exception:
    """The stored error as an exception: its class built from the message, else ReplayedError."""
    name = str(document.get("class") or "")
    message = str(document.get("message", ""))
    error: Exception | None = None
    cls = _exception_class(name) if name else None
    if cls is not None:
        try:
            error = cls(message)
        except Exception:  # needs other arguments: keep name and message generically
            error = None
    if error is None:
        error = ReplayedError(namespace, key, name or "<unknown>", message, attempts)
    error.add_note(
        f"replayed from the idempotency ledger: {namespace}/{key} failed permanently "
        f"(attempt {attempts}, {name or 'unknown class'}); the handler did not run again"
    )
    return error


# --------------------------------------------------------------------------- the decorator


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
            result: ResT = _run_idempotently(
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
