"""Sources read again owe no effect: a Kafka range re-read (offsets reset, or a second connector
of the same key namespace reading the topic from the start) and a file partition materialized
again in Dagster leave the outbox as the first commit left it. Real Kafka-protocol broker,
PostgreSQL, Spark and Dagster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from idem_platform.config import IdemConfig
from idem_platform.defs.definitions import build_definitions
from idem_platform.defs.filedrop.partitions import partition_key_for, partitions_for
from idem_platform.idempotency import mint_key
from idem_platform.postgres import connect
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.effects import alert, effects_config, outbox
from idem_platform_tests.helpers.kafka import KAFKA_CONFIG
from idem_platform_tests.helpers.kafka import ingest as ingest_kafka
from idem_platform_tests.helpers.kafka_broker import Broker, create_topic, produce, spread

ALERT_URL = "http://127.0.0.1:9/alert"  # never called: these tests stop at the commit
RECORDS = [
    {"type": "indicator", "id": "q1", "name": "bad.example", "confidence": 90},
    {"type": "indicator", "id": "n1", "name": "meh.example", "confidence": 79},
    {"type": "indicator", "id": "q2", "name": "edge.example", "confidence": 80},  # gte: qualifies
    {"type": "malware", "id": "m1", "name": "emotet"},  # no effect on its record type
    {"type": "indicator", "id": "n2", "name": "unknown.example"},  # null confidence: never qualifies
    {"type": "indicator", "id": "q3", "name": "worse.example", "confidence": 99},
    {"type": "indicator", "id": "r1", "name": "x", "confidence": "high"},  # rejected
    {"type": "malware", "id": "m2", "name": "trickbot"},
    {"type": "indicator", "id": "n3", "name": "low.example", "confidence": 10},
]
QUALIFYING = ["q1", "q2", "q3"]
VALID = len(RECORDS) - 1  # every record but the rejected one is written once


def owed_ids(pg_url: str) -> list[str]:
    return sorted(r["payload"]["id"] for r in outbox(pg_url))


def assert_default_keys(pg_url: str, connector: str) -> None:
    """Each outbox row's key is the minted key of its committed row's default parts."""
    hashes = dict(rows(pg_url, "SELECT _external_id, _content_hash FROM idem.indicator"))
    for row in outbox(pg_url):
        ext_id = row["payload"]["id"]
        assert row["key"] == mint_key("alert", connector, "indicator", ext_id, hashes[ext_id])


# --- Kafka: a re-read range -------------------------------------------------------------------


@pytest.fixture
def kafka_effects(pg_url: str, tmp_path: Path, kafka_broker: Broker, topic: str) -> IdemConfig:
    """Connector ``events`` on ``topic`` (two partitions) with the ``alert`` effect, and
    ``events-again``: the same topic under the same key namespace, with no offsets of its own."""
    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 2)
    data = yaml.safe_load(KAFKA_CONFIG.format(bootstrap=kafka_broker.bootstrap, topics=topic, extra=""))
    (events,) = data["connectors"]
    data["connectors"].append({**events, "name": "events-again", "key_namespace": "events"})
    data["effects"] = [alert(ALERT_URL)]
    return write_config(tmp_path, yaml.safe_dump(data, sort_keys=False))


@pytest.fixture
def first_commit(pg_url: str, kafka_effects: IdemConfig, spark: Any, kafka_broker: Broker, topic: str) -> list[dict[str, Any]]:
    """The topic's messages ingested once by ``events``: one outbox row per qualifying message."""
    produce(kafka_broker.bootstrap, topic, spread([json.dumps(r) for r in RECORDS], 2))
    first = ingest_kafka(pg_url, kafka_effects, spark, "events")
    assert (first["rows_written"], first["rows_skipped"], first["rows_rejected"]) == (VALID, 0, 1)
    assert (first["effects_created"], first["effects_suppressed"]) == (len(QUALIFYING), 0)
    assert owed_ids(pg_url) == QUALIFYING
    assert rows(pg_url, "SELECT DISTINCT commit_id::text FROM idem.outbox") == [(first["commit_id"],)]
    assert_default_keys(pg_url, "events")
    return outbox(pg_url)


@pytest.mark.kafka
def test_a_kafka_range_read_again_after_an_offset_reset_owes_nothing(
    pg_url: str, kafka_effects: IdemConfig, spark: Any, first_commit: list[dict[str, Any]], kafka_broker: Broker, topic: str
) -> None:
    with connect(pg_url, autocommit=True) as conn:  # rewound to offset 1 of each partition: a new range
        assert conn.execute("UPDATE idem.source_offsets SET next_offset = 1 WHERE connector = 'events'").rowcount == 2
    rewound = ingest_kafka(pg_url, kafka_effects, spark, "events")
    assert rewound["replayed"] is False and rewound["commit_id"] is not None  # read and coerced again
    assert (rewound["rows_written"], rewound["rows_skipped"] + rewound["rows_rejected"]) == (0, len(RECORDS) - 2)
    assert (rewound["effects_created"], rewound["effects_suppressed"]) == (0, 0)
    assert outbox(pg_url) == first_commit

    offsets_query = "SELECT partition, next_offset FROM idem.source_offsets WHERE connector = 'events' ORDER BY 1"
    committed_offsets = rows(pg_url, offsets_query)
    with connect(pg_url, autocommit=True) as conn:  # every offset forgotten: the topic from offset 0
        assert conn.execute("DELETE FROM idem.source_offsets WHERE connector = 'events'").rowcount == 2
    reset = ingest_kafka(pg_url, kafka_effects, spark, "events")
    # The range from offset 0 is in the ledger as committed: the run replays its result, and
    # each partition's offset is written back from the ledger (where that range ended).
    assert reset["replayed"] is True and reset["rows_written"] == 0 and reset.get("effects_created", 0) == 0
    assert outbox(pg_url) == first_commit
    assert rows(pg_url, offsets_query) == committed_offsets

    # Forgotten again, and a message produced before the next run: partition 0 is replayed
    # (its offset back), partition 1's committed range is followed to its end and the message
    # past it is read, owes once, and moves the offset on.
    with connect(pg_url, autocommit=True) as conn:
        assert conn.execute("DELETE FROM idem.source_offsets WHERE connector = 'events'").rowcount == 2
    fresh = {"type": "indicator", "id": "q5", "name": "late.example", "confidence": 97}
    produce(kafka_broker.bootstrap, topic, [(1, b"k-late", json.dumps(fresh).encode(), None)])
    later = ingest_kafka(pg_url, kafka_effects, spark, "events")
    assert later["replayed"] is False and later["rows_written"] == 1  # the committed ranges: counted as skipped
    assert later["effects_created"] == 1 and owed_ids(pg_url) == sorted([*QUALIFYING, "q5"])
    (p0, p1) = committed_offsets
    assert rows(pg_url, offsets_query) == [p0, (1, p1[1] + 1)]
    again = ingest_kafka(pg_url, kafka_effects, spark, "events")
    assert again["rows_written"] == 0 and len(outbox(pg_url)) == len(first_commit) + 1


@pytest.mark.kafka
def test_a_second_connector_of_the_key_namespace_reading_from_the_start_owes_nothing(
    pg_url: str, kafka_effects: IdemConfig, spark: Any, first_commit: list[dict[str, Any]], kafka_broker: Broker, topic: str
) -> None:
    again = ingest_kafka(pg_url, kafka_effects, spark, "events-again")
    assert again["replayed"] is False and again["commit_id"] is not None
    assert (again["rows_written"], again["rows_skipped"], again["rows_rejected"]) == (0, VALID, 1)
    assert (again["effects_created"], again["effects_suppressed"]) == (0, 0)
    assert outbox(pg_url) == first_commit
    # A new qualifying message read in one range with committed ones (rewound to offset 1 of
    # each partition: a range not read before): it alone owes, once.
    fresh = {"type": "indicator", "id": "q4", "name": "new.example", "confidence": 95}
    produce(kafka_broker.bootstrap, topic, [(0, b"k-fresh", json.dumps(fresh).encode(), None)])
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE idem.source_offsets SET next_offset = 1 WHERE connector = 'events-again'")
    mixed = ingest_kafka(pg_url, kafka_effects, spark, "events-again")
    # Read again: offsets 1.. of both partitions (RECORDS[2:] less the first of partition 1), q4 new.
    assert (mixed["rows_written"], mixed["rows_skipped"], mixed["rows_rejected"]) == (1, VALID - 2, 1)
    assert mixed["effects_created"] == 1
    added = [r for r in outbox(pg_url) if r not in first_commit]
    assert [r["payload"]["id"] for r in added] == ["q4"] and len(outbox(pg_url)) == len(first_commit) + 1


# --- Dagster: a re-materialized file partition -----------------------------------------------


def committed_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    (event,) = [
        m for m in result.asset_materializations_for_node("threatfeed__committed") if m.asset_key.path[-1] == "committed"
    ]
    return {k: v.value for k, v in event.metadata.items()}


def test_a_file_partition_materialized_again_owes_nothing(
    tmp_path: Path, pg_url: str, instance: dg.DagsterInstance, spark: Any
) -> None:
    config = effects_config(tmp_path, pg_url, [alert(ALERT_URL)])
    defs = build_definitions(config, postgres_url=pg_url)
    job = defs.resolve_job_def("threatfeed_ingest")
    connector = config.connector("threatfeed")
    assert connector.path is not None
    path = write_lines(connector.path / "day1.ndjson", [json.dumps(r) for r in RECORDS])
    key = partition_key_for(connector, path)
    instance.add_dynamic_partitions(partitions_for(connector).name or "", [key])

    # As the file-drop sensor's run: the partition with its files named in the run config.
    first = job.execute_in_process(
        instance=instance, partition_key=key, run_config={"ops": {"threatfeed__ingest": {"config": {"files": [str(path)]}}}}
    )
    assert first.success
    committed = committed_metadata(first)
    assert (committed["rows_written"], committed["rows_rejected"], committed["replayed"]) == (VALID, 1, False)
    assert committed["effects_created"] == len(QUALIFYING)
    assert owed_ids(pg_url) == QUALIFYING
    assert rows(pg_url, "SELECT DISTINCT commit_id::text FROM idem.outbox") == [(committed["commit_id"],)]
    assert_default_keys(pg_url, "threatfeed")
    before = outbox(pg_url)

    # As the UI's "Materialize" of that partition: no run config, the partition's file.
    again = job.execute_in_process(instance=instance, partition_key=key)
    assert again.success
    replay = committed_metadata(again)
    assert replay["replayed"] is True and replay["rows_written"] == 0
    assert replay["prior"]["commit_id"] == committed["commit_id"]
    assert replay.get("effects_created", 0) == 0
    assert outbox(pg_url) == before

    # The partition's file rewritten with one more qualifying record: only that row owes.
    fresh = {"type": "indicator", "id": "q4", "name": "new.example", "confidence": 95}
    write_lines(path, [json.dumps(r) for r in [*RECORDS, fresh]])
    grown = job.execute_in_process(instance=instance, partition_key=key)
    assert grown.success
    metadata = committed_metadata(grown)
    assert (metadata["replayed"], metadata["rows_written"], metadata["rows_skipped"]) == (False, 1, VALID)
    assert metadata["effects_created"] == 1
    added = [r for r in outbox(pg_url) if r not in before]
    assert [r["payload"]["id"] for r in added] == ["q4"] and len(outbox(pg_url)) == len(before) + 1
