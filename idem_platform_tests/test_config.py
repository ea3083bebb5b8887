"""idem.yaml: the example parses; every mistake names the file, the key, the line and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from idem_platform.config import (
    FileDropConnector,
    HttpConnector,
    KafkaConnector,
    OtlpConnector,
    load_config,
    parse_config,
)
from idem_platform.errors import ConfigError
from idem_platform_tests.helpers.paths import EXAMPLE_CONFIG


def test_example_uses_every_catalog_type_across_three_record_types() -> None:
    config = load_config(EXAMPLE_CONFIG)
    connector = config.connector("threatfeed")
    assert connector.kind == "filedrop" and connector.record_type_field == "type" and connector.evolve
    assert connector.path == (EXAMPLE_CONFIG.parent / "drop" / "threatfeed").resolve()
    # the three declared tables, and the otlp connector's `log` (OTLP's log shape, never declared)
    assert set(config.tables) == {"indicator", "malware", "threat-actor", "log"}
    kinds = {c.type.kind for spec in config.table_specs.values() for c in spec.columns}
    assert kinds == {"bool", "int", "long", "real", "string", "timestamp", "vector", "dynamic"}
    push, otel = config.connector("threatfeed-push"), config.connector("otel")
    assert push.kind == "http" and push.lands_files and push.key_prefix == "threatfeed"
    assert otel.record_type == "log" and otel.missing_id == "content"
    assert {c.name: c.type.kind for c in config.table_specs["log"].columns} == {
        "time": "timestamp", "observed_time": "timestamp", "severity_number": "int", "severity_text": "string",
        "body": "dynamic", "attributes": "dynamic", "resource": "dynamic", "scope": "dynamic",
        "trace_id": "string", "span_id": "string",
    }


@pytest.mark.parametrize(
    ("connector", "message"),
    [
        ("{name: p, kind: http, record_type: thing}", "an http connector needs 'path'"),
        ("{name: o, kind: otlp}", "an otlp connector needs 'path'"),
        ("{name: f, kind: filedrop, path: d, record_type: thing, max_body_bytes: 4096}",
         "max_body_bytes: only for kind: http and otlp connectors"),
        ("{name: p, kind: http, path: d, record_type: thing, topics: [a]}", "topics: only for kind: kafka"),
    ],
)
def test_push_connectors_are_validated(connector: str, message: str) -> None:
    text = f"connectors:\n  - {connector}\ntables:\n  thing: {{columns: {{name: string}}}}\n"
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


def test_an_otlp_connector_may_name_its_record_type_and_declare_its_table() -> None:
    text = (
        "connectors:\n  - {name: o, kind: otlp, path: d, record_type: app_logs}\n"
        "tables:\n  app_logs: {schema_version: 2, columns: {time: timestamp, body: dynamic}}\n"
    )
    config = parse_config(text)
    assert config.connector("o").record_type == "app_logs"
    assert config.tables["app_logs"].schema_version == 2 and set(config.tables["app_logs"].columns) == {"time", "body"}


BASE = """
connectors:
  - name: feed
    kind: filedrop
    path: drop
    record_type: thing
tables:
  thing:
    columns:
      name: {type: string, required: true}
"""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("name: feed", "name: Feed!"), "connectors[0].name (line 3): String should match pattern"),
        (("record_type: thing", "record_type: other"), "record_type 'other' is not in tables (thing)"),
        (("kind: filedrop", "kind: ftp"), "connectors[0].kind (line 4): Input should be 'filedrop', 'kafka', 'http' or 'otlp'"),
        (("{type: string, required: true}", "{type: strng}"), "tables.thing.columns.name.type (line 10): unknown type 'strng'"),
        (("    record_type: thing", "    record_type: thing\n    max_reject_ratio: 2"), "max_reject_ratio (line 7): Input should be less than or equal to 1"),
        (("    record_type: thing", "    record_type: thing\n    recordtype: x"), "connectors[0].recordtype (line 7): Extra inputs are not permitted"),
        (("      name:", "      _name:"), "column name '_name' must match"),
        (("    path: drop\n", ""), "a filedrop connector needs 'path'"),
        (("    record_type: thing", "    record_type: thing\n    record_type_field: type"), "set exactly one of"),
        (("connectors:", "connectors: ["), "not valid YAML"),
        (("      name:", "      xmin:"), "or one of PostgreSQL's system columns (cmax, cmin, ctid, oid, tableoid, xmax, xmin)"),
        (("thing", "commits"), "record type 'commits' is the name of one of idem's own tables"),
        (("thing", "t" * 64), f"record type '{'t' * 64}' must match [a-z0-9_-]{{1,63}}"),
    ],
)
def test_errors_name_file_key_and_line(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = tmp_path / "idem.yaml"
    path.write_text(BASE.replace(*edit))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value), str(caught.value)


def test_environment_variables_are_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEED_DIR", "/data/feed")
    config = parse_config(BASE.replace("path: drop", "path: ${FEED_DIR}"), Path("/etc/idem/idem.yaml"))
    assert str(config.connector("feed").path) == "/data/feed"
    with_default = parse_config(BASE.replace("path: drop", "path: ${NOT_SET_ANYWHERE:-/srv/x}"))
    assert str(with_default.connector("feed").path) == "/srv/x"
    with pytest.raises(ConfigError, match="environment variable NOT_SET_ANYWHERE is not set"):
        parse_config(BASE.replace("path: drop", "path: ${NOT_SET_ANYWHERE}"))


def test_missing_file_and_unknown_connector(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    config = parse_config(BASE, tmp_path / "idem.yaml")
    with pytest.raises(ConfigError, match="no connector named 'x' \\(known: feed\\)"):
        config.connector("x")


def test_spark_master_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config(BASE + "spark:\n  master: spark://h:7077\n  conf: {spark.speculation: true}\n")
    monkeypatch.delenv("IDEM_SPARK_MASTER", raising=False)
    assert config.spark_master() == "spark://h:7077" and config.spark.conf == {"spark.speculation": "true"}
    monkeypatch.setenv("IDEM_SPARK_MASTER", "local[3]")
    assert config.spark_master() == "local[3]"
    assert parse_config(BASE).spark_master() in ("local[3]",)
    monkeypatch.delenv("IDEM_SPARK_MASTER")
    assert parse_config(BASE).spark_master() == "local[*]"


KAFKA = """
connectors:
  - name: events
    kind: kafka
    bootstrap_servers: 127.0.0.1:9092
    topics: [t]
    record_type: thing
tables:
  thing: {columns: {name: string}}
"""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # a key of the three file kinds on a kafka connector is refused by name, not ignored
        (("    topics: [t]", "    topics: [t]\n    path: drop"),
         "connectors[0] (line 3): path: only for kind: filedrop, http and otlp connectors"),
        (("    topics: [t]", "    topics: [t]\n    max_files_per_run: 3"),
         "connectors[0] (line 3): max_files_per_run: only for kind: filedrop, http and otlp connectors"),
        # only the chosen kind's errors, keyed as in the file (no model name or tag in the key)
        (("    topics: [t]", "    topics: [t]\n    split_records: 5"),
         "connectors[0].split_records (line 7): Input should be greater than or equal to 1000"),
        (("    kind: kafka\n", ""), "connectors[0].kind (line 3): Field required"),
        (("    kind: kafka", "    kind: [kafka]"),
         "connectors[0].kind (line 4): Input should be 'filedrop', 'kafka', 'http' or 'otlp'"),
    ],
)
def test_each_kind_takes_only_its_own_keys(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(KAFKA.replace(*edit))
    assert str(caught.value) == f"idem.yaml: {message}"


def test_each_kind_parses_to_its_own_model() -> None:
    others = (
        "  - {name: f, kind: filedrop, path: d, record_type: thing}\n"
        "  - {name: h, kind: http, path: h, record_type: thing}\n"
        "  - {name: o, kind: otlp, path: o}\n"
    )
    config = parse_config(KAFKA.replace("tables:", others + "tables:"))
    kafka, filedrop, http, otlp = config.connectors
    assert isinstance(kafka, KafkaConnector) and kafka.group == "idem-events" and kafka.meta_column == "_kafka"
    assert isinstance(filedrop, FileDropConnector) and filedrop.sensor_interval == 15 and filedrop.lands_files
    assert isinstance(http, HttpConnector) and http.sensor_interval == 5 and http.max_body_bytes == 64 << 20
    assert isinstance(otlp, OtlpConnector) and otlp.record_type == "log" and otlp.missing_id == "content"
    assert not kafka.lands_files and kafka.contract == "drop" and filedrop.contract == "evolve"


def test_a_connector_carries_what_it_needs_of_tables_and_migrations(tmp_path: Path) -> None:
    """Executors get one connector, not the config: its record types' own schema_contract and
    the config's migrations are fields of it (set by the config, kept by copies, never keys of
    the file)."""
    text = (
        "connectors:\n  - {name: f, kind: filedrop, path: d, record_type_field: t}\n"
        "tables:\n  thing: {schema_contract: strict, schema_version: 2}\n  other: {}\n"
        "migrations: [my_migrations]\n"
    )
    connector = parse_config(text, tmp_path / "idem.yaml").connector("f")
    assert connector.table_contracts == {"thing": "strict"}
    assert connector.migrations.modules == ("my_migrations",) and connector.migrations.base_dir == str(tmp_path)
    assert connector.migrations.current == (("other", 1), ("thing", 2))
    copied = connector.model_copy(update={"max_reject_ratio": 0.5})
    assert copied.contract_for("thing") == "strict" and copied.migrations == connector.migrations
    assert "table_contracts" not in connector.model_dump() and "migrations" not in connector.model_dump()
    for key in ("table_contracts: {thing: drop}", "migrations: [x]"):
        with pytest.raises(ConfigError, match=rf"connectors\[0\]\.{key.split(':')[0]} \(line 2\): Extra inputs"):
            parse_config(text.replace("record_type_field: t}", f"record_type_field: t, {key}}}"))


def test_idems_own_variables_are_read_through_settings_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IDEM_CONFIG, IDEM_SPARK_MASTER, IDEM_SPARK_SERVER and IDEM_SPARK_REMOTE are read by
    idem_platform.settings at each call (a test's setenv is seen; blank is unset), and the
    config answers through it."""
    from idem_platform import settings

    path = tmp_path / "idem.yaml"
    path.write_text(BASE)
    config = parse_config(BASE, path)
    for name in ("IDEM_CONFIG", "IDEM_SPARK_MASTER", "IDEM_SPARK_SERVER", "IDEM_SPARK_REMOTE"):
        monkeypatch.setenv(name, "")
    assert settings.config_path_from_environment() is None and settings.spark_remote_from_environment() is None
    assert config.spark_master() == "local[*]" and config.spark_server() == "auto"
    monkeypatch.setenv("IDEM_CONFIG", str(path))
    monkeypatch.setenv("IDEM_SPARK_SERVER", " OFF ")
    monkeypatch.setenv("IDEM_SPARK_REMOTE", "sc://127.0.0.1:15002")
    assert load_config().source == path and config.spark_server() == "off"
    assert settings.spark_remote_from_environment() == "sc://127.0.0.1:15002"
    monkeypatch.setenv("IDEM_SPARK_SERVER", "sometimes")
    with pytest.raises(ConfigError, match="IDEM_SPARK_SERVER='sometimes': expected 'auto' or 'off'"):
        config.spark_server()
