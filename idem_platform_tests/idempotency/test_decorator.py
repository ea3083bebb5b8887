"""@idempotent (idem_platform.idempotency.decorator): end to end, and its key and namespace checks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from idem_platform.idempotency import (
    IdempotencyUsageError,
    KeyValidationError,
    idempotent,
    mint_key,
)
from idem_platform.postgres import connect
from idem_platform_tests.helpers.idempotency import (
    NS,
    ChargeRequest,
    Receipt,
    ledger_row,
    side_effects,
)


def test_the_decorator_wraps_a_handler_end_to_end(url: str) -> None:
    calls: list[str] = []

    @idempotent(NS, key=lambda request: mint_key("order", request.order_id), result_model=Receipt)
    def charge(conn: psycopg.Connection, request: ChargeRequest) -> Receipt:
        """Charge an order."""
        calls.append(request.order_id)
        conn.execute("INSERT INTO public.side_effects VALUES (%s, 'charged')", [request.order_id])
        return Receipt(
            charge_id=f"ch_{request.order_id}",
            cents=request.cents,
            issued=datetime(2026, 1, 1, tzinfo=UTC),
        )

    assert charge.__name__ == "charge" and charge.__doc__ == "Charge an order."
    assert charge.__wrapped__ is not None  # type: ignore[attr-defined]
    request = ChargeRequest(order_id="o-20", cents=700)
    with connect(url) as conn:
        first = charge(conn, request)
        assert charge(conn, request) == first and isinstance(first, Receipt)
        assert calls == ["o-20"]
        assert ledger_row(url, mint_key("order", "o-20")) is not None

        # An explicit key (a caller's Idempotency-Key header) wins, trimmed.
        explicit = charge(conn, request, idempotency_key="  header-key-1 ")
        assert calls == ["o-20", "o-20"] and explicit.charge_id == "ch_o-20"
        assert ledger_row(url, "header-key-1") is not None
        charge(conn, request, idempotency_key="header-key-1")
        assert calls == ["o-20", "o-20"]
        with pytest.raises(KeyValidationError, match="blank"):
            charge(conn, request, idempotency_key="   ")
    assert side_effects(url, "o-20") == 2


def test_the_decorator_needs_a_key_and_a_valid_namespace(url: str) -> None:
    @idempotent("payments.refunds")
    def refund(conn: psycopg.Connection, request: dict[str, Any]) -> dict[str, Any]:
        return {"refunded": request["id"]}

    with connect(url) as conn:
        with pytest.raises(KeyValidationError, match="needs an idempotency key"):
            refund(conn, {"id": 1})
        assert refund(conn, {"id": 1}, idempotency_key="r-1") == {"refunded": 1}

        @idempotent("payments.refunds", key=lambda request: request["id"])
        def by_number(conn: psycopg.Connection, request: dict[str, Any]) -> dict[str, Any]:
            return {}

        with pytest.raises(IdempotencyUsageError, match="returned int, not str"):
            by_number(conn, {"id": 1})
    with pytest.raises(ValueError, match="namespace"):
        idempotent("Payments/Refunds")
