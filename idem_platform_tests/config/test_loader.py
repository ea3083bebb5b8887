"""Reading idem.yaml (idem_platform.config.loader): every mistake names the file, the key, the line and the
problem; ${VAR} is resolved from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from idem_platform.config import (
    load_config,
    parse_config,
)
from idem_platform.errors import ConfigError
from idem_platform_tests.helpers.config import BASE


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
        (("thing", "ingest-ledger"), "record type 'ingest-ledger' would be the table idem.ingest_ledger, one of idem's own tables"),
        (("thing", "t" * 64), f"record type '{'t' * 64}' must match [a-z0-9_-]{{1,63}}"),
    ],
)
def test_errors_name_file_key_and_line(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = tmp_path / "idem.yaml"
    path.write_text(BASE.replace(*edit))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value), str(caught.value)


def test_record_types_that_would_share_a_table_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "idem.yaml"
    path.write_text(BASE.replace("  thing:\n", "  threat_actor: {}\n  threat-actor: {}\n  thing:\n"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: tables (line 8): ") and message.endswith(
        "record types 'threat_actor' and 'threat-actor' would share the table idem.threat_actor "
        "(a table name spells '-' as '_'): rename one of them"
    ), message
    # Either alone is fine: its table is idem.threat_actor.
    path.write_text(BASE.replace("  thing:\n", "  threat-actor: {}\n  thing:\n"))
    assert sorted(load_config(path).tables) == ["thing", "threat-actor"]


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
