"""Upsert tables without ``order_by``: versions in the source's own order (commit order, then a
file's lines or a partition's offsets), through the real pipeline on real PostgreSQL.

The property: whatever the split of one event sequence into files, re-deliveries of committed
files (the same file again, a copy under another name) and commits that fail and are retried,
``idem.<type>_current`` equals the fold of the lines committed, in commit order, by position:
per identity its last line, none when that is a delete. A value that comes back (A, B, A) is a
new version at its new position, so it is current again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idem_platform.config import parse_config
from idem_platform.contract.catalog import SOURCE_ORDER
from idem_platform.errors import TransientError
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import fresh_config, rows
from idem_platform_tests.helpers.ingest import commit_files, ingest_records
from idem_platform_tests.helpers.upsert import BY_SOURCE


def current(pg_url: str) -> dict[str, Any]:
    """``idem.indicator_current``: identity -> its value."""
    return dict(rows(pg_url, "SELECT _external_id, value FROM idem.indicator_current"))


def folded(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The expected current state: per id its last line, none when that is a delete."""
    last: dict[str, dict[str, Any]] = {}
    for line in lines:
        last[line["id"]] = line
    return {key: line.get("value") for key, line in last.items() if line.get("op") != "d"}


# --- configuration ---------------------------------------------------------------------------


def test_an_upsert_table_without_order_by_is_in_the_source_order() -> None:
    config = parse_config(BY_SOURCE.replace("path: drop", "path: /tmp/drop"))
    upsert = config.table_specs["indicator"].upsert
    assert upsert is not None and upsert.by_source and upsert.order_by == SOURCE_ORDER
    with_order = parse_config(
        "tables:\n  indicator:\n    mode: upsert\n    order_by: v\n    columns: {v: long}\n"
    )
    assert with_order.table_specs["indicator"].upsert is not None
    assert not with_order.table_specs["indicator"].upsert.by_source


# --- end to end ------------------------------------------------------------------------------


def test_the_last_line_wins_a_value_that_comes_back_is_current_and_a_copy_changes_nothing(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = fresh_config(tmp_path, pg_url, BY_SOURCE)
    first = ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "value": "A"},
        {"id": "b", "value": "1"},
        {"id": "a", "value": "B"},
        {"id": "a", "value": "B"},
    ])
    counts = first["tables"]["indicator"]
    # Every line is a version at its position (the repeated B too); per id the last is current.
    assert [counts[k] for k in ("written", "inserted", "updated", "stale")] == [4, 2, 0, 2]
    assert current(pg_url) == {"a": "B", "b": "1"}
    second = ingest_records(pg_url, config, spark, "feed", "2.ndjson", [{"id": "a", "value": "A"}, {"id": "b", "op": "d"}])
    assert (second["tables"]["indicator"]["updated"], second["tables"]["indicator"]["deleted"]) == (
        1,
        1,
    )
    assert current(pg_url) == {"a": "A"}  # A came back: the version at the later position
    # Its content hash (and record key) covers its position: sha1("<position>\n<sha1(canonical)>").
    for source, content_hash, key, payload in rows(
        pg_url, "SELECT _source, _content_hash, _idempotency_key, _payload FROM idem.indicator"
    ):
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        expected = hashlib.sha1(
            f"{source}\n{hashlib.sha1(canonical).hexdigest()}".encode()
        ).hexdigest()
        assert (content_hash, key) == (expected, f"feed:indicator:{payload['id']}:{expected[:12]}")
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator WHERE value = 'A'") == [(2,)]
    # The state's order is the history row's _source_order: [the commit's number, its position].
    ((order, source_order, source),) = rows(
        pg_url,
        "SELECT s._order, h._source_order, h._source FROM idem.indicator_state s "
        "JOIN idem.indicator h ON h._idempotency_key = s._record_key WHERE s._external_id = 'a'",
    )
    assert order == source_order and source.endswith("#L1") and order[1] == 1
    ((first_order,),) = rows(pg_url, "SELECT min(_source_order) FROM idem.indicator")
    assert first_order[0] < order[0]  # the second commit's number is greater
    # The first file again, and a copy of it under another name: replays, nothing changes.
    drop = config.connector("feed").path
    assert drop is not None
    (drop / "copy.ndjson").write_bytes((drop / "1.ndjson").read_bytes())
    for name in ("1.ndjson", "copy.ndjson"):
        replay = commit_files(pg_url, config, spark, "feed", [drop / name])
        assert replay["rows_written"] == 0
    assert current(pg_url) == {"a": "A"}
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator") == [(6,)]


def test_files_one_commit_takes_are_in_the_order_it_reads_them(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = fresh_config(tmp_path, pg_url, BY_SOURCE)
    drop = config.connector("feed").path
    assert drop is not None
    late = write_lines(drop / "2026-01-02.ndjson", [json.dumps({"id": "a", "value": "second"})])
    early = write_lines(drop / "2026-01-01.ndjson", [json.dumps({"id": "a", "value": "first"})])
    summary = commit_files(pg_url, config, spark, "feed", [late, early])
    assert summary["rows_written"] == 2
    assert current(pg_url) == {"a": "second"}  # name order within the commit
    orders = rows(pg_url, "SELECT value, _source_order FROM idem.indicator ORDER BY _source_order")
    assert [value for value, _ in orders] == ["first", "second"]
    assert orders[0][1][0] == orders[1][1][0]  # one commit, one number


def test_a_copy_in_the_same_batch_is_the_same_file(pg_url: str, tmp_path: Path, spark: Any) -> None:
    """``a`` and its copy ``z`` in one batch, ``b`` between them in path order, each file over
    several slices (``split_bytes``): the copy's records have ``a``'s keys, and the earliest
    slice wins a repeated key, so the version is ``a``'s, at ``a``'s place, and ``b``'s
    version stays the later one."""
    config = fresh_config(
        tmp_path, pg_url, BY_SOURCE.replace("id_field: id", "id_field: id\n    split_bytes: 65536")
    )
    drop = config.connector("feed").path
    assert drop is not None
    filler = [json.dumps({"id": f"f{n}", "value": "x" * 40}) for n in range(3000)]
    a = write_lines(drop / "a.ndjson", [*filler, json.dumps({"id": "x", "value": "A"})])
    b = write_lines(drop / "b.ndjson", [json.dumps({"id": "x", "value": "B"})])
    z = drop / "z.ndjson"
    z.write_bytes(a.read_bytes())
    summary = commit_files(pg_url, config, spark, "feed", [z, b, a])
    assert summary["rows_written"] == 3002
    assert current(pg_url)["x"] == "B"
    ((order,),) = rows(pg_url, "SELECT _source_order FROM idem.indicator WHERE value = 'A'")
    assert order[1] >> 40 == 0  # a's unit


def test_switching_between_order_by_and_the_source_order_rebuilds_the_state(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    """An append table's history (no ``_source_order``) becomes a source-ordered upsert table:
    its versions are ordered by their commit's time, then their line; new versions follow."""
    append = BY_SOURCE.replace(
        "    mode: upsert\n    delete_when: {field: op, equals: d}\n", ""
    ).replace("value: string", "value: string\n      version: long")
    config = fresh_config(tmp_path, pg_url, append)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [
        {"id": "a", "value": "A", "version": 2},
        {"id": "a", "value": "B", "version": 1},
    ])
    ingest_records(
        pg_url, config, spark, "feed", "2.ndjson", [{"id": "b", "value": "1", "version": 1}]
    )
    by_source = write_config(
        tmp_path, BY_SOURCE.replace("value: string", "value: string\n      version: long")
    )
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, by_source.table_specs)
    assert current(pg_url) == {"a": "B", "b": "1"}
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator WHERE _source_order IS NULL") == [(3,)]
    ingest_records(
        pg_url, by_source, spark, "feed", "3.ndjson", [{"id": "b", "value": "2", "version": 0}]
    )
    assert current(pg_url) == {"a": "B", "b": "2"}
    ordered = write_config(
        tmp_path,
        append.replace("  indicator:\n", "  indicator:\n    mode: upsert\n    order_by: version\n"),
    )
    with connect(pg_url, autocommit=True) as conn:  # order_by now: the state is rebuilt by version
        sync_tables(conn, ordered.table_specs)
    assert current(pg_url) == {"a": "A", "b": "1"}


# --- the property ----------------------------------------------------------------------------

EVENTS = st.lists(
    st.fixed_dictionaries(
        {"id": st.sampled_from(["a", "b", "c"]), "value": st.sampled_from(["x", "y"])},
        optional={"op": st.just("d")},
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(events=EVENTS, data=st.data())
def test_any_split_redelivery_and_retry_gives_the_fold_by_source_order(
    pg_url: str,
    tmp_path: Path,
    spark: Any,
    events: list[dict[str, Any]],
    data: st.DataObject,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = fresh_config(tmp_path, pg_url, BY_SOURCE)
    drop = config.connector("feed").path
    assert drop is not None
    cuts = (
        sorted(data.draw(st.sets(st.integers(1, len(events) - 1), max_size=3), label="cuts"))
        if len(events) > 1
        else []
    )
    files = [events[start:end] for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True)]
    committed: list[dict[str, Any]] = []
    for index, lines in enumerate(files):
        path = write_lines(drop / f"{index:02d}.ndjson", [json.dumps(line) for line in lines])
        if data.draw(
            st.booleans(), label="fails first"
        ):  # a commit that fails inside its transaction
            monkeypatch.setenv("IDEM_FAULT", "during_apply:raise")
            with pytest.raises(TransientError, match="fault injected at during_apply"):
                commit_files(pg_url, config, spark, "feed", [path])
            monkeypatch.delenv("IDEM_FAULT")
        commit_files(pg_url, config, spark, "feed", [path])
        committed += lines
        if index and data.draw(
            st.booleans(), label="re-delivered"
        ):  # an earlier file again, or a copy of it
            again = data.draw(st.integers(0, index - 1), label="which")
            source = drop / f"{again:02d}.ndjson"
            if data.draw(st.booleans(), label="as a copy"):
                copy = drop / f"copy-{index}.ndjson"
                copy.write_bytes(source.read_bytes())
                source = copy
            assert commit_files(pg_url, config, spark, "feed", [source])["rows_written"] == 0
        assert current(pg_url) == folded(committed)
    # The state is the fold of the history: rebuilt from it, it is the same.
    before = rows(pg_url, "SELECT * FROM idem.indicator_state ORDER BY _external_id")
    with connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "COMMENT ON TABLE idem.indicator_state IS 'idem upsert state of {}'"
        )  # forces a rebuild
        sync_tables(conn, config.table_specs)
    assert rows(pg_url, "SELECT * FROM idem.indicator_state ORDER BY _external_id") == before


# --- Kafka: a partition's offsets ------------------------------------------------------------

KAFKA = """
connectors:
  - name: events
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topic}]
    record_type: indicator
  - name: events-again
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topic}]
    record_type: indicator
    key_namespace: events
tables:
  indicator:
    mode: upsert
    delete_when: {{field: op, equals: d}}
    columns:
      value: string
"""


def test_kafka_offsets_order_versions_and_rereading_them_changes_nothing(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Any, topic: str
) -> None:
    from idem_platform_tests.helpers.kafka import ingest as ingest_kafka
    from idem_platform_tests.helpers.kafka_broker import create_topic, produce

    config = fresh_config(
        tmp_path, pg_url, KAFKA.format(bootstrap=kafka_broker.bootstrap, topic=topic)
    )
    create_topic(kafka_broker.bootstrap, topic, 2)
    messages = [  # keyed: each id in one partition
        (0, b"a", {"id": "a", "value": "A"}),
        (0, b"a", {"id": "a", "value": "B"}),
        (1, b"b", {"id": "b", "value": "1"}),
        (0, b"a", {"id": "a", "value": "A"}),
        (1, b"b", {"id": "b", "op": "d"}),
        (1, b"c", {"id": "c", "value": "9"}),
    ]
    produce(
        kafka_broker.bootstrap,
        topic,
        [(p, k, json.dumps(m).encode(), None) for p, k, m in messages],
    )
    first = ingest_kafka(pg_url, config, spark)
    assert first["rows_written"] == 6  # A at offset 2 is a new version, not a repeat of offset 0's
    assert current(pg_url) == {"a": "A", "c": "9"}
    ((source,),) = rows(
        pg_url,
        "SELECT h._source FROM idem.indicator_state s JOIN idem.indicator h ON h._idempotency_key = s._record_key "
        "WHERE s._external_id = 'a'",
    )
    assert source == f"{topic}-0@2"
    # Another connector with the same key namespace re-reads every offset: the same keys, skipped.
    again = ingest_kafka(pg_url, config, spark, "events-again")
    assert (again["rows_written"], again["rows_skipped"]) == (0, 6)
    assert current(pg_url) == {"a": "A", "c": "9"}
    # An id whose messages are in two partitions: a later commit wins whatever the offsets
    # (partition 1's offset 3 after partition 0's offset 3); within one commit, partition order.
    produce(
        kafka_broker.bootstrap,
        topic,
        [(0, b"z", json.dumps({"id": "z", "value": "p0"}).encode(), None)],
    )
    ingest_kafka(pg_url, config, spark)
    produce(
        kafka_broker.bootstrap,
        topic,
        [(1, b"z2", json.dumps({"id": "z", "value": "p1"}).encode(), None)],
    )
    ingest_kafka(pg_url, config, spark)
    assert current(pg_url)["z"] == "p1"
    produce(
        kafka_broker.bootstrap,
        topic,
        [
            (1, b"y", json.dumps({"id": "y", "value": "p1"}).encode(), None),
            (0, b"y", json.dumps({"id": "y", "value": "p0"}).encode(), None),
        ],
    )
    ingest_kafka(pg_url, config, spark)
    assert current(pg_url)["y"] == "p1"


# --- HTTP pushes: the order they landed in ---------------------------------------------------


def test_pushed_bodies_one_commit_takes_are_in_the_order_they_landed(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    """Bodies land as ``<sha256>.ndjson``: the commit reads them by landing time (mtime), not
    by that name. The mtimes are set here so that name order and landing order disagree."""
    import os

    from idem_platform.sources.push.landing import Spool

    config = fresh_config(tmp_path, pg_url, BY_SOURCE.replace("kind: filedrop", "kind: http"))
    drop = config.connector("feed").path
    assert drop is not None
    drop.mkdir(parents=True, exist_ok=True)
    landed = []
    for value in ("one", "two"):
        with Spool(drop, limit=1 << 20) as spool:
            spool.write(json.dumps({"id": "a", "value": value}).encode() + b"\n")
            landed.append((value, Path(spool.publish().path)))
    by_name = sorted(landed, key=lambda item: item[1].name)
    for stamp, (_, path) in enumerate(reversed(by_name), 1):  # the greater name landed first
        os.utime(path, ns=(stamp * 10**9, stamp * 10**9))
    commit_files(pg_url, config, spark, "feed", [path for _, path in landed])
    assert current(pg_url) == {"a": by_name[0][0]}  # the body that landed last


def test_idem_read_reads_a_table_in_the_source_order(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    from idem_platform.read.planner import plan_read
    from idem_platform.read.render import lines_in_process

    config = fresh_config(tmp_path, pg_url, BY_SOURCE)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [{"id": "a", "value": "A"}, {"id": "a", "value": "B"}])
    plan, _ = plan_read(pg_url, config, "indicator", ordered=True, current=True)
    assert [json.loads(line)["value"] for line in lines_in_process(plan) if line] == ["B"]
    plan, _ = plan_read(pg_url, config, "indicator", ordered=True)
    assert sorted(json.loads(line)["value"] for line in lines_in_process(plan) if line) == [
        "A",
        "B",
    ]


@pytest.mark.slow
def test_a_kill_before_commit_leaves_nothing_and_the_rerun_orders_after_every_earlier_commit(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    from idem_platform_tests.helpers.cli import cli_env, idem_command
    from idem_platform_tests.helpers.faults import kill_at_fault

    config = fresh_config(tmp_path, pg_url, BY_SOURCE)
    ingest_records(pg_url, config, spark, "feed", "1.ndjson", [{"id": "a", "value": "A"}, {"id": "b", "value": "1"}])
    drop = config.connector("feed").path
    assert drop is not None
    second = [{"id": "a", "value": "B"}, {"id": "b", "op": "d"}, {"id": "a", "value": "A"}]
    path = write_lines(drop / "2.ndjson", [json.dumps(r) for r in second])
    marker = tmp_path / "during_apply.pid"
    env = cli_env(pg_url, tmp_path, config, f"during_apply:pause:{marker}")
    kill_at_fault(idem_command("ingest", "--connector", "feed", str(path)), env, marker)
    assert current(pg_url) == {"a": "A", "b": "1"}  # the killed commit's fold died with it
    assert rows(pg_url, "SELECT count(*) FROM idem.indicator") == [(2,)]
    ingest_records(
        pg_url, config, spark, "feed", "3.ndjson", [{"id": "c", "value": "3"}]
    )  # commits meanwhile
    rerun = commit_files(pg_url, config, spark, "feed", [path])
    assert rerun["rows_written"] == 3
    assert current(pg_url) == folded(
        [{"id": "a", "value": "A"}, {"id": "b", "value": "1"}, {"id": "c", "value": "3"}, *second]
    )
