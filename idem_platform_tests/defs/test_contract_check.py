"""The pandera contract (the blocking ``pandera_contract`` check): it passes coerced rows and
names every broken rule of rows that are not what coercion makes."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest
from pandera.errors import SchemaErrors

from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.contract.catalog import Column, ColumnType, TableSpec
from idem_platform.defs.connector.checks import contract_frame, pandera_schema
from idem_platform_tests.helpers.batches import lines_batch

THING = TableSpec(
    "thing",
    1,
    (
        Column("name", ColumnType.parse("string"), required=True),
        Column("n", ColumnType.parse("int")),
        Column("big", ColumnType.parse("long")),
        Column("score", ColumnType.parse("real")),
        Column("flag", ColumnType.parse("bool")),
        Column("at", ColumnType.parse("timestamp")),
        Column("emb", ColumnType.parse("vector(3)")),
        Column("tags", ColumnType.parse("dynamic")),
    ),
)
SPEC = RecordSpec(connector="feed", tables={"thing": THING}, units=(("feed:ab#L", 0),), record_type="thing", spark_types=True)


def coerced_rows() -> pa.Table:
    lines = [
        {"id": "a", "name": "ünïcode ✓", "n": 1, "big": 2**40, "score": 0.5, "flag": True,
         "at": "2026-01-01T00:00:00Z", "emb": [1, 2, 3], "tags": ["x"]},
        {"id": "b", "name": "plain", "n": None, "emb": None},
        {"id": "c", "name": "third", "n": -3, "flag": False, "emb": [0.5, 0.25, 0]},
    ]
    batch = coerce_batch(lines_batch([json.dumps(line).encode() for line in lines]), SPEC)
    assert batch.column("_errors").null_count == batch.num_rows
    return pa.Table.from_batches([batch])


def test_coerced_rows_pass() -> None:
    rows = coerced_rows()
    frame = contract_frame(rows, "thing", THING)
    assert list(frame.columns) == ["_idempotency_key", "_content_hash", "_payload", *THING.column_names()]
    assert frame["name"].tolist() == ["ünïcode ✓", "plain", "third"]
    pandera_schema(THING).validate(frame, lazy=True)


def _with(rows: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return rows.set_column(rows.schema.get_field_index(name), name, values)


def _with_typed(rows: pa.Table, field: str, values: pa.Array) -> pa.Table:
    struct = rows.column("thing").combine_chunks()
    children = [values if struct.type.field(i).name == field else struct.field(i) for i in range(struct.type.num_fields)]
    return _with(rows, "thing", pa.StructArray.from_arrays(children, names=[field.name for field in struct.type]))


def test_broken_rows_fail_with_each_rule_named() -> None:
    rows = coerced_rows()
    keys = rows.column("_idempotency_key").to_pylist()
    rows = _with(rows, "_idempotency_key", pa.array(["not a key", *keys[1:]], pa.string()))
    hashes = rows.column("_content_hash").to_pylist()
    rows = _with(rows, "_content_hash", pa.array([hashes[0], "xyz", hashes[2]], pa.string()))
    rows = _with_typed(rows, "name", pa.array(["ünïcode ✓", None, "third"], pa.string()))
    rows = _with_typed(rows, "emb", pa.array([[1.0, 2.0, 3.0], None, [1.0, 2.0]], pa.list_(pa.float32())))
    with pytest.raises(SchemaErrors) as failed:
        pandera_schema(THING).validate(contract_frame(rows, "thing", THING), lazy=True)
    cases = failed.value.failure_cases
    broken = {(row["column"], str(row["check"])) for row in cases.to_dict("records")}
    assert ("_idempotency_key", "str_matches('^[a-z0-9_-]{1,64}:[a-z0-9_-]{1,64}:.+:[0-9a-f]{12}$')") in broken
    assert any(column == "_content_hash" and check.startswith("str_matches") for column, check in broken)
    assert ("name", "not_nullable") in broken
    assert ("emb", "length_3") in broken
    assert {column for column, _ in broken} == {"_idempotency_key", "_content_hash", "name", "emb"}


def test_text_of_the_wrong_type_fails() -> None:
    """A typed text column that is not text (a bug upstream of the check) is a failure, not a pass."""
    rows = _with_typed(coerced_rows(), "name", pa.array([1, 2, 3], pa.int64()))
    with pytest.raises(SchemaErrors) as failed:
        pandera_schema(THING).validate(contract_frame(rows, "thing", THING), lazy=True)
    assert "name" in set(failed.value.failure_cases["column"])


# The extremes of every catalog type's range (DESIGN §3), each column mixed with nulls and
# missing fields: a nullable integer column once went through pandas' float64, turned
# 2**63-1 into 2**63 and failed the blocking check on a valid file, on every retry.
EXTREMES = [
    {"id": "lo", "name": "", "n": -(2**31), "big": -(2**63), "score": -1.7976931348623157e308, "flag": False,
     "at": "1677-09-21T00:12:43.145224192Z", "emb": [-3.4028234663852886e38, -1.401298464324817e-45, 0.0],
     "tags": {"deep": [[[None]]], "big": 2**64}},
    {"id": "nulls", "name": "x", "n": None, "big": None, "score": None, "flag": None, "at": None, "emb": None,
     "tags": None},
    {"id": "hi", "name": "ünïcode ✓ 𝄞" * 1000, "n": 2**31 - 1, "big": 2**63 - 1, "score": 1.7976931348623157e308,
     "flag": True, "at": "2262-04-11T23:47:16.854775807Z", "emb": [3.4028234663852886e38, 1.401298464324817e-45, -0.0],
     "tags": "just text"},
    {"id": "missing", "name": "only a name"},
    {"id": "tiny", "name": "\t\n", "n": 0, "big": 0, "score": 5e-324, "at": -(2**63), "emb": [1e-38, 1, -1],
     "tags": [1.5e300, -0.0]},
    {"id": "epoch", "name": "epoch", "score": -5e-324, "at": 2**63 - 1, "tags": True},
]


@pytest.mark.parametrize("spark_types", [True, False], ids=["commit_types", "catalog_types"])
def test_every_catalog_type_at_its_extremes_with_nulls_passes(spark_types: bool) -> None:
    spec = RecordSpec(
        connector="feed", tables={"thing": THING}, units=(("feed:ab#L", 0),), record_type="thing",
        spark_types=spark_types,
    )
    for order in (EXTREMES, EXTREMES[::-1]):  # a null first or a value first: the same result
        batch = coerce_batch(lines_batch([json.dumps(line).encode() for line in order]), spec)
        assert batch.column("_errors").to_pylist() == [None] * len(order)
        rows = pa.Table.from_batches([batch])
        frame = contract_frame(rows, "thing", THING)
        pandera_schema(THING, spark=spark_types).validate(frame, lazy=True)
        by_id = dict(zip(rows.column("_external_id").to_pylist(), frame["big"].tolist(), strict=True))
        assert by_id["hi"] == 2**63 - 1 and by_id["lo"] == -(2**63) and by_id["nulls"] is pd.NA


def test_numbers_of_the_wrong_type_fail() -> None:
    """Arrow types are checked as they are: a ``long`` column that is float64 or an ``int``
    column that is int64 (a bug upstream) fails, where coercing it would have hidden it."""
    rows = coerced_rows()
    rows = _with_typed(rows, "big", pa.array([1.0, None, 2.0], pa.float64()))
    rows = _with_typed(rows, "n", pa.array([1, None, -3], pa.int64()))
    with pytest.raises(SchemaErrors) as failed:
        pandera_schema(THING).validate(contract_frame(rows, "thing", THING), lazy=True)
    assert {"big", "n"} <= set(failed.value.failure_cases["column"])
