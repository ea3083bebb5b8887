"""Schema contracts (DESIGN §3, issue 15): ``schema_contract: evolve | strict | drop`` per
connector and per record type, ``schema_evolve`` as its older spelling, and what each mode
does to a record's unknown top-level fields, from ``coerce_batch`` to the committed tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from idem_platform.coercion.records import (
    MAX_UNKNOWN_REASONS,
    RecordSpec,
    RepeatedLines,
    coerce_batch,
)
from idem_platform.config import IdemConfig, parse_config
from idem_platform.contract.catalog import Column, ColumnType, TableSpec
from idem_platform.errors import ConfigError
from idem_platform.pipeline.ingest import record_spec
from idem_platform.postgres import connect
from idem_platform.postgres.tables import sync_tables
from idem_platform.samples import write_lines
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.config import example_text, write_config
from idem_platform_tests.helpers.database import reset_database, rows
from idem_platform_tests.helpers.ingest import ingest

TABLES = """
tables:
  indicator:
    columns: {name: string}
  malware:
    columns: {name: string}
"""


def connector_yaml(extra: str = "", kind: str = "filedrop") -> str:
    where = (
        "    bootstrap_servers: b:9092\n    topics: [t]\n" if kind == "kafka" else "    path: drop\n"
    )
    return f"connectors:\n  - name: feed\n    kind: {kind}\n{where}    record_type_field: type\n{extra}"


# --- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "expected"), [("filedrop", "evolve"), ("http", "evolve"), ("kafka", "drop")])
def test_defaults_per_kind_are_unchanged(kind: str, expected: str) -> None:
    connector = parse_config(connector_yaml(kind=kind) + TABLES).connector("feed")
    assert connector.contract == expected and connector.contract_for("indicator") == expected
    assert connector.evolve is (expected == "evolve")


def test_otlp_log_table_evolves_by_default() -> None:
    config = parse_config("connectors:\n  - {name: otel, kind: otlp, path: drop}\n")
    assert config.connector("otel").contract_for("log") == "evolve"


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("schema_evolve: true", "evolve"),
        ("schema_evolve: false", "drop"),
        ("schema_contract: evolve", "evolve"),
        ("schema_contract: strict", "strict"),
        ("schema_contract: drop", "drop"),
    ],
)
def test_connector_setting_and_its_alias(setting: str, expected: str) -> None:
    connector = parse_config(connector_yaml(f"    {setting}\n") + TABLES).connector("feed")
    assert connector.contract == expected
    assert {connector.contract_for(name) for name in ("indicator", "malware")} == {expected}


def test_kafka_takes_either_spelling() -> None:
    assert parse_config(connector_yaml("    schema_evolve: true\n", "kafka") + TABLES).connector("feed").contract == "evolve"
    assert parse_config(connector_yaml("    schema_contract: strict\n", "kafka") + TABLES).connector("feed").contract == "strict"


def test_the_record_types_setting_wins_over_the_connectors() -> None:
    text = connector_yaml("    schema_contract: strict\n") + TABLES.replace(
        "  indicator:\n", "  indicator:\n    schema_contract: evolve\n"
    ).replace("  malware:\n", "  malware:\n    schema_contract: drop\n") + "  other:\n    columns: {name: string}\n"
    connector = parse_config(text).connector("feed")
    assert connector.contract == "strict"
    assert [connector.contract_for(n) for n in ("indicator", "malware", "other")] == ["evolve", "drop", "strict"]
    # one evolving record type is enough for the commit to widen tables
    assert connector.evolve is True
    # a record type's setting applies to every connector that writes it, each with its own default
    both = text.replace("connectors:\n", "connectors:\n  - {name: k, kind: kafka, bootstrap_servers: 'b:1', "
                        "topics: [t], record_type: other}\n")
    config = parse_config(both)
    assert config.connector("k").contract_for("other") == "drop"
    assert config.connector("k").evolve is False


@pytest.mark.parametrize(
    "settings", ["    schema_contract: strict\n    schema_evolve: true\n", "    schema_evolve: false\n    schema_contract: drop\n"]
)
def test_both_keys_on_one_connector_is_an_error_naming_both(settings: str) -> None:
    text = connector_yaml(settings) + TABLES
    line = 1 + text.splitlines().index("    schema_evolve: " + ("true" if "true" in settings else "false"))
    with pytest.raises(ConfigError) as caught:
        parse_config(text, Path("/cfg/idem.yaml"))
    message = str(caught.value)
    assert message.startswith(f"/cfg/idem.yaml: connectors[0].schema_evolve (line {line}): ")
    assert "schema_evolve and schema_contract are both set" in message


def test_unknown_contract_names_the_key_and_line() -> None:
    text = connector_yaml() + TABLES.replace("  malware:\n", "  malware:\n    schema_contract: freeze\n")
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    line = 1 + text.splitlines().index("    schema_contract: freeze")
    assert f"tables.malware.schema_contract (line {line}): Input should be 'evolve', 'strict' or 'drop'" in str(
        caught.value
    )
    with pytest.raises(ConfigError, match=r"connectors\[0\]\.schema_contract \(line 6\)"):
        parse_config(connector_yaml("    schema_contract: yes\n") + TABLES)


def test_record_spec_carries_each_tables_contract() -> None:
    config = parse_config(
        connector_yaml("    schema_evolve: false\n")
        + TABLES.replace("  indicator:\n", "  indicator:\n    schema_contract: strict\n")
    )
    connector = config.connector("feed")
    spec = record_spec(connector, config.tables_for(connector), [])
    assert spec.contracts == {"indicator": "strict", "malware": "drop"}
    assert spec.contract("indicator") == "strict" and spec.contract("malware") == "drop"


# --- coerce_batch ------------------------------------------------------------------------

THING = TableSpec(
    "thing", 1, (Column("name", ColumnType.parse("string"), required=True), Column("n", ColumnType.parse("int")))
)
OTHER = TableSpec("other", 1, (Column("name", ColumnType.parse("string")),))
SPEC = RecordSpec(
    connector="feed",
    tables={"thing": THING, "other": OTHER},
    units=(("abababababababab#L", 0),),
    record_type_field="type",
    id_field="id",
    ignored_fields=frozenset({"ignored"}),
)


def run(lines: list[bytes], contracts: dict[str, str], repeats: RepeatedLines | None = None) -> list[dict[str, Any]]:
    spec = RecordSpec(**{**SPEC.__dict__, "contracts": contracts})
    out = coerce_batch(lines_batch(lines), spec, repeats)
    assert out.schema == spec.output_schema()
    return out.to_pylist()


def reasons(row: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(row["_errors"])


def unknown(name: str, record_type: str = "thing") -> dict[str, Any]:
    return {
        "field": name,
        "rule": "unknown_field",
        "message": f"field '{name}': not in the catalog of {record_type} (schema_contract: strict)",
    }


def test_strict_rejects_the_row_naming_each_unknown_field_and_the_batch_goes_on() -> None:
    out = run(
        [
            b'{"type":"thing","id":1,"name":"a","n":1}',
            b'{"type":"thing","id":2,"name":"b","shade":"dark","colour":"red","Bad Name":1}',
            b'{"type":"thing","id":3,"name":"c","ignored":true}',  # id, routing and ignored fields are known
            b'{"type":"other","id":4,"name":"d","colour":"blue"}',  # other's contract: evolve
        ],
        {"thing": "strict", "other": "evolve"},
    )
    assert [r["_errors"] is None for r in out] == [True, False, True, True]
    assert reasons(out[1]) == [unknown("Bad Name"), unknown("colour"), unknown("shade")]  # in name order
    assert out[1]["_record_type"] is None and out[1]["thing"] is None and out[1]["_payload"] is None
    assert out[1]["_raw"] == '{"type":"thing","id":2,"name":"b","shade":"dark","colour":"red","Bad Name":1}'
    assert [r["thing"]["name"] for r in (out[0], out[2])] == ["a", "c"]
    assert json.loads(out[3]["_extra"]) == {"colour": "blue"}


def test_strict_reject_keeps_the_rows_column_errors_first() -> None:
    (row,) = run([b'{"type":"thing","id":1,"n":"x","colour":"red"}'], {"thing": "strict"})
    rules = [(e["field"], e["rule"]) for e in reasons(row)]
    assert rules == [("name", "required"), ("n", "type"), ("colour", "unknown_field")]


def test_strict_knows_evolved_columns_and_repeats_of_a_reject_stay_rejects() -> None:
    spec = RecordSpec(**{**SPEC.__dict__, "tables": {"thing": THING.with_evolved(["colour"]), "other": OTHER},
                         "contracts": {"thing": "strict"}})
    line = b'{"type":"thing","id":1,"name":"a","colour":"red"}'
    (row,) = coerce_batch(lines_batch([line]), spec).to_pylist()
    assert row["_errors"] is None and row["thing"]["colour"] == "red"
    bad = b'{"type":"thing","id":2,"name":"b","hue":1}'
    repeats = RepeatedLines()
    first, again = run([bad, bad], {"thing": "strict"}, repeats)
    assert reasons(first) == reasons(again) == [unknown("hue")]
    (later,) = run([bad], {"thing": "strict"}, repeats)  # a reject is not remembered as a good row
    assert reasons(later) == [unknown("hue")]


def test_strict_names_at_most_so_many_fields_then_counts_the_rest() -> None:
    record = {"type": "thing", "id": 1, "name": "a", **{f"f{i:03d}": i for i in range(MAX_UNKNOWN_REASONS + 8)}}
    (row,) = run([json.dumps(record).encode()], {"thing": "strict"})
    errors = reasons(row)
    assert errors[:-1] == [unknown(f"f{i:03d}") for i in range(MAX_UNKNOWN_REASONS)]
    assert errors[-1] == {
        "field": None,
        "rule": "unknown_field",
        "message": "8 more fields are not in the catalog of thing (schema_contract: strict)",
    }
    long_name = "x" * 100
    (row,) = run([json.dumps({"type": "thing", "id": 1, "name": "a", long_name: 1}).encode()], {"thing": "strict"})
    (error,) = reasons(row)
    assert error["field"] == long_name and error["message"].startswith(f"field '{'x' * 60}…': not in the catalog")


def test_drop_keeps_unknown_fields_out_of_columns_and_props_but_in_the_payload() -> None:
    (row,) = run([b'{"type":"thing","id":1,"name":"a","colour":"red","Bad Name":1,"_sys":2}'], {"thing": "drop"})
    assert row["_errors"] is None and row["_extra"] is None and row["_props"] is None
    assert set(row["thing"]) == {"name", "n"}
    assert json.loads(row["_payload"]) == {"type": "thing", "id": 1, "name": "a", "colour": "red", "Bad Name": 1, "_sys": 2}


def test_evolve_is_todays_behaviour() -> None:
    (row,) = run([b'{"type":"thing","id":1,"name":"a","colour":"red","Bad Name":1}'], {"thing": "evolve"})
    assert row["_errors"] is None
    assert json.loads(row["_extra"]) == {"colour": "red"} and json.loads(row["_props"]) == {"Bad Name": 1}


def test_without_contracts_the_evolve_flag_decides() -> None:
    line = [b'{"type":"thing","id":1,"name":"a","colour":"red"}']
    (row,) = coerce_batch(lines_batch(line), RecordSpec(**{**SPEC.__dict__, "evolve": False})).to_pylist()
    assert row["_errors"] is None and row["_extra"] is None
    (row,) = coerce_batch(lines_batch(line), SPEC).to_pylist()
    assert json.loads(row["_extra"]) == {"colour": "red"}


# --- end to end: Spark, staging, the commit --------------------------------------------------


def feed(tmp_path: Path, pg_url: str, connector: dict[str, Any], tables: dict[str, str]) -> IdemConfig:
    """The example's threat feed with these connector settings and per-table contracts; tables synced."""
    reset_database(pg_url)
    data = yaml.safe_load(example_text())
    (threatfeed,) = data["connectors"]
    threatfeed.pop("schema_evolve", None)
    threatfeed.update(connector)
    for name, contract in tables.items():
        data["tables"][name]["schema_contract"] = contract
    config = write_config(tmp_path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    with connect(pg_url, autocommit=True) as conn:
        sync_tables(conn, config.table_specs)
    return config


def drop_file(config: IdemConfig, name: str, records: list[dict[str, Any]]) -> Path:
    path = config.connector("threatfeed").path
    assert path is not None
    return write_lines(path / name, [json.dumps(r) for r in records])


def columns_of(pg_url: str, table: str) -> set[str]:
    found = rows(pg_url, "SELECT column_name FROM information_schema.columns WHERE table_schema = 'idem' AND table_name = %s", table)
    return {name for (name,) in found}


def test_strict_record_type_rejects_rows_with_unknown_fields_and_commits_the_rest(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = feed(tmp_path, pg_url, {}, {"indicator": "strict"})  # the connector: evolve (filedrop default)
    path = drop_file(config, "strict.ndjson", [
        {"type": "indicator", "id": "ioc-1", "name": "a"},
        {"type": "indicator", "id": "ioc-2", "name": "b", "colour": "red"},
        {"type": "indicator", "id": "ioc-3", "name": "c"},
        {"type": "malware", "id": "m-1", "name": "m", "colour": "green"},
    ])
    summary = ingest(pg_url, config, spark, path)
    assert (summary["rows_written"], summary["rows_rejected"]) == (3, 1)
    assert rows(pg_url, "SELECT _external_id FROM idem.indicator ORDER BY 1") == [("ioc-1",), ("ioc-3",)]
    assert "colour" not in columns_of(pg_url, "indicator")
    assert rows(pg_url, "SELECT colour FROM idem.malware") == [("green",)]  # malware still evolves
    ((line, reasons_, raw),) = rows(pg_url, "SELECT line, reasons, raw FROM idem.rejects")
    assert line == 2 and json.loads(raw)["colour"] == "red"
    assert reasons_ == [
        {"field": "colour", "rule": "unknown_field",
         "message": "field 'colour': not in the catalog of indicator (schema_contract: strict)"}
    ]


def test_drop_contract_adds_no_column_and_keeps_the_field_in_the_payload(
    pg_url: str, tmp_path: Path, spark: Any
) -> None:
    config = feed(tmp_path, pg_url, {"schema_contract": "drop"}, {})
    path = drop_file(config, "drop.ndjson", [{"type": "indicator", "id": "ioc-1", "name": "a", "colour": "red", "Bad Name": 1}])
    summary = ingest(pg_url, config, spark, path)
    assert (summary["rows_written"], summary["rows_rejected"]) == (1, 0)
    assert "colour" not in columns_of(pg_url, "indicator")
    ((props, payload),) = rows(pg_url, "SELECT props, _payload FROM idem.indicator")
    assert props is None and payload["colour"] == "red" and payload["Bad Name"] == 1
    assert summary["tables"]["indicator"]["new_columns"] == []


def test_connector_strict_but_record_type_evolve_wins(pg_url: str, tmp_path: Path, spark: Any) -> None:
    config = feed(tmp_path, pg_url, {"schema_contract": "strict"}, {"indicator": "evolve"})
    path = drop_file(config, "mixed.ndjson", [
        {"type": "indicator", "id": "ioc-1", "name": "a", "colour": "red"},
        {"type": "malware", "id": "m-1", "name": "m", "colour": "green"},
        {"type": "malware", "id": "m-2", "name": "n"},
    ])
    summary = ingest(pg_url, config, spark, path)
    assert (summary["rows_written"], summary["rows_rejected"]) == (2, 1)
    assert summary["tables"]["indicator"]["new_columns"] == ["colour"]
    assert rows(pg_url, "SELECT colour FROM idem.indicator") == [("red",)]
    assert "colour" not in columns_of(pg_url, "malware")
    assert rows(pg_url, "SELECT _external_id FROM idem.malware") == [("m-2",)]
    ((line, reasons_),) = rows(pg_url, "SELECT line, reasons FROM idem.rejects")
    assert line == 2 and reasons_ == [
        {"field": "colour", "rule": "unknown_field",
         "message": "field 'colour': not in the catalog of malware (schema_contract: strict)"}
    ]
