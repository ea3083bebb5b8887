"""Backpressure on real PostgreSQL and Spark: a receiver that does not answer never slows the
ingest. The commit only inserts outbox rows (no request leaves it), a dispatcher timing out
against the receiver does not hold the commit up, and what is owed grows where the operator
looks: ``idem effects list`` and the ``effects_owed`` verdict (the count and the oldest age)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from idem_platform.effects.admin import owed
from idem_platform.effects.delivery import deliver
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.cli import cli_env, run
from idem_platform_tests.helpers.database import rows
from idem_platform_tests.helpers.effects import alert, effects_config
from idem_platform_tests.helpers.ingest import ingest
from idem_platform_tests.helpers.receiver import Reply, receiving

HANG = 60.0  # the receiver holds every request this long: a request inside the commit would show


def _timed_ingest(pg_url: str, config: Any, spark: Any, name: str, records: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
    path = config.connector("threatfeed").path
    drop = write_lines(path / name, [json.dumps(r) for r in records])
    started = time.monotonic()
    summary = ingest(pg_url, config, spark, drop)
    return summary, time.monotonic() - started


def test_a_receiver_that_does_not_answer_never_slows_the_ingest(
    tmp_path: Path, pg_url: str, spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with receiving(lambda key, seen: Reply(200, delay=HANG)) as down:
        effect = alert(down.url, http={"timeout_seconds": 1}, max_attempts=100, lease_seconds=3)
        config = effects_config(tmp_path, pg_url, [effect])
        first, took = _timed_ingest(pg_url, config, spark, "a.ndjson", [
            {"type": "indicator", "id": "ioc-1", "name": "bad.example", "confidence": 90},
            {"type": "indicator", "id": "ioc-2", "name": "worse.example", "confidence": 85},
        ])
        assert first["effects_created"] == 2 and took < HANG
        assert down.requests == []  # the commit sent nothing: it only wrote the outbox rows
        stop = threading.Event()
        reports: list[Any] = []

        def dispatch() -> None:
            while not stop.is_set():
                reports.append(deliver(pg_url, config.effects, wait_seconds=0.5, limit=1))

        dispatcher = threading.Thread(target=dispatch)
        dispatcher.start()
        try:
            while len(down.requests) < 2:
                time.sleep(0.05)
            second, took = _timed_ingest(pg_url, config, spark, "b.ndjson", [  # while requests time out
                {"type": "indicator", "id": "ioc-1", "name": "bad.example", "confidence": 95},  # a new version
                {"type": "indicator", "id": "ioc-3", "name": "new.example", "confidence": 99},
            ])
        finally:
            stop.set()
            dispatcher.join(timeout=60)
    assert second["effects_created"] == 2 and took < HANG
    assert sum(r.delivered for r in reports) == 0 and sum(r.retrying for r in reports) >= 2
    owed_rows = rows(pg_url, "SELECT external_id, status, last_response FROM idem.outbox ORDER BY seq")
    assert [(e, s) for e, s, _ in owed_rows] == [("ioc-1", "pending"), ("ioc-2", "pending"),
                                                 ("ioc-1", "pending"), ("ioc-3", "pending")]
    assert any(text and text.startswith("timeout after 1s") for _, _, text in owed_rows)
    time.sleep(1.0)
    for name, value in cli_env(pg_url, tmp_path, config).items():
        monkeypatch.setenv(name, value)
    code, out, _ = run(capsys, "effects", "list", "--json")
    counts = json.loads(out[-1])["effects"]["alert"]
    assert code == 0 and (counts["pending"], counts["delivered"], counts["failed"]) == (4, 0, 0)
    assert counts["oldest_pending_seconds"] >= 1.0
    with connect(pg_url, autocommit=True) as conn:
        fine, judged, problems = owed(conn, {"alert": 0.5})
    assert not fine and judged["alert"]["pending"] == 4
    assert problems == [f"alert: oldest pending row is {judged['alert']['oldest_pending_seconds']:.0f}s old (bound 0.5s)"]
