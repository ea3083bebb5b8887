"""Properties of coercion (DESIGN §3) for any JSON value, any column and any field name (hypothesis).

* Any JSON value against any catalog type (``vector(1..4)``, required or not),
  under every schema contract: :func:`coerce_batch` never raises; every row is a
  typed row or a reject whose every reason has a rule and a message; and the
  batch agrees, row for row, with the per-value contract of
  :mod:`idem_platform.coercion.converters` (whichever path, Arrow's fast one or
  the exact one, the column took).
* Any field names (SQL, spaces, case twins, system and reserved names, 63/64/300
  characters, non-ASCII): nothing raises, and no name that fails
  :func:`is_safe_column_name` can become a column (``_extra`` holds the names
  evolution may add; everything else lands in ``props``, is dropped, or is a
  strict reject).

CI runs the ``ci`` profile of :mod:`test_fuzz` (halved: these are parametrized);
``HYPOTHESIS_PROFILE=fuzz`` runs many more.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idem_platform.coercion import records
from idem_platform.coercion.converters import FieldError, converter_for
from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.contract.catalog import (
    SCALAR_KINDS,
    Column,
    ColumnType,
    TableSpec,
    is_safe_column_name,
)
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.fuzz import FUZZ, NUMBERS, rfc3339

EXAMPLES = settings(FUZZ, max_examples=max(FUZZ.max_examples // 2, 1))
TABLE = "t"
FIELD = "v"
MISSING = object()  # the field is left out of the record


def _contracts() -> list[Any]:
    """The schema contracts a record type may have, as RecordSpec keyword arguments.

    PARAMETRIZATION POINT: ``evolve: true/false`` is the connector setting; the
    per-table ``strict`` contract joins as soon as RecordSpec carries
    ``contracts`` (a per-record-type setting: records.STRICT).
    """
    modes = [pytest.param({"evolve": True}, id="evolve"), pytest.param({"evolve": False}, id="no-evolve")]
    if "contracts" in {f.name for f in dataclasses.fields(RecordSpec)} and hasattr(records, "STRICT"):
        modes.append(pytest.param({"contracts": {TABLE: records.STRICT}}, id="strict"))
    return modes


CONTRACTS = _contracts()
STRICT = getattr(records, "STRICT", None)

# --- JSON values: big integers, -0.0, 1e308, non-ASCII and astral text, nesting, unique keys

TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8)
ODD_TEXT = st.sampled_from(["", "é", "中文", "😀", "𝄞x", "\u200b", "\x7f", "true", "1", "null", "[1]", "a'b\"c\\"])
EDGE_NUMBERS = st.sampled_from(
    [
        0, -0.0, 3.0, 3.5, 1e10, 1e308, -1e308, 5e-324, 3.4e38, 1e39, 1.7e18,
        2**24 + 1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**53 + 1, 2**63 - 1, 2**63,
        -(2**63), -(2**63) - 1, 2**64, 2**70, 10**30, -(10**30), 10**400,
    ]
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, EDGE_NUMBERS, TEXT, ODD_TEXT, rfc3339())
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=10,
)
# Numbers only, so that vectors of the right length come up often.
NUMBER_LISTS = st.lists(st.one_of(NUMBERS, EDGE_NUMBERS), min_size=1, max_size=5)
VALUES = st.one_of(JSON_VALUES, NUMBER_LISTS, st.just(MISSING))

COLUMN_TYPES = st.one_of(
    st.sampled_from(SCALAR_KINDS).map(ColumnType.parse),
    st.integers(1, 4).map(lambda dim: ColumnType.parse(f"vector({dim})")),
)
COLUMNS = st.builds(
    lambda type_, required: Column(FIELD, type_, required=required), COLUMN_TYPES, st.booleans()
)


def spec_for(columns: tuple[Column, ...], mode: dict[str, Any], *, spark: bool = False) -> RecordSpec:
    return RecordSpec(
        connector="props",
        tables={TABLE: TableSpec(TABLE, 1, columns)},
        units=(("0123456789abcdef#L", 0),),
        record_type=TABLE,
        spark_types=spark,
        **mode,
    )


def line_of(number: int, fields: dict[str, Any], *, ascii_only: bool) -> bytes:
    return json.dumps({"id": f"r{number}", **fields}, ensure_ascii=ascii_only).encode("utf-8")


def check_reasons(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A reject's reasons: a non-empty list, each with a rule and a message."""
    reasons = json.loads(row["_errors"])
    assert isinstance(reasons, list) and reasons
    for reason in reasons:
        assert isinstance(reason["rule"], str) and reason["rule"]
        assert isinstance(reason["message"], str) and reason["message"]
    assert row["_idempotency_key"] is None and row["_record_type"] is None and row[TABLE] is None
    return reasons


def expected(column: Column, value: Any) -> tuple[Any, list[dict[str, Any]] | None]:
    """The per-value contract: ``(Arrow value as JSON-comparable, None)`` or ``(None, reasons)``."""
    if value is MISSING or value is None:
        if column.required:
            problem = "missing" if value is MISSING else "null"
            message = f"field '{FIELD}': required but {problem}"
            return None, [{"field": FIELD, "rule": "required", "message": message}]
        return None, None
    try:
        converted = converter_for(column)(value)
    except FieldError as exc:
        return None, [exc.to_json()]
    if column.type.kind == "vector":
        converted = [float(np.float32(item)) for item in converted]
    elif column.type.kind == "dynamic":
        converted = converted.decode("ascii")
    elif column.type.kind == "real":
        converted = float(converted)
    return converted, None


def arrow_values(array: pa.Array) -> list[Any]:
    """A coerced column's values, JSON-comparable (timestamps as epoch nanoseconds)."""
    if pa.types.is_timestamp(array.type):
        return array.cast(pa.int64()).to_pylist()
    if pa.types.is_binary(array.type):
        return [None if v is None else v.decode("ascii") for v in array.to_pylist()]
    return array.to_pylist()


def same(a: Any, b: Any) -> bool:
    """Equal as JSON text: ``1`` is not ``1.0``, ``-0.0`` is not ``0.0``."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("mode", CONTRACTS)
@EXAMPLES
@given(column=COLUMNS, values=st.lists(VALUES, min_size=1, max_size=5), ascii_only=st.booleans())
def test_any_value_against_any_column_coerces_or_is_a_reject_as_the_contract_says(
    mode: dict[str, Any], column: Column, values: list[Any], ascii_only: bool
) -> None:
    """Several values in one batch, so that a column takes Arrow's fast path or the exact one
    as its values decide: either way each row is what the per-value converter says."""
    lines = [
        line_of(n, {} if value is MISSING else {FIELD: value}, ascii_only=ascii_only)
        for n, value in enumerate(values)
    ]
    out = coerce_batch(lines_batch(lines), spec_for((column,), mode))
    assert out.num_rows == len(values)
    rows = out.to_pylist()
    typed = arrow_values(out.column(TABLE).field(FIELD))
    for row, arrow_value, value in zip(rows, typed, values, strict=True):
        want, reasons = expected(column, value)
        if reasons is not None:
            assert check_reasons(row) == reasons, value
            continue
        assert row["_errors"] is None, (value, json.loads(row["_errors"]))
        assert row["_record_type"] == TABLE
        assert same(arrow_value, want), (value, arrow_value, want)
    # The commit path's shapes (microsecond timestamps, variable lists) take the same rows.
    spark = coerce_batch(lines_batch(lines), spec_for((column,), mode, spark=True))
    assert spark.column("_errors").to_pylist() == out.column("_errors").to_pylist()


# --- field names

HOSTILE_NAMES = [
    "xmin", "xmax", "cmin", "cmax", "ctid", "tableoid", "oid", "Robert'); DROP TABLE x;--", "a b", "a-b", "a.b",
    '"quoted"', "_idempotency_key", "_payload", "_x", "props", "PROPS", "Props", "Score", "SCORE", "score",
    "select", "user", "order", "é", "naïve", "名前", "😀", "x\u200b", "", " ", "\t", "1abc", "a" * 63, "a" * 64,
    "b" * 300, "é" * 32, "id", "type",
]
NAMES = st.one_of(
    st.sampled_from(HOSTILE_NAMES),
    st.from_regex(r"[a-z_][a-z0-9_]{0,70}", fullmatch=True),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12),
    st.text(st.characters(), max_size=6),  # lone surrogates and NUL: line-level rejects
)
SCORE = Column("score", ColumnType.parse("real"))
NAME = Column("name", ColumnType.parse("string"), required=True)


def clean(value: Any) -> bool:
    """Text PostgreSQL can store: no NUL, no lone surrogate (else the line is a reject)."""
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return all(clean(k) and clean(v) for k, v in value.items())
    if isinstance(value, list):
        return all(clean(v) for v in value)
    return True


@pytest.mark.parametrize("mode", CONTRACTS)
@EXAMPLES
@given(fields=st.dictionaries(NAMES, SCALARS, max_size=8), ascii_only=st.booleans())
def test_any_field_names_never_raise_nor_become_unsafe_columns(
    mode: dict[str, Any], fields: dict[str, Any], ascii_only: bool
) -> None:
    fields = {k: v for k, v in fields.items() if k != "id"}  # the record's id is written by line_of
    record = {"name": "n", "score": 0.5, **fields}
    try:
        line = line_of(0, record, ascii_only=ascii_only)
    except UnicodeEncodeError:  # a lone surrogate written raw: no UTF-8 text at all
        line = line_of(0, record, ascii_only=True)
    (row,) = coerce_batch(lines_batch([line]), spec_for((NAME, SCORE), mode)).to_pylist()
    unknown = set(record) - {"name", "score"}
    if row["_errors"] is not None:
        reasons = check_reasons(row)
        if clean(record):  # a clean record is rejected for its values or (strict) its unknown fields only
            rules = {reason["rule"] for reason in reasons}
            assert rules <= {"type", "range", "required", "unknown_field"}, reasons
            if mode == {"contracts": {TABLE: STRICT}} and unknown:
                assert "unknown_field" in rules
        return
    assert clean(record)
    extra = json.loads(row["_extra"]) if row["_extra"] else {}
    props = json.loads(row["_props"]) if row["_props"] else {}
    assert all(is_safe_column_name(name) for name in extra), extra
    assert not any(is_safe_column_name(name) for name in props), props
    assert all(len(name.encode()) <= 63 for name in extra)
    if mode.get("evolve") is True:
        assert set(extra) | set(props) == unknown and not set(extra) & set(props)
        assert props == {name: record[name] for name in props}
    else:
        assert not extra and not props  # dropped (they stay in _payload), or strict with none unknown
        assert not unknown or mode.get("evolve") is False


def test_a_bad_vector_does_not_sink_its_batch() -> None:
    """Regression: one wrong vector sends its column down the exact path, whose integers
    float32 cannot hold exactly (16777217, 2**70) made Arrow raise for the whole batch,
    and so fail the file on every retry. Now the bad row is a reject and the rest commit."""
    column = Column(FIELD, ColumnType.parse("vector(2)"))
    lines = [line_of(0, {FIELD: [1]}, ascii_only=True), line_of(1, {FIELD: [16777217, 2**70]}, ascii_only=True)]
    bad, good = coerce_batch(lines_batch(lines), spec_for((column,), {})).to_pylist()
    assert json.loads(bad["_errors"])[0]["message"] == "field 'v': expected 2 elements, got 1"
    assert good["_errors"] is None and good[TABLE][FIELD] == [16777216.0, float(np.float32(2**70))]
