"""The Kafka path end to end on a real Kafka-protocol broker, PostgreSQL and Spark.

Offsets move in the rows' transaction: a range is committed once, poison
messages are rejects with their offsets, a run that finds its range committed
by another commits nothing, and keys are shared with the file path when the
connectors share a key namespace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from idem_platform.config import IdemConfig
from idem_platform.pipeline import commit as run
from idem_platform.pipeline import ingest as pipeline
from idem_platform.postgres import connect
from idem_platform.samples import threatfeed_lines
from idem_platform.sources.kafka.offsets import committed_offsets
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.kafka import (
    TABLES,
    expected_keys,
    ingest,
    kafka_config,
    stored_keys,
)
from idem_platform_tests.helpers.kafka_broker import Broker, create_topic, produce, spread
from idem_platform_tests.helpers.threads import at_once

pytestmark = pytest.mark.kafka


@pytest.fixture
def events(pg_url: str, tmp_path: Path, kafka_broker: Broker, topic: str) -> IdemConfig:
    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 3)
    return kafka_config(tmp_path, kafka_broker.bootstrap, [topic], pg_url=pg_url)


def test_ten_thousand_messages_over_three_partitions_are_ingested_once(
    pg_url: str, events: IdemConfig, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    lines = list(threatfeed_lines(10_000, seed=21, duplicate_ratio=0.1, bad_ratio=0.01))
    messages = spread(lines, 3)
    produce(kafka_broker.bootstrap, topic, messages)

    summary = ingest(pg_url, events, spark)
    assert summary["rows_written"] + summary["rows_skipped"] + summary["rows_rejected"] == 10_000
    assert summary["rows_rejected"] > 0 and summary["rows_skipped"] > 0
    assert stored_keys(pg_url) == expected_keys(events, messages, topic)
    assert summary["rows_written"] == len(stored_keys(pg_url))
    with connect(pg_url) as conn:
        offsets = committed_offsets(conn, "events")
    assert offsets == {(topic, p): sum(1 for m in messages if m[0] == p) for p in range(3)}
    assert sorted((o["topic"], o["partition"], o["from"], o["to"]) for o in summary["offsets"]) == sorted(
        (topic, p, 0, n) for (_, p), n in offsets.items()
    )
    # Rows know where they came from: position and the message's metadata.
    source, meta = rows(pg_url, "SELECT _source, _kafka FROM idem.indicator ORDER BY _source LIMIT 1")[0]
    partition, offset = int(source.split("@")[0].rsplit("-", 1)[1]), int(source.split("@")[1])
    assert source == f"{topic}-{partition}@{offset}" and meta["offset"] == offset and meta["partition"] == partition
    assert meta["key"].startswith("k") and meta["timestamp"] > 0
    (valid_through,) = rows(pg_url, "SELECT valid_through FROM idem.commits WHERE commit_id = %s", summary["commit_id"])[0]
    assert valid_through is not None and valid_through.year >= 2026
    assert summary["consumer_group"] == {"group": "idem-events", "committed": True}

    again = ingest(pg_url, events, spark)  # nothing new: nothing read, nothing written
    assert again["nothing_to_ingest"] is True and again["rows_written"] == 0 and again["commit_id"] is None
    assert rows(pg_url, "SELECT count(*) FROM idem.commits") == [(1,)]


def test_poison_messages_are_rejects_with_offsets_and_keys(
    pg_url: str, events: IdemConfig, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    good = next(iter(threatfeed_lines(1, seed=5)))
    poison = [
        (0, b"k-good", good.encode(), None),
        (0, b"k-utf8", b'{"type":"indicator","id":"x","name":"\xff\xfe"}', None),
        (0, b"k-json", b"{not json", None),
        (0, b"k-array", b"[1,2]", None),
        (0, b"k-tomb", None, None),
        (0, b"\xff\x00", b"", [("trace", b"abc")]),
    ]
    produce(kafka_broker.bootstrap, topic, poison)
    summary = ingest(pg_url, events, spark)
    assert (summary["rows_written"], summary["rows_rejected"]) == (1, 5)
    rejects = rows(
        pg_url, "SELECT source, position, line, raw, reasons, context FROM idem.rejects ORDER BY line"
    )
    assert [r[1] for r in rejects] == [f"{topic}-0@{n}" for n in range(1, 6)]
    assert [r[2] for r in rejects] == [1, 2, 3, 4, 5]
    assert all(r[0] == f"kafka:{topic}-0@0" for r in rejects)
    rules = [[e["rule"] for e in r[4]] for r in rejects]
    assert rules == [["json"], ["json"], ["not_object"], ["no_value"], ["blank"]]
    assert "invalid UTF-8" in rejects[0][4][0]["message"] and rejects[0][4][0]["message"].startswith("message")
    assert [r[5]["key"] for r in rejects[:4]] == ["k-utf8", "k-json", "k-array", "k-tomb"]
    assert rejects[4][5]["key"] == {"base64": "/wA="} and rejects[4][5]["headers"] == [["trace", "abc"]]
    assert all(r[5]["topic"] == topic and r[5]["partition"] == 0 for r in rejects)
    with connect(pg_url) as conn:
        assert committed_offsets(conn, "events") == {(topic, 0): 6}  # the range commits with its rejects


def test_two_runs_of_one_range_at_once_commit_it_once(
    pg_url: str, events: IdemConfig, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    produce(kafka_broker.bootstrap, topic, spread(threatfeed_lines(3000, seed=8, duplicate_ratio=0.0), 3))
    connector = events.connector("events")
    batches = [pipeline.plan_batch(pg_url, connector) for _ in range(2)]  # both plan the same ranges
    tables = pipeline.current_tables(pg_url, events, connector)
    results: list[dict[str, Any]] = []

    def commit(batch: Any) -> None:
        request = run.CommitRequest(url=pg_url, connector=connector, run_id=f"r{len(results)}")
        results.append(run.commit_batch(request, pipeline.CoercedBatch(batch, connector, tables), lambda: spark))

    failures = at_once(commit, batches)
    assert not failures, failures
    written = sorted(r["rows_written"] for r in results)
    assert written[0] == 0 and written[1] == 3000  # exactly one run wrote them
    replay = next(r for r in results if r["rows_written"] == 0)
    assert replay["replayed"] is True and replay["prior"]["rows_written"] == 3000
    assert rows(pg_url, "SELECT count(*) FROM idem.commits WHERE NOT replay") == [(1,)]


def test_a_range_another_run_moved_commits_nothing(
    pg_url: str, events: IdemConfig, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    """The compare-and-set itself: offsets moved under the run (by anything) → nothing commits."""
    produce(kafka_broker.bootstrap, topic, spread(threatfeed_lines(300, seed=9, duplicate_ratio=0.0), 3))
    connector = events.connector("events")
    first = ingest(pg_url, events, spark)  # commits 0..100 on every partition
    produce(kafka_broker.bootstrap, topic, spread(threatfeed_lines(300, seed=10, start=1000, duplicate_ratio=0.0), 3))
    batch = pipeline.plan_batch(pg_url, connector)  # plans 100..200
    with connect(pg_url) as conn:  # meanwhile partition 1 moves on without this run
        conn.execute("UPDATE idem.source_offsets SET next_offset = 150 WHERE partition = 1")
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, events, connector))
    summary = run.commit_batch(run.CommitRequest(url=pg_url, connector=connector, run_id="late"), coerced, lambda: spark)
    assert summary["commit_id"] is None and summary["rows_written"] == 0
    assert summary["already_committed"].startswith(f"range already committed: {topic}-1 is at offset 150")
    assert len(stored_keys(pg_url)) == first["rows_written"]  # nothing of the late run is visible
    with connect(pg_url) as conn:
        assert committed_offsets(conn, "events") == {(topic, 0): 100, (topic, 1): 150, (topic, 2): 100}
        # its ledger claims are released: the next run of those offsets starts fresh
        assert conn.execute("SELECT count(*) FROM idem.ingest_ledger WHERE status <> 'committed'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_staging'").fetchone() == (0,)


def test_keyless_records_from_two_topics_never_collide(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    reset_database(pg_url)
    other = f"{topic}-b"
    for name in (topic, other):
        create_topic(kafka_broker.bootstrap, name, 1)
        # The same keyless record, twice in each topic: missing_id position keys it by place.
        produce(kafka_broker.bootstrap, name, [(0, None, b'{"type":"malware","name":"same"}', None)] * 2)
    config = kafka_config(tmp_path, kafka_broker.bootstrap, [topic, other], pg_url=pg_url)
    summary = ingest(pg_url, config, spark)
    assert summary["rows_written"] == 4
    assert {k.split(":")[2] for k in stored_keys(pg_url)} == {f"{t}-0@{o}" for t in (topic, other) for o in (0, 1)}


def test_the_same_records_by_file_and_by_kafka_are_written_once(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 2)
    lines = list(threatfeed_lines(500, seed=31, duplicate_ratio=0.0))
    text = (
        KAFKA_AND_FILE.replace("{bootstrap}", kafka_broker.bootstrap).replace("{topic}", topic)
    )
    config = write_config(tmp_path, text)
    pipeline.prepare_tables(pg_url, config, config.connector("events"))
    drop = Path(str(config.connector("feed").path))
    drop.mkdir(parents=True)
    (drop / "export.ndjson").write_text("\n".join(lines) + "\n", encoding="utf-8")
    connector = config.connector("feed")
    batch = pipeline.plan_batch(pg_url, connector, [drop / "export.ndjson"])
    coerced = pipeline.CoercedBatch(batch, connector, pipeline.current_tables(pg_url, config, connector))
    by_file = run.commit_batch(run.CommitRequest(url=pg_url, connector=connector), coerced, lambda: spark)
    assert by_file["rows_written"] == 500

    produce(kafka_broker.bootstrap, topic, spread(lines, 2))
    by_kafka = ingest(pg_url, config, spark)
    assert (by_kafka["rows_written"], by_kafka["rows_skipped"]) == (0, 500)
    assert all(key.startswith("threatfeed:") for key in stored_keys(pg_url))
    assert rows(pg_url, "SELECT DISTINCT _connector FROM idem.indicator") == [("feed",)]


KAFKA_AND_FILE = """
connectors:
  - name: feed
    kind: filedrop
    path: drop
    record_type_field: type
    key_namespace: threatfeed
  - name: events
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topic}]
    record_type_field: type
    key_namespace: threatfeed
tables:
  indicator:
    columns:
      name: {type: string, required: true}
      confidence: int
  malware:
    columns:
      name: {type: string, required: true}
  threat-actor:
    columns:
      name: {type: string, required: true}
"""


def test_config_errors_name_the_kafka_key(tmp_path: Path) -> None:
    from idem_platform.config import parse_config
    from idem_platform.errors import ConfigError

    base = KAFKA_AND_FILE.replace("{bootstrap}", "127.0.0.1:1").replace("{topic}", "t")
    with pytest.raises(ConfigError, match=r"client_config.*'group.id' is set by idem"):
        parse_config(base.replace("    key_namespace: threatfeed\ntables", "    key_namespace: threatfeed\n    client_config: {group.id: x}\ntables"))
    with pytest.raises(ConfigError, match="topics: only for kind: kafka connectors"):
        parse_config(base.replace("    path: drop\n", "    path: drop\n    topics: [a]\n"))
    with pytest.raises(ConfigError, match="is not a Kafka topic name"):
        parse_config(base.replace("topics: [t]", "topics: ['a b']"))
    assert json.dumps(parse_config(base).connector("events").group) == '"idem-events"'


def test_kafka_metadata_ignore_keeps_no_message_metadata_in_rows_but_rejects_keep_it(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Broker, topic: str
) -> None:
    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 1)
    config = kafka_config(tmp_path, kafka_broker.bootstrap, [topic], "kafka_metadata: ignore", pg_url=pg_url)
    produce(kafka_broker.bootstrap, topic, [(0, b"k1", next(iter(threatfeed_lines(1, seed=3))).encode(), None), (0, b"k2", b"oops", None)])
    summary = ingest(pg_url, config, spark)
    assert (summary["rows_written"], summary["rows_rejected"]) == (1, 1)
    columns = {name for table in TABLES for (name,) in rows(
        pg_url, "SELECT column_name FROM information_schema.columns WHERE table_schema = 'idem' AND table_name = %s", table
    )}
    assert "_kafka" not in columns and "_source" in columns
    assert rows(pg_url, "SELECT context ->> 'key' FROM idem.rejects") == [("k2",)]  # a poison message is still found


SCHEMA_REGISTRY_KEY = b"\x00\x00\x00\x00\x01abc"  # magic byte 0x00, 4-byte schema id, then the key


@pytest.mark.parametrize("kafka_metadata", ["include", "ignore"])
def test_nul_bytes_in_keys_headers_and_values_never_block_the_partition(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Broker, topic: str, kafka_metadata: str
) -> None:
    """A key or header holding NUL (every Schema Registry key starts with one) is valid UTF-8
    that PostgreSQL's jsonb refuses: it once failed the range's commit as a "transient" error,
    naming no offset, and every later message of the partition waited behind it for good.
    Metadata with NUL is kept as base64, like non-UTF-8; a value with NUL is that record's reject."""
    reset_database(pg_url)
    create_topic(kafka_broker.bootstrap, topic, 1)
    config = kafka_config(tmp_path, kafka_broker.bootstrap, [topic], f"kafka_metadata: {kafka_metadata}", pg_url=pg_url)
    good = [line.encode() for line in threatfeed_lines(4, seed=8, duplicate_ratio=0.0)]
    messages = [
        (0, SCHEMA_REGISTRY_KEY, good[0], None),
        (0, b"k1", good[1], [("trace", b"a\x00b"), ("plain", b"c")]),
        (0, SCHEMA_REGISTRY_KEY, b"oops", [("trace", b"\x00")]),  # a poison message: its context keeps the key
        (0, b"k3", b'{"type":"indicator","id":"n1","name":"a\\u0000b"}', None),  # the JSON escape
        (0, b"k4", b'{"type":"indicator","id":"n2","name":"a\x00b"}', None),  # a literal NUL byte
        (0, b"k5", b'{"type":"indicator","id":"n3","name":"x","tags":{"k":"\\u0000"}}', None),  # in a dynamic value
        (0, b"k6", good[2], None),
        (0, b"k7", good[3], None),
    ]
    produce(kafka_broker.bootstrap, topic, messages)
    summary = ingest(pg_url, config, spark)
    assert (summary["rows_written"], summary["rows_rejected"]) == (4, 4)
    with connect(pg_url) as conn:
        assert committed_offsets(conn, "events") == {(topic, 0): len(messages)}
    rejects = rows(pg_url, "SELECT line, raw, reasons, context FROM idem.rejects ORDER BY line")
    assert [r[0] for r in rejects] == [2, 3, 4, 5]
    assert [[e["rule"] for e in r[2]] for r in rejects] == [["json"], ["nul"], ["json"], ["nul"]]
    schema_key = {"base64": "AAAAAAFhYmM="}
    assert rejects[0][3]["key"] == schema_key and rejects[0][3]["headers"] == [["trace", {"base64": "AA=="}]]
    assert rejects[1][1] == '{"type":"indicator","id":"n1","name":"a\\u0000b"}'  # the escape is fine as text
    assert "\x00" not in rejects[2][1] and rejects[2][1].startswith('{"type":"indicator","id":"n2"')
    if kafka_metadata == "include":
        kept = dict(rows(pg_url, "SELECT _source, _kafka FROM idem.indicator UNION ALL SELECT _source, _kafka FROM idem.malware "
                         "UNION ALL SELECT _source, _kafka FROM idem.threat_actor"))
        assert kept[f"{topic}-0@0"]["key"] == schema_key
        assert kept[f"{topic}-0@1"]["headers"] == [["trace", {"base64": "YQBi"}], ["plain", "c"]]
    # The partition goes on: later messages commit behind them.
    produce(kafka_broker.bootstrap, topic, [(0, SCHEMA_REGISTRY_KEY, b'{"type":"malware","id":"m9","name":"z"}', None)])
    assert ingest(pg_url, config, spark)["rows_written"] == 1
    with connect(pg_url) as conn:
        assert committed_offsets(conn, "events") == {(topic, 0): len(messages) + 1}


def test_message_metadata_keeps_nul_and_non_utf8_as_base64_and_other_text_as_text() -> None:
    """Header names too: librdkafka hands them over as C strings (cut at NUL), another
    client library may not."""
    from idem_platform.sources.kafka.reader import message_meta

    meta = json.loads(message_meta(
        "t", 0, 7, SCHEMA_REGISTRY_KEY, [("a\x00b", b"v"), ("é", b"\xff"), ("n", None), ("ok", "ü".encode())], (1, 5)
    ))
    assert meta["key"] == {"base64": "AAAAAAFhYmM="}
    assert meta["headers"] == [[{"base64": "YQBi"}, "v"], ["é", {"base64": "/w=="}], ["n", None], ["ok", "ü"]]
    assert "\\u0000" not in json.dumps(meta)
