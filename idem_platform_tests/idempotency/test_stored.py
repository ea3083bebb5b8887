"""What the ledger stores of an answer (idem_platform.idempotency.stored): typed results round-trip, and a
permanent error replays as its own class, or as ReplayedError when it cannot be rebuilt."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from idem_platform.errors import TerminalError
from idem_platform.idempotency import (
    Fresh,
    IncompatibleStoredResult,
    Ledger,
    ReplayedError,
    request_hash,
    run_idempotently,
)
from idem_platform.postgres import connect
from idem_platform_tests.helpers.idempotency import (
    NS,
    CardDeclined,
    ChargeRequest,
    Counter,
    Receipt,
    ledger_row,
    side_effects,
)


class ReceiptWithCurrency(BaseModel):
    """Receipt, a release later: a required field old stored results do not have."""

    charge_id: str
    cents: int
    issued: datetime
    currency: str


class NeedsTwoArguments(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code}: {reason}")


def test_typed_results_round_trip_through_the_model(url: str) -> None:
    request = ChargeRequest(order_id="o-4", cents=1250)
    receipt = Receipt(charge_id="ch_4", cents=1250, issued=datetime(2026, 5, 1, 12, 30, tzinfo=UTC))
    with connect(url) as conn:
        counter = Counter(conn, "k4")
        fresh = run_idempotently(
            conn, NS, "k4", request, counter.returning(receipt), result_model=Receipt
        )
        replayed = run_idempotently(
            conn, NS, "k4", request, counter.returning(receipt), result_model=Receipt
        )
    assert isinstance(fresh, Receipt) and isinstance(replayed, Receipt)
    assert fresh == replayed == receipt
    assert counter.calls == 1
    row = ledger_row(url, "k4")
    assert row is not None
    assert row["result"] == receipt.model_dump(mode="json")
    # A model request is hashed as its JSON dump: the equivalent dict is the same request.
    assert row["request_hash"] == request_hash({"order_id": "o-4", "cents": 1250})


def test_a_stored_result_that_no_longer_decodes_is_an_explicit_error(url: str) -> None:
    receipt = Receipt(charge_id="ch_5", cents=1, issued=datetime(2026, 5, 1, tzinfo=UTC))
    with connect(url) as conn:
        counter = Counter(conn, "k5")
        run_idempotently(conn, NS, "k5", {}, counter.returning(receipt), result_model=Receipt)
        with pytest.raises(IncompatibleStoredResult) as caught:
            run_idempotently(
                conn, NS, "k5", {}, counter.returning(receipt), result_model=ReceiptWithCurrency
            )
    error = caught.value
    assert counter.calls == 1  # the effects happened once; only their answer is unreadable
    assert (error.namespace, error.key, error.model) == (NS, "k5", ReceiptWithCurrency)
    assert error.stored == receipt.model_dump(mode="json")
    assert "payments.charges/k5" in str(error) and "ReceiptWithCurrency" in str(error)
    assert "currency: Field required" in str(error)
    assert isinstance(error, TerminalError)
    assert ledger_row(url, "k5")["status"] == "committed"  # untouched


def test_a_permanent_error_is_recorded_and_replayed_as_the_same_class(url: str) -> None:
    with connect(url) as conn:
        counter = Counter(conn, "k6")
        with pytest.raises(CardDeclined, match="^card 4242 declined$"):
            run_idempotently(
                conn, NS, "k6", {}, counter.raising(CardDeclined("card 4242 declined"))
            )
        # Recorded and committed before the exception reached us; the handler's write rolled back.
        row = ledger_row(url, "k6")
        assert row is not None and row["status"] == "failed"
        assert row["error"] == {
            "class": "idem_platform_tests.helpers.idempotency.CardDeclined",
            "message": "card 4242 declined",
            "retryable": False,
        }
        assert side_effects(url, "k6") == 0
        with pytest.raises(CardDeclined) as replayed:
            run_idempotently(conn, NS, "k6", {}, counter.raising(RuntimeError("must not run")))
        assert str(replayed.value) == "card 4242 declined"  # (pytest's match= also reads notes)
        assert counter.calls == 1
        assert any("did not run again" in note for note in replayed.value.__notes__)
        # Builtins replay too.
        with pytest.raises(ValueError, match="^amount must be positive$"):
            run_idempotently(
                conn, NS, "k6b", {}, counter.raising(ValueError("amount must be positive"))
            )
        with pytest.raises(ValueError) as replayed_builtin:
            run_idempotently(conn, NS, "k6b", {}, counter.raising(RuntimeError("must not run")))
        assert type(replayed_builtin.value) is ValueError
        assert str(replayed_builtin.value) == "amount must be positive"
        assert counter.calls == 2


def test_an_error_class_that_cannot_be_rebuilt_replays_as_replayed_error(url: str) -> None:
    class LocalOnly(Exception):  # "<locals>" in its qualified name: not findable later
        pass

    with connect(url) as conn:
        counter = Counter(conn, "k7")
        with pytest.raises(LocalOnly):
            run_idempotently(conn, NS, "k7", {}, counter.raising(LocalOnly("gone with the frame")))
        with pytest.raises(ReplayedError) as caught:
            run_idempotently(conn, NS, "k7", {}, counter.raising(LocalOnly("x")))
        error = caught.value
        assert str(error) == error.message == "gone with the frame"
        assert error.error_class.endswith("LocalOnly") and "<locals>" in error.error_class
        assert (error.namespace, error.key, error.attempts) == (NS, "k7", 1)

        # A class that needs more than a message cannot be rebuilt faithfully either.
        with pytest.raises(NeedsTwoArguments):
            run_idempotently(
                conn, NS, "k7b", {}, counter.raising(NeedsTwoArguments(402, "no funds"))
            )
        with pytest.raises(ReplayedError) as caught:
            run_idempotently(conn, NS, "k7b", {}, counter.raising(RuntimeError("must not run")))
        assert str(caught.value) == "402: no funds"
        assert caught.value.error_class == "idem_platform_tests.idempotency.test_stored.NeedsTwoArguments"

        # A row naming a module this process never imported: nothing is imported for it.
        with conn.transaction():
            ledger = Ledger(conn, NS)
            assert ledger.begin("k7c", {}) == Fresh()
            ledger.fail_permanent("k7c", {"class": "not_imported_anywhere.Boom", "message": "boom"})
        with pytest.raises(ReplayedError) as caught:
            run_idempotently(conn, NS, "k7c", {}, counter.raising(RuntimeError("must not run")))
        assert (
            str(caught.value) == "boom" and caught.value.error_class == "not_imported_anywhere.Boom"
        )
        assert counter.calls == 2


def test_the_librarys_own_errors_are_stored_under_the_public_package(url: str) -> None:
    """A permanent failure stores its class as ``module.QualName``: the library's errors are
    named where users import them (``idem_platform.idempotency``), not by the module inside
    the package that defines them, so ledger rows keep the names they always had."""
    with connect(url) as conn:
        counter = Counter(conn, "k-lib")
        nested = ReplayedError("other.namespace", "k0", "x.Boom", "declined upstream", 1)
        with pytest.raises(ReplayedError):
            run_idempotently(conn, NS, "k-lib", {}, counter.raising(nested))
        row = ledger_row(url, "k-lib")
        assert row is not None and row["error"]["class"] == "idem_platform.idempotency.ReplayedError"
        with pytest.raises(ReplayedError) as caught:
            run_idempotently(conn, NS, "k-lib", {}, counter.raising(RuntimeError("must not run")))
        assert caught.value.error_class == "idem_platform.idempotency.ReplayedError"
        assert str(caught.value) == "declined upstream" and counter.calls == 1
