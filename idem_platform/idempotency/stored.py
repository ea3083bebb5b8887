"""What the ledger stores of a handler's answer, and how a replay reads it back.

A result is stored as JSON (checked to decode back before it is committed); a
permanent failure as its class name and message, rebuilt as the same class on a
replay (:class:`~idem_platform.idempotency.errors.ReplayedError` when it cannot
be). Apart from :mod:`.call` because these are pure conversions, with no
connection or transaction.
"""

from __future__ import annotations

import builtins
import json
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

from idem_platform.idempotency.errors import IdempotencyUsageError, ReplayedError


def encode_result(
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


def error_document(exc: BaseException) -> dict[str, Any]:
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


def rebuild_error(namespace: str, key: str, document: dict[str, Any], attempts: int) -> Exception:
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

