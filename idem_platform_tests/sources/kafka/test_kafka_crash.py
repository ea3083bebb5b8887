"""A Kafka run killed before or after its PostgreSQL commit: the rerun commits everything once,
or writes nothing; and aborted transactions stay out when the broker hides them (read_committed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from idem_platform.contract.catalog import table_name
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines
from idem_platform.sources.kafka.offsets import committed_offsets
from idem_platform.write.staging import drop_stale_staging
from idem_platform_tests.helpers.cli import cli_env, idem_command
from idem_platform_tests.helpers.database import reset_database
from idem_platform_tests.helpers.faults import kill_at_fault
from idem_platform_tests.helpers.kafka import (
    TABLES,
    expected_outcome,
    ingest,
    kafka_config,
    stored_keys,
)
from idem_platform_tests.helpers.kafka_broker import Broker, create_topic, produce, spread

pytestmark = pytest.mark.kafka


def _ingest_command() -> list[str]:
    return idem_command("ingest", "--connector", "events")


def _commits(pg_url: str) -> int:
    with connect(pg_url) as conn:
        return int(conn.execute("SELECT count(*) FROM idem.commits WHERE NOT replay").fetchone()[0])


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before_apply", "after_apply"])
def test_a_killed_kafka_run_is_committed_once_by_the_rerun(
    pg_url: str, tmp_path: Path, kafka_broker: Broker, topic: str, point: str, spark: Any
) -> None:
    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 3)
    config = kafka_config(tmp_path, kafka_broker.bootstrap, [topic], pg_url=pg_url)
    messages = spread(threatfeed_lines(4000, seed=17, duplicate_ratio=0.1, bad_ratio=0.01), 3)
    produce(kafka_broker.bootstrap, topic, messages)
    marker = tmp_path / "paused.pid"
    kill_at_fault(_ingest_command(), cli_env(pg_url, tmp_path, config, f"{point}:pause:{marker}"), marker)
    assert _commits(pg_url) == (1 if point == "after_apply" else 0)

    # The kill needs a process of its own; the rerun does not (the session's Spark, no second JVM start).
    summary = ingest(pg_url, config, spark)
    if point == "before_apply":
        # Nothing of the killed run was visible: the rerun takes its ledger rows over and commits all.
        assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == 4000
    else:
        # The killed run's commit was durable: the rerun finds no lag and writes nothing.
        assert summary["rows_written"] == 0 and summary.get("nothing_to_ingest") is True
    assert _commits(pg_url) == 1
    keys, rejected = expected_outcome(config, messages, topic)
    assert stored_keys(pg_url) == keys
    with connect(pg_url) as conn:
        assert committed_offsets(conn, "events") == {(topic, p): sum(1 for m in messages if m[0] == p) for p in range(3)}
        assert conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE status <> 'committed'").fetchone() == (0,)
        if point == "after_apply":
            # Killed between COMMIT and dropping its staging templates: the hourly purge drops a
            # committed commit's leftovers whatever their age.
            with conn.transaction():
                assert drop_stale_staging(conn, 24 * 3600) == 4
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM idem.rejects").fetchone() == (rejected,)
        rows = sum(conn.execute(f'SELECT count(*) FROM idem.{table_name(t)}').fetchone()[0] for t in TABLES)
    assert rows == len(keys) and rejected > 0


def _transactional_batches(bootstrap: str, topic: str) -> dict[str, list[str]]:
    """Three transactions on partition 0: committed, aborted, committed. Returns the lines by fate."""
    from confluent_kafka import KafkaException, Producer

    lines = list(threatfeed_lines(30, seed=40, duplicate_ratio=0.0))
    batches = {"committed": lines[:10] + lines[20:], "aborted": lines[10:20]}
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"idem-test-{topic}", "linger.ms": 0, "batch.num.messages": 1})
    try:
        producer.init_transactions(30)
    except KafkaException as exc:
        pytest.skip(f"this broker has no transactions ({exc}); the read_committed test needs Apache Kafka")
    for chunk, commit in ((lines[:10], True), (lines[10:20], False), (lines[20:], True)):
        producer.begin_transaction()
        for line in chunk:
            producer.produce(topic, value=line.encode(), partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    return batches


def test_aborted_transactions_are_never_ingested(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    """Only meaningful where the broker hides aborted transactions from read_committed readers
    (Apache Kafka): on a broker that does not (Tansu) the test says so and is skipped, never faked."""
    from confluent_kafka import Consumer, TopicPartition

    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 1)
    batches = _transactional_batches(kafka_broker.bootstrap, topic)
    probe = Consumer({
        "bootstrap.servers": kafka_broker.bootstrap, "group.id": "idem-probe", "isolation.level": "read_committed",
        "enable.partition.eof": True, "enable.auto.commit": False,
    })
    probe.assign([TopicPartition(topic, 0, 0)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = probe.poll(1.0)
        if message is None:
            continue
        if message.error():
            break  # partition EOF
        seen.append(message.value())
    probe.close()
    if any(line.encode() in seen for line in batches["aborted"]):
        pytest.skip(
            "this broker shows aborted transactions to read_committed readers (Tansu does); point "
            "KAFKA_BOOTSTRAP_SERVERS at Apache Kafka to run this test"
        )
    config = kafka_config(tmp_path, kafka_broker.bootstrap, [topic], pg_url=pg_url)
    summary = ingest(pg_url, config, spark)
    assert summary["rows_written"] == len(batches["committed"]) and summary["rows_rejected"] == 0
    stored = stored_keys(pg_url)
    assert not any(line.split('"id": "')[1].split('"')[0] in key for key in stored for line in batches["aborted"])
    with connect(pg_url) as conn:
        # The committed offset passes the transaction markers: nothing is read again.
        (offset,) = committed_offsets(conn, "events").values()
    again = ingest(pg_url, config, spark)
    assert offset >= 32 and again.get("nothing_to_ingest") is True
