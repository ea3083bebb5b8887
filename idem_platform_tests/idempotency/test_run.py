"""run_idempotently (idem_platform.idempotency.run) against real PostgreSQL: a fresh call runs once and a
replay returns its answer; transient errors release the key; mismatches and misuse are refused."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from idem_platform.idempotency import (
    IdempotencyKeyMismatch,
    IdempotencyUsageError,
    KeyValidationError,
    LedgerUsageError,
    request_hash,
    run_idempotently,
)
from idem_platform.postgres import connect
from idem_platform_tests.helpers.idempotency import (
    NS,
    CardDeclined,
    Counter,
    Receipt,
    ledger_row,
    side_effects,
)


def test_fresh_runs_the_handler_once_and_stores_its_result_with_its_writes(url: str) -> None:
    request = {"order": "o-1", "cents": 500}
    with connect(url) as conn:
        counter = Counter(conn, "k1")
        answer = run_idempotently(
            conn, NS, "k1", request, counter.returning({"charge": "ch_1", "n": 1})
        )
        assert answer == {"charge": "ch_1", "n": 1}
        assert counter.calls == 1
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed
    row = ledger_row(url, "k1")
    assert row is not None
    assert row["status"] == "committed" and row["result"] == {"charge": "ch_1", "n": 1}
    assert row["request_hash"] == request_hash(request) and row["attempts"] == 1
    assert side_effects(url, "k1") == 1


def test_replay_returns_the_stored_result_without_running_the_handler(url: str) -> None:
    request = {"order": "o-2"}
    with connect(url) as first:
        counter = Counter(first, "k2")
        handler = counter.returning({"charge": "ch_2", "keys": {"1": [1, 2.5, None, True]}})
        original = run_idempotently(first, NS, "k2", request, handler)
        assert run_idempotently(first, NS, "k2", request, handler) == original
    with connect(url, autocommit=True) as second:  # another connection (process) replays too
        assert (
            run_idempotently(second, NS, "k2", dict(reversed(request.items())), handler) == original
        )
    assert counter.calls == 1
    assert side_effects(url, "k2") == 1


def test_the_first_answer_is_what_replays_return(url: str) -> None:
    """A tuple or an int key comes back as JSON turns it: the first call returns the same."""
    with connect(url) as conn:
        handler = Counter(conn, "k3").returning({"pair": (1, 2), 7: "seven"})
        first = run_idempotently(conn, NS, "k3", {}, handler)
        assert (
            first == {"pair": [1, 2], "7": "seven"} == run_idempotently(conn, NS, "k3", {}, handler)
        )


def test_a_transient_error_releases_the_key_and_the_next_call_runs(url: str) -> None:
    with connect(url) as conn:
        counter = Counter(conn, "k8")
        with pytest.raises(TimeoutError):
            run_idempotently(
                conn, NS, "k8", {}, counter.raising(TimeoutError("provider timed out"))
            )
        assert ledger_row(url, "k8") is None and side_effects(url, "k8") == 0
        assert run_idempotently(conn, NS, "k8", {}, counter.returning({"ok": True})) == {"ok": True}
        assert counter.calls == 2

        # The caller decides what is transient.
        with pytest.raises(CardDeclined):
            run_idempotently(
                conn,
                NS,
                "k8b",
                {},
                counter.raising(CardDeclined("try later")),
                transient=(CardDeclined,),
            )
        assert ledger_row(url, "k8b") is None


def test_a_mismatch_raises_and_leaves_the_first_row_untouched(url: str) -> None:
    first, second = {"order": "o-9", "cents": 500}, {"order": "o-9", "cents": 900}
    with connect(url) as conn:
        counter = Counter(conn, "k9")
        run_idempotently(conn, NS, "k9", first, counter.returning({"charge": "ch_9"}))
        before = ledger_row(url, "k9")
        with pytest.raises(IdempotencyKeyMismatch) as caught:
            run_idempotently(conn, NS, "k9", second, counter.returning({"charge": "other"}))
    assert caught.value.recorded_hash == request_hash(first)
    assert caught.value.submitted_hash == request_hash(second)
    assert (caught.value.namespace, caught.value.key) == (NS, "k9")
    assert counter.calls == 1
    assert ledger_row(url, "k9") == before  # hash, status, result, attempts, updated_at


def test_usage_errors_release_the_key(url: str) -> None:
    with connect(url) as conn:
        counter = Counter(conn, "k10")
        with pytest.raises(IdempotencyUsageError, match="returned list"):
            run_idempotently(conn, NS, "k10", {}, counter.returning([1, 2]))
        with pytest.raises(IdempotencyUsageError, match="pass result_model"):
            run_idempotently(
                conn,
                NS,
                "k10",
                {},
                counter.returning(Receipt(charge_id="c", cents=1, issued=datetime.now(UTC))),
            )
        with pytest.raises(IdempotencyUsageError, match="not JSON"):
            run_idempotently(conn, NS, "k10", {}, counter.returning({"x": float("nan")}))
        with pytest.raises(IdempotencyUsageError, match="cannot be stored"):
            run_idempotently(conn, NS, "k10", {}, counter.returning({"x": "nul\u0000"}))
        assert ledger_row(url, "k10") is None and side_effects(url, "k10") == 0
        assert run_idempotently(conn, NS, "k10", {}, counter.returning({})) == {}
        with pytest.raises(KeyValidationError):
            run_idempotently(conn, NS, "  ", {}, counter.returning({}))
        with pytest.raises(ValueError, match="namespace"):
            run_idempotently(conn, "Payments Charges", "k", {}, counter.returning({}))


def test_a_failed_transaction_is_refused(url: str) -> None:
    with connect(url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(LedgerUsageError, match="roll back"):
            run_idempotently(conn, NS, "k17", {}, lambda: {})
