"""The Kafka connector's Dagster surface on a real broker: the sensor's requests and skips, the job
in process with the sensor's run config, and the CLI (``idem ingest`` of a Kafka connector, ``idem offsets``)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from idem_platform.config import IdemConfig
from idem_platform.ledger import Ledger
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.kafka import kafka_config
from idem_platform_tests.helpers.kafka_broker import (
    Broker,
    add_partitions,
    create_topic,
    produce,
    spread,
)
from idem_platform_tests.helpers.sensors import SensorTicker

pytestmark = pytest.mark.kafka


class Ticker(SensorTicker):
    """The Kafka connector's sensor, and its job for the runs it requests."""

    def __init__(self, config: IdemConfig, instance: dg.DagsterInstance, pg_url: str) -> None:
        super().__init__(config, instance, pg_url, "events_kafka_sensor")

    def run(self, request: dg.RunRequest, job: str = "events_ingest") -> dg.ExecuteInProcessResult:
        return super().run(request, job)


def skip_message(result: dg.SensorResult) -> str:
    return (result.skip_reason.skip_message or "") if result.skip_reason else ""


def ranges_of(request: dg.RunRequest) -> list[tuple[int, int, int]]:
    config = request.run_config["ops"]["events__ingest"]["config"]["ranges"]
    return sorted((r["partition"], r["start"], r["end"]) for r in config)


@pytest.fixture
def events(pg_url: str, tmp_path: Path, kafka_broker: Broker, topic: str) -> IdemConfig:
    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 3)
    return kafka_config(tmp_path, kafka_broker.bootstrap, [topic], pg_url=pg_url)


def committed_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    (materialization,) = [m for m in result.asset_materializations_for_node("events__committed") if m.asset_key.path[-1] == "committed"]
    return {k: v.value for k, v in materialization.metadata.items()}


def test_sensor_requests_the_lag_runs_it_once_and_picks_up_new_partitions(
    pg_url: str, events: IdemConfig, instance: dg.DagsterInstance, kafka_broker: Broker, topic: str
) -> None:
    ticker = Ticker(events, instance, pg_url)
    assert "lag 0" in skip_message(ticker.tick())  # an empty topic: nothing to request

    produce(kafka_broker.bootstrap, topic, spread(threatfeed_lines(90, seed=4, duplicate_ratio=0.0), 3))
    (request,) = ticker.tick().run_requests or []
    assert ranges_of(request) == [(0, 0, 30), (1, 0, 30), (2, 0, 30)]
    assert request.run_key == f"events:{topic}-0@0..30#1,{topic}-1@0..30#1,{topic}-2@0..30#1"
    assert json.loads(ticker.cursor or "{}")["lag"] == 90

    result = ticker.run(request)
    assert result.success
    metadata = committed_metadata(result)
    assert (metadata["rows_written"], metadata["rows_skipped"], metadata["rows_rejected"]) == (90, 0, 0)
    assert sorted((o["partition"], o["from"], o["to"]) for o in metadata["offsets"]) == ranges_of(request)
    ingest_metadata = {k: v.value for k, v in result.asset_materializations_for_node("events__ingest")[0].metadata.items()}
    assert ingest_metadata["messages"] == 90 and len(ingest_metadata["ranges"]) == 3
    assert "lag 0" in skip_message(ticker.tick())



def test_topics_and_partitions_that_appear_later_are_picked_up(
    pg_url: str, tmp_path: Path, instance: dg.DagsterInstance, kafka_broker: Broker, topic: str
) -> None:
    reset_database(pg_url)
    later = f"{topic}-later"
    create_topic(kafka_broker.bootstrap, topic, 1)
    config = kafka_config(tmp_path, kafka_broker.bootstrap, [topic, later], pg_url=pg_url)
    ticker = Ticker(config, instance, pg_url)
    produce(kafka_broker.bootstrap, topic, [(0, None, line.encode(), None) for line in threatfeed_lines(4, seed=1)])
    first = ticker.tick()
    (request,) = first.run_requests or []  # the topic that exists is not held back by the one that does not
    assert ranges_of(request) == [(0, 0, 4)]
    assert ticker.run(request).success
    assert f"topic(s) {later} not in the cluster yet" in skip_message(ticker.tick())

    create_topic(kafka_broker.bootstrap, later, 2)
    produce(kafka_broker.bootstrap, later, spread(threatfeed_lines(6, seed=2, start=100), 2))
    (request,) = ticker.tick().run_requests or []
    config_ranges = request.run_config["ops"]["events__ingest"]["config"]["ranges"]
    assert sorted((r["topic"], r["partition"], r["start"], r["end"]) for r in config_ranges) == [
        (later, 0, 0, 3), (later, 1, 0, 3)
    ]
    assert ticker.run(request).success

    from confluent_kafka import KafkaException

    try:
        add_partitions(kafka_broker.bootstrap, later, 3)
    except KafkaException as exc:
        if "UNSUPPORTED_FEATURE" not in str(exc):
            raise
        pytest.skip(f"this broker cannot add partitions to a topic ({exc.args[0].str()}); new topics were picked up")
    produce(kafka_broker.bootstrap, later, [(2, None, line.encode(), None) for line in threatfeed_lines(5, seed=6, start=500)])
    (request,) = ticker.tick().run_requests or []
    assert ranges_of(request) == [(2, 0, 5)]
    assert ticker.run(request).success


def test_a_failed_range_is_requested_again_with_a_new_key_and_a_live_run_holds_it(
    pg_url: str, events: IdemConfig, instance: dg.DagsterInstance, kafka_broker: Broker, topic: str
) -> None:
    produce(kafka_broker.bootstrap, topic, [(0, None, line.encode(), None) for line in threatfeed_lines(10, seed=2)])
    ticker = Ticker(events, instance, pg_url)
    (first,) = ticker.tick().run_requests or []
    key = f"kafka:{topic}-0@0"
    with connect(pg_url) as conn, conn.transaction():
        ledger = Ledger(conn, "events")
        ledger.begin(key, {"connector": "events", "topic": topic, "partition": 0, "from": 0}, owner="dead-run/c1")
        ledger.fail_permanent(key, {"class": "KafkaError", "message": "broker went away", "retryable": True}, owner="dead-run/c1")
    (second,) = ticker.tick().run_requests or []
    assert ranges_of(second) == ranges_of(first) and second.run_key != first.run_key
    assert second.run_key.endswith("#2")
    with connect(pg_url) as conn, conn.transaction():  # the same failure, now one that cannot pass
        conn.execute("UPDATE idem.ingest_ledger SET error = jsonb_set(error, '{retryable}', 'false')")
    assert "failed permanently: broker went away" in skip_message(ticker.tick())


def test_broker_down_skips_the_tick_and_the_next_tick_resumes_without_loss(
    pg_url: str, tmp_path: Path, instance: dg.DagsterInstance, kafka_broker: Broker, topic: str
) -> None:
    if kafka_broker.external:
        pytest.skip("stopping the broker needs the test's own Tansu; an external cluster is not stopped")
    reset_database(pg_url)
    own = Broker.start_tansu()
    try:
        create_topic(own.bootstrap, topic, 2)
        produce(own.bootstrap, topic, spread(threatfeed_lines(40, seed=3, duplicate_ratio=0.0), 2))
        config = kafka_config(tmp_path, own.bootstrap, [topic], pg_url=pg_url)
        ticker = Ticker(config, instance, pg_url)
        own.pause()  # the broker stops answering (SIGSTOP): nothing is lost, nothing answers
        started = time.monotonic()
        paused = ticker.tick()
        assert not paused.run_requests and time.monotonic() - started < 30
        assert "unreachable" in skip_message(paused) and "no offset moved" in skip_message(paused)
        own.resume()
        (request,) = ticker.tick().run_requests or []
        assert ranges_of(request) == [(0, 0, 20), (1, 0, 20)]
        assert ticker.run(request).success
        own.stop()  # gone altogether: refused connections, the same skip
        assert "unreachable" in skip_message(ticker.tick())
        with connect(pg_url) as conn:
            assert conn.execute("SELECT count(*) FROM idem.malware").fetchone()[0] + conn.execute(
                "SELECT count(*) FROM idem.indicator"
            ).fetchone()[0] + conn.execute('SELECT count(*) FROM idem.threat_actor').fetchone()[0] == 40
    finally:
        own.stop()


def _idem(pg_url: str, tmp_path: Path, config: IdemConfig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        idem_command(*args), env=cli_env(pg_url, tmp_path, config), capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_ingests_the_lag_and_shows_offsets(
    pg_url: str, events: IdemConfig, tmp_path: Path, kafka_broker: Broker, topic: str
) -> None:
    produce(kafka_broker.bootstrap, topic, spread(threatfeed_lines(300, seed=12, duplicate_ratio=0.0), 3))
    done = _idem(pg_url, tmp_path, events, "ingest", "--connector", "events")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["rows_written"], summary["files"]) == (300, [])
    assert sorted(o["to"] for o in summary["offsets"]) == [100, 100, 100]

    produce(kafka_broker.bootstrap, topic, [(1, None, line.encode(), None) for line in threatfeed_lines(7, seed=13, start=900)])
    shown = _idem(pg_url, tmp_path, events, "offsets", "--connector", "events")
    assert shown.returncode == 0, shown.stderr[-3000:]
    report = {r["partition"]: r for r in json.loads(shown.stdout)["offsets"]}
    assert {p: (r["committed"], r["high"], r["lag"]) for p, r in report.items()} == {
        0: (100, 100, 0), 1: (100, 107, 7), 2: (100, 100, 0)
    }
    assert report[0]["commit_id"] == summary["commit_id"]

    wrong = _idem(pg_url, tmp_path, events, "ingest", "--connector", "events", "some.ndjson")
    assert wrong.returncode == 1 and wrong.stderr.strip().splitlines()[-1].startswith("idem: error: connector 'events' reads")
