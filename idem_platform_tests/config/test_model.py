"""The whole idem.yaml (idem_platform.config.model): the example parses, a connector carries what it needs of the
config, and idem's own variables are read through settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from idem_platform.config import (
    load_config,
    parse_config,
)
from idem_platform.errors import ConfigError
from idem_platform_tests.helpers.config import BASE
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
