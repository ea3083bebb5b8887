"""connectors: (idem_platform.config.connectors): each kind parses to its own model and takes only its own keys."""

from __future__ import annotations

import pytest

from idem_platform.config import (
    FileDropConnector,
    HttpConnector,
    KafkaConnector,
    OtlpConnector,
    parse_config,
)
from idem_platform.errors import ConfigError


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
