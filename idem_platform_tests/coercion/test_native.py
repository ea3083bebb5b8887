"""The C path of the per-record loop (``coercion/_native.c``) agrees with the Python loop.

The Python loop is the definition (DESIGN §2's canonical form, the rejects and their
reasons); the C path may only hand a record back to it, never answer differently.
These tests check, on hypothesis-generated lines (the fuzz module's strategies: odd
bytes, repeated keys, escapes, big numbers, unicode) and on hand-picked edges, that:

* ``canonical_line`` returns the contract's bytes, their SHA-1 and json's values, or
  ``None`` (the Python path decides) for anything the contract refuses;
* it does not decline ordinary records (else the shortcut silently stops paying);
* ``coerce_batch`` gives the same batch, counts and repeat memory with the C path
  and without it, for every spec knob the fuzz module varies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from idem_platform.coercion import native
from idem_platform.coercion.records import RepeatedLines, _lone_surrogate, coerce_batch
from idem_platform.contract.canonical import (
    InvalidJSON,
    canonical_bytes,
    has_nul,
    parse_and_canonicalize,
    repeated_key,
)
from idem_platform_tests.helpers.batches import lines_batch
from idem_platform_tests.helpers.fuzz import (
    BASE_SPEC,
    CLEAN_VALUE,
    FUZZ,
    STYLES,
    WHOLE_FILES,
    Obj,
    any_line,
    dump,
    first_repeat,
    layouts,
    lines_of_a_file,
    structured_lines,
)

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="the C extension is not built here")


def test_the_extension_is_built_where_a_compiler_and_openssl_are() -> None:
    """``optional = true`` lets a build failure pass silently: a broken _native.c must fail here."""
    headers = Path("/usr/include/openssl/sha.h").exists() or Path(sysconfig.get_paths()["include"], "openssl").exists()
    if not (shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")) or not headers:
        pytest.skip("no C compiler or OpenSSL headers: the Python path alone")
    assert native.AVAILABLE, "idem_platform/coercion/_native.c did not build: run `pip install -e .` and read its errors"


def reference(line: bytes) -> tuple[dict[str, Any], bytes, str] | None:
    """What the Python path makes of a line when it accepts it as a plain object, else None."""
    try:
        value, canonical = parse_and_canonicalize(line)
    except InvalidJSON:
        return None
    if type(value) is not dict or repeated_key(line, canonical) is not None:
        return None
    if has_nul(value) or _lone_surrogate(value) is not None:
        return None
    return value, canonical, hashlib.sha1(canonical).hexdigest()


def same_values(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True would hide a wrong type)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and str(a) == str(b)  # -0.0 vs 0.0
    return bool(a == b)


def check_line(line: bytes) -> tuple[dict[str, Any], bytes, str] | None:
    assert native.canonical_line is not None
    got = native.canonical_line(line, frozenset())
    if got is None:
        return None
    expected = reference(line)
    assert expected is not None, f"the C path accepted what the Python path refuses: {line!r}"
    assert got[1] == expected[1], line
    assert got[2] == expected[2]
    assert same_values(got[0], expected[0]), line
    return got


@needs_native
@FUZZ
@given(line=any_line)
def test_any_line_gets_the_contract_form_or_is_handed_back(line: bytes) -> None:
    check_line(line)
    check_line(line + b"\r\n")


@needs_native
@FUZZ
@given(value=CLEAN_VALUE, style=STYLES)
def test_an_ordinary_object_is_never_handed_back(value: Any, style: Any) -> None:
    record = value if isinstance(value, Obj) else Obj((("v", value),))
    if first_repeat(record) is not None:
        return
    line = dump(record, style).encode("utf-8")
    assert check_line(line) is not None, line


@pytest.mark.parametrize(
    "token",
    [
        "0", "-0", "7", "-12", "9007199254740993", "123456789012345678901234567890", "-" + "9" * 400,
        "0.0", "-0.0", "0.000", "1.50", "10.0", "5.059", "-0.464693", "0.0001", "0.00012", "0.00001", "0.000099",
        "1e5", "1E5", "1e+16", "1e16", "1e15", "1.5e-7", "2.5E-3", "0.1e1", "1e-400", "1e308",
        "1000000000000000.0", "9999999999999999.0", "12345678901234567.0", "123456789012345.6",
        "0.30000000000000004", "0.1000000000000000055511151231257827", "3.4028235e38", "1.7976931348623157e308",
        "4.9e-324", "2.2250738585072014e-308", "0.123456789012345", "0.1234567890123456",
    ],
)
@needs_native
def test_numbers_print_as_json_dumps_prints_them(token: str) -> None:
    line = f'{{"n":{token},"l":[{token}]}}'.encode()
    got = check_line(line)
    assert got is not None, token
    assert got[1] == canonical_bytes(json.loads(line)), token


@pytest.mark.parametrize("token", ["1e400", "-1e400", "NaN", "Infinity", "01", "1.", ".5", "+1", "1e", "0x10", "1" * 4301])
@needs_native
def test_numbers_json_refuses_are_handed_back(token: str) -> None:
    assert native.canonical_line is not None
    assert native.canonical_line(f'{{"n":{token}}}'.encode(), frozenset()) is None


@pytest.mark.parametrize(
    "text",
    [
        r'"\u00e9"', r'"\u00E9"', '"é"', '"中文"', '"😀"', r'"\ud83d\ude00"', r'"\u007f"', '"\x7f"', r'"\/"',
        r'"\b\f\n\r\t"', r'"\u0001"', r'"\"\\"', r'"\u003a"', r'"\uffff"', '"\U0010ffff"',
    ],
)
@needs_native
def test_strings_are_escaped_as_json_dumps_escapes_them(text: str) -> None:
    line = ('{"s":' + text + ',' + text + ':1}').encode("utf-8")
    assert check_line(line) is not None, text


@pytest.mark.parametrize(
    "line",
    [
        rb'{"s":"\u0000"}', rb'{"s":"\ud800"}', rb'{"s":"\udc00"}', rb'{"s":"\ud800\u0041"}', b'{"s":"\xff"}',
        b'{"s":"\xed\xa0\x80"}', b'{"s":"\xc0\xaf"}', b'{"s":"a\tb"}', b'{"a":1,"a":2}', b'{"a":{"b":1,"b":1}}',
        rb'{"a":1,"\u0061":2}', b'[1]', b'"x"', b'{"a":1}x', b'{"a":1', b'{"a" 1}', b'{"a":tru}', b"{'a':1}",
        b'{"a":1,}', b'\xef\xbb\xbf{"a":1}', b"{" * 300 + b"}" * 300,
    ],
)
@needs_native
def test_lines_the_python_path_must_word_are_handed_back(line: bytes) -> None:
    assert native.canonical_line is not None
    assert native.canonical_line(line, frozenset()) is None


@needs_native
def test_shallow_fields_hold_only_whether_they_are_null() -> None:
    assert native.canonical_line is not None
    got = native.canonical_line(b'{"tags":{"a":[1]},"labels":null,"name":"n"}', frozenset({"tags", "labels"}))
    assert got is not None
    assert got[0] == {"tags": ..., "labels": None, "name": "n"}
    assert got[1] == b'{"labels":null,"name":"n","tags":{"a":[1]}}'


def both_ways(lines: list[bytes], spec: Any, repeats: bool, batches: int = 2) -> None:
    """coerce_batch with and without the C path: the same batches, counts and memories."""
    memories = (RepeatedLines(), RepeatedLines()) if repeats else (None, None)
    cut = max(1, len(lines) // batches)
    for start in range(0, max(len(lines), 1), cut):
        batch = lines_batch(lines[start : start + cut], first_line=start + 1)
        outputs = []
        for use_native, memory in zip((True, False), memories, strict=True):
            os.environ["IDEM_NATIVE"] = "1" if use_native else "0"
            try:
                outputs.append(coerce_batch(batch, spec, memory))
            finally:
                os.environ.pop("IDEM_NATIVE", None)
        assert outputs[0].equals(outputs[1]), (outputs[0].to_pylist(), outputs[1].to_pylist())
    if repeats:
        a, b = memories
        assert a is not None and b is not None
        assert (a.seen, a.keys, a.skipped, a.unique) == (b.seen, b.keys, b.skipped, b.unique)


@needs_native
@FUZZ
@given(lines=lines_of_a_file, layout=layouts, repeats=st.booleans(), doubled=st.booleans())
def test_coerce_batch_is_the_same_with_the_c_path(lines: list[bytes], layout: Any, repeats: bool, doubled: bool) -> None:
    if doubled:  # repeats inside a batch and across batches
        lines = lines + lines[::-1]
    both_ways(lines, layout.spec(), repeats)


@needs_native
@WHOLE_FILES
@given(lines=st.lists(structured_lines, max_size=12), repeats=st.booleans(), contract=st.sampled_from(["evolve", "strict", "drop"]))
def test_contracts_and_fixed_types_are_the_same_with_the_c_path(lines: list[bytes], repeats: bool, contract: str) -> None:
    spec = replace(BASE_SPEC, contracts={name: contract for name in BASE_SPEC.tables}, declared_version=None)
    both_ways(lines, spec, repeats)
    fixed = replace(spec, record_type="malware", record_type_field=None)
    both_ways(lines, fixed, repeats)


THREAT_FEED = [
    {
        "type": kind, "id": f"{kind}--{n:08d}-9c4e-4b65-881a-5f0f1b1bba94", "name": f"näme {n}" if n % 3 else f"name {n}",
        "confidence": n % 101, "score": round(n * 0.731 % 10, 3), "created": "2021-09-30T02:42:25.932Z",
        "labels": ["apt", "c2"][: n % 3], "tags": {"tlp": "amber", "source": {"name": "MISP", "reliability": "F"}},
        "embedding": [round((n * k) % 7 / 3.1 - 1, 6) for k in range(8)],
    }
    for n, kind in enumerate(["indicator", "malware", "threat-actor"] * 40)
]


@needs_native
def test_ordinary_records_all_take_the_c_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of ordinary records gets every line's facts from C: the Python path parses none of them."""
    from idem_platform.coercion import rules

    lines = [json.dumps(record, ensure_ascii=False).encode() for record in THREAT_FEED]
    handed: list[bytes] = []
    original = rules.parsed

    def spy(raw: bytes, noun: str) -> Any:
        handed.append(raw)
        return original(raw, noun)

    monkeypatch.setattr(rules, "parsed", spy)
    out = coerce_batch(lines_batch(lines + lines[:10]), BASE_SPEC, RepeatedLines())
    assert handed == []
    assert out.num_rows == len(lines)
    assert pa.compute.sum(out.column("_errors").is_null()).as_py() == out.num_rows
    both_ways(lines + lines[:10], replace(BASE_SPEC, dynamic_values=False), True)


@needs_native
def test_columns_reads_every_record_as_dict_get_does() -> None:
    records: list[dict[str, Any]] = [{"a": 1, "b": None}, {"b": [2]}, {}, {"a": "x", "c": 3.5}]
    names = ("a", "b", "c", "missing")
    assert native.columns(records, names) == [[record.get(name) for record in records] for name in names]
    assert native.columns([], names) == [[], [], [], []]
    with pytest.raises(TypeError, match="must be a dict"):
        native.columns([{"a": 1}, ["not", "a", "dict"]], names)  # type: ignore[list-item]


@needs_native
def test_the_c_path_leaves_its_records_to_reference_counting() -> None:
    """A JSON tree holds no reference cycle: the C path untracks the dicts and lists it builds
    from the collector, so a batch's records (kept until their columns are converted) do not
    set off its full passes. Equal values all the same; a dict tracks itself again when a
    container goes into it."""
    import gc

    assert native.canonical_line is not None
    line = b'{"a":[1,{"b":[2.5,"x",null]},[]],"c":{"d":{}},"e":"f"}'
    got = native.canonical_line(line, frozenset())
    assert got is not None
    record = got[0]
    assert record == json.loads(line)
    containers = [record, record["a"], record["a"][1], record["a"][1]["b"], record["a"][2], record["c"], record["c"]["d"]]
    assert not any(gc.is_tracked(container) for container in containers)
    record["c"]["d"]["loop"] = record["c"]
    assert gc.is_tracked(record["c"]["d"])


@needs_native
def test_an_upgraded_record_reads_its_dynamic_fields_whole_on_the_c_path(tmp_path: Path) -> None:
    """A migration reads the whole record, the fields the commit never reads included (the C
    path's ``...`` for ``dynamic`` columns): the same rows both ways, no ``...`` reaching a
    migration (it was a ``migration`` reject: ``Object of type ellipsis is not JSON serializable``)."""
    import uuid

    from idem_platform.contract.catalog import Column, ColumnType, TableSpec
    from idem_platform.migrations import MigrationSource
    from idem_platform_tests.helpers import migrations_fixture

    module = f"native_migrations_{uuid.uuid4().hex[:10]}"  # a fresh module: the registry is per module
    shutil.copy(migrations_fixture.__file__, tmp_path / f"{module}.py")
    columns = (Column("sensor", ColumnType("string"), True), Column("temperature", ColumnType("real")),
               Column("labels", ColumnType("dynamic")))
    spec = replace(
        BASE_SPEC, tables={"reading": TableSpec("reading", 3, columns)}, record_type="reading", record_type_field=None,
        declared_version=None, contracts={}, dynamic_values=False,
        migrations=MigrationSource((module,), str(tmp_path), (("reading", 3),)),
    )
    lines = [
        b'{"schema_version": 1, "id": "a", "sensor": "s", "temp": 50, "meta": ["m", 1]}',
        b'{"schema_version": 2, "id": "b", "sensor": "t", "temperature": 60, "labels": {"c": 1}}',
        b'{"id": "c", "sensor": "u", "temperature": 10.5, "labels": [1]}',
    ]
    both_ways(lines, spec, repeats=False, batches=1)
    os.environ["IDEM_NATIVE"] = "1"
    try:
        rows = coerce_batch(lines_batch(lines), spec).to_pylist()
    finally:
        os.environ.pop("IDEM_NATIVE", None)
    assert [row["_errors"] for row in rows] == [None, None, None]
    assert json.loads(rows[1]["_upgraded"])["labels"] == {"c": 1}
