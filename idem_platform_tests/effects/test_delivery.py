"""Delivery on real PostgreSQL and a real HTTP receiver on loopback: one key per row on every
attempt, retries of transient answers, permanent ones parked, leases taken over after a
SIGKILL, and two dispatchers that never send one key at once."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from idem_platform.config import IdemConfig
from idem_platform.effects.connections import Connections
from idem_platform.effects.delivery import STALE_STATISTICS_ROWS, deliver, refresh_statistics, send
from idem_platform.idempotency import mint_key
from idem_platform.postgres import connect
from idem_platform_tests.helpers.cli import cli_env, idem_command, run
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.effects import alert, effects_config, outbox
from idem_platform_tests.helpers.receiver import Reply, receiving

COMMIT = "00000000-0000-0000-0000-000000000001"


def owe(pg_url: str, count: int, effect: str = "alert") -> list[str]:
    """Put ``count`` pending rows of ``effect`` in the outbox (as a commit would); their keys."""
    keys = [mint_key(effect, "threatfeed", "indicator", f"ioc-{i}", f"{i:040d}") for i in range(count)]
    with connect(pg_url) as conn, conn.transaction():
        for i, key in enumerate(keys):
            conn.execute(
                "INSERT INTO idem.outbox (key, effect, connector, record_type, record_key, payload, commit_id) "
                "VALUES (%s, %s, 'threatfeed', 'indicator', %s, %s, %s)",
                [key, effect, f"threatfeed:indicator:ioc-{i}:x", Jsonb({"id": f"ioc-{i}", "n": i}), COMMIT],
            )
    return keys


def _config(tmp_path: Path, pg_url: str, url: str, **overrides: Any) -> IdemConfig:
    return effects_config(tmp_path, pg_url, [alert(url, **overrides)])


def test_transient_answers_are_retried_under_one_key_until_delivered(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEM_TEST_EFFECT_TOKEN", "s3cret-token-1")
    answers = [Reply(500), Reply(429, {"Retry-After": "1"}), Reply(200)]
    with receiving(lambda key, seen: answers[seen]) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        (key,) = owe(pg_url, 1)
        report = deliver(pg_url, config.effects, wait_seconds=5)
    assert (report.delivered, report.failed, report.attempts) == (1, 0, 3)
    assert receiver.keys() == [key, key, key]  # the same key on every attempt
    assert receiver.times[2] - receiver.times[1] >= 0.95  # Retry-After: 1 was honoured
    assert receiver.requests[0][1] == {"id": "ioc-0", "n": 0}
    assert receiver.requests[0][2]["Authorization"] == "Bearer s3cret-token-1"
    assert receiver.acted == {key: 1}
    (row,) = outbox(pg_url)
    assert (row["status"], row["attempts"], row["last_status"], row["reason"]) == ("delivered", 3, 200, None)


def test_a_permanent_answer_is_parked_with_its_reason_and_no_secret(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEM_TEST_EFFECT_TOKEN", "s3cret-token-2")

    def echo(key: str, seen: int) -> Reply:
        return Reply(400, body="bad request; you sent Bearer s3cret-token-2")

    with receiving(echo) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        owe(pg_url, 1)
        report = deliver(pg_url, config.effects, wait_seconds=2)
    assert (report.delivered, report.failed, report.attempts, len(receiver.requests)) == (0, 1, 1, 1)
    (row,) = outbox(pg_url)
    assert (row["status"], row["last_status"], row["reason"]) == ("failed", 400, "permanent answer: HTTP 400")
    (response,) = rows(pg_url, "SELECT last_response FROM idem.outbox")[0]
    assert "s3cret-token-2" not in response and "***" in response


def test_max_attempts_counts_every_try_then_parks(tmp_path: Path, pg_url: str) -> None:
    with receiving(lambda key, seen: Reply(503)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url, max_attempts=3)
        (key,) = owe(pg_url, 1)
        report = deliver(pg_url, config.effects, wait_seconds=5)
    assert receiver.keys() == [key] * 3 and report.failed == 1
    (row,) = outbox(pg_url)
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert row["reason"] == "max_attempts (3) reached; last: HTTP 503"


def test_a_timeout_is_transient_and_the_retry_delivers(tmp_path: Path, pg_url: str) -> None:
    with receiving(lambda key, seen: Reply(200, delay=1.5 if seen == 0 else 0)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url, http={"timeout_seconds": 0.5})
        (key,) = owe(pg_url, 1)
        report = deliver(pg_url, config.effects, wait_seconds=5)
    assert report.delivered == 1 and receiver.keys() == [key, key]
    (row,) = outbox(pg_url)
    assert (row["status"], row["attempts"]) == ("delivered", 2)


def test_two_dispatchers_never_send_one_key_at_once(tmp_path: Path, pg_url: str) -> None:
    with receiving(lambda key, seen: Reply(200, delay=0.02)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        keys = owe(pg_url, 40)
        reports: list[Any] = []
        threads = [
            threading.Thread(target=lambda: reports.append(deliver(pg_url, config.effects))) for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert sorted(receiver.keys()) == sorted(keys)  # each key sent once, by one of them
    assert receiver.overlaps == []
    assert sum(r.delivered for r in reports) == 40 and all(r.delivered for r in reports)
    assert {r["status"] for r in outbox(pg_url)} == {"delivered"}


def test_a_killed_dispatcher_s_claims_are_taken_over_and_each_key_acted_on_once(tmp_path: Path, pg_url: str) -> None:
    with receiving(lambda key, seen: Reply(200, delay=0.15)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url, lease_seconds=3)
        keys = owe(pg_url, 30)
        child = subprocess.Popen(
            idem_command("effects", "deliver"), env=cli_env(pg_url, tmp_path, config),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while len(receiver.keys()) < 8 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)  # mid-burst: one row claimed, maybe mid-request
        child.wait()
        sent_before = len(receiver.keys())
        assert 8 <= sent_before < 30
        claimed = rows(pg_url, "SELECT count(*) FROM idem.outbox WHERE claimed_by IS NOT NULL AND status = 'pending'")
        assert claimed[0][0] <= 1  # a dispatcher holds at most the row it is sending
        report = deliver(pg_url, config.effects, wait_seconds=6)  # waits out the dead one's lease
    assert {r["status"] for r in outbox(pg_url)} == {"delivered"}
    assert set(receiver.keys()) == set(keys)  # every key received
    assert receiver.acted == dict.fromkeys(keys, 1)  # and acted on once
    assert len(receiver.keys()) - len(keys) <= 1  # at most the killed request's row came twice
    assert report.delivered >= 30 - sent_before  # the rest, and the killed one's row if unrecorded


def test_cli_list_retry_and_purge(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    with receiving(lambda key, seen: Reply(400 if seen == 0 else 200)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        for name, value in cli_env(pg_url, tmp_path, config).items():
            monkeypatch.setenv(name, value)
        (key,) = owe(pg_url, 1)
        code, out, _ = run(capsys, "effects", "deliver")
        assert code == 0 and json.loads(out[-1])["failed"] == 1
        code, out, _ = run(capsys, "effects", "list", "--status", "failed", "--json")
        listed = json.loads(out[-1])
        assert listed["effects"]["alert"] == {"pending": 0, "delivered": 0, "failed": 1, "oldest_pending_seconds": None}
        assert [r["key"] for r in listed["rows"]] == [key] and listed["rows"][0]["reason"] == "permanent answer: HTTP 400"
        code, out, _ = run(capsys, "effects", "retry", "--effect", "alert")
        assert code == 0 and json.loads(out[-1]) == {"retried": 1}
        code, out, _ = run(capsys, "effects", "deliver", "--effect", "alert")
        assert json.loads(out[-1])["delivered"] == 1
    assert receiver.keys() == [key, key]
    code, out, _ = run(capsys, "effects", "purge")  # delivered just now: inside the replay window
    assert json.loads(out[-1]) == {"purged": 0}
    code, out, _ = run(capsys, "effects", "purge", "--older-than-seconds", "0")
    assert json.loads(out[-1]) == {"purged": 1} and outbox(pg_url) == []
    code, _, err = run(capsys, "effects", "deliver", "--effect", "nope")
    assert code == 1 and "no effect named 'nope'" in err and "(known: alert)" in err


def _outbox_statistics(pg_url: str) -> tuple[int, int, float]:
    """The outbox's rows changed since its last ANALYZE, how often it was analyzed, and the
    planner's row count (``pg_class.reltuples``)."""
    with connect(pg_url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT s.n_mod_since_analyze, s.analyze_count, c.reltuples FROM pg_stat_user_tables s "
            "JOIN pg_class c ON c.oid = s.relid WHERE s.schemaname = 'idem' AND s.relname = 'outbox'"
        ).fetchone()
    assert found is not None
    return int(found[0]), int(found[1]), float(found[2])


def test_a_dispatcher_analyzes_an_outbox_that_grew_since_its_statistics(tmp_path: Path, pg_url: str) -> None:
    """A commit of many effects into an outbox analyzed while empty: the dispatcher analyzes it
    before claiming (else every claim walks all pending rows), and not again while it is fresh."""
    with receiving(lambda key, seen: Reply(200)) as receiver:
        config = effects_config(tmp_path, pg_url, [alert(receiver.url)])
        with connect(pg_url, autocommit=True) as conn:
            conn.execute("ANALYZE idem.outbox")  # known empty, as a new database's outbox is
        with connect(pg_url, autocommit=True) as conn:  # closed at once: its counts are reported
            conn.execute(
                "INSERT INTO idem.outbox (key, effect, connector, record_type, external_id, record_key, payload, commit_id) "
                "SELECT 'k' || i, 'alert', 'threatfeed', 'indicator', 'ioc-' || i, 'r' || i, '{}', %s "
                "FROM generate_series(1, %s) i",
                [COMMIT, STALE_STATISTICS_ROWS + 200],
            )
        deadline = time.monotonic() + 60
        while _outbox_statistics(pg_url)[0] < STALE_STATISTICS_ROWS + 200:
            assert time.monotonic() < deadline, "PostgreSQL never counted the inserted rows"
            time.sleep(0.1)
        _, analyzed_before, _ = _outbox_statistics(pg_url)
        assert deliver(pg_url, config.effects, limit=1).delivered == 1
    changed, analyzed, planned_rows = _outbox_statistics(pg_url)
    assert analyzed == analyzed_before + 1 and planned_rows == STALE_STATISTICS_ROWS + 200 and changed < 10
    with connect(pg_url, autocommit=True) as conn:
        assert not refresh_statistics(conn)  # a few changes since: nothing to do
    assert _outbox_statistics(pg_url)[1] == analyzed


def _bucket(key: str) -> int:
    """A key's share of the flaky receiver's script (minted keys are SHA-256 hex)."""
    return int(key[:8], 16) % 6


def _flaky(key: str, seen: int) -> Reply:
    """Refuses a sixth of the keys (400), fails another sixth twice (503), and answers another
    sixth's first request only after the dispatcher's timeout (it acted; the dispatcher gave up)."""
    bucket = _bucket(key)
    if bucket == 0:
        return Reply(400, body='{"error":"unknown indicator"}')
    if bucket == 1 and seen < 2:
        return Reply(503)
    if bucket == 2 and seen == 0:
        return Reply(200, delay=1.5)
    return Reply(200, delay=0.01)


@pytest.mark.slow
def test_a_flaky_receiver_through_sigkilled_dispatchers_gets_each_key_and_refusals_are_parked(
    tmp_path: Path, pg_url: str
) -> None:
    """A receiver that refuses some keys, fails a share of requests and times out on others, while
    ``idem effects deliver`` children are SIGKILLed at seeded random points of the burst and
    restarted until nothing is pending: every accepted key is delivered, every refused one is
    parked with its reason, and every row reached the receiver under its one key."""
    chance = random.Random(37)
    with receiving(_flaky) as receiver:
        config = _config(
            tmp_path, pg_url, receiver.url, http={"timeout_seconds": 1}, lease_seconds=3, max_attempts=12,
        )
        keys = owe(pg_url, 60)
        env = cli_env(pg_url, tmp_path, config)
        kills = 0
        deadline = time.monotonic() + 180
        while rows(pg_url, "SELECT count(*) FROM idem.outbox WHERE status = 'pending'")[0][0]:
            assert time.monotonic() < deadline, "the outbox did not drain"
            child = subprocess.Popen(
                idem_command("effects", "deliver", "--wait-seconds", "4"), env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if kills < 5:
                target = len(receiver.keys()) + chance.randint(3, 12)
                while len(receiver.keys()) < target and child.poll() is None:
                    time.sleep(chance.uniform(0.0, 0.01))
                if child.poll() is None:
                    os.kill(child.pid, signal.SIGKILL)
                    kills += 1
            child.wait(timeout=120)
    refused = {key for key in keys if _bucket(key) == 0}
    owed = outbox(pg_url)
    assert kills >= 3 and refused and len(refused) < len(keys)
    assert {r["key"] for r in owed if r["status"] == "delivered"} == set(keys) - refused
    parked = [r for r in owed if r["status"] == "failed"]
    assert {r["key"] for r in parked} == refused
    assert all(r["reason"] == "permanent answer: HTTP 400" and r["last_status"] == 400 for r in parked)
    assert set(receiver.keys()) == set(keys)  # each row under its one key, whatever was re-sent
    assert set(receiver.acted) == set(keys) - refused


@pytest.mark.parametrize("keep_alive", [True, False], ids=["receiver keeps connections", "receiver closes them"])
def test_a_dispatcher_keeps_one_connection_per_receiver_while_the_receiver_keeps_it(
    tmp_path: Path, pg_url: str, keep_alive: bool
) -> None:
    with receiving(lambda key, seen: Reply(200), keep_alive=keep_alive) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        keys = owe(pg_url, 12)
        assert deliver(pg_url, config.effects).delivered == 12
    assert sorted(receiver.keys()) == sorted(keys)
    assert len(set(receiver.peers)) == (1 if keep_alive else 12)


def test_a_kept_connection_the_receiver_closed_meanwhile_is_replaced(tmp_path: Path, pg_url: str) -> None:
    """A receiver that drops its idle connections (its keep-alive timeout) between two rows: the
    next request goes on a new connection, sent once."""
    with receiving(lambda key, seen: Reply(200)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        (effect,) = config.effects
        keys = owe(pg_url, 2)
        with Connections() as connections:
            first = send(effect, keys[0], {"n": 0}, connections)
            for kept in connections._open.values():  # the connection breaks, as when an idle timeout closes it
                assert kept.sock is not None
                kept.sock.shutdown(socket.SHUT_RDWR)
            second = send(effect, keys[1], {"n": 1}, connections)
    assert (first.status, second.status) == (200, 200)
    assert receiver.keys() == keys and len(set(receiver.peers)) == 2
