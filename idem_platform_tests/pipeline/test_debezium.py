"""``format: debezium``: Debezium change events keep an upsert table equal to the source table,
through files and a Kafka-protocol broker, on real PostgreSQL and Spark.

The events are shaped as Debezium's PostgreSQL and MySQL connectors document them (the
``customers`` table of their tutorials: create, update and delete events, with and without
the JSON converter's ``{schema, payload}`` wrapper). The oracle is a Python fold of the
events by their source position (``source.lsn``; the MySQL connector's binlog file number,
``pos`` and ``row``): what the source table holds after them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from idem_platform.coercion import rules
from idem_platform.config import IdemConfig, parse_config
from idem_platform.errors import ConfigError
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform_tests.helpers.config import write_config
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.ingest import ingest_records

TABLE = """
tables:
  customers:
    mode: upsert
    identity: [id]
    columns:
      id: {type: long, required: true}
      first_name: string
      last_name: string
      email: {type: string, required: true}
"""
FILES = """
connectors:
  - name: cdc
    kind: filedrop
    path: drop
    format: debezium
    record_type: customers
""" + TABLE
KAFKA = """
connectors:
  - name: cdc
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topic}]
    format: debezium
    record_type: customers
  - name: cdc-again
    kind: kafka
    bootstrap_servers: {bootstrap}
    topics: [{topic}]
    format: debezium
    record_type: customers
    key_namespace: cdc
""" + TABLE

# The Envelope schema the JSON converter sends with schemas.enable=true (fields abridged).
_ROW_SCHEMA = {
    "type": "struct", "optional": True, "name": "PostgreSQL_server.inventory.customers.Value",
    "fields": [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "string", "optional": False, "field": "first_name"},
        {"type": "string", "optional": False, "field": "last_name"},
        {"type": "string", "optional": False, "field": "email"},
    ],
}
SCHEMA = {
    "type": "struct", "optional": False, "name": "PostgreSQL_server.inventory.customers.Envelope",
    "fields": [
        {**_ROW_SCHEMA, "field": "before"}, {**_ROW_SCHEMA, "field": "after"},
        {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source",
         "fields": [{"type": "int64", "optional": True, "field": "lsn"}, {"type": "int64", "optional": False, "field": "ts_ms"}]},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
}


def customer(id_: int, first: str, email: str, last: str = "Kretchmar") -> dict[str, Any]:
    return {"id": id_, "first_name": first, "last_name": last, "email": email}


def event(op: str, lsn: int, *, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
          ts_ms: int = 1559033904863, wrapped: bool = False) -> dict[str, Any]:
    """A change event of Debezium's PostgreSQL connector (its documented shape)."""
    payload = {
        "before": before, "after": after, "op": op, "ts_ms": ts_ms + 2,
        "source": {
            "version": "2.5.4.Final", "connector": "postgresql", "name": "PostgreSQL_server", "ts_ms": ts_ms,
            "snapshot": "false", "db": "postgres", "sequence": json.dumps([str(lsn - 8), str(lsn)]),
            "schema": "public", "table": "customers", "txId": 555, "lsn": lsn, "xmin": None,
        },
    }
    return {"schema": SCHEMA, "payload": payload} if wrapped else payload


ANNE = customer(1, "Anne", "annek@noanswer.org")
ANNE_MARIE = customer(1, "Anne Marie", "annek@noanswer.org")
SALLY = customer(1001, "Sally", "sally.thomas@acme.com", "Thomas")
EVENTS = [
    event("r", 24023100, after=SALLY, wrapped=True),  # a snapshot read
    event("c", 24023128, after=ANNE, wrapped=True),
    event("u", 24023160, before=None, after=ANNE_MARIE),  # REPLICA IDENTITY DEFAULT: no before of an update
    event("d", 46523128, before={"id": 1, "first_name": None, "last_name": None, "email": None}),  # key fields only
    event("c", 46523200, after=customer(2, "George", "gbailey@foobar.com", "Bailey"), wrapped=True),
]


# The MySQL connector's Envelope schema (fields abridged): its source names a binlog position.
MYSQL_SCHEMA = {
    **SCHEMA, "name": "mysql-server-1.inventory.customers.Envelope",
    "fields": [
        {**_ROW_SCHEMA, "name": "mysql-server-1.inventory.customers.Value", "field": "before"},
        {**_ROW_SCHEMA, "name": "mysql-server-1.inventory.customers.Value", "field": "after"},
        {"type": "struct", "optional": False, "name": "io.debezium.connector.mysql.Source", "field": "source",
         "fields": [{"type": "string", "optional": False, "field": "file"}, {"type": "int64", "optional": False, "field": "pos"},
                    {"type": "int32", "optional": False, "field": "row"}, {"type": "string", "optional": True, "field": "gtid"},
                    {"type": "int64", "optional": False, "field": "ts_ms"}]},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
}


def binlog_event(op: str, file: str, pos: int, row: int = 0, *, before: dict[str, Any] | None = None,
                 after: dict[str, Any] | None = None, ts_ms: int = 1465581029000, wrapped: bool = False,
                 snapshot: str = "false") -> dict[str, Any]:
    """A change event of Debezium's MySQL connector (its documented shape), at row ``row`` of
    the binlog event at ``pos`` in ``mysql-bin.<file>``."""
    payload = {
        "before": before, "after": after, "op": op, "ts_ms": ts_ms + 523, "transaction": None,
        "source": {
            "version": "2.5.4.Final", "connector": "mysql", "name": "mysql-server-1", "ts_ms": ts_ms,
            "snapshot": snapshot, "db": "inventory", "table": "customers", "server_id": 223344,
            "gtid": None, "file": f"mysql-bin.{file}", "pos": pos, "row": row, "thread": 7, "query": None,
        },
    }
    return {"schema": MYSQL_SCHEMA, "payload": payload} if wrapped else payload


GEORGE = customer(1002, "George", "gbailey@foobar.com", "Bailey")
MYSQL_EVENTS = [
    # A snapshot reads every row at the binlog position it started from.
    binlog_event("r", "000009", 154, after=SALLY, snapshot="true", wrapped=True),
    binlog_event("r", "000009", 154, after=GEORGE, snapshot="last"),
    binlog_event("c", "000009", 4015, after=ANNE, wrapped=True),
    binlog_event("u", "000009", 4331, before=ANNE, after=ANNE_MARIE),
    # In the next file, one UPDATE ... SET id = id + 1 ORDER BY id DESC: a multi-row event whose
    # rows each change a primary key (a delete of the old key, a create of the new one), so
    # identity 1002 is deleted at row 0 and created at row 1 of the same event.
    binlog_event("d", "000010", 355, 0, before=GEORGE),
    binlog_event("c", "000010", 355, 0, after={**GEORGE, "id": 1003}, wrapped=True),
    binlog_event("d", "000010", 355, 1, before=SALLY),
    binlog_event("c", "000010", 355, 1, after={**SALLY, "id": 1002}),
    binlog_event("d", "000010", 1066, before=ANNE_MARIE, wrapped=True),
    # Past mysql-bin.999999 MySQL writes seven digits: the number orders, not the text.
    binlog_event("c", "999999", 4015, after=customer(4, "Edward", "ed@walker.com", "Walker")),
    binlog_event("u", "1000000", 894, after=customer(4, "Edward", "edward@walker.com", "Walker"), wrapped=True),
]


def position(source: dict[str, Any]) -> tuple[int, ...]:
    """Where the source database wrote an event: its WAL position, or its binlog coordinates
    (the file's number, not its name: ``mysql-bin.1000000`` follows ``mysql-bin.999999``)."""
    if "lsn" in source:
        return (source["lsn"],)
    return int(source["file"].rsplit(".", 1)[1]), source["pos"], source["row"]


def source_table(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The source table after ``events``: each applied in source position order."""
    table: dict[int, dict[str, Any]] = {}
    for e in sorted((rules.debezium_envelope(e) for e in events), key=lambda e: position(e["source"])):
        if e["op"] == "d":
            table.pop(e["before"]["id"], None)
        else:
            table[e["after"]["id"]] = e["after"]
    return table


def current(pg_url: str) -> dict[int, dict[str, Any]]:
    found = rows(pg_url, "SELECT id, first_name, last_name, email FROM idem.customers_current")
    return {r[0]: dict(zip(("id", "first_name", "last_name", "email"), r, strict=True)) for r in found}


def config_at(tmp_path: Path, pg_url: str, text: str = FILES) -> IdemConfig:
    reset_database(pg_url)
    config = write_config(tmp_path, text)
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    return config


# --- configuration ---------------------------------------------------------------------------

_CONNECTOR = "connectors:\n  - {{name: cdc, kind: {kind}, path: drop, format: debezium, {route}}}\n"


@pytest.mark.parametrize(
    ("connector", "table", "message"),
    [
        (_CONNECTOR.format(kind="http", route="record_type: customers"), TABLE, "format: only for kind: filedrop and kafka"),
        (_CONNECTOR.format(kind="filedrop", route="record_type_field: type"), TABLE, "format: debezium needs a fixed 'record_type'"),
        (_CONNECTOR.format(kind="filedrop", route="record_type: customers"), TABLE.replace("    mode: upsert\n    identity: [id]\n", ""),
         "must be mode: upsert with an identity"),
        (_CONNECTOR.format(kind="filedrop", route="record_type: customers"), TABLE.replace("    identity: [id]\n", ""),
         "must be mode: upsert with an identity"),
        (_CONNECTOR.format(kind="filedrop", route="record_type: customers"),
         TABLE.replace("    identity: [id]\n", "    identity: [id]\n    delete_when: {field: op, equals: d}\n"),
         "takes no order_by or delete_when"),
        (_CONNECTOR.format(kind="filedrop", route="record_type: customers"), TABLE + "      tags: dynamic\n",
         "has no dynamic columns"),
        (_CONNECTOR.format(kind="filedrop", route="record_type: customers"),
         TABLE.replace("    identity: [id]\n", "    identity: [id]\n    schema_version: 2\n"), "stays at schema_version 1"),
        (_CONNECTOR.format(kind="filedrop", route="record_type: customers")
         + "  - {name: other, kind: filedrop, path: other, record_type_field: type}\n", TABLE,
         "connector 'other' could write tables.customers"),
    ],
)
def test_a_debezium_feed_is_checked_at_load(connector: str, table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(connector + table)


def test_the_order_of_a_debezium_table_is_its_source_position() -> None:
    upsert = parse_config(FILES).table_specs["customers"].upsert
    assert upsert is not None and (upsert.debezium, upsert.order_by, upsert.identity) == (True, "_source_position", ("id",))


# --- what a version is --------------------------------------------------------------------------


def test_a_version_is_the_row_image_at_its_position_whatever_the_timestamps_or_the_wrapper() -> None:
    plain = rules.debezium_version(event("u", 24023160, after=ANNE_MARIE), ("id",))
    resent = rules.debezium_version(event("u", 24023160, after=ANNE_MARIE, ts_ms=1700000000000, wrapped=True), ("id",))
    assert plain == resent
    assert plain[0] == {**ANNE_MARIE, rules.DEBEZIUM_OP: "u"} and plain[2] == "1"
    moved = rules.debezium_version(event("u", 24023161, after=ANNE_MARIE), ("id",))
    assert moved[1] != plain[1]  # another position: another version
    composite = rules.debezium_version(event("u", 24023160, after=ANNE_MARIE), ("id", "first_name"))
    assert composite[2] == '[1,"Anne Marie"]'


def test_a_mysql_version_is_the_row_image_at_its_binlog_position() -> None:
    plain = rules.debezium_version(binlog_event("u", "000009", 4331, before=ANNE, after=ANNE_MARIE), ("id",))
    resent = rules.debezium_version(
        binlog_event("u", "000009", 4331, before=ANNE, after=ANNE_MARIE, ts_ms=1700000000000, wrapped=True), ("id",)
    )
    assert plain == resent and plain[2] == "1"
    assert rules.debezium_version(binlog_event("u", "000009", 4331, 1, after=ANNE_MARIE), ("id",))[1] != plain[1]
    assert rules.debezium_version(binlog_event("u", "000010", 4331, after=ANNE_MARIE), ("id",))[1] != plain[1]
    assert rules.debezium_position({"file": "mysql-bin.000003", "pos": 154}) == {
        "binlog": {"file": "mysql-bin.000003", "pos": 154, "row": 0}  # no row: an event of one row
    }
    # A PostgreSQL event's version is as it always was: its record keys do not change.
    assert rules.debezium_version(event("c", 5, after=ANNE), ("id",))[1] == rules.canonical_value_bytes(
        {"lsn": 5, "op": "c", "row": ANNE}
    )


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"pos": 154, "row": 0}, "source.file"),
        ({"file": None, "pos": 154}, "source.file"),
        ({"file": "mysql-bin", "pos": 154}, "source.file"),
        ({"file": "mysql-bin.00000x", "pos": 154}, "source.file"),
        ({"file": "mysql-bin.000003\n", "pos": 154}, "source.file"),
        ({"file": "mysql-bin.0000000000000000003", "pos": 154}, "source.file"),  # past a bigint's 18 digits
        ({"file": "mysql-bin.000003"}, "source.pos"),
        ({"file": "mysql-bin.000003", "pos": "154"}, "source.pos"),
        ({"file": "mysql-bin.000003", "pos": 154.0}, "source.pos"),
        ({"file": "mysql-bin.000003", "pos": 154, "row": -1}, "source.row"),
        ({"file": "mysql-bin.000003", "pos": 154, "row": True}, "source.row"),
        ({"gtid": "c1a3-42:23", "ts_ms": 1465581029100}, "source.lsn"),  # neither position
    ],
)
def test_a_mysql_event_without_a_binlog_position_is_a_reject_naming_the_field(source: dict[str, Any], field: str) -> None:
    with pytest.raises(rules.Reject) as caught:
        rules.debezium_version({**binlog_event("c", "000003", 154, after=ANNE), "source": source}, ("id",))
    error = caught.value.errors[0]
    assert (error["rule"], error["field"]) == ("position", field)
    assert field in error["message"] and "MySQL connector" in error["message"]


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"op": "t", "before": None, "after": None}, "truncate"),
        ({"op": "m"}, "debezium"),
        ({"source": {"connector": "sqlserver", "change_lsn": "00000025:00000d98:0002"}}, "position"),
        ({"source": {"lsn": "24023128"}}, "position"),
        ({"source": {"lsn": 1 << 63}}, "position"),
        ({"after": None}, "debezium"),
        ({"after": {"first_name": "no id"}}, "identity"),
        ({"op": "d", "before": None, "after": None}, "debezium"),
    ],
)
def test_an_event_idem_cannot_order_or_apply_is_a_reject(change: dict[str, Any], rule: str) -> None:
    with pytest.raises(rules.Reject) as caught:
        rules.debezium_version({**event("c", 5, after=ANNE), **change}, ("id",))
    assert caught.value.errors[0]["rule"] == rule


# --- end to end: files ----------------------------------------------------------------------------


def test_change_events_keep_the_current_table_equal_to_the_source(pg_url: str, tmp_path: Path, spark: Any) -> None:
    config = config_at(tmp_path, pg_url)
    first = ingest_records(pg_url, config, spark, "cdc", "1.ndjson", EVENTS)
    counts = first["tables"]["customers"]
    assert first["rows_rejected"] == 0
    assert [counts[k] for k in ("written", "inserted", "deleted", "stale")] == [5, 2, 1, 2]
    assert current(pg_url) == source_table(EVENTS) == {1001: SALLY, 2: customer(2, "George", "gbailey@foobar.com", "Bailey")}
    # A connector restart re-sends recent events: other timestamps, the other converter setting.
    resent = [
        event("u", 24023160, after=ANNE_MARIE, ts_ms=1700000000000, wrapped=True),
        event("d", 46523128, before={"id": 1, "first_name": None, "last_name": None, "email": None}, ts_ms=1700000000001),
        event("t", 46523300, wrapped=True),  # a truncate: a reject, the current rows stay
    ]
    again = ingest_records(pg_url, config, spark, "cdc", "2.ndjson", resent)
    assert (again["rows_written"], again["rows_skipped"], again["rows_rejected"]) == (0, 2, 1)
    assert rows(pg_url, "SELECT count(*) FROM idem.customers") == [(5,)]  # one history version each
    assert rows(pg_url, "SELECT reasons -> 0 ->> 'rule' FROM idem.rejects") == [("truncate",)]
    assert current(pg_url) == source_table(EVENTS)
    # The envelope as received stays in _payload; the history row keeps the delete's key fields.
    assert rows(pg_url, "SELECT _payload -> 'payload' ->> 'op' FROM idem.customers WHERE _payload ? 'schema' ORDER BY 1") == [
        ("c",), ("c",), ("r",)
    ]


def test_a_delete_before_its_insert_keeps_the_row_deleted(pg_url: str, tmp_path: Path, spark: Any) -> None:
    config = config_at(tmp_path, pg_url)
    delete = event("d", 300, before=customer(7, "Late", "late@example.com"))
    ingest_records(pg_url, config, spark, "cdc", "1.ndjson", [delete])
    older = ingest_records(pg_url, config, spark, "cdc", "2.ndjson", [
        event("c", 100, after=customer(7, "Late", "late@example.com")),
        event("u", 200, after=customer(7, "Later", "late@example.com"), wrapped=True),
    ])
    assert (older["tables"]["customers"]["stale"], older["tables"]["customers"]["inserted"]) == (2, 0)
    assert current(pg_url) == {}
    assert rows(pg_url, "SELECT id, _deleted, _order FROM idem.customers_state") == [(7, True, [300])]
    back = {**customer(7, "Back", "b@example.com"), "phone": "555-0100"}  # a column the source table gained
    ingest_records(pg_url, config, spark, "cdc", "3.ndjson", [event("c", 400, after=back)])
    assert current(pg_url) == {7: customer(7, "Back", "b@example.com")}
    assert rows(pg_url, "SELECT phone FROM idem.customers_current") == [("555-0100",)]  # evolved as a column


def test_any_split_and_order_of_the_events_gives_the_source_table(pg_url: str, tmp_path: Path, spark: Any) -> None:
    config = config_at(tmp_path, pg_url)
    backwards = list(reversed(EVENTS))
    ingest_records(pg_url, config, spark, "cdc", "1.ndjson", backwards[:2] + backwards[3:4])
    ingest_records(pg_url, config, spark, "cdc", "2.ndjson", backwards[2:] + backwards[:1])
    assert current(pg_url) == source_table(EVENTS)
    assert rows(pg_url, "SELECT count(*) FROM idem.customers") == [(5,)]


def test_mysql_change_events_keep_the_current_table_equal_to_the_source(pg_url: str, tmp_path: Path, spark: Any) -> None:
    config = config_at(tmp_path, pg_url)
    backwards = list(reversed(MYSQL_EVENTS))
    first = ingest_records(pg_url, config, spark, "cdc", "1.ndjson", backwards[:6])
    second = ingest_records(pg_url, config, spark, "cdc", "2.ndjson", backwards[6:])
    assert (first["rows_rejected"], second["rows_rejected"]) == (0, 0)
    assert first["rows_written"] + second["rows_written"] == len(MYSQL_EVENTS)
    assert current(pg_url) == source_table(MYSQL_EVENTS) == {
        1002: {**SALLY, "id": 1002}, 1003: {**GEORGE, "id": 1003}, 4: customer(4, "Edward", "edward@walker.com", "Walker")
    }
    assert rows(pg_url, "SELECT id, _order, _deleted FROM idem.customers_state ORDER BY id") == [
        (1, [10, 1066, 0], True), (4, [1000000, 894, 0], False), (1001, [10, 355, 1], True),
        (1002, [10, 355, 1], False), (1003, [10, 355, 0], False),
    ]
    # A connector restart re-sends events: other timestamps, the other converter setting.
    resent = [
        binlog_event("u", "000009", 4331, before=ANNE, after=ANNE_MARIE, ts_ms=1700000000000, wrapped=True),
        binlog_event("d", "000010", 355, 0, before=GEORGE, ts_ms=1700000000001, wrapped=True),
        binlog_event("c", "000010", 355, 1, after={**SALLY, "id": 1002}, ts_ms=1700000000002),
        binlog_event("u", "1000000", 894, after=customer(4, "Edward", "edward@walker.com", "Walker")),
        {**binlog_event("u", "000011", 154, after=ANNE), "source": {"connector": "mysql", "pos": 154}},  # no file
    ]
    again = ingest_records(pg_url, config, spark, "cdc", "3.ndjson", resent)
    assert (again["rows_written"], again["rows_skipped"], again["rows_rejected"]) == (0, 4, 1)
    assert rows(pg_url, "SELECT reasons -> 0 ->> 'rule', reasons -> 0 ->> 'field' FROM idem.rejects") == [
        ("position", "source.file")
    ]
    assert rows(pg_url, "SELECT count(*) FROM idem.customers") == [(len(MYSQL_EVENTS),)]  # one history version each
    assert current(pg_url) == source_table(MYSQL_EVENTS)


def test_a_state_ordered_by_the_lsn_alone_rebuilds_itself_as_an_array(pg_url: str, tmp_path: Path, spark: Any) -> None:
    """A state the lsn-only release built (``_order bigint``) rebuilds itself from the history
    on the next table sync, with the same rows, and folds on."""
    config = config_at(tmp_path, pg_url)
    ingest_records(pg_url, config, spark, "cdc", "1.ndjson", EVENTS)
    state = "SELECT id, _order, _content_hash, _record_key, _deleted, _commit_id FROM idem.customers_state ORDER BY id"
    built = rows(pg_url, state)
    with connect(pg_url, autocommit=True) as conn:
        comment = conn.execute("SELECT obj_description('idem.customers_state'::regclass, 'pg_class')").fetchone()[0]
        assert '["_source_position", "bigint[]"]' in comment
        conn.execute("ALTER TABLE idem.customers_state ALTER COLUMN _order TYPE bigint USING _order[1]")
        old = comment.replace('["_source_position", "bigint[]"]', '["_source_position", "bigint"]')
        conn.execute(sql.SQL("COMMENT ON TABLE idem.customers_state IS {}").format(sql.Literal(old)))
    assert rows(pg_url, "SELECT _order FROM idem.customers_state WHERE id = 1001") == [(24023100,)]
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    assert rows(pg_url, state) == built
    assert rows(pg_url, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                        "'idem.customers_state'::regclass AND attname = '_order'") == [("bigint[]",)]
    older = ingest_records(pg_url, config, spark, "cdc", "2.ndjson", [event("u", 24023000, after=customer(1001, "Old", "o@x"))])
    assert (older["tables"]["customers"]["stale"], current(pg_url)) == (1, source_table(EVENTS))


# --- end to end: Kafka ---------------------------------------------------------------------------


@pytest.mark.parametrize("events", [EVENTS, MYSQL_EVENTS], ids=["postgresql", "mysql"])
def test_a_topic_read_twice_or_after_an_offset_reset_leaves_the_source_table(
    pg_url: str, tmp_path: Path, spark: Any, kafka_broker: Any, topic: str, events: list[dict[str, Any]]
) -> None:
    from idem_platform_tests.helpers.kafka import ingest as ingest_kafka
    from idem_platform_tests.helpers.kafka_broker import create_topic, produce

    config = config_at(tmp_path, pg_url, KAFKA.replace("{bootstrap}", kafka_broker.bootstrap).replace("{topic}", topic))
    create_topic(kafka_broker.bootstrap, topic, 2)
    messages: list[tuple[int, bytes | None, bytes | None, None]] = []
    for e in events:
        envelope = rules.debezium_envelope(e)
        id_ = (envelope["after"] or envelope["before"])["id"]
        key = json.dumps({"id": id_}).encode()  # Debezium's message key: the primary key; a partition per key
        messages.append((id_ % 2, key, json.dumps(e).encode(), None))
        if envelope["op"] == "d":
            messages.append((id_ % 2, key, None, None))  # the tombstone that follows a delete
    produce(kafka_broker.bootstrap, topic, messages)
    deletes = sum(rules.debezium_envelope(e)["op"] == "d" for e in events)
    first = ingest_kafka(pg_url, config, spark, "cdc")
    assert (first["rows_written"], first["rows_rejected"], first["tombstones_skipped"]) == (len(events), 0, deletes)
    assert first["rows_skipped"] == deletes
    assert current(pg_url) == source_table(events)
    twice = ingest_kafka(pg_url, config, spark, "cdc-again")  # the same topic from offset 0, same key namespace
    assert (twice["rows_written"], twice["rows_skipped"], twice["tombstones_skipped"]) == (0, len(events) + deletes, deletes)
    with connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM idem.source_offsets WHERE connector = 'cdc'")  # offsets reset
    reset = ingest_kafka(pg_url, config, spark, "cdc")
    assert (reset["rows_written"], reset["rows_rejected"]) == (0, 0)
    assert current(pg_url) == source_table(events)
    assert rows(pg_url, "SELECT count(*) FROM idem.customers") == [(len(events),)]
