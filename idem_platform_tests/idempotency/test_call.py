"""One call against the ledger (idem_platform.idempotency.call): a claim in flight elsewhere, the bounded wait,
the caller's own transaction, and a 16-process race for one key."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest

from idem_platform.errors import TransientError
from idem_platform.idempotency import (
    Fresh,
    IdempotencyKeyInFlight,
    Ledger,
    run_idempotently,
)
from idem_platform.postgres import connect
from idem_platform_tests.helpers import idempotency_race
from idem_platform_tests.helpers.idempotency import (
    NS,
    CardDeclined,
    Counter,
    ledger_row,
    side_effects,
)


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
