"""Coercion (DESIGN §3): every catalog type, its exact errors, and line-level rejects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from idem_platform.coercion.converters import FieldError, converter_for
from idem_platform.coercion.records import RecordSpec, coerce_batch
from idem_platform.coercion.timestamps import parse_rfc3339_ns
from idem_platform.contract.catalog import Column, ColumnType, TableSpec
from idem_platform_tests.helpers.batches import lines_batch


def convert(kind: str, value: Any, name: str = "x") -> Any:
    return converter_for(Column(name, ColumnType.parse(kind)))(value)


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("bool", True, True),
        ("int", 3.0, 3),
        ("int", -(2**31), -(2**31)),
        ("long", 2**63 - 1, 2**63 - 1),
        ("long", 1e18, 10**18),
        ("real", 1, 1.0),
        ("real", 2.5, 2.5),
        ("string", "as-is", "as-is"),
        ("string", {"b": 1, "a": [1.0, None]}, '{"a":[1.0,null],"b":1}'),
        ("string", 12345678901234567890123, "12345678901234567890123"),
        ("timestamp", "2026-01-31T12:00:00Z", 1_769_860_800_000_000_000),
        ("timestamp", "2026-01-31T13:30:00.123456789+01:30", 1_769_860_800_123_456_789),
        ("timestamp", 1_700_000_000_000_000_000, 1_700_000_000_000_000_000),
        ("vector(3)", [1, 2.5, -3], [1, 2.5, -3]),
        ("dynamic", {"z": 1, "a": "é"}, b'{"a":"\\u00e9","z":1}'),
    ],
)
def test_accepted_values(kind: str, value: Any, expected: Any) -> None:
    assert convert(kind, value) == expected


@pytest.mark.parametrize(
    ("kind", "name", "value", "message", "rule"),
    [
        ("int", "confidence", 3000000000, "field 'confidence': 3000000000 out of int32 range", "range"),
        ("int", "x", 2.5, "field 'x': 2.5 is not an integer", "type"),
        ("int", "x", "12", "field 'x': expected an integer, got a string \"12\"", "type"),
        ("int", "x", True, "field 'x': expected an integer, got a boolean true", "type"),
        ("long", "x", 2**63, "field 'x': 9223372036854775808 out of int64 range", "range"),
        ("real", "x", "1.5", "field 'x': expected a number, got a string \"1.5\"", "type"),
        ("real", "x", 10**400, "out of double range", "range"),
        ("bool", "x", 1, "field 'x': expected true or false, got a number 1", "type"),
        ("vector(8)", "emb", [0.0] * 7, "field 'emb': expected 8 elements, got 7", "length"),
        ("vector(2)", "emb", [1, "a"], "field 'emb': element 1 is a string \"a\", not a number", "type"),
        ("vector(2)", "emb", [1, 1e39], "field 'emb': element 1 (1e+39) out of float32 range", "range"),
        ("timestamp", "created", "yesterday", "field 'created': \"yesterday\" is not RFC3339", "format"),
        ("timestamp", "created", "\u0662\u0660\u0662\u0666-01-01T00:00:00Z", "is not RFC3339", "format"),
        ("timestamp", "created", "2026-02-30T00:00:00Z", "has day 30", "format"),
        ("timestamp", "created", "9999-01-01T00:00:00Z", "out of range for timestamp[ns]", "range"),
        ("timestamp", "created", 1.5e18, "expected an RFC3339 string or integer epoch nanoseconds", "type"),
    ],
)
def test_rejected_values(kind: str, name: str, value: Any, message: str, rule: str) -> None:
    with pytest.raises(FieldError) as caught:
        convert(kind, value, name)
    assert message in str(caught.value)
    assert caught.value.to_json() == {"field": name, "rule": rule, "message": str(caught.value)}


def test_epoch_is_nanoseconds_not_milliseconds() -> None:
    # Competitors read epoch-ns as ms; 1.7e18 ns is November 2023, not year 55 million.
    assert convert("timestamp", 1_700_000_000_000_000_000) == parse_rfc3339_ns("2023-11-14T22:13:20Z")


SPEC = RecordSpec(
    connector="feed",
    tables={
        "thing": TableSpec(
            "thing",
            1,
            (
                Column("name", ColumnType.parse("string"), required=True),
                Column("n", ColumnType.parse("int")),
                Column("at", ColumnType.parse("timestamp")),
                Column("emb", ColumnType.parse("vector(2)")),
            ),
        ),
        "other": TableSpec("other", 1, (Column("name", ColumnType.parse("string")),)),
    },
    units=(("abababababababab#L", 0),),
    record_type_field="type",
    id_field="id",
)


def run(lines: list[bytes], spec: RecordSpec = SPEC) -> list[dict[str, Any]]:
    out = coerce_batch(lines_batch(lines), spec)
    assert out.schema == spec.output_schema()
    return out.to_pylist()


def reasons(row: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(row["_errors"])


def test_good_row_is_typed_and_keyed() -> None:
    (row,) = run([b'{"type":"thing","id":"t1","name":"a","n":5,"at":"2026-01-01T00:00:00Z","emb":[1,2]}'])
    assert row["_errors"] is None and row["_record_type"] == "thing"
    assert row["_idempotency_key"].startswith("feed:thing:t1:") and len(row["_idempotency_key"].split(":")[-1]) == 12
    assert row["_source"] == "abababababababab#L1"
    assert row["thing"]["n"] == 5 and row["thing"]["emb"] == [1.0, 2.0]
    assert row["other"] is None


def test_blank_crlf_bom_and_last_line_rules() -> None:
    rows = run([b"\xef\xbb\xbf" + b'{"type":"other","id":1}\r', b"", b"   \r", b'{"type":"other","id":2}'])
    assert [r["_external_id"] for r in rows] == ["1", "2"]  # blank lines are not records
    assert [r["_source"].split("#")[1] for r in rows] == ["L1", "L4"]  # positions still count them


@pytest.mark.parametrize(
    ("line", "rule", "fragment"),
    [
        (b"not json", "json", "line is not valid JSON"),
        (b'{"type":"other","id":1', "json", "line is not valid JSON"),
        (b'{"type":"other","v":NaN}', "json", "NaN is not valid JSON"),
        (b"[1,2]", "not_object", "line is an array, not a JSON object"),
        (b'"text"', "not_object", "line is a string, not a JSON object"),
        (b"\xff\xfe{}", "json", "invalid UTF-8"),
        (b'{"id":1}', "record_type", "field 'type' is missing"),
        (b'{"type":"nope","id":1}', "record_type", "is not a record type of this connector (other, thing)"),
        (b'{"type":"other","id":{"a":1}}', "id", "field 'id' is a JSON object, not a scalar"),
        (b'{"type":"other","id":"x","name":"a\\u0000b"}', "nul", "NUL character"),
    ],
)
def test_line_level_rejects(line: bytes, rule: str, fragment: str) -> None:
    (row,) = run([line])
    assert row["_record_type"] is None and row["_idempotency_key"] is None
    (reason,) = reasons(row)
    assert reason["rule"] == rule and fragment in reason["message"]
    assert row["_raw_length"] == len(line)


def test_a_row_collects_every_error() -> None:
    (row,) = run([b'{"type":"thing","id":"t","n":3000000000,"at":"soon","emb":[1]}'])
    assert [(r["field"], r["rule"]) for r in reasons(row)] == [
        ("name", "required"),
        ("n", "range"),
        ("at", "format"),
        ("emb", "length"),
    ]


def test_too_long_line_is_rejected_with_its_real_length() -> None:
    spec = RecordSpec(**{**SPEC.__dict__, "max_line_bytes": 64})
    line = b'{"type":"other","id":"' + b"x" * 100 + b'"}'
    (row,) = run([line], spec)
    assert reasons(row)[0]["rule"] == "too_long" and "the limit is 64" in reasons(row)[0]["message"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("position", "abababababababab#L1"), ("content", None), ("reject", None)],
)
def test_missing_id_policies(policy: str, expected: str | None) -> None:
    spec = RecordSpec(**{**SPEC.__dict__, "missing_id": policy})
    (row,) = run([b'{"type":"other","name":"n"}'], spec)
    if policy == "reject":
        assert reasons(row)[0]["rule"] == "id"
    elif policy == "content":
        assert row["_external_id"] == row["_content_hash"]
    else:
        assert row["_external_id"] == expected


def test_unknown_fields_split_between_evolution_and_props() -> None:
    (row,) = run([b'{"type":"other","id":1,"name":"n","new_field":3,"Bad Name":1,"_sys":2,"props":4,"note":"t"}'])
    assert json.loads(row["_extra"]) == {"new_field": "3", "note": "t"}
    assert json.loads(row["_props"]) == {"Bad Name": 1, "_sys": 2, "props": 4}
    strict = RecordSpec(**{**SPEC.__dict__, "evolve": False})
    (row,) = run([b'{"type":"other","id":1,"new_field":3}'], strict)
    assert row["_extra"] is None and row["_props"] is None


def test_same_record_same_key_whatever_the_key_order() -> None:
    a, b = run([b'{"type":"other","id":1,"name":"x"}', b'{"name":"x","id":1,"type":"other"}'])
    assert a["_idempotency_key"] == b["_idempotency_key"] and a["_source"] != b["_source"]


def test_exact_repeats_are_counted_not_emitted_and_repeats_of_rejects_stay_rejects() -> None:
    from idem_platform.coercion.records import RepeatedLines

    good = b'{"type":"other","id":1,"name":"x"}'
    bad = b'{"type":"thing","id":2,"n":"not a number","name":"y"}'
    no_id = b'{"type":"other","name":"z"}'
    repeats = RepeatedLines()
    first = run_with([good, bad, good, bad, no_id, no_id], repeats)
    # good twice -> one row + one counted repeat; bad twice -> two rejects; no id -> keyed by position, both kept
    assert [r["_record_type"] for r in first] == ["other", None, "other", "other", None]
    assert sorted(r["_source"].split("#L")[1] for r in first if r["_errors"]) == ["2", "4"]
    assert repeats.skipped == {"other": 1}
    second = run_with([good, bad], repeats, first_line=7)  # a later batch of the same task
    assert [r["_errors"] is not None for r in second] == [True]
    assert repeats.skipped == {"other": 2}


def test_the_same_record_written_differently_is_a_repeat_by_key() -> None:
    from idem_platform.coercion.records import RepeatedLines

    spaced = b'{"type": "other", "id": 1, "name": "x"}'
    reordered = b'{"name":"x","id":1,"type":"other"}'
    bad = b'{"type":"thing","id":2,"n":"not a number","name":"y"}'
    bad_reordered = b'{"name":"y","n":"not a number","id":2,"type":"thing"}'
    repeats = RepeatedLines()
    first = run_with([spaced, bad, reordered, bad_reordered], repeats)
    assert [(r["_record_type"], r["_source"].split("#L")[1]) for r in first] == [("other", "1"), (None, "2"), (None, "4")]
    assert json.loads(first[2]["_errors"]) == json.loads(first[1]["_errors"])  # a repeat of a reject is a reject
    assert repeats.skipped == {"other": 1}
    later = run_with([reordered], repeats, first_line=9)  # the key is remembered across batches
    assert later == [] and repeats.skipped == {"other": 2}
    assert repeats.unique  # every key the task emitted is distinct


def test_a_task_past_its_key_memory_no_longer_vouches_for_distinct_keys() -> None:
    from idem_platform.coercion.records import RepeatedLines

    repeats = RepeatedLines(limit=2, key_limit=2)
    run_with([b'{"type":"other","id":%d}' % i for i in range(3)], repeats)
    assert not repeats.unique and repeats.keys == {} and repeats.seen == {}
    rows = run_with([b'{"type":"other","id":0}'], repeats, first_line=4)
    assert len(rows) == 1  # no longer recognised: staged again, the apply sorts it out


def run_with(lines: list[bytes], repeats: Any, first_line: int = 1) -> list[dict[str, Any]]:
    return coerce_batch(lines_batch(lines, first_line), SPEC, repeats).to_pylist()


@pytest.mark.parametrize("missing_id", ["position", "content", "reject"])
def test_an_empty_string_id_counts_as_missing(missing_id: str) -> None:
    """``"id": ""`` names nothing: the connector's missing_id policy decides, as for a null id,
    so a row never gets a key with an empty ext_id (which the data contract refuses)."""
    from dataclasses import replace

    spec = replace(SPEC, missing_id=missing_id)
    (empty, null) = run([b'{"type":"other","id":"","name":"a"}', b'{"type":"other","id":null,"name":"a"}'], spec)
    if missing_id == "reject":
        assert reasons(empty)[0]["message"] == "field 'id' is missing, null or empty and missing_id is 'reject'"
        return
    assert empty["_errors"] is None and empty["_external_id"] not in ("", None)
    ext = empty["_idempotency_key"].split(":")[2]
    assert ext == ("abababababababab#L1" if missing_id == "position" else empty["_content_hash"])
    assert null["_external_id"] == ("abababababababab#L2" if missing_id == "position" else null["_content_hash"])


@pytest.mark.parametrize("depth", [255, 300, 1000, 2000])
def test_records_nested_too_deep_are_rejects_not_failures(depth: int) -> None:
    """Up to 254 levels of arrays and objects are data; deeper is a reject with the limit in its
    reason, whichever parser path the record takes (a 30-digit integer forces the exact one)."""
    deep = "[" * (depth - 1) + "{}" + "]" * (depth - 1)
    exact = "[" * (depth - 1) + "123456789012345678901234567890" + "]" * (depth - 1)
    rows = run([
        f'{{"type":"thing","id":"a","name":"x","emb":[1,2],"deep":{deep}}}'.encode(),
        f'{{"type":"thing","id":"b","name":"x","deep":{exact}}}'.encode(),
        b'{"type":"thing","id":"c","name":"fine"}',
    ])
    assert [r["_errors"] is None for r in rows] == [False, False, True]
    assert all("nest" in reasons(r)[0]["message"] and reasons(r)[0]["rule"] == "json" for r in rows[:2])


def test_records_nested_up_to_the_limit_are_data() -> None:
    deep = "[" * 252 + "1" + "]" * 252  # 254 levels with the record itself
    (row,) = run([f'{{"type":"thing","id":"a","name":"x","deep":{deep}}}'.encode()])
    assert row["_errors"] is None


def test_a_batch_leaves_the_cyclic_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector stays on while a batch's records are parsed: switching it off is
    process-wide, and the C path's records need no such thing (it untracks them)."""
    import gc

    from idem_platform.coercion import rules

    monkeypatch.setenv("IDEM_NATIVE", "0")  # the spy sits on the Python path's parse
    seen: list[bool] = []
    parse = rules.parse_and_canonicalize

    def spying(raw: bytes) -> Any:
        seen.append(gc.isenabled())
        return parse(raw)

    monkeypatch.setattr(rules, "parse_and_canonicalize", spying)
    assert gc.isenabled()
    run([b'{"type":"thing","id":"t1","name":"a"}'])
    assert seen == [True] and gc.isenabled()
