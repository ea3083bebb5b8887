"""idem as its own receiver: config A's effect POSTs each qualifying row to ``idem serve`` of
config B (its own database) with ``Idempotency-Key: <minted key>``. The dispatcher is killed
with SIGKILL at random points of a burst and restarted until nothing is owed; B, which keeps
every key it acted on in its ledger, must have landed each row once, under one key, and
answered every re-sent key as a replay."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idem_platform.config import IdemConfig
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.samples import write_lines
from idem_platform.sources.push.server import free_port
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import rows, scratch_database
from idem_platform_tests.helpers.effects import effects_config
from idem_platform_tests.helpers.ingest import ingest
from idem_platform_tests.helpers.push import landed_files, push_config, wait_until_serving

QUALIFYING = 200
SEED = 37


@pytest.fixture
def b_url(postgres_server: str) -> Iterator[str]:
    """Config B's own database (A has the module's ``pg_url``)."""
    with scratch_database(postgres_server, f"idem_receiver_b_{uuid.uuid4().hex[:8]}") as url:
        yield url


@pytest.fixture
def serve_b(b_url: str, tmp_path: Path) -> Iterator[tuple[str, IdemConfig]]:
    """``idem serve`` of config B as a child process: its push URL and its config."""
    directory = tmp_path / "b"
    directory.mkdir()
    config = push_config(directory)
    pipeline.prepare_tables(b_url, config, config.connector("push"))
    port = free_port()
    env = {**cli_env(b_url, directory, config), "IDEM_HTTP_TOKEN": ""}
    process = subprocess.Popen(
        idem_command("serve", "--port", str(port)), env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_until_serving(process, port, poll=0.1)
        yield f"http://127.0.0.1:{port}/v1/connectors/push/records", config
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _forward(url: str) -> dict[str, Any]:
    """A's effect: each qualifying indicator, as one NDJSON line B's http connector reads."""
    return {
        "name": "forward",
        "record_type": "indicator",
        "when": {"field": "confidence", "gte": 80},
        "http": {
            "url": url,
            "headers": {"Content-Type": "application/x-ndjson"},
            "body": {"type": "record_type", "id": "external_id", "name": "name", "confidence": "confidence"},
            "timeout_seconds": 1,
        },
        "max_attempts": 10,
        "backoff_seconds": 0.05,
        "max_backoff_seconds": 0.2,
        "lease_seconds": 2,
    }


def _records(prefix: str, count: int) -> list[str]:
    """``count`` indicators; five of every six have confidence >= 80."""
    return [
        json.dumps({"type": "indicator", "id": f"{prefix}-{i}", "name": f"{prefix}{i}.example",
                    "confidence": 50 if i % 6 == 0 else 80 + i % 20})
        for i in range(count)
    ]


def _burst(a_url: str, b_url: str, a_dir: Path, config: IdemConfig, b_config: IdemConfig) -> tuple[int, set[str]]:
    """Run ``idem effects deliver`` children, SIGKILLing them at seeded random points, until
    nothing is pending. The kills, and the keys a killed child had sent but not recorded."""
    chance = random.Random(SEED)
    env = cli_env(a_url, a_dir, config)
    kills, in_doubt = 0, set[str]()
    deadline = time.monotonic() + 50
    while rows(a_url, "SELECT count(*) FROM idem.outbox WHERE status = 'pending'")[0][0]:
        assert time.monotonic() < deadline, "the outbox did not drain"
        child = subprocess.Popen(idem_command("effects", "deliver", "--wait-seconds", "3"), env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if kills < 6:
            target = len(landed_files(b_config)) + chance.randint(5, 45)
            while len(landed_files(b_config)) < target and child.poll() is None:
                time.sleep(chance.uniform(0.0, 0.01))
        if child.poll() is None and kills < 6:
            os.kill(child.pid, signal.SIGKILL)
            kills += 1
        child.wait(timeout=60)
        claimed = rows(a_url, "SELECT key FROM idem.outbox WHERE status = 'pending' AND claimed_by IS NOT NULL")
        ledger = {k for (k,) in rows(b_url, "SELECT key FROM idem.ingest_ledger WHERE namespace = 'http:push'")}
        in_doubt |= {key for (key,) in claimed if key in ledger}
    return kills, in_doubt


def _ingest_landed(b_url: str, b_config: IdemConfig, spark: Any) -> dict[str, Any]:
    """B ingests everything its server landed, as one batch."""
    connector = b_config.connector("push")
    batch = pipeline.plan_batch(b_url, connector, landed_files(b_config))
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(b_url, b_config, connector))
    return run.commit_batch(run.CommitRequest(url=b_url, connector=connector, run_id="b"), coerced, lambda: spark)


@pytest.mark.slow
def test_every_qualifying_row_reaches_idem_once_under_one_key_through_sigkills(
    tmp_path: Path, pg_url: str, b_url: str, serve_b: tuple[str, IdemConfig], spark: Any
) -> None:
    push_url, b_config = serve_b
    a_dir = tmp_path / "a"
    a_dir.mkdir()
    config = effects_config(a_dir, pg_url, [_forward(push_url)])
    drop = config.connector("threatfeed").path
    assert drop is not None
    summary = ingest(pg_url, config, spark, write_lines(drop / "a.ndjson", _records("ioc", 240)))
    assert (summary["rows_written"], summary["effects_created"]) == (240, QUALIFYING)
    again = ingest(pg_url, config, spark, write_lines(drop / "copy.ndjson", _records("ioc", 240)))
    replay = ingest(pg_url, config, spark, write_lines(drop / "old.ndjson", _records("old", 24)), replay=True)
    assert (again["rows_written"], again.get("effects_created", 0)) == (0, 0)
    assert (replay["rows_written"], replay["effects_created"], replay["effects_suppressed"]) == (24, 0, 20)

    kills, in_doubt = _burst(pg_url, b_url, a_dir, config, b_config)

    owed = rows(pg_url, "SELECT key, payload->>'id', status, attempts, last_response, reason, commit_id::text "
                        "FROM idem.outbox")
    assert kills >= 3 and in_doubt  # some kills fell between B acting and A recording it
    assert {commit for *_, commit in owed} == {summary["commit_id"]}  # no replay-tagged run owes anything
    assert not [r for r in owed if r[2] == "failed" and not r[5]]  # parked ones (if any) say why
    assert {r[2] for r in owed} == {"delivered"} and len(owed) == QUALIFYING
    qualifying = {r[1] for r in owed}
    assert qualifying == {f"ioc-{i}" for i in range(240) if i % 6}
    # B's ledger holds each minted key once, and one landed body per key.
    ledger = rows(b_url, "SELECT key, count(*) FROM idem.ingest_ledger WHERE namespace = 'http:push' GROUP BY key")
    assert sorted(k for k, n in ledger if n == 1) == sorted(r[0] for r in owed) and len(ledger) == QUALIFYING
    assert len(landed_files(b_config)) == QUALIFYING
    # A key sent again after a kill was answered as a replay; a key sent once was not.
    answers = {key: json.loads(response) for key, _, _, _, response, _, _ in owed}
    assert all(answers[key]["replayed"] for key in in_doubt)
    assert all(not answers[key]["replayed"] for key, _, _, attempts, *_ in owed if attempts == 1)
    assert not [k for k, a in answers.items() if a["replayed"] and k not in in_doubt and
                next(r[3] for r in owed if r[0] == k) < 2]
    # B's table holds each qualifying row once.
    assert _ingest_landed(b_url, b_config, spark)["rows_written"] == QUALIFYING
    b_rows = rows(b_url, "SELECT _external_id, count(*) FROM idem.indicator GROUP BY _external_id")
    assert {i for i, _ in b_rows} == qualifying and {n for _, n in b_rows} == {1}
