"""The idempotency ledger as a library for the user's own idempotent handlers.

idem keeps one ledger (``idem.ingest_ledger``, DESIGN §4) for its own file-drop,
Kafka and HTTP paths. This package lends it to your code: wrap a function that
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

This package's modules, for reading it (import from here: the names below are
its public API): :mod:`.run` (:func:`run_idempotently`, the defaults),
:mod:`.call` (one call's transaction work), :mod:`.stored` (results and errors as
stored and replayed), :mod:`.decorator` (``@idempotent``), :mod:`.errors`,
:mod:`.keys` (:func:`mint_key`).
"""

from idem_platform.contract.keys import (
    MAX_KEY_LENGTH,
    content_hash,
    minted_key,
    parse_caller_key,
    record_key,
    record_key_of,
)
from idem_platform.errors import KeyValidationError
from idem_platform.idempotency.decorator import IdempotentFunction, idempotent
from idem_platform.idempotency.errors import (
    IdempotencyError,
    IdempotencyKeyInFlight,
    IdempotencyKeyMismatch,
    IdempotencyUsageError,
    IncompatibleStoredResult,
    ReplayedError,
)
from idem_platform.idempotency.keys import mint_key
from idem_platform.idempotency.run import DEFAULT_TRANSIENT, DEFAULT_WAIT_SECONDS, run_idempotently
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
