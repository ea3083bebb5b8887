"""The ledger's five outcomes, its transaction discipline, and the TTL purge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from idem_platform.ledger import (
    Fresh,
    InFlight,
    Ledger,
    LedgerUsageError,
    Mismatch,
    PriorError,
    PriorResult,
    purge_expired,
    request_hash,
)
from idem_platform.postgres import connect
from idem_platform_tests.helpers.database import reset_database


@pytest.fixture
def url(pg_url: str) -> str:
    reset_database(pg_url)
    return pg_url


def test_begin_outcomes(url: str) -> None:
    with connect(url) as conn:
        with conn.transaction():
            ledger = Ledger(conn, "api")
            assert ledger.begin("k1", {"a": 1}, owner="o1") == Fresh()
            assert ledger.begin("k1", {"a": 1}) == InFlight("o1", 1)
            assert isinstance(ledger.begin("k1", {"a": 2}), Mismatch)
            ledger.commit("k1", {"answer": 42}, owner="o1")
            assert ledger.begin("k1", {"a": 1}) == PriorResult({"answer": 42})
            assert ledger.begin("k2", {"b": 1}) == Fresh()
            ledger.fail_permanent("k2", {"class": "Bad", "message": "no"})
            assert ledger.begin("k2", {"b": 1}) == PriorError({"class": "Bad", "message": "no"}, 1)
            assert ledger.take_over("k2", "o2") == 2
            assert ledger.begin("k3", {}) == Fresh()
            ledger.fail_transient("k3")
            assert ledger.begin("k3", {}) == Fresh()


def test_rows_only_exist_if_the_caller_commits(url: str) -> None:
    with connect(url) as conn:
        with conn.transaction(force_rollback=True):
            assert Ledger(conn, "api").begin("gone", {}) == Fresh()
        with conn.transaction():
            assert Ledger(conn, "api").begin("gone", {}) == Fresh()


def test_refuses_a_connection_outside_a_transaction(url: str) -> None:
    with connect(url, autocommit=True) as conn:
        with pytest.raises(LedgerUsageError, match="inside the caller's transaction"):
            Ledger(conn, "api").begin("k", {})
    with pytest.raises(ValueError, match="namespace"):
        Ledger(conn, "Bad Namespace")


def test_commit_checks_ownership(url: str) -> None:
    with connect(url) as conn, conn.transaction():
        ledger = Ledger(conn, "api")
        ledger.begin("k", {}, owner="mine")
        with pytest.raises(LedgerUsageError, match="for owner theirs"):
            ledger.commit("k", {}, owner="theirs")


def test_request_hash_is_canonical() -> None:
    assert request_hash({"b": [1, 2], "a": 1}) == request_hash({"a": 1, "b": [1, 2]})
    assert request_hash({"b": [2, 1]}) != request_hash({"b": [1, 2]})


def test_expired_rows_replay_until_purged(url: str) -> None:
    with connect(url) as conn:
        with conn.transaction():
            ledger = Ledger(conn, "api", replay_window=timedelta(seconds=-10))
            ledger.begin("old", {})
            ledger.commit("old", {"r": 1})
            ledger.begin("running", {})
        with conn.transaction():
            assert Ledger(conn, "api").begin("old", {}) == PriorResult({"r": 1})
            assert purge_expired(conn, grace=timedelta(hours=1)) == 0  # within the grace
            assert purge_expired(conn, now=datetime.now(UTC) + timedelta(hours=2), grace=timedelta(hours=1)) == 1
            assert Ledger(conn, "api").begin("old", {}) == Fresh()
            assert Ledger(conn, "api").begin("running", {}) == InFlight(None, 1)
