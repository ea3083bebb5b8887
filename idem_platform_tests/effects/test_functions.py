"""Python-function effects (idem_platform.effects.delivery.call) on real PostgreSQL: the function
is called once per key through run_idempotently, its result recorded like an answer; a dispatcher
SIGKILLed after the function acted and before the outbox noted it does not act again (the rerun
replays the recorded result); a raising function is retried, then parked with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from idem_platform.effects.delivery import deliver
from idem_platform.idempotency import mint_key
from idem_platform.postgres import connect
from idem_platform_tests.effects.test_delivery import COMMIT, owe
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.effects import effects_config, enrich, function_module, outbox
from idem_platform_tests.helpers.faults import kill_at_fault


def acted(log: Path) -> list[dict[str, object]]:
    """What the function did: one line per call that acted."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_function_is_called_once_per_key_and_its_result_recorded(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "acted.log"
    monkeypatch.setenv("IDEM_TEST_EFFECT_LOG", str(log))
    module = function_module(tmp_path, "fx_called_once")
    config = effects_config(tmp_path, pg_url, [enrich(module)], effect_modules=[module])
    keys = owe(pg_url, 3, effect="enrich")
    report = deliver(pg_url, config.effects)
    assert (report.delivered, report.failed, report.attempts) == (3, 0, 3)
    assert sorted(str(line["key"]) for line in acted(log)) == sorted(keys)
    assert acted(log)[0]["payload"] == {"id": "ioc-0", "n": 0}
    recorded = rows(pg_url, "SELECT last_status, last_response FROM idem.outbox ORDER BY record_key")
    assert recorded[0][0] is None and json.loads(recorded[0][1]) == {"score": 0, "key": keys[0][:8]}
    ledger = rows(pg_url, "SELECT count(*) FROM idem.ingest_ledger WHERE namespace = 'effects.enrich' AND status = 'committed'")
    assert ledger == [(3,)]


def test_a_function_killed_after_acting_is_not_acted_again(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, marker = tmp_path / "acted.log", tmp_path / "paused"
    module = function_module(tmp_path, "fx_killed")
    config = effects_config(tmp_path, pg_url, [enrich(module)], effect_modules=[module])
    (key,) = owe(pg_url, 1, effect="enrich")
    env = {**cli_env(pg_url, tmp_path, config), "IDEM_TEST_EFFECT_LOG": str(log),
           "IDEM_FAULT": f"effect_sent:pause:{marker}"}
    # SIGKILL once the function acted and run_idempotently recorded it, before the outbox notes it.
    kill_at_fault(idem_command("effects", "deliver"), env, marker)
    assert [line["key"] for line in acted(log)] == [key]
    (row,) = outbox(pg_url)
    assert (row["status"], row["attempts"]) == ("pending", 1)  # still owed: the outbox never heard
    monkeypatch.setenv("IDEM_TEST_EFFECT_LOG", str(log))
    report = deliver(pg_url, config.effects, wait_seconds=5)  # takes the row over once the lease ends
    assert report.delivered == 1
    assert [line["key"] for line in acted(log)] == [key]  # replayed, not acted again
    (row,) = outbox(pg_url)
    assert (row["status"], row["attempts"]) == ("delivered", 2)
    (response,) = rows(pg_url, "SELECT last_response FROM idem.outbox")[0]
    assert json.loads(response) == {"score": 0, "key": key[:8]}  # the first call's result, replayed


def test_a_raising_function_is_retried_then_parked_and_acts_nothing(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "acted.log"
    monkeypatch.setenv("IDEM_TEST_EFFECT_LOG", str(log))
    module = function_module(tmp_path, "fx_raising")
    config = effects_config(tmp_path, pg_url, [enrich(module)], effect_modules=[module])
    key = mint_key("enrich", "threatfeed", "indicator", "boom", "0" * 40)
    with connect(pg_url) as conn, conn.transaction():
        conn.execute(
            "INSERT INTO idem.outbox (key, effect, connector, record_type, record_key, payload, commit_id) "
            "VALUES (%s, 'enrich', 'threatfeed', 'indicator', 'threatfeed:indicator:boom:x', %s, %s)",
            [key, Jsonb({"indicator": "boom", "id": "boom"}), COMMIT],
        )
    report = deliver(pg_url, config.effects, wait_seconds=5)
    assert (report.delivered, report.failed, report.attempts) == (0, 1, 3)
    (row,) = outbox(pg_url)
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert row["reason"] == "max_attempts (3) reached; last: RuntimeError: the enrichment service refused boom"
    assert acted(log) == []
    # A failure is released, not recorded: a retry after a fix calls the function again.
    assert rows(pg_url, "SELECT count(*) FROM idem.ingest_ledger WHERE namespace = 'effects.enrich'") == [(0,)]


def test_the_documented_example_records_a_band_per_indicator(tmp_path: Path, pg_url: str) -> None:
    effect = {
        "name": "confidence-band", "record_type": "indicator", "max_attempts": 3,
        "python": {"function": "idem_platform.examples.effects:band", "body": {"indicator": "name", "confidence": "confidence"}},
    }
    config = effects_config(tmp_path, pg_url, [effect], effect_modules=["idem_platform.examples.effects"])
    with connect(pg_url) as conn, conn.transaction():
        for name, confidence in (("a.example", 90), ("b.example", 40), ("c.example", None)):
            conn.execute(
                "INSERT INTO idem.outbox (key, effect, connector, record_type, record_key, payload, commit_id) "
                "VALUES (%s, 'confidence-band', 'threatfeed', 'indicator', %s, %s, %s)",
                [mint_key("confidence-band", name), name, Jsonb({"indicator": name, "confidence": confidence}), COMMIT],
            )
    assert deliver(pg_url, config.effects).delivered == 3
    answers = rows(pg_url, "SELECT record_key, last_response FROM idem.outbox ORDER BY record_key")
    assert [(key, json.loads(text)["band"]) for key, text in answers] == [
        ("a.example", "high"), ("b.example", "medium"), ("c.example", None)
    ]
