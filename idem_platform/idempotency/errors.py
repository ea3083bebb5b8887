"""The errors of the idempotency library, each with the ledger row it is about.

Apart because every other module of the package raises them and users catch
them (re-exported from :mod:`idem_platform.idempotency`). Their ``__module__`` is
set to the package: a permanent failure stores its class as ``module.QualName``
in the ledger, and those names (and tracebacks) read as they did before the
split into modules.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from idem_platform.errors import IdemError, TerminalError, TransientError


class IdempotencyError(IdemError):
    """Base of the errors this package raises on purpose (idem's ``IdemError`` family).

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


# Stored and shown as ``idem_platform.idempotency.<Name>``, the documented place to import them from.
for _error in (
    IdempotencyError,
    IdempotencyUsageError,
    IdempotencyKeyMismatch,
    IdempotencyKeyInFlight,
    IncompatibleStoredResult,
    ReplayedError,
):
    _error.__module__ = "idem_platform.idempotency"
