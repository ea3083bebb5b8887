"""Ordering per identity on real PostgreSQL and a loopback receiver: the versions of one
identity (effect, record type, external id) are sent in commit order, a later one never
before an earlier one succeeded nor while it is in flight (one dispatcher or two), and a
parked earlier version does not hold the later ones back."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from idem_platform.config import IdemConfig
from idem_platform.effects.admin import due_rows
from idem_platform.effects.delivery import deliver
from idem_platform.idempotency import mint_key
from idem_platform.postgres import connect
from idem_platform.postgres.schema import ensure_schema
from idem_platform_tests.effects.test_delivery import COMMIT
from idem_platform_tests.helpers.effects import alert, effects_config, outbox
from idem_platform_tests.helpers.receiver import Receiver, Reply, receiving


def owe_versions(pg_url: str, identities: int, versions: int) -> dict[str, list[str]]:
    """Pending rows of ``alert``: ``versions`` versions of each of ``identities`` external ids, all
    due at once, an identity's versions inserted one after the other (their commit order: a
    dispatcher that ignored identities would take an identity's first two versions together);
    external id -> keys in commit order."""
    keys: dict[str, list[str]] = {f"ioc-{i}": [] for i in range(identities)}
    with connect(pg_url) as conn, conn.transaction():
        for external_id, found in keys.items():
            for version in range(versions):
                key = mint_key("alert", "threatfeed", "indicator", external_id, f"{version:040d}")
                conn.execute(
                    "INSERT INTO idem.outbox (key, effect, connector, record_type, external_id, record_key, payload, "
                    "commit_id) VALUES (%s, 'alert', 'threatfeed', 'indicator', %s, %s, %s, %s)",
                    [key, external_id, f"threatfeed:indicator:{external_id}:{version}",
                     Jsonb({"id": external_id, "version": version}), COMMIT],
                )
                found.append(key)
    return keys


def _config(tmp_path: Path, pg_url: str, url: str) -> IdemConfig:
    return effects_config(tmp_path, pg_url, [alert(url, backoff_seconds=0.3, max_backoff_seconds=0.3)])


def _sent(receiver: Receiver, keys: list[str]) -> list[tuple[str, float]]:
    """The requests of ``keys`` in arrival order, with their arrival times."""
    with receiver.lock:
        return [(key, at) for (key, _, _), at in zip(receiver.requests, receiver.times, strict=True) if key in keys]


def test_the_later_version_waits_until_the_earlier_one_succeeded(tmp_path: Path, pg_url: str) -> None:
    keys: dict[str, list[str]] = {}

    def first_fails_once(key: str, seen: int) -> Reply:
        return Reply(500 if key == keys["ioc-0"][0] and seen == 0 else 200)

    with receiving(first_fails_once) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        keys.update(owe_versions(pg_url, 2, 2))
        report = deliver(pg_url, config.effects, wait_seconds=5)
    first, second = keys["ioc-0"]
    sent = _sent(receiver, [first, second])
    # The first failed once and was retried after its backoff; the second was not sent meanwhile.
    assert [key for key, _ in sent] == [first, first, second]
    assert sent[1][1] - sent[0][1] >= 0.14  # the backoff (0.3 s, jitter down to half) was waited out
    other = _sent(receiver, keys["ioc-1"])
    assert [key for key, _ in other] == keys["ioc-1"]  # another identity was not held back
    assert other[-1][1] < sent[1][1]  # ... it went on while ioc-0 waited for its retry
    assert (report.delivered, report.failed) == (4, 0)
    assert {row["status"] for row in outbox(pg_url)} == {"delivered"}


def test_a_parked_earlier_version_does_not_block_the_later_ones(tmp_path: Path, pg_url: str) -> None:
    keys: dict[str, list[str]] = {}
    with receiving(lambda key, seen: Reply(400 if key == keys["ioc-0"][0] else 200)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        keys.update(owe_versions(pg_url, 1, 3))
        report = deliver(pg_url, config.effects, wait_seconds=2)
    assert receiver.keys() == keys["ioc-0"]  # parked at once (a 400), then the later two in order
    assert (report.delivered, report.failed) == (2, 1)
    statuses = {row["key"]: row["status"] for row in outbox(pg_url)}
    assert [statuses[key] for key in keys["ioc-0"]] == ["failed", "delivered", "delivered"]


def test_two_dispatchers_never_send_two_versions_of_one_identity_at_once(tmp_path: Path, pg_url: str) -> None:
    delay = 0.05
    with receiving(lambda key, seen: Reply(200, delay=delay)) as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        keys = owe_versions(pg_url, 6, 4)
        reports: list[Any] = []
        threads = [threading.Thread(target=lambda: reports.append(deliver(pg_url, config.effects, wait_seconds=1)))
                   for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert sum(r.delivered for r in reports) == 24 and all(r.delivered for r in reports)  # both worked
    assert receiver.overlaps == [] and len(receiver.keys()) == 24
    for versions in keys.values():
        sent = _sent(receiver, versions)
        assert [key for key, _ in sent] == versions  # commit order
        # Each version arrived after the one before it was answered (never two in flight).
        assert all(later - earlier >= delay * 0.9 for (_, earlier), (_, later) in zip(sent, sent[1:], strict=False))


def test_the_claim_probes_an_identity_through_its_index(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("SET LOCAL enable_seqscan = off")  # an empty table: price the scan out
        plan = conn.execute(
            "EXPLAIN SELECT 1 FROM idem.outbox e WHERE e.effect = 'a' AND e.record_type = 'r' "
            "AND e.external_id = 'x' AND e.status = 'pending' AND e.seq < 10"
        ).fetchall()
    assert any("outbox_identity" in line for (line,) in plan)


def test_rows_from_before_the_upgrade_get_seq_in_their_created_order(pg_url: str) -> None:
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("TRUNCATE idem.outbox")
        conn.execute("DROP INDEX idem.outbox_identity")
        conn.execute("ALTER TABLE idem.outbox DROP COLUMN seq, DROP COLUMN external_id")  # the 007 table
        for name, age in (("newer", "1 minute"), ("older", "2 minutes")):
            conn.execute(
                "INSERT INTO idem.outbox (key, effect, connector, record_type, record_key, payload, commit_id, created_at) "
                "VALUES (%s, 'alert', 'c', 'indicator', %s, '{}', %s, now() - %s::interval)",
                [name, name, COMMIT, age],
            )
        conn.execute("DELETE FROM idem.schema_migrations WHERE version = 8")
        assert ensure_schema(conn) == [8]
        found = conn.execute("SELECT key, external_id FROM idem.outbox ORDER BY seq").fetchall()
        conn.execute(
            "INSERT INTO idem.outbox (key, effect, connector, record_type, record_key, payload, commit_id) "
            "VALUES ('later', 'alert', 'c', 'indicator', 'later', '{}', %s)", [COMMIT],
        )
        last = conn.execute("SELECT key FROM idem.outbox ORDER BY seq DESC LIMIT 1").fetchone()
    assert found == [("older", None), ("newer", None)] and last == ("later",)


def test_a_version_behind_a_waiting_one_is_not_due(tmp_path: Path, pg_url: str) -> None:
    with receiving() as receiver:
        config = _config(tmp_path, pg_url, receiver.url)
        (first, second), = owe_versions(pg_url, 1, 2).values()
        with connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE idem.outbox SET next_attempt_at = now() + interval '1 hour' WHERE key = %s", [first])
            assert due_rows(conn, ["alert"])[0] == 0  # the sensor launches nothing for it
        started = time.monotonic()
        report = deliver(pg_url, config.effects, wait_seconds=30)
    assert report.attempts == 0 and receiver.keys() == []
    assert time.monotonic() - started < 5  # nothing due within the wait: it stops, it does not poll
    assert {row["key"]: row["status"] for row in outbox(pg_url)} == {first: "pending", second: "pending"}
