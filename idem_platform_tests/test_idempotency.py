"""The ledger as a library (idem_platform.idempotency): every outcome against real PostgreSQL,
a 16-process race for one key, the decorator, the typed results and the public keys."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from idem_platform import idempotency
from idem_platform.errors import TerminalError, TransientError
from idem_platform.idempotency import (
    Fresh,
    IdempotencyKeyInFlight,
    IdempotencyKeyMismatch,
    IdempotencyUsageError,
    IncompatibleStoredResult,
    KeyValidationError,
    Ledger,
    LedgerUsageError,
    ReplayedError,
    idempotent,
    mint_key,
    minted_key,
    parse_caller_key,
    request_hash,
    run_idempotently,
)
from idem_platform.postgres import connect
from idem_platform_tests.helpers import idempotency_race
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.paths import SPEC_DIR

NS = "payments.charges"


class ChargeRequest(BaseModel):
    order_id: str
    cents: int


class Receipt(BaseModel):
    charge_id: str
    cents: int
    issued: datetime


class ReceiptWithCurrency(BaseModel):
    """Receipt, a release later: a required field old stored results do not have."""

    charge_id: str
    cents: int
    issued: datetime
    currency: str


class CardDeclined(Exception):
    """A user's permanent error, importable by name (module level)."""


class NeedsTwoArguments(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code}: {reason}")


@pytest.fixture
def url(pg_url: str) -> str:
    reset_database(pg_url)
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.side_effects, public.race_runs")
        conn.execute("CREATE TABLE public.side_effects (key text, note text)")
        conn.execute("CREATE TABLE public.race_runs (runner int)")
    return pg_url


class Counter:
    """A handler factory that counts its runs and leaves a row in ``side_effects`` each time."""

    def __init__(self, conn: psycopg.Connection, key: str) -> None:
        self.conn = conn
        self.key = key
        self.calls = 0

    def returning(self, result: Any) -> Any:
        def handler() -> Any:
            self.calls += 1
            self.conn.execute("INSERT INTO public.side_effects VALUES (%s, 'ran')", [self.key])
            return result

        return handler

    def raising(self, error: BaseException) -> Any:
        def handler() -> Any:
            self.calls += 1
            self.conn.execute("INSERT INTO public.side_effects VALUES (%s, 'ran')", [self.key])
            raise error

        return handler


def ledger_row(url: str, key: str, namespace: str = NS) -> dict[str, Any] | None:
    with connect(url, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT request_hash, status, result, error, attempts, owner, updated_at "
            "FROM idem.ingest_ledger WHERE namespace = %s AND key = %s",
            [namespace, key],
        )
        row = cur.fetchone()
        return dict(zip([c.name for c in cur.description], row, strict=True)) if row else None


def side_effects(url: str, key: str) -> int:
    with connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM public.side_effects WHERE key = %s", [key]
        ).fetchone()[0]


# ----------------------------------------------------------------- fresh and replay


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


# ----------------------------------------------------------------- errors


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
            "class": "idem_platform_tests.test_idempotency.CardDeclined",
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
        assert caught.value.error_class == "idem_platform_tests.test_idempotency.NeedsTwoArguments"

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


# ----------------------------------------------------------------- in flight and transactions


def test_an_uncommitted_claim_elsewhere_is_in_flight_not_a_hang(url: str) -> None:
    with connect(url) as other, connect(url) as conn:
        with other.transaction():
            assert Ledger(other, NS).begin("k11", {}, owner="other") == Fresh()
            counter = Counter(conn, "k11")
            started = time.monotonic()
            with pytest.raises(IdempotencyKeyInFlight) as caught:
                run_idempotently(conn, NS, "k11", {}, counter.returning({}), wait_seconds=0.5)
            assert 0.4 < time.monotonic() - started < 5
            assert caught.value.waited_seconds == 0.5 and isinstance(caught.value, TransientError)

            # Inside the caller's transaction: it survives the timeout (a savepoint), and its
            # own lock_timeout is back once the call returns.
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '7s'")
                with pytest.raises(IdempotencyKeyInFlight):
                    run_idempotently(conn, NS, "k11", {}, counter.returning({}), wait_seconds=0.2)
                assert conn.execute("SHOW lock_timeout").fetchone()[0] == "7s"
            assert counter.calls == 0
            Ledger(other, NS).commit("k11", {"done": "elsewhere"}, owner="other")
        assert run_idempotently(conn, NS, "k11", {}, counter.returning({})) == {"done": "elsewhere"}


def test_a_claim_that_commits_while_we_wait_is_replayed(url: str) -> None:
    with connect(url) as other, connect(url) as conn:
        other.execute("SELECT 1")  # opens its transaction (not autocommit)
        assert Ledger(other, NS).begin("k12", {}) == Fresh()
        Ledger(other, NS).commit("k12", {"winner": "other"})
        committer = threading.Timer(0.3, other.commit)
        committer.start()
        counter = Counter(conn, "k12")
        assert run_idempotently(conn, NS, "k12", {}, counter.returning({}), wait_seconds=30) == {
            "winner": "other"
        }
        committer.join()
        assert counter.calls == 0

        # The handler runs under the session's lock_timeout, not the wait's.
        def show_lock_timeout() -> dict[str, Any]:
            return {"lock_timeout": conn.execute("SHOW lock_timeout").fetchone()[0]}

        with conn.transaction():
            assert run_idempotently(conn, NS, "k12b", {}, show_lock_timeout) == {
                "lock_timeout": "0"
            }
        assert run_idempotently(conn, NS, "k12c", {}, show_lock_timeout) == {"lock_timeout": "0"}


def test_a_committed_claim_in_progress_is_in_flight_with_its_owner(url: str) -> None:
    with connect(url) as conn:
        with conn.transaction():
            Ledger(conn, NS).begin("k13", {}, owner="worker-7")  # a run that died mid-way
        with pytest.raises(IdempotencyKeyInFlight) as caught:
            run_idempotently(conn, NS, "k13", {}, Counter(conn, "k13").returning({}))
    assert (caught.value.owner, caught.value.attempts, caught.value.waited_seconds) == (
        "worker-7",
        1,
        None,
    )


def test_inside_the_callers_transaction_everything_waits_for_the_caller(url: str) -> None:
    with connect(url) as conn:
        counter = Counter(conn, "k14")
        with conn.transaction():
            assert run_idempotently(conn, NS, "k14", {}, counter.returning({"n": 1})) == {"n": 1}
            assert ledger_row(url, "k14") is None  # not visible before the caller commits
        assert ledger_row(url, "k14")["result"] == {"n": 1}

        # A caller that rolls back on the exception forgets the failure as well.
        with pytest.raises(CardDeclined), conn.transaction():
            run_idempotently(conn, NS, "k15", {}, counter.raising(CardDeclined("declined")))
        assert ledger_row(url, "k15") is None
        assert run_idempotently(conn, NS, "k15", {}, counter.returning({"n": 2})) == {"n": 2}

        # One that catches it and commits keeps it, with the handler's writes undone.
        with conn.transaction():
            with pytest.raises(CardDeclined):
                run_idempotently(conn, NS, "k16", {}, counter.raising(CardDeclined("declined")))
            conn.execute("INSERT INTO public.side_effects VALUES ('k16', 'caller')")
        assert ledger_row(url, "k16")["status"] == "failed"
        assert side_effects(url, "k16") == 1  # the caller's row only


def test_a_failed_transaction_is_refused(url: str) -> None:
    with connect(url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(LedgerUsageError, match="roll back"):
            run_idempotently(conn, NS, "k17", {}, lambda: {})


def test_sixteen_processes_race_for_one_key(url: str) -> None:
    """All ask at once: one Fresh, every other one a replay of its result (or in flight); the
    wrapper runs its handler exactly once and all sixteen get the winner's answer."""
    processes = 16
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results = context.Queue()
    namespaces = ("race.begin", "race.run")
    children = [
        context.Process(
            target=idempotency_race.race, args=(url, namespaces, index, barrier, results)
        )
        for index in range(processes)
    ]
    for child in children:
        child.start()
    try:
        reports = [results.get(timeout=180) for _ in range(2 * processes)]
    finally:
        for child in children:
            child.join(timeout=60)
    assert all(child.exitcode == 0 for child in children)

    begins = [r for r in reports if r[0] == "begin"]
    fresh = [r for r in begins if r[2] == "Fresh"]
    assert len(fresh) == 1, begins
    winner = fresh[0][1]
    for _, _, outcome, result in begins:
        assert outcome in {"Fresh", "PriorResult", "InFlight"}
        if outcome == "PriorResult":
            assert result == {"winner": winner}
    assert ledger_row(url, idempotency_race.KEY, "race.begin")["result"] == {"winner": winner}

    answers = [r[3] for r in reports if r[0] == "run"]
    with connect(url, autocommit=True) as conn:
        runners = [r[0] for r in conn.execute("SELECT runner FROM public.race_runs")]
    assert len(runners) == 1
    assert answers == [{"winner": runners[0]}] * processes


# ----------------------------------------------------------------- the decorator


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


# ----------------------------------------------------------------- keys


def _minted_vectors() -> list[dict[str, Any]]:
    # The project's copy of shared/spec/minted_keys.jsonl (test_keys compares it with the original).
    path = SPEC_DIR / "minted_keys.jsonl"
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


@pytest.mark.parametrize("case", _minted_vectors(), ids=lambda c: c["key"][:12])
def test_minted_key_vectors_through_the_library(case: dict[str, Any]) -> None:
    assert idempotency.minted_key(case["parts"]) == case["key"]
    assert mint_key(*case["parts"]) == case["key"]


def test_minted_keys_are_length_prefixed() -> None:
    assert mint_key("ab", "c") != mint_key("a", "bc")
    assert minted_key(iter(["x", "y"])) == mint_key("x", "y")


def test_caller_keys_are_validated() -> None:
    assert parse_caller_key(None) is None
    assert parse_caller_key("  abc  ") == "abc"
    assert parse_caller_key("k" * 255) == "k" * 255
    with pytest.raises(KeyValidationError, match="blank"):
        parse_caller_key(" \t ")
    with pytest.raises(KeyValidationError, match="256 characters"):
        parse_caller_key("k" * 256)
    with pytest.raises(KeyValidationError, match="control character 0x0a at position 1"):
        parse_caller_key("a\nb")
    with pytest.raises(KeyValidationError, match="0x7f"):
        parse_caller_key("a\x7f")


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
