"""Enrichment results as data (``results_table:``) on real PostgreSQL and a loopback receiver:
one row per delivered key, written with the delivery's record; a dispatcher SIGKILLed between
the receiver's answer and the recording leaves neither, and the retry (same key, the
receiver answering from its idempotency store) leaves exactly one row; ``idem read`` lists them."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from idem_platform.effects.delivery import deliver
from idem_platform.samples import write_lines
from idem_platform_tests.effects.test_functions import acted
from idem_platform_tests.effects.test_ordering import owe_versions
from idem_platform_tests.helpers.cli import cli_env, idem_command, run
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.effects import (
    alert,
    effects_config,
    enrich,
    function_module,
    outbox,
)
from idem_platform_tests.helpers.faults import kill_at_fault
from idem_platform_tests.helpers.ingest import ingest
from idem_platform_tests.helpers.paths import REPO
from idem_platform_tests.helpers.receiver import Reply, receiving

DOC = (REPO / "docs" / "effects.md").read_text(encoding="utf-8")
RESULTS = "SELECT key, effect, record_type, external_id, record_key, response, status FROM idem.alert_results ORDER BY key"


class Enricher:
    """A receiver's script that answers each key from its idempotency store: the first request of a
    key makes the answer (a serial number), every later one gets the same answer back."""

    def __init__(self, refuse: str = "", text: str = "") -> None:
        self.answers: dict[str, str] = {}
        self.lock = threading.Lock()
        self.refuse, self.text = refuse, text

    def __call__(self, key: str, seen: int) -> Reply:
        if key == self.refuse:
            return Reply(400, body='{"error":"no"}')
        if key == self.text:
            return Reply(200, body="plain words")
        with self.lock:
            body = self.answers.setdefault(key, json.dumps({"verdict": "malicious", "serial": len(self.answers)}))
        return Reply(200, body=body)


def test_each_delivered_answer_is_one_row_and_a_parked_one_none(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys: dict[str, list[str]] = {}
    with receiving(lambda key, seen: script(key, seen)) as receiver:
        config = effects_config(tmp_path, pg_url, [alert(receiver.url, results_table="alert_results")])
        keys.update(owe_versions(pg_url, 3, 1))
        script = Enricher(refuse=keys["ioc-2"][0], text=keys["ioc-1"][0])
        report = deliver(pg_url, config.effects, wait_seconds=2)
    assert (report.delivered, report.failed) == (2, 1)
    (first,), (second,) = keys["ioc-0"], keys["ioc-1"]
    assert rows(pg_url, RESULTS) == sorted([
        (first, "alert", "indicator", "ioc-0", "threatfeed:indicator:ioc-0:0", json.loads(script.answers[first]), 200),
        (second, "alert", "indicator", "ioc-1", "threatfeed:indicator:ioc-1:0", "plain words", 200),  # not JSON: text
    ])
    same = rows(pg_url, "SELECT count(*) FROM idem.alert_results r JOIN idem.outbox o USING (key) "
                        "WHERE o.status = 'delivered' AND o.delivered_at = r.delivered_at")
    assert same == [(2,)]  # the time of the delivery recorded with it
    for name, value in cli_env(pg_url, tmp_path, config).items():
        monkeypatch.setenv(name, value)
    code, out, err = run(capsys, "read", "alert_results")
    assert code == 0 and [json.loads(line)["external_id"] for line in out] == ["ioc-0", "ioc-1"]
    assert json.loads(err.strip().splitlines()[-1]) == {"results_table": "alert_results", "rows": 2}
    code, _, err = run(capsys, "read", "alert_results", "--history")
    assert code == 1 and "only --limit applies" in err


def test_a_crash_between_the_answer_and_the_recording_leaves_one_row(tmp_path: Path, pg_url: str) -> None:
    script = Enricher()
    with receiving(script) as receiver:
        config = effects_config(tmp_path, pg_url, [alert(receiver.url, results_table="alert_results")])
        ((key,),) = owe_versions(pg_url, 1, 1).values()
        marker = tmp_path / "paused"
        env = {**cli_env(pg_url, tmp_path, config), "IDEM_FAULT": f"effect_sent:pause:{marker}"}
        # SIGKILL once the receiver answered, before the outbox (and the results table) heard of it.
        kill_at_fault(idem_command("effects", "deliver"), env, marker)
        assert receiver.keys() == [key] and receiver.acted == {key: 1}
        assert rows(pg_url, "SELECT count(*) FROM idem.alert_results") == [(0,)]  # no result without its record
        assert [row["status"] for row in outbox(pg_url)] == ["pending"]
        report = deliver(pg_url, config.effects, wait_seconds=6)  # after the dead dispatcher's lease
    assert report.delivered == 1
    assert receiver.keys() == [key, key] and receiver.acted == {key: 1}  # re-sent under its key, acted once
    (row,) = rows(pg_url, "SELECT key, response FROM idem.alert_results")
    assert row == (key, json.loads(script.answers[key]))  # the answer of the first request, once
    assert [r["status"] for r in outbox(pg_url)] == ["delivered"]


def test_a_function_s_result_is_its_row(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEM_TEST_EFFECT_LOG", str(tmp_path / "acted.log"))
    module = function_module(tmp_path, "fx_results")
    config = effects_config(
        tmp_path, pg_url, [enrich(module, results_table="scores")], effect_modules=[module]
    )
    keys: Any = owe_versions(pg_url, 2, 1)
    with_effect = rows(pg_url, "UPDATE idem.outbox SET effect = 'enrich' RETURNING key")
    assert len(with_effect) == 2
    assert deliver(pg_url, config.effects).delivered == 2
    found = rows(pg_url, "SELECT external_id, response, status FROM idem.scores ORDER BY external_id")
    assert found == [(f"ioc-{i}", {"score": 0, "key": keys[f"ioc-{i}"][0][:8]}, None) for i in range(2)]
    assert len(acted(tmp_path / "acted.log")) == 2


def test_the_documented_query_joins_a_committed_row_to_its_answer(
    tmp_path: Path, pg_url: str, spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with receiving(lambda key, seen: Reply(200, body='{"verdict":"malicious"}')) as receiver:
        effect = alert(receiver.url, name="enrich", when=[], results_table="indicator_enrichment")
        config = effects_config(tmp_path, pg_url, [effect])
        path = config.connector("threatfeed").path
        assert path is not None
        records = [{"type": "indicator", "id": "ioc-1", "name": "bad.example", "confidence": 90}]
        summary = ingest(pg_url, config, spark, write_lines(path / "a.ndjson", [json.dumps(r) for r in records]))
        assert summary["effects_created"] == 1
        assert deliver(pg_url, config.effects).delivered == 1
    documented = (
        "SELECT i.name, r.response ->> 'verdict' AS verdict\n"
        "FROM idem.indicator i\n"
        "JOIN idem.indicator_enrichment r ON r.record_key = i._idempotency_key;"
    )
    assert documented in DOC
    assert rows(pg_url, documented) == [("bad.example", "malicious")]
    for name, value in cli_env(pg_url, tmp_path, config).items():
        monkeypatch.setenv(name, value)
    code, out, _ = run(capsys, "read", "indicator_enrichment", "--limit", "10")
    assert code == 0 and [json.loads(line)["external_id"] for line in out] == ["ioc-1"]
