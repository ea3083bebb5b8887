"""One call against the ledger: claim the key, then replay, refuse, or run the handler in a savepoint.

:class:`Call` is the transaction-level work of
:func:`~idem_platform.idempotency.run.run_idempotently` once it has decided
whose transaction it runs in: the bounded wait for a concurrent claim
(``lock_timeout``), the savepoint that lets a failing handler's writes roll back
while its claim survives, and what is recorded or released for each outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from pydantic import BaseModel, ValidationError

from idem_platform.idempotency.errors import (
    IdempotencyKeyInFlight,
    IdempotencyKeyMismatch,
    IdempotencyUsageError,
    IncompatibleStoredResult,
)
from idem_platform.idempotency.stored import encode_result, error_document, rebuild_error
from idem_platform.ledger import InFlight, Ledger, Mismatch, Outcome, PriorError, PriorResult


@dataclass(frozen=True)
class Done:
    value: Any


@dataclass(frozen=True)
class Failed:
    """A permanent failure recorded in the transaction; raised once that transaction commits."""

    error: BaseException


@dataclass
class Call:
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

    def run(self, *, own_transaction: bool) -> Done | Failed:
        outcome = self._claim(protect=not own_transaction)
        if isinstance(outcome, PriorResult):
            return Done(self._decode(outcome.result))
        if isinstance(outcome, PriorError):
            raise rebuild_error(self.namespace, self.key, outcome.error, outcome.attempts)
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

    def _execute(self) -> Done | Failed:
        """Run the handler in a savepoint; store its result, or record or release its failure.

        The savepoint is what lets a failing handler's writes roll back while the
        claim survives to record the failure. The result is stored inside it too,
        so a result the database refuses also undoes the handler's writes.
        """
        try:
            with self.conn.transaction():
                produced = self.handler()
                stored, value = encode_result(produced, self.result_model, self.namespace, self.key)
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
            self.ledger.fail_permanent(self.key, error_document(exc), owner=self.owner)
            return Failed(exc)
        return Done(value)

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

